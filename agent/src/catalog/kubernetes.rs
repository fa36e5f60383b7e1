//! Catalog backed by the Kubernetes API: watch-backed caches (reflectors) of ExternalSecrets,
//! SecretStores, ClusterSecretStores and Namespaces, so a publish costs no API round trip; a
//! direct GET on a cache miss (an object created a moment ago). Secrets (provider credentials)
//! are read on demand and never cached here.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tracing::warn;

use super::{Catalog, CatalogError};
use crate::api::{ClusterSecretStore, ExternalSecret, SecretStore};

/// The label the API server sets on every Namespace.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// How many reflectors must have listed once before the catalog counts as synced.
const REFLECTORS: usize = 4;

/// Objects from the API server, cached by watches.
pub struct KubernetesCatalog {
    client: Client,
    external_secrets: Store<ExternalSecret>,
    secret_stores: Store<SecretStore>,
    cluster_secret_stores: Store<ClusterSecretStore>,
    namespaces: Store<Namespace>,
    synced: Arc<AtomicUsize>,
    tasks: Vec<JoinHandle<()>>,
}

impl KubernetesCatalog {
    /// Starts the watches; lookups work at once (falling back to GETs until the caches fill).
    pub fn start(client: Client) -> Self {
        let synced = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        let external_secrets = reflect(Api::all(client.clone()), &synced, &mut tasks);
        let secret_stores = reflect(Api::all(client.clone()), &synced, &mut tasks);
        let cluster_secret_stores = reflect(Api::all(client.clone()), &synced, &mut tasks);
        let namespaces = reflect(Api::all(client.clone()), &synced, &mut tasks);
        Self {
            client,
            external_secrets,
            secret_stores,
            cluster_secret_stores,
            namespaces,
            synced,
            tasks,
        }
    }
}

impl Drop for KubernetesCatalog {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts a reflector for one kind: a task driving the watch, and one counting it as synced
/// after its first complete list.
fn reflect<K>(api: Api<K>, synced: &Arc<AtomicUsize>, tasks: &mut Vec<JoinHandle<()>>) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store::<K>();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let stream = reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    tasks.push(tokio::spawn(async move {
        stream
            .for_each(|event| {
                if let Err(error) = event {
                    warn!(%kind, %error, "watch failed; retrying with backoff");
                }
                std::future::ready(())
            })
            .await;
    }));
    let ready = reader.clone();
    let synced = Arc::clone(synced);
    tasks.push(tokio::spawn(async move {
        if ready.wait_until_ready().await.is_ok() {
            synced.fetch_add(1, Ordering::AcqRel);
        }
    }));
    reader
}

/// The cached object, or a GET when the cache does not have it (yet).
async fn cached_or_get<K>(
    store: &Store<K>,
    api: Api<K>,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<Arc<K>>, CatalogError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let mut key = ObjectRef::new(name);
    if let Some(ns) = namespace {
        key = key.within(ns);
    }
    if let Some(found) = store.get(&key) {
        return Ok(Some(found));
    }
    api.get_opt(name)
        .await
        .map(|o| o.map(Arc::new))
        .map_err(|e| unavailable::<K>(&e, name))
}

/// A kube error as a catalog error. Only the API server's own message is kept: a client-side
/// decoding error could quote the body, and Secret bodies hold values.
fn unavailable<K: Resource>(e: &kube::Error, name: &str) -> CatalogError
where
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    match e {
        kube::Error::Api(status) => {
            CatalogError::Unavailable(format!("reading {kind} {name:?}: {}", status.message))
        }
        _ => CatalogError::Unavailable(format!(
            "reading {kind} {name:?}: the API server did not answer usably"
        )),
    }
}

#[async_trait]
impl Catalog for KubernetesCatalog {
    async fn external_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ExternalSecret>>, CatalogError> {
        let api = Api::namespaced(self.client.clone(), namespace);
        cached_or_get(&self.external_secrets, api, Some(namespace), name).await
    }

    async fn secret_store(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<SecretStore>>, CatalogError> {
        let api = Api::namespaced(self.client.clone(), namespace);
        cached_or_get(&self.secret_stores, api, Some(namespace), name).await
    }

    async fn cluster_secret_store(
        &self,
        name: &str,
    ) -> Result<Option<Arc<ClusterSecretStore>>, CatalogError> {
        let api = Api::all(self.client.clone());
        cached_or_get(&self.cluster_secret_stores, api, None, name).await
    }

    async fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Secret>>, CatalogError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name)
            .await
            .map(|o| o.map(Arc::new))
            .map_err(|e| unavailable::<Secret>(&e, name))
    }

    async fn namespace_labels(
        &self,
        namespace: &str,
    ) -> Result<BTreeMap<String, String>, CatalogError> {
        let api = Api::all(self.client.clone());
        let ns = cached_or_get(&self.namespaces, api, None, namespace).await?;
        let mut labels = ns
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default();
        labels
            .entry(NAMESPACE_NAME_LABEL.into())
            .or_insert_with(|| namespace.into());
        Ok(labels)
    }

    fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire) >= REFLECTORS
    }
}
