//! The catalog as one reconcile reads it. The ExternalSecret being reconciled is the one the
//! controller's own watch delivered, so the shared catalog does not cache every ExternalSecret a
//! second time (the controller starts it without that watch: at 10,000 ExternalSecrets the two
//! copies were most of its memory). Stores, Namespaces and credential Secrets come from the
//! shared catalog.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use crate::api::{ClusterSecretStore, ExternalSecret, SecretStore};
use crate::catalog::{Catalog, CatalogError};

/// The shared catalog, with the ExternalSecret at hand served as given.
pub struct AtHand<'a> {
    /// The ExternalSecret being reconciled.
    pub external_secret: &'a Arc<ExternalSecret>,
    /// Everything else.
    pub catalog: &'a dyn Catalog,
}

impl AtHand<'_> {
    fn is_at_hand(&self, namespace: &str, name: &str) -> bool {
        let meta = &self.external_secret.metadata;
        meta.namespace.as_deref() == Some(namespace) && meta.name.as_deref() == Some(name)
    }
}

#[async_trait]
impl Catalog for AtHand<'_> {
    async fn external_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ExternalSecret>>, CatalogError> {
        if self.is_at_hand(namespace, name) {
            return Ok(Some(Arc::clone(self.external_secret)));
        }
        self.catalog.external_secret(namespace, name).await
    }

    async fn secret_store(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<SecretStore>>, CatalogError> {
        self.catalog.secret_store(namespace, name).await
    }

    async fn cluster_secret_store(
        &self,
        name: &str,
    ) -> Result<Option<Arc<ClusterSecretStore>>, CatalogError> {
        self.catalog.cluster_secret_store(name).await
    }

    async fn generator(
        &self,
        namespace: &str,
        kind: &str,
        name: &str,
    ) -> Result<Option<crate::api::generator::GeneratorObject>, CatalogError> {
        self.catalog.generator(namespace, kind, name).await
    }

    async fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Secret>>, CatalogError> {
        self.catalog.secret(namespace, name).await
    }

    async fn provider(
        &self,
        kind: crate::api::provider_kinds::ProviderKind,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Arc<crate::api::provider_kinds::ProviderObject>>, CatalogError> {
        self.catalog.provider(kind, namespace, name).await
    }

    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ConfigMap>>, CatalogError> {
        self.catalog.config_map(namespace, name).await
    }

    async fn namespace_labels(
        &self,
        namespace: &str,
    ) -> Result<BTreeMap<String, String>, CatalogError> {
        self.catalog.namespace_labels(namespace).await
    }

    fn is_synced(&self) -> bool {
        self.catalog.is_synced()
    }
}
