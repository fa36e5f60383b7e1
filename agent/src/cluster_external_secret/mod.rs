//! The ClusterExternalSecret controller (ESO's kind of the same name): for each
//! ClusterExternalSecret, an ExternalSecret named `externalSecretName` is written into every
//! namespace named in `namespaces` or matching any of `namespaceSelectors`, owned by it
//! (controller ownerReference), and deleted from namespaces that stop matching. The mirror then
//! serves those ExternalSecrets as any other, under the same opt-in rules: a
//! ClusterExternalSecret gives no namespace more than its own service accounts already have.
//!
//! Only ExternalSecrets it owns are ever changed or deleted: an ExternalSecret of that name
//! that is someone else's is reported in `status.failedNamespaces` and left alone. Namespaces
//! being deleted are skipped. When the ClusterExternalSecret is deleted, Kubernetes' garbage
//! collector removes its ExternalSecrets (they are its dependents); before creating any, the
//! object is read back from the API server, so none is created for one already gone.
//!
//! What is written is remembered (the object's generation and a digest of the body), so an
//! unchanged ExternalSecret is not written again on every namespace event, status write of the
//! mirror or refresh; one whose spec someone else edited is written back.

mod plan;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{FutureExt, StreamExt, future};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use crate::api::ExternalSecret;
use crate::api::cluster_external_secret::{ClusterExternalSecret, ClusterExternalSecretStatus};
use crate::catalog::Lenient;
use crate::events::{EventTarget, KubeEvents, WARNING};

pub use plan::{LABEL, MAX_STATUS_NAMESPACES, Owned, Plan, SeenNamespace, matches, plan};
use plan::{controller_uid, desired, digest, foreign, refresh};

/// The field manager of the ExternalSecrets written (the mirror's, so one name shows in
/// `managedFields` for everything the controller writes).
const FIELD_MANAGER: &str = "latchkey";
/// Longest wait before a failed reconcile is retried.
const RETRY: Duration = Duration::from_secs(5);
/// When to look again while the caches are still filling.
const NOT_READY_RETRY: Duration = Duration::from_millis(200);
/// How long in-flight reconciles may take to finish once a stop is asked for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Reconciles run at once.
const CONCURRENCY: u16 = 4;
/// Reason of the Warning Event recorded when some namespaces cannot get their ExternalSecret.
pub const PROVISION_FAILED: &str = "ProvisionFailed";
/// Reason of the Warning Event recorded when the object cannot be used.
pub const INVALID: &str = "Invalid";

/// What the controller needs.
pub struct Parts {
    /// The controller's API client.
    pub client: Client,
    /// Namespaces to serve; empty: all.
    pub namespaces: Vec<String>,
    /// Whether this replica may write now (checked before every write).
    pub leading: Arc<dyn Fn() -> bool + Send + Sync>,
    /// Where Events go; `None` records none (dry run).
    pub events: Option<Arc<KubeEvents>>,
    /// Log what would be written, write nothing.
    pub dry_run: bool,
}

/// Why a reconcile did not finish; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum CesError {
    /// The status could not be written.
    #[error("ClusterExternalSecret {name}: status not written: {reason}")]
    Status {
        /// Name of the ClusterExternalSecret.
        name: String,
        /// The API server's answer (its Status message, which holds no value).
        reason: String,
    },
    /// The object could not be read back before creating its ExternalSecrets.
    #[error("ClusterExternalSecret {name}: cannot be read: {reason}")]
    Read {
        /// Name of the ClusterExternalSecret.
        name: String,
        /// The API server's answer (its Status message, which holds no value).
        reason: String,
    },
}

/// What was last written for one ExternalSecret: (owner uid, body digest, generation).
type Written = (String, u64, i64);

/// Runs ClusterExternalSecrets.
pub struct CesController {
    parts: Parts,
    written: Mutex<HashMap<(String, String), Written>>,
}

/// One run's caches, shared by its reconciles.
struct Run {
    me: Arc<CesController>,
    namespaces: Store<Namespace>,
    owned: Store<PartialObjectMeta<ExternalSecret>>,
}

impl CesController {
    /// A controller over `parts`.
    pub fn new(parts: Parts) -> Self {
        Self {
            parts,
            written: Mutex::new(HashMap::new()),
        }
    }

