//! `SecretStore` and `ClusterSecretStore`: how to reach a backend and authenticate to it.

use super::store_push::StorePush;
use std::fmt;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::external_secret::Condition;

/// A namespaced store, usable only by ExternalSecrets of its own namespace.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "latchkey.dev",
    version = "v1alpha1",
    kind = "SecretStore",
    namespaced,
    // Not ESO's `ss`: with both installed, `kubectl get ss` would be ambiguous.
    shortname = "lkss",
    category = "latchkey",
    status = "StoreStatus",
    printcolumn = r#"{"name": "Provider", "type": "string", "jsonPath": ".status.provider"}"#,
    printcolumn = r#"{"name": "Status", "type": "string",
                      "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name": "Ready", "type": "string",
                      "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = &crate::api::rules::AGENT_IDENTITY_CLUSTER_ONLY)]
#[x_kube(validation = &crate::api::rules::PROVIDER_OR_REF)]
#[x_kube(validation = &crate::api::rules::PROVIDER_REF_NAMESPACED)]
#[serde(rename_all = "camelCase")]
pub struct SecretStoreSpec {
    /// The backend, inline: exactly one provider block. Exactly one of this and `providerRef`.
    #[serde(default, skip_serializing_if = "StoreProvider::is_empty")]
    pub provider: StoreProvider,
    /// The backend as a provider object of the store's own namespace
    /// (`providers.latchkey.dev/v1alpha1`). Exactly one of this and `provider`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<ProviderRef>,
    /// What PushSecrets may do with this store beyond what Latchkey created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<StorePush>,
}

/// A cluster-wide store, usable from the namespaces its `conditions` admit.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "latchkey.dev",
    version = "v1alpha1",
    kind = "ClusterSecretStore",
    // Not ESO's `css`: with both installed, `kubectl get css` would be ambiguous.
    shortname = "lkcss",
    category = "latchkey",
    status = "StoreStatus",
    printcolumn = r#"{"name": "Provider", "type": "string", "jsonPath": ".status.provider"}"#,
    printcolumn = r#"{"name": "Status", "type": "string",
                      "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name": "Ready", "type": "string",
                      "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = &crate::api::rules::PROVIDER_OR_REF)]
#[x_kube(validation = &crate::api::rules::PROVIDER_REF_CLUSTER)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSecretStoreSpec {
    /// The backend, inline: exactly one provider block. Exactly one of this and `providerRef`.
    #[serde(default, skip_serializing_if = "StoreProvider::is_empty")]
    pub provider: StoreProvider,
    /// The backend as a cluster-scoped provider object
    /// (`cluster.providers.latchkey.dev/v1alpha1`). Exactly one of this and `provider`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<ProviderRef>,
    /// What PushSecrets may do with this store beyond what Latchkey created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<StorePush>,
    /// Which namespaces may use the store; empty admits every namespace (as in ESO).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<ClusterStoreCondition>,
}

/// One admission rule, with ESO's meaning: a namespace is admitted when any condition matches
/// it, and a condition matches when ANY of its criteria does (name listed, OR a regex matches,
/// OR the selector matches). Several criteria in one condition admit the union.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStoreCondition {
    /// Namespaces admitted by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Namespaces admitted by a label selector on the Namespace object (an invalid requirement
    /// admits nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Namespaces admitted by regular expression over the name (unanchored; invalid ones admit
    /// nothing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespace_regexes: Vec<String>,
}

/// A Kubernetes label selector (`matchLabels` and `matchExpressions`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels that must all be present with these values.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub match_labels: std::collections::BTreeMap<String, String>,
    /// Set-based requirements.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// A set-based label requirement.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct LabelSelectorRequirement {
    /// Label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// Values for `In` / `NotIn`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// Names the provider object a store uses (issue #41): a SecretStore's in its own namespace
