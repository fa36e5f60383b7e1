//! External Secrets Operator `PushSecret` (v1alpha1) -> Latchkey PushSecret. The fields are
//! ESO's; a `generatorRef` of a kind Latchkey has too (those of [`super::eso_generator`]) is
//! carried over to `generators.latchkey.dev`. What Latchkey does not implement (store
//! `labelSelector`, another generator kind, a Secret selected by labels, `template`, `dataTo`,
//! a `conversionStrategy` other than `None`) fails the object rather than pushing something
//! else than the author meant. Provider `metadata` is noted and dropped. Every PushSecret gets
//! the note of who now reads and writes.

use super::fields::Fields;
use super::mirrored::{ALLOW_CONTROLLER, BEFORE_ESO, DEFAULT_SERVICE_ACCOUNT};
use super::notes::{Notes, quoted};
use super::output::{Document, Meta};
use crate::api::StoreKind;
use crate::api::external_secret::GeneratorRef;
use crate::api::push_secret::{
    PushDeletionPolicy, PushRemoteRef, PushSecret, PushSecretData, PushSecretMatch,
    PushSecretSelector, PushSecretSource, PushSecretSpec, PushSecretStoreRef, PushUpdatePolicy,
};

/// Fields Latchkey refuses rather than drops: each changes what is pushed, or where.
const NOT_YET: &str = "is not supported by Latchkey yet \
     (docs/push-secret.md lists what is)";

/// Converts the PushSecret whose top-level fields are `top`.
pub fn push_secret(
    top: &mut Fields<'_>,
    meta: &Meta,
    notes: &mut Notes,
) -> Result<Vec<Document>, String> {
    let mut spec = top
        .object("spec", notes)
        .ok_or("spec is missing or not an object")?;
    for key in ["template", "dataTo"] {
        if spec.has(key) {
            return Err(format!("{} {NOT_YET}", spec.at(key)));
        }
    }
    let refresh_interval = spec.duration(
        "refreshInterval",
        notes,
        "Latchkey's default is 1h, as ESO's",
    );
    let update_policy = match spec.string("updatePolicy", notes).as_deref() {
        None | Some("Replace") => PushUpdatePolicy::Replace,
        Some("IfNotExists") => PushUpdatePolicy::IfNotExists,
        Some(other) => {
            return Err(format!(
                "{}: {} is neither Replace nor IfNotExists",
                spec.at("updatePolicy"),
                quoted(other)
            ));
        }
    };
    let deletion_policy = match spec.string("deletionPolicy", notes).as_deref() {
        None | Some("None") => PushDeletionPolicy::None,
        Some("Delete") => PushDeletionPolicy::Delete,
        Some(other) => {
            return Err(format!(
                "{}: {} is neither None nor Delete",
                spec.at("deletionPolicy"),
                quoted(other)
            ));
        }
    };
    let mut secret_store_refs = Vec::new();
    for (path, item) in spec.list("secretStoreRefs", notes) {
        let mut r = Fields::of(item, &path, notes).ok_or(format!("{path} is not an object"))?;
        if r.has("labelSelector") {
            return Err(format!("{} {NOT_YET}", r.at("labelSelector")));
        }
        let name = r
            .string("name", notes)
            .ok_or(format!("{path}.name is missing"))?;
        let kind = match r.string("kind", notes).as_deref() {
            None | Some("SecretStore") => StoreKind::SecretStore,
            Some("ClusterSecretStore") => StoreKind::ClusterSecretStore,
            Some(other) => {
                return Err(format!(
                    "{}: {} is neither SecretStore nor ClusterSecretStore",
                    r.at("kind"),
                    quoted(other)
                ));
            }
        };
        r.finish(notes);
        secret_store_refs.push(PushSecretStoreRef {
            name,
            kind,
            label_selector: None,
        });
    }
    let source = selector(&mut spec, notes)?;
    let mut data = Vec::new();
    for (path, item) in spec.list("data", notes) {
        let mut d = Fields::of(item, &path, notes).ok_or(format!("{path} is not an object"))?;
        if let Some(strategy) = d.string("conversionStrategy", notes)
            && strategy != "None"
        {
            return Err(format!(
                "{}: {} {NOT_YET}",
                d.at("conversionStrategy"),
                quoted(&strategy)
            ));
        }
        d.drop_field(
            "metadata",
            notes,
            "provider-specific push metadata has no Latchkey equivalent yet; not carried over \
             (Latchkey marks what it writes with managed-by: latchkey)",
        );
        let mut m = d
            .object("match", notes)
            .ok_or(format!("{path}.match is missing"))?;
        let secret_key = m.string("secretKey", notes).ok_or(format!(
            "{path}.match.secretKey is missing (pushing the whole Secret {NOT_YET})"
        ))?;
        let mut r = m
            .object("remoteRef", notes)
            .ok_or(format!("{path}.match.remoteRef is missing"))?;
        let remote_key = r
            .string("remoteKey", notes)
            .ok_or(format!("{path}.match.remoteRef.remoteKey is missing"))?;
        let property = r.string("property", notes).filter(|p| !p.is_empty());
        r.finish(notes);
        m.finish(notes);
        d.finish(notes);
        data.push(PushSecretData {
            match_: PushSecretMatch {
                secret_key,
                remote_ref: PushRemoteRef {
                    remote_key,
                    property,
                },
            },
        });
    }
    spec.finish(notes);
    notes.warn("spec", identity_note(meta, &source));
    let (secret, generator_ref) = match source {
        Source::Secret(name) => (Some(PushSecretSource { name }), None),
        Source::Generator(g) => (None, Some(g)),
    };
    let mut ps = PushSecret::new(
        &meta.name,
        PushSecretSpec {
            secret_store_refs,
            selector: PushSecretSelector {
                secret,
                generator_ref,
            },
            data,
            refresh_interval,
            update_policy,
            deletion_policy,
            service_account_name: None,
            template: None,
        },
    );
    ps.metadata = meta.object_meta(&meta.name, true);
    Ok(vec![Document::PushSecret(Box::new(ps))])
}

