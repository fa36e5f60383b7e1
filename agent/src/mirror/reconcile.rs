//! One reconcile of one ExternalSecret: decide whether its values are due, read them through
//! the agent's own binding, fetch and resolution paths as its service account, and make the
//! Secret match with one server-side apply, or leave it untouched when nothing changed, the
//! Secret is not ours, or anything failed. The outcome goes to the status, an Event and metrics.
//!
//! Never deletes or empties a Secret on an error: only `deletionPolicy` Delete or Merge, when the
//! backend says the remote value does not exist, removes what this controller wrote. Which
//! Secrets it may write at all is [`ownership`]'s decision; the writes are in [`write`].

mod progress;
mod render;
mod write;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Client};
use tracing::{debug, info, warn};

use super::catalog::AtHand;
use super::consent;
use super::desired::{self, DesiredError};
use super::generated::{self, MirrorGenerators};
use super::leader::Leadership;
use super::ownership;
use super::status::{self, Outcome, Reason};
use super::tokens::TokenMinter;
use crate::api::ExternalSecret;
use crate::api::external_secret::{CreationPolicy, RefreshPolicy};
use crate::catalog::{Catalog, Lenient, bind};
use crate::compute::Pool;
use crate::events::{EventTarget, KubeEvents, NORMAL, WARNING};
use crate::fetch::backoff::{Backoff, Gate};
use crate::fetch::schedule::Refresh;
use crate::fetch::{FetchError, Fetcher};
use crate::identity::PodInfo;
use crate::providers::ProviderError;
use crate::resolve::{self, Context};
use crate::telemetry::Metrics;
use crate::telemetry::metrics::ResultLabel;

/// Shortest wait before retrying a failed ExternalSecret; doubled per failure in a row, up to its
/// refresh interval, so a broken one never costs more backend calls than a healthy one.
pub const RETRY_FLOOR: Duration = Duration::from_secs(5);
/// Largest share by which a periodic refresh is delayed, so ExternalSecrets created together do
/// not refresh in step.
const REFRESH_JITTER: f64 = 0.1;
/// How long a due refresh waits when the refresh share of the workers is taken.
const DEFER: Duration = Duration::from_secs(1);
/// Service account an ExternalSecret acts as when it names none (as in ESO's examples).
const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// A reconcile that could not even be attempted (the controller retries it with backoff).
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// The API server failed a request the controller itself needs.
    #[error("namespace \"{namespace}\", ExternalSecret \"{name}\": {reason}")]
    Api {
        /// Namespace.
        namespace: String,
        /// ExternalSecret.
        name: String,
        /// What failed (a Status message; no values).
        reason: String,
    },
}

/// What the controller remembers per ExternalSecret.
#[derive(Default)]
struct Progress {
    failures: u32,
    next_refresh: Option<Instant>,
    /// The generation last synced by this process: the status says the same a moment later,
    /// but the watch may deliver the object before that status write.
    synced_generation: Option<i64>,
}

/// A Secret as this controller last wrote it.
struct Written {
    resource_version: String,
    /// The ExternalSecret it was written for, so its entry goes when that one does.
    external_secret: String,
}

/// Shared state of every reconcile.
pub struct Reconciler {
    client: Client,
    catalog: Arc<dyn Catalog>,
    fetcher: Fetcher,
    compute: Pool,
    tokens: TokenMinter,
    leadership: Leadership,
    metrics: Arc<Metrics>,
    events: Option<KubeEvents>,
    dry_run: bool,
    allow_agent_identity: bool,
    backoff: Backoff,
    generators: MirrorGenerators,
    progress: Mutex<HashMap<(String, String), Progress>>,
    /// Each Secret as this controller last wrote it, by (namespace, Secret name).
    written: Mutex<HashMap<(String, String), Written>>,
    /// Refreshes of ExternalSecrets synced before may use half the workers at most, so ones
    /// never synced (new, or failing since creation) go first.
    refresh_slots: Arc<tokio::sync::Semaphore>,
}

