//! Where GeneratorStates are recorded: the API server in a cluster ([`KubeStates`]), this process's
//! memory in standalone mode ([`MemoryStates`], lost on restart: without an API server there is
//! nobody to clean up after a crash either, so leases then end by their TTL).
//!
//! A state is created with the cleanup finalizer before Generate runs (the intent), gets
//! `spec.state` right after, and goes only through [`StateStore::remove`], after its credential
//! was cleaned up. Kubernetes' garbage collector deletes the states of a deleted pod (owner
//! reference); the finalizer then holds them until the controller has cleaned up.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::api::CLEANUP_FINALIZER;
use crate::api::external_secret::GeneratorRef;
use crate::api::generator::{GeneratorObject, GeneratorState, GeneratorStateSpec};

/// Label: `<Kind>.<name>` of the generator the state is for.
pub const LABEL_GENERATOR: &str = "generators.latchkey.dev/generator";
/// Label: name of the pod the credential was made for.
pub const LABEL_POD: &str = "generators.latchkey.dev/pod";
/// Label: uid of that pod.
pub const LABEL_POD_UID: &str = "generators.latchkey.dev/pod-uid";
/// Label: a short hash of the volume's target path (kubelet's volume ids exceed a label's 63
/// characters).
pub const LABEL_VOLUME: &str = "generators.latchkey.dev/volume";
/// Label: the node whose agent made it.
pub const LABEL_NODE: &str = "generators.latchkey.dev/node";
/// Label: the service account whose identity made it (and cleans it up).
pub const LABEL_SERVICE_ACCOUNT: &str = "generators.latchkey.dev/service-account";
/// Label: the ExternalSecret it was made for.
pub const LABEL_EXTERNAL_SECRET: &str = "generators.latchkey.dev/external-secret";
/// Label: the PushSecret it was made for.
pub const LABEL_PUSH_SECRET: &str = "generators.latchkey.dev/push-secret";
/// Annotation: when (RFC 3339) every store of its PushSecret held the credential.
pub const ANNOTATION_PUSHED: &str = "generators.latchkey.dev/pushed";

/// Why a state could not be recorded, read or removed. Never contains a value.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The API server refused or failed.
    #[error("GeneratorState {namespace}/{name}: {reason}")]
    Api {
        /// Namespace of the state.
        namespace: String,
        /// Name (or `generateName` prefix) of the state.
        name: String,
        /// The API server's answer, without values.
        reason: String,
    },
}

/// Records GeneratorStates.
#[async_trait]
pub trait StateStore: Send + Sync {
    /// Creates `state` (its name may be a `generateName`); returns it as stored, with its name.
    async fn create(&self, state: &GeneratorState) -> Result<GeneratorState, StateError>;
    /// Records what Cleanup needs (`spec.state`).
    async fn record(
        &self,
        namespace: &str,
        name: &str,
        state: &serde_json::Value,
    ) -> Result<(), StateError>;
    /// Sets the annotation `key` to `value` (what the holder of the credential records on it).
    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), StateError>;
    /// Sets `spec.garbageCollectionDeadline` (RFC 3339).
    async fn set_deadline(
        &self,
        namespace: &str,
        name: &str,
        deadline: &str,
    ) -> Result<(), StateError>;
    /// After its credential was cleaned up: drops the finalizer and deletes the state. A state
    /// that is already gone is success.
    async fn remove(&self, namespace: &str, name: &str) -> Result<(), StateError>;
    /// Every state whose labels match `selector` (a label selector), in all namespaces.
    async fn list(&self, selector: &str) -> Result<Vec<GeneratorState>, StateError>;
    /// Deletes the state with its finalizers kept: the controller then cleans its credential
    /// up with a token it mints, and drops the finalizer. A state already gone is success.
    async fn abandon(&self, namespace: &str, name: &str) -> Result<(), StateError>;
}

/// GeneratorStates in the API server.
pub struct KubeStates {
    client: Client,
}

impl KubeStates {
    /// States written with `client` (the agent's or controller's own credentials: the state
    /// holds no value, and the agent records them for the pods it mounts).
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    fn api(&self, namespace: &str) -> Api<GeneratorState> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Merges `spec` into the state's spec.
    async fn merge_spec(
        &self,
        namespace: &str,
        name: &str,
        spec: serde_json::Value,
    ) -> Result<(), StateError> {
        let patch = json!({ "spec": spec });
        self.api(namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| api_error(namespace, name, &e))
    }
}

