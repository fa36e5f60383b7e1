//! Credentials generated for mounted volumes: one per (volume, generator), never shared and never
//! cached. [`Generated`] makes them (intent recorded first, state right after), keeps them while
//! the volume is mounted, renews their leases before 2/3 of the TTL, replaces one that cannot be
//! renewed any more (keeping the old one for the grace period), and cleans them up when the
//! volume goes, off the unmount's path.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::warn;

mod cleanup;
mod record;

use super::{PublishError, PublishRequest};
use crate::api::StoreKind;
use crate::api::external_secret::GeneratorRef;
use crate::api::generator::GeneratorObject;
use crate::generators::states::{MemoryStates, StateStore};
use crate::generators::{self, GeneratorError, GeneratorSpec, Lease};
use crate::identity::PodInfo;
use crate::providers::{self, BuildContext};
use crate::resolve::Context;
use crate::secret::SecretBytes;
use crate::telemetry::metrics::KindLabel;

/// Annotation on a GeneratorState: the volume's target path (a label cannot hold it).
pub const ANNOTATION_TARGET: &str = "generators.latchkey.dev/target";

/// How long a credential that was replaced stays valid, by default (`--generator-grace-period`).
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(120);

/// How long cleanup of one credential is retried before it is left to its TTL (or handed to the
/// controller); the unmount never waits for it.
const CLEANUP_PATIENCE: Duration = Duration::from_secs(300);

/// A lease is renewed once this fraction of its TTL has passed.
const RENEW_AT: f64 = 2.0 / 3.0;

/// How often the publisher's tick runs (the node agent calls it once a second).
const TICK: Duration = Duration::from_secs(1);

/// A failed renewal is tried again this much later (or at the lease's end, if sooner).
const RENEW_RETRY: Duration = Duration::from_secs(5);

/// Where generated credentials are recorded and how they are handled.
#[derive(Clone)]
pub struct GeneratorConfig {
    /// Where GeneratorStates are recorded.
    pub states: Arc<dyn StateStore>,
    /// This node's name (a label on each state).
    pub node: String,
    /// How long a replaced credential stays valid before it is cleaned up.
    pub grace: Duration,
    /// Whether states carry the cleanup finalizer: only when the controller runs, which then
    /// cleans up after a pod whose node or agent is gone. Without it, a finalizer would hold
    /// the state (and its namespace's deletion) with nobody to release it.
    pub finalizer: bool,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        Self {
            states: Arc::new(MemoryStates::default()),
            node: String::new(),
            grace: DEFAULT_GRACE_PERIOD,
            finalizer: false,
        }
    }
}

/// One generated credential of a mounted volume.
#[derive(Clone)]
pub(super) struct Credential {
    reference: GeneratorRef,
    /// The generator as it was when the credential was made (renewal and cleanup use it).
    object: GeneratorObject,
    /// Its GeneratorState, when there is something to clean up.
    state: Option<Recorded>,
    /// The uid of the pod it was made for.
    pod_uid: String,
    /// Where its credential Secrets may be read: the generator's own scope when it came from
    /// the catalog, always namespaced when it was read back from a (tenant-writable) state.
    scope: StoreKind,
    values: Arc<BTreeMap<String, SecretBytes>>,
    renew_at: Option<Instant>,
    /// Renewal said it cannot be extended any more: the next publish makes a new one.
    replace: bool,
}

impl Credential {
    /// Whether its renewal (or replacement) is due.
    fn is_due(&self, now: Instant) -> bool {
        self.renew_at.is_some_and(|at| at <= now)
    }

    /// What was generated.
    pub(super) fn values(&self) -> Arc<BTreeMap<String, SecretBytes>> {
        Arc::clone(&self.values)
    }
}

/// A GeneratorState and what Cleanup needs.
#[derive(Clone, Debug)]
struct Recorded {
    namespace: String,
    name: String,
    state: serde_json::Value,
}

/// The generated credentials of one mounted volume.
struct Volume {
    /// The latest publish request (kubelet's republish brings fresh tokens).
    request: PublishRequest,
    live: Vec<Credential>,
    /// Replaced credentials, cleaned up once their grace period has passed.
    retiring: Vec<(Instant, Credential)>,
}

