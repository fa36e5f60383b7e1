//! The PushSecret loop of `latchkey controller`: each PushSecret's source Secret, read as its
//! service account (or its generator's output, [`super::generated`]), written into each of its
//! stores (as that account too), on every change of the PushSecret or of the Secret (watched by
//! metadata only: no Secret value of the cluster is held here) and at `refreshInterval`.
//! Unchanged data costs no backend write. With `deletionPolicy: Delete` a finalizer holds the
//! PushSecret until what was pushed, and only that, is deleted; never longer than
//! `cleanup_timeout`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt, future};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tracing::{debug, warn};

mod finalize;
mod helpers;
mod store;
#[cfg(test)]
mod tests;
mod write;

use helpers::{bounded, compact, describe, describe_targets, refresh};
use store::{Echo, StoreLabels, selecting};
use write::Written;

use super::generated::{self, Generated, GeneratedValues, PushGenerators};
use super::plan::{self, Recorded};
use super::pushers::Pushers;
use super::source::SourceReader;
use super::template;
use crate::api::push_secret::{
    PushDeletionPolicy, PushSecret, PushSecretStatus, PushSecretStoreRef, SyncedPush,
};
use crate::api::{ClusterSecretStore, SecretStore, StoreKind, validate};
use crate::catalog::{Catalog, Lenient};
use crate::compute::Pool;
use crate::events::{EventTarget, KubeEvents, WARNING};
use crate::mirror::status::with_ready;

/// The finalizer that holds a PushSecret with `deletionPolicy: Delete`.
pub const FINALIZER: &str = "latchkey.dev/push-secret";
/// Reason of the Warning Event of a push that failed.
pub const PUSH_FAILED: &str = "PushFailed";
/// Reason of the Warning Event of a deletion that failed.
pub const DELETE_FAILED: &str = "DeleteFailed";
/// Retry of a failed reconcile.
const RETRY: Duration = Duration::from_secs(5);
/// When `refreshInterval` is not set.
const DEFAULT_REFRESH: Duration = Duration::from_secs(3600);
/// Shortest refresh, so that a tenant cannot make the controller spin.
const MIN_REFRESH: Duration = Duration::from_secs(5);
/// How long in-flight reconciles may take to finish once a stop is asked for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Reconciles run at once.
const CONCURRENCY: u16 = 4;
/// Most status entries of writes remembered (as many as the fingerprints).
const MAX_ENTRIES: usize = 100_000;
/// Longest condition or Event message, in bytes.
const MAX_MESSAGE: usize = 2048;

/// What the controller needs.
pub struct Parts {
    /// The controller's API client (PushSecrets, their status and finalizers, stores).
    pub client: Client,
    /// Stores and namespace labels.
    pub catalog: Arc<dyn Catalog>,
    /// Namespaces to serve; empty: all.
    pub namespaces: Vec<String>,
    /// Whether this replica may write now (checked before every write).
    pub leading: Arc<dyn Fn() -> bool + Send + Sync>,
    /// Where Events go; `None` records none (dry run).
    pub events: Option<Arc<KubeEvents>>,
    /// Log what would be pushed, write nothing.
    pub dry_run: bool,
    /// Reads source Secrets as the PushSecrets' service accounts.
    pub reader: SourceReader,
    /// Makes the writer of each store.
    pub pushers: Arc<dyn Pushers>,
    /// How long deleting what was pushed is retried before the finalizer is released anyway.
    pub cleanup_timeout: Duration,
    /// Runs the generators PushSecrets name.
    pub generators: PushGenerators,
    /// Where templates are evaluated (tenant CPU, off the async workers, with a time limit).
    pub compute: Arc<Pool>,
}

/// Why a reconcile did not finish; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum PushSecretError {
    /// The status or finalizers could not be written.
    #[error("PushSecret {namespace}/{name}: {what} not written: {reason}")]
    Write {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// `status`, `finalizers`.
        what: &'static str,
        /// The API server's Status message (holds no value).
        reason: String,
    },
}

/// Runs PushSecrets.
pub struct PushController {
    parts: Parts,
    recorded: Recorded,
    /// The status entry of the last write per (store, remote key): a reconcile may run on a
    /// cached object whose status does not show that write yet, and must not write again.
    entries: Mutex<HashMap<(String, String), SyncedPush>>,
    /// The values of generators, held until replaced.
    generated: GeneratedValues,
}

type Stop = Shared<BoxFuture<'static, ()>>;

impl PushController {
    /// A controller over `parts`.
    pub fn new(parts: Parts) -> Self {
        Self {
            parts,
            recorded: Recorded::default(),
            entries: Mutex::new(HashMap::new()),
            generated: GeneratedValues::default(),
        }
    }