/// The API server's answer, as a [`StateError`].
fn api_error(namespace: &str, name: &str, e: &kube::Error) -> StateError {
    let reason = match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => other.to_string(),
    };
    StateError::Api {
        namespace: namespace.into(),
        name: name.into(),
        reason,
    }
}

/// Whether the API server said the object does not exist.
fn is_gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

#[async_trait]
impl StateStore for KubeStates {
    async fn create(&self, state: &GeneratorState) -> Result<GeneratorState, StateError> {
        let namespace = state.namespace().unwrap_or_default();
        let api = self.api(&namespace);
        api.create(&PostParams::default(), state)
            .await
            .map_err(|e| {
                let name = state
                    .metadata
                    .name
                    .clone()
                    .or_else(|| state.metadata.generate_name.clone())
                    .unwrap_or_default();
                api_error(&namespace, &name, &e)
            })
    }

    async fn record(
        &self,
        namespace: &str,
        name: &str,
        state: &serde_json::Value,
    ) -> Result<(), StateError> {
        self.merge_spec(namespace, name, json!({"state": state}))
            .await
    }

    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), StateError> {
        let patch = json!({"metadata": {"annotations": {key: value}}});
        self.api(namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| api_error(namespace, name, &e))
    }

    async fn set_deadline(
        &self,
        namespace: &str,
        name: &str,
        deadline: &str,
    ) -> Result<(), StateError> {
        self.merge_spec(
            namespace,
            name,
            json!({"garbageCollectionDeadline": deadline}),
        )
        .await
    }

    async fn remove(&self, namespace: &str, name: &str) -> Result<(), StateError> {
        let api = self.api(namespace);
        let live = match api.get(name).await {
            Ok(live) => live,
            Err(e) if is_gone(&e) => return Ok(()),
            Err(e) => return Err(api_error(namespace, name, &e)),
        };
        let finalizers: Vec<&String> = live
            .finalizers()
            .iter()
            .filter(|f| *f != CLEANUP_FINALIZER)
            .collect();
        if finalizers.len() != live.finalizers().len() {
            // Guarded by the resourceVersion: a finalizer another controller added meanwhile
            // is not dropped by this write.
            let patch = json!({"metadata": {
                "finalizers": finalizers,
                "resourceVersion": live.resource_version(),
            }});
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(e) if is_gone(&e) => return Ok(()),
                Err(e) => return Err(api_error(namespace, name, &e)),
            }
        }
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if is_gone(&e) => Ok(()),
            Err(e) => Err(api_error(namespace, name, &e)),
        }
    }

    async fn abandon(&self, namespace: &str, name: &str) -> Result<(), StateError> {
        match self
            .api(namespace)
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_gone(&e) => Ok(()),
            Err(e) => Err(api_error(namespace, name, &e)),
        }
    }

    async fn list(&self, selector: &str) -> Result<Vec<GeneratorState>, StateError> {
        let api: Api<GeneratorState> = Api::all(self.client.clone());
        api.list(&ListParams::default().labels(selector))
            .await
            .map(|l| l.items)
            .map_err(|e| api_error("*", selector, &e))
    }
}

/// GeneratorStates in this process's memory (standalone mode).
#[derive(Default)]
pub struct MemoryStates {
    states: Mutex<BTreeMap<(String, String), GeneratorState>>,
    next: Mutex<u64>,
}

