//! Publishing: what a NodePublishVolume or NodeUnpublishVolume call does, gRPC-free. [`Publisher`]
//! strings the steps together for one target: pod identity -> catalog binding -> fetch
//! ([`crate::fetch`]) -> resolve -> volume, and owns the orchestration around them: one operation
//! per target at a time (`locks`), when a mounted volume is next due ([`crate::fetch::schedule`]), leaving a
//! failing backend alone ([`crate::fetch::backoff`]), rendering on the compute pool, cleaning up after a panic,
//! and Events on the pod.
//!
//! Not for reading values (cache, providers and the fetch budget are [`crate::fetch`]'s, which
//! callers without a pod share), not for what values become (see [`crate::resolve`]) and not for
//! CSI types: the CSI edge parses requests into [`PublishRequest`] and maps [`PublishError`] to a
//! status code.

mod generated;
mod locks;
mod renewal;

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tracing::warn;

use crate::api::external_secret::GeneratorRef;
use crate::api::validate::Invalid;
use crate::cache::CacheLimits;
use crate::catalog::{BindingError, Catalog, bind, bind_generator};
use crate::compute::{ComputeError, Pool};
use crate::events::{MOUNT_FAILED, PodEvents, REFRESH_FAILED};
use crate::fetch::backoff::{Backoff, Gate};
use crate::fetch::schedule::{DEFAULT_REFRESH, Refresh, Schedule};
use crate::fetch::{FetchError, Fetcher};
use crate::generators::GeneratorError;
use crate::generators::states::StateError;
use crate::identity::PodInfo;
use crate::providers::{self, ProviderError, RemoteKey};
use crate::resolve::{self, Context, Fetched, ResolveError};
use crate::volume::{self, Published, Unpublished, VolumeError, VolumeFile, Volumes};
pub use generated::{ANNOTATION_TARGET, DEFAULT_GRACE_PERIOD, GeneratorConfig};
use generated::{Credential, Generated};

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

/// A successful publish: what it did and where the values came from, for the CSI edge's log
/// line and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// What was done.
    pub outcome: Outcome,
    /// `Kind/name` of the store the values were read from; `None` when nothing was resolved.
    pub store: Option<String>,
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
    /// A generator did not make a value.
    #[error("{ctx}, generator {generator}: {source}")]
    Generator {
        /// Objects involved.
        ctx: Box<Context>,
        /// `Kind "name"` of the generator.
        generator: String,
        /// Cause.
        source: GeneratorError,
    },
    /// A GeneratorState could not be recorded, so nothing was generated (or what was, was
    /// cleaned up again).
    #[error("{ctx}: {source}")]
    GeneratorState {
        /// Objects involved.
        ctx: Box<Context>,
        /// Cause.
        source: StateError,
    },
    /// A worker thread died (a bug).
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<FetchError> for PublishError {
    fn from(e: FetchError) -> Self {
        match e {
            FetchError::Provider { ctx, key, source } => Self::Provider { ctx, key, source },
            // `fetch_budget` derives the limit from the volume size, so the message names the flag.
            FetchError::OverBudget { ctx, what, limit } => Self::Resolve(ResolveError::Bound {
                ctx,
                reason: format!(
                    "{what} takes the values fetched for this volume beyond {limit} bytes (4x \
                     --volume-size-limit)"
                ),
            }),
            FetchError::Internal(message) => Self::Internal(message),
        }
    }
}

/// What a publish generated, so that it is kept when the publish succeeds and cleaned up when
/// it fails.
#[derive(Default)]
struct Generation {
    /// New credentials.
    made: Vec<Credential>,
    /// Every generator the ExternalSecret names, once it was read.
    named: Option<Vec<GeneratorRef>>,
    /// Credentials an earlier run of the agent made for this volume, replaced by this publish.
    orphans: Vec<Credential>,
}

/// A first mount or a refresh, and how it went.
enum Attempt {
    Mount(Result<(), PublishError>),
    Refresh(Result<bool, PublishError>),
}

