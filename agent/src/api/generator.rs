//! Generators (`generators.latchkey.dev/v1alpha1`): objects that make a value instead of reading
//! one (a password, a Vault dynamic secret or PKI certificate, an account from a plugin), and the
//! `GeneratorState` that records what was made so that it can be cleaned up (ESO design 011).
//!
//! Field names follow ESO's generators; the short names are our own so that `kubectl get` stays
//! unambiguous with both installed.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::external_secret::Condition;
use super::store::{ClusterStoreCondition, PluginProvider, VaultProvider};

pub use super::{CLEANUP_FINALIZER, GENERATOR_API_VERSION, GENERATOR_GROUP};

/// Makes a random password (ESO's `Password`); the result has one key, `password`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "generators.latchkey.dev",
    version = "v1alpha1",
    kind = "Password",
    namespaced,
    shortname = "lkpassword",
    category = "latchkey",
    category = "latchkey-generators",
    printcolumn = r#"{"name": "Length", "type": "integer", "jsonPath": ".spec.length"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = &crate::api::rules::PASSWORD_FITS)]
#[serde(rename_all = "camelCase")]
pub struct PasswordSpec {
    /// Length of the password (default 24).
    #[serde(default = "default_password_length")]
    #[schemars(range(min = 1, max = crate::api::rules::MAX_PASSWORD_LENGTH))]
    pub length: u32,
    /// How many digits it contains (default: a quarter of the length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = crate::api::rules::MAX_PASSWORD_LENGTH))]
    pub digits: Option<u32>,
    /// How many symbols it contains (default: a quarter of the length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = crate::api::rules::MAX_PASSWORD_LENGTH))]
    pub symbols: Option<u32>,
    /// The symbols to pick from (default ``~!@#$%^&*()_+`-={}|[]\:"<>?,./``).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::api::rules::MAX_SYMBOL_CHARACTERS))]
    #[x_kube(validation = &crate::api::rules::NOT_EMPTY)]
    pub symbol_characters: Option<String>,
    /// No upper-case letters.
    #[serde(default)]
    pub no_upper: bool,
    /// Characters may repeat (default: each character at most once).
    #[serde(default)]
    pub allow_repeat: bool,
}

fn default_password_length() -> u32 {
    24
}

/// What part of Vault's answer a [`VaultDynamicSecretSpec`] returns, as in ESO.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum VaultResultType {
    /// The `data` map (default): a PKI certificate, database credentials.
    #[default]
    Data,
    /// The `auth` block: a token made by a login or `auth/token/create`.
    Auth,
    /// The whole answer, as one JSON value under the key `response`.
    Raw,
}

/// Asks Vault/OpenBao for a dynamic secret (ESO's `VaultDynamicSecret`): a PKI certificate, a
/// database user. A leased answer is renewed while in use and revoked when no longer used.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "generators.latchkey.dev",
    version = "v1alpha1",
    kind = "VaultDynamicSecret",
    namespaced,
    shortname = "lkvds",
    category = "latchkey",
    category = "latchkey-generators",
    printcolumn = r#"{"name": "Path", "type": "string", "jsonPath": ".spec.path"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VaultDynamicSecretSpec {
    /// The Vault path, e.g. `pki/issue/example-dot-com` or `database/creds/app`.
    #[schemars(length(max = crate::api::rules::MAX_VAULT_PATH_LEN))]
    #[x_kube(validation = &crate::api::rules::NOT_EMPTY)]
    pub path: String,
    /// HTTP method: `GET` (default), `POST`, `PUT` (Vault treats it as POST) or `LIST`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = crate::api::rules::VAULT_METHOD.regex))]
    pub method: Option<String>,
    /// Request parameters (a JSON object), e.g. `{common_name: localhost, ttl: 1h}`; at most
    /// 64 keys and 64 KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::generator::parameters_object")]
    pub parameters: Option<serde_json::Map<String, serde_json::Value>>,
    /// Which part of the answer is the result: `Data` (default), `Auth` or `Raw`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_type: Option<VaultResultType>,
    /// An answer without data is a result (default: an error).
    #[serde(default)]
    pub allow_empty_response: bool,
    /// The Vault server and how to log in, as a store's `vault` block (`path` and `version`
    /// are not used).
    pub provider: VaultProvider,
}

