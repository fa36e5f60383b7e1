//! Provider status (issue #41, ESO design 007's provider reconciler): every provider object's
//! `Ready` condition and `observedGeneration`, so `kubectl get lkcpvault` shows whether the agent
//! accepts its spec. Written by the controller's leader; node agents write nothing.
//!
//! `Ready` is the check a mount makes of a referenced object ([`validate::provider_object`]),
//! not a backend login: a provider authenticates with the identity of the pod that mounts (or
//! of the mirrored ExternalSecret's account), and the controller has neither.
//!
//! Only served kinds are watched: the kinds are discovered as the catalog discovers them, again
//! every [`REDISCOVER`], and a kind's watch starts when its CRD appears and stops when it goes.
//! Objects the controller cannot read at all are left alone, as for stores (their status could
//! not be compared, so a write would repeat on every event).

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::{Future, FutureExt, StreamExt, future};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tracing::{debug, info, warn};

use crate::api::provider_kinds::{
    self, KindVisitor, ProviderKind, ProviderResource, ProviderStatus,
};
use crate::api::validate;
use crate::catalog::Lenient;
use crate::catalog::kubernetes::served_provider_kinds;
use crate::mirror::stores::{REASON_INVALID, REASON_VALID};

/// How often the served kinds are discovered again (a CRD installed or removed later).
pub const REDISCOVER: Duration = Duration::from_secs(30);
/// Pause before retrying a status write the API server did not take.
const RETRY: Duration = Duration::from_secs(30);
/// What `Ready: True` means here: the spec, not a login.
const VALID_MESSAGE: &str = "the spec is valid; credentials are checked at each mount, with the \
                             identity of the pod (or of the mirrored ExternalSecret)";

/// The status a provider object calls for, or `None` when `current` already says it: every
/// write is a watch event for every node agent's catalog.
pub fn next(
    current: Option<&ProviderStatus>,
    object: &provider_kinds::ProviderObject,
    generation: Option<i64>,
) -> Option<ProviderStatus> {
    let (status, reason, message) = match validate::provider_object(object) {
        Ok(_) => ("True", REASON_VALID, VALID_MESSAGE.to_string()),
        Err(invalid) => ("False", REASON_INVALID, invalid.to_string()),
    };
    let (conditions, same) = crate::mirror::status::with_ready(
        current.map_or(&[][..], |s| &s.conditions[..]),
        status,
        reason,
        &message,
    );
    if same && current.is_some_and(|s| s.observed_generation == generation) {
        return None;
    }
    Some(ProviderStatus {
        observed_generation: generation,
        conditions,
    })
}

/// Why a provider object's status was not written.
#[derive(Debug, thiserror::Error)]
#[error("{kind} {name}: writing the status: {source}")]
pub struct StatusError {
    kind: String,
    name: String,
    #[source]
    source: kube::Error,
}

/// What the reconcile of one kind needs.
struct Writer<T: ProviderResource> {
    client: Client,
    /// The object's API (its namespace's, for a namespaced kind).
    api: fn(Client, Option<&str>) -> Api<T>,
    dry_run: bool,
    leading: Arc<dyn Fn() -> bool + Send + Sync>,
}

async fn reconcile<T: ProviderResource>(
    object: Arc<Lenient<T>>,
    writer: Arc<Writer<T>>,
) -> Result<Action, StatusError> {
    let Lenient::Usable(object) = &*object else {
        return Ok(Action::await_change());
    };
    let provider = object.provider_object();
    let generation = object.meta().generation;
    let Some(status) = next(object.provider_status(), &provider, generation) else {
        return Ok(Action::await_change());
    };
    let shown = provider.shown();
    if writer.dry_run || !(writer.leading)() {
        debug!(provider = %shown, "provider status not written (dry run or not leader)");
        return Ok(Action::await_change());
    }
    let api = (writer.api)(writer.client.clone(), object.meta().namespace.as_deref());
    let patch = serde_json::json!({ "status": status });
    match api
        .patch_status(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(Action::await_change()),
        // Deleted meanwhile (or its CRD): nothing to report on.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Action::await_change()),
        Err(source) => Err(StatusError {
            kind: T::KIND.name().to_string(),
            name: shown,
            source,
        }),
    }
}

