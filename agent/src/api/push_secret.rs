//! `PushSecret`: the reverse of an ExternalSecret, a Secret of the namespace written into one or
//! more stores (ESO's kind of the same name and fields), as the PushSecret's service account.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::external_secret::{Condition, GeneratorRef, StoreKind, Template};
pub use super::push_metadata::NotSupported;
use super::push_metadata::PushSecretMetadata;
use super::store::LabelSelector;

// The `x-kubernetes-validations` rules below come from `super::rules`, which documents them; the
// agent re-checks them in `super::validate::push_secret`.

/// Writes keys of a Secret of its namespace into the stores it names, again whenever the Secret
/// changes, and never over a remote secret Latchkey did not write.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "latchkey.dev",
    version = "v1alpha1",
    kind = "PushSecret",
    namespaced,
    // Not ESO's `ps`: with both installed, `kubectl get ps` would be ambiguous.
    shortname = "lkps",
    category = "latchkey",
    status = "PushSecretStatus",
    printcolumn = r#"{"name": "Secret", "type": "string", "jsonPath": ".spec.selector.secret.name"}"#,
    printcolumn = r#"{"name": "Refresh Interval", "type": "string",
                      "jsonPath": ".spec.refreshInterval"}"#,
    printcolumn = r#"{"name": "Status", "type": "string",
                      "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name": "Ready", "type": "string",
                      "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = &crate::api::rules::PUSH_STORES_AND_DATA)]
#[serde(rename_all = "camelCase")]
pub struct PushSecretSpec {
    /// The stores written to, each one with every entry of `data`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::api::rules::MAX_PUSH_STORES))]
    pub secret_store_refs: Vec<PushSecretStoreRef>,
    /// What is pushed: a Secret of this namespace.
    pub selector: PushSecretSelector,
    /// Which keys of the Secret go where.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::api::rules::MAX_PUSH_DATA))]
    pub data: Vec<PushSecretData>,
    /// How often the stores are written again even without a change seen (e.g. `1h`, at most
    /// `8760h`, default `1h`); `0`: only when the Secret changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = crate::api::rules::MAX_DURATION_LEN),
        regex(pattern = crate::api::rules::DURATION.regex)
    )]
    #[x_kube(validation = &crate::api::rules::REFRESH_INTERVAL_MAX)]
    pub refresh_interval: Option<String>,
    /// `Replace` (default): write over what Latchkey wrote before; `IfNotExists`: write only a
    /// remote secret that does not exist yet.
    #[serde(default)]
    pub update_policy: PushUpdatePolicy,
    /// `None` (default): pushed values stay when the PushSecret or an entry goes; `Delete`:
    /// remove what Latchkey pushed (and only that).
    #[serde(default)]
    pub deletion_policy: PushDeletionPolicy,
    /// Service account the Secret is read and the stores written as (defaults to `default`);
    /// it must opt in as for a mirrored Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = crate::api::rules::MAX_NAME_LEN),
        regex(pattern = crate::api::rules::DNS_SUBDOMAIN.regex)
    )]
    pub service_account_name: Option<String>,
    /// CEL templates over the source Secret's keys (`secret`), computing the keys that
    /// `data[].match.secretKey` then picks, as an ExternalSecret's `target.template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PushSecretTemplate>,
}

/// A PushSecret's `template`: the ExternalSecret's CEL template (`data`, `mergePolicy`), plus
/// ESO's Go-template fields, declared only so that the rules refuse them instead of the API
/// server pruning them (which would push something else than the author meant).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(validation = &crate::api::rules::PUSH_TEMPLATE_CEL)]
#[x_kube(validation = &crate::api::rules::PUSH_TEMPLATE_NO_SECRET_FIELDS)]
#[serde(rename_all = "camelCase")]
pub struct PushSecretTemplate {
    /// Output key -> CEL expression over `secret` (the source Secret's keys); `mergePolicy`
    /// `Replace` (default: only these keys) or `Merge` (the Secret's keys plus these). `type`
    /// and `metadata` shape a Secret, which a push does not write: refused when set.
    #[serde(flatten)]
    pub template: Template,
    /// ESO's Go template engine version: refused (Latchkey templates are CEL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::api::rules::MAX_NAME_LEN))]
    pub engine_version: Option<String>,
    /// ESO's templates read from ConfigMaps or Secrets: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_from: Option<Vec<NotSupported>>,
}

/// One store a PushSecret writes to, by name, or every store of `kind` its `labelSelector`
/// matches (exactly one of the two).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(validation = &crate::api::rules::PUSH_STORE_BY_NAME)]
#[serde(rename_all = "camelCase")]
pub struct PushSecretStoreRef {
    /// Name of the store (unset: the ref selects stores by `labelSelector`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = crate::api::rules::MAX_NAME_LEN),
        regex(pattern = crate::api::rules::DNS_SUBDOMAIN.regex)
    )]
    #[x_kube(validation = &crate::api::rules::NOT_EMPTY)]
    pub name: Option<String>,
    /// `SecretStore` (default) or `ClusterSecretStore`.
    #[serde(default)]
    pub kind: StoreKind,
    /// Every store of `kind` whose labels match (SecretStores of the PushSecret's namespace;
    /// ClusterSecretStores that admit it); a PushSecret writes at most 16 stores in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
}

