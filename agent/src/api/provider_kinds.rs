//! Providers as objects of their own (issue #41, ESO's design 007): one kind per built-in
//! provider, namespaced in `providers.latchkey.dev` and cluster-scoped in
//! `cluster.providers.latchkey.dev`. A store names one with `spec.providerRef` instead of an
//! inline `spec.provider` block.
//!
//! Each kind's `spec` IS the inline block's type from [`super::store`] (a transparent newtype),
//! so the two forms can never drift: the same schema, the same CEL rules, the same agent checks
//! (a referenced object is checked as the equivalent inline block, see [`ProviderObject`]).
//!
//! AWS is one kind, `AWS`, with today's `service` field rather than one kind per service: the
//! spec is then exactly `spec.provider.aws`, and a kind per service would need either a second
//! set of types or a `service` the kind overrides.
//!
//! Versioning: each kind is served at its own version; a `v1alpha2` of one kind is added next
//! to `v1alpha1` in this file without touching stores, whose `providerRef.apiVersion` names
//! the version they were written against.

use std::sync::Arc;

use kube::{CustomResource, Resource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::store::{
    AwsProvider, FakeProvider, KubernetesProvider, PluginProvider, SecretsStoreCsiProvider,
    StoreProvider, VaultProvider,
};

pub use super::provider_kind::{
    CLUSTER_PROVIDER_API_VERSION, CLUSTER_PROVIDER_GROUP, PROVIDER_API_VERSION, PROVIDER_GROUP,
    PROVIDER_VERSION, ProviderKind,
};

/// Observed state of a provider object, written by `latchkey controller` (design 007's provider
/// reconciler): whether the agent accepts its spec.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderStatus {
    /// The `metadata.generation` the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Standard conditions (`Ready`: the spec is one the agent accepts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<super::external_secret::Condition>,
}

/// Declares the namespaced and the cluster-scoped kind of one provider, whose `spec` is `$inner`.
macro_rules! provider_kind {
    (
        $(#[$doc:meta])*
        $spec:ident / $cluster_spec:ident: $inner:ty,
        kind $kind:tt, root $root:tt / $cluster_root:tt, plural $plural:tt,
        shortnames $short:tt / $cluster_short:tt
    ) => {
        $(#[$doc])*
        #[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
        #[kube(
            group = "providers.latchkey.dev",
            version = "v1alpha1",
            kind = $kind,
            root = $root,
            doc = "A provider object SecretStores of its namespace name in `spec.providerRef`.",
            plural = $plural,
            namespaced,
            status = "ProviderStatus",
            printcolumn = r#"{"name": "Status", "type": "string",
                              "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason"}"#,
            printcolumn = r#"{"name": "Ready", "type": "string",
                              "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
            printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#,
            shortname = $short,
            category = "latchkey",
            category = "latchkey-providers"
        )]
        #[serde(transparent)]
        pub struct $spec(pub $inner);

        $(#[$doc])*
        #[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
        #[kube(
            group = "cluster.providers.latchkey.dev",
            version = "v1alpha1",
            kind = $kind,
            root = $cluster_root,
            doc = "A cluster-scoped provider object ClusterSecretStores name in `spec.providerRef`.",
            plural = $plural,
            status = "ProviderStatus",
            printcolumn = r#"{"name": "Status", "type": "string",
                              "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason"}"#,
            printcolumn = r#"{"name": "Ready", "type": "string",
                              "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
            printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#,
            shortname = $cluster_short,
            category = "latchkey",
            category = "latchkey-providers"
        )]
        #[serde(transparent)]
        pub struct $cluster_spec(pub $inner);
    };
}

provider_kind! {
    /// AWS Secrets Manager or Parameter Store: `spec` is a store's `spec.provider.aws`.
    AwsSpec / ClusterAwsSpec: AwsProvider,
    kind "AWS", root "AwsProviderObject" / "ClusterAwsProviderObject", plural "aws",
    shortnames "lkpaws" / "lkcpaws"
}

provider_kind! {
    /// HashiCorp Vault or OpenBao: `spec` is a store's `spec.provider.vault`.
    VaultSpec / ClusterVaultSpec: VaultProvider,
    kind "Vault", root "VaultProviderObject" / "ClusterVaultProviderObject", plural "vaults",
    shortnames "lkpvault" / "lkcpvault"
}

provider_kind! {
    /// Secrets of the pod's namespace, read as the pod: `spec` is `spec.provider.kubernetes`.
    KubernetesSpec / ClusterKubernetesSpec: KubernetesProvider,
    kind "Kubernetes", root "KubernetesProviderObject" / "ClusterKubernetesProviderObject",
    plural "kubernetes", shortnames "lkpk8s" / "lkcpk8s"
}

