//! The stores a PushSecret writes: named, or selected by label (SecretStores of its namespace,
//! ClusterSecretStores that admit it), each once and at most [`MAX_PUSH_SELECTED_STORES`]; and
//! each store as its namespace may use it: found, admitted (a ClusterSecretStore's conditions),
//! its provider inline or by `providerRef` (resolved and checked as a publish does), and the
//! writer for it as the PushSecret's service account.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt, stream};
use tokio::sync::mpsc;

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use super::PushController;
use crate::api::push_secret::{PushSecret, PushSecretStoreRef};
use crate::api::rules::MAX_PUSH_SELECTED_STORES;
use crate::api::{CredentialScope, StoreKind, validate};
use crate::catalog::binding::{
    BoundStore, ProviderResolution, admits, provider_spec, resolve_provider,
};
use crate::catalog::{Catalog, CatalogError, Lenient};
use crate::providers::push::Pusher;
use crate::push_secret::pushers::StoreTarget;

/// A failure: its condition reason and message (store named, never a value).
type Failed = (&'static str, String);

/// The stores a PushSecret writes now.
#[derive(Debug, Default)]
pub(super) struct Selection {
    /// Each store once, in the order of the refs (a selector's in name order).
    pub stores: Vec<(StoreKind, String)>,
    /// Refs that selected nothing, or could not be expanded.
    pub failures: Vec<Failed>,
    /// Kinds with a selector that could not be expanded (catalog not listed, too many stores):
    /// what was pushed to stores of these kinds is kept as it is, never pruned as if they had
    /// stopped matching.
    pub unresolved: BTreeSet<String>,
}

impl Selection {
    fn has(&self, kind: StoreKind, name: &str) -> bool {
        self.stores.iter().any(|(k, n)| *k == kind && n == name)
    }

    fn add(&mut self, kind: StoreKind, name: &str) {
        if !self.has(kind, name) {
            self.stores.push((kind, name.to_string()));
        }
    }

    /// Whether what was pushed to the store `status_key` must be kept although it is not
    /// written now.
    pub fn keeps(&self, status_key: &str) -> bool {
        self.unresolved
            .iter()
            .any(|kind| status_key.starts_with(&format!("{kind}/")))
    }
}

/// Most stores whose labels are remembered per watch; past it the record starts over (every
/// store then counts as changed once: a push of unchanged data costs no write).
const MAX_REMEMBERED_STORES: usize = 100_000;

/// The labels last seen per store, so that a store watch starts pushes only when a store's
/// labels change (or a store appears), not on every change of its spec or status.
#[derive(Debug, Default)]
pub(super) struct StoreLabels(Mutex<HashMap<String, BTreeMap<String, String>>>);

impl StoreLabels {
    /// Whether `labels` differ from what was last seen for the store `key`; remembers them.
    pub fn changed(&self, key: String, labels: &BTreeMap<String, String>) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if seen.get(&key) == Some(labels) {
            return false;
        }
        if seen.len() >= MAX_REMEMBERED_STORES && !seen.contains_key(&key) {
            seen.clear();
        }
        seen.insert(key, labels.clone());
        true
    }
}

/// How long after a store's label change the PushSecrets it concerns are started again.
const ECHO_DELAY: Duration = Duration::from_secs(1);
/// Label changes waiting for their second start; past it one is dropped (the first start
/// happened, and the refresh catches up).
const MAX_ECHOES: usize = 256;

/// The PushSecrets a store's label change started, started again [`ECHO_DELAY`] later: their
/// selection reads the catalog's own watch of the stores, which may see the change only after
/// this watch did (so the first start can find the old labels).
#[derive(Clone)]
pub(super) struct Echo(mpsc::Sender<(Instant, Vec<ObjectRef<Lenient<PushSecret>>>)>);