impl MemoryStates {
    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<(String, String), GeneratorState>) -> T) -> T {
        // Every operation leaves a well-formed map, so a poisoned lock is still safe to use.
        f(&mut self.states.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

#[async_trait]
impl StateStore for MemoryStates {
    async fn create(&self, state: &GeneratorState) -> Result<GeneratorState, StateError> {
        let mut state = state.clone();
        if state.metadata.name.is_none() {
            let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
            *next += 1;
            let prefix = state.metadata.generate_name.clone().unwrap_or_default();
            state.metadata.name = Some(format!("{prefix}{next}"));
        }
        let key = (state.namespace().unwrap_or_default(), state.name_any());
        self.with(|states| states.insert(key, state.clone()));
        Ok(state)
    }

    async fn record(
        &self,
        namespace: &str,
        name: &str,
        state: &serde_json::Value,
    ) -> Result<(), StateError> {
        self.with(|states| {
            if let Some(s) = states.get_mut(&(namespace.into(), name.into())) {
                s.spec.state = Some(state.clone());
            }
        });
        Ok(())
    }

    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), StateError> {
        self.with(|states| {
            if let Some(s) = states.get_mut(&(namespace.into(), name.into())) {
                s.annotations_mut().insert(key.into(), value.into());
            }
        });
        Ok(())
    }

    async fn set_deadline(
        &self,
        namespace: &str,
        name: &str,
        deadline: &str,
    ) -> Result<(), StateError> {
        self.with(|states| {
            if let Some(s) = states.get_mut(&(namespace.into(), name.into())) {
                s.spec.garbage_collection_deadline = Some(deadline.into());
            }
        });
        Ok(())
    }

    async fn remove(&self, namespace: &str, name: &str) -> Result<(), StateError> {
        self.with(|states| states.remove(&(namespace.into(), name.into())));
        Ok(())
    }

    async fn abandon(&self, namespace: &str, name: &str) -> Result<(), StateError> {
        self.remove(namespace, name).await
    }

    async fn list(&self, selector: &str) -> Result<Vec<GeneratorState>, StateError> {
        // Only `key=value,key=value` selectors: the ones Latchkey writes.
        let wanted: Vec<(&str, &str)> = selector
            .split(',')
            .filter_map(|term| term.split_once('='))
            .collect();
        Ok(self.with(|states| {
            states
                .values()
                .filter(|s| {
                    let labels = s.labels();
                    wanted
                        .iter()
                        .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
                })
                .cloned()
                .collect()
        }))
    }
}

/// The GeneratorState recorded before Generate runs (no `spec.state` yet), in `namespace`, named
/// by the API server after `name_prefix`, labelled with the generator, the service account whose
/// identity makes (and cleans up) the credential, and the ExternalSecret it is for. Callers add
/// what links it to its owner (a pod, or the ExternalSecret).
pub fn intent(
    namespace: &str,
    name_prefix: &str,
    reference: &GeneratorRef,
    object: &GeneratorObject,
    service_account: &str,
    external_secret: &str,
    finalizer: bool,
) -> GeneratorState {
    intent_for(
        namespace,
        name_prefix,
        reference,
        object,
        service_account,
        (LABEL_EXTERNAL_SECRET, external_secret),
        finalizer,
    )
}

/// As [`intent`], for the object `holder` (a label key, e.g. [`LABEL_PUSH_SECRET`], and the
/// object's name) that the credential is made for.
pub fn intent_for(
    namespace: &str,
    name_prefix: &str,
    reference: &GeneratorRef,
    object: &GeneratorObject,
    service_account: &str,
    holder: (&str, &str),
    finalizer: bool,
) -> GeneratorState {
    let mut state = GeneratorState::new(
        "",
        GeneratorStateSpec {
            resource: object.to_resource(),
            state: None,
            garbage_collection_deadline: None,
        },
    );
    state.metadata = ObjectMeta {
        generate_name: Some(format!("{}-", truncate(name_prefix, 40))),
        namespace: Some(namespace.to_string()),
        labels: Some(BTreeMap::from([
            (
                LABEL_GENERATOR.to_string(),
                label_value(&format!("{}.{}", reference.kind, reference.name)),
            ),
            (
                LABEL_SERVICE_ACCOUNT.to_string(),
                label_value(service_account),
            ),
            (holder.0.to_string(), label_value(holder.1)),
        ])),
        finalizers: finalizer.then(|| vec![CLEANUP_FINALIZER.to_string()]),
        ..ObjectMeta::default()
    };
    state
}

/// `s` as a label value (at most 63 characters): kept when it fits, else a prefix and a hash.
pub fn label_value(s: &str) -> String {
    if s.len() <= 63 {
        return s.to_string();
    }
    format!("{}-{}", truncate(s, 50), short_hash(s))
}

/// The first `max` bytes of a name, without a trailing `-` or `.` (names are ASCII).
pub fn truncate(s: &str, max: usize) -> &str {
    let cut = s.get(..max.min(s.len())).unwrap_or(s);
    cut.trim_end_matches(['-', '.'])
}

/// 12 hex digits of the SHA-256 of `s`.
pub fn short_hash(s: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    digest.as_ref()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
