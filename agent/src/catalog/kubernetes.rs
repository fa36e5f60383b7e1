//! Catalog backed by the Kubernetes API: watch-backed caches (reflectors) of ExternalSecrets,
//! SecretStores, ClusterSecretStores and Namespaces, so a publish costs no API round trip; a
//! direct GET on a cache miss (an object created a moment ago). Secrets (provider credentials)
//! are read on demand and never cached here. An object that does not deserialize is kept as
//! unusable ([`Lenient`]), counted and logged once, and reported to pods that name it; it never
//! stops the others from being served.

mod providers;

/// The provider kinds the API server serves (kind, cluster-scoped), discovered as the catalog
/// discovers them; for the controller's provider status loop, which watches only those.
pub use providers::discover as served_provider_kinds;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Resource};
use prometheus_client::metrics::gauge::Gauge;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::lenient::Lenient;
use super::{Catalog, CatalogError};
use crate::api::generator::GeneratorObject;
use crate::api::provider_kinds::{ProviderKind, ProviderObject};
use crate::api::store::LabelSelector;
use crate::api::{ClusterSecretStore, ExternalSecret, SecretStore, StoreKind};
use crate::telemetry::Metrics;
use crate::telemetry::metrics::KindLabel;

/// The label the API server sets on every Namespace.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Objects from the API server, cached by watches.
pub struct KubernetesCatalog {
    client: Client,
    /// `None` in the mirror controller, whose own watch holds the ExternalSecrets.
    external_secrets: Option<Store<Lenient<ExternalSecret>>>,
    secret_stores: Store<Lenient<SecretStore>>,
    cluster_secret_stores: Store<Lenient<ClusterSecretStore>>,
    namespaces: Store<Lenient<Namespace>>,
    /// The provider kinds the API server serves, and their caches.
    providers: Arc<providers::Providers>,
    synced: Arc<AtomicUsize>,
    /// How many reflectors must have listed once before the catalog counts as synced.
    reflectors: usize,
    tasks: Vec<JoinHandle<()>>,
}

impl KubernetesCatalog {
    /// Starts the watches; lookups work at once (falling back to GETs until the caches fill).
    pub fn start(client: Client, metrics: &Metrics) -> Self {
        Self::start_watching(client, metrics, true)
    }

    /// As [`Self::start`], without caching ExternalSecrets: for the mirror controller, which
    /// holds them in its own watch and would otherwise keep each twice; an ExternalSecret asked
    /// for here is read with a GET.
    pub fn start_without_external_secrets(client: Client, metrics: &Metrics) -> Self {
        Self::start_watching(client, metrics, false)
    }

    fn start_watching(client: Client, metrics: &Metrics, external_secrets: bool) -> Self {
        let synced = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        let unusable = |kind| Unusable::new(kind, metrics);
        let external_secrets = external_secrets.then(|| {
            reflect(
                Api::all(client.clone()),
                unusable("ExternalSecret"),
                &synced,
                &mut tasks,
            )
        });
        let secret_stores = reflect(
            Api::all(client.clone()),
            unusable("SecretStore"),
            &synced,
            &mut tasks,
        );
        let cluster_secret_stores = reflect(
            Api::all(client.clone()),
            unusable("ClusterSecretStore"),
            &synced,
            &mut tasks,
        );
        let namespaces = reflect(
            Api::all(client.clone()),
            unusable("Namespace"),
            &synced,
            &mut tasks,
        );
        let providers = Arc::new(providers::Providers::new(
            client.clone(),
            metrics.catalog_unusable.clone(),
        ));
        // Discovered at start, so the served kinds are watched (and the catalog synced) before
        // a store needs one.
        let discovering = Arc::clone(&providers);
        tasks.push(tokio::spawn(async move {
            discovering.discover_at_start().await;
        }));
        Self {
            providers,
            reflectors: 3 + usize::from(external_secrets.is_some()),
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
        self.providers.stop();
    }
}

/// Starts a reflector for one kind: a task driving the watch, and one counting it as synced
/// after its first complete list.
fn reflect<K>(
    api: Api<Lenient<K>>,
    unusable: Unusable,
    synced: &Arc<AtomicUsize>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Store<Lenient<K>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    reflect_while_served(api, unusable, synced, tasks, None)
}

/// [`reflect`], for a kind whose CRD may go away: with `gone`, the watch ends (and sets it) when
/// the API server answers 404 for the kind, as it does once the CRD is deleted, instead of
/// retrying forever against a kind that is not there.
fn reflect_while_served<K>(
    api: Api<Lenient<K>>,
    mut unusable: Unusable,
    synced: &Arc<AtomicUsize>,
    tasks: &mut Vec<JoinHandle<()>>,
    gone: Option<Arc<AtomicBool>>,
) -> Store<Lenient<K>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store::<Lenient<K>>();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let stream = reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    tasks.push(tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => unusable.observe(&event),
                Err(error) => {
                    if let Some(gone) = gone.as_ref().filter(|_| not_served(&error)) {
                        info!(%kind, "the kind is no longer served (its CRD was deleted); watch ended");
                        gone.store(true, Ordering::Release);
                        return;
                    }
                    warn!(%kind, %error, "watch failed; retrying with backoff");
                }
            }
        }
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