/// The generated credentials of every mounted volume on this node.
pub(super) struct Generated {
    config: GeneratorConfig,
    env: providers::Env,
    volumes: Mutex<HashMap<PathBuf, Volume>>,
    /// Credentials an earlier run of the agent made for volumes still mounted: replaced at the
    /// volume's next publish (their values are not known any more), then cleaned up.
    orphans: Mutex<HashMap<PathBuf, Vec<Credential>>>,
    /// Whether `orphans` has any entry: only after a restart, so publishes skip its lock.
    any_orphan: AtomicBool,
    /// Whether `volumes` has any entry: most nodes mount no generated volume, and their warm
    /// publishes then skip the lock.
    any: AtomicBool,
}

impl Generated {
    pub(super) fn new(config: GeneratorConfig, env: providers::Env) -> Self {
        Self {
            config,
            env,
            volumes: Mutex::new(HashMap::new()),
            orphans: Mutex::new(HashMap::new()),
            any_orphan: AtomicBool::new(false),
            any: AtomicBool::new(false),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<PathBuf, Volume>) -> T) -> T {
        // Every operation leaves a well-formed map, so a poisoned lock is still safe to use.
        let mut volumes = self.volumes.lock().unwrap_or_else(PoisonError::into_inner);
        let out = f(&mut volumes);
        self.any.store(!volumes.is_empty(), Ordering::Relaxed);
        out
    }

    /// Runs `f` on the earlier run's credentials, skipped (as `default`) while there are none.
    fn with_orphans<T>(
        &self,
        default: T,
        f: impl FnOnce(&mut HashMap<PathBuf, Vec<Credential>>) -> T,
    ) -> T {
        if !self.any_orphan.load(Ordering::Relaxed) {
            return default;
        }
        // Every operation leaves a well-formed map, so a poisoned lock is still safe to use.
        let mut orphans = self.orphans.lock().unwrap_or_else(PoisonError::into_inner);
        let out = f(&mut orphans);
        self.any_orphan
            .store(!orphans.is_empty(), Ordering::Relaxed);
        out
    }

    /// [`Self::with`] for a lookup about `target`, skipped (as `default`) while no volume has
    /// generated credentials.
    fn about<T>(&self, default: T, f: impl FnOnce(&mut HashMap<PathBuf, Volume>) -> T) -> T {
        if !self.any.load(Ordering::Relaxed) {
            return default;
        }
        self.with(f)
    }

    /// The values already made for `target` by `reference` (and not due for replacement).
    pub(super) fn current(
        &self,
        target: &Path,
        reference: &GeneratorRef,
    ) -> Option<Arc<BTreeMap<String, SecretBytes>>> {
        self.with(|volumes| {
            volumes.get(target).and_then(|v| {
                v.live
                    .iter()
                    .find(|c| c.reference == *reference && !c.replace)
                    .map(|c| Arc::clone(&c.values))
            })
        })
    }

    /// Whether `target` has generated credentials.
    pub(super) fn knows(&self, target: &Path) -> bool {
        self.about(false, |volumes| volumes.contains_key(target))
    }

    /// Whether `target` holds a credential whose renewal is due, or that must be replaced.
    pub(super) fn due(&self, target: &Path, now: Instant) -> bool {
        self.about(false, |volumes| {
            volumes
                .get(target)
                .is_some_and(|v| v.live.iter().any(|c| c.is_due(now)))
        })
    }

    /// Whether a credential of `target` must be replaced now.
    pub(super) fn must_replace(&self, target: &Path, now: Instant) -> bool {
        self.about(false, |volumes| {
            volumes
                .get(target)
                .is_some_and(|v| v.live.iter().any(|c| c.replace && c.is_due(now)))
        })
    }

    /// A publish that was to replace credentials of `target` failed: it is tried again a
    /// little later, not on every tick.
    pub(super) fn postpone(&self, target: &Path) {
        let later = Instant::now() + RENEW_RETRY;
        self.about((), |volumes| {
            if let Some(v) = volumes.get_mut(target) {
                for c in v.live.iter_mut().filter(|c| c.replace) {
                    c.renew_at = Some(later);
                }
            }
        });
    }

