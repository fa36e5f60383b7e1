//! The controller's half of generator cleanup (issue #40, ESO design 011): GeneratorStates being
//! deleted (a deleted pod's, through Kubernetes' garbage collector; a namespace's; a state past
//! its `garbageCollectionDeadline`) are cleaned up here when the agent that made them cannot:
//! the node or agent is gone, or nobody unpublished.
//!
//! A state being deleted with the cleanup finalizer gets its credential cleaned up as the
//! service account in its own namespace that made it (a token minted under the mirror's opt-in
//! rules, never the controller's own identity: a tenant who edits a state can at most make
//! Latchkey clean up as that tenant), then the finalizer is released. Never wedge a deletion:
//! when cleanup keeps failing (the service account or its namespace is being deleted too, the
//! backend refuses), the finalizer is released anyway once `cleanup_timeout` has passed since
//! the deletion began, and the credential is counted as left to its TTL.
//!
//! States past their `garbageCollectionDeadline` are deleted (the finalizer path above then
//! cleans them up); each is requeued at its own deadline, nothing is polled.

mod cleanup;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, future};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::api::CLEANUP_FINALIZER;
use crate::api::generator::GeneratorState;
use crate::generators::states::LABEL_GENERATOR;
use crate::telemetry::Metrics;
use crate::telemetry::metrics::{GeneratorCleanupLabels, KindLabel};

pub use cleanup::{Cleaner, CleanupError, Generators, Identities, IdentityError};

/// Default of `--generator-cleanup-timeout`: how long cleanup of a state being deleted is
/// retried before its finalizer is released anyway.
pub const DEFAULT_CLEANUP_TIMEOUT: Duration = Duration::from_secs(300);
/// First wait before a failed cleanup is retried.
const RETRY_FLOOR: Duration = Duration::from_secs(1);
/// Longest wait between two cleanup attempts.
const RETRY_CEILING: Duration = Duration::from_secs(30);
/// Longest `garbageCollectionDeadline` read (an RFC 3339 time is about 30 bytes); a tenant
/// writes it.
const MAX_DEADLINE_LEN: usize = 64;
/// Reconciles run at once: each is a few API calls and at most one backend call.
const CONCURRENCY: u16 = 8;

/// What the collector needs.
pub struct Parts {
    /// The controller's API client (reads and writes GeneratorStates, never credentials).
    pub client: Client,
    /// Namespaces to serve; empty: all.
    pub namespaces: Vec<String>,
    /// Mints the tokens of the service account that made a credential.
    pub identities: Arc<dyn Identities>,
    /// Builds generators and runs their Cleanup.
    pub cleaner: Arc<dyn Cleaner>,
    /// Where cleanups are counted.
    pub metrics: Arc<Metrics>,
    /// Whether this replica may write now (checked before every write).
    pub leading: Arc<dyn Fn() -> bool + Send + Sync>,
    /// How long cleanup is retried, from the state's deletionTimestamp.
    pub cleanup_timeout: Duration,
}

/// Cleans up and collects GeneratorStates.
pub struct Collector {
    parts: Parts,
}

/// Why a reconcile did not finish; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    /// The API server refused or failed a write.
    #[error("GeneratorState {namespace}/{name}: {reason}")]
    Api {
        /// Namespace of the state.
        namespace: String,
        /// Name of the state.
        name: String,
        /// The API server's answer (its Status message, which holds no value).
        reason: String,
    },
}

/// What a state needs now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Being deleted with our finalizer: clean up, then release; `elapsed` since the deletion
    /// began.
    Cleanup {
        /// Time since `deletionTimestamp` (zero when the clocks disagree).
        elapsed: Duration,
    },
    /// Past its garbage-collection deadline: delete it.
    Collect,
    /// Its deadline is this far away.
    WaitFor(Duration),
    /// Nothing to do until it changes (the deadline, if any, is unreadable: `Some(why)`).
    Nothing(Option<String>),
}

/// What `state` needs at `now`.
pub(crate) fn step(state: &GeneratorState, now: Timestamp) -> Step {
    if let Some(deleted) = &state.metadata.deletion_timestamp {
        if !state.finalizers().iter().any(|f| f == CLEANUP_FINALIZER) {
            return Step::Nothing(None);
        }
        let elapsed = now.duration_since(deleted.0);
        return Step::Cleanup {
            elapsed: Duration::try_from(elapsed).unwrap_or(Duration::ZERO),
        };
    }
    let Some(deadline) = &state.spec.garbage_collection_deadline else {
        return Step::Nothing(None);
    };
    match parse_deadline(deadline) {
        Ok(at) => match Duration::try_from(at.duration_since(now)) {
            Ok(left) if !left.is_zero() => Step::WaitFor(left),
            _ => Step::Collect,
        },
        Err(why) => Step::Nothing(Some(why)),
    }
}

