//! External Secrets Operator `ExternalSecret` (v1, v1beta1) -> Latchkey ExternalSecret. The field
//! names are the same; what differs is ESO's default of creating a Secret (Latchkey's default is
//! mount only, so `creationPolicy` is written out), Go templates (Latchkey's are CEL) and the
//! ESO features Latchkey lacks.

use std::collections::BTreeMap;

use super::fields::Fields;
use super::notes::{Notes, quoted};
use super::output::{Document, Meta};
use super::template::go_to_cel;
use crate::api::external_secret::{
    CreationPolicy, DataFrom, DecodingStrategy, DeletionPolicy, ExternalSecretData, FindName,
    FindRef, RefreshPolicy, Rewrite, RewriteRegexp, SecretStoreRef, Target, Template,
    TemplateMergePolicy, TemplateMetadata,
};
use crate::api::{ExternalSecret, ExternalSecretSpec, RemoteRef, StoreKind};

/// Converts the ExternalSecret whose top-level fields are `top`.
pub fn external_secret(
    top: &mut Fields<'_>,
    meta: &Meta,
    notes: &mut Notes,
) -> Result<Vec<Document>, String> {
    let mut spec = top
        .object("spec", notes)
        .ok_or("spec is missing or not an object")?;
    let secret_store_ref = store_ref(&mut spec, notes)?;
    let refresh_interval = spec.string("refreshInterval", notes).and_then(|text| {
        let ok = crate::api::rules::DURATION.is_match(&text);
        if !ok {
            notes.warn(
                spec.at("refreshInterval"),
                format!(
                    "{} {}; not carried over (Latchkey's default is 1h)",
                    quoted(&text),
                    crate::api::rules::DURATION.message
                ),
            );
        }
        ok.then_some(text)
    });
    let refresh_policy = spec.string("refreshPolicy", notes).and_then(|p| {
        let policy = match p.as_str() {
            "Periodic" => Some(RefreshPolicy::Periodic),
            "OnChange" => Some(RefreshPolicy::OnChange),
            "CreatedOnce" => Some(RefreshPolicy::CreatedOnce),
            _ => None,
        };
        if policy.is_none() {
            notes.warn(
                spec.at("refreshPolicy"),
                format!(
                    "{} is not a Latchkey refresh policy; not carried over",
                    quoted(&p)
                ),
            );
        }
        policy
    });
    let mut data = Vec::new();
    for (path, item) in spec.list("data", notes) {
        if let Some(mut f) = Fields::of(item, &path, notes)
            && let Some(d) = data_entry(&mut f, notes)
        {
            data.push(d);
        }
    }
    let mut data_from = Vec::new();
    for (path, item) in spec.list("dataFrom", notes) {
        if let Some(mut f) = Fields::of(item, &path, notes)
            && let Some(d) = data_from_entry(&mut f, notes)
        {
            data_from.push(d);
        }
    }
    let target = target(&mut spec, notes);
    spec.finish(notes);
    if data.is_empty() && data_from.is_empty() {
        return Err("no entry of spec.data or spec.dataFrom could be converted".into());
    }
    let mut es = ExternalSecret::new(
        &meta.name,
        ExternalSecretSpec {
            secret_store_ref: Some(secret_store_ref),
            refresh_interval,
            data,
            data_from,
            target: Some(target),
            service_account_name: None,
            refresh_policy,
        },
    );
    es.metadata = meta.object_meta(&meta.name, true);
    Ok(vec![Document::ExternalSecret(Box::new(es))])
}

/// `spec.secretStoreRef`.
fn store_ref(spec: &mut Fields<'_>, notes: &mut Notes) -> Result<SecretStoreRef, String> {
    let mut r = spec.object("secretStoreRef", notes).ok_or(
        "spec.secretStoreRef is missing (entries that name their own store or generator with \
         sourceRef have no Latchkey equivalent: an ExternalSecret reads one store)",
    )?;
    let name = r
        .string("name", notes)
        .ok_or("spec.secretStoreRef.name is missing")?;
    let kind = match r.string("kind", notes).as_deref() {
        None | Some("SecretStore") => StoreKind::SecretStore,
        Some("ClusterSecretStore") => StoreKind::ClusterSecretStore,
        Some(other) => {
            return Err(format!(
                "spec.secretStoreRef.kind: {} is not SecretStore or ClusterSecretStore",
                quoted(other)
            ));
        }
    };
    r.finish(notes);
    Ok(SecretStoreRef { name, kind })
}

/// Whether an entry names its own store or a generator (`sourceRef`), which Latchkey cannot
/// carry over: noted.
fn has_source_ref(f: &Fields<'_>, notes: &mut Notes) -> bool {
    if !f.has("sourceRef") {
        return false;
    }
    notes.warn(
        f.at("sourceRef"),
        "per-entry stores and generators have no Latchkey equivalent (an ExternalSecret reads \
         its one store); entry not carried over",
    );
    true
}

