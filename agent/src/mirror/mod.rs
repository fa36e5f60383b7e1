//! The mirror controller: ExternalSecrets whose `spec.target.creationPolicy` asks for it are
//! written into Kubernetes Secrets, for workloads that can only read Secrets. ExternalSecrets left
//! at `creationPolicy: None` are mount-only and never touched.
//!
//! It shares the node agent's binding, tenancy, fetch path, value cache and providers; it has no
//! pod, so it acts as each ExternalSecret's `spec.serviceAccountName` with tokens it mints
//! ([`tokens`]). Secrets it writes are watched by metadata only (a label selects them), so no
//! Secret value of the cluster is held in its memory. Only the replica holding the Lease
//! ([`leader`]) runs the controllers, and every write checks that it still does.

pub mod catalog;
pub mod consent;
pub mod desired;
pub mod generated;
pub mod leader;
pub mod ownership;
pub mod reconcile;
pub mod status;
pub mod stores;
pub mod tokens;

use std::sync::Arc;

use futures::{FutureExt, StreamExt, future};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{
    Action, Config as ControllerConfig, Controller, Error as ControllerError,
};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tracing::{debug, warn};

use crate::api::ExternalSecret;
use crate::catalog::Lenient;
use leader::Leadership;
use reconcile::{MirrorError, Reconciler};

/// How often what is remembered of deleted ExternalSecrets is dropped.
const SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(600);
/// How long in-flight reconciles may take to finish once leadership is lost or a stop asked for.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Which ExternalSecrets one controller process serves.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// Namespaces to serve; empty: all.
    pub namespaces: Vec<String>,
    /// Label selector on ExternalSecrets (`team=shop`), to split a cluster between instances.
    pub selector: Option<String>,
    /// Reconciles run at once.
    pub concurrency: u16,
}

/// Runs the controllers while this replica leads, until `stop` completes: the mirror over
/// ExternalSecrets, and the status of stores ([`stores`]).
pub async fn run(
    client: Client,
    scope: Scope,
    reconciler: Arc<Reconciler>,
    store_status: Arc<stores::StatusWriter>,
    mut leadership: Leadership,
    metrics: Arc<crate::telemetry::Metrics>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let stop = Box::pin(stop).shared();
    loop {
        tokio::select! {
            // Stopping wins over a leadership that has not yet noticed the stop.
            biased;
            _ = stop.clone() => return,
            _ = leadership.wait_for(true) => {}
        }
        metrics.mirror_leader.set(1);
        let mut lost = leadership.clone();
        let lost = async move { lost.wait_for(false).await };
        let ended = future::select(Box::pin(lost), stop.clone())
            .map(|_| ())
            .shared();
        let namespaces: Vec<Option<String>> = if scope.namespaces.is_empty() {
            vec![None]
        } else {
            scope.namespaces.iter().cloned().map(Some).collect()
        };
        let controllers: Vec<_> = namespaces
            .iter()
            .map(|namespace| controller(&client, namespace.as_deref(), &scope))
            .collect();
        let seen: Vec<Store<Lenient<ExternalSecret>>> =
            controllers.iter().map(Controller::store).collect();
        let runs = controllers.into_iter().map(|controller| {
            let reconciler = Arc::clone(&reconciler);
            controller
                .graceful_shutdown_on(ended.clone())
                .run(
                    |es, r: Arc<Reconciler>| r.reconcile(es),
                    error_policy,
                    Arc::clone(&reconciler),
                )
                .for_each(move |result| {
                    match result {
                        // A reconcile scheduled for an ExternalSecret deleted since.
                        Err(ControllerError::ObjectNotFound(gone)) => reconciler.forget_deleted(
                            gone.namespace.as_deref().unwrap_or_default(),
                            &gone.name,
                        ),
                        Err(error) => debug!(%error, "reconcile not run"),
                        Ok(_) => {}
                    }
                    future::ready(())
                })
        });
        let runs = future::join3(
            future::join_all(runs),
            sweep(seen, Arc::clone(&reconciler), ended.clone()),
            stores::run(
                &client,
                &scope.namespaces,
                Arc::clone(&store_status),
                ended.clone(),
            ),
        );
        tokio::pin!(runs);
        tokio::select! {
            _ = &mut runs => {}
            _ = ended.clone() => {
                // In-flight reconciles may finish (every write checks leadership first), but no
                // longer than this: a controller stopped before its first list completes would
                // wait for that list forever.
                let _ = tokio::time::timeout(SHUTDOWN_GRACE, &mut runs).await;
            }
        }
        metrics.mirror_leader.set(0);
    }
}