/// An RFC 3339 `garbageCollectionDeadline`.
fn parse_deadline(text: &str) -> Result<Timestamp, String> {
    if text.len() > MAX_DEADLINE_LEN {
        return Err(format!(
            "garbageCollectionDeadline is longer than {MAX_DEADLINE_LEN} bytes"
        ));
    }
    text.parse::<Timestamp>().map_err(|_| {
        format!(
            "garbageCollectionDeadline {:?} is not an RFC 3339 time",
            crate::telemetry::escape::printable(text, MAX_DEADLINE_LEN)
        )
    })
}

/// When to try a failed cleanup again: half the time spent so far (so attempts thin out
/// geometrically without remembering them), within the floor and ceiling, and never past the
/// moment the finalizer is released anyway.
pub(crate) fn retry_after(elapsed: Duration, timeout: Duration) -> Duration {
    let left = timeout.saturating_sub(elapsed);
    (elapsed / 2)
        .clamp(RETRY_FLOOR, RETRY_CEILING)
        .min(left)
        .max(Duration::from_millis(100))
}

/// The `kind` label of a state: one of the generator kinds, or `unknown` (the resource is
/// tenant-written, and a label must stay a small closed set).
pub(crate) fn kind_label(state: &GeneratorState) -> &'static str {
    let kind = state.spec.resource.get("kind").and_then(|k| k.as_str());
    let kind = match kind {
        Some("ClusterGenerator") => state
            .spec
            .resource
            .pointer("/spec/kind")
            .and_then(|k| k.as_str()),
        other => other,
    };
    kind.and_then(crate::api::generator::GeneratorKind::parse)
        .map_or("unknown", |k| k.as_str())
}

impl Collector {
    /// A collector over `parts`.
    pub fn new(parts: Parts) -> Self {
        Self { parts }
    }

    /// Runs until `stop` completes: one controller per served namespace (or one over all).
    pub async fn run(
        self: Arc<Self>,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let stop = futures::FutureExt::shared(Box::pin(stop));
        let apis: Vec<Api<GeneratorState>> = if self.parts.namespaces.is_empty() {
            vec![Api::all(self.parts.client.clone())]
        } else {
            self.parts
                .namespaces
                .iter()
                .map(|ns| Api::namespaced(self.parts.client.clone(), ns))
                .collect()
        };
        let runs = apis.into_iter().map(|api| {
            Controller::new(api, watcher::Config::default())
                .with_config(ControllerConfig::default().concurrency(CONCURRENCY))
                .graceful_shutdown_on(stop.clone())
                .run(
                    |state, me: Arc<Self>| async move { me.reconcile(&state).await },
                    |_, error: &GcError, _| {
                        debug!(%error, "generator state reconcile failed; retrying");
                        Action::requeue(RETRY_FLOOR * 5)
                    },
                    Arc::clone(&self),
                )
                .for_each(|result| {
                    if let Err(error) = result {
                        debug!(%error, "generator state reconcile not run");
                    }
                    future::ready(())
                })
        });
        future::join_all(runs).await;
    }

    /// Does what `state` needs now; returns when to look at it again.
    pub async fn reconcile(&self, state: &GeneratorState) -> Result<Action, GcError> {
        match step(state, Timestamp::now()) {
            Step::Nothing(None) => Ok(Action::await_change()),
            Step::Nothing(Some(why)) => {
                debug!(
                    namespace = %state.namespace().unwrap_or_default(), state = %state.name_any(),
                    %why, "generator state not collected"
                );
                Ok(Action::await_change())
            }
            Step::WaitFor(left) => Ok(Action::requeue(left)),
            Step::Collect => self.collect(state).await,
            Step::Cleanup { elapsed } => self.clean(state, elapsed).await,
        }
    }

