//! `deletionPolicy: Delete`: what a PushSecret no longer pushes (an entry, a property or a store
//! dropped from its spec) is deleted, and only that; the finalizer is added while the policy asks
//! for it, and released once what was pushed is deleted, or past the cleanup timeout (a deletion
//! never waits on Latchkey for longer).

use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use serde_json::json;
use tracing::{info, warn};

use super::helpers::{bounded, describe, parse_store_key};
use super::{DELETE_FAILED, FINALIZER, PushController, PushSecretError, RETRY};
use std::collections::BTreeMap;

use crate::api::push_secret::{PushDeletionPolicy, PushSecret, SyncedPush};
use crate::catalog::Lenient;
use crate::push_secret::pushers::fake_store_id;
use k8s_openapi::jiff::Timestamp;
use kube::Api;

impl PushController {
    /// Adds (`on`) or removes the finalizer, guarded by the resourceVersion read.
    pub(super) async fn set_finalizer(
        &self,
        object: &PushSecret,
        namespace: &str,
        name: &str,
        on: bool,
    ) -> Result<(), PushSecretError> {
        if self.parts.dry_run || !self.leading() {
            return Ok(());
        }
        let mut finalizers: Vec<&String> = object
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .collect();
        let ours = FINALIZER.to_string();
        if on {
            finalizers.push(&ours);
        }
        let patch = json!({"metadata": {
            "finalizers": finalizers,
            "resourceVersion": object.resource_version(),
        }});
        let api: Api<Lenient<PushSecret>> = Api::namespaced(self.parts.client.clone(), namespace);
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(PushSecretError::Write {
                namespace: namespace.into(),
                name: name.into(),
                what: "finalizers",
                reason: describe(&e),
            }),
        }
    }

    /// Deletes what was pushed (as listed in the status), then releases the finalizer; past
    /// `cleanup_timeout` since the deletion, releases it anyway and logs what is left.
    pub(super) async fn finalize(
        &self,
        object: &PushSecret,
        namespace: &str,
        name: &str,
    ) -> Result<Action, PushSecretError> {
        if !self.leading() {
            return Ok(Action::requeue(RETRY));
        }
        let who = format!("PushSecret {namespace}/{name}");
        let mut failures = Vec::new();
        let synced = object
            .status
            .as_ref()
            .map(|s| s.synced_push_secrets.clone())
            .unwrap_or_default();
        if object.spec.deletion_policy == PushDeletionPolicy::Delete {
            for (key, remotes) in &synced {
                let Some((kind, store)) = parse_store_key(key) else {
                    continue;
                };
                let id = fake_store_id(kind, namespace, store);
                let pusher = match self.pusher(object, namespace, kind, store).await {
                    Ok((p, _)) => p,
                    Err((_, why)) => {
                        failures.push(format!("{who}, {key}: {why}"));
                        continue;
                    }
                };
                for (remote, entry) in remotes {
                    if self.parts.dry_run {
                        info!(store = %id, remote_key = %remote, "dry run: would delete");
                        continue;
                    }
                    match pusher.delete(remote, &entry.properties).await {
                        Ok(()) => {
                            self.forget(&id, remote);
                            info!(push_secret = %name, %namespace, store = %key, remote_key = %remote, "pushed remote secret deleted");
                        }
                        Err(e) => {
                            failures.push(format!("{who}, {key}, remote key {remote:?}: {e}"))
                        }
                    }
                }
            }
        }
        if !failures.is_empty() {
            let message = bounded(failures.join("; "));
            let since = object
                .metadata
                .deletion_timestamp
                .as_ref()
                .map(|t| Timestamp::now().duration_since(t.0).unsigned_abs())
                .unwrap_or_default();
            if since < self.parts.cleanup_timeout {
                self.warn(object, DELETE_FAILED, &message);
                return Ok(Action::requeue(RETRY));
            }
            warn!(push_secret = %name, %namespace, %message, "giving up deleting what was pushed after the cleanup timeout; releasing the finalizer, the remote secrets above are left in their stores");
        }
        self.set_finalizer(object, namespace, name, false).await?;
        Ok(Action::await_change())
    }

    /// Deletes what `before` lists and `synced` (this push) no longer does: whole remote
    /// secrets, or properties dropped from one. What cannot be deleted stays listed in `synced`
    /// (so it is tried again) and is reported in `failures`.
    pub(super) async fn prune(
        &self,
        object: &PushSecret,
        namespace: &str,
        before: &BTreeMap<String, BTreeMap<String, SyncedPush>>,
        synced: &mut BTreeMap<String, BTreeMap<String, SyncedPush>>,
        failures: &mut Vec<(&'static str, String)>,
    ) {
        let who = format!("PushSecret {namespace}/{}", object.name_any());
        for (key, remotes) in before {
            let now = synced.get(key);
            let gone: Vec<(&String, &SyncedPush, Vec<String>)> = remotes
                .iter()
                .filter_map(|(remote, entry)| match now.and_then(|n| n.get(remote)) {
                    None => Some((remote, entry, entry.properties.clone())),
                    // A whole secret, before or now: the push replaced it as a whole.
                    Some(current)
                        if entry.properties.is_empty() || current.properties.is_empty() =>
                    {
                        None
                    }
                    Some(current) => {
                        let removed: Vec<String> = entry
                            .properties
                            .iter()
                            .filter(|p| !current.properties.contains(p))
                            .cloned()
                            .collect();
                        (!removed.is_empty()).then_some((remote, entry, removed))
                    }
                })
                .collect();
            if gone.is_empty() || self.parts.dry_run || !self.leading() {
                continue;
            }
            let Some((kind, store)) = parse_store_key(key) else {
                continue;
            };
            let id = fake_store_id(kind, namespace, store);
            let pusher = self
                .pusher(object, namespace, kind, store)
                .await
                .map(|(p, _)| p);
            for (remote, entry, properties) in gone {
                let result = match &pusher {
                    Ok(p) => p
                        .delete(remote, &properties)
                        .await
                        .map_err(|e| (e.reason(), e.to_string())),
                    Err((reason, why)) => Err((*reason, why.clone())),
                };
                match result {
                    Ok(()) => {
                        if properties.len() == entry.properties.len() {
                            self.forget(&id, remote);
                        }
                        info!(push_secret = %object.name_any(), %namespace, store = %key, remote_key = %remote, ?properties, "no longer pushed: deleted");
                    }
                    Err(("StoreNotFound", why)) if !synced.contains_key(key) => {
                        // A store dropped from the spec and deleted: nothing left to write to.
                        warn!(push_secret = %object.name_any(), %namespace, store = %key, remote_key = %remote, %why, "no longer pushed, and its store is gone: left as it is");
                    }
                    Err((reason, why)) => {
                        failures.push((reason, format!("{who}, {key}, remote key {remote:?}: deleting what is no longer pushed: {why}")));
                        // Listed again, with the properties still to delete.
                        let slot = synced.entry(key.clone()).or_default();
                        match slot.get_mut(remote) {
                            Some(current) => {
                                current.properties.extend(properties);
                                current.properties.sort();
                                current.properties.dedup();
                            }
                            None => {
                                slot.insert(remote.clone(), entry.clone());
                            }
                        }
                    }
                }
            }
        }
    }
}