/// Every [`SWEEP_INTERVAL`], forgets ExternalSecrets the controllers no longer see. Deletions
/// are not reconciled (kube-runtime drops them), and one that is never requeued (refreshPolicy
/// OnChange or CreatedOnce, a Secret that is not owned) would otherwise be remembered forever.
async fn sweep(
    stores: Vec<Store<Lenient<ExternalSecret>>>,
    reconciler: Arc<Reconciler>,
    ended: impl std::future::Future<Output = ()>,
) {
    let sweeping = async {
        // Before the first list completes every ExternalSecret would look deleted.
        for store in &stores {
            if store.wait_until_ready().await.is_err() {
                return;
            }
        }
        loop {
            tokio::time::sleep(SWEEP_INTERVAL).await;
            reconciler.retain(|namespace, name| {
                let at = ObjectRef::new(name).within(namespace);
                stores.iter().any(|store| store.get(&at).is_some())
            });
        }
    };
    tokio::select! {
        _ = sweeping => {}
        _ = ended => {}
    }
}

/// One controller over the ExternalSecrets of `namespace` (all when `None`), triggered also by
/// changes to the Secrets it wrote, seen by metadata only.
fn controller(
    client: &Client,
    namespace: Option<&str>,
    scope: &Scope,
) -> Controller<Lenient<ExternalSecret>> {
    let (externals, secrets): (Api<Lenient<ExternalSecret>>, Api<PartialObjectMeta<Secret>>) =
        match namespace {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
            ),
            None => (Api::all(client.clone()), Api::all(client.clone())),
        };
    let mut selected = watcher::Config::default();
    if let Some(selector) = &scope.selector {
        selected = selected.labels(selector);
    }
    let managed = watcher::Config::default().labels(&format!("{}=true", desired::MANAGED_LABEL));
    // The store keeps every ExternalSecret for as long as it exists: only what a reconcile
    // reads goes in (see `compact`).
    let (reader, writer) = reflector::store();
    let watched = watcher(externals, selected)
        .modify(compact)
        .reflect(writer)
        .applied_objects();
    Controller::for_stream(watched, reader)
        .with_config(ControllerConfig::default().concurrency(scope.concurrency))
        // `PartialObjectMeta` makes the watch metadata-only: no Secret value is ever sent here.
        .watches(secrets, managed, |secret| {
            // The annotation names the ExternalSecret, in the Secret's own namespace.
            let namespace = secret.metadata.namespace.clone()?;
            let name = secret
                .metadata
                .annotations
                .as_ref()?
                .get(desired::EXTERNAL_SECRET_ANNOTATION)?
                .clone();
            Some(ObjectRef::new(&name).within(&namespace))
        })
}

/// Drops what no reconcile reads from an ExternalSecret before the controller stores it: of the
/// metadata, all but its identity, generation and resourceVersion. `managedFields` (one entry
/// per writer, the controller's own status writes among them, each parsed into a tree of JSON
/// maps), labels and annotations (`kubectl`'s last applied configuration repeats the whole
/// object) are read by no reconcile; the label selector is applied by the server.
fn compact(object: &mut Lenient<ExternalSecret>) {
    let metadata = match object {
        // Just deserialized, so not shared: `make_mut` does not copy.
        Lenient::Usable(es) => &mut Arc::make_mut(es).metadata,
        Lenient::Unusable { metadata, .. } => &mut **metadata,
    };
    *metadata = ObjectMeta {
        name: metadata.name.take(),
        namespace: metadata.namespace.take(),
        uid: metadata.uid.take(),
        generation: metadata.generation,
        resource_version: metadata.resource_version.take(),
        ..ObjectMeta::default()
    };
}