/// The parts a [`Reconciler`] is made of.
pub struct Parts {
    /// API client (the controller's own identity: Secrets, status, Events, TokenRequests).
    pub client: Client,
    /// Stores, Namespaces and credential Secrets, as the node agent reads them (ExternalSecrets
    /// come from the controller's own watch; see [`super::catalog`]).
    pub catalog: Arc<dyn Catalog>,
    /// The shared value cache and providers.
    pub fetcher: Fetcher,
    /// Threads for templates and other heavy rendering.
    pub compute: Pool,
    /// Whether this replica may write.
    pub leadership: Leadership,
    /// Where metrics go.
    pub metrics: Arc<Metrics>,
    /// Events on ExternalSecrets (`None`: none are written).
    pub events: Option<KubeEvents>,
    /// Log what would be written instead of writing.
    pub dry_run: bool,
    /// Let ClusterSecretStores with `agentIdentity` read with the controller's own identity.
    pub allow_agent_identity: bool,
    /// Reconciles the controller runs at once.
    pub concurrency: u16,
    /// Where credentials of generators are recorded, and how they retire.
    pub generators: MirrorGenerators,
}

impl Reconciler {
    /// A reconciler over `parts`.
    pub fn new(parts: Parts) -> Self {
        Self {
            tokens: TokenMinter::new(parts.client.clone()),
            client: parts.client,
            catalog: parts.catalog,
            fetcher: parts.fetcher,
            compute: parts.compute,
            leadership: parts.leadership,
            metrics: parts.metrics,
            events: parts.events,
            dry_run: parts.dry_run,
            allow_agent_identity: parts.allow_agent_identity,
            generators: parts.generators,
            backoff: Backoff::default(),
            progress: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
            refresh_slots: Arc::new(tokio::sync::Semaphore::new(
                usize::from(parts.concurrency / 2).max(1),
            )),
        }
    }

    /// Reconciles one ExternalSecret and says when to look at it again.
    pub async fn reconcile(
        self: Arc<Self>,
        object: Arc<Lenient<ExternalSecret>>,
    ) -> Result<Action, MirrorError> {
        let started = Instant::now();
        self.metrics.mirror_in_flight.inc();
        let result = self.reconcile_object(&object).await;
        self.metrics.mirror_in_flight.dec();
        self.metrics
            .mirror_sync_duration
            .observe(started.elapsed().as_secs_f64());
        self.metrics.mirror_queued.set(self.queued() as i64);
        result
    }

    async fn reconcile_object(
        &self,
        object: &Lenient<ExternalSecret>,
    ) -> Result<Action, MirrorError> {
        let es = match object {
            Lenient::Usable(es) => Arc::clone(es),
            Lenient::Unusable { metadata, reason } => {
                let namespace = metadata.namespace.clone().unwrap_or_default();
                let name = metadata.name.clone().unwrap_or_default();
                warn!(%namespace, external_secret = %name, %reason, "ExternalSecret cannot be read");
                return Ok(Action::await_change());
            }
        };
        let policy = creation_policy(&es);
        let namespace = es.metadata.namespace.clone().unwrap_or_default();
        let name = es.metadata.name.clone().unwrap_or_default();
        if policy == CreationPolicy::None {
            // Mount only: this controller never touches it.
            self.forget(&namespace, &name);
            return Ok(Action::await_change());
        }
        let _refresh_slot = if self.synced_generation(&namespace, &name).is_some()
            && self.refresh_due(&namespace, &name)
        {
            match Arc::clone(&self.refresh_slots).try_acquire_owned() {
                Ok(slot) => Some(slot),
                Err(_) => {
                    self.metrics
                        .mirror_syncs
                        .get_or_create(&ResultLabel { result: "deferred" })
                        .inc();
                    return Ok(Action::requeue(DEFER));
                }
            }
        } else {
            None
        };
        let (outcome, label) = self.sync(&es, policy, &namespace, &name).await?;
        self.metrics
            .mirror_syncs
            .get_or_create(&ResultLabel { result: label })
            .inc();
        let requeue = self.schedule(&es, &namespace, &name, &outcome);
        self.report(&es, &namespace, &name, &outcome, label).await?;
        Ok(match requeue {
            Some(after) => Action::requeue(after),
            None => Action::await_change(),
        })
    }