    /// Runs until `stop` completes.
    pub async fn run(
        self: Arc<Self>,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let stop = Box::pin(stop).shared();
        let client = self.parts.client.clone();
        let (namespaces, ns_writer) = reflector::store();
        let ns_stream = watcher(Api::<Namespace>::all(client.clone()), Default::default())
            .default_backoff()
            .reflect(ns_writer)
            .touched_objects();
        let (owned, es_writer) = reflector::store();
        // Metadata only: ownership and generations are all this controller reads of them.
        // Every ExternalSecret, not only those with the label: one of someone else that goes
        // away frees its name for a ClusterExternalSecret at once, not at the next refresh.
        let es_stream = watcher(
            Api::<PartialObjectMeta<ExternalSecret>>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        // Kept for as long as each ExternalSecret exists: without managedFields (an entry per
        // writer, the mirror's status writes among them) and kubectl's last applied copy.
        .modify(|es| {
            es.metadata.managed_fields = None;
            if let Some(annotations) = es.metadata.annotations.as_mut() {
                annotations.remove(crate::api::LAST_APPLIED_ANNOTATION);
            }
        })
        .reflect(es_writer)
        .touched_objects();
        let api: Api<Lenient<ClusterExternalSecret>> = Api::all(client);
        let controller = Controller::new(api, watcher::Config::default())
            .with_config(ControllerConfig::default().concurrency(CONCURRENCY));
        let every = controller.store();
        let named = controller.store();
        let run = Arc::new(Run {
            me: Arc::clone(&self),
            namespaces,
            owned,
        });
        let runs = controller
            // Any Namespace change can change what any ClusterExternalSecret matches.
            .watches_stream(ns_stream, move |_: Namespace| {
                every
                    .state()
                    .iter()
                    .map(|c| ObjectRef::from_obj(c.as_ref()))
                    .collect::<Vec<_>>()
            })
            // Not `owns_stream`: it looks owners up in the child's namespace, and a
            // ClusterExternalSecret has none.
            .watches_stream(es_stream, move |es: PartialObjectMeta<ExternalSecret>| {
                let name = es.name_any();
                let mut refs: Vec<ObjectRef<Lenient<ClusterExternalSecret>>> = es
                    .owner_references()
                    .iter()
                    .filter(|o| o.kind == ClusterExternalSecret::kind(&()))
                    .map(|o| ObjectRef::new(&o.name))
                    .collect();
                // Those that want an ExternalSecret of this name (one that was in the way).
                refs.extend(named.state().iter().filter_map(|c| match c.as_ref() {
                    Lenient::Usable(o) if o.external_secret_name() == name => {
                        Some(ObjectRef::from_obj(c.as_ref()))
                    }
                    _ => None,
                }));
                refs
            })
            .graceful_shutdown_on(stop.clone())
            .run(
                |ces, run: Arc<Run>| async move { run.reconcile(&ces).await },
                |_, error: &CesError, _| {
                    debug!(%error, "cluster external secret reconcile failed; retrying");
                    Action::requeue(RETRY)
                },
                run,
            )
            .for_each(|result| {
                if let Err(error) = result {
                    debug!(%error, "cluster external secret reconcile not run");
                }
                future::ready(())
            });
        tokio::pin!(runs);
        tokio::select! {
            _ = &mut runs => {}
            _ = stop.clone() => {
                // A controller whose first list never succeeded (no CRD, no RBAC yet) would
                // wait for it forever.
                let _ = tokio::time::timeout(SHUTDOWN_GRACE, &mut runs).await;
            }
        }
    }

    fn leading(&self) -> bool {
        (self.parts.leading)()
    }

    fn warn(&self, ces: &Lenient<ClusterExternalSecret>, reason: &'static str, message: &str) {
        if let Some(events) = &self.parts.events {
            let target = EventTarget {
                api_version: "latchkey.dev/v1alpha1",
                kind: "ClusterExternalSecret",
                namespace: String::new(),
                name: ces.name_any(),
                uid: ces.uid().unwrap_or_default(),
            };
            events.record(&target, WARNING, reason, "Provision", message);
        }
    }

    /// Whether the ClusterExternalSecret `name` of `uid` still exists and is not being
    /// deleted, read from the API server (one metadata GET).
    async fn still_there(&self, name: &str, uid: &str) -> Result<bool, CesError> {
        let api: Api<PartialObjectMeta<ClusterExternalSecret>> =
            Api::all(self.parts.client.clone());
        match api.get_metadata_opt(name).await {
            Ok(Some(live)) => {
                Ok(live.uid() == Some(uid.to_string())
                    && live.metadata.deletion_timestamp.is_none())
            }
            Ok(None) => Ok(false),
            Err(e) => Err(CesError::Read {
                name: name.into(),
                reason: describe(&e),
            }),
        }
    }

    /// Writes `status` when it differs from `previous`.
    async fn write_status(
        &self,
        name: &str,
        previous: Option<&ClusterExternalSecretStatus>,
        status: &ClusterExternalSecretStatus,
    ) -> Result<bool, CesError> {
        if previous == Some(status) || self.parts.dry_run || !self.leading() {
            return Ok(false);
        }
        let mut body = serde_json::to_value(status).unwrap_or_default();
        // A merge patch leaves out-of-date lists in place unless they are set: set them all.
        for key in [
            "provisionedNamespaces",
            "failedNamespaces",
            "externalSecretName",
        ] {
            if body.get(key).is_none() {
                body[key] = Value::Null;
            }
        }
        let api: Api<Lenient<ClusterExternalSecret>> = Api::all(self.parts.client.clone());
        match api
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": body })),
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(CesError::Status {
                name: name.into(),
                reason: describe(&e),
            }),
        }
    }
}