    /// Renews the leases of `target` that are due, as `pod`. One that cannot be extended any
    /// more is marked for replacement, which the publish under way then makes.
    pub(super) async fn renew_due(&self, target: &Path, pod: &PodInfo, now: Instant) {
        let due: Vec<Credential> = self.with(|volumes| {
            volumes.get(target).map_or_else(Vec::new, |v| {
                v.live
                    .iter()
                    .filter(|c| !c.replace && c.renew_at.is_some_and(|at| at <= now))
                    .cloned()
                    .collect()
            })
        });
        for c in due {
            let Some(recorded) = &c.state else { continue };
            let outcome = match self.build(&c.object, c.scope, pod).await {
                Ok(g) => g.renew(&recorded.state).await,
                Err(e) => Err(e),
            };
            let (renew_at, replace) = match outcome {
                Ok(Some(lease)) => (renew_time(Instant::now(), lease), false),
                // Replaced by the publish under way (or the next tick's).
                Ok(None) => (Some(Instant::now()), true),
                Err(e) => {
                    warn!(namespace = %recorded.namespace, state = %recorded.name,
                        generator = %c.reference, error = %e,
                        "cannot renew a generated credential; trying again shortly");
                    (Some(Instant::now() + RENEW_RETRY), false)
                }
            };
            self.with(|volumes| {
                if let Some(live) = volumes
                    .get_mut(target)
                    .and_then(|v| v.live.iter_mut().find(|l| l.reference == c.reference))
                {
                    live.renew_at = renew_at;
                    live.replace = replace;
                }
            });
        }
    }

    /// Makes a new credential for the volume of `req` with the generator `object`: records the
    /// intent, generates as the pod, records what Cleanup needs. Whatever fails after Generate
    /// cleans up at once.
    pub(super) async fn generate(
        &self,
        req: &PublishRequest,
        ctx: &Context,
        reference: &GeneratorRef,
        object: GeneratorObject,
    ) -> Result<Credential, PublishError> {
        let failed = |source| PublishError::Generator {
            ctx: ctx.boxed(),
            generator: reference.to_string(),
            source,
        };
        let scope = GeneratorSpec::scope(&object);
        let generator = self.build(&object, scope, &req.pod).await.map_err(failed)?;
        let stateless = GeneratorSpec::of(&object).is_some_and(|s| s.is_stateless());
        let intent = if stateless {
            None
        } else {
            let state = self.intent(req, ctx, reference, &object);
            let created = self.config.states.create(&state).await.map_err(|source| {
                PublishError::GeneratorState {
                    ctx: ctx.boxed(),
                    source,
                }
            })?;
            Some((
                created.metadata.namespace.unwrap_or_default(),
                created.metadata.name.unwrap_or_default(),
            ))
        };
        let made = match generator.generate().await {
            Ok(made) => made,
            Err(source) => {
                if let Some((namespace, name)) = &intent {
                    self.drop_state(namespace, name).await;
                }
                return Err(failed(source));
            }
        };
        let recorded = match (intent, made.state) {
            (Some((namespace, name)), Some(state)) => {
                if let Err(source) = self.config.states.record(&namespace, &name, &state).await {
                    // Not recorded means nobody could clean it up later: undo it now.
                    if let Err(e) = generator.cleanup(&state).await {
                        warn!(%namespace, state = %name, generator = %reference, error = %e,
                            "cannot clean up a credential whose state was not recorded; \
                             it ends with its TTL");
                    }
                    self.drop_state(&namespace, &name).await;
                    return Err(PublishError::GeneratorState {
                        ctx: ctx.boxed(),
                        source,
                    });
                }
                Some(Recorded {
                    namespace,
                    name,
                    state,
                })
            }
            (Some((namespace, name)), None) => {
                self.drop_state(&namespace, &name).await;
                None
            }
            (None, _) => None,
        };
        if recorded.is_some() {
            self.leases(&object).inc();
        }
        Ok(Credential {
            reference: reference.clone(),
            object,
            state: recorded,
            pod_uid: req.pod.uid.clone(),
            scope,
            values: Arc::new(made.values),
            renew_at: made.lease.and_then(|l| renew_time(Instant::now(), l)),
            replace: false,
        })
    }

    /// After a successful publish of `req`: `made` are the volume's new credentials; the ones
    /// they replace, those of generators the ExternalSecret no longer names, and `replaced`
    /// (an earlier run's), retire.
    pub(super) fn commit(
        &self,
        req: &PublishRequest,
        made: Vec<Credential>,
        named: &[GeneratorRef],
        replaced: Vec<Credential>,
    ) {
        if made.is_empty() && named.is_empty() && replaced.is_empty() && !self.knows(&req.target) {
            return;
        }
        let retire_at = Instant::now() + self.config.grace;
        self.with(|volumes| {
            let volume = volumes.entry(req.target.clone()).or_insert_with(|| Volume {
                request: req.clone(),
                live: Vec::new(),
                retiring: Vec::new(),
            });
            volume.request = req.clone();
            volume
                .retiring
                .extend(replaced.into_iter().map(|c| (retire_at, c)));
            for c in made {
                if let Some(i) = volume.live.iter().position(|l| l.reference == c.reference) {
                    let old = volume.live.swap_remove(i);
                    volume.retiring.push((retire_at, old));
                }
                volume.live.push(c);
            }
            let (kept, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut volume.live)
                .into_iter()
                .partition(|c| named.contains(&c.reference));
            volume.live = kept;
            volume
                .retiring
                .extend(gone.into_iter().map(|c| (retire_at, c)));
            if volume.live.is_empty() && volume.retiring.is_empty() {
                volumes.remove(&req.target);
            }
        });
    }