/// One `spec.data` item.
fn data_entry(f: &mut Fields<'_>, notes: &mut Notes) -> Option<ExternalSecretData> {
    if has_source_ref(f, notes) {
        return None;
    }
    let Some(secret_key) = f.string("secretKey", notes) else {
        notes.warn(f.at("secretKey"), "is missing; entry not carried over");
        return None;
    };
    if !crate::api::rules::FILE_PATH.is_match(&secret_key) {
        notes.warn(
            f.at("secretKey"),
            format!(
                "{} {}; entry not carried over",
                quoted(&secret_key),
                crate::api::rules::FILE_PATH.message
            ),
        );
        return None;
    }
    let path = f.at("remoteRef");
    let Some(mut r) = f.object("remoteRef", notes) else {
        notes.warn(path, "is missing; entry not carried over");
        return None;
    };
    let remote_ref = remote_ref(&mut r, notes)?;
    f.finish(notes);
    Some(ExternalSecretData {
        source_ref: None,
        secret_key,
        remote_ref,
    })
}

/// A `remoteRef` or `dataFrom[].extract`; `None` (with a note) when it cannot mean the same.
fn remote_ref(f: &mut Fields<'_>, notes: &mut Notes) -> Option<RemoteRef> {
    let Some(key) = f.string("key", notes) else {
        notes.warn(f.at("key"), "is missing; entry not carried over");
        return None;
    };
    if let Some(policy) = f.string("metadataPolicy", notes)
        && policy != "None"
    {
        notes.warn(
            f.at("metadataPolicy"),
            format!(
                "{} (reading the secret's metadata or tags) has no Latchkey equivalent; entry \
                 not carried over",
                quoted(&policy)
            ),
        );
        return None;
    }
    let property = f.string("property", notes);
    let version = f.string("version", notes);
    let decoding_strategy = decoding(f, notes);
    conversion(f, notes);
    if let Some(policy) = f.string("nullBytePolicy", notes)
        && policy != "Ignore"
    {
        notes.warn(
            f.at("nullBytePolicy"),
            format!(
                "{} has no Latchkey equivalent; not carried over",
                quoted(&policy)
            ),
        );
    }
    f.finish(notes);
    Some(RemoteRef {
        key,
        property,
        version,
        decoding_strategy,
    })
}

/// `decodingStrategy`.
fn decoding(f: &mut Fields<'_>, notes: &mut Notes) -> Option<DecodingStrategy> {
    let text = f.string("decodingStrategy", notes)?;
    let strategy = match text.as_str() {
        "None" => Some(DecodingStrategy::None),
        "Base64" => Some(DecodingStrategy::Base64),
        "Base64URL" => Some(DecodingStrategy::Base64Url),
        "Auto" => Some(DecodingStrategy::Auto),
        _ => None,
    };
    if strategy.is_none() {
        notes.warn(
            f.at("decodingStrategy"),
            format!(
                "{} is not a Latchkey decoding strategy; not carried over",
                quoted(&text)
            ),
        );
    }
    strategy
}

/// `conversionStrategy`: Latchkey always behaves as ESO's `Default`.
fn conversion(f: &mut Fields<'_>, notes: &mut Notes) {
    if let Some(text) = f.string("conversionStrategy", notes)
        && text != "Default"
    {
        notes.warn(
            f.at("conversionStrategy"),
            format!(
                "{} has no Latchkey equivalent (names and values are used as they are); not \
                 carried over",
                quoted(&text)
            ),
        );
    }
}

/// One `spec.dataFrom` item.
fn data_from_entry(f: &mut Fields<'_>, notes: &mut Notes) -> Option<DataFrom> {
    if has_source_ref(f, notes) {
        return None;
    }
    let extract = match f.object("extract", notes) {
        Some(mut e) => Some(remote_ref(&mut e, notes)?),
        None => None,
    };
    let find = match f.object("find", notes) {
        Some(mut e) => Some(find(&mut e, notes)?),
        None => None,
    };
    if extract.is_some() == find.is_some() {
        notes.warn(
            f.path(),
            "needs exactly one of extract and find; entry not carried over",
        );
        return None;
    }
    let mut rewrite = Vec::new();
    for (path, item) in f.list("rewrite", notes) {
        let mut r = Fields::of(item, &path, notes)?;
        let Some(mut re) = r.object("regexp", notes) else {
            notes.warn(
                &path,
                "only regexp rewrites have a Latchkey equivalent (transform and merge do not); \
                 the whole dataFrom entry is not carried over, since its names would differ",
            );
            return None;
        };
        let source = re.string("source", notes);
        let target = re.string("target", notes);
        re.finish(notes);
        r.finish(notes);
        let (Some(source), Some(target)) = (source, target) else {
            notes.warn(
                &path,
                "needs regexp.source and regexp.target; dataFrom entry not carried over",
            );
            return None;
        };
        rewrite.push(Rewrite {
            regexp: Some(RewriteRegexp { source, target }),
        });
    }
    f.finish(notes);
    Some(DataFrom {
        source_ref: None,
        extract,
        find,
        rewrite,
    })
}

