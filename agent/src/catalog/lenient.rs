//! Objects from the API server that this agent may not be able to read. A CRD applied by a newer
//! (or older) release, or an object stored before a schema change, can fail to deserialize into
//! the agent's types. Listed as the types themselves, one such object fails the whole list, and
//! the watch retries forever: the catalog never syncs and no pod on the node gets a volume.
//! [`Lenient`] deserializes every object that has metadata, keeping the ones it cannot read as
//! [`Lenient::Unusable`] with the reason, so the others keep being served and a pod that names
//! the bad one is told why.
//!
//! Not for validation rules (see `api::validate`): an object that deserializes is usable here.

use std::borrow::Cow;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{DeserializeOwned, Deserializer};
use serde::{Deserialize, Serialize};

use crate::telemetry::escape::printable;

/// Longest reason kept from a deserialization error.
const MAX_REASON_CHARS: usize = 300;

/// An object of kind `K` as the API server sent it: readable or not.
#[derive(Debug, Clone)]
pub enum Lenient<K> {
    /// The object as the agent's types read it.
    Usable(Arc<K>),
    /// An object whose body does not fit the agent's types.
    Unusable {
        /// Its metadata (name, namespace, resourceVersion), read on its own; boxed, as it is
        /// much larger than the usable variant.
        metadata: Box<ObjectMeta>,
        /// Which field failed and why, without any value from the object.
        reason: String,
    },
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Buffered once so a failure can still read the metadata; watch events are rare
        // enough that the second pass costs nothing that matters.
        let value = serde_json::Value::deserialize(deserializer)?;
        match serde_path_to_error::deserialize::<_, K>(&value) {
            Ok(object) => Ok(Self::Usable(Arc::new(object))),
            Err(err) => {
                let metadata = value
                    .get("metadata")
                    .cloned()
                    .and_then(|m| serde_json::from_value::<Box<ObjectMeta>>(m).ok())
                    .ok_or_else(|| serde::de::Error::custom("object without usable metadata"))?;
                let path = err.path().to_string();
                let reason = without_values(&err.into_inner().to_string());
                let reason = if path.is_empty() || path == "." {
                    reason
                } else {
                    format!("{path}: {reason}")
                };
                Ok(Self::Unusable {
                    metadata,
                    reason: printable(&reason, MAX_REASON_CHARS),
                })
            }
        }
    }
}

/// The catalog never writes objects back; serializing exists only because kube's client
/// traits ask for it, and writes the metadata alone.
impl<K: Serialize> Serialize for Lenient<K> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Usable(object) => object.serialize(serializer),
            Self::Unusable { metadata, .. } => {
                #[derive(Serialize)]
                struct MetadataOnly<'a> {
                    metadata: &'a ObjectMeta,
                }
                MetadataOnly { metadata }.serialize(serializer)
            }
        }
    }
}

impl<K: Resource + Clone> Resource for Lenient<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        match self {
            Self::Usable(object) => object.meta(),
            Self::Unusable { metadata, .. } => metadata,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Self::Usable(object) => Arc::make_mut(object).meta_mut(),
            Self::Unusable { metadata, .. } => metadata,
        }
    }
}

/// A serde error message with the offending value left out: "invalid type: string \"x\",
/// expected u32" becomes "invalid type, expected u32", "unknown variant `x`, expected one of
/// ..." becomes "unknown variant, expected one of ...". Field names and the expected variants
/// stay; values go, since a store's spec can hold secret material (the `fake` provider's data).
pub(super) fn without_values(message: &str) -> String {
    for kind in [
        "invalid type",
        "invalid value",
        "invalid length",
        "unknown variant",
    ] {
        if message.starts_with(kind) {
            return match message.rsplit_once(", expected ") {
                Some((_, expected)) => format!("{kind}, expected {expected}"),
                None => kind.to_string(),
            };
        }
    }
    message.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ExternalSecret;

    fn parse(json: serde_json::Value) -> Lenient<ExternalSecret> {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_readable_object_is_usable() {
        let es = parse(serde_json::json!({
            "apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
            "metadata": {"name": "app", "namespace": "shop"},
            "spec": {"secretStoreRef": {"name": "s"}, "data": [
                {"secretKey": "k", "remoteRef": {"key": "r"}}]}
        }));
        assert!(matches!(es, Lenient::Usable(_)), "{es:?}");
        assert_eq!(es.meta().name.as_deref(), Some("app"));
    }

    #[test]
    fn an_unreadable_object_keeps_its_name_and_says_where_without_values() {
        let es = parse(serde_json::json!({
            "apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
            "metadata": {"name": "broken", "namespace": "shop", "resourceVersion": "7"},
            "spec": {"secretStoreRef": {"name": "s"}, "data": [
                {"secretKey": "k", "remoteRef": {"key": ["hunter2-the-password"]}}]}
        }));
        let Lenient::Unusable { metadata, reason } = &es else {
            panic!("{es:?}")
        };
        assert_eq!(metadata.name.as_deref(), Some("broken"));
        assert_eq!(es.meta().resource_version.as_deref(), Some("7"));
        assert!(
            reason.starts_with("spec.data[0].remoteRef.key: "),
            "{reason}"
        );
        assert!(!reason.contains("hunter2"), "{reason}");
    }

    #[test]
    fn values_are_cut_from_serde_messages() {
        assert_eq!(
            without_values("invalid type: string \"s3cr3t\", expected u32"),
            "invalid type, expected u32"
        );
        assert_eq!(
            without_values("invalid value: integer `-1`, expected u32"),
            "invalid value, expected u32"
        );
        assert_eq!(
            without_values("unknown variant `hunter2`, expected `Data` or `Raw`"),
            "unknown variant, expected `Data` or `Raw`"
        );
        assert_eq!(
            without_values("missing field `spec`"),
            "missing field `spec`"
        );
    }

    #[test]
    fn an_object_without_metadata_is_an_error() {
        let err = serde_json::from_value::<Lenient<ExternalSecret>>(serde_json::json!({
            "spec": {}
        }))
        .unwrap_err();
        assert!(err.to_string().contains("metadata"), "{err}");
    }
}