    /// Keeps the latest request of a volume with generated credentials (its tokens renew and
    /// clean up later).
    pub(super) fn remember(&self, req: &PublishRequest) {
        self.about((), |volumes| {
            if let Some(v) = volumes.get_mut(&req.target) {
                v.request = req.clone();
            }
        });
    }

    /// Cleans up credentials a failed publish made, in the background.
    pub(super) fn discard(self: &Arc<Self>, made: Vec<Credential>, pod: &PodInfo) {
        for c in made {
            self.spawn_cleanup(c, pod.clone());
        }
    }

    /// The volume at `target` is gone: cleans up all its credentials, in the background.
    pub(super) fn forget(self: &Arc<Self>, target: &Path) {
        if let Some(orphans) = self.with_orphans(None, |o| o.remove(target)) {
            // No pod token to clean them up with: hand them over, or leave them to their TTL.
            let this = Arc::clone(self);
            tokio::spawn(async move {
                for c in orphans {
                    if let Some(recorded) = &c.state {
                        this.give_up(&c, recorded, &"unmounted while the agent was restarting")
                            .await;
                    }
                }
            });
        }
        let Some(volume) = self.about(None, |volumes| volumes.remove(target)) else {
            return;
        };
        let pod = volume.request.pod;
        for c in volume
            .live
            .into_iter()
            .chain(volume.retiring.into_iter().map(|(_, c)| c))
        {
            self.spawn_cleanup(c, pod.clone());
        }
    }

    /// The requests of volumes with a renewal due, and cleanup of credentials whose grace
    /// period has passed; called about once a second.
    pub(super) fn tick(self: &Arc<Self>, now: Instant) -> Vec<PublishRequest> {
        let (due, expired) = self.with(|volumes| {
            let mut due = Vec::new();
            let mut expired = Vec::new();
            for v in volumes.values_mut() {
                if v.live.iter().any(|c| c.is_due(now)) {
                    due.push(v.request.clone());
                }
                let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut v.retiring)
                    .into_iter()
                    .partition(|(until, _)| *until <= now);
                v.retiring = kept;
                expired.extend(gone.into_iter().map(|(_, c)| (c, v.request.pod.clone())));
            }
            // A volume whose ExternalSecret no longer names a generator has nothing left here.
            volumes.retain(|_, v| !(v.live.is_empty() && v.retiring.is_empty()));
            (due, expired)
        });
        for (c, pod) in expired {
            self.spawn_cleanup(c, pod);
        }
        due
    }

    /// The generator of `object`, acting as `pod`.
    async fn build(
        &self,
        object: &GeneratorObject,
        scope: StoreKind,
        pod: &PodInfo,
    ) -> Result<Arc<dyn generators::Generator>, GeneratorError> {
        let spec = GeneratorSpec::of(object).ok_or_else(|| {
            GeneratorError::Invalid(format!(
                "{} sets no generator block for its kind",
                object.kind()
            ))
        })?;
        let ctx = BuildContext {
            env: &self.env,
            pod,
            scope: scope.into(),
            max_age: None,
        };
        generators::build(spec, &ctx).await
    }

    fn leases(&self, object: &GeneratorObject) -> prometheus_client::metrics::gauge::Gauge {
        let kind = GeneratorSpec::of(object).map_or(object.kind(), |s| s.kind());
        self.env
            .metrics
            .generator_leases
            .get_or_create(&KindLabel { kind })
            .clone()
    }
}

/// When a lease should be renewed: before 2/3 of its TTL, by one tick of the loop that looks
/// (so a short lease is not renewed at its very end), but not before 1/3 (`None` when it need
/// not be).
fn renew_time(now: Instant, lease: Lease) -> Option<Instant> {
    if lease.ttl.is_zero() {
        return None;
    }
    let at = lease
        .ttl
        .mul_f64(RENEW_AT)
        .saturating_sub(TICK)
        .max(lease.ttl / 3);
    Some(now + at)
}
