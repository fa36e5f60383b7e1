//! Fetching: the values an ExternalSecret's [`Plan`] asks for, read from its store as one
//! identity. [`Fetcher`] goes through the shared [`ValueCache`] (pods of one service account share
//! a read, concurrent reads of one key share one backend call), builds the store's provider only
//! on a cache miss, runs identical `dataFrom.find` searches once, and stops once the values exceed
//! the caller's byte budget. Errors name the ExternalSecret, store and remote key, never a value.
//!
//! Shared by every caller that needs an ExternalSecret's values: the publish path, and a caller
//! with no pod (the mirror controller) that brings its own identity. Not for binding (see
//! [`crate::catalog`]), not for deciding *whether* or *when* to call a backend (backoff and
//! refresh schedules are the caller's, keyed by [`Source::store`] and [`Source::identity`]; they
//! keep them with [`backoff`] and [`schedule`], which live here so both callers share them), and
//! not for turning values into entries or files (see [`crate::resolve`]). No CSI, no volumes, no
//! Events.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::OnceCell;

use crate::api::provider_kinds::ProviderObject;
use crate::api::validate::ProviderSpec;
use crate::api::{ClusterSecretStore, SecretStore};
use crate::api::{CredentialScope, StoreKind};
use crate::cache::{CacheKey, CacheLimits, ValueCache};
use crate::catalog::{Binding, BoundStore};
use crate::identity::PodInfo;
use crate::providers::{self, FindQuery, Provider, ProviderError, RemoteKey};
use crate::resolve::{Context, Fetched, Plan};
use backoff::Gate;

pub mod backoff;
pub mod schedule;

/// Why values could not be fetched. Messages name namespace, ExternalSecret, store and remote key
/// where they apply, and never contain values or tokens.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The backend did not deliver a value.
    #[error("{ctx}{}: {source}", key.as_ref().map(|k| format!(", {k}")).unwrap_or_default())]
    Provider {
        /// Objects involved.
        ctx: Box<Context>,
        /// The key being fetched, if the failure is about one.
        key: Option<RemoteKey>,
        /// Cause.
        source: ProviderError,
    },
    /// The values fetched so far exceed the caller's byte budget.
    #[error("{ctx}: {what} takes the fetched values beyond {limit} bytes")]
    OverBudget {
        /// Objects involved.
        ctx: Box<Context>,
        /// The remote key or `find` whose result went over.
        what: String,
        /// The budget, in bytes.
        limit: u64,
    },
    /// The store no longer validates although its binding did (a bug).
    #[error("internal error: {0}")]
    Internal(String),
}

impl FetchError {
    /// The backend's error, when the backend is what failed.
    pub fn provider_error(&self) -> Option<&ProviderError> {
        match self {
            Self::Provider { source, .. } => Some(source),
            Self::OverBudget { .. } | Self::Internal(_) => None,
        }
    }
}

/// Where values come from and as whom: a bound store and the identity its requests are made as.
pub struct Source<'a> {
    ctx: &'a Context,
    spec: ProviderSpec<'a>,
    scope: CredentialScope,
    pod: &'a PodInfo,
    store: Arc<str>,
    identity: String,
}

impl<'a> Source<'a> {
    /// The store of `binding`, named `store` (its [`store_identity`]), read as `pod`; `ctx`
    /// names the objects in errors.
    fn new(
        ctx: &'a Context,
        binding: &'a Binding,
        pod: &'a PodInfo,
        store: Arc<str>,
    ) -> Result<Self, FetchError> {
        // `bind` validated the provider block, so there is one; map its absence rather than panic.
        let spec = binding
            .spec()
            .ok_or_else(|| FetchError::Internal(format!("{ctx}: the store sets no provider")))?;
        Ok(Self {
            ctx,
            spec,
            scope: binding.credential_scope(),
            pod,
            store,
            // Pods of one service account share a fetch; two identities never share a value.
            identity: format!("{}/{}", pod.namespace, pod.service_account),
        })
    }

    /// Names the store in cache and backoff keys: changes whenever its provider block does.
    pub fn store(&self) -> &str {
        &self.store
    }

    /// The auth identity (`namespace/serviceaccount`) in cache and backoff keys.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn error(&self, key: Option<RemoteKey>, source: ProviderError) -> FetchError {
        FetchError::Provider {
            ctx: self.ctx.boxed(),
            key,
            source,
        }
    }
}

