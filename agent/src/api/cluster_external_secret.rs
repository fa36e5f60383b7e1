//! `ClusterExternalSecret`: one ExternalSecret spec, written by the controller into every
//! namespace the object selects (ESO's kind of the same name and fields).

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::external_secret::{Condition, ExternalSecretSpec};
use super::store::LabelSelector;

/// Stamps an ExternalSecret into each namespace named in `namespaces` or matching any of
/// `namespaceSelectors`; the ExternalSecrets are owned by this object and removed from
/// namespaces that stop matching.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "latchkey.dev",
    version = "v1alpha1",
    kind = "ClusterExternalSecret",
    // Not ESO's `ces`: with both installed, `kubectl get ces` would be ambiguous.
    shortname = "lkces",
    category = "latchkey",
    status = "ClusterExternalSecretStatus",
    printcolumn = r#"{"name": "Store", "type": "string",
                      "jsonPath": ".spec.externalSecretSpec.secretStoreRef.name"}"#,
    printcolumn = r#"{"name": "Refresh Time", "type": "string", "jsonPath": ".spec.refreshTime"}"#,
    printcolumn = r#"{"name": "Status", "type": "string",
                      "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name": "Ready", "type": "string",
                      "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterExternalSecretSpec {
    /// The spec of every ExternalSecret written, as is.
    pub external_secret_spec: ExternalSecretSpec,
    /// Name of the ExternalSecrets (defaults to this object's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = crate::api::rules::MAX_NAME_LEN),
        regex(pattern = crate::api::rules::DNS_SUBDOMAIN.regex)
    )]
    pub external_secret_name: Option<String>,
    /// Labels and annotations given to the ExternalSecrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_secret_metadata: Option<ExternalSecretMetadata>,
    /// Namespaces whose labels match any of these selectors get the ExternalSecret.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::api::rules::MAX_NAMESPACE_SELECTORS))]
    pub namespace_selectors: Vec<LabelSelector>,
    /// Namespaces that get the ExternalSecret by name (besides those the selectors match).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = crate::api::rules::MAX_CES_NAMESPACES),
        inner(length(max = crate::api::rules::MAX_NAMESPACE_LEN),
              regex(pattern = crate::api::rules::DNS_SUBDOMAIN.regex))
    )]
    pub namespaces: Vec<String>,
    /// How often the namespaces are looked at again even without a change seen (default `1m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = crate::api::rules::MAX_DURATION_LEN),
        regex(pattern = crate::api::rules::DURATION.regex)
    )]
    pub refresh_time: Option<String>,
}

/// Metadata given to each ExternalSecret written.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ExternalSecretMetadata {
    /// Labels added to the ExternalSecrets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = crate::api::rules::MAX_CES_METADATA))]
    pub labels: BTreeMap<String, String>,
    /// Annotations added to the ExternalSecrets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = crate::api::rules::MAX_CES_METADATA))]
    pub annotations: BTreeMap<String, String>,
}

/// Observed state, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterExternalSecretStatus {
    /// Name of the ExternalSecrets written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_secret_name: Option<String>,
    /// Namespaces whose ExternalSecret is written and up to date.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub provisioned_namespaces: Vec<String>,
    /// Namespaces that match but could not get their ExternalSecret, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_namespaces: Vec<ClusterExternalSecretNamespaceFailure>,
    /// Standard conditions (`Ready`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One namespace that could not get its ExternalSecret.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ClusterExternalSecretNamespaceFailure {
    /// The namespace.
    pub namespace: String,
    /// Why (never contains values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl ClusterExternalSecret {
    /// The name of the ExternalSecrets this object writes.
    pub fn external_secret_name(&self) -> &str {
        self.spec
            .external_secret_name
            .as_deref()
            .or(self.metadata.name.as_deref())
            .unwrap_or_default()
    }
}