/// A generator served by an out-of-tree plugin (`latchkey.plugin.v1` `Generate`/`Cleanup`).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "generators.latchkey.dev",
    version = "v1alpha1",
    kind = "PluginGenerator",
    namespaced,
    shortname = "lkpg",
    category = "latchkey",
    category = "latchkey-generators",
    printcolumn = r#"{"name": "Endpoint", "type": "string", "jsonPath": ".spec.provider.endpoint"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PluginGeneratorSpec {
    /// The plugin, as a store's `plugin` block (same socket and TLS rules).
    pub provider: PluginProvider,
}

/// The generator kinds a [`ClusterGenerator`] may wrap.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum GeneratorKind {
    /// [`Password`].
    Password,
    /// [`VaultDynamicSecret`].
    VaultDynamicSecret,
    /// [`PluginGenerator`].
    PluginGenerator,
}

impl GeneratorKind {
    /// The kind's name, as in `generatorRef.kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Password => "Password",
            Self::VaultDynamicSecret => "VaultDynamicSecret",
            Self::PluginGenerator => "PluginGenerator",
        }
    }

    /// The namespaced kind named `kind`, if any.
    pub fn parse(kind: &str) -> Option<Self> {
        [
            Self::Password,
            Self::VaultDynamicSecret,
            Self::PluginGenerator,
        ]
        .into_iter()
        .find(|k| k.as_str() == kind)
    }
}

impl std::fmt::Display for GeneratorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The wrapped generator of a [`ClusterGenerator`]: exactly the block `kind` names.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GeneratorSpecs {
    /// With `kind: Password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_spec: Option<PasswordSpec>,
    /// With `kind: VaultDynamicSecret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vault_dynamic_secret_spec: Option<VaultDynamicSecretSpec>,
    /// With `kind: PluginGenerator`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_generator_spec: Option<PluginGeneratorSpec>,
}

/// Any generator, usable from the namespaces its `conditions` admit (as a ClusterSecretStore).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "generators.latchkey.dev",
    version = "v1alpha1",
    kind = "ClusterGenerator",
    shortname = "lkcg",
    category = "latchkey",
    category = "latchkey-generators",
    printcolumn = r#"{"name": "Kind", "type": "string", "jsonPath": ".spec.kind"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = &crate::api::rules::CLUSTER_GENERATOR_KIND_MATCHES)]
#[serde(rename_all = "camelCase")]
pub struct ClusterGeneratorSpec {
    /// Which generator `generator` holds.
    pub kind: GeneratorKind,
    /// The generator's spec, under `<kind>Spec` (ESO's shape).
    pub generator: GeneratorSpecs,
    /// Which namespaces may use it; empty admits every namespace (as a ClusterSecretStore).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<ClusterStoreCondition>,
}

/// What was generated for one owner, and what it takes to clean it up (ESO design 011). Never
/// holds a generated value: only references such as a lease id or a certificate serial.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "generators.latchkey.dev",
    version = "v1alpha1",
    kind = "GeneratorState",
    namespaced,
    shortname = "lkgs",
    category = "latchkey",
    category = "latchkey-generators",
    status = "GeneratorStateStatus",
    printcolumn = r#"{"name": "Generator", "type": "string",
                      "jsonPath": ".metadata.labels.generators\\.latchkey\\.dev/generator"}"#,
    printcolumn = r#"{"name": "Pod", "type": "string",
                      "jsonPath": ".metadata.labels.generators\\.latchkey\\.dev/pod"}"#,
    printcolumn = r#"{"name": "GC Deadline", "type": "string",
                      "jsonPath": ".spec.garbageCollectionDeadline"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GeneratorStateSpec {
    /// The generator object as it was when the credential was made (its kind and spec).
    #[schemars(schema_with = "crate::api::generator::any_object")]
    pub resource: serde_json::Value,
    /// What Cleanup needs (lease id, serial, account id); absent while only the intent is
    /// recorded (Generate has not answered yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::generator::any_object")]
    pub state: Option<serde_json::Value>,
    /// After this time (RFC 3339) the state is deleted and its credential cleaned up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub garbage_collection_deadline: Option<String>,
}