/// Reads values through the cache shared by all of the agent's callers.
pub struct Fetcher {
    cache: ValueCache,
    providers: providers::Env,
    stores: StoreIdentities,
}

impl Fetcher {
    /// What providers (and generators) are built with.
    pub fn env(&self) -> &providers::Env {
        &self.providers
    }

    /// A fetcher building providers in `providers` and caching values within `cache_limits`.
    pub fn new(providers: providers::Env, cache_limits: CacheLimits) -> Self {
        Self {
            cache: ValueCache::new(cache_limits, Arc::clone(&providers.metrics)),
            providers,
            stores: StoreIdentities::default(),
        }
    }

    /// The store of `binding`, read as `pod` (a caller with no pod brings the identity it acts
    /// as); `ctx` names the objects in errors.
    pub fn source<'a>(
        &self,
        ctx: &'a Context,
        binding: &'a Binding,
        pod: &'a PodInfo,
    ) -> Result<Source<'a>, FetchError> {
        Source::new(ctx, binding, pod, self.stores.of(binding))
    }

    /// Fetches what `plan` asks for from `source`. Cached values older than `max_age` are read
    /// again; everything fetched shares `budget` bytes, checked as values arrive. `gate` is
    /// entered before every backend call (a cache miss or a `find`), never for a cache hit.
    pub async fn fetch(
        &self,
        source: &Source<'_>,
        plan: Plan,
        max_age: Option<Duration>,
        budget: u64,
        gate: &Gate<'_>,
    ) -> Result<Fetched, FetchError> {
        // Built on the first cache miss only: a warm fetch never constructs a client. The build
        // is boxed: its future (the SDK clients' set-up, ~12 KiB in a debug build) would
        // otherwise be part of every key's future below, allocated and copied on every fetch,
        // warm ones included.
        let provider: OnceCell<Arc<dyn Provider>> = OnceCell::new();
        let provider = || async {
            provider
                .get_or_try_init(|| {
                    let ctx = providers::BuildContext {
                        env: &self.providers,
                        pod: source.pod,
                        scope: source.scope,
                        max_age,
                    };
                    Box::pin(async move { providers::build(source.spec, &ctx).await })
                })
                .await
                .cloned()
        };
        let budget = Budget::new(budget);
        let over_budget = |what: String| FetchError::OverBudget {
            ctx: source.ctx.boxed(),
            what,
            limit: budget.limit,
        };
        let values = futures::future::try_join_all(plan.keys.into_iter().map(|key| {
            let cache_key = CacheKey::new(&source.store, &source.identity, &key);
            async {
                let fetch = || async {
                    gate.enter()?;
                    provider().await?.get(&key).await
                };
                let value = self
                    .cache
                    .get_or_fetch(cache_key, max_age, fetch)
                    .await
                    .map_err(|e| source.error(Some(key.clone()), e))?;
                if !budget.take(value.len()) {
                    return Err(over_budget(key.to_string()));
                }
                Ok((key, value))
            }
        }))
        .await?;
        let mut fetched: Fetched = values.into_iter().collect();
        // Identical searches are run once and their result shared.
        let mut done: Vec<(&FindQuery, usize)> = Vec::new();
        for (index, query) in &plan.finds {
            if let Some((_, first)) = done.iter().find(|(q, _)| q.same_as(query)) {
                fetched.share_found(*first, *index);
                continue;
            }
            gate.enter().map_err(|e| source.error(None, e))?;
            let found = provider()
                .await
                .map_err(|e| source.error(None, e))?
                .find(query)
                .await
                .map_err(|e| source.error(None, e))?;
            let bytes = found.iter().map(|(n, v)| n.len() + v.len()).sum();
            if !budget.take(bytes) {
                return Err(over_budget(format!("spec.dataFrom[{index}].find")));
            }
            fetched.insert_found(*index, found);
            done.push((query, *index));
        }
        Ok(fetched)
    }
}

/// The bytes one fetch may still take; shared by its concurrent reads.
struct Budget {
    limit: u64,
    taken: AtomicU64,
}

impl Budget {
    fn new(limit: u64) -> Self {
        Self {
            limit,
            taken: AtomicU64::new(0),
        }
    }

    /// Takes `bytes`; false once the total exceeds the limit.
    fn take(&self, bytes: usize) -> bool {
        let bytes = bytes as u64;
        let before = self.taken.fetch_add(bytes, Ordering::Relaxed);
        before.saturating_add(bytes) <= self.limit
    }
}