/// What a PushSecret pushes.
enum Source {
    /// A Secret of its namespace, by name.
    Secret(String),
    /// A generator, as Latchkey names it.
    Generator(GeneratorRef),
}

/// `spec.selector`: the Secret pushed, or the generator.
fn selector(spec: &mut Fields<'_>, notes: &mut Notes) -> Result<Source, String> {
    let mut s = spec
        .object("selector", notes)
        .ok_or("spec.selector is missing")?;
    if s.has("generatorRef") {
        if s.has("secret") {
            return Err("spec.selector sets both secret and generatorRef".into());
        }
        let at = s.at("generatorRef");
        let mut g = s
            .object("generatorRef", notes)
            .ok_or(format!("{at} is not an object"))?;
        let api_version = g.string("apiVersion", notes);
        let kind = g.string("kind", notes);
        let name = g.string("name", notes);
        g.finish(notes);
        s.finish(notes);
        let eso_group = api_version
            .as_deref()
            .is_none_or(|v| v.starts_with("generators.external-secrets.io/"));
        let (Some(kind), Some(name)) = (kind, name) else {
            return Err(format!("{at} needs kind and name"));
        };
        if !eso_group || !super::eso_generator::KINDS.contains(&kind.as_str()) {
            return Err(format!(
                "{at}: generator {} has no Latchkey equivalent (Latchkey has Password, \
                 VaultDynamicSecret, PluginGenerator and ClusterGenerator: docs/generators.md)",
                quoted(&kind)
            ));
        }
        notes.warn(
            &at,
            format!(
                "carried over as generators.latchkey.dev/v1alpha1 {kind} {}: convert and apply \
                 ESO's {kind} of that name along with it (latchkey convert converts it){}; a \
                 new value is generated on the first push and once per refreshInterval (ESO: on \
                 every reconcile), see docs/push-secret.md",
                quoted(&name),
                if kind == "ClusterGenerator" {
                    "; its conditions must admit this namespace"
                } else {
                    ", in this namespace"
                }
            ),
        );
        return Ok(Source::Generator(GeneratorRef {
            api_version: crate::api::GENERATOR_API_VERSION.to_string(),
            kind,
            name,
        }));
    }
    let mut secret = s
        .object("secret", notes)
        .ok_or("spec.selector.secret is missing")?;
    if secret.has("selector") {
        return Err(format!(
            "{} (Secrets chosen by label) {NOT_YET}",
            secret.at("selector")
        ));
    }
    let name = secret
        .string("name", notes)
        .ok_or("spec.selector.secret.name is missing")?;
    secret.finish(notes);
    s.finish(notes);
    Ok(Source::Secret(name))
}

/// Who reads the Secret (or runs the generator) and writes the stores now, and what to grant.
fn identity_note(meta: &Meta, source: &Source) -> String {
    let ns = meta.namespace.as_deref().unwrap_or("NAMESPACE");
    let sa = DEFAULT_SERVICE_ACCOUNT;
    let (what, grant) = match source {
        Source::Secret(secret) => (
            format!("reads Secret {}", quoted(secret)),
            format!("that account needs get on the Secret (a Role in {ns}), and "),
        ),
        Source::Generator(g) => (format!("runs generator {g}"), String::new()),
    };
    format!(
        "latchkey controller {what} and writes the stores as the PushSecret's \
         spec.serviceAccountName (not set: {sa}), {BEFORE_ESO}: {grant}the backend must let the subject \
         system:serviceaccount:{ns}:{sa} write (the Vault policy: create, update, read on the \
         paths; the IAM role: secretsmanager:CreateSecret, PutSecretValue, TagResource; its \
         trust policy: the sub claim); the account must opt in: kubectl annotate serviceaccount \
         -n {ns} {sa} {ALLOW_CONTROLLER}=true"
    )
}