fn error_policy<T: ProviderResource>(
    _: Arc<Lenient<T>>,
    error: &StatusError,
    _: Arc<Writer<T>>,
) -> Action {
    warn!(%error, "provider status not written; retrying");
    Action::requeue(RETRY)
}

/// Starts the status controller of one kind, as a task ended by aborting it.
struct Start<'a> {
    parts: &'a Parts,
}

impl KindVisitor for Start<'_> {
    type Output = Vec<tokio::task::JoinHandle<()>>;

    fn namespaced<T>(self) -> Self::Output
    where
        T: ProviderResource<Scope = k8s_openapi::NamespaceResourceScope>,
    {
        let api: fn(Client, Option<&str>) -> Api<T> = |client, namespace| match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        };
        let watched: Vec<Api<Lenient<T>>> = if self.parts.namespaces.is_empty() {
            vec![Api::all(self.parts.client.clone())]
        } else {
            self.parts
                .namespaces
                .iter()
                .map(|ns| Api::namespaced(self.parts.client.clone(), ns))
                .collect()
        };
        let writer = Arc::new(self.parts.writer(api));
        watched
            .into_iter()
            .map(|watched| tokio::spawn(drive(watched, Arc::clone(&writer))))
            .collect()
    }

    fn cluster<T>(self) -> Self::Output
    where
        T: ProviderResource<Scope = k8s_openapi::ClusterResourceScope>,
    {
        let api: fn(Client, Option<&str>) -> Api<T> = |client, _| Api::all(client);
        let writer = Arc::new(self.parts.writer(api));
        vec![tokio::spawn(drive(
            Api::all(self.parts.client.clone()),
            writer,
        ))]
    }
}

fn drive<T: ProviderResource>(
    api: Api<Lenient<T>>,
    writer: Arc<Writer<T>>,
) -> impl Future<Output = ()> + Send + 'static {
    Controller::new(api, watcher::Config::default())
        .run(reconcile::<T>, error_policy, writer)
        .for_each(|_| future::ready(()))
}

/// What the provider status loop needs.
pub struct Parts {
    /// The controller's API client.
    pub client: Client,
    /// Namespaced provider objects of these namespaces only (all when empty), as `--namespace`.
    pub namespaces: Vec<String>,
    /// Reconcile and log, never write.
    pub dry_run: bool,
    /// Whether this replica leads (only the leader writes).
    pub leading: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl Parts {
    fn writer<T: ProviderResource>(&self, api: fn(Client, Option<&str>) -> Api<T>) -> Writer<T> {
        Writer {
            client: self.client.clone(),
            api,
            dry_run: self.dry_run,
            leading: Arc::clone(&self.leading),
        }
    }
}

/// The running status loops, by (kind, cluster-scoped); aborted when dropped, so a `run` that
/// is itself dropped (leadership lost, shutdown) leaves no watch behind.
#[derive(Default)]
struct Running(HashMap<(ProviderKind, bool), Vec<tokio::task::JoinHandle<()>>>);

impl Drop for Running {
    fn drop(&mut self) {
        for task in self.0.values().flatten() {
            task.abort();
        }
    }
}

/// Runs the status controllers of the served provider kinds until `ended` completes, following
/// CRDs installed and removed meanwhile.
pub async fn run(parts: &Parts, ended: impl Future<Output = ()> + Send) {
    let mut running = Running::default();
    let mut ended = std::pin::pin!(ended.fuse());
    loop {
        match served_provider_kinds(&parts.client).await {
            Ok(served) => {
                running.0.retain(|kind, tasks| {
                    let keep = served.contains(kind);
                    if !keep {
                        info!(
                            kind = kind.0.name(),
                            cluster = kind.1,
                            "provider kind gone; its status loop stops"
                        );
                        tasks.iter().for_each(tokio::task::JoinHandle::abort);
                    }
                    keep
                });
                for kind in served {
                    running.0.entry(kind).or_insert_with(|| {
                        debug!(
                            kind = kind.0.name(),
                            cluster = kind.1,
                            "provider status loop starts"
                        );
                        provider_kinds::visit(kind.0, kind.1, Start { parts })
                    });
                }
            }
            Err(error) => warn!(%error, "provider kinds not discovered; retrying"),
        }
        futures::select! {
            _ = ended.as_mut() => break,
            _ = tokio::time::sleep(REDISCOVER).fuse() => {}
        }
    }
}

#[cfg(test)]
mod tests;