    /// Brings the Secret in line; the outcome and a short result label for metrics.
    async fn sync(
        &self,
        es: &Arc<ExternalSecret>,
        policy: CreationPolicy,
        namespace: &str,
        name: &str,
    ) -> Result<(Outcome, &'static str), MirrorError> {
        let target = desired::target_name(es);
        let generation = es.metadata.generation.unwrap_or(0);
        let fail = |reason: Reason, message: String| {
            (
                Outcome {
                    reason,
                    message,
                    refreshed: false,
                    synced_generation: None,
                    secret: target.clone(),
                },
                match reason {
                    Reason::SecretConflict => "conflict",
                    _ => "error",
                },
            )
        };
        let prefix = format!("namespace \"{namespace}\", ExternalSecret \"{name}\"");
        if let Err(e) = crate::api::validate::object_name("spec.target.name", &target) {
            return Ok(fail(Reason::InvalidTarget, format!("{prefix}: {e}")));
        }
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let existing = secrets.get_metadata_opt(&target).await.map_err(|e| {
            self.api_error(namespace, name, &format!("reading Secret {target:?}"), e)
        })?;
        // Refused before any backend call: a template that would write a token Secret or one
        // of Latchkey's own marks, and a Secret neither created by this controller for this
        // ExternalSecret nor opted in to its Merge.
        if let Err(e) = desired::check_template(es) {
            return Ok(fail(Reason::InvalidTarget, format!("{prefix}: {e}")));
        }
        let uid = es.metadata.uid.clone().unwrap_or_default();
        let existing_meta = existing.as_ref().map(|m| &m.metadata);
        let access = match ownership::access(existing_meta, name, &uid, policy, &target) {
            Ok(access) => access,
            Err((reason, message)) => return Ok(fail(reason, format!("{prefix}: {message}"))),
        };
        let key = (namespace.to_string(), target.clone());
        let drift = match (&existing, self.written(&key)) {
            (Some(m), Some(rv)) => m.metadata.resource_version.as_ref() != Some(&rv),
            _ => true,
        };
        let refresh = match Refresh::parse(es.spec.refresh_interval.as_deref()) {
            Ok(r) => r,
            Err(reason) => {
                return Ok(fail(
                    Reason::SecretSyncedError,
                    format!("{prefix}: {reason}"),
                ));
            }
        };
        let synced = self.synced_generation(namespace, name).or_else(|| {
            es.status
                .as_ref()
                .and_then(|s| s.synced_resource_version.as_deref())
                .and_then(|g| g.parse::<i64>().ok())
        });
        let spec_changed = synced != Some(generation);
        let (due, drift) = match es.spec.refresh_policy.unwrap_or_default() {
            RefreshPolicy::Periodic => (spec_changed || self.refresh_due(namespace, name), drift),
            RefreshPolicy::OnChange => (spec_changed, drift),
            // Written once: only a missing Secret is written (again).
            RefreshPolicy::CreatedOnce => (existing.is_none(), false),
        };
        if !due && !drift {
            return Ok((
                Outcome {
                    reason: Reason::SecretSynced,
                    message: synced_message(namespace, name, &target),
                    refreshed: false,
                    synced_generation: Some(generation),
                    secret: target.clone(),
                },
                "unchanged",
            ));
        }
        // Not due: only the Secret drifted, and any cached value will do to repair it.
        let max_age = if due { refresh.max_age() } else { None };

        let catalog = AtHand {
            external_secret: es,
            catalog: &*self.catalog,
        };
        let binding = match bind(&catalog, namespace, name).await {
            Ok(b) => b,
            Err(e) => return Ok(fail(Reason::SecretSyncedError, e.to_string())),
        };
        let cx = Context {
            namespace: namespace.to_string(),
            external_secret: name.to_string(),
            store_kind: binding.store_kind(),
            store_name: binding.store_name.clone(),
        };
        // `bind` validated the provider block.
        let Some(spec) = binding.spec() else {
            let message = format!("{cx}: the store sets no provider");
            return Ok(fail(Reason::SecretSyncedError, message));
        };
        let service_account = es
            .spec
            .service_account_name
            .clone()
            .unwrap_or_else(|| DEFAULT_SERVICE_ACCOUNT.to_string());
        let bound = match generated::bind_all(&catalog, es).await {
            Ok(b) => b,
            Err(e) => return Ok(fail(Reason::SecretSyncedError, e)),
        };
        let audiences =
            match consent::audiences(spec, binding.credential_scope(), self.allow_agent_identity) {
                Ok(mut a) => match generated::audiences(&bound, self.allow_agent_identity) {
                    Ok(more) => {
                        a.extend(more);
                        a.sort();
                        a.dedup();
                        a
                    }
                    Err(e) => return Ok(fail(Reason::SecretSyncedError, format!("{cx}: {e}"))),
                },
                Err(e) => return Ok(fail(Reason::SecretSyncedError, format!("{cx}: {e}"))),
            };
        let tokens = match self
            .tokens
            .tokens(namespace, &service_account, &audiences)
            .await
        {
            Ok(t) => t,
            Err(e) => return Ok(fail(Reason::SecretSyncedError, format!("{cx}: {e}"))),
        };
        let identity = PodInfo {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: String::new(),
            service_account,
            tokens,
        };
        let source = match self.fetcher.source(&cx, &binding, &identity) {
            Ok(s) => s,
            Err(e) => return Ok(fail(Reason::SecretSyncedError, e.to_string())),
        };
        let plan = match resolve::plan(&cx, &es.spec) {
            Ok(p) => p,
            Err(e) => return Ok(fail(Reason::SecretSyncedError, e.to_string())),
        };
        let budget = (desired::MAX_SECRET_BYTES as u64).saturating_mul(4);
        // A backend that keeps failing is left alone until its backoff delay has passed; what
        // is still cached is used meanwhile.
        let gate = Gate::new(&self.backoff, source.store(), source.identity());
        let fetched = self
            .fetcher
            .fetch(&source, plan, max_age, budget, &gate)
            .await;
        gate.record(&fetched);
        let fetched = match fetched {
            Ok(f) => f,
            Err(FetchError::Provider {
                source: ProviderError::NotFound,
                key,
                ..
            }) => {
                let what = key.map(|k| format!(", {k}")).unwrap_or_default();
                return self
                    .remote_gone(
                        es,
                        policy,
                        &secrets,
                        &access,
                        &target,
                        &format!("{cx}{what}"),
                    )
                    .await
                    .map(|o| {
                        let label = if o.reason == Reason::SecretDeleted {
                            "deleted"
                        } else {
                            "error"
                        };
                        (o, label)
                    });
            }
            Err(e) => {
                return Ok(fail(
                    Reason::SecretSyncedError,
                    format!("{e}; the Secret is kept as it is"),
                ));
            }
        };
        // Generated last (a failing store costs no credential), anew on every sync that
        // writes: design 011. Whatever fails from here on cleans them up again.
        let mut fetched = fetched;
        let env = self.fetcher.env();
        let made = match (self.generators)
            .generate(env, &cx, es, &identity, bound, &mut fetched)
            .await
        {
            Ok(m) => m,
            Err(e) => return Ok(fail(Reason::SecretSyncedError, e)),
        };
        let entries = self.render(&cx, es, fetched).await;
        let wanted = entries
            .map_err(|m| (Reason::TemplateError, m))
            .and_then(|entries| {
                desired::secret(es, policy, Some(&entries)).map_err(|e| {
                    let reason = match e {
                        DesiredError::TooLarge(_) => Reason::SecretTooLarge,
                        DesiredError::InvalidKey(_)
                        | DesiredError::ForbiddenType(_)
                        | DesiredError::ReservedMark(_) => Reason::InvalidTarget,
                    };
                    (reason, format!("{cx}: {e}"))
                })
            });
        let wanted = match wanted {
            Ok(w) => w,
            Err((reason, message)) => {
                self.generators.discard(made).await;
                return Ok(fail(reason, message));
            }
        };
        let same_hash = existing
            .as_ref()
            .and_then(|m| m.metadata.annotations.as_ref())
            .and_then(|a| a.get(desired::DATA_HASH_ANNOTATION))
            .is_some_and(|h| *h == wanted.hash);
        let synced_outcome = |label| {
            (
                Outcome {
                    reason: Reason::SecretSynced,
                    message: synced_message(namespace, name, &target),
                    refreshed: due,
                    synced_generation: Some(generation),
                    secret: target.clone(),
                },
                label,
            )
        };
        // Earlier credentials retire once the Secret holds new ones; a spec change may have
        // dropped a generator, whose credentials retire too. Other syncs skip the listing.
        let retire = !made.is_empty() || spec_changed;
        if same_hash && !drift {
            if retire {
                self.generators.retire_older(es, &made).await;
            }
            return Ok(synced_outcome("unchanged"));
        }
        match self.write(&secrets, &key, name, &wanted, &access).await {
            Ok(()) if retire => self.generators.retire_older(es, &made).await,
            Ok(()) => {}
            Err(outcome) => {
                self.generators.discard(made).await;
                return Ok(fail(outcome.0, format!("{cx}: {}", outcome.1)));
            }
        }
        info!(
            %namespace, external_secret = %name, secret = %target, keys = ?wanted.keys,
            dry_run = self.dry_run, "Secret written"
        );
        Ok(synced_outcome("synced"))
    }