/// A reconcile that failed outright (the API server did not answer): retried after a pause; the
/// Secret and status are as they were.
fn error_policy(
    es: Arc<Lenient<ExternalSecret>>,
    error: &MirrorError,
    _: Arc<Reconciler>,
) -> Action {
    let name = kube::ResourceExt::name_any(&*es);
    warn!(external_secret = %name, %error, "reconcile failed; retrying");
    Action::requeue(reconcile::RETRY_FLOOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ExternalSecret as a real API server sends it after `kubectl apply --server-side` and
    /// one status write by the controller.
    fn as_listed() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
            "metadata": {
                "name": "creds", "namespace": "shop", "uid": "uid-1", "generation": 2,
                "resourceVersion": "42", "creationTimestamp": "2026-11-28T20:00:00Z",
                "labels": {"team": "shop"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                "managedFields": [
                    {"manager": "kubectl", "operation": "Apply", "apiVersion": "latchkey.dev/v1alpha1",
                     "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:refreshInterval": {}}}},
                    {"manager": "", "operation": "Update", "subresource": "status",
                     "apiVersion": "latchkey.dev/v1alpha1", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:status": {"f:conditions": {}}}}
                ]
            },
            "spec": {"secretStoreRef": {"name": "vault"}, "refreshInterval": "1h",
                     "data": [{"secretKey": "password", "remoteRef": {"key": "shop/db"}}],
                     "target": {"creationPolicy": "Owner"}},
            "status": {"syncedResourceVersion": "2",
                       "conditions": [{"type": "Ready", "status": "True", "reason": "SecretSynced"}]}
        })
    }

    #[test]
    fn the_store_keeps_what_a_reconcile_reads() {
        let mut object: Lenient<ExternalSecret> = serde_json::from_value(as_listed()).unwrap();
        compact(&mut object);
        let Lenient::Usable(es) = &object else {
            panic!("compact changed the variant");
        };
        let meta = &es.metadata;
        assert_eq!(meta.name.as_deref(), Some("creds"));
        assert_eq!(meta.namespace.as_deref(), Some("shop"));
        assert_eq!(meta.uid.as_deref(), Some("uid-1"));
        assert_eq!(meta.generation, Some(2));
        assert_eq!(meta.resource_version.as_deref(), Some("42"));
        assert!(meta.managed_fields.is_none());
        assert!(meta.annotations.is_none() && meta.labels.is_none());
        assert!(meta.creation_timestamp.is_none());
        // Spec and status are untouched.
        let full: ExternalSecret = serde_json::from_value(as_listed()).unwrap();
        assert_eq!(
            serde_json::to_value(&es.spec).unwrap(),
            serde_json::to_value(&full.spec).unwrap()
        );
        assert_eq!(
            serde_json::to_value(&es.status).unwrap(),
            serde_json::to_value(&full.status).unwrap()
        );
    }

    #[test]
    fn an_unusable_object_keeps_its_identity_only() {
        let mut listed = as_listed();
        listed["spec"]["refreshInterval"] = serde_json::json!({"not": "a string"});
        let mut object: Lenient<ExternalSecret> = serde_json::from_value(listed).unwrap();
        compact(&mut object);
        let Lenient::Unusable { metadata, reason } = &object else {
            panic!("expected an unusable object");
        };
        assert!(reason.contains("refreshInterval"), "{reason}");
        assert_eq!(metadata.name.as_deref(), Some("creds"));
        assert_eq!(metadata.resource_version.as_deref(), Some("42"));
        assert!(metadata.managed_fields.is_none() && metadata.annotations.is_none());
    }
}
