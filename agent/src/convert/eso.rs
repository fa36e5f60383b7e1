//! External Secrets Operator `ExternalSecret` (v1, v1beta1) -> Latchkey ExternalSecret. The field
//! names are the same; what differs is ESO's default of creating a Secret (Latchkey's default is
//! mount only, so `creationPolicy` is written out), Go templates (Latchkey's are CEL) and the
//! ESO features Latchkey lacks.

use std::collections::BTreeMap;

use super::fields::Fields;
use super::mirrored::{BEFORE_ESO, DEFAULT_SERVICE_ACCOUNT, service_account_note};
use super::notes::{Notes, quoted};
use super::output::{Document, Meta};
use super::template::go_to_cel;
use crate::api::external_secret::{
    CreationPolicy, DataFrom, DecodingStrategy, DeletionPolicy, ExternalSecretData, FindName,
    FindRef, GeneratorRef, RefreshPolicy, Rewrite, RewriteRegexp, SecretStoreRef, SourceRef,
    Target, Template, TemplateMergePolicy, TemplateMetadata,
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
    let refresh_interval = spec.duration("refreshInterval", notes, "Latchkey's default is 1h");
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
    if target.creation_policy != Some(CreationPolicy::None) {
        let secret = target.name.as_deref().unwrap_or(&meta.name);
        notes.warn(
            "spec.target",
            service_account_note(
                meta.namespace.as_deref(),
                DEFAULT_SERVICE_ACCOUNT,
                secret,
                BEFORE_ESO,
            ),
        );
    }
    if data.is_empty() && data_from.is_empty() {
        return Err("no entry of spec.data or spec.dataFrom could be converted".into());
    }
    let reads_store = !data.is_empty() || data_from.iter().any(|d| d.source_ref.is_none());
    if reads_store && secret_store_ref.is_none() {
        return Err(
            "spec.secretStoreRef is missing, and entries other than generators need a store \
             (entries naming their own store with sourceRef.storeRef have no Latchkey \
             equivalent: an ExternalSecret reads one store)"
                .into(),
        );
    }
    let mut es = ExternalSecret::new(
        &meta.name,
        ExternalSecretSpec {
            secret_store_ref,
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

/// `spec.secretStoreRef`; `None` when absent (ESO allows that when every entry is generated).
fn store_ref(spec: &mut Fields<'_>, notes: &mut Notes) -> Result<Option<SecretStoreRef>, String> {
    let Some(mut r) = spec.object("secretStoreRef", notes) else {
        return Ok(None);
    };
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
    Ok(Some(SecretStoreRef { name, kind }))
}

/// What an entry's `sourceRef` names.
enum Source {
    /// No `sourceRef`: the ExternalSecret's store.
    Store,
    /// A generator Latchkey has too: carried over.
    Generator(GeneratorRef),
    /// Not carried over (noted).
    Dropped,
}

/// ESO generator kinds that have a `generators.latchkey.dev` kind of the same name and fields.
const GENERATOR_KINDS: &[&str] = &["Password", "VaultDynamicSecret", "ClusterGenerator"];

/// An entry's `sourceRef` (every field read, so that none is unknown). `in_data_from`: ESO runs
/// generators in `dataFrom` only (its `data[].sourceRef.generatorRef` is deprecated and unused).
fn source_ref(f: &mut Fields<'_>, in_data_from: bool, notes: &mut Notes) -> Source {
    let at = f.at("sourceRef");
    let Some(mut s) = f.object("sourceRef", notes) else {
        return Source::Store;
    };
    let store = s.object("storeRef", notes).map(|mut r| {
        r.string("name", notes);
        r.string("kind", notes);
        r.finish(notes);
    });
    let generator = s.object("generatorRef", notes).map(|mut g| {
        let api_version = g.string("apiVersion", notes);
        let kind = g.string("kind", notes);
        let name = g.string("name", notes);
        g.finish(notes);
        (api_version, kind, name)
    });
    s.finish(notes);
    if store.is_some() {
        notes.warn(
            format!("{at}.storeRef"),
            "per-entry stores have no Latchkey equivalent (an ExternalSecret reads its one \
             store); entry not carried over",
        );
        return Source::Dropped;
    }
    let Some((api_version, kind, name)) = generator else {
        notes.warn(
            at,
            "names neither storeRef nor generatorRef; entry not carried over",
        );
        return Source::Dropped;
    };
    let at = format!("{at}.generatorRef");
    if !in_data_from {
        notes.warn(
            at,
            "ESO does not run generators in data[] (deprecated and unused there); entry not \
             carried over (a Latchkey data[] entry may name a generator, remoteRef.key picking \
             one key of its result: docs/generators.md)",
        );
        return Source::Dropped;
    }
    let eso_group = api_version
        .as_deref()
        .is_none_or(|v| v.starts_with("generators.external-secrets.io/"));
    match (kind, name) {
        (Some(kind), Some(name)) if eso_group && GENERATOR_KINDS.contains(&kind.as_str()) => {
            notes.warn(
                &at,
                format!(
                    "carried over as generators.latchkey.dev/v1alpha1 {kind} {}: convert and \
                     apply ESO's {kind} of that name along with it (latchkey convert converts \
                     it; docs/generators.md){}",
                    quoted(&name),
                    if kind == "ClusterGenerator" {
                        "; its conditions must admit this namespace"
                    } else {
                        ", in this namespace"
                    }
                ),
            );
            Source::Generator(GeneratorRef {
                api_version: crate::api::GENERATOR_API_VERSION.to_string(),
                kind,
                name,
            })
        }
        (Some(kind), Some(_)) => {
            notes.warn(
                at,
                format!(
                    "generator {} has no Latchkey equivalent (Latchkey has Password, \
                     VaultDynamicSecret, PluginGenerator and ClusterGenerator: \
                     docs/generators.md); entry not carried over",
                    quoted(&kind)
                ),
            );
            Source::Dropped
        }
        _ => {
            notes.warn(at, "needs kind and name; entry not carried over");
            Source::Dropped
        }
    }
}

/// One `spec.data` item.
fn data_entry(f: &mut Fields<'_>, notes: &mut Notes) -> Option<ExternalSecretData> {
    // Every field is read before the entry is judged, so that a typo is reported as unknown
    // even in an entry that is dropped for another reason.
    let source = source_ref(f, false, notes);
    let secret_key = f.string("secretKey", notes);
    let remote_at = f.at("remoteRef");
    let remote = f
        .object("remoteRef", notes)
        .map(|mut r| remote_ref(&mut r, notes));
    f.finish(notes);
    if !matches!(source, Source::Store) {
        return None;
    }
    let Some(secret_key) = secret_key else {
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
    let Some(remote) = remote else {
        notes.warn(remote_at, "is missing; entry not carried over");
        return None;
    };
    Some(ExternalSecretData {
        source_ref: None,
        secret_key,
        remote_ref: remote?,
    })
}

/// A `remoteRef` or `dataFrom[].extract`; `None` (with a note) when it cannot mean the same.
fn remote_ref(f: &mut Fields<'_>, notes: &mut Notes) -> Option<RemoteRef> {
    let key = f.string("key", notes);
    let metadata_policy = f.string("metadataPolicy", notes);
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
    let Some(key) = key else {
        notes.warn(f.at("key"), "is missing; entry not carried over");
        return None;
    };
    if let Some(policy) = metadata_policy
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
    // Every field is read before the entry is judged (see `data_entry`).
    let source = source_ref(f, true, notes);
    let has_extract = f.has("extract");
    let extract = f
        .object("extract", notes)
        .map(|mut e| remote_ref(&mut e, notes));
    let has_find = f.has("find");
    let find = f.object("find", notes).map(|mut e| find(&mut e, notes));
    let rewrite = rewrites(f, notes);
    f.finish(notes);
    let generator = match source {
        Source::Dropped => return None,
        Source::Generator(g) => Some(g),
        Source::Store => None,
    };
    if usize::from(has_extract) + usize::from(has_find) + usize::from(generator.is_some()) != 1 {
        notes.warn(
            f.path(),
            "needs exactly one of extract, find and sourceRef.generatorRef; entry not carried \
             over",
        );
        return None;
    }
    let extract = match extract {
        Some(e) => Some(e?),
        None => None,
    };
    let find = match find {
        Some(e) => Some(e?),
        None => None,
    };
    Some(DataFrom {
        source_ref: generator.map(|g| SourceRef {
            generator_ref: Some(g),
        }),
        extract,
        find,
        rewrite: rewrite?,
    })
}

/// `dataFrom[].rewrite`; `None` (noted) when one cannot be carried over, since the entry's names
/// would then differ.
fn rewrites(f: &mut Fields<'_>, notes: &mut Notes) -> Option<Vec<Rewrite>> {
    let mut out = Some(Vec::new());
    for (path, item) in f.list("rewrite", notes) {
        let Some(mut r) = Fields::of(item, &path, notes) else {
            out = None;
            continue;
        };
        let regexp = r.object("regexp", notes).map(|mut re| {
            let source = re.string("source", notes);
            let target = re.string("target", notes);
            re.finish(notes);
            (source, target)
        });
        for other in ["transform", "merge"] {
            if let Some(mut o) = r.object(other, notes) {
                // Read so that they are not unknown; the entry is dropped below.
                for k in o.keys() {
                    o.value(&k);
                }
            }
        }
        r.finish(notes);
        match regexp {
            None => {
                notes.warn(
                    &path,
                    "only regexp rewrites have a Latchkey equivalent (transform and merge do \
                     not); the whole dataFrom entry is not carried over, since its names would \
                     differ",
                );
                out = None;
            }
            Some((Some(source), Some(target))) => {
                if let Some(list) = &mut out {
                    list.push(Rewrite {
                        regexp: Some(RewriteRegexp { source, target }),
                    });
                }
            }
            Some(_) => {
                notes.warn(
                    &path,
                    "needs regexp.source and regexp.target; dataFrom entry not carried over",
                );
                out = None;
            }
        }
    }
    out
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
