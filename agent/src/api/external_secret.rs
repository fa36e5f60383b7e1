//! `ExternalSecret`: which remote values a volume (or a mirrored Secret) is made of.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// The `x-kubernetes-validations` rules below come from `super::rules`, which documents them; the
// agent re-checks them in `super::validate`.

/// Describes the files a pod's volume is built from and, optionally, a mirrored Secret.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "latchkey.dev",
    version = "v1alpha1",
    kind = "ExternalSecret",
    namespaced,
    // Not ESO's `es`: with both installed, `kubectl get es` would be ambiguous.
    shortname = "lkes",
    category = "latchkey",
    status = "ExternalSecretStatus",
    printcolumn = r#"{"name": "Store", "type": "string", "jsonPath": ".spec.secretStoreRef.name"}"#,
    printcolumn = r#"{"name": "Store Kind", "type": "string", "priority": 1,
                      "jsonPath": ".spec.secretStoreRef.kind"}"#,
    printcolumn = r#"{"name": "Refresh Interval", "type": "string",
                      "jsonPath": ".spec.refreshInterval"}"#,
    printcolumn = r#"{"name": "Status", "type": "string",
                      "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name": "Ready", "type": "string",
                      "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = &crate::api::rules::DATA_OR_DATA_FROM)]
#[serde(rename_all = "camelCase")]
pub struct ExternalSecretSpec {
    /// The store the remote references are resolved against; may be left out when every entry
    /// names a generator (`sourceRef.generatorRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_store_ref: Option<SecretStoreRef>,
    /// How often mounted files and mirrors are refreshed (e.g. `1h`, at most `8760h`); `0`: once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = crate::api::rules::MAX_DURATION_LEN),
        regex(pattern = crate::api::rules::DURATION.regex)
    )]
    #[x_kube(validation = &crate::api::rules::REFRESH_INTERVAL_MAX)]
    pub refresh_interval: Option<String>,
    /// Individual remote values, one entry (file) each; each `secretKey` at most once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = crate::api::rules::MAX_ITEMS),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["secretKey"])
    )]
    pub data: Vec<ExternalSecretData>,
    /// Remote values that expand into several entries; later entries override earlier ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::api::rules::MAX_DATA_FROM))]
    pub data_from: Vec<DataFrom>,
    /// What is produced: templates, file layout and the optional mirrored Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    /// Service account the mirror controller acts as (defaults to `default`); mounts use the pod's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = crate::api::rules::MAX_NAME_LEN),
        regex(pattern = crate::api::rules::DNS_SUBDOMAIN.regex)
    )]
    pub service_account_name: Option<String>,
    /// When the mirror controller refreshes a mirrored Secret: `Periodic` (default, every
    /// `refreshInterval`), `OnChange` (only when the spec changes), `CreatedOnce`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_policy: Option<RefreshPolicy>,
}

/// When a mirrored Secret is refreshed, as in ESO.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RefreshPolicy {
    /// Every `refreshInterval`.
    #[default]
    Periodic,
    /// Only when the ExternalSecret's spec (its generation) changes.
    OnChange,
    /// Written once; never refreshed (a deleted Secret is written again).
    CreatedOnce,
}

/// Points at a SecretStore (same namespace) or a ClusterSecretStore.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretStoreRef {
    /// Name of the store.
    #[schemars(
        length(max = crate::api::rules::MAX_NAME_LEN),
        regex(pattern = crate::api::rules::DNS_SUBDOMAIN.regex)
    )]
    #[x_kube(validation = &crate::api::rules::NOT_EMPTY)]
    pub name: String,
    /// `SecretStore` (default) or `ClusterSecretStore`.
    #[serde(default)]
    pub kind: StoreKind,
}

/// The two kinds of store an ExternalSecret can reference.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum StoreKind {
    /// A namespaced store; only usable from its own namespace.
    #[default]
    SecretStore,
    /// A cluster-wide store; usable from the namespaces its conditions admit.
    ClusterSecretStore,
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoreKind::SecretStore => "SecretStore",
            StoreKind::ClusterSecretStore => "ClusterSecretStore",
        })
    }
}

