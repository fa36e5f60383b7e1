//! Where a store's credential references (`secretRef`, `tokenSecretRef`, `caProvider`, ...) may
//! point, and who reads them: the one rule of docs/concepts.md's credentials table, as a value
//! the providers consult instead of the store kind.

use super::StoreKind;
use super::provider_kinds::ProviderObject;

/// How a store's credential references are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CredentialScope {
    /// A SecretStore (inline or by `providerRef`): the caller's namespace only, read as the
    /// caller.
    Namespaced,
    /// A ClusterSecretStore with an inline provider: the agent's namespace only, read by the
    /// agent.
    Cluster,
    /// A ClusterSecretStore naming a cluster-scoped provider object (ESO design 007's
    /// `ApplyReferent`): a reference naming no namespace is read from the caller's namespace as
    /// the caller, exactly like a SecretStore's; one naming a namespace follows [`Self::Cluster`].
    Referent,
}

impl CredentialScope {
    /// The scope of a store of `kind` whose provider is `object` (`None`: inline). Only a
    /// referenced cluster-scoped object is referent: an inline ClusterSecretStore keeps reading
    /// from the agent's namespace, as it did before provider objects existed.
    pub fn of(kind: StoreKind, object: Option<&ProviderObject>) -> Self {
        match (kind, object) {
            (StoreKind::SecretStore, _) => Self::Namespaced,
            (StoreKind::ClusterSecretStore, Some(o)) if o.cluster => Self::Referent,
            (StoreKind::ClusterSecretStore, _) => Self::Cluster,
        }
    }

    /// The store kind this scope belongs to.
    pub fn store_kind(self) -> StoreKind {
        match self {
            Self::Namespaced => StoreKind::SecretStore,
            Self::Cluster | Self::Referent => StoreKind::ClusterSecretStore,
        }
    }

    /// True when a reference naming `namespace` (`None`: none) is read as the caller from the
    /// caller's namespace.
    pub fn as_caller(self, namespace: Option<&str>) -> bool {
        match self {
            Self::Namespaced => true,
            Self::Cluster => false,
            Self::Referent => namespace.is_none(),
        }
    }
}

impl From<StoreKind> for CredentialScope {
    /// An inline store's scope.
    fn from(kind: StoreKind) -> Self {
        Self::of(kind, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::provider_kind::ProviderKind;

    fn object(cluster: bool) -> ProviderObject {
        ProviderObject {
            kind: ProviderKind::Vault,
            cluster,
            name: "vault".into(),
            provider: Default::default(),
        }
    }

    #[test]
    fn only_a_cluster_store_by_reference_is_referent() {
        use StoreKind::*;
        assert_eq!(
            CredentialScope::of(SecretStore, None),
            CredentialScope::Namespaced
        );
        assert_eq!(
            CredentialScope::of(SecretStore, Some(&object(false))),
            CredentialScope::Namespaced
        );
        assert_eq!(
            CredentialScope::of(ClusterSecretStore, None),
            CredentialScope::Cluster
        );
        assert_eq!(
            CredentialScope::of(ClusterSecretStore, Some(&object(true))),
            CredentialScope::Referent
        );
        assert!(CredentialScope::Referent.as_caller(None));
        assert!(!CredentialScope::Referent.as_caller(Some("latchkey")));
        assert!(!CredentialScope::Cluster.as_caller(None));
        assert!(CredentialScope::Namespaced.as_caller(Some("shop")));
    }
}