/// (`providers.latchkey.dev`), a ClusterSecretStore's cluster-scoped
/// (`cluster.providers.latchkey.dev`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderRef {
    /// `providers.latchkey.dev/v1alpha1` (SecretStore) or
    /// `cluster.providers.latchkey.dev/v1alpha1` (ClusterSecretStore).
    #[schemars(length(max = crate::api::rules::MAX_NAME_LEN))]
    pub api_version: String,
    /// The provider kind: `AWS`, `Vault`, `Kubernetes`, `Fake`, `Plugin` or
    /// `SecretsStoreCSIProvider`.
    pub kind: crate::api::provider_kind::ProviderKind,
    /// The provider object's name.
    #[schemars(
        length(max = crate::api::rules::MAX_NAME_LEN),
        regex(pattern = crate::api::rules::DNS_SUBDOMAIN.regex)
    )]
    pub name: String,
}

impl StoreProvider {
    /// True when no provider block is set (the store names a `providerRef` instead).
    pub fn is_empty(&self) -> bool {
        *self == StoreProvider::default()
    }
}

/// The backend of a store: exactly one of these blocks is set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(validation = &crate::api::rules::ONE_PROVIDER)]
#[serde(rename_all = "camelCase")]
pub struct StoreProvider {
    /// AWS Secrets Manager or Parameter Store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws: Option<AwsProvider>,
    /// HashiCorp Vault or OpenBao.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vault: Option<VaultProvider>,
    /// Secrets of the pod's own namespace, read as the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesProvider>,
    /// Inline values, for demos and tests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fake: Option<FakeProvider>,
    /// An out-of-tree secret-store plugin speaking Crossplane's External Secret Store protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<PluginProvider>,
    /// A provider pod of the Kubernetes Secrets Store CSI Driver (Azure Key Vault, GCP, AWS,
    /// Vault, ...), reached on its socket in the agent's `--secrets-store-provider-dir`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "secretsStoreCSI"
    )]
    pub secrets_store_csi: Option<SecretsStoreCsiProvider>,
}

/// A reference to one key of a Kubernetes Secret holding a credential.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct SecretKeySelector {
    /// Secret name.
    #[schemars(
        length(max = crate::api::rules::MAX_NAME_LEN),
        regex(pattern = crate::api::rules::DNS_SUBDOMAIN.regex)
    )]
    pub name: String,
    /// Key in the Secret's data.
    pub key: String,
    /// Namespace; only meaningful for ClusterSecretStores (must be the agent's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// AWS Secrets Manager or Systems Manager Parameter Store.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AwsProvider {
    /// `SecretsManager` (default) or `ParameterStore`.
    #[serde(default = "default_aws_service")]
    #[x_kube(validation = &crate::api::rules::AWS_SERVICE)]
    pub service: String,
    /// AWS region, e.g. `eu-west-1`.
    pub region: String,
    /// Endpoint override (VPC endpoints, tests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Role ARN assumed after authenticating.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// How to authenticate; at most one method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AwsAuth>,
}

fn default_aws_service() -> String {
    "SecretsManager".to_string()
}

/// AWS authentication methods; at most one is set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(validation = &crate::api::rules::AWS_AUTH_AT_MOST_ONE)]
#[serde(rename_all = "camelCase")]
pub struct AwsAuth {
    /// Static keys from a Kubernetes Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<AwsSecretRef>,
    /// Web identity with the pod's own projected service-account token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt: Option<AwsJwtAuth>,
    /// The agent's own default credential chain (must be chosen explicitly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_identity: Option<Empty>,
}

/// Static AWS keys.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AwsSecretRef {
    /// Access key id.
    #[serde(rename = "accessKeyIDSecretRef")]
    pub access_key_id_secret_ref: SecretKeySelector,
    /// Secret access key.
    pub secret_access_key_secret_ref: SecretKeySelector,
    /// Optional session token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token_secret_ref: Option<SecretKeySelector>,
}

/// Web identity settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct AwsJwtAuth {
    /// Token audience (default `sts.amazonaws.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
}

/// An empty object, for options that are switched on by their presence.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Empty {}

/// HashiCorp Vault / OpenBao.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct VaultProvider {
    /// Server URL, e.g. `https://vault.example:8200`.
    pub server: String,
    /// KV mount path, e.g. `secret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// KV engine version: `v1` or `v2` (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = &crate::api::rules::VAULT_VERSION)]
    pub version: Option<String>,
    /// Vault Enterprise / OpenBao namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// PEM CA bundle, base64-encoded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
    /// A PEM CA bundle in a Secret or ConfigMap, as ESO's `caProvider`; trusted along with
    /// `caBundle` when both are set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_provider: Option<CaProvider>,
    /// How to authenticate; exactly one method.
    pub auth: VaultAuth,
}

