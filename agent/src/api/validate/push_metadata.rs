//! A PushSecret entry's `metadata`: bounded maps without Latchkey's reserved mark, and the
//! fields ESO has that Latchkey does not implement yet refused by name.

use super::Invalid;
use super::fields::not_empty;
use crate::api::push_metadata::{
    MARK_KEY, MARK_LABEL, MAX_METADATA_KEY_LEN, MAX_METADATA_VALUE_LEN, MetadataMergePolicy,
    PushSecretMetadata,
};
use crate::api::rules;

/// Checks `metadata` of the entry at `path` (`spec.data[i]`).
pub(super) fn metadata(path: &str, metadata: &PushSecretMetadata) -> Result<(), Invalid> {
    let spec = &metadata.spec;
    let at = format!("{path}.metadata.spec");
    for (field, map, max) in spec.maps() {
        if map.len() > max {
            return Err(Invalid::schema(
                format_args!("{at}.{field}"),
                rules::too_many_properties(max),
            ));
        }
        for (key, value) in map {
            not_empty(format_args!("{at}.{field}"), key)?;
            if key.chars().count() > MAX_METADATA_KEY_LEN
                || value.chars().count() > MAX_METADATA_VALUE_LEN
            {
                return Err(Invalid(format!(
                    "{at}.{field}[{key:.64}]: keys are at most {MAX_METADATA_KEY_LEN} \
                     characters and values at most {MAX_METADATA_VALUE_LEN}"
                )));
            }
        }
    }
    let reserved = [
        ("tags", spec.tags.contains_key(MARK_KEY), MARK_KEY),
        (
            "customMetadata",
            spec.custom_metadata.contains_key(MARK_KEY),
            MARK_KEY,
        ),
        ("labels", spec.labels.contains_key(MARK_LABEL), MARK_LABEL),
    ];
    for (field, set, key) in reserved {
        if set {
            return Err(Invalid(format!(
                "{at}.{field}: {key:?} is Latchkey's mark of what it wrote and cannot be set"
            )));
        }
    }
    for (field, text) in [
        ("description", &spec.description),
        ("kmsKeyId", &spec.kms_key_id),
    ] {
        if text
            .as_ref()
            .is_some_and(|t| t.chars().count() > MAX_METADATA_VALUE_LEN)
        {
            return Err(Invalid::schema(
                format_args!("{at}.{field}"),
                rules::too_long(MAX_METADATA_VALUE_LEN),
            ));
        }
    }
    if spec.resource_policy.is_some() {
        return Err(Invalid(format!(
            "{at}.resourcePolicy is not supported yet; set the policy on the secret in AWS"
        )));
    }
    if spec.source_merge_policy == Some(MetadataMergePolicy::Merge) {
        return Err(Invalid(format!(
            "{at}.sourceMergePolicy: Merge (copying the source Secret's labels and \
             annotations, which may hold kubectl's copy of its values) is not supported; list \
             the labels and annotations to set, with sourceMergePolicy: Replace or unset"
        )));
    }
    if let Some(ns) = &spec.remote_namespace {
        super::fields::name(format_args!("{at}.remoteNamespace"), ns)?;
    }
    Ok(())
}
