//! `spec.data[].metadata` of a PushSecret: ESO's `PushSecretMetadata` envelope, with the
//! settings of every provider Latchkey writes in one typed, bounded `spec` (each provider takes
//! its own fields and refuses the others by name, so none is dropped in silence).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `apiVersion` of the envelope, as ESO writes it (so that an ESO manifest carries over as is).
pub const METADATA_API_VERSION: &str = "kubernetes.external-secrets.io/v1alpha1";
/// `kind` of the envelope.
pub const METADATA_KIND: &str = "PushSecretMetadata";

/// The tag (AWS), custom metadata (Vault) or ESS plugin metadata key Latchkey marks what it
/// created with: reserved, a PushSecret cannot set it.
pub const MARK_KEY: &str = "managed-by";
/// The value of [`MARK_KEY`].
pub const MARK_VALUE: &str = "latchkey";
/// The label marking a Secret the kubernetes provider created (Kubernetes' recommended
/// `managed-by` label): reserved too.
pub const MARK_LABEL: &str = "app.kubernetes.io/managed-by";

/// The fields of [`PushMetadataSpec`], by their names in the manifest, in its order.
pub const ALL_FIELDS: [&str; 13] = [
    "tags",
    "description",
    "kmsKeyId",
    "secretPushFormat",
    "resourcePolicy",
    "replicationLocations",
    "customMetadata",
    "mergePolicy",
    "labels",
    "annotations",
    "sourceMergePolicy",
    "targetMergePolicy",
    "remoteNamespace",
];

/// Most AWS tags on one secret (Secrets Manager's own limit).
pub const MAX_TAGS: usize = 50;
/// Most Vault custom metadata keys (Vault's own limit).
pub const MAX_CUSTOM_METADATA: usize = 64;
/// Most labels, and most annotations, set on a Secret by the kubernetes provider.
pub const MAX_LABELS: usize = 64;
/// Longest key of any of those maps.
pub const MAX_METADATA_KEY_LEN: usize = 253;
/// Longest value of any of those maps, and of `description` and `kmsKeyId` (AWS: 2048).
pub const MAX_METADATA_VALUE_LEN: usize = 2048;

/// A field of ESO's PushSecret that Latchkey does not implement yet. Declared (as an object with
/// no known fields) so that the API server keeps it and the rules can refuse it, instead of
/// pruning it and pushing something else than the author meant.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct NotSupported {}

/// Provider settings of the remote secret one entry writes, in ESO's envelope.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PushSecretMetadata {
    /// `kubernetes.external-secrets.io/v1alpha1`.
    pub api_version: MetadataApiVersion,
    /// `PushSecretMetadata`.
    pub kind: MetadataKind,
    /// The settings.
    #[serde(default)]
    pub spec: PushMetadataSpec,
}

/// The only `apiVersion` of the envelope.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum MetadataApiVersion {
    /// ESO's.
    #[default]
    #[serde(rename = "kubernetes.external-secrets.io/v1alpha1")]
    V1alpha1,
}

/// The only `kind` of the envelope.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum MetadataKind {
    /// ESO's.
    #[default]
    PushSecretMetadata,
}

/// Every provider's settings; a provider refuses a field it does not take, naming it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PushMetadataSpec {
    /// AWS Secrets Manager: tags of the secret (besides Latchkey's `managed-by`); when set, the
    /// secret carries exactly these (and the mark), as ESO does.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_TAGS))]
    pub tags: BTreeMap<String, String>,
    /// AWS Secrets Manager: the secret's description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_METADATA_VALUE_LEN))]
    pub description: Option<String>,
    /// AWS Secrets Manager: the KMS key the secret is encrypted with (ARN, id or alias).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_METADATA_VALUE_LEN))]
    pub kms_key_id: Option<String>,
    /// AWS Secrets Manager: `string` (SecretString; the value must be UTF-8) or `binary`
    /// (SecretBinary); unset: text as a string, anything else as binary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_push_format: Option<SecretPushFormat>,
    /// AWS Secrets Manager's resource policy from a ConfigMap or Secret: refused (not yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_policy: Option<NotSupported>,
    /// AWS Secrets Manager: the regions the secret is replicated to (exactly those, when set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub replication_locations: Option<Vec<String>>,
    /// Vault KV v2 (and plugins): custom metadata of the secret (besides `managed-by`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_CUSTOM_METADATA))]
    pub custom_metadata: BTreeMap<String, String>,
    /// Vault KV v2: `Merge` (default; the secret's other custom metadata is kept) or `Replace`
    /// (it holds exactly `customMetadata` and the mark).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_policy: Option<MetadataMergePolicy>,
    /// kubernetes: labels of the Secret written (besides Latchkey's mark).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_LABELS))]
    pub labels: BTreeMap<String, String>,
    /// kubernetes: annotations of the Secret written.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_LABELS))]
    pub annotations: BTreeMap<String, String>,
    /// kubernetes: `Replace` only: the Secret gets `labels` and `annotations`, never the
    /// source Secret's (whose annotations may hold kubectl's copy of its values). ESO's
    /// default `Merge` is refused rather than ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_merge_policy: Option<MetadataMergePolicy>,
    /// kubernetes: `Merge` (default; the Secret's other labels and annotations are kept),
    /// `Replace` (it holds exactly these and the mark) or `Ignore` (left as they are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_merge_policy: Option<TargetMergePolicy>,
    /// kubernetes: the namespace written; only the store's own (`remoteNamespace`, default the
    /// PushSecret's) is taken, another one is refused: a store's credential reaches only
    /// where its author pointed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::api::rules::MAX_NAMESPACE_LEN))]
    pub remote_namespace: Option<String>,
}

/// `secretPushFormat`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum SecretPushFormat {
    /// SecretString.
    String,
    /// SecretBinary.
    Binary,
}

/// `mergePolicy`, `sourceMergePolicy`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum MetadataMergePolicy {
    /// What is there is kept, these are added or changed.
    #[default]
    Merge,
    /// Exactly these.
    Replace,
}

/// `targetMergePolicy`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum TargetMergePolicy {
    /// What is there is kept, these are added or changed.
    #[default]
    Merge,
    /// Exactly these.
    Replace,
    /// Left as they are.
    Ignore,
}

impl PushMetadataSpec {
    /// The fields set, by their names in the manifest.
    pub fn fields(&self) -> Vec<&'static str> {
        let set = [
            !self.tags.is_empty(),
            self.description.is_some(),
            self.kms_key_id.is_some(),
            self.secret_push_format.is_some(),
            self.resource_policy.is_some(),
            self.replication_locations.is_some(),
            !self.custom_metadata.is_empty(),
            self.merge_policy.is_some(),
            !self.labels.is_empty(),
            !self.annotations.is_empty(),
            self.source_merge_policy.is_some(),
            self.target_merge_policy.is_some(),
            self.remote_namespace.is_some(),
        ];
        ALL_FIELDS
            .into_iter()
            .zip(set)
            .filter_map(|(name, on)| on.then_some(name))
            .collect()
    }

    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.fields().is_empty()
    }

    /// The maps, by field name, for the checks every map gets.
    pub fn maps(&self) -> [(&'static str, &BTreeMap<String, String>, usize); 4] {
        [
            ("tags", &self.tags, MAX_TAGS),
            ("customMetadata", &self.custom_metadata, MAX_CUSTOM_METADATA),
            ("labels", &self.labels, MAX_LABELS),
            ("annotations", &self.annotations, MAX_LABELS),
        ]
    }
}