/// One remote value mapped to one entry.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalSecretData {
    /// Entry name: the file name (a relative path) in the volume, the key in a mirrored Secret.
    #[schemars(
        length(max = crate::api::rules::MAX_SECRET_KEY_LEN),
        regex(pattern = crate::api::rules::FILE_PATH.regex)
    )]
    #[x_kube(validation = &crate::api::rules::NOT_EMPTY)]
    pub secret_key: String,
    /// Where the value comes from; with `sourceRef.generatorRef`, `key` picks one key of the
    /// generated result.
    pub remote_ref: RemoteRef,
    /// A generator instead of the ExternalSecret's store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_ref: Option<SourceRef>,
}

/// A reference to a value in the backend.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemoteRef {
    /// The remote key (secret name or path).
    #[x_kube(validation = &crate::api::rules::NOT_EMPTY)]
    pub key: String,
    /// A top-level key of a JSON value, or a dotted path into nested JSON; empty = whole value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub property: Option<String>,
    /// Provider-specific version (AWS VersionStage or `uuid/<VersionId>`, Vault KV version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// How to decode the fetched value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoding_strategy: Option<DecodingStrategy>,
}

/// Decoding applied to a fetched value, as in ESO.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DecodingStrategy {
    /// Use the value as is.
    #[default]
    None,
    /// Standard base64.
    Base64,
    /// URL-safe base64.
    #[serde(rename = "Base64URL")]
    Base64Url,
    /// Base64 or Base64URL when the value decodes, else as is.
    Auto,
}

/// A remote value that expands into several entries: exactly one of `extract`, `find`,
/// `sourceRef.generatorRef`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(validation = &crate::api::rules::EXTRACT_XOR_FIND)]
#[serde(rename_all = "camelCase")]
pub struct DataFrom {
    /// A JSON object whose top-level keys become entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extract: Option<RemoteRef>,
    /// Every remote secret whose name matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub find: Option<FindRef>,
    /// A generator: every key of its result becomes an entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_ref: Option<SourceRef>,
    /// Renames applied, in order, to the entry names this source produces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::api::rules::MAX_REWRITES))]
    pub rewrite: Vec<Rewrite>,
}

/// Selects remote secrets by name, path and/or tags (at least one of them).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(validation = &crate::api::rules::FIND_NAME_OR_PATH)]
#[serde(rename_all = "camelCase")]
pub struct FindRef {
    /// Only look below this path (providers with hierarchical keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Name filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<FindName>,
    /// Only secrets carrying every one of these tags (key and value); `aws` stores only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = crate::api::rules::MAX_FIND_TAGS))]
    pub tags: BTreeMap<String, String>,
    /// How to decode each fetched value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoding_strategy: Option<DecodingStrategy>,
}

/// A regular expression over remote secret names.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct FindName {
    /// The regular expression (RE2 syntax, unanchored unless `^`/`$` are used).
    pub regexp: String,
}

/// One rename step.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Rewrite {
    /// Replace every match of `source` by `target` (which may use `$1`-style groups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regexp: Option<RewriteRegexp>,
}

/// The regular-expression rename.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct RewriteRegexp {
    /// Pattern to match in the entry name.
    pub source: String,
    /// Replacement.
    pub target: String,
}

/// What an ExternalSecret produces.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(
    validation = &crate::api::rules::DELETE_NEEDS_OWNER,
    validation = &crate::api::rules::MERGE_NEEDS_MIRROR
)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// CEL templates computed from the resolved entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<Template>,
    /// File layout and modes in the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<Files>,
    /// Name of the mirrored Secret (defaults to the ExternalSecret's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = crate::api::rules::MAX_NAME_LEN),
        regex(pattern = crate::api::rules::DNS_SUBDOMAIN.regex)
    )]
    pub name: Option<String>,
    /// Whether and how a Kubernetes Secret is mirrored; `None` (default) means mount only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_policy: Option<CreationPolicy>,
    /// What happens to mirrored data when the remote value disappears.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<DeletionPolicy>,
    /// Make the mirrored Secret immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub immutable: Option<bool>,
}