/// A 404 for the kind's list or watch: the resource itself is gone (objects are never 404 in
/// a list).
fn not_served(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 404,
        _ => false,
    }
}

/// Counts and logs the unusable objects of one kind as watch events arrive: each is logged once
/// per version, and the gauge follows the current set.
struct Unusable {
    kind: &'static str,
    gauge: Gauge,
    /// `namespace/name` -> resourceVersion of every unusable object currently known.
    known: HashMap<String, String>,
    /// The set being rebuilt during a (re-)list, swapped in when the list is complete.
    relisting: Option<HashMap<String, String>>,
}

impl Unusable {
    fn new(kind: &'static str, metrics: &Metrics) -> Self {
        Self::from_family(kind, &metrics.catalog_unusable)
    }

    fn from_family(
        kind: &'static str,
        family: &prometheus_client::metrics::family::Family<KindLabel, Gauge>,
    ) -> Self {
        Self {
            kind,
            gauge: family.get_or_create(&KindLabel { kind }).clone(),
            known: HashMap::new(),
            relisting: None,
        }
    }

    fn observe<K: Resource + Clone>(&mut self, event: &watcher::Event<Lenient<K>>) {
        match event {
            watcher::Event::Init => self.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(object) | watcher::Event::Apply(object) => {
                self.apply(object);
            }
            watcher::Event::Delete(object) => {
                self.known.remove(&key(object));
            }
            watcher::Event::InitDone => {
                if let Some(listed) = self.relisting.take() {
                    self.known = listed;
                }
            }
        }
        self.gauge
            .set(i64::try_from(self.known.len()).unwrap_or(i64::MAX));
    }

    fn apply<K: Resource + Clone>(&mut self, object: &Lenient<K>) {
        let key = key(object);
        let Lenient::Unusable { reason, .. } = object else {
            self.known.remove(&key);
            return;
        };
        let version = object.meta().resource_version.clone().unwrap_or_default();
        if self.known.get(&key) != Some(&version) {
            warn!(kind = self.kind, object = %key, %reason,
                "skipping an object this agent cannot read; pods that name it fail until it is fixed");
        }
        self.known.insert(key.clone(), version.clone());
        if let Some(listed) = &mut self.relisting {
            listed.insert(key, version);
        }
    }
}

fn key<K: Resource>(object: &K) -> String {
    let meta = object.meta();
    match &meta.namespace {
        Some(ns) => format!("{ns}/{}", meta.name.as_deref().unwrap_or_default()),
        None => meta.name.clone().unwrap_or_default(),
    }
}

/// The cached object, or a GET when the cache does not have it (yet) or there is none; an
/// unusable one is an error naming the object and what is wrong with it.
async fn usable_or_get<K>(
    store: Option<&Store<Lenient<K>>>,
    api: Api<Lenient<K>>,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<Arc<K>>, CatalogError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let found = cached_or_get(store, api, namespace, name).await?;
    match found.as_deref() {
        None => Ok(None),
        Some(Lenient::Usable(object)) => Ok(Some(Arc::clone(object))),
        Some(Lenient::Unusable { reason, .. }) => Err(CatalogError::Unusable {
            kind: K::kind(&K::DynamicType::default()).into_owned(),
            name: match namespace {
                Some(ns) => format!("{ns}/{name}"),
                None => name.to_string(),
            },
            reason: reason.clone(),
        }),
    }
}

