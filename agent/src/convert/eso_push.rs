//! External Secrets Operator `PushSecret` (v1alpha1) -> Latchkey PushSecret. The fields are
//! ESO's; what Latchkey does not implement (store `labelSelector`, `generatorRef`, a Secret
//! selected by labels, `template`, `dataTo`, a `conversionStrategy` other than `None`) fails the
//! object rather than pushing something else than the author meant. Provider `metadata` is
//! noted and dropped. Every PushSecret gets the note of who now reads and writes.

use super::fields::Fields;
use super::mirrored::{ALLOW_CONTROLLER, BEFORE_ESO, DEFAULT_SERVICE_ACCOUNT};
use super::notes::{Notes, quoted};
use super::output::{Document, Meta};
use crate::api::StoreKind;
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
    let mut ps = PushSecret::new(
        &meta.name,
        PushSecretSpec {
            secret_store_refs,
            selector: PushSecretSelector {
                secret: Some(PushSecretSource { name: source }),
                generator_ref: None,
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

/// `spec.selector`: the name of the Secret pushed.
fn selector(spec: &mut Fields<'_>, notes: &mut Notes) -> Result<String, String> {
    let mut s = spec
        .object("selector", notes)
        .ok_or("spec.selector is missing")?;
    if s.has("generatorRef") {
        return Err(format!("{} {NOT_YET}", s.at("generatorRef")));
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
    Ok(name)
}

/// Who reads the Secret and writes the stores now, and what to grant.
fn identity_note(meta: &Meta, secret: &str) -> String {
    let ns = meta.namespace.as_deref().unwrap_or("NAMESPACE");
    let sa = DEFAULT_SERVICE_ACCOUNT;
    format!(
        "latchkey controller reads Secret {} and writes the stores as the PushSecret's \
         spec.serviceAccountName (not set: {sa}), {BEFORE_ESO}: that account needs get on the \
         Secret (a Role in {ns}), and the backend must let the subject \
         system:serviceaccount:{ns}:{sa} write (the Vault policy: create, update, read on the \
         paths; the IAM role: secretsmanager:CreateSecret, PutSecretValue, TagResource; its \
         trust policy: the sub claim); the account must opt in: kubectl annotate serviceaccount \
         -n {ns} {sa} {ALLOW_CONTROLLER}=true",
        quoted(secret)
    )
}