/// Names a store for cache keys: kind, namespace and name, plus a hash of its provider block
/// (the inline one, or the spec of the provider object its `providerRef` names), so an edited
/// store or provider object never serves values fetched under its old settings.
fn store_identity(binding: &Binding) -> String {
    use std::hash::Hasher;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    // Streamed into the hasher: a fake store's spec holds values, which must not be copied into
    // an ordinary (non-zeroizing) buffer on every publish. Writing to a hasher cannot fail.
    let _ = serde_json::to_writer(HashWriter(&mut hasher), binding.provider());
    // A ClusterSecretStore belongs to no namespace; the pod's is in the auth identity instead.
    let kind = binding.store_kind();
    let namespace = match kind {
        StoreKind::SecretStore => binding.namespace.as_str(),
        StoreKind::ClusterSecretStore => "",
    };
    format!(
        "{kind}/{namespace}/{}#{:016x}",
        binding.store_name,
        hasher.finish()
    )
}

/// Most store identities remembered: more stores than a node's pods use at once.
const REMEMBERED_STORES: usize = 16;

/// The identities of the stores used last, each with the store object it was computed from.
/// Hashing a provider block through its JSON took ~9,000 instructions on every warm publish of
/// the benchmark's store (docs/benchmarks.md at c9d4b4e); a store the catalog holds does not
/// change, and an edited one is a new object, so it is not found here and gets its identity
/// anew.
#[derive(Default)]
struct StoreIdentities(Mutex<VecDeque<(RememberedStore, Arc<str>)>>);

/// A store object and the provider object its `providerRef` named, both held weakly: the
/// identity of a store by reference changes with its provider object, which the catalog
/// replaces when it is edited.
struct RememberedStore {
    store: RememberedStoreObject,
    provider: Option<Weak<ProviderObject>>,
}

impl RememberedStore {
    fn new(binding: &Binding) -> Self {
        Self {
            store: RememberedStoreObject::new(&binding.store),
            provider: binding.provider_object.as_ref().map(Arc::downgrade),
        }
    }

    fn is(&self, binding: &Binding) -> bool {
        let same_provider = match (&self.provider, &binding.provider_object) {
            (None, None) => true,
            (Some(w), Some(p)) => w.as_ptr() == Arc::as_ptr(p),
            _ => false,
        };
        same_provider && self.store.is(&binding.store)
    }
}

/// A store object, held weakly: an entry keeps no deleted or replaced store alive, and while
/// it exists no other object can take the allocation it points to.
enum RememberedStoreObject {
    Namespaced(Weak<SecretStore>),
    Cluster(Weak<ClusterSecretStore>),
    /// No store (every entry is generated): all such bindings share one identity.
    None,
}

impl RememberedStoreObject {
    fn new(store: &BoundStore) -> Self {
        match store {
            BoundStore::Namespaced(s) => Self::Namespaced(Arc::downgrade(s)),
            BoundStore::Cluster(s) => Self::Cluster(Arc::downgrade(s)),
            BoundStore::None => Self::None,
        }
    }

    fn is(&self, store: &BoundStore) -> bool {
        match (self, store) {
            (Self::Namespaced(w), BoundStore::Namespaced(s)) => w.as_ptr() == Arc::as_ptr(s),
            (Self::Cluster(w), BoundStore::Cluster(s)) => w.as_ptr() == Arc::as_ptr(s),
            (Self::None, BoundStore::None) => true,
            _ => false,
        }
    }
}

impl StoreIdentities {
    /// [`store_identity`] of `binding`'s store, computed once per store object.
    fn of(&self, binding: &Binding) -> Arc<str> {
        // Every operation under this lock leaves a well-formed list, so a poisoned lock is
        // still safe to use.
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // Most recently used first, so the one a storm uses is found at once.
        if let Some(found) = known
            .iter()
            .position(|(s, _)| s.is(binding))
            .and_then(|at| known.remove(at))
        {
            let identity = Arc::clone(&found.1);
            known.push_front(found);
            return identity;
        }
        let identity: Arc<str> = store_identity(binding).into();
        if known.len() == REMEMBERED_STORES {
            known.pop_back();
        }
        known.push_front((RememberedStore::new(binding), Arc::clone(&identity)));
        identity
    }
}

/// Feeds written bytes to a hasher, so a value can be hashed through its serialization.
struct HashWriter<'a, H: std::hash::Hasher>(&'a mut H);