/// The cached object, or a GET when the cache does not have it (yet) or there is none.
async fn cached_or_get<K>(
    store: Option<&Store<K>>,
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
    if let Some(found) = store.and_then(|s| s.get(&key)) {
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
        usable_or_get(self.external_secrets.as_ref(), api, Some(namespace), name).await
    }

    async fn secret_store(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<SecretStore>>, CatalogError> {
        let api = Api::namespaced(self.client.clone(), namespace);
        usable_or_get(Some(&self.secret_stores), api, Some(namespace), name).await
    }

    async fn cluster_secret_store(
        &self,
        name: &str,
    ) -> Result<Option<Arc<ClusterSecretStore>>, CatalogError> {
        let api = Api::all(self.client.clone());
        usable_or_get(Some(&self.cluster_secret_stores), api, None, name).await
    }

    async fn generator(
        &self,
        namespace: &str,
        kind: &str,
        name: &str,
    ) -> Result<Option<GeneratorObject>, CatalogError> {
        // A GET each time: generators are read on a first publish only, and watching four
        // more kinds on every node would cost memory for the rare volume that uses one.
        let client = &self.client;
        let ns = Some(namespace);
        Ok(match kind {
            "Password" => usable_or_get(None, Api::namespaced(client.clone(), namespace), ns, name)
                .await?
                .map(GeneratorObject::Password),
            "VaultDynamicSecret" => {
                usable_or_get(None, Api::namespaced(client.clone(), namespace), ns, name)
                    .await?
                    .map(GeneratorObject::VaultDynamicSecret)
            }
            "PluginGenerator" => {
                usable_or_get(None, Api::namespaced(client.clone(), namespace), ns, name)
                    .await?
                    .map(GeneratorObject::Plugin)
            }
            "ClusterGenerator" => usable_or_get(None, Api::all(client.clone()), None, name)
                .await?
                .map(GeneratorObject::Cluster),
            _ => None,
        })
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

    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ConfigMap>>, CatalogError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name)
            .await
            .map(|o| o.map(Arc::new))
            .map_err(|e| unavailable::<ConfigMap>(&e, name))
    }

    async fn provider(
        &self,
        kind: ProviderKind,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Arc<ProviderObject>>, CatalogError> {
        self.providers.get(kind, namespace, name).await
    }

    async fn namespace_labels(
        &self,
        namespace: &str,
    ) -> Result<BTreeMap<String, String>, CatalogError> {
        let api = Api::all(self.client.clone());
        let ns = usable_or_get(Some(&self.namespaces), api, None, namespace).await?;
        let mut labels = ns
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default();
        labels
            .entry(NAMESPACE_NAME_LABEL.into())
            .or_insert_with(|| namespace.into());
        Ok(labels)
    }

    fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire) >= self.reflectors && self.providers.is_synced()
    }

    async fn stores_matching(
        &self,
        kind: StoreKind,
        namespace: &str,
        selector: &LabelSelector,
    ) -> Result<Vec<String>, CatalogError> {
        // Before the first list the caches hold only some stores: a selection from them would
        // be partial (and a store that stopped matching would look deleted).
        if self.synced.load(Ordering::Acquire) < self.reflectors {
            return Err(CatalogError::Unavailable(
                "the stores are not all listed yet".into(),
            ));
        }
        let mut names = match kind {
            StoreKind::SecretStore => matching(&self.secret_stores, Some(namespace), selector),
            StoreKind::ClusterSecretStore => matching(&self.cluster_secret_stores, None, selector),
        };
        names.sort_unstable();
        Ok(names)
    }
}

/// The names of the cached objects (of `namespace`, if given) whose labels `selector` matches.
fn matching<K>(
    store: &Store<Lenient<K>>,
    namespace: Option<&str>,
    selector: &LabelSelector,
) -> Vec<String>
where
    K: Resource + Clone,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let empty = BTreeMap::new();
    store
        .state()
        .iter()
        .filter(|o| namespace.is_none() || o.meta().namespace.as_deref() == namespace)
        .filter(|o| {
            let labels = o.meta().labels.as_ref().unwrap_or(&empty);
            super::binding::selector_matches(selector, labels).is_ok()
        })
        .filter_map(|o| o.meta().name.clone())
        .collect()
}
