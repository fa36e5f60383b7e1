//! ESO `PushSecret` `spec.data[].metadata` -> Latchkey's: the `PushSecretMetadata` envelope with
//! the fields of the providers Latchkey writes. A field of another provider, or one Latchkey
//! does not implement (AWS's `resourcePolicy`), fails the object; copying the source Secret's labels (the kubernetes
//! provider's `sourceMergePolicy: Merge`, ESO's default) is noted, as Latchkey never does.

use super::fields::Fields;
use super::notes::{Notes, quoted};
use crate::api::push_metadata::{
    METADATA_API_VERSION, METADATA_KIND, MetadataApiVersion, MetadataKind, MetadataMergePolicy,
    PushMetadataSpec, PushSecretMetadata, SecretPushFormat, TargetMergePolicy,
};

/// The metadata of one entry (`d` is the entry), if it has any.
pub fn metadata(
    d: &mut Fields<'_>,
    notes: &mut Notes,
) -> Result<Option<PushSecretMetadata>, String> {
    let Some(mut m) = d.object("metadata", notes) else {
        return Ok(None);
    };
    if !m.has("apiVersion") && !m.has("kind") && m.has("secretPushFormat") {
        // ESO's AWS provider also finds this one key outside of the envelope; any other key
        // there is unknown (ESO reads nothing else without it).
        let spec = PushMetadataSpec {
            secret_push_format: one_of(&mut m, "secretPushFormat", notes, push_format)?,
            ..Default::default()
        };
        m.finish(notes);
        notes.warn(
            m.path(),
            "written in ESO's PushSecretMetadata envelope, which Latchkey asks for",
        );
        return Ok(Some(envelope(spec)));
    }
    let envelope_of = (m.string("apiVersion", notes), m.string("kind", notes));
    if envelope_of
        != (
            Some(METADATA_API_VERSION.into()),
            Some(METADATA_KIND.into()),
        )
    {
        return Err(format!(
            "{} is not a {METADATA_KIND} of {METADATA_API_VERSION} (apiVersion, kind, spec), \
             the only form ESO reads",
            m.path()
        ));
    }
    let mut spec = PushMetadataSpec::default();
    if let Some(mut s) = m.object("spec", notes) {
        if s.has("resourcePolicy") {
            return Err(format!(
                "{} is not supported by Latchkey yet (docs/push-secret.md lists what is)",
                s.at("resourcePolicy")
            ));
        }
        spec.tags = s.strings("tags", notes);
        spec.description = s.string("description", notes);
        spec.kms_key_id = s.string("kmsKeyId", notes);
        if s.has("replicationLocations") {
            spec.replication_locations = Some(s.string_list("replicationLocations", notes));
        }
        spec.secret_push_format = one_of(&mut s, "secretPushFormat", notes, push_format)?;
        spec.custom_metadata = s.strings("customMetadata", notes);
        spec.merge_policy = one_of(&mut s, "mergePolicy", notes, merge_policy)?;
        spec.labels = s.strings("labels", notes);
        spec.annotations = s.strings("annotations", notes);
        let source = one_of(&mut s, "sourceMergePolicy", notes, merge_policy)?;
        let for_a_secret = !spec.labels.is_empty()
            || !spec.annotations.is_empty()
            || s.has("targetMergePolicy")
            || s.has("remoteNamespace");
        let copies = match source {
            Some(p) => p == MetadataMergePolicy::Merge,
            None => for_a_secret,
        };
        if copies {
            notes.warn(
                s.at("sourceMergePolicy"),
                "Latchkey never copies the source Secret's labels and annotations (ESO's \
                 default Merge does); only those listed under labels and annotations are set",
            );
        }
        spec.source_merge_policy = source.filter(|p| *p == MetadataMergePolicy::Replace);
        spec.target_merge_policy = one_of(&mut s, "targetMergePolicy", notes, |v| match v {
            "Merge" => Some(TargetMergePolicy::Merge),
            "Replace" => Some(TargetMergePolicy::Replace),
            "Ignore" => Some(TargetMergePolicy::Ignore),
            _ => None,
        })?;
        spec.remote_namespace = s.string("remoteNamespace", notes);
        s.finish(notes);
    }
    m.finish(notes);
    Ok(Some(envelope(spec)))
}

fn envelope(spec: PushMetadataSpec) -> PushSecretMetadata {
    PushSecretMetadata {
        api_version: MetadataApiVersion::V1alpha1,
        kind: MetadataKind::PushSecretMetadata,
        spec,
    }
}

fn push_format(v: &str) -> Option<SecretPushFormat> {
    match v {
        "string" => Some(SecretPushFormat::String),
        "binary" => Some(SecretPushFormat::Binary),
        _ => None,
    }
}

fn merge_policy(v: &str) -> Option<MetadataMergePolicy> {
    match v {
        "Merge" => Some(MetadataMergePolicy::Merge),
        "Replace" => Some(MetadataMergePolicy::Replace),
        _ => None,
    }
}

/// Field `key` read by `parse`; a value it does not know fails the object.
fn one_of<T>(
    s: &mut Fields<'_>,
    key: &str,
    notes: &mut Notes,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Option<T>, String> {
    match s.string(key, notes) {
        None => Ok(None),
        Some(v) => parse(&v)
            .map(Some)
            .ok_or_else(|| format!("{}: {} is not a value ESO takes", s.at(key), quoted(&v))),
    }
}
