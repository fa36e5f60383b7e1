//! Where Latchkey objects come from: the Kubernetes API (watch-backed caches) or a directory of
//! manifests (standalone mode). The catalog only finds objects; which store an ExternalSecret may use is
//! decided in [`binding`].

pub mod binding;
pub mod generators;
pub mod kubernetes;
pub mod lenient;
pub mod manifests;
mod strict;
pub mod yaml_limits;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use crate::api::generator::GeneratorObject;
use crate::api::provider_kinds::{ProviderKind, ProviderObject};
use crate::api::store::LabelSelector;
use crate::api::{ClusterSecretStore, ExternalSecret, SecretStore, StoreKind};

pub use binding::{Binding, BindingError, BoundStore, bind};
pub use generators::bind_generator;
pub use kubernetes::KubernetesCatalog;
pub use lenient::Lenient;
pub use manifests::{ManifestCatalog, ManifestError, Origin, Skipped};

/// Failure to reach the object source itself (not "object missing", which is `Ok(None)`).
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The source could not answer.
    #[error("catalog unavailable: {0}")]
    Unavailable(String),
    /// The object exists but this agent cannot read it (it does not match the agent's schema,
    /// e.g. written for another release of the CRDs).
    #[error(
        "{kind} {name:?} cannot be used: it does not match the schema this agent reads \
         ({reason}); fix the object or align the CRDs with the agent's release"
    )]
    Unusable {
        /// Kind of the object.
        kind: String,
        /// `namespace/name` or `name`.
        name: String,
        /// Which field and why, without values.
        reason: String,
    },
    /// A store names a provider kind the API server does not serve: its CRD is not installed
    /// (the cluster installs only the providers it uses).
    #[error("{}", crd_missing(*kind, *cluster))]
    ProviderCrdMissing {
        /// The provider kind.
        kind: ProviderKind,
        /// In `cluster.providers.latchkey.dev`.
        cluster: bool,
    },
    /// Standalone mode: a manifest defines the object, but it was not loaded.
    #[error("{kind} {name:?} was not loaded from {detail}; fix the manifest and restart the agent")]
    NotLoaded {
        /// Kind of the object.
        kind: &'static str,
        /// `namespace/name` or `name`.
        name: String,
        /// `file document N: why`, without values (one string: this error travels inside
        /// every publish error, which must stay small).
        detail: String,
    },
}

/// What [`CatalogError::ProviderCrdMissing`] says: the kind, its CRD and how to install it.
fn crd_missing(kind: ProviderKind, cluster: bool) -> String {
    let (api_version, file) = (
        if cluster {
            crate::api::provider_kinds::CLUSTER_PROVIDER_API_VERSION
        } else {
            crate::api::provider_kinds::PROVIDER_API_VERSION
        },
        kind.file_stem(),
    );
    format!(
        "{} ({api_version}) is not served by the API server: the CRD {} is not installed; \
         install it with `kubectl apply -k crds/providers/{file}` (or `latchkey crds \
         --provider {file} | kubectl apply -f -`; the chart: add {file} to its `providers` value)",
        kind.name(),
        kind.crd_name(cluster)
    )
}

/// Read access to the objects a publish needs. Lookups are cheap (served from memory).
#[async_trait]
pub trait Catalog: Send + Sync {
    /// The ExternalSecret `namespace/name`.
    async fn external_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ExternalSecret>>, CatalogError>;
    /// The SecretStore `namespace/name`.
    async fn secret_store(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<SecretStore>>, CatalogError>;
    /// The ClusterSecretStore `name`.
    async fn cluster_secret_store(
        &self,
        name: &str,
    ) -> Result<Option<Arc<ClusterSecretStore>>, CatalogError>;
    /// The generator of `kind` (`Password`, `VaultDynamicSecret`, `PluginGenerator`) named
    /// `namespace/name`, or the ClusterGenerator `name` (`kind` `ClusterGenerator`; `namespace`
    /// is then not used). Generators are read when a volume is first published, not watched.
    async fn generator(
        &self,
        namespace: &str,
        kind: &str,
        name: &str,
    ) -> Result<Option<GeneratorObject>, CatalogError>;
    /// The `v1` Secret `namespace/name` (provider credentials).
    async fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Secret>>, CatalogError>;
    /// The `v1` ConfigMap `namespace/name` (a store's `caProvider`).
    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ConfigMap>>, CatalogError>;
    /// The provider object of `kind` a store names: `namespace/name` in
    /// `providers.latchkey.dev`, or with `namespace` `None` the cluster-scoped `name` in
    /// `cluster.providers.latchkey.dev`.
    async fn provider(
        &self,
        kind: ProviderKind,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Arc<ProviderObject>>, CatalogError>;
    /// Labels of a namespace, for ClusterSecretStore namespace selectors.
    async fn namespace_labels(
        &self,
        namespace: &str,
    ) -> Result<BTreeMap<String, String>, CatalogError>;
    /// True once the catalog holds a complete view (always true for manifests).
    fn is_synced(&self) -> bool;
    /// The names of the stores of `kind` whose labels `selector` matches: SecretStores of
    /// `namespace`, or ClusterSecretStores (whatever their conditions), unusable ones included
    /// (a lookup by name reports them). An error rather than a partial list while the stores
    /// are not all listed yet (a PushSecret's `labelSelector`).
    async fn stores_matching(
        &self,
        _kind: StoreKind,
        _namespace: &str,
        _selector: &LabelSelector,
    ) -> Result<Vec<String>, CatalogError> {
        Err(CatalogError::Unavailable(
            "this catalog cannot select stores by label".into(),
        ))
    }
}