impl Run {
    /// Brings the ExternalSecrets of `ces` in line with the namespaces it matches, then its
    /// status.
    async fn reconcile(&self, ces: &Lenient<ClusterExternalSecret>) -> Result<Action, CesError> {
        let me = &self.me;
        // Never act on a partial view (it would delete what is only not yet seen). Checked, not
        // awaited: a store's readiness wakes only the last of several waiters, so concurrent
        // reconciles awaiting it could sleep forever.
        let ready = |ready: Option<Result<(), _>>| matches!(ready, Some(Ok(())));
        if !ready(self.namespaces.wait_until_ready().now_or_never())
            || !ready(self.owned.wait_until_ready().now_or_never())
        {
            return Ok(Action::requeue(NOT_READY_RETRY));
        }
        let name = ces.name_any();
        let now = Timestamp::now().to_string();
        let object = match ces {
            Lenient::Usable(object) => object,
            Lenient::Unusable { reason, .. } => {
                // Its status cannot be read back, so writing one would only trigger this again
                // (the schema keeps such objects out in a real cluster): the log says it.
                warn!(cluster_external_secret = %name, %reason, "ClusterExternalSecret cannot be read; nothing is written or removed for it");
                return Ok(Action::await_change());
            }
        };
        if object.metadata.deletion_timestamp.is_some() {
            // The garbage collector removes its ExternalSecrets.
            return Ok(Action::await_change());
        }
        let previous = object.status.as_ref();
        if let Err(invalid) = crate::api::validate::cluster_external_secret(&object.spec) {
            return self.refuse(ces, previous, &invalid.to_string(), &now).await;
        }
        let Some(uid) = object.metadata.uid.clone() else {
            return Ok(Action::await_change());
        };
        let es_name = object.external_secret_name().to_string();
        let seen: Vec<SeenNamespace> = self
            .namespaces
            .state()
            .iter()
            .map(|ns| SeenNamespace {
                name: ns.name_any(),
                labels: ns.labels().clone(),
                deleting: ns.metadata.deletion_timestamp.is_some(),
            })
            .collect();
        let owned: Vec<Owned> = self
            .owned
            .state()
            .iter()
            .filter(|es| controller_uid(es.owner_references()) == Some(uid.as_str()))
            .map(|es| Owned {
                namespace: es.namespace().unwrap_or_default(),
                name: es.name_any(),
                uid: es.uid().unwrap_or_default(),
            })
            .collect();
        let plan = plan(&object.spec, &es_name, &seen, &owned, &me.parts.namespaces);
        // This replica's copy of the object can be behind its ExternalSecrets' watch: the
        // garbage collector's deletions may arrive before the object's own. Creating for an
        // object already gone would make orphans the mirror serves until they are collected.
        let creates = plan
            .write
            .iter()
            .any(|ns| self.owned_copy(ns, &es_name, &uid).is_none());
        if creates && me.leading() && !me.parts.dry_run && !me.still_there(&name, &uid).await? {
            debug!(cluster_external_secret = %name, "cluster external secret gone; nothing created for it");
            return Ok(Action::await_change());
        }
        let body = desired(object, &uid, &es_name);
        let mut provisioned = BTreeSet::new();
        let mut failed = BTreeMap::new();
        let mut retry = false;
        for namespace in &plan.write {
            match self.write(namespace, &es_name, &uid, &body).await {
                Ok(()) => {
                    provisioned.insert(namespace.clone());
                }
                Err(Failure::Retry) => retry = true,
                Err(Failure::Refused(why)) => {
                    failed.insert(namespace.clone(), why);
                }
            }
        }
        for gone in &plan.delete {
            retry |= !self.delete(gone).await;
        }
        if !me.leading() {
            return Ok(Action::requeue(RETRY));
        }
        debug!(
            cluster_external_secret = %name, provisioned = provisioned.len(), failed = failed.len(),
            deleted = plan.delete.len(), "cluster external secret reconciled"
        );
        let status = plan::status(previous, &es_name, &provisioned, &failed, &now);
        let changed = me.write_status(&name, previous, &status).await?;
        if changed && !failed.is_empty() {
            let message = status.conditions[0].message.clone().unwrap_or_default();
            me.warn(ces, PROVISION_FAILED, &message);
        }
        if retry {
            return Ok(Action::requeue(RETRY));
        }
        Ok(Action::requeue(refresh(
            object.spec.refresh_time.as_deref(),
        )))
    }