/// Where a PEM CA bundle is kept, as ESO's `caProvider`: one key of a Secret or ConfigMap, read
/// with the rules of credential Secrets (a SecretStore's from its own namespace as the pod, a
/// ClusterSecretStore's from the agent's namespace).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct CaProvider {
    /// `Secret` or `ConfigMap`.
    #[serde(rename = "type")]
    pub kind: CaProviderKind,
    /// The object's name.
    #[schemars(
        length(max = crate::api::rules::MAX_NAME_LEN),
        regex(pattern = crate::api::rules::DNS_SUBDOMAIN.regex)
    )]
    pub name: String,
    /// The key holding the PEM bundle.
    pub key: String,
    /// Namespace; only meaningful for ClusterSecretStores (must be the agent's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// The kind of object a [`CaProvider`] names.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CaProviderKind {
    /// A `v1` Secret.
    #[default]
    Secret,
    /// A `v1` ConfigMap.
    ConfigMap,
}

/// Vault authentication methods; exactly one is set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(validation = &crate::api::rules::VAULT_AUTH_ONE)]
#[serde(rename_all = "camelCase")]
pub struct VaultAuth {
    /// A token stored in a Kubernetes Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<SecretKeySelector>,
    /// Kubernetes auth with the pod's own token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<VaultRoleAuth>,
    /// JWT auth with the pod's own token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt: Option<VaultRoleAuth>,
    /// AppRole auth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_role: Option<VaultAppRole>,
    /// Username and password auth (`userpass`), the password from a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_pass: Option<VaultUserPass>,
    /// TLS certificate auth (`cert`), the client certificate and key from Secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<VaultCert>,
    /// AWS IAM auth: a `sts:GetCallerIdentity` request signed as the role the pod's token
    /// assumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iam: Option<VaultIamAuth>,
}

/// Vault's `aws` auth method, `iam` type (ESO's `auth.iam`), with the pod's web identity.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VaultIamAuth {
    /// Auth mount path (default `aws`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Vault role to log in as.
    pub vault_role: String,
    /// IAM role ARN assumed with the pod's token (`sts:AssumeRoleWithWebIdentity`).
    pub role: String,
    /// STS region the request is signed for (default `us-east-1`, the global endpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// STS endpoint override (VPC endpoints, tests): where the role is assumed and the URL the
    /// signed request names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Value of the `X-Vault-AWS-IAM-Server-ID` header, when the mount requires one.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "vaultAwsIamServerID"
    )]
    pub vault_aws_iam_server_id: Option<String>,
    /// The pod's web identity (token audience, default `sts.amazonaws.com`); the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt: Option<AwsJwtAuth>,
}

/// Role-based login with a service-account token.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VaultRoleAuth {
    /// Auth mount path (default `kubernetes` or `jwt`).
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "path")]
    pub mount_path: Option<String>,
    /// Vault role.
    pub role: String,
    /// Token audience requested from kubelet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
}

/// AppRole login.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VaultAppRole {
    /// Auth mount path (default `approle`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Role id.
    pub role_id: String,
    /// Secret holding the secret id.
    pub secret_ref: SecretKeySelector,
}

/// Userpass login, as ESO's `userPass`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VaultUserPass {
    /// Auth mount path (default `userpass`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The Vault user.
    #[schemars(length(min = 1, max = crate::api::rules::MAX_VAULT_USERNAME_LEN))]
    pub username: String,
    /// Secret holding the password.
    pub secret_ref: SecretKeySelector,
}

/// TLS certificate login, as ESO's `cert`: the login request carries the client certificate.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VaultCert {
    /// Auth mount path (default `cert`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Secret holding the client certificate (PEM; a chain, leaf first).
    pub client_cert: SecretKeySelector,
    /// Secret holding the client certificate's private key (PEM).
    pub secret_ref: SecretKeySelector,
}