impl<H: std::hash::Hasher> std::io::Write for HashWriter<'_, H> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.write(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::api::store::{
        ClusterSecretStore, ClusterSecretStoreSpec, FakeEntry, FakeProvider, SecretStore,
        SecretStoreSpec, StoreProvider,
    };
    use crate::api::{ExternalSecret, StoreKind};
    use crate::catalog::{Binding, BoundStore};

    fn binding(kind: StoreKind, value: &str) -> Binding {
        let es: ExternalSecret =
            serde_json::from_str(r#"{"apiVersion":"latchkey.dev/v1alpha1","kind":"ExternalSecret",
              "metadata":{"name":"es","namespace":"shop"},
              "spec":{"secretStoreRef":{"name":"s"},"data":[{"secretKey":"k","remoteRef":{"key":"k"}}]}}"#)
                .unwrap();
        let provider = StoreProvider {
            fake: Some(FakeProvider {
                data: vec![FakeEntry {
                    key: "k".into(),
                    value: value.into(),
                    version: None,
                }],
                latency: None,
            }),
            ..Default::default()
        };
        let store = match kind {
            StoreKind::SecretStore => BoundStore::Namespaced(Arc::new(SecretStore::new(
                "s",
                SecretStoreSpec {
                    provider,
                    provider_ref: None,
                    push: None,
                },
            ))),
            StoreKind::ClusterSecretStore => {
                BoundStore::Cluster(Arc::new(ClusterSecretStore::new(
                    "s",
                    ClusterSecretStoreSpec {
                        provider,
                        provider_ref: None,
                        push: None,
                        conditions: Vec::new(),
                    },
                )))
            }
        };
        Binding {
            namespace: "shop".into(),
            external_secret: Arc::new(es),
            store_name: "s".into(),
            store,
            provider_object: None,
        }
    }

    #[test]
    fn store_identity_follows_the_spec_and_not_the_pod_namespace_for_cluster_stores() {
        let a = super::store_identity(&binding(StoreKind::SecretStore, "v1"));
        assert_eq!(
            a,
            super::store_identity(&binding(StoreKind::SecretStore, "v1"))
        );
        assert_ne!(
            a,
            super::store_identity(&binding(StoreKind::SecretStore, "v2"))
        );
        assert!(a.starts_with("SecretStore/shop/s#"), "{a}");
        assert!(!a.contains("v1"), "the identity never carries a value: {a}");
        let c = super::store_identity(&binding(StoreKind::ClusterSecretStore, "v1"));
        assert!(c.starts_with("ClusterSecretStore//s#"), "{c}");
    }

    #[test]
    fn a_store_identity_is_remembered_per_store_object_and_keeps_none_alive() {
        let stores = super::StoreIdentities::default();
        let v1 = binding(StoreKind::SecretStore, "v1");
        let first = stores.of(&v1);
        assert_eq!(*first, super::store_identity(&v1));
        assert!(Arc::ptr_eq(&first, &stores.of(&v1)), "computed once");
        // An edited store is a new object in the catalog: its identity is computed anew.
        let v2 = binding(StoreKind::SecretStore, "v2");
        assert_ne!(stores.of(&v2), first);
        let cluster = binding(StoreKind::ClusterSecretStore, "v1");
        assert_eq!(*stores.of(&cluster), super::store_identity(&cluster));
        // Remembered weakly: dropping the binding drops the store.
        let BoundStore::Namespaced(store) = &v1.store else {
            unreachable!()
        };
        let weak = Arc::downgrade(store);
        drop(v1);
        assert!(weak.upgrade().is_none(), "the list kept a store alive");
        // Never more than REMEMBERED_STORES; the oldest goes first.
        let many: Vec<_> = (0..super::REMEMBERED_STORES + 2)
            .map(|i| binding(StoreKind::SecretStore, &format!("s{i}")))
            .collect();
        for b in &many {
            stores.of(b);
        }
        let known = stores.0.lock().unwrap();
        assert_eq!(known.len(), super::REMEMBERED_STORES);
        assert!(known[0].0.is(many.last().unwrap()));
    }

    #[test]
    fn the_budget_is_shared_and_refuses_once_exceeded() {
        let budget = super::Budget::new(10);
        assert!(budget.take(6));
        assert!(budget.take(4));
        assert!(!budget.take(1));
    }
}
