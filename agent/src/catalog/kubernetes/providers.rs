//! Provider objects (`providers.latchkey.dev`, `cluster.providers.latchkey.dev`) in the
//! Kubernetes catalog. A cluster installs only the provider CRDs it uses, so which kinds exist
//! is discovered (at start, and again when a store names a kind not seen yet, at most every
//! [`REDISCOVER_AFTER`]), and only the served kinds are watched: no watch ever runs on a kind
//! that is not there, and a missing one is an error only for the stores that name it. A watch
//! whose CRD is deleted ends at the API server's first 404, and the kind counts as missing
//! until a discovery finds it again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use kube::runtime::reflector::Store;
use kube::{Api, Client};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::super::CatalogError;
use super::super::lenient::Lenient;
use super::{Unusable, reflect_while_served, usable_or_get};
use crate::api::provider_kinds::{
    self, CLUSTER_PROVIDER_GROUP, KindVisitor, PROVIDER_GROUP, PROVIDER_VERSION, ProviderKind,
    ProviderObject, ProviderResource,
};
use crate::telemetry::metrics::KindLabel;

/// How long a discovery that found a kind missing is trusted: a store naming that kind within
/// this time gets the "not installed" error without asking the API server again.
pub(super) const REDISCOVER_AFTER: Duration = Duration::from_secs(30);

/// One served provider kind and its watch-backed cache.
#[async_trait]
trait ProviderCache: Send + Sync {
    /// The kind's watch ended because the API server no longer serves it.
    fn is_gone(&self) -> bool;

    async fn get(
        &self,
        client: &Client,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Arc<ProviderObject>>, CatalogError>;
}

struct Namespaced<T: ProviderResource>(Store<Lenient<T>>, Memo, Arc<AtomicBool>);
struct Cluster<T: ProviderResource>(Store<Lenient<T>>, Memo, Arc<AtomicBool>);

/// Most conversions remembered per kind before the memo starts over.
const MEMO_LIMIT: usize = 4096;

/// The [`ProviderObject`] made from each object version, so that every publish of a store by
/// reference sees the same `Arc` until the object changes: the fetch layer computes a store's
/// cache identity once per (store, provider object) pair it has not seen.
#[derive(Default)]
struct Memo(Mutex<HashMap<String, (String, Arc<ProviderObject>)>>);

impl Memo {
    fn of<T: ProviderResource>(&self, object: &T) -> Arc<ProviderObject> {
        let meta = object.meta();
        let key = format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        );
        let version = format!(
            "{}/{}",
            meta.uid.as_deref().unwrap_or_default(),
            meta.resource_version.as_deref().unwrap_or_default()
        );
        // Every operation under this lock leaves a well-formed map.
        let mut memo = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((seen, converted)) = memo.get(&key)
            && *seen == version
            && !version.ends_with('/')
        {
            return Arc::clone(converted);
        }
        if memo.len() >= MEMO_LIMIT {
            memo.clear();
        }
        let converted = object.provider_object();
        memo.insert(key, (version, Arc::clone(&converted)));
        converted
    }
}

#[async_trait]
impl<T> ProviderCache for Namespaced<T>
where
    T: ProviderResource<Scope = k8s_openapi::NamespaceResourceScope>,
{
    fn is_gone(&self) -> bool {
        self.2.load(Ordering::Acquire)
    }

    async fn get(
        &self,
        client: &Client,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Arc<ProviderObject>>, CatalogError> {
        let namespace = namespace.unwrap_or_default();
        let api = Api::namespaced(client.clone(), namespace);
        let found = usable_or_get::<T>(Some(&self.0), api, Some(namespace), name).await?;
        Ok(found.map(|o| self.1.of(&*o)))
    }
}

#[async_trait]
impl<T> ProviderCache for Cluster<T>
where
    T: ProviderResource<Scope = k8s_openapi::ClusterResourceScope>,
{
    fn is_gone(&self) -> bool {
        self.2.load(Ordering::Acquire)
    }

    async fn get(
        &self,
        client: &Client,
        _namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Arc<ProviderObject>>, CatalogError> {
        let api = Api::all(client.clone());
        let found = usable_or_get::<T>(Some(&self.0), api, None, name).await?;
        Ok(found.map(|o| self.1.of(&*o)))
    }
}

/// Starts the watch of one provider kind.
struct StartWatch<'a> {
    client: &'a Client,
    unusable: &'a Family<KindLabel, Gauge>,
    synced: &'a Arc<AtomicUsize>,
    tasks: &'a mut Vec<JoinHandle<()>>,
}

impl KindVisitor for StartWatch<'_> {
    type Output = Arc<dyn ProviderCache>;

    fn namespaced<T>(self) -> Self::Output
    where
        T: ProviderResource<Scope = k8s_openapi::NamespaceResourceScope>,
    {
        let (store, gone) = self.start::<T>();
        Arc::new(Namespaced(store, Memo::default(), gone))
    }

    fn cluster<T>(self) -> Self::Output
    where
        T: ProviderResource<Scope = k8s_openapi::ClusterResourceScope>,
    {
        let (store, gone) = self.start::<T>();
        Arc::new(Cluster(store, Memo::default(), gone))
    }
}