    /// Deletes a state past its deadline, only as it was read: a state whose deadline was
    /// moved or that was re-created meanwhile is left alone (the watch brings it back).
    async fn collect(&self, state: &GeneratorState) -> Result<Action, GcError> {
        if !(self.parts.leading)() {
            return Ok(Action::requeue(RETRY_FLOOR));
        }
        let (namespace, name) = (state.namespace().unwrap_or_default(), state.name_any());
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: state.uid(),
                resource_version: state.resource_version(),
            }),
            ..DeleteParams::default()
        };
        let api: Api<GeneratorState> = Api::namespaced(self.parts.client.clone(), &namespace);
        match api.delete(&name, &params).await {
            Ok(_) => {
                self.parts.metrics.generator_states_collected.inc();
                info!(%namespace, state = %name, "generator state past its garbage-collection deadline deleted");
                Ok(Action::await_change())
            }
            Err(e) if status_code(&e) == Some(404) => Ok(Action::await_change()),
            Err(e) if status_code(&e) == Some(409) => Ok(Action::requeue(RETRY_FLOOR)),
            Err(e) => Err(api_error(&namespace, &name, &e)),
        }
    }

    /// Cleans up the credential of a state being deleted, then releases its finalizer; past
    /// the timeout, releases it anyway.
    async fn clean(&self, state: &GeneratorState, elapsed: Duration) -> Result<Action, GcError> {
        // Another replica leads: it cleans up, and one backend call per credential is enough.
        if !(self.parts.leading)() {
            return Ok(Action::requeue(RETRY_FLOOR));
        }
        let (namespace, name) = (state.namespace().unwrap_or_default(), state.name_any());
        let kind = kind_label(state);
        let outcome = match &state.spec.state {
            // Only the intent was recorded: Generate never answered, nothing was made.
            None => Ok("no_state"),
            Some(recorded) => cleanup::clean(
                state,
                recorded,
                self.parts.identities.as_ref(),
                self.parts.cleaner.as_ref(),
            )
            .await
            .map(|()| "cleaned"),
        };
        let result = match outcome {
            Ok(result) => result,
            Err(e) if !e.is_permanent() && elapsed < self.parts.cleanup_timeout => {
                debug!(%namespace, state = %name, error = %e, "generator cleanup failed; retrying");
                self.count(kind, "retried");
                return Ok(Action::requeue(retry_after(
                    elapsed,
                    self.parts.cleanup_timeout,
                )));
            }
            Err(e) => {
                let generator = state.labels().get(LABEL_GENERATOR).cloned();
                let why = if e.is_permanent() {
                    "it cannot be cleaned up".to_string()
                } else {
                    format!(
                        "cleanup kept failing for {}",
                        humantime::format_duration(self.parts.cleanup_timeout)
                    )
                };
                warn!(
                    %namespace, state = %name, generator = generator.as_deref().unwrap_or(kind),
                    error = %e,
                    "generator credential left to its TTL: {why}; releasing the finalizer so the \
                     deletion is not blocked"
                );
                "left_to_ttl"
            }
        };
        if !(self.parts.leading)() {
            return Ok(Action::requeue(RETRY_FLOOR));
        }
        match self.release(state).await? {
            Released::Done => {
                self.count(kind, result);
                if result == "left_to_ttl" {
                    self.parts
                        .metrics
                        .generator_left_to_ttl
                        .get_or_create(&KindLabel { kind })
                        .inc();
                }
                Ok(Action::await_change())
            }
            // The state changed since it was read (its recorded state may be new): look again.
            Released::Changed => Ok(Action::requeue(Duration::from_millis(100))),
        }
    }

    fn count(&self, kind: &'static str, result: &'static str) {
        self.parts
            .metrics
            .generator_cleanups
            .get_or_create(&GeneratorCleanupLabels { kind, result })
            .inc();
    }

    /// Drops the cleanup finalizer from `state` as it was read (guarded by its
    /// resourceVersion: a state edited since, or a finalizer added since, is read again).
    async fn release(&self, state: &GeneratorState) -> Result<Released, GcError> {
        let (namespace, name) = (state.namespace().unwrap_or_default(), state.name_any());
        let kept: Vec<&String> = state
            .finalizers()
            .iter()
            .filter(|f| *f != CLEANUP_FINALIZER)
            .collect();
        let patch = json!({"metadata": {
            "finalizers": kept,
            "resourceVersion": state.resource_version(),
        }});
        let api: Api<GeneratorState> = Api::namespaced(self.parts.client.clone(), &namespace);
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(Released::Done),
            Err(e) if status_code(&e) == Some(404) => Ok(Released::Done),
            Err(e) if status_code(&e) == Some(409) => Ok(Released::Changed),
            Err(e) => Err(api_error(&namespace, &name, &e)),
        }
    }
}

/// How a finalizer release ended.
enum Released {
    /// Released, or the state is gone.
    Done,
    /// The state changed since it was read.
    Changed,
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

fn api_error(namespace: &str, name: &str, e: &kube::Error) -> GcError {
    let reason = match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => other.to_string(),
    };
    GcError::Api {
        namespace: namespace.into(),
        name: name.into(),
        reason,
    }
}
