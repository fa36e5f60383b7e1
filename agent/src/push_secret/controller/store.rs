//! The store a PushSecret names, as its namespace may use it: found, admitted (a
//! ClusterSecretStore's conditions), its provider inline or by `providerRef` (resolved and checked
//! as a publish does), and the writer for it as the PushSecret's service account.

use std::sync::Arc;

use kube::ResourceExt;

use super::PushController;
use crate::api::push_secret::PushSecret;
use crate::api::{CredentialScope, StoreKind, validate};
use crate::catalog::binding::{
    BoundStore, ProviderResolution, admits, provider_spec, resolve_provider,
};
use crate::catalog::{Catalog, CatalogError};
use crate::providers::push::Pusher;
use crate::push_secret::pushers::StoreTarget;

/// A failure: its condition reason and message (store named, never a value).
type Failed = (&'static str, String);

impl PushController {
    /// The store `kind/name` as `object`'s namespace may use it: its writer, and whether it lets
    /// pushes adopt what Latchkey did not create (`spec.push.adoptExisting`).
    pub(super) async fn pusher(
        &self,
        object: &PushSecret,
        namespace: &str,
        kind: StoreKind,
        name: &str,
    ) -> Result<(Arc<dyn Pusher>, bool), Failed> {
        let catalog = &*self.parts.catalog;
        let store = found(catalog, namespace, kind, name).await?;
        let adopt = match &store {
            BoundStore::Namespaced(s) => s.spec.push.as_ref(),
            BoundStore::Cluster(s) => s.spec.push.as_ref(),
            BoundStore::None => None,
        }
        .is_some_and(|p| p.adopt_existing);
        let invalid =
            |e: validate::Invalid| ("InvalidStore", format!("{kind} {name:?} is invalid: {e}"));
        let provider_object = match resolve_provider(catalog, &store, kind, namespace).await {
            Ok(object) => object,
            Err(ProviderResolution::Invalid(e)) => return Err(invalid(e)),
            Err(ProviderResolution::Catalog(e)) => return Err(unavailable(e)),
            Err(ProviderResolution::Missing(provider)) => {
                return Err((
                    "ProviderNotFound",
                    format!(
                        "{kind} {name:?}: its providerRef names {provider}, which does not exist"
                    ),
                ));
            }
        };
        let spec = provider_spec(&store, provider_object.as_deref(), kind).map_err(invalid)?;
        let target = StoreTarget {
            namespace,
            push_secret: &object.name_any(),
            service_account: object.service_account(),
            kind,
            scope: CredentialScope::of(kind, provider_object.as_deref()),
            store: name,
            spec,
        };
        let pusher = self
            .parts
            .pushers
            .pusher(&target)
            .await
            .map_err(|e| (e.reason(), e.to_string()))?;
        Ok((pusher, adopt))
    }
}

fn unavailable(e: CatalogError) -> Failed {
    ("StoreUnavailable", e.to_string())
}

/// The store, if it exists and (a ClusterSecretStore) admits `namespace`.
async fn found(
    catalog: &dyn Catalog,
    namespace: &str,
    kind: StoreKind,
    name: &str,
) -> Result<BoundStore, Failed> {
    let missing = || ("StoreNotFound", format!("{kind} {name:?} not found"));
    match kind {
        StoreKind::SecretStore => {
            let store = catalog
                .secret_store(namespace, name)
                .await
                .map_err(unavailable)?;
            Ok(BoundStore::Namespaced(store.ok_or_else(missing)?))
        }
        StoreKind::ClusterSecretStore => {
            let store = catalog
                .cluster_secret_store(name)
                .await
                .map_err(unavailable)?
                .ok_or_else(missing)?;
            let labels = catalog
                .namespace_labels(namespace)
                .await
                .map_err(unavailable)?;
            admits(&store.spec.conditions, namespace, &labels).map_err(|rule| {
                (
                    "NotAdmitted",
                    format!("{kind} {name:?} does not admit namespace {namespace:?}: {rule}"),
                )
            })?;
            Ok(BoundStore::Cluster(store))
        }
    }
}