    /// Runs until `stop` completes.
    pub async fn run(
        self: Arc<Self>,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let stop: BoxFuture<'static, ()> = Box::pin(stop);
        let stop = stop.shared();
        let scopes: Vec<Option<String>> = if self.parts.namespaces.is_empty() {
            vec![None]
        } else {
            self.parts.namespaces.iter().cloned().map(Some).collect()
        };
        let runs = future::join_all(
            scopes
                .into_iter()
                .map(|ns| Arc::clone(&self).run_in(ns, stop.clone())),
        );
        tokio::pin!(runs);
        tokio::select! {
            _ = &mut runs => {}
            _ = stop.clone() => {
                // A first list that never succeeds (no CRD, no RBAC yet) would hold the stop.
                let _ = tokio::time::timeout(SHUTDOWN_GRACE, &mut runs).await;
            }
        }
    }

    async fn run_in(self: Arc<Self>, namespace: Option<String>, stop: Stop) {
        let client = self.parts.client.clone();
        let cluster_stores = Api::<PartialObjectMeta<ClusterSecretStore>>::all(client.clone());
        let (pushes, secrets, stores) = match &namespace {
            Some(ns) => (
                Api::<Lenient<PushSecret>>::namespaced(client.clone(), ns),
                Api::<PartialObjectMeta<Secret>>::namespaced(client.clone(), ns),
                Api::<PartialObjectMeta<SecretStore>>::namespaced(client, ns),
            ),
            None => (
                Api::all(client.clone()),
                Api::all(client.clone()),
                Api::all(client),
            ),
        };
        // The store keeps every PushSecret for as long as it exists: without what no reconcile
        // reads (see `compact`).
        let (reader, writer) = reflector::store();
        let watched = watcher(pushes, watcher::Config::default())
            .default_backoff()
            .modify(compact)
            .reflect(writer)
            .applied_objects();
        let controller = Controller::for_stream(watched, reader)
            .with_config(ControllerConfig::default().concurrency(CONCURRENCY));
        let seen = controller.store();
        // Metadata only, and no cache of them: each event is mapped to the PushSecrets of its
        // namespace that name it, and the value is read as their account.
        let secret_events = watcher(secrets, watcher::Config::default())
            .default_backoff()
            .touched_objects();
        // Stores by metadata too: a store whose labels change (or a new one) starts the pushes
        // of the PushSecrets that select stores of its kind, now and a second later (the
        // selection reads the catalog's own watch, which may see the change after this one), so
        // a store that gains a label is written within seconds rather than at the next refresh.
        let (seen_stores, store_labels) = (controller.store(), StoreLabels::default());
        let store_events = watcher(stores, watcher::Config::default())
            .default_backoff()
            .touched_objects();
        let (seen_cluster, cluster_labels) = (controller.store(), StoreLabels::default());
        let (echo, echoes) = Echo::new();
        let cluster_echo = echo.clone();
        let cluster_events = watcher(cluster_stores, watcher::Config::default())
            .default_backoff()
            .touched_objects();
        controller
            .watches_stream(secret_events, move |secret: PartialObjectMeta<Secret>| {
                let (namespace, name) = (secret.namespace(), secret.name_any());
                seen.state()
                    .iter()
                    .filter(|p| match p.as_ref() {
                        Lenient::Usable(o) => {
                            o.namespace() == namespace && o.source_secret() == name
                        }
                        Lenient::Unusable { .. } => false,
                    })
                    .map(|p| ObjectRef::from_obj(p.as_ref()))
                    .collect::<Vec<_>>()
            })
            .watches_stream(store_events, move |s: PartialObjectMeta<SecretStore>| {
                let namespace = s.namespace();
                let key = format!(
                    "{}/{}",
                    namespace.as_deref().unwrap_or_default(),
                    s.name_any()
                );
                if !store_labels.changed(key, s.labels()) {
                    return Vec::new();
                }
                echo.and_later(selecting(
                    &seen_stores,
                    StoreKind::SecretStore,
                    namespace.as_deref(),
                ))
            })
            .watches_stream(
                cluster_events,
                move |s: PartialObjectMeta<ClusterSecretStore>| {
                    if !cluster_labels.changed(s.name_any(), s.labels()) {
                        return Vec::new();
                    }
                    cluster_echo.and_later(selecting(
                        &seen_cluster,
                        StoreKind::ClusterSecretStore,
                        None,
                    ))
                },
            )
            .reconcile_on(echoes)
            .graceful_shutdown_on(stop)
            .run(
                |ps, me: Arc<PushController>| async move { me.reconcile(&ps).await },
                |_, error: &PushSecretError, _| {
                    debug!(%error, "push secret reconcile failed; retrying");
                    Action::requeue(RETRY)
                },
                self,
            )
            .for_each(|result| {
                if let Err(error) = result {
                    debug!(%error, "push secret reconcile not run");
                }
                future::ready(())
            })
            .await;
    }

