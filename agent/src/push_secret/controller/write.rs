//! Writing a PushSecret's planned remote secrets into its selected stores: each store's pusher
//! made first, the entries' settings checked against what the stores use, then every remote
//! secret pushed unless unchanged, with the status entries to keep.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;
use tracing::{debug, info};

use super::helpers::describe_targets;
use super::{MAX_ENTRIES, PushController};
use crate::api::StoreKind;
use crate::api::push_secret::{
    PushSecret, PushSecretStatus, PushSecretStoreRef, PushUpdatePolicy, SyncedPush,
};
use crate::providers::push::{PushPolicy, Pushed, Pusher};
use crate::push_secret::plan::{self, RemoteWrite};
use crate::push_secret::pushers::fake_store_id;

/// What writing the stores gave.
pub(super) struct Written {
    /// The status entries to keep, by store then remote key.
    pub synced: BTreeMap<String, BTreeMap<String, SyncedPush>>,
    /// Whether anything was written.
    pub wrote: bool,
    /// Stores that took every write: a generated value is replaced only once all have it.
    pub delivered: BTreeSet<String>,
}

impl PushController {
    /// Pushes `writes` into `stores`, adding what failed to `failures`; `previous` is the
    /// status read, whose entries stay for what was not written now.
    pub(super) async fn write_stores(
        &self,
        object: &PushSecret,
        stores: &[(StoreKind, String)],
        writes: &[RemoteWrite],
        previous: &PushSecretStatus,
        failures: &mut Vec<(&'static str, String)>,
    ) -> Written {
        let namespace = object.namespace().unwrap_or_default();
        let who = format!("PushSecret {namespace}/{}", object.name_any());
        let targets = describe_targets(object);
        let if_not_exists = object.spec.update_policy == PushUpdatePolicy::IfNotExists;
        let mut synced = BTreeMap::new();
        let mut wrote = false;
        // Stores that took every write: a generated value is replaced only once all have it.
        let mut delivered = BTreeSet::new();
        let mut pushers = Vec::new();
        for (kind, store) in stores {
            pushers.push(self.pusher(object, &namespace, *kind, store).await);
        }
        // Each store uses its provider's fields of the entries' metadata and ignores the
        // others; a field no store uses is a mistake, refused before anything is written (a
        // store that could not be made may be the one using it: then nothing is refused).
        let used: BTreeSet<&str> = pushers
            .iter()
            .flatten()
            .flat_map(|(p, _)| p.metadata_fields().iter().copied())
            .collect();
        let unused = pushers
            .iter()
            .all(Result::is_ok)
            .then(|| plan::unused_metadata(writes, &used))
            .flatten();
        if let Some(e) = &unused {
            failures.push((
                e.reason(),
                format!("{who}: nothing pushed to {targets}: {e}"),
            ));
        }
        for ((kind, store), made) in stores.iter().zip(pushers) {
            let (kind, store) = (*kind, store.as_str());
            let key = PushSecretStoreRef::status_key_of(kind, store);
            let before = previous
                .synced_push_secrets
                .get(&key)
                .cloned()
                .unwrap_or_default();
            let id = fake_store_id(kind, &namespace, store);
            let mut now = BTreeMap::new();
            match made {
                _ if unused.is_some() => now = before,
                Err((reason, why)) => {
                    failures.push((reason, format!("{who}, {key}: {why}")));
                    now = before;
                }
                Ok((pusher, adopt)) => {
                    // Over what Latchkey did not create only with `Replace` and the store's
                    // consent (`spec.push.adoptExisting`).
                    let policy = PushPolicy {
                        if_not_exists,
                        adopt: adopt && !if_not_exists,
                    };
                    let failed_before = failures.len();
                    // Settings this store cannot write (a label that is no label, another
                    // namespace) fail it before any write: it gets all of the PushSecret, or
                    // nothing.
                    let refused: Vec<_> = writes
                        .iter()
                        .filter_map(|w| pusher.check_metadata(&w.metadata).err().map(|e| (w, e)))
                        .collect();
                    for (write, e) in &refused {
                        let at = format!("{who}, {key}, remote key {:?}", write.remote_key);
                        failures.push((e.reason(), format!("{at}: {e}")));
                    }
                    let writes = if refused.is_empty() { writes } else { &[] };
                    if !refused.is_empty() {
                        now = before.clone();
                    }
                    for write in writes {
                        let at = format!("{who}, {key}, remote key {:?}", write.remote_key);
                        match self
                            .push_one(&*pusher, &id, write, policy, before.get(&write.remote_key))
                            .await
                        {
                            Ok((entry, written)) => {
                                wrote |= written;
                                if let Some(entry) = entry {
                                    now.insert(write.remote_key.clone(), entry);
                                }
                            }
                            Err((reason, why)) => {
                                failures.push((reason, format!("{at}: {why}")));
                                if let Some(entry) = before.get(&write.remote_key) {
                                    now.insert(write.remote_key.clone(), entry.clone());
                                }
                            }
                        }
                    }
                    if failures.len() == failed_before {
                        delivered.insert(key.clone());
                    }
                }
            }
            if !now.is_empty() {
                synced.insert(key, now);
            }
        }
        Written {
            synced,
            wrote,
            delivered,
        }
    }

    /// Pushes one remote secret unless unchanged: the status entry to keep and whether a
    /// write happened.
    async fn push_one(
        &self,
        pusher: &dyn Pusher,
        store_id: &str,
        write: &RemoteWrite,
        policy: PushPolicy,
        before: Option<&SyncedPush>,
    ) -> Result<(Option<SyncedPush>, bool), (&'static str, String)> {
        let key = (store_id.to_string(), write.remote_key.clone());
        if self.recorded.unchanged(store_id, write) {
            let last = self.entries().get(&key).cloned();
            if let Some(entry) = last.or_else(|| before.cloned()) {
                return Ok((Some(entry), false));
            }
        }
        if self.parts.dry_run {
            info!(store = %store_id, remote_key = %write.remote_key, "dry run: would push");
            return Ok((before.cloned(), false));
        }
        if !self.leading() {
            return Err(("NotLeading", "this replica stopped leading".into()));
        }
        let pushed = pusher.push_with(&write.remote_key, &write.value, policy, &write.metadata);
        let (version, written) = match pushed.await {
            Ok(Pushed::Written { version }) => (version, true),
            // Ours and already as it should be (after a restart, say): listed like a write.
            Ok(Pushed::Unchanged { version }) => (version, false),
            // Not written by this push: only what an earlier push of ours wrote is listed
            // (and would be deleted).
            Ok(Pushed::Kept) => return Ok((before.cloned(), false)),
            Err(e) => {
                self.forget(store_id, &write.remote_key);
                return Err((e.reason(), e.to_string()));
            }
        };
        self.recorded.written(store_id, write);
        debug!(store = %store_id, remote_key = %write.remote_key, %version, written, "pushed");
        let entry = SyncedPush {
            properties: write.properties(),
            // Vault KV v1 and plugins over ESS answer none.
            version: (!version.is_empty()).then_some(version),
        };
        let mut entries = self.entries();
        if entries.len() >= MAX_ENTRIES && !entries.contains_key(&key) {
            // As the fingerprints: starting over costs a write each, never a change.
            entries.clear();
        }
        entries.insert(key, entry.clone());
        Ok((Some(entry), written))
    }
}