/// Reads Secrets with the pod's own token: of the pod's namespace (or `remoteNamespace`), on the
/// agent's API server (or `server`, with the pod's token or a stored one).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(validation = &crate::api::rules::KUBERNETES_SERVER_AUDIENCE)]
#[x_kube(validation = &crate::api::rules::KUBERNETES_AUTH_NEEDS_SERVER)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesProvider {
    /// Token audience (defaults to the API server's); with `server`, required unless `auth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// Another cluster's API server, called with the pod's token for `audience` (that cluster
    /// must trust this one's service-account issuer); the agent's own API server when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<KubernetesServer>,
    /// The namespace whose Secrets are read (default: the pod's own); the pod's RBAC there
    /// decides what it may read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = crate::api::rules::MAX_NAMESPACE_LEN),
        regex(pattern = crate::api::rules::DNS_LABEL.regex)
    )]
    pub remote_namespace: Option<String>,
    /// A stored credential for `server` instead of the pod's token (ESO's `auth.token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<KubernetesAuth>,
}

/// How the provider authenticates to a remote `server` other than with the pod's token.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesAuth {
    /// A bearer token kept in a Secret.
    pub token: KubernetesTokenAuth,
}

/// ESO's `auth.token`: a bearer token from a credential Secret, read as other credential
/// Secrets are (a SecretStore's as the pod, a ClusterSecretStore's from the agent's namespace).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesTokenAuth {
    /// The Secret key holding the token.
    pub bearer_token: SecretKeySelector,
}

/// A remote Kubernetes API server and the CA its certificate must chain to (ESO's `server`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(validation = &crate::api::rules::KUBERNETES_SERVER_ONE_CA)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesServer {
    /// `https://host[:port][/path]`; TLS is always verified.
    #[schemars(
        length(max = crate::api::rules::MAX_SERVER_URL_LEN),
        regex(pattern = crate::api::rules::HTTPS_URL.regex)
    )]
    pub url: String,
    /// PEM CA certificates (as text, or base64 of the PEM as ESO writes it), the only roots
    /// trusted. Exactly one of this and `caProvider`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = crate::api::rules::MAX_CA_BUNDLE_LEN))]
    pub ca_bundle: Option<String>,
    /// The same roots from a Secret or ConfigMap key, read as `vault.caProvider`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_provider: Option<CaProvider>,
}

/// Inline values, for demos and tests.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct FakeProvider {
    /// The remote values this store serves.
    #[serde(default)]
    pub data: Vec<FakeEntry>,
    /// Simulated backend latency per read, e.g. `5ms` (benchmarks and demos).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<String>,
}

/// One inline value of the fake provider.
#[derive(Serialize, Deserialize, Clone, Default, PartialEq, JsonSchema)]
pub struct FakeEntry {
    /// Remote key.
    pub key: String,
    /// The value (a string; JSON text for property lookups).
    pub value: String,
    /// Version this value answers to; entries without one answer unversioned reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl fmt::Debug for FakeEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeEntry")
            .field("key", &self.key)
            .field("value", &"<redacted>")
            .field("version", &self.version)
            .finish()
    }
}

/// A secret-store plugin reached over gRPC: Latchkey's `latchkey.plugin.v1` when it serves it,
/// else Crossplane's External Secret Store protocol (`ess.proto.v1alpha1`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(validation = &crate::api::rules::PLUGIN_TLS_TCP_ONLY)]
#[serde(rename_all = "camelCase")]
pub struct PluginProvider {
    /// `unix:///<plugin socket dir>/<name>.sock` (a socket directly inside the agent's
    /// `--plugin-socket-dir`) or `host:port` (gRPC over TCP; TLS with `tls`).
    #[schemars(length(min = 1, max = crate::api::rules::MAX_PLUGIN_ENDPOINT_LEN))]
    pub endpoint: String,
    /// The plugin configuration object each call names (`config` of the protocol).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_ref: Option<PluginConfigRef>,
    /// How long one call may take, e.g. `10s` (the default); at most `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = crate::api::rules::MAX_DURATION_LEN),
        regex(pattern = crate::api::rules::DURATION.regex)
    )]
    pub timeout: Option<String>,
    /// The audiences of the pod's service-account tokens passed to the plugin (latchkey.plugin.v1
    /// only); none when empty. Only these are passed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::api::rules::MAX_AUDIENCES))]
    pub audiences: Vec<String>,
    /// TLS for a `host:port` endpoint (refused with a unix one): the CA that signed the
    /// plugin's certificate, and optionally the client certificate for mutual TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<PluginTls>,
}