/// Observed state of a GeneratorState.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct GeneratorStateStatus {
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// An object whose fields are not checked by the schema (kept as written).
pub(crate) fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// A JSON object kept as written, with at most [`rules::MAX_VAULT_PARAMETERS`] keys (its size
/// in bytes is the agent's check).
///
/// [`rules::MAX_VAULT_PARAMETERS`]: crate::api::rules::MAX_VAULT_PARAMETERS
pub(crate) fn parameters_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": crate::api::rules::MAX_VAULT_PARAMETERS,
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// A generator object a `generatorRef` found: a namespaced kind or a ClusterGenerator.
#[derive(Debug, Clone)]
pub enum GeneratorObject {
    /// A `Password` of the ExternalSecret's namespace.
    Password(std::sync::Arc<Password>),
    /// A `VaultDynamicSecret` of the ExternalSecret's namespace.
    VaultDynamicSecret(std::sync::Arc<VaultDynamicSecret>),
    /// A `PluginGenerator` of the ExternalSecret's namespace.
    Plugin(std::sync::Arc<PluginGenerator>),
    /// A `ClusterGenerator`.
    Cluster(std::sync::Arc<ClusterGenerator>),
}

impl GeneratorObject {
    /// The object as a GeneratorState's `spec.resource` records it: `apiVersion`, `kind`,
    /// `metadata.name` (and namespace) and `spec`, nothing else (no status, no managedFields).
    pub fn to_resource(&self) -> serde_json::Value {
        fn of<K: kube::Resource<DynamicType = ()>, S: Serialize>(
            object: &K,
            spec: &S,
        ) -> serde_json::Value {
            let meta = object.meta();
            serde_json::json!({
                "apiVersion": K::api_version(&()),
                "kind": K::kind(&()),
                "metadata": {"name": meta.name, "namespace": meta.namespace},
                "spec": spec,
            })
        }
        match self {
            Self::Password(g) => of(&**g, &g.spec),
            Self::VaultDynamicSecret(g) => of(&**g, &g.spec),
            Self::Plugin(g) => of(&**g, &g.spec),
            Self::Cluster(g) => of(&**g, &g.spec),
        }
    }

    /// Reads back what [`Self::to_resource`] recorded. A tenant can edit a GeneratorState, so
    /// this is hostile input: the caller validates the result as it would a live generator.
    pub fn from_resource(resource: &serde_json::Value) -> Result<Self, String> {
        use std::sync::Arc;
        let kind = resource["kind"].as_str().unwrap_or_default();
        let parsed = match kind {
            "Password" => {
                serde_json::from_value(resource.clone()).map(|g| Self::Password(Arc::new(g)))
            }
            "VaultDynamicSecret" => serde_json::from_value(resource.clone())
                .map(|g| Self::VaultDynamicSecret(Arc::new(g))),
            "PluginGenerator" => {
                serde_json::from_value(resource.clone()).map(|g| Self::Plugin(Arc::new(g)))
            }
            "ClusterGenerator" => {
                serde_json::from_value(resource.clone()).map(|g| Self::Cluster(Arc::new(g)))
            }
            other => {
                return Err(format!(
                    "spec.resource.kind {:?} is not a generator kind",
                    crate::telemetry::escape::printable(other, 80)
                ));
            }
        };
        parsed.map_err(|e| format!("spec.resource does not match {kind}: {e}"))
    }

    /// The kind's name (`Password`, ..., `ClusterGenerator`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Password(_) => "Password",
            Self::VaultDynamicSecret(_) => "VaultDynamicSecret",
            Self::Plugin(_) => "PluginGenerator",
            Self::Cluster(_) => "ClusterGenerator",
        }
    }
}
