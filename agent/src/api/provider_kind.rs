//! The names of the provider kinds (issue #41): their groups and the [`ProviderKind`] a store's
//! `spec.providerRef` names. Apart from [`super::provider_kinds`], which declares the kinds over
//! the store types, so that the store types can name a kind without a cycle.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the namespaced provider kinds.
pub const PROVIDER_GROUP: &str = "providers.latchkey.dev";
/// The API group of the cluster-scoped provider kinds.
pub const CLUSTER_PROVIDER_GROUP: &str = "cluster.providers.latchkey.dev";
/// The version every provider kind is served at today.
pub const PROVIDER_VERSION: &str = "v1alpha1";
/// `apiVersion` of the namespaced provider kinds.
pub const PROVIDER_API_VERSION: &str = "providers.latchkey.dev/v1alpha1";
/// `apiVersion` of the cluster-scoped provider kinds.
pub const CLUSTER_PROVIDER_API_VERSION: &str = "cluster.providers.latchkey.dev/v1alpha1";

/// The kind of a provider object, as `providerRef.kind` names it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ProviderKind {
    /// AWS Secrets Manager or Parameter Store (`spec` as `spec.provider.aws`).
    #[serde(rename = "AWS")]
    Aws,
    /// HashiCorp Vault or OpenBao (`spec.provider.vault`).
    Vault,
    /// Secrets of the pod's own namespace (`spec.provider.kubernetes`).
    Kubernetes,
    /// Inline values (`spec.provider.fake`).
    Fake,
    /// An out-of-tree plugin (`spec.provider.plugin`).
    Plugin,
    /// A Secrets Store CSI Driver provider (`spec.provider.secretsStoreCSI`).
    #[serde(rename = "SecretsStoreCSIProvider")]
    SecretsStoreCsiProvider,
}

impl ProviderKind {
    /// Every kind, in the order `latchkey crds` prints them.
    pub const ALL: [ProviderKind; 6] = [
        ProviderKind::Aws,
        ProviderKind::Vault,
        ProviderKind::Kubernetes,
        ProviderKind::Fake,
        ProviderKind::Plugin,
        ProviderKind::SecretsStoreCsiProvider,
    ];

    /// The `kind` field.
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::Aws => "AWS",
            ProviderKind::Vault => "Vault",
            ProviderKind::Kubernetes => "Kubernetes",
            ProviderKind::Fake => "Fake",
            ProviderKind::Plugin => "Plugin",
            ProviderKind::SecretsStoreCsiProvider => "SecretsStoreCSIProvider",
        }
    }

    /// The name of the inline `spec.provider` block this kind stands for (`vault`).
    pub fn block_name(self) -> &'static str {
        match self {
            ProviderKind::Aws => "aws",
            ProviderKind::Vault => "vault",
            ProviderKind::Kubernetes => "kubernetes",
            ProviderKind::Fake => "fake",
            ProviderKind::Plugin => "plugin",
            ProviderKind::SecretsStoreCsiProvider => "secretsStoreCSI",
        }
    }

    /// The kind called `name`.
    pub fn named(name: &str) -> Option<ProviderKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The resource (plural) name, as RBAC and URLs spell it.
    pub fn plural(self) -> &'static str {
        match self {
            ProviderKind::Aws => "aws",
            ProviderKind::Vault => "vaults",
            ProviderKind::Kubernetes => "kubernetes",
            ProviderKind::Fake => "fakes",
            ProviderKind::Plugin => "plugins",
            ProviderKind::SecretsStoreCsiProvider => "secretsstorecsiproviders",
        }
    }

    /// The directory of `crds/providers/` (and the chart's `providers` value) holding both CRDs
    /// of this kind, so that a cluster installs only the providers it uses.
    pub fn file_stem(self) -> &'static str {
        match self {
            ProviderKind::Aws => "aws",
            ProviderKind::Vault => "vault",
            ProviderKind::Kubernetes => "kubernetes",
            ProviderKind::Fake => "fake",
            ProviderKind::Plugin => "plugin",
            ProviderKind::SecretsStoreCsiProvider => "secretsstorecsi",
        }
    }

    /// The CRD's name in `group` (`vaults.providers.latchkey.dev`).
    pub fn crd_name(self, cluster: bool) -> String {
        let group = if cluster {
            CLUSTER_PROVIDER_GROUP
        } else {
            PROVIDER_GROUP
        };
        format!("{}.{group}", self.plural())
    }
}
