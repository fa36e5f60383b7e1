//! The publish path, gRPC-free: pod identity -> catalog binding -> provider fetch -> resolve ->
//! volume. The CSI edge parses requests into [`PublishRequest`] and maps [`PublishError`] to a
//! status code; everything in between lives here.

pub mod backoff;
mod locks;
pub mod schedule;

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::sync::OnceCell;
use tracing::{info, warn};

use crate::api::validate::Invalid;
use crate::cache::{CacheKey, CacheLimits, ValueCache};
use crate::catalog::{BindingError, Catalog, bind};
use crate::compute::{ComputeError, Pool};
use crate::events::{MOUNT_FAILED, PodEvents, REFRESH_FAILED};
use crate::identity::PodInfo;
use crate::providers::{self, Provider, ProviderError, RemoteKey};
use crate::resolve::{self, Context, Fetched, ResolveError};
use crate::volume::{Unpublished, VolumeError, VolumeFile, Volumes};
use schedule::{DEFAULT_REFRESH, Refresh, Schedule};

/// A validated NodePublishVolume call.
#[derive(Debug, Clone)]
pub struct PublishRequest {
    /// CSI volume id (kubelet's, for ephemeral volumes).
    pub volume_id: String,
    /// Where the volume is mounted.
    pub target: PathBuf,
    /// The pod the volume is for.
    pub pod: PodInfo,
    /// The ExternalSecret named in the volume attributes.
    pub external_secret: String,
    /// The pod's fsGroup (kubelet's `volume_mount_group`): files are group-owned by it.
    pub group: Option<u32>,
}

/// What a successful publish did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A fresh volume was mounted and filled.
    Mounted,
    /// The volume was already there; `changed` says whether new content was swapped in.
    Refreshed {
        /// Whether the content differed.
        changed: bool,
    },
    /// The volume was already there and refreshing it failed; the previous content is kept.
    RefreshFailed,
    /// The volume was already there and its refresh is not due: nothing was done.
    NotDue,
}

/// Why a publish or unpublish failed. Messages name namespace, ExternalSecret, store and remote
/// key where they apply, and never contain values or tokens.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// No usable ExternalSecret/store pair for the pod.
    #[error(transparent)]
    Binding(#[from] BindingError),
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
    /// The fetched values do not fit the ExternalSecret.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The volume could not be written or removed.
    #[error("{}target {}: {source}", ctx.as_ref().map(|c| format!("{c}, ")).unwrap_or_default(), target.display())]
    Volume {
        /// Objects involved, when publishing.
        ctx: Option<Box<Context>>,
        /// The target path.
        target: PathBuf,
        /// Cause.
        source: VolumeError,
    },
    /// Rendering the values (templates, rewrite, decoding) did not complete.
    #[error("{ctx}: {source}")]
    Compute {
        /// Objects involved.
        ctx: Box<Context>,
        /// Cause.
        source: ComputeError,
    },
    /// A worker thread died (a bug).
    #[error("internal error: {0}")]
    Internal(String),
}

/// The bytes one publish may still fetch; shared by its concurrent fetches.
struct FetchBudget {
    limit: u64,
    taken: std::sync::atomic::AtomicU64,
}

impl FetchBudget {
    fn new(limit: u64) -> Self {
        Self {
            limit,
            taken: Default::default(),
        }
    }

    /// Takes `bytes`; false once the total exceeds the limit.
    fn take(&self, bytes: usize) -> bool {
        let bytes = bytes as u64;
        let before = self.taken.fetch_add(bytes, Ordering::Relaxed);
        before.saturating_add(bytes) <= self.limit
    }
}

/// What the blocking half of a publish did.
enum Written {
    Mounted(Result<(), VolumeError>),
    Updated(Result<bool, VolumeError>),
}

/// A first mount or a refresh, and how it went.
enum Attempt {
    Mount(Result<(), PublishError>),
    Refresh(Result<bool, PublishError>),
}

