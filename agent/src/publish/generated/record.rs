//! The GeneratorState of a credential: what is recorded before Generate runs (labels linking it
//! to its pod, volume and node; the pod as owner; the generator as it was), and label values
//! that fit Kubernetes' limits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tracing::warn;

use kube::ResourceExt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::{ANNOTATION_TARGET, Credential, Generated, Recorded};
use crate::api::external_secret::GeneratorRef;
use crate::api::generator::{GeneratorObject, GeneratorState};
use crate::api::{GENERATOR_API_VERSION, StoreKind};
use crate::generators::states::{
    self, LABEL_NODE, LABEL_POD, LABEL_POD_UID, LABEL_VOLUME, StateError, label_value, short_hash,
};
use crate::identity::PodInfo;
use crate::publish::PublishRequest;
use crate::resolve::Context;

impl Generated {
    /// The states this node's agent recorded before it (re)started.
    pub(in crate::publish) async fn recorded_here(
        &self,
    ) -> Result<Vec<GeneratorState>, StateError> {
        let selector = format!("{LABEL_NODE}={}", label_value(&self.config.node));
        self.config.states.list(&selector).await
    }

    /// Takes over a state an earlier run recorded: a credential of a volume still `mounted` is
    /// replaced at its next publish; one of a volume gone, or a state that never got past the
    /// intent, is cleaned up as far as possible without the pod's token. Returns whether it
    /// was adopted.
    pub(in crate::publish) async fn adopt(
        self: &Arc<Self>,
        state: &GeneratorState,
        mounted: bool,
    ) -> bool {
        let namespace = state.namespace().unwrap_or_default();
        let name = state.name_any();
        let target = state
            .annotations()
            .get(ANNOTATION_TARGET)
            .map(PathBuf::from);
        // Tenant-writable: checked like a live generator before it is ever used.
        let object = GeneratorObject::from_resource(&state.spec.resource).and_then(|o| {
            crate::api::validate::generator(&o)
                .map(|_| o)
                .map_err(|e| e.to_string())
        });
        let (Some(target), Ok(object), Some(recorded)) = (target, object, state.spec.state.clone())
        else {
            // Generate never answered (or the state is not one this agent wrote): nothing it
            // can clean up.
            self.drop_state(&namespace, &name).await;
            return false;
        };
        let pod_uid = state
            .labels()
            .get(LABEL_POD_UID)
            .cloned()
            .unwrap_or_default();
        let credential = Credential {
            reference: GeneratorRef {
                api_version: GENERATOR_API_VERSION.to_string(),
                kind: object.kind().to_string(),
                name: object_name(&state.spec.resource),
            },
            object,
            state: Some(Recorded {
                namespace,
                name,
                state: recorded,
            }),
            pod_uid,
            // Read back from a tenant-writable state: never the agent's namespace for
            // credential Secrets, whatever kind the recorded resource claims.
            scope: StoreKind::SecretStore,
            values: Arc::default(),
            renew_at: None,
            replace: true,
        };
        self.leases(&credential.object).inc();
        if !mounted {
            if let Some(recorded) = &credential.state {
                self.give_up(&credential, recorded, &"unmounted while the agent was down")
                    .await;
            }
            return false;
        }
        // Set first, so that `with_orphans` looks at the map.
        self.any_orphan.store(true, Ordering::Relaxed);
        self.with_orphans((), |o| o.entry(target).or_default().push(credential));
        true
    }

    /// The credentials an earlier run made for `target`, if any, as `pod` may take them over.
    /// A state is tenant-writable: one that claims `target` but was not recorded for this very
    /// pod (its namespace and uid) is never cleaned up with this pod's identity; it is left
    /// alone.
    pub(in crate::publish) fn take_orphans(
        &self,
        target: &Path,
        pod: &PodInfo,
    ) -> Option<Vec<Credential>> {
        let found = self.with_orphans(None, |o| o.remove(target))?;
        let (own, foreign): (Vec<_>, Vec<_>) = found.into_iter().partition(|c| {
            c.pod_uid == pod.uid
                && c.state
                    .as_ref()
                    .is_some_and(|r| r.namespace == pod.namespace)
        });
        for c in foreign {
            if let Some(r) = &c.state {
                warn!(namespace = %r.namespace, state = %r.name, pod = %pod.name,
                    "a GeneratorState names this pod's volume but was not recorded for this \
                     pod; it is left alone");
            }
        }
        (!own.is_empty()).then_some(own)
    }

    /// Puts back what [`Self::take_orphans`] took, when the publish that was to replace them
    /// failed.
    pub(in crate::publish) fn keep_orphans(&self, target: &Path, credentials: Vec<Credential>) {
        if credentials.is_empty() {
            return;
        }
        self.any_orphan.store(true, Ordering::Relaxed);
        self.with_orphans((), |o| {
            o.entry(target.to_path_buf())
                .or_default()
                .extend(credentials);
        });
    }

    /// The GeneratorState recorded before Generate runs.
    pub(super) fn intent(
        &self,
        req: &PublishRequest,
        ctx: &Context,
        reference: &GeneratorRef,
        object: &GeneratorObject,
    ) -> GeneratorState {
        let pod = &req.pod;
        let target = req.target.to_string_lossy();
        let mut state = states::intent(
            &pod.namespace,
            &pod.name,
            reference,
            object,
            &pod.service_account,
            &ctx.external_secret,
            self.config.finalizer,
        );
        let meta = &mut state.metadata;
        meta.labels.get_or_insert_with(BTreeMap::new).extend([
            (LABEL_POD.to_string(), label_value(&pod.name)),
            (LABEL_POD_UID.to_string(), label_value(&pod.uid)),
            (LABEL_VOLUME.to_string(), short_hash(&target)),
            (LABEL_NODE.to_string(), label_value(&self.config.node)),
        ]);
        meta.annotations = Some(BTreeMap::from([(
            ANNOTATION_TARGET.to_string(),
            target.into_owned(),
        )]));
        // Kubernetes' garbage collector deletes the state with its pod.
        meta.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            ..OwnerReference::default()
        }]);
        state
    }
}

/// `metadata.name` of a recorded generator object.
fn object_name(resource: &serde_json::Value) -> String {
    resource["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}
