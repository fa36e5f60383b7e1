//! External Secrets Operator `PushSecret` (v1alpha1) -> Latchkey PushSecret. The fields are
//! ESO's; store `labelSelector`s carry over, and so does a `template` whose Go templates are the
//! trivial ones [`super::template`] turns into CEL, and a `generatorRef` of a kind Latchkey has
//! (those of [`super::eso_generator`], to `generators.latchkey.dev`). What Latchkey does not
//! implement (another generator kind, a Secret selected by labels, any other template,
//! `dataTo`, a `conversionStrategy` other than `None`) fails the object rather than pushing
//! something else than the author meant. Provider `metadata` carries over (see
//! [`super::eso_push_metadata`]). Every
//! PushSecret gets the note of who now reads and writes.

use std::collections::BTreeMap;

use super::fields::Fields;
use super::mirrored::{ALLOW_CONTROLLER, BEFORE_ESO, DEFAULT_SERVICE_ACCOUNT};
use super::notes::{Notes, quoted};
use super::output::{Document, Meta};
use super::template::go_to_cel;
use crate::api::StoreKind;
use crate::api::external_secret::{GeneratorRef, Template, TemplateMergePolicy};
use crate::api::push_secret::{
    PushDeletionPolicy, PushRemoteRef, PushSecret, PushSecretData, PushSecretMatch,
    PushSecretSelector, PushSecretSource, PushSecretSpec, PushSecretStoreRef, PushSecretTemplate,
    PushUpdatePolicy,
};
use crate::api::store::{LabelSelector, LabelSelectorRequirement};

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
    if spec.has("dataTo") {
        return Err(format!("{} {NOT_YET}", spec.at("dataTo")));
    }
    let template = template(&mut spec, notes)?;
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
        let label_selector = match r.object("labelSelector", notes) {
            Some(mut l) => Some(label_selector(&mut l, notes)?),
            None => None,
        };
        // As ESO: a ref with a selector selects by it, whatever its name says.
        let name = match label_selector {
            Some(_) => {
                if r.has("name") {
                    let _ = r.string("name", notes);
                    notes.warn(
                        r.at("name"),
                        "ESO ignores the name of a ref with a labelSelector; not carried over",
                    );
                }
                None
            }
            None => Some(
                r.string("name", notes)
                    .ok_or(format!("{path}.name is missing"))?,
            ),
        };
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
            label_selector,
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
        let metadata = super::eso_push_metadata::metadata(&mut d, notes)?;
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
            metadata,
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
            template,
        },
    );
    ps.metadata = meta.object_meta(&meta.name, true);
    Ok(vec![Document::PushSecret(Box::new(ps))])
}

/// A store `labelSelector`; a requirement it cannot read fails the object (without it the
/// selector would select more stores).
fn label_selector(s: &mut Fields<'_>, notes: &mut Notes) -> Result<LabelSelector, String> {
    let match_labels = s.strings("matchLabels", notes);
    let mut match_expressions = Vec::new();
    for (path, item) in s.list("matchExpressions", notes) {
        let mut e = Fields::of(item, &path, notes).ok_or(format!("{path} is not an object"))?;
        let key = e.string("key", notes);
        let operator = e.string("operator", notes);
        let values = e.string_list("values", notes);
        e.finish(notes);
        let (Some(key), Some(operator)) = (key, operator) else {
            return Err(format!("{path} needs key and operator"));
        };
        match_expressions.push(LabelSelectorRequirement {
            key,
            operator,
            values,
        });
    }
    s.finish(notes);
    Ok(LabelSelector {
        match_labels,
        match_expressions,
    })
}

/// `spec.template`: its `data` when every Go template is a trivial one (literal text and key
/// references, turned into CEL), with `mergePolicy`; anything else fails the object, naming
/// the field, since Latchkey would refuse it or push another value.
fn template(
    spec: &mut Fields<'_>,
    notes: &mut Notes,
) -> Result<Option<PushSecretTemplate>, String> {
    let Some(mut t) = spec.object("template", notes) else {
        return Ok(None);
    };
    match t.string("engineVersion", notes).as_deref() {
        None | Some("v2") => {}
        Some(other) => {
            return Err(format!(
                "{}: {} templates are not converted (only engine v2's simple ones are)",
                t.at("engineVersion"),
                quoted(other)
            ));
        }
    }
    if t.has("templateFrom") {
        return Err(format!(
            "{}: templates read from ConfigMaps or Secrets have no Latchkey equivalent",
            t.at("templateFrom")
        ));
    }
    if t.has("type") {
        return Err(format!(
            "{}: a PushSecret's template writes no Secret; Latchkey refuses type",
            t.at("type")
        ));
    }
    if let Some(mut m) = t.object("metadata", notes) {
        let at = m.path().to_string();
        let labels = m.strings("labels", notes);
        let annotations = m.strings("annotations", notes);
        m.finish(notes);
        // Named by the first key, so the message says which entry to remove.
        let first = [("labels", &labels), ("annotations", &annotations)]
            .into_iter()
            .find_map(|(field, map)| map.keys().next().map(|k| (field, k)));
        if let Some((field, key)) = first {
            return Err(format!(
                "{at}.{field}.{}: a PushSecret's template writes no Secret; Latchkey refuses \
                 labels and annotations",
                super::notes::segment(key)
            ));
        }
    }
    let merge_policy = match t.string("mergePolicy", notes).as_deref() {
        None => None,
        Some("Replace") => Some(TemplateMergePolicy::Replace),
        Some("Merge") => Some(TemplateMergePolicy::Merge),
        Some(other) => {
            return Err(format!(
                "{}: {} is neither Replace nor Merge",
                t.at("mergePolicy"),
                quoted(other)
            ));
        }
    };
    let data_path = t.at("data");
    let mut data = BTreeMap::new();
    for (key, tpl) in t.strings("data", notes) {
        let cel = go_to_cel(&tpl).ok_or(format!(
            "{data_path}.{key}: Go template {} is not converted (only literal text and {{{{ .key }}}} \
             references are); write it as a CEL expression over `secret` (docs/push-secret.md)",
            quoted(&tpl)
        ))?;
        data.insert(key, cel);
    }
    t.finish(notes);
    Ok(Some(PushSecretTemplate {
        template: Template {
            data,
            merge_policy,
            ..Default::default()
        },
        ..Default::default()
    }))
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