/// Serves publish and unpublish for one node.
pub struct Publisher {
    catalog: Arc<dyn Catalog>,
    volumes: Arc<Volumes>,
    providers: providers::Env,
    events: Arc<dyn PodEvents>,
    locks: locks::TargetLocks,
    schedule: Schedule,
    backoff: backoff::Backoff,
    cache: ValueCache,
    compute: Pool,
}

impl Publisher {
    /// A publisher over a catalog and a volume manager, building providers in `providers` and
    /// recording failures as Events on the pod.
    pub fn new(
        catalog: Arc<dyn Catalog>,
        volumes: Volumes,
        providers: providers::Env,
        cache_limits: CacheLimits,
        events: Arc<dyn PodEvents>,
        compute: Pool,
    ) -> Self {
        Self {
            cache: ValueCache::new(cache_limits, Arc::clone(&providers.metrics)),
            catalog,
            volumes: Arc::new(volumes),
            providers,
            events,
            locks: locks::TargetLocks::default(),
            schedule: Schedule::default(),
            backoff: backoff::Backoff::default(),
            compute,
        }
    }

    /// The catalog, for readiness checks.
    pub fn catalog(&self) -> &dyn Catalog {
        &*self.catalog
    }

    /// Mounts and fills the volume, or refreshes it when it is already mounted. A failed refresh
    /// keeps the previous content and succeeds (kubelet unmounts a volume whose republish fails).
    pub async fn publish(&self, req: &PublishRequest) -> Result<Outcome, PublishError> {
        let _lock = self.locks.lock(&req.target).await;
        let mounted_here = AtomicBool::new(false);
        let attempt = AssertUnwindSafe(self.publish_locked(req, &mounted_here))
            .catch_unwind()
            .await;
        match attempt {
            Ok(outcome) => outcome,
            // A bug panicked: whatever this call mounted goes again, so that kubelet's retry
            // starts from nothing (a panic must not leave a mount behind).
            Err(_) => {
                if mounted_here.load(Ordering::SeqCst) {
                    let unmounted = self
                        .blocking(&req.target, None, |v, t| v.unpublish(t))
                        .await;
                    self.schedule.remove(&req.target);
                    if let Err(error) = unmounted {
                        tracing::error!(%error, "cannot unmount after a failed publish");
                    }
                }
                Err(PublishError::Internal(
                    "the publish failed unexpectedly (a bug in Latchkey); nothing was left mounted"
                        .into(),
                ))
            }
        }
    }

    /// [`Self::publish`] with the target's lock held; sets `mounted_here` once it has mounted a
    /// fresh volume.
    async fn publish_locked(
        &self,
        req: &PublishRequest,
        mounted_here: &AtomicBool,
    ) -> Result<Outcome, PublishError> {
        let now = Instant::now();
        // kubelet republishes every volume periodically: answer at once until a refresh is due.
        if self.schedule.is_fresh(&req.target, now) {
            return Ok(Outcome::NotDue);
        }
        let group = req.group;
        // Set when the backend is backing off: how long until the next allowed attempt.
        let mut retry = None;
        // Boxed: resolution nests many futures (cache, single-flight, providers); keeping them
        // behind one allocation bounds the publish future's size and its type depth (rustc's
        // layout query overflows otherwise).
        let resolved = Box::pin(self.resolve(req, &mut retry)).await;
        let refresh = resolved
            .as_ref()
            .map_or(Refresh::Every(DEFAULT_REFRESH), |r| r.2);
        let attempt = match resolved {
            // One trip to the blocking pool on the hot path: mount a fresh volume, or swap the
            // content of a mounted one.
            Ok((ctx, files, _)) => {
                let written = self
                    .blocking(&req.target, Some(&ctx), move |v, t| {
                        Ok(if v.is_published(t)? {
                            Written::Updated(v.update(t, &files, group))
                        } else {
                            Written::Mounted(v.publish(t, &files, group))
                        })
                    })
                    .await?;
                let volume_error = |source| PublishError::Volume {
                    ctx: Some(ctx.boxed()),
                    target: req.target.clone(),
                    source,
                };
                match written {
                    Written::Mounted(r) => {
                        mounted_here.store(r.is_ok(), Ordering::SeqCst);
                        Attempt::Mount(r.map_err(volume_error))
                    }
                    Written::Updated(r) => Attempt::Refresh(r.map_err(volume_error)),
                }
            }
            // Whether the volume is already there decides what a failure means.
            Err(e) => {
                if self
                    .blocking(&req.target, None, |v, t| v.is_published(t))
                    .await?
                {
                    Attempt::Refresh(Err(e))
                } else {
                    Attempt::Mount(Err(e))
                }
            }
        };
        match attempt {
            Attempt::Mount(mounted) => {
                if let Err(e) = &mounted {
                    self.events.warn(&req.pod, MOUNT_FAILED, &e.to_string());
                }
                mounted?;
                self.schedule.refreshed(&req.target, refresh, now);
                Ok(Outcome::Mounted)
            }
            Attempt::Refresh(Ok(changed)) => {
                self.schedule.refreshed(&req.target, refresh, now);
                Ok(Outcome::Refreshed { changed })
            }
            Attempt::Refresh(Err(error)) => {
                self.schedule.failed(&req.target, refresh, now, retry);
                warn!(%error, "refresh failed; keeping the previous content");
                let message = format!("{error} (the volume keeps its previous content)");
                self.events.warn(&req.pod, REFRESH_FAILED, &message);
                Ok(Outcome::RefreshFailed)
            }
        }
    }