    /// Reports an object that cannot be used; nothing is written or deleted for it.
    async fn refuse(
        &self,
        ces: &Lenient<ClusterExternalSecret>,
        previous: Option<&ClusterExternalSecretStatus>,
        why: &str,
        now: &str,
    ) -> Result<Action, CesError> {
        debug!(cluster_external_secret = %ces.name_any(), %why, "cluster external secret refused");
        let status = plan::invalid(previous, why, now);
        if self
            .me
            .write_status(&ces.name_any(), previous, &status)
            .await?
        {
            self.me.warn(ces, INVALID, why);
        }
        Ok(Action::await_change())
    }

    /// Writes the ExternalSecret into `namespace`: created when missing, updated when it is
    /// this object's, refused when it is anyone else's.
    async fn write(
        &self,
        namespace: &str,
        es_name: &str,
        uid: &str,
        body: &Value,
    ) -> Result<(), Failure> {
        let me = &self.me;
        let key = (namespace.to_string(), es_name.to_string());
        let digest = digest(body);
        let cached = self.owned_copy(namespace, es_name, uid);
        if let Some(es) = &cached {
            let written = me.written.lock().unwrap_or_else(PoisonError::into_inner);
            let generation = es.metadata.generation.unwrap_or_default();
            if written.get(&key) == Some(&(uid.to_string(), digest, generation)) {
                return Ok(());
            }
        }
        if !me.leading() {
            return Err(Failure::Retry);
        }
        let mut body = body.clone();
        body["metadata"]["namespace"] = json!(namespace);
        if me.parts.dry_run {
            info!(%namespace, external_secret = %es_name, "dry run: would write the ExternalSecret");
            return Ok(());
        }
        let api: Api<ExternalSecret> = Api::namespaced(me.parts.client.clone(), namespace);
        let resource_version = match cached {
            Some(es) => es.resource_version().unwrap_or_default(),
            None => match self.create(&api, namespace, es_name, uid, &body).await? {
                Created::New(generation) => {
                    me.remember(key, uid, digest, generation);
                    return Ok(());
                }
                Created::Ours(rv) => rv,
            },
        };
        // A precondition: the apply fails with 409 when the object changed since it was read,
        // so an ExternalSecret deleted and re-created by someone else is never taken over.
        body["metadata"]["resourceVersion"] = json!(resource_version);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        match api.patch(es_name, &params, &Patch::Apply(&body)).await {
            Ok(written) => {
                let generation = written.metadata.generation.unwrap_or_default();
                me.remember(key, uid, digest, generation);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Err(Failure::Retry),
            Err(e) => Err(Failure::Refused(format!(
                "the ExternalSecret cannot be written: {}",
                describe(&e)
            ))),
        }
    }

    /// The cached ExternalSecret `es_name` in `namespace` when the object of `uid` owns it.
    fn owned_copy(
        &self,
        namespace: &str,
        es_name: &str,
        uid: &str,
    ) -> Option<Arc<PartialObjectMeta<ExternalSecret>>> {
        self.owned
            .get(&ObjectRef::new(es_name).within(namespace))
            .filter(|es| controller_uid(es.owner_references()) == Some(uid))
    }

    /// Creates the ExternalSecret; when one of that name exists, tells whether it is this
    /// object's (then it is updated) or refuses.
    async fn create(
        &self,
        api: &Api<ExternalSecret>,
        namespace: &str,
        es_name: &str,
        uid: &str,
        body: &Value,
    ) -> Result<Created, Failure> {
        let typed: ExternalSecret = serde_json::from_value(body.clone())
            .map_err(|e| Failure::Refused(format!("the ExternalSecret cannot be built: {e}")))?;
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        match api.create(&params, &typed).await {
            Ok(created) => {
                info!(%namespace, external_secret = %es_name, "ExternalSecret created for a ClusterExternalSecret");
                Ok(Created::New(
                    created.metadata.generation.unwrap_or_default(),
                ))
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let meta: Api<PartialObjectMeta<ExternalSecret>> =
                    Api::namespaced(self.me.parts.client.clone(), namespace);
                match meta.get_metadata_opt(es_name).await {
                    Ok(Some(existing)) => {
                        if controller_uid(existing.owner_references()) == Some(uid) {
                            return Ok(Created::Ours(
                                existing.resource_version().unwrap_or_default(),
                            ));
                        }
                        Err(Failure::Refused(foreign(existing.owner_references())))
                    }
                    // Gone again since: the next attempt creates it.
                    Ok(None) => Err(Failure::Retry),
                    Err(e) => Err(Failure::Refused(format!(
                        "an ExternalSecret of that name exists and cannot be read: {}",
                        describe(&e)
                    ))),
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Err(Failure::Refused(
                "the namespace does not exist (any more)".into(),
            )),
            Err(e) => Err(Failure::Refused(format!(
                "the ExternalSecret cannot be created: {}",
                describe(&e)
            ))),
        }
    }

    /// Deletes an owned ExternalSecret that is no longer wanted (only the object that was
    /// seen: its uid is a precondition). `false` when it should be tried again.
    async fn delete(&self, gone: &Owned) -> bool {
        let me = &self.me;
        if !me.leading() {
            return false;
        }
        if me.parts.dry_run {
            info!(namespace = %gone.namespace, external_secret = %gone.name, "dry run: would delete the ExternalSecret");
            return true;
        }
        let api: Api<ExternalSecret> = Api::namespaced(me.parts.client.clone(), &gone.namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(gone.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let done = match api.delete(&gone.name, &params).await {
            Ok(_) => {
                info!(namespace = %gone.namespace, external_secret = %gone.name, "ExternalSecret of a ClusterExternalSecret deleted: its namespace no longer matches");
                true
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => true,
            Err(e) => {
                warn!(namespace = %gone.namespace, external_secret = %gone.name, error = %describe(&e), "cannot delete the ExternalSecret of a ClusterExternalSecret");
                false
            }
        };
        if done {
            me.written
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&(gone.namespace.clone(), gone.name.clone()));
        }
        done
    }
}

impl CesController {
    fn remember(&self, key: (String, String), uid: &str, digest: u64, generation: i64) {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, (uid.to_string(), digest, generation));
    }
}

/// How a create ended when it did not fail.
enum Created {
    /// Created now; its generation.
    New(i64),
    /// It existed and is this object's; its resourceVersion.
    Ours(String),
}

/// Why one namespace did not get its ExternalSecret.
enum Failure {
    /// Something changed meanwhile: try again soon.
    Retry,
    /// Reported in `status.failedNamespaces`.
    Refused(String),
}

fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => other.to_string(),
    }
}