/// Where the pushed values come from: exactly one of a Secret and a generator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(validation = &crate::api::rules::PUSH_ONE_SOURCE)]
#[serde(rename_all = "camelCase")]
pub struct PushSecretSelector {
    /// A Secret of the PushSecret's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<PushSecretSource>,
    /// A generator (of the PushSecret's namespace, or a ClusterGenerator), run as the service
    /// account: a new value on the first push and then once per `refreshInterval`, kept in no
    /// Secret; `data[].match.secretKey` names keys of its output (`password`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator_ref: Option<GeneratorRef>,
}

/// The Secret pushed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
pub struct PushSecretSource {
    /// Its name.
    #[schemars(
        length(max = crate::api::rules::MAX_NAME_LEN),
        regex(pattern = crate::api::rules::DNS_SUBDOMAIN.regex)
    )]
    pub name: String,
}

/// One key of the Secret and where it goes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct PushSecretData {
    /// The key and its destination (ESO's `match`).
    #[serde(rename = "match")]
    pub match_: PushSecretMatch,
    /// Provider settings of the remote secret written (AWS tags and description, Vault custom
    /// metadata, labels of a Secret), in ESO's `PushSecretMetadata` envelope; entries writing
    /// one remote secret carry the same, or none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<PushSecretMetadata>,
}

/// A key of the source Secret and the remote place it is written to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PushSecretMatch {
    /// The key of the source Secret.
    #[schemars(length(max = crate::api::rules::MAX_SECRET_KEY_LEN))]
    #[x_kube(validation = &crate::api::rules::NOT_EMPTY)]
    pub secret_key: String,
    /// Where it is written.
    pub remote_ref: PushRemoteRef,
}

/// A remote secret, and optionally one property of it (a key of its JSON object).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PushRemoteRef {
    /// The remote secret's name (AWS) or path (Vault).
    #[schemars(length(max = crate::api::rules::MAX_REMOTE_KEY_LEN))]
    #[x_kube(validation = &crate::api::rules::NOT_EMPTY)]
    pub remote_key: String,
    /// A key of the remote JSON object the value is merged into; unset: the value is the whole
    /// remote secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::api::rules::MAX_REMOTE_KEY_LEN))]
    #[x_kube(validation = &crate::api::rules::NOT_EMPTY)]
    pub property: Option<String>,
}

/// When a remote secret that exists is written.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PushUpdatePolicy {
    /// Written over, if Latchkey wrote it (or the store allows adopting it).
    #[default]
    Replace,
    /// Never written over: only a remote secret that does not exist yet is created.
    IfNotExists,
}

/// What happens to pushed values when the PushSecret (or one of its entries) goes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PushDeletionPolicy {
    /// They stay in the store.
    #[default]
    None,
    /// What Latchkey pushed is removed: the property it wrote, or the remote secret it created.
    Delete,
}

/// Observed state, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PushSecretStatus {
    /// When the stores were last written or checked (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_time: Option<String>,
    /// What was pushed where: store (`<kind>/<name>`) -> remote key -> what it holds. Never values
    /// nor hashes of them (a hash of a short password is as good as the password).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub synced_push_secrets: BTreeMap<String, BTreeMap<String, SyncedPush>>,
    /// Standard conditions (`Ready`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One remote secret a PushSecret wrote.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncedPush {
    /// The properties written into it; empty: the whole remote secret.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub properties: Vec<String>,
    /// The backend's version of what was written (AWS VersionId, Vault KV version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl PushSecret {
    /// The service account the Secret is read and the stores written as.
    pub fn service_account(&self) -> &str {
        self.spec
            .service_account_name
            .as_deref()
            .unwrap_or("default")
    }

    /// The name of the source Secret (empty when the selector names none, which validation
    /// refuses).
    pub fn source_secret(&self) -> &str {
        self.spec
            .selector
            .secret
            .as_ref()
            .map(|s| s.name.as_str())
            .unwrap_or_default()
    }
}

impl PushSecretStoreRef {
    /// The key of a store in `status.syncedPushSecrets`.
    pub fn status_key_of(kind: StoreKind, name: &str) -> String {
        format!("{kind}/{name}")
    }

    /// The ref for messages: `SecretStore/name` (its key in `status.syncedPushSecrets`), or
    /// the kind and the selector (`SecretStore{push=yes}`).
    pub fn describe(&self) -> String {
        match (&self.name, &self.label_selector) {
            (Some(name), _) => Self::status_key_of(self.kind, name),
            (None, Some(selector)) => format!("{}{{{}}}", self.kind, describe_selector(selector)),
            (None, None) => format!("{}{{}}", self.kind),
        }
    }
}

/// A label selector as `kubectl` writes one: `a=b,c in (d,e),!f`.
pub fn describe_selector(selector: &LabelSelector) -> String {
    let labels = selector
        .match_labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"));
    let expressions = selector
        .match_expressions
        .iter()
        .map(|e| match e.operator.as_str() {
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            op => format!("{} {} ({})", e.key, op.to_lowercase(), e.values.join(",")),
        });
    labels.chain(expressions).collect::<Vec<_>>().join(",")
}