    /// Unmounts and removes the target; succeeds when it is already gone. Returns whether a
    /// published volume was removed.
    pub async fn unpublish(&self, target: &Path) -> Result<bool, PublishError> {
        let _lock = self.locks.lock(target).await;
        let published =
            self.blocking(target, None, |v, t| v.unpublish(t)).await? == Unpublished::Removed;
        self.schedule.remove(target);
        if published {
            info!(target_path = %target.display(), "volume unmounted");
        }
        Ok(published)
    }

    /// Identity -> binding -> fetch -> files. No side effects.
    /// Sets `retry` to the wait until the next allowed backend attempt when the (store, identity)
    /// is backing off.
    async fn resolve(
        &self,
        req: &PublishRequest,
        retry: &mut Option<Duration>,
    ) -> Result<(Context, Vec<VolumeFile>, Refresh), PublishError> {
        let binding = bind(&*self.catalog, &req.pod.namespace, &req.external_secret).await?;
        let refresh = Refresh::parse(binding.external_secret.spec.refresh_interval.as_deref())
            .map_err(|reason| BindingError::InvalidExternalSecret {
                namespace: binding.namespace.clone(),
                name: req.external_secret.clone(),
                reason: Invalid(reason),
            })?;
        tracing::Span::current().record(
            "store",
            format!("{}/{}", binding.store_kind, binding.store_name),
        );
        let ctx = Context {
            namespace: binding.namespace.clone(),
            external_secret: req.external_secret.clone(),
            store_kind: binding.store_kind,
            store_name: binding.store_name.clone(),
        };
        let provider_err = |key: Option<RemoteKey>, source| PublishError::Provider {
            ctx: ctx.boxed(),
            key,
            source,
        };
        // `bind` validated the provider block, so this cannot fail; map it anyway rather than panic.
        let spec =
            crate::api::validate::provider(&binding.provider, binding.store_kind).map_err(|e| {
                PublishError::Internal(format!("{ctx}: store re-validation failed: {e}"))
            })?;
        // Built on the first cache miss only: a warm publish never constructs a client.
        let provider: OnceCell<Arc<dyn Provider>> = OnceCell::new();
        let provider = || async {
            provider
                .get_or_try_init(|| {
                    let ctx = providers::BuildContext {
                        env: &self.providers,
                        pod: &req.pod,
                        store_kind: binding.store_kind,
                    };
                    async move { providers::build(spec, &ctx).await }
                })
                .await
                .cloned()
        };
        let store = store_identity(&binding);
        // Pods of one service account share a fetch; two identities never share a value.
        let identity = format!("{}/{}", req.pod.namespace, req.pod.service_account);
        let spec = &binding.external_secret.spec;
        let plan = resolve::plan(&ctx, spec)?;
        // A backend that keeps failing is left alone until its backoff delay has passed.
        let started = Instant::now();
        if let Some(off) = self.backoff.check(&store, &identity, started) {
            let wait = off.next.saturating_duration_since(started);
            *retry = Some(wait);
            return Err(provider_err(
                None,
                ProviderError::Unavailable(format!(
                    "backing off after {} failed attempt(s) as service account {identity}; \
                     next attempt in {:.1}s",
                    off.failures,
                    wait.as_secs_f64()
                )),
            ));
        }
        // Everything fetched for one publish shares one byte budget, checked as values arrive.
        let budget = FetchBudget::new(self.fetch_budget());
        let over_budget = |what: &str| {
            PublishError::Resolve(ResolveError::Bound {
                ctx: ctx.boxed(),
                reason: format!(
                    "{what} takes the values fetched for this volume beyond {} bytes (4x \
                     --volume-size-limit)",
                    budget.limit
                ),
            })
        };
        let fetched = async {
            let values = futures::future::try_join_all(plan.keys.into_iter().map(|key| {
                let cache_key = CacheKey {
                    store: store.clone(),
                    identity: identity.clone(),
                    key: key.clone(),
                };
                async {
                    let fetch = || async { provider().await?.get(&key).await };
                    let value = self
                        .cache
                        .get_or_fetch(cache_key, refresh.max_age(), fetch)
                        .await
                        .map_err(|e| provider_err(Some(key.clone()), e))?;
                    if !budget.take(value.len()) {
                        return Err(over_budget(&key.to_string()));
                    }
                    Ok::<_, PublishError>((key, value))
                }
            }))
            .await?;
            let mut fetched: Fetched = values.into_iter().collect();
            // Identical searches are run once and their result shared.
            let mut done: Vec<(&providers::FindQuery, usize)> = Vec::new();
            for (index, query) in &plan.finds {
                if let Some((_, first)) = done.iter().find(|(q, _)| q.same_as(query)) {
                    fetched.share_found(*first, *index);
                    continue;
                }
                let found = provider()
                    .await
                    .map_err(|e| provider_err(None, e))?
                    .find(query)
                    .await
                    .map_err(|e| provider_err(None, e))?;
                let bytes = found.iter().map(|(n, v)| n.len() + v.len()).sum();
                if !budget.take(bytes) {
                    return Err(over_budget(&format!("spec.dataFrom[{index}].find")));
                }
                fetched.insert_found(*index, found);
                done.push((query, *index));
            }
            Ok::<_, PublishError>(fetched)
        }
        .await;
        match &fetched {
            Ok(_) => self.backoff.succeeded(&store, &identity),
            Err(PublishError::Provider { source, .. }) if backoff::is_transient(source) => {
                *retry = Some(self.backoff.failed(&store, &identity, Instant::now()));
            }
            Err(_) => {}
        }
        let fetched = fetched?;
        let pod = resolve::TemplatePod {
            namespace: req.pod.namespace.clone(),
            name: req.pod.name.clone(),
            service_account: req.pod.service_account.clone(),
        };
        let files = self
            .render(&ctx, Arc::clone(&binding.external_secret), fetched, pod)
            .await?;
        Ok((ctx, files, refresh))
    }