/// Output entries computed by CEL expressions.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Template {
    /// Output key -> CEL expression over `secret` (and `pod` on mounts).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = crate::api::rules::MAX_TEMPLATE_KEYS))]
    pub data: BTreeMap<String, String>,
    /// `Replace` (default): the entries are only the template keys; `Merge`: the resolved
    /// entries plus the template keys, which override them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_policy: Option<TemplateMergePolicy>,
    /// `type` of a mirrored Secret (default `Opaque`); unused by mounts.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::api::rules::MAX_NAME_LEN))]
    pub type_: Option<String>,
    /// Labels and annotations of a mirrored Secret; unused by mounts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
}

/// Metadata given to a mirrored Secret.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct TemplateMetadata {
    /// Labels added to the Secret.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations added to the Secret.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// How template output combines with the resolved entries, as in ESO.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum TemplateMergePolicy {
    /// Only the template keys.
    #[default]
    Replace,
    /// The resolved entries plus the template keys, which override them.
    Merge,
}

/// File layout in the mounted volume.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Files {
    /// Mode of every file without its own (default 0444), at most 0777; write bits are dropped.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::mode::deserialize"
    )]
    #[x_kube(validation = &crate::api::rules::FILE_MODE)]
    pub default_mode: Option<i32>,
    /// Explicit key -> path mappings; when set, only these keys are written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::api::rules::MAX_ITEMS))]
    pub items: Vec<FileItem>,
}

/// One key written to a chosen relative path.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
pub struct FileItem {
    /// Entry name.
    pub key: String,
    /// Relative path in the volume; no segment is empty, `.` or starts with `..`.
    #[schemars(
        length(max = crate::api::rules::MAX_FILE_PATH_LEN),
        regex(pattern = crate::api::rules::FILE_PATH.regex)
    )]
    pub path: String,
    /// File mode (e.g. 0400), at most 0777; write bits are dropped (the volume is read-only).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::mode::deserialize"
    )]
    #[x_kube(validation = &crate::api::rules::FILE_MODE)]
    pub mode: Option<i32>,
}

/// Mirroring behaviour, as in ESO.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CreationPolicy {
    /// Mount only; no Kubernetes Secret is created.
    #[default]
    None,
    /// Create the Secret, owned by the ExternalSecret.
    Owner,
    /// Create the Secret without an owner reference.
    Orphan,
    /// Merge into an existing Secret.
    Merge,
}

/// Mirrored-data behaviour when the remote value is gone, as in ESO.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    /// Keep the Secret as it is.
    #[default]
    Retain,
    /// Delete the Secret.
    Delete,
    /// Remove only the keys Latchkey manages.
    Merge,
}

/// Observed state, written by the mirror controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalSecretStatus {
    /// Standard conditions (`Ready`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// When the values were last fetched (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_time: Option<String>,
    /// The `metadata.generation` of the ExternalSecret the mirrored Secret was last written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synced_resource_version: Option<String>,
    /// The mirrored Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<SecretBinding>,
}

/// Names the Secret an ExternalSecret is mirrored into.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct SecretBinding {
    /// Secret name, in the ExternalSecret's namespace.
    pub name: String,
}

/// A status condition.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Condition type, e.g. `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Machine-readable reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable message (never contains values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Last transition (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// Points at a generator: a namespaced kind in the ExternalSecret's namespace, or a
/// `ClusterGenerator`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GeneratorRef {
    /// `generators.latchkey.dev/v1alpha1` (default).
    #[serde(default = "default_generator_api_version")]
    pub api_version: String,
    /// `Password`, `VaultDynamicSecret`, `PluginGenerator` or `ClusterGenerator`.
    #[schemars(regex(
        pattern = r"^(Password|VaultDynamicSecret|PluginGenerator|ClusterGenerator)$"
    ))]
    pub kind: String,
    /// Name of the generator.
    #[schemars(
        length(max = crate::api::rules::MAX_NAME_LEN),
        regex(pattern = crate::api::rules::DNS_SUBDOMAIN.regex)
    )]
    pub name: String,
}

fn default_generator_api_version() -> String {
    crate::api::GENERATOR_API_VERSION.to_string()
}

impl std::fmt::Display for GeneratorRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} \"{}\"", self.kind, self.name)
    }
}

/// Where a `data[]` or `dataFrom[]` entry comes from when it is not the ExternalSecret's store.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceRef {
    /// A generator: the entry's values are made for this volume (or mirrored Secret) alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator_ref: Option<GeneratorRef>,
}