impl Echo {
    /// The sender, and the stream of the PushSecrets to start again, each at its time.
    pub fn new() -> (
        Self,
        impl Stream<Item = ObjectRef<Lenient<PushSecret>>> + Send + 'static,
    ) {
        let (tx, rx) = mpsc::channel(MAX_ECHOES);
        let later = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) })
            .then(|(at, refs)| async move {
                tokio::time::sleep_until(tokio::time::Instant::from_std(at + ECHO_DELAY)).await;
                stream::iter(refs)
            })
            .flatten();
        (Self(tx), later)
    }

    /// `refs` again, [`ECHO_DELAY`] from now; returns them for the first start.
    pub fn and_later(
        &self,
        refs: Vec<ObjectRef<Lenient<PushSecret>>>,
    ) -> Vec<ObjectRef<Lenient<PushSecret>>> {
        if !refs.is_empty() {
            let _ = self.0.try_send((Instant::now(), refs.clone()));
        }
        refs
    }
}

/// The PushSecrets that select stores of `kind` by label (for a SecretStore, those of its
/// `namespace`): the ones a change of that store's labels may concern.
pub(super) fn selecting(
    seen: &Store<Lenient<PushSecret>>,
    kind: StoreKind,
    namespace: Option<&str>,
) -> Vec<ObjectRef<Lenient<PushSecret>>> {
    seen.state()
        .iter()
        .filter(|p| match p.as_ref() {
            Lenient::Usable(o) => {
                (kind == StoreKind::ClusterSecretStore || o.namespace().as_deref() == namespace)
                    && o.spec
                        .secret_store_refs
                        .iter()
                        .any(|r| r.kind == kind && r.label_selector.is_some())
            }
            Lenient::Unusable { .. } => false,
        })
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

impl PushController {
    /// The stores `object` writes: named refs as they are, each `labelSelector` expanded into
    /// the stores of its kind that match (and, for ClusterSecretStores, admit `namespace`).
    /// A selector that would take the PushSecret over [`MAX_PUSH_SELECTED_STORES`] stores adds
    /// none of them: it fails, named in the condition, rather than writing a partial set.
    pub(super) async fn select_stores(&self, object: &PushSecret, namespace: &str) -> Selection {
        let who = format!("PushSecret {namespace}/{}", object.name_any());
        let refs = &object.spec.secret_store_refs;
        let mut selection = Selection::default();
        for r in refs {
            if let Some(name) = &r.name {
                selection.add(r.kind, name);
            }
        }
        for (i, r) in refs.iter().enumerate() {
            let (None, Some(selector)) = (&r.name, &r.label_selector) else {
                continue;
            };
            let at = format!("{who}, secretStoreRefs[{i}] {}", r.describe());
            let matched = match self.matching(r, namespace, selector).await {
                Ok(matched) => matched,
                Err((reason, why)) => {
                    selection.failures.push((reason, format!("{at}: {why}")));
                    selection.unresolved.insert(r.kind.to_string());
                    continue;
                }
            };
            if matched.is_empty() {
                selection.failures.push((
                    "NoStoreSelected",
                    format!("{at}: no {} matches; nothing pushed for it", r.kind),
                ));
                continue;
            }
            let new = matched.iter().filter(|n| !selection.has(r.kind, n)).count();
            if selection.stores.len() + new > MAX_PUSH_SELECTED_STORES {
                selection.failures.push((
                    "TooManyStores",
                    format!(
                        "{at}: selects {} stores, which would make {} in all; a PushSecret \
                         writes at most {MAX_PUSH_SELECTED_STORES}: nothing pushed to the stores \
                         it selects (narrow the selector)",
                        matched.len(),
                        selection.stores.len() + new
                    ),
                ));
                selection.unresolved.insert(r.kind.to_string());
                continue;
            }
            for name in &matched {
                selection.add(r.kind, name);
            }
        }
        selection
    }

    /// The stores of `r.kind` `selector` matches that `namespace` may use, by name.
    async fn matching(
        &self,
        r: &PushSecretStoreRef,
        namespace: &str,
        selector: &crate::api::store::LabelSelector,
    ) -> Result<Vec<String>, Failed> {
        let catalog = &*self.parts.catalog;
        let names = catalog
            .stores_matching(r.kind, namespace, selector)
            .await
            .map_err(unavailable)?;
        if r.kind == StoreKind::SecretStore {
            return Ok(names);
        }
        // Only the ClusterSecretStores this namespace may use are selected, under the
        // conditions a named one is checked against; one that cannot be read is kept, so that
        // the push names it rather than leaving it out in silence.
        let labels = catalog
            .namespace_labels(namespace)
            .await
            .map_err(unavailable)?;
        let mut admitted = Vec::with_capacity(names.len());
        for name in names {
            match catalog.cluster_secret_store(&name).await {
                Ok(Some(store)) => {
                    if admits(&store.spec.conditions, namespace, &labels).is_ok() {
                        admitted.push(name);
                    }
                }
                // Deleted since it was listed.
                Ok(None) => {}
                Err(_) => admitted.push(name),
            }
        }
        Ok(admitted)
    }

    /// The store `kind/name` as `object`'s namespace may use it: its writer, and whether it lets
    /// pushes adopt what Latchkey did not create (`spec.push.adoptExisting`).
    pub(super) async fn pusher(
        &self,
        object: &PushSecret,
        namespace: &str,
        kind: StoreKind,
        name: &str,
    ) -> Result<(Arc<dyn Pusher>, bool), Failed> {
        let catalog = &*self.parts.catalog;
        let store = found(catalog, namespace, kind, name).await?;
        let adopt = match &store {
            BoundStore::Namespaced(s) => s.spec.push.as_ref(),
            BoundStore::Cluster(s) => s.spec.push.as_ref(),
            BoundStore::None => None,
        }
        .is_some_and(|p| p.adopt_existing);
        let invalid =
            |e: validate::Invalid| ("InvalidStore", format!("{kind} {name:?} is invalid: {e}"));
        let provider_object = match resolve_provider(catalog, &store, kind, namespace).await {
            Ok(object) => object,
            Err(ProviderResolution::Invalid(e)) => return Err(invalid(e)),
            Err(ProviderResolution::Catalog(e)) => return Err(unavailable(e)),
            Err(ProviderResolution::Missing(provider)) => {
                return Err((
                    "ProviderNotFound",
                    format!(
                        "{kind} {name:?}: its providerRef names {provider}, which does not exist"
                    ),
                ));
            }
        };
        let spec = provider_spec(&store, provider_object.as_deref(), kind).map_err(invalid)?;
        let target = StoreTarget {
            namespace,
            push_secret: &object.name_any(),
            service_account: object.service_account(),
            kind,
            scope: CredentialScope::of(kind, provider_object.as_deref()),
            store: name,
            spec,
        };
        let pusher = self
            .parts
            .pushers
            .pusher(&target)
            .await
            .map_err(|e| (e.reason(), e.to_string()))?;
        Ok((pusher, adopt))
    }
}

fn unavailable(e: CatalogError) -> Failed {
    ("StoreUnavailable", e.to_string())
}

/// The store, if it exists and (a ClusterSecretStore) admits `namespace`.
async fn found(
    catalog: &dyn Catalog,
    namespace: &str,
    kind: StoreKind,
    name: &str,
) -> Result<BoundStore, Failed> {
    let missing = || ("StoreNotFound", format!("{kind} {name:?} not found"));
    match kind {
        StoreKind::SecretStore => {
            let store = catalog
                .secret_store(namespace, name)
                .await
                .map_err(unavailable)?;
            Ok(BoundStore::Namespaced(store.ok_or_else(missing)?))
        }
        StoreKind::ClusterSecretStore => {
            let store = catalog
                .cluster_secret_store(name)
                .await
                .map_err(unavailable)?
                .ok_or_else(missing)?;
            let labels = catalog
                .namespace_labels(namespace)
                .await
                .map_err(unavailable)?;
            admits(&store.spec.conditions, namespace, &labels).map_err(|rule| {
                (
                    "NotAdmitted",
                    format!("{kind} {name:?} does not admit namespace {namespace:?}: {rule}"),
                )
            })?;
            Ok(BoundStore::Cluster(store))
        }
    }
}