    /// The fetched values -> files, on the compute pool (off the async workers, with a time
    /// limit) unless the work is trivially small.
    async fn render(
        &self,
        ctx: &Context,
        es: Arc<crate::api::ExternalSecret>,
        fetched: Fetched,
        pod: resolve::TemplatePod,
    ) -> Result<Vec<VolumeFile>, PublishError> {
        let light = resolve::is_light(&es.spec, &fetched);
        let work = move |ctx: &Context| {
            let spec = &es.spec;
            let entries = resolve::entries(ctx, spec, &fetched, Some(&pod))?;
            Ok::<_, PublishError>(resolve::files(ctx, spec.target.as_ref(), entries)?)
        };
        if light {
            // A few small values copied into files: the pool hop would cost more than the work.
            return work(ctx);
        }
        let owned = ctx.clone();
        let started = Instant::now();
        let result = self
            .compute
            .run(&ctx.namespace, move || work(&owned))
            .await
            .map_err(|e| PublishError::Compute {
                ctx: ctx.boxed(),
                source: e,
            })?;
        // A bound hit because the deadline passed is reported as the timeout it is.
        match result {
            Err(PublishError::Resolve(ResolveError::Deadline { .. }))
            | Err(PublishError::Resolve(ResolveError::Template { .. }))
                if started.elapsed() >= self.compute.timeout() =>
            {
                Err(PublishError::Compute {
                    ctx: ctx.boxed(),
                    source: ComputeError::TimedOut(self.compute.timeout()),
                })
            }
            other => other,
        }
    }