/// `dataFrom[].find`.
fn find(f: &mut Fields<'_>, notes: &mut Notes) -> Option<FindRef> {
    // Honoured by `aws` stores; any other store refuses a find with tags.
    let tags = f.strings("tags", notes);
    let path = f.string("path", notes);
    let name = match f.object("name", notes) {
        Some(mut n) => {
            let regexp = n.string("regexp", notes);
            n.finish(notes);
            regexp.map(|regexp| FindName { regexp })
        }
        None => None,
    };
    let decoding_strategy = decoding(f, notes);
    conversion(f, notes);
    f.finish(notes);
    if name.is_none() && path.is_none() && tags.is_empty() {
        notes.warn(f.path(), "needs name, path or tags; entry not carried over");
        return None;
    }
    Some(FindRef {
        path,
        name,
        tags,
        decoding_strategy,
    })
}

/// `spec.target`; ESO creates a Secret by default, so `creationPolicy` is always written.
fn target(spec: &mut Fields<'_>, notes: &mut Notes) -> Target {
    let mut t = Target {
        creation_policy: Some(CreationPolicy::Owner),
        ..Default::default()
    };
    let Some(mut f) = spec.object("target", notes) else {
        return t;
    };
    t.name = f.string("name", notes);
    if let Some(p) = f.string("creationPolicy", notes) {
        match p.as_str() {
            "Owner" => {}
            "Orphan" => t.creation_policy = Some(CreationPolicy::Orphan),
            "Merge" => t.creation_policy = Some(CreationPolicy::Merge),
            "None" => t.creation_policy = Some(CreationPolicy::None),
            _ => notes.warn(
                f.at("creationPolicy"),
                format!(
                    "{} is not a Latchkey creation policy; Owner is used",
                    quoted(&p)
                ),
            ),
        }
    }
    if let Some(p) = f.string("deletionPolicy", notes) {
        match p.as_str() {
            "Retain" => t.deletion_policy = Some(DeletionPolicy::Retain),
            "Delete" => t.deletion_policy = Some(DeletionPolicy::Delete),
            "Merge" => t.deletion_policy = Some(DeletionPolicy::Merge),
            _ => notes.warn(
                f.at("deletionPolicy"),
                format!(
                    "{} is not a Latchkey deletion policy; not carried over",
                    quoted(&p)
                ),
            ),
        }
    }
    t.immutable = f.flag("immutable", notes);
    if let Some(mut tf) = f.object("template", notes) {
        t.template = template(&mut tf, notes);
        tf.finish(notes);
    }
    f.finish(notes);
    t
}

/// `spec.target.template`: type and metadata carry over; each Go template that is a trivial
/// reference becomes CEL, every other one is left out with its text in a note.
fn template(f: &mut Fields<'_>, notes: &mut Notes) -> Option<Template> {
    let mut t = Template {
        type_: f.string("type", notes),
        ..Default::default()
    };
    let v1 = match f.string("engineVersion", notes).as_deref() {
        None | Some("v2") => false,
        Some(_) => true,
    };
    if let Some(mut m) = f.object("metadata", notes) {
        let labels = m.strings("labels", notes);
        let annotations = m.strings("annotations", notes);
        m.finish(notes);
        if !labels.is_empty() || !annotations.is_empty() {
            t.metadata = Some(TemplateMetadata {
                labels,
                annotations,
            });
        }
    }
    t.merge_policy = match f.string("mergePolicy", notes).as_deref() {
        None => None,
        Some("Replace") => Some(TemplateMergePolicy::Replace),
        Some("Merge") => Some(TemplateMergePolicy::Merge),
        Some(other) => {
            notes.warn(
                f.at("mergePolicy"),
                format!(
                    "{} is not Replace or Merge; not carried over",
                    quoted(other)
                ),
            );
            None
        }
    };
    let data_path = f.at("data");
    let mut data = BTreeMap::new();
    for (key, tpl) in f.strings("data", notes) {
        let cel = if v1 { None } else { go_to_cel(&tpl) };
        match cel {
            Some(cel) => {
                data.insert(key, cel);
            }
            None => notes.warn(
                format!("{data_path}.{key}"),
                format!(
                    "Go template {} not converted: Latchkey templates are CEL expressions over \
                     `secret` (e.g. \"'%s:%s'.format([secret.user, secret.pass])\", see the README \
                     on templates); write it by hand",
                    quoted(&tpl)
                ),
            ),
        }
    }
    t.data = data;
    f.drop_field(
        "templateFrom",
        notes,
        "templates read from ConfigMaps or Secrets have no Latchkey equivalent; not carried over",
    );
    (t != Template::default()).then_some(t)
}