provider_kind! {
    /// Inline values, for demos and tests: `spec` is `spec.provider.fake`.
    FakeSpec / ClusterFakeSpec: FakeProvider,
    kind "Fake", root "FakeProviderObject" / "ClusterFakeProviderObject", plural "fakes",
    shortnames "lkpfake" / "lkcpfake"
}

provider_kind! {
    /// An out-of-tree secret-store plugin: `spec` is `spec.provider.plugin`.
    PluginSpec / ClusterPluginSpec: PluginProvider,
    kind "Plugin", root "PluginProviderObject" / "ClusterPluginProviderObject",
    plural "plugins", shortnames "lkpplugin" / "lkcpplugin"
}

provider_kind! {
    /// A Secrets Store CSI Driver provider: `spec` is `spec.provider.secretsStoreCSI`.
    SecretsStoreCsiSpec / ClusterSecretsStoreCsiSpec: SecretsStoreCsiProvider,
    kind "SecretsStoreCSIProvider",
    root "SecretsStoreCsiProviderObject" / "ClusterSecretsStoreCsiProviderObject",
    plural "secretsstorecsiproviders", shortnames "lkpsscsi" / "lkcpsscsi"
}

/// Every provider CRD, namespaced then cluster-scoped, per kind in [`ProviderKind::ALL`] order.
pub fn crds() -> Vec<(
    ProviderKind,
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
)> {
    use kube::CustomResourceExt;
    ProviderKind::ALL
        .into_iter()
        .flat_map(|kind| {
            let (namespaced, cluster) = match kind {
                ProviderKind::Aws => (
                    with_spec_rule(
                        AwsProviderObject::crd(),
                        &super::rules::AGENT_IDENTITY_CLUSTER_PROVIDER_ONLY,
                    ),
                    ClusterAwsProviderObject::crd(),
                ),
                ProviderKind::Vault => (
                    VaultProviderObject::crd(),
                    ClusterVaultProviderObject::crd(),
                ),
                ProviderKind::Kubernetes => (
                    KubernetesProviderObject::crd(),
                    ClusterKubernetesProviderObject::crd(),
                ),
                ProviderKind::Fake => (FakeProviderObject::crd(), ClusterFakeProviderObject::crd()),
                ProviderKind::Plugin => (
                    PluginProviderObject::crd(),
                    ClusterPluginProviderObject::crd(),
                ),
                ProviderKind::SecretsStoreCsiProvider => (
                    SecretsStoreCsiProviderObject::crd(),
                    ClusterSecretsStoreCsiProviderObject::crd(),
                ),
            };
            [(kind, namespaced), (kind, cluster)]
        })
        .collect()
}

/// `crd` with `rule` added to the `x-kubernetes-validations` of its `spec`: the derive cannot
/// attach a rule to a transparent newtype's own node.
fn with_spec_rule(
    mut crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    rule: &super::rules::CelRule,
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::ValidationRule;
    for version in &mut crd.spec.versions {
        let spec = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("spec"));
        if let Some(spec) = spec {
            spec.x_kubernetes_validations
                .get_or_insert_with(Vec::new)
                .push(ValidationRule {
                    rule: rule.rule.into(),
                    message: Some(rule.message.into()),
                    ..ValidationRule::default()
                });
        }
    }
    crd
}

/// A provider object a store refers to, as the catalog found it: its spec as the inline block
/// it stands for, and who it is (for messages and for cache identity).
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderObject {
    /// The kind.
    pub kind: ProviderKind,
    /// Cluster-scoped (`cluster.providers.latchkey.dev`).
    pub cluster: bool,
    /// `namespace/name`, or `name` for a cluster-scoped object.
    pub name: String,
    /// The spec, as the equivalent `spec.provider` block (exactly one block set).
    pub provider: StoreProvider,
}

/// Turns a provider object of any of the twelve kinds into a [`ProviderObject`].
pub trait AsProvider: Resource + Clone {
    /// The kind.
    const KIND: ProviderKind;
    /// Cluster-scoped.
    const CLUSTER: bool;
    /// The spec, as the equivalent `spec.provider` block.
    fn store_provider(&self) -> StoreProvider;
    /// `status`, if any.
    fn provider_status(&self) -> Option<&ProviderStatus>;

    /// The object as a [`ProviderObject`].
    fn provider_object(&self) -> Arc<ProviderObject> {
        let meta = self.meta();
        let name = meta.name.clone().unwrap_or_default();
        Arc::new(ProviderObject {
            kind: Self::KIND,
            cluster: Self::CLUSTER,
            name: match (&meta.namespace, Self::CLUSTER) {
                (Some(ns), false) => format!("{ns}/{name}"),
                _ => name,
            },
            provider: self.store_provider(),
        })
    }
}