    /// The byte budget of one publish's fetched values: 4x the volume size limit.
    fn fetch_budget(&self) -> u64 {
        self.volumes.config().size_limit.saturating_mul(4)
    }

    /// Runs a blocking volume operation off the async runtime.
    async fn blocking<T: Send + 'static>(
        &self,
        target: &Path,
        ctx: Option<&Context>,
        op: impl FnOnce(&Volumes, &Path) -> Result<T, VolumeError> + Send + 'static,
    ) -> Result<T, PublishError> {
        let volumes = Arc::clone(&self.volumes);
        let path = target.to_path_buf();
        tokio::task::spawn_blocking(move || op(&volumes, &path))
            .await
            .map_err(|e| PublishError::Internal(format!("volume worker failed: {e}")))?
            .map_err(|source| PublishError::Volume {
                ctx: ctx.map(Context::boxed),
                target: target.to_path_buf(),
                source,
            })
    }
}

/// Names a store for cache keys: kind, namespace and name, plus a hash of its provider block,
/// so an edited store never serves values fetched under its old settings.
fn store_identity(binding: &crate::catalog::Binding) -> String {
    use std::hash::Hasher;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    // Streamed into the hasher: a fake store's spec holds values, which must not be copied into
    // an ordinary (non-zeroizing) buffer on every publish. Writing to a hasher cannot fail.
    let _ = serde_json::to_writer(HashWriter(&mut hasher), &binding.provider);
    // A ClusterSecretStore belongs to no namespace; the pod's is in the auth identity instead.
    let namespace = match binding.store_kind {
        crate::api::StoreKind::SecretStore => binding.namespace.as_str(),
        crate::api::StoreKind::ClusterSecretStore => "",
    };
    format!(
        "{}/{namespace}/{}#{:016x}",
        binding.store_kind,
        binding.store_name,
        hasher.finish()
    )
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

    use crate::api::store::{FakeEntry, FakeProvider, StoreProvider};
    use crate::api::{ExternalSecret, StoreKind};
    use crate::catalog::Binding;

    fn binding(kind: StoreKind, value: &str) -> Binding {
        let es: ExternalSecret =
            serde_json::from_str(r#"{"apiVersion":"latchkey.dev/v1alpha1","kind":"ExternalSecret",
              "metadata":{"name":"es","namespace":"shop"},
              "spec":{"secretStoreRef":{"name":"s"},"data":[{"secretKey":"k","remoteRef":{"key":"k"}}]}}"#)
                .unwrap();
        Binding {
            namespace: "shop".into(),
            external_secret: Arc::new(es),
            store_kind: kind,
            store_name: "s".into(),
            provider: StoreProvider {
                fake: Some(FakeProvider {
                    data: vec![FakeEntry {
                        key: "k".into(),
                        value: value.into(),
                        version: None,
                    }],
                    latency: None,
                }),
                ..Default::default()
            },
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
}