/// TLS to a plugin on TCP.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(validation = &crate::api::rules::PLUGIN_TLS_ONE_CA)]
#[serde(rename_all = "camelCase")]
pub struct PluginTls {
    /// PEM certificates (as text, or base64 of the PEM as `vault.caBundle`) the plugin's server
    /// certificate must chain to; the only roots trusted. Exactly one of this and `caProvider`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = crate::api::rules::MAX_CA_BUNDLE_LEN))]
    pub ca_bundle: Option<String>,
    /// The same roots from a Secret or ConfigMap key, as `vault.caProvider`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_provider: Option<CaProvider>,
    /// A `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`) with the client certificate and key,
    /// read as other credential Secrets are; no client certificate when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert_secret_ref: Option<TlsSecretRef>,
}

/// A `kubernetes.io/tls` Secret: its `tls.crt` and `tls.key`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct TlsSecretRef {
    /// Secret name.
    #[schemars(
        length(max = crate::api::rules::MAX_NAME_LEN),
        regex(pattern = crate::api::rules::DNS_SUBDOMAIN.regex)
    )]
    pub name: String,
    /// Namespace; only meaningful for ClusterSecretStores (must be the agent's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Names a configuration object of the plugin (its `ConfigReference`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginConfigRef {
    /// API version of the configuration object, e.g. `secrets.example.com/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// Kind of the configuration object.
    #[serde(default)]
    pub kind: String,
    /// Name of the configuration object.
    pub name: String,
}

/// A Secrets Store CSI Driver provider (`v1alpha1.CSIDriverProvider`), called as the pod.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretsStoreCsiProvider {
    /// The provider's name, as in a SecretProviderClass's `spec.provider` (`azure`, `gcp`,
    /// `aws`, `vault`, ...): its socket is `<--secrets-store-provider-dir>/<provider>.sock`.
    #[schemars(regex(pattern = crate::api::rules::SECRETS_STORE_PROVIDER.regex))]
    pub provider: String,
    /// The provider's parameters, as in a SecretProviderClass's `spec.parameters`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub parameters: std::collections::BTreeMap<String, String>,
    /// The audiences of the pod's service-account tokens passed to the provider (the
    /// CSIDriver's `tokenRequests` of that driver); none when empty. Only these are passed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::api::rules::MAX_AUDIENCES))]
    pub audiences: Vec<String>,
    /// How long one Mount call may take, e.g. `10s` (the default); at most `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = crate::api::rules::MAX_DURATION_LEN),
        regex(pattern = crate::api::rules::DURATION.regex)
    )]
    pub timeout: Option<String>,
    /// A Secret whose keys are sent as the Mount's `secrets`, as the driver sends a pod volume's
    /// `nodePublishSecretRef` (provider credentials, e.g. Azure's clientid/clientsecret). Read
    /// as a credential Secret: a SecretStore's in its own namespace, as the pod; a
    /// ClusterSecretStore's in the agent's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_publish_secret_ref: Option<SecretNameRef>,
}

/// A Secret named by name alone (all its keys are used).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct SecretNameRef {
    /// Secret name.
    #[schemars(
        length(max = crate::api::rules::MAX_NAME_LEN),
        regex(pattern = crate::api::rules::DNS_SUBDOMAIN.regex)
    )]
    pub name: String,
}

/// Observed state of a store, written by the mirror controller (`latchkey controller`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct StoreStatus {
    /// The provider block the spec sets (`aws`, `vault`, `kubernetes`, `fake`, `plugin`,
    /// `secretsStoreCSI`; comma-separated when an invalid spec sets several).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Standard conditions (`Ready`: the spec is one the agent accepts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