    /// Writes the outcome to the status (when it changed) and as an Event.
    async fn report(
        &self,
        es: &ExternalSecret,
        namespace: &str,
        name: &str,
        outcome: &Outcome,
        label: &str,
    ) -> Result<(), MirrorError> {
        let Some(next) = status::next(es.status.as_ref(), outcome) else {
            return Ok(());
        };
        if !outcome.reason.is_ready() {
            warn!(%namespace, external_secret = %name, reason = outcome.reason.as_str(), message = %outcome.message, "mirror failed");
        }
        if self.dry_run || !self.may_write() {
            debug!(%namespace, external_secret = %name, "status not written (dry run or not leader)");
            return Ok(());
        }
        let previous = es
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .and_then(|c| c.reason.clone());
        let api: Api<ExternalSecret> = Api::namespaced(self.client.clone(), namespace);
        let patch = serde_json::json!({ "status": next });
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            // Deleted meanwhile: nothing to report on.
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(self.api_error(namespace, name, "writing the status", e)),
        }
        let changed = previous.as_deref() != Some(outcome.reason.as_str());
        if let Some(events) = &self.events
            && (changed || label == "synced")
        {
            let target = EventTarget {
                api_version: "latchkey.dev/v1alpha1",
                kind: "ExternalSecret",
                namespace: namespace.to_string(),
                name: name.to_string(),
                uid: es.metadata.uid.clone().unwrap_or_default(),
            };
            let type_ = if outcome.reason.is_ready() {
                NORMAL
            } else {
                WARNING
            };
            events.record(
                &target,
                type_,
                outcome.reason.as_str(),
                "Mirror",
                &outcome.message,
            );
        }
        Ok(())
    }

    /// Checked right before every write: a replica whose lease may have lapsed writes nothing.
    fn may_write(&self) -> bool {
        self.leadership.is_leader()
    }

    fn api_error(&self, namespace: &str, name: &str, what: &str, e: kube::Error) -> MirrorError {
        MirrorError::Api {
            namespace: namespace.to_string(),
            name: name.to_string(),
            reason: format!("{what}: {}", describe(&e)),
        }
    }
}

/// The creation policy, `None` when absent.
pub fn creation_policy(es: &ExternalSecret) -> CreationPolicy {
    es.spec
        .target
        .as_ref()
        .and_then(|t| t.creation_policy)
        .unwrap_or_default()
}

fn synced_message(namespace: &str, name: &str, target: &str) -> String {
    format!("namespace \"{namespace}\", ExternalSecret \"{name}\": Secret {target:?} is up to date")
}

/// A kube error without anything but the API server's Status message.
fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => other.to_string(),
    }
}