impl StartWatch<'_> {
    fn start<T: ProviderResource>(self) -> (Store<Lenient<T>>, Arc<AtomicBool>) {
        let unusable = Unusable::from_family(T::KIND.name(), self.unusable);
        let gone = Arc::new(AtomicBool::new(false));
        let store = reflect_while_served(
            Api::all(self.client.clone()),
            unusable,
            self.synced,
            self.tasks,
            Some(Arc::clone(&gone)),
        );
        (store, gone)
    }
}

/// What discovery found, and the caches of the served kinds.
#[derive(Default)]
struct State {
    served: HashMap<(ProviderKind, bool), Arc<dyn ProviderCache>>,
    discovered_at: Option<Instant>,
    tasks: Vec<JoinHandle<()>>,
}

/// The provider kinds of one catalog.
pub(super) struct Providers {
    client: Client,
    unusable: Family<KindLabel, Gauge>,
    state: tokio::sync::Mutex<State>,
    /// The watch tasks, for [`Providers::stop`] (which must not wait for the async lock).
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// A discovery has succeeded.
    discovered: AtomicBool,
    /// Counts the provider watches that have listed once; not waited for (see
    /// [`Providers::is_synced`]).
    synced: Arc<AtomicUsize>,
}

impl Providers {
    pub(super) fn new(client: Client, unusable: Family<KindLabel, Gauge>) -> Self {
        Self {
            client,
            unusable,
            state: tokio::sync::Mutex::default(),
            tasks: Mutex::default(),
            discovered: AtomicBool::new(false),
            synced: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Discovered once. The provider watches are not waited for: a lookup before a watch has
    /// listed is a GET, and a kind the agent may not list (a ClusterRole older than the CRDs)
    /// must fail only the stores that name it, not the agent's readiness.
    pub(super) fn is_synced(&self) -> bool {
        self.discovered.load(Ordering::Acquire)
    }

    /// Discovers until it succeeds (at start: the agent is not ready before).
    pub(super) async fn discover_at_start(&self) {
        while let Err(error) = self.discover_now().await {
            warn!(%error, "provider kinds not discovered; retrying in 5s");
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    }

    /// Discovers the served kinds and starts their watches; logs what it found.
    pub(super) async fn discover_now(&self) -> Result<(), CatalogError> {
        let mut state = self.state.lock().await;
        self.discover(&mut state).await
    }

    async fn discover(&self, state: &mut State) -> Result<(), CatalogError> {
        let served = discover(&self.client).await?;
        let mut started = Vec::new();
        for key in served {
            if state.served.contains_key(&key) {
                continue;
            }
            let watch = StartWatch {
                client: &self.client,
                unusable: &self.unusable,
                synced: &self.synced,
                tasks: &mut state.tasks,
            };
            state
                .served
                .insert(key, provider_kinds::visit(key.0, key.1, watch));
            started.push(provider_kinds::shown(key.0, key.1, "").replace(" \"\"", ""));
        }
        state.discovered_at = Some(Instant::now());
        self.discovered.store(true, Ordering::Release);
        self.tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .append(&mut state.tasks);
        if !started.is_empty() {
            info!(kinds = %started.join(", "), "watching provider kinds");
        }
        Ok(())
    }

    /// The provider object `namespace/name` (or the cluster-scoped `name`) of `kind`.
    pub(super) async fn get(
        &self,
        kind: ProviderKind,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Arc<ProviderObject>>, CatalogError> {
        let key = (kind, namespace.is_none());
        let cache = {
            let mut state = self.state.lock().await;
            // Kinds whose CRD was deleted: missing now, watched again once rediscovered.
            state.served.retain(|_, cache| !cache.is_gone());
            if !state.served.contains_key(&key)
                && state
                    .discovered_at
                    .is_none_or(|at| at.elapsed() >= REDISCOVER_AFTER)
            {
                self.discover(&mut state).await?;
            }
            state.served.get(&key).cloned()
        };
        match cache {
            Some(cache) => cache.get(&self.client, namespace, name).await,
            None => Err(missing(kind, key.1)),
        }
    }

    /// Ends the watches.
    pub(super) fn stop(&self) {
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            task.abort();
        }
    }
}

/// The error for a kind whose CRD is not installed.
fn missing(kind: ProviderKind, cluster: bool) -> CatalogError {
    CatalogError::ProviderCrdMissing { kind, cluster }
}

/// The provider kinds the API server serves, from the discovery documents of the two groups
/// (a group none of whose CRDs is installed is a 404).
pub async fn discover(client: &Client) -> Result<Vec<(ProviderKind, bool)>, CatalogError> {
    let mut served = Vec::new();
    for (group, cluster) in [(PROVIDER_GROUP, false), (CLUSTER_PROVIDER_GROUP, true)] {
        let version = format!("{group}/{PROVIDER_VERSION}");
        let list = match client.list_api_group_resources(&version).await {
            Ok(list) => list,
            Err(kube::Error::Api(status)) if status.code == 404 => continue,
            Err(e) => {
                warn!(group = %version, error = %e, "provider discovery failed");
                return Err(CatalogError::Unavailable(format!(
                    "discovering the provider kinds of {version}: the API server did not \
                     answer usably"
                )));
            }
        };
        for resource in list.resources {
            let Some(kind) = ProviderKind::named(&resource.kind) else {
                continue;
            };
            if resource.name == kind.plural() && resource.namespaced != cluster {
                served.push((kind, cluster));
            }
        }
    }
    Ok(served)
}