    fn leading(&self) -> bool {
        (self.parts.leading)()
    }

    fn warn(&self, ps: &PushSecret, reason: &'static str, message: &str) {
        if let Some(events) = &self.parts.events {
            let target = EventTarget {
                api_version: "latchkey.dev/v1alpha1",
                kind: "PushSecret",
                namespace: ps.namespace().unwrap_or_default(),
                name: ps.name_any(),
                uid: ps.uid().unwrap_or_default(),
            };
            events.record(&target, WARNING, reason, "Push", message);
        }
    }

    async fn reconcile(&self, ps: &Lenient<PushSecret>) -> Result<Action, PushSecretError> {
        let object = match ps {
            Lenient::Usable(object) => object,
            Lenient::Unusable { reason, .. } => {
                warn!(push_secret = %ps.name_any(), %reason, "PushSecret cannot be read; nothing is pushed for it");
                return Ok(Action::await_change());
            }
        };
        let namespace = object.namespace().unwrap_or_default();
        let name = object.name_any();
        let ours = object.finalizers().iter().any(|f| f == FINALIZER);
        if object.metadata.deletion_timestamp.is_some() {
            self.generated.forget(object);
            return if ours {
                self.finalize(object, &namespace, &name).await
            } else {
                Ok(Action::await_change())
            };
        }
        let who = format!("PushSecret {namespace}/{name}");
        let previous = object.status.clone().unwrap_or_default();
        if let Err(invalid) = validate::push_secret(&object.spec) {
            let message = format!("{who}: invalid: {invalid}");
            self.report(
                object,
                &previous,
                previous.synced_push_secrets.clone(),
                Some(("Invalid", message)),
                false,
            )
            .await?;
            return Ok(Action::await_change());
        }
        let delete = object.spec.deletion_policy == PushDeletionPolicy::Delete;
        if delete != ours {
            self.set_finalizer(object, &namespace, &name, delete)
                .await?;
        }
        let secret = object.source_secret();
        let service_account = object.service_account();
        let targets = describe_targets(object);
        // The stores are selected first: a generated value is replaced only once all have it.
        let selection = self.select_stores(object, &namespace).await;
        let wanted: BTreeSet<String> = selection
            .stores
            .iter()
            .map(|(kind, store)| PushSecretStoreRef::status_key_of(*kind, store))
            .collect();
        // The values live only while the writes are planned (a generator's: until replaced).
        let generator = object.spec.selector.generator_ref.as_ref();
        let source = match generator {
            Some(reference) => {
                let may_write = !self.parts.dry_run && self.leading();
                (self.generated)
                    .values(
                        &self.parts.generators,
                        &*self.parts.catalog,
                        object,
                        reference,
                        generated::Reached {
                            status: &previous,
                            stores: &wanted,
                        },
                        generated::interval(object, DEFAULT_REFRESH, MIN_REFRESH),
                        may_write,
                    )
                    .await
            }
            None => (self.parts.reader)
                .read(&namespace, service_account, secret)
                .await
                .map(|data| Generated::Values(data, None))
                .map_err(|e| ("SourceUnavailable", e.to_string())),
        };
        let (data, due) = match source {
            Ok(Generated::Values(data, due)) => (Ok(data), due),
            Ok(Generated::Quiet(due)) => {
                let synced = previous.synced_push_secrets.clone();
                self.report(object, &previous, synced, None, false).await?;
                let wait = due.map_or(refresh(object), |d| d.min(refresh(object)));
                return Ok(Action::requeue(wait.max(MIN_REFRESH)));
            }
            Err(e) => (Err(e), None),
        };
        let t = object.spec.template.as_ref();
        let planned = match data {
            Err(e) => Err(e),
            Ok(data) => {
                match template::apply(&self.parts.compute, &namespace, &name, t, data).await {
                    // The fingerprints are of what the template computed: a changed template over
                    // unchanged data is pushed again, an unchanged one is not.
                    Ok(data) => plan::plan(&object.spec, secret, &data).map_err(|e| {
                        let after = if t.is_some() {
                            " after spec.template"
                        } else {
                            ""
                        };
                        ("MissingKey", format!("{e}{after}"))
                    }),
                    Err(e) => Err(("TemplateFailed", e.to_string())),
                }
            }
        };
        let writes = match planned {
            Ok(writes) => writes,
            Err((reason, e)) => {
                let message = format!("{who}: nothing pushed to {targets}: {e}");
                self.report(
                    object,
                    &previous,
                    previous.synced_push_secrets.clone(),
                    Some((reason, message)),
                    false,
                )
                .await?;
                // No watch tells when a generator works again: retried as a failed push.
                return Ok(Action::requeue(match generator {
                    Some(_) => RETRY.max(refresh(object).min(Duration::from_secs(30))),
                    None => refresh(object),
                }));
            }
        };
        let mut failures: Vec<(&'static str, String)> = selection.failures.clone();
        let Written {
            mut synced,
            wrote,
            delivered,
        } = self
            .write_stores(object, &selection.stores, &writes, &previous, &mut failures)
            .await;
        // A selector that could not be expanded says nothing of which stores stopped matching:
        // what was pushed to stores of its kind stays listed (and is not pruned).
        for (key, remotes) in &previous.synced_push_secrets {
            if !synced.contains_key(key) && selection.keeps(key) {
                synced.insert(key.clone(), remotes.clone());
            }
        }
        if object.spec.deletion_policy == PushDeletionPolicy::Delete {
            self.prune(
                object,
                &namespace,
                &previous.synced_push_secrets,
                &mut synced,
                &mut failures,
            )
            .await;
        }
        if generator.is_some() && !self.parts.dry_run && self.leading() {
            let gens = &self.parts.generators;
            self.generated
                .settle(gens, object, &wanted, delivered)
                .await;
        }
        if !self.leading() {
            return Ok(Action::requeue(RETRY));
        }
        let failure = (!failures.is_empty()).then(|| {
            let reason = failures[0].0;
            let message: Vec<String> = failures.into_iter().map(|(_, m)| m).collect();
            (reason, bounded(message.join("; ")))
        });
        let failed = failure.is_some();
        self.report(object, &previous, synced, failure, wrote)
            .await?;
        Ok(Action::requeue(if failed {
            RETRY.max(refresh(object).min(Duration::from_secs(30)))
        } else {
            due.map_or(refresh(object), |d| d.clamp(MIN_REFRESH, refresh(object)))
        }))
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<(String, String), SyncedPush>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `remote_key` of `store_id` is to be written again at the next push.
    fn forget(&self, store_id: &str, remote_key: &str) {
        self.recorded.forget(store_id, remote_key);
        self.entries()
            .remove(&(store_id.to_string(), remote_key.to_string()));
    }

    /// Writes the status when it changes, and a Warning Event when it changed to a failure.
    async fn report(
        &self,
        object: &PushSecret,
        previous: &PushSecretStatus,
        synced: BTreeMap<String, BTreeMap<String, SyncedPush>>,
        failure: Option<(&'static str, String)>,
        wrote: bool,
    ) -> Result<(), PushSecretError> {
        let (status, reason, message) = match &failure {
            None => {
                let count: usize = synced.values().map(BTreeMap::len).sum();
                ("True", "Synced", format!("{count} remote secret(s) pushed"))
            }
            Some((reason, message)) => ("False", *reason, message.clone()),
        };
        let (conditions, same) = with_ready(&previous.conditions, status, reason, &message);
        if same && synced == previous.synced_push_secrets && !wrote {
            return Ok(());
        }
        if let Some((_, message)) = &failure {
            debug!(%message, "push secret failed");
        }
        if self.parts.dry_run || !self.leading() {
            return Ok(());
        }
        let mut body = json!({
            "conditions": conditions,
            "syncedPushSecrets": synced,
        });
        if wrote || previous.refresh_time.is_none() {
            body["refreshTime"] = json!(Timestamp::now().to_string());
        }
        // A merge patch keeps map entries it does not name: name the ones gone as null.
        for (store, remotes) in &previous.synced_push_secrets {
            match synced.get(store) {
                None => body["syncedPushSecrets"][store] = Value::Null,
                Some(now) => {
                    for remote in remotes.keys().filter(|r| !now.contains_key(*r)) {
                        body["syncedPushSecrets"][store][remote] = Value::Null;
                    }
                }
            }
        }
        let (namespace, name) = (object.namespace().unwrap_or_default(), object.name_any());
        let api: Api<Lenient<PushSecret>> = Api::namespaced(self.parts.client.clone(), &namespace);
        let patch = Patch::Merge(json!({ "status": body }));
        match api
            .patch_status(&name, &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => {
                return Err(PushSecretError::Write {
                    namespace,
                    name,
                    what: "status",
                    reason: describe(&e),
                });
            }
        }
        if !same && let Some((_, message)) = &failure {
            self.warn(object, PUSH_FAILED, message);
        }
        Ok(())
    }
}