/// Serves publish and unpublish for one node.
pub struct Publisher {
    catalog: Arc<dyn Catalog>,
    volumes: Volumes,
    events: Arc<dyn PodEvents>,
    locks: locks::TargetLocks,
    schedule: Schedule,
    backoff: Backoff,
    fetcher: Fetcher,
    compute: Pool,
    generated: Arc<Generated>,
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
        let generated = Arc::new(Generated::new(
            GeneratorConfig::default(),
            providers.clone(),
        ));
        Self {
            catalog,
            volumes,
            events,
            locks: locks::TargetLocks::default(),
            schedule: Schedule::default(),
            backoff: Backoff::default(),
            fetcher: Fetcher::new(providers, cache_limits),
            compute,
            generated,
        }
    }

    /// Records generated credentials as `config` says (default: in memory, no finalizer).
    pub fn with_generators(mut self, config: GeneratorConfig) -> Self {
        self.generated = Arc::new(Generated::new(config, self.fetcher.env().clone()));
        self
    }

    /// The catalog, for readiness checks.
    pub fn catalog(&self) -> &dyn Catalog {
        &*self.catalog
    }

    /// Mounts and fills the volume, or refreshes it when it is already mounted. A failed refresh
    /// keeps the previous content and succeeds (kubelet unmounts a volume whose republish fails).
    pub async fn publish(&self, req: &PublishRequest) -> Result<Report, PublishError> {
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
                    let unmounted = volume::unpublish(&self.volumes, &req.target).await;
                    self.schedule.remove(&req.target);
                    if let Err(source) = unmounted {
                        let error = volume_error(None, &req.target, source);
                        tracing::error!(target_path = %req.target.display(), %error,
                            "cannot unmount after a failed publish");
                    }
                }
                Err(PublishError::Internal(
                    "the publish failed unexpectedly (a bug in Latchkey); nothing was left mounted"
                        .into(),
                ))
            }
        }
    }

    /// [`Self::publish`] with the target's lock held, in its order: due? -> resolve -> volume
    /// -> schedule and Events. Sets `mounted_here` once it has mounted a fresh volume.
    async fn publish_locked(
        &self,
        req: &PublishRequest,
        mounted_here: &AtomicBool,
    ) -> Result<Report, PublishError> {
        let now = Instant::now();
        // Generated credentials are renewed when due, whatever the refresh schedule says; one
        // that cannot be renewed any more is replaced by this publish.
        self.generated.remember(req);
        if self.generated.due(&req.target, now) {
            self.generated.renew_due(&req.target, &req.pod, now).await;
        }
        let orphans = self.generated.take_orphans(&req.target, &req.pod);
        let replace = orphans.is_some() || self.generated.must_replace(&req.target, Instant::now());
        // kubelet republishes every volume periodically: answer at once until a refresh is due.
        if !replace && self.schedule.is_fresh(&req.target, now) {
            return Ok(Report {
                outcome: Outcome::NotDue,
                store: None,
            });
        }
        // Set when the backend is backing off: how long until the next allowed attempt.
        let mut retry = None;
        let mut generation = Generation {
            orphans: orphans.unwrap_or_default(),
            ..Generation::default()
        };
        // Boxed: resolution nests many futures (cache, single-flight, providers); keeping them
        // behind one allocation bounds the publish future's size and its type depth (rustc's
        // layout query overflows otherwise).
        let resolved = Box::pin(self.resolve(req, &mut retry, &mut generation)).await;
        let attempt = self.write(req, resolved, mounted_here).await;
        // Credentials generated by this publish are kept only if it succeeded.
        let succeeded = matches!(
            attempt,
            Ok((Attempt::Mount(Ok(())) | Attempt::Refresh(Ok(_)), _, _))
        );
        match (&generation.named, succeeded) {
            (Some(named), true) => {
                self.generated
                    .commit(req, generation.made, named, generation.orphans);
            }
            _ => {
                self.generated.discard(generation.made, &req.pod);
                self.generated.keep_orphans(&req.target, generation.orphans);
                if replace {
                    self.generated.postpone(&req.target);
                }
            }
        }
        let (attempt, refresh, store) = attempt?;
        self.report(req, attempt, refresh, store, retry, now)
    }

    /// Writes the resolved files into the volume (or learns whether one is there when there
    /// is nothing to write).
    async fn write(
        &self,
        req: &PublishRequest,
        resolved: Result<(Context, Vec<VolumeFile>, Refresh), PublishError>,
        mounted_here: &AtomicBool,
    ) -> Result<(Attempt, Refresh, Option<String>), PublishError> {
        let refresh = resolved
            .as_ref()
            .map_or(Refresh::Every(DEFAULT_REFRESH), |r| r.2);
        let store = resolved
            .as_ref()
            .ok()
            .filter(|(ctx, _, _)| !ctx.store_name.is_empty())
            .map(|(ctx, _, _)| format!("{}/{}", ctx.store_kind, ctx.store_name));
        let attempt = match resolved {
            // One volume call on the hot path: it mounts a fresh volume or swaps the content of
            // a mounted one, and says which it did.
            Ok((ctx, files, _)) => {
                let failed = |source| volume_error(Some(&ctx), &req.target, source);
                let written = volume::publish(
                    &self.volumes,
                    &req.pod.namespace,
                    &req.target,
                    files,
                    req.group,
                )
                .await
                .map_err(failed)?;
                match written {
                    Published::Mounted(r) => {
                        mounted_here.store(r.is_ok(), Ordering::SeqCst);
                        Attempt::Mount(r.map_err(failed))
                    }
                    Published::Updated(r) => Attempt::Refresh(r.map_err(failed)),
                }
            }
            // Whether the volume is already there decides what a failure means.
            Err(e) => {
                let published = volume::is_published(&self.volumes, &req.target).await;
                if published.map_err(|source| volume_error(None, &req.target, source))? {
                    Attempt::Refresh(Err(e))
                } else {
                    Attempt::Mount(Err(e))
                }
            }
        };
        Ok((attempt, refresh, store))
    }

    /// The outcome of a publish: schedule, Events and the report.
    fn report(
        &self,
        req: &PublishRequest,
        attempt: Attempt,
        refresh: Refresh,
        store: Option<String>,
        retry: Option<Duration>,
        now: Instant,
    ) -> Result<Report, PublishError> {
        match attempt {
            Attempt::Mount(mounted) => {
                if let Err(e) = &mounted {
                    self.events.warn(&req.pod, MOUNT_FAILED, &e.to_string());
                }
                mounted?;
                self.schedule.refreshed(&req.target, refresh, now);
                Ok(Report {
                    outcome: Outcome::Mounted,
                    store,
                })
            }
            Attempt::Refresh(Ok(changed)) => {
                self.schedule.refreshed(&req.target, refresh, now);
                Ok(Report {
                    outcome: Outcome::Refreshed { changed },
                    store,
                })
            }
            Attempt::Refresh(Err(error)) => {
                self.schedule.failed(&req.target, refresh, now, retry);
                warn!(target_path = %req.target.display(), %error,
                    "refresh failed; keeping the previous content");
                let message = format!("{error} (the volume keeps its previous content)");
                self.events.warn(&req.pod, REFRESH_FAILED, &message);
                Ok(Report {
                    outcome: Outcome::RefreshFailed,
                    store,
                })
            }
        }
    }

    /// Bytes the volumes of each namespace hold (sorted by namespace), and all together.
    pub fn volume_usage(&self) -> (Vec<(String, u64)>, u64) {
        self.volumes.usage()
    }

    /// Volumes this process knows to be published (see [`Schedule::count`]).
    pub fn volumes(&self) -> usize {
        self.schedule.count()
    }

    /// Unmounts and removes the target; succeeds when it is already gone. Returns whether a
    /// published volume was removed.
    pub async fn unpublish(&self, target: &Path) -> Result<bool, PublishError> {
        let _lock = self.locks.lock(target).await;
        let unpublished = volume::unpublish(&self.volumes, target).await;
        let published = unpublished.map_err(|source| volume_error(None, target, source))?
            == Unpublished::Removed;
        self.schedule.remove(target);
        // Cleanup runs in the background: it never holds up the unmount.
        self.generated.forget(target);
        Ok(published)
    }

    /// The files for `req`: binding (catalog) -> plan (resolve) -> fetch -> render (resolve, on
    /// the compute pool). Each is a call down that returns here; none calls back into publish.
    /// No side effects beyond the backoff state. Sets `retry` to the wait until the next allowed backend attempt when the (store, identity)
    /// is backing off.
    async fn resolve(
        &self,
        req: &PublishRequest,
        retry: &mut Option<Duration>,
        generation: &mut Generation,
    ) -> Result<(Context, Vec<VolumeFile>, Refresh), PublishError> {
        let binding = bind(&*self.catalog, &req.pod.namespace, &req.external_secret).await?;
        let refresh = Refresh::parse(binding.external_secret.spec.refresh_interval.as_deref())
            .map_err(|reason| BindingError::InvalidExternalSecret {
                namespace: binding.namespace.clone(),
                name: req.external_secret.clone(),
                reason: Invalid(reason),
            })?;
        let ctx = Context {
            namespace: binding.namespace.clone(),
            external_secret: req.external_secret.clone(),
            store_kind: binding.store_kind(),
            store_name: binding.store_name.clone(),
        };
        let source = self.fetcher.source(&ctx, &binding, &req.pod)?;
        let plan = resolve::plan(&ctx, &binding.external_secret.spec)?;
        // A backend that keeps failing is left alone until its backoff delay has passed; what
        // is still cached is served meanwhile.
        let gate = Gate::new(&self.backoff, source.store(), source.identity());
        let fetched = self
            .fetcher
            .fetch(&source, plan, refresh.max_age(), self.fetch_budget(), &gate)
            .await;
        *retry = gate.record(&fetched);
        let mut fetched = fetched?;
        // Generated last: a store that fails costs no credential.
        let named = resolve::generator_refs(&binding.external_secret.spec);
        for reference in &named {
            let values = match self.generated.current(&req.target, reference) {
                Some(values) => values,
                None => {
                    let object = bind_generator(
                        &*self.catalog,
                        &req.pod.namespace,
                        &req.external_secret,
                        reference,
                    )
                    .await?;
                    let made = self
                        .generated
                        .generate(req, &ctx, reference, object)
                        .await?;
                    let values = made.values();
                    generation.made.push(made);
                    values
                }
            };
            fetched.insert_generated(reference.clone(), values);
        }
        generation.named = Some(named);
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
        self.compute
            .run_fallible(&ctx.namespace, move || work(&owned))
            .await
            .map_err(|source| PublishError::Compute {
                ctx: ctx.boxed(),
                source,
            })?
    }

    /// The byte budget of one publish's fetched values: 4x the volume size limit.
    fn fetch_budget(&self) -> u64 {
        self.volumes.config().size_limit.saturating_mul(4)
    }
}

/// A volume operation's failure at `target`, with the objects involved when publishing.
fn volume_error(ctx: Option<&Context>, target: &Path, source: VolumeError) -> PublishError {
    PublishError::Volume {
        ctx: ctx.map(Context::boxed),
        target: target.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::PublishError;
    use crate::api::StoreKind;
    use crate::fetch::FetchError;
    use crate::resolve::{Context, ResolveError};

    #[test]
    fn an_exceeded_fetch_budget_is_a_bound_that_names_the_volume_size_flag() {
        let ctx = Context {
            namespace: "shop".into(),
            external_secret: "es".into(),
            store_kind: StoreKind::SecretStore,
            store_name: "s".into(),
        };
        let e = PublishError::from(FetchError::OverBudget {
            ctx: ctx.boxed(),
            what: "spec.dataFrom[0].find".into(),
            limit: 64,
        });
        assert!(
            matches!(e, PublishError::Resolve(ResolveError::Bound { .. })),
            "{e:?}"
        );
        let message = e.to_string();
        assert!(
            message.ends_with(
                "spec.dataFrom[0].find takes the values fetched for this volume beyond 64 bytes \
                 (4x --volume-size-limit)"
            ),
            "{message}"
        );
    }
}