macro_rules! as_provider {
    ($root:ty, $kind:ident, $cluster:expr, $field:ident) => {
        impl AsProvider for $root {
            const KIND: ProviderKind = ProviderKind::$kind;
            const CLUSTER: bool = $cluster;
            fn store_provider(&self) -> StoreProvider {
                StoreProvider {
                    $field: Some(self.spec.0.clone()),
                    ..StoreProvider::default()
                }
            }
            fn provider_status(&self) -> Option<&ProviderStatus> {
                self.status.as_ref()
            }
        }
    };
}

as_provider!(AwsProviderObject, Aws, false, aws);
as_provider!(ClusterAwsProviderObject, Aws, true, aws);
as_provider!(VaultProviderObject, Vault, false, vault);
as_provider!(ClusterVaultProviderObject, Vault, true, vault);
as_provider!(KubernetesProviderObject, Kubernetes, false, kubernetes);
as_provider!(
    ClusterKubernetesProviderObject,
    Kubernetes,
    true,
    kubernetes
);
as_provider!(FakeProviderObject, Fake, false, fake);
as_provider!(ClusterFakeProviderObject, Fake, true, fake);
as_provider!(PluginProviderObject, Plugin, false, plugin);
as_provider!(ClusterPluginProviderObject, Plugin, true, plugin);
as_provider!(
    SecretsStoreCsiProviderObject,
    SecretsStoreCsiProvider,
    false,
    secrets_store_csi
);
as_provider!(
    ClusterSecretsStoreCsiProviderObject,
    SecretsStoreCsiProvider,
    true,
    secrets_store_csi
);

/// What every provider root type is, so generic code (the catalogs) can read any of them.
pub trait ProviderResource:
    AsProvider
    + Resource<DynamicType = ()>
    + serde::de::DeserializeOwned
    + Serialize
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<T> ProviderResource for T where
    T: AsProvider
        + Resource<DynamicType = ()>
        + serde::de::DeserializeOwned
        + Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// Code run with the Rust type of one provider kind: namespaced kinds and cluster-scoped
/// kinds apart, as kube's `Api` constructors want to know the scope.
pub trait KindVisitor {
    /// What the visit returns.
    type Output;
    /// A namespaced kind (`providers.latchkey.dev`).
    fn namespaced<T>(self) -> Self::Output
    where
        T: ProviderResource<Scope = k8s_openapi::NamespaceResourceScope>;
    /// A cluster-scoped kind (`cluster.providers.latchkey.dev`).
    fn cluster<T>(self) -> Self::Output
    where
        T: ProviderResource<Scope = k8s_openapi::ClusterResourceScope>;
}

/// Runs `visitor` with the type of `kind` in the namespaced (`cluster` false) or cluster group.
pub fn visit<V: KindVisitor>(kind: ProviderKind, cluster: bool, visitor: V) -> V::Output {
    match (kind, cluster) {
        (ProviderKind::Aws, false) => visitor.namespaced::<AwsProviderObject>(),
        (ProviderKind::Aws, true) => visitor.cluster::<ClusterAwsProviderObject>(),
        (ProviderKind::Vault, false) => visitor.namespaced::<VaultProviderObject>(),
        (ProviderKind::Vault, true) => visitor.cluster::<ClusterVaultProviderObject>(),
        (ProviderKind::Kubernetes, false) => visitor.namespaced::<KubernetesProviderObject>(),
        (ProviderKind::Kubernetes, true) => visitor.cluster::<ClusterKubernetesProviderObject>(),
        (ProviderKind::Fake, false) => visitor.namespaced::<FakeProviderObject>(),
        (ProviderKind::Fake, true) => visitor.cluster::<ClusterFakeProviderObject>(),
        (ProviderKind::Plugin, false) => visitor.namespaced::<PluginProviderObject>(),
        (ProviderKind::Plugin, true) => visitor.cluster::<ClusterPluginProviderObject>(),
        (ProviderKind::SecretsStoreCsiProvider, false) => {
            visitor.namespaced::<SecretsStoreCsiProviderObject>()
        }
        (ProviderKind::SecretsStoreCsiProvider, true) => {
            visitor.cluster::<ClusterSecretsStoreCsiProviderObject>()
        }
    }
}

/// The CRD of `kind` in the namespaced (`cluster` false) or cluster group, as rendered.
pub fn crd(
    kind: ProviderKind,
    cluster: bool,
) -> Option<
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
> {
    crds()
        .into_iter()
        .filter(|(k, _)| *k == kind)
        .map(|(_, crd)| crd)
        .find(|crd| (crd.spec.scope == "Cluster") == cluster)
}

impl ProviderObject {
    /// `Vault "shop/vault"` or `cluster-scoped Vault "vault"`, for messages.
    pub fn shown(&self) -> String {
        shown(self.kind, self.cluster, &self.name)
    }
}

/// `Vault "shop/vault"` or `cluster-scoped Vault "vault"`.
pub fn shown(kind: ProviderKind, cluster: bool, name: &str) -> String {
    let scope = if cluster { "cluster-scoped " } else { "" };
    format!("{scope}{} {name:?}", kind.name())
}
