//! Kubernetes Events on the pod a volume is for, so a failed mount explains itself in
//! `kubectl describe pod`, and on the ExternalSecrets the mirror controller writes for. Messages are the publish errors' texts, which never contain values.
//! Recording is fire-and-forget: a slow API server never delays kubelet. Repeats are aggregated
//! as kubelet's own FailedMount is: one Event object per pod and reason whose `count` grows
//! (kubelet retries a failing mount every few seconds, and a new object per attempt floods the
//! namespace's Events).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tracing::warn;

use crate::identity::PodInfo;

/// Reason of the Event recorded when a first publish fails.
pub const MOUNT_FAILED: &str = "MountFailed";
/// Reason of the Event recorded when refreshing a mounted volume fails (the old files stay).
pub const REFRESH_FAILED: &str = "RefreshFailed";
/// Longest Event message the API server accepts comfortably.
const MAX_MESSAGE: usize = 1024;
/// How long recording one Event may take before it is dropped.
const RECORD_TIMEOUT: Duration = Duration::from_secs(10);
/// Most (pod, reason) series remembered for aggregation. Past it the least recently used are
/// forgotten, and their next failure starts a new Event object (as kubelet's correlator does).
const MAX_SERIES: usize = 4096;

/// Where pod Events go.
pub trait PodEvents: Send + Sync {
    /// Records a Warning Event on the pod (in the background).
    fn warn(&self, pod: &PodInfo, reason: &'static str, message: &str);
}

/// Standalone mode: there is no API server; the failure is already in the log.
pub struct NoEvents;

impl PodEvents for NoEvents {
    fn warn(&self, _: &PodInfo, _: &'static str, _: &str) {}
}

/// Writes `v1` Events through the API server.
pub struct KubeEvents {
    client: Client,
    node: Arc<str>,
    series: Mutex<HashMap<SeriesKey, (Slot, Instant)>>,
}

/// One Event object per pod (namespace, name and uid, so a recreated pod starts afresh) and
/// reason.
type SeriesKey = (String, String, String, &'static str);

/// The Event object of one series, once created; the lock orders the writes of a series so
/// a repeat patches the object its predecessor created.
type Slot = Arc<tokio::sync::Mutex<Option<Recorded>>>;

/// An Event object written for a series.
struct Recorded {
    name: String,
    count: i32,
}

impl KubeEvents {
    /// Events reported by the agent on `node`.
    pub fn new(client: Client, node: &str) -> Self {
        Self {
            client,
            node: node.into(),
            series: Mutex::new(HashMap::new()),
        }
    }

    /// The slot of a series, created if new; forgets the least recently used past the bound.
    fn slot(&self, key: SeriesKey) -> Slot {
        // Every critical section is one map operation, so a poisoned lock holds a whole map.
        let mut series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        if !series.contains_key(&key)
            && series.len() >= MAX_SERIES
            && let Some(oldest) = series
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
        {
            series.remove(&oldest);
        }
        let now = Instant::now();
        let (slot, used) = series.entry(key).or_insert_with(|| (Slot::default(), now));
        *used = now;
        Arc::clone(slot)
    }
}

impl PodEvents for KubeEvents {
    fn warn(&self, pod: &PodInfo, reason: &'static str, message: &str) {
        let action = pod_action(reason);
        self.record(&EventTarget::pod(pod), WARNING, reason, action, message);
    }
}

/// `type` of an Event that reports a failure.
pub const WARNING: &str = "Warning";
/// `type` of an Event that reports progress.
pub const NORMAL: &str = "Normal";

/// The object an Event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventTarget {
    /// `apiVersion` of the object.
    pub api_version: &'static str,
    /// `kind` of the object.
    pub kind: &'static str,
    /// Namespace (Events live in the object's namespace); empty for a cluster-scoped object,
    /// whose Events live in `default` as the API server requires.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID, so a recreated object starts a new series.
    pub uid: String,
}

impl EventTarget {
    /// The pod a volume is for.
    pub fn pod(pod: &PodInfo) -> Self {
        Self {
            api_version: "v1",
            kind: "Pod",
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
        }
    }
}

impl KubeEvents {
    /// Records an Event on `target` (in the background), aggregated per object and reason.
    pub fn record(
        &self,
        target: &EventTarget,
        type_: &'static str,
        reason: &'static str,
        action: &'static str,
        message: &str,
    ) {
        let event = object_event(target, type_, reason, action, message, &self.node);
        let slot = self.slot((
            target.namespace.clone(),
            target.name.clone(),
            target.uid.clone(),
            reason,
        ));
        let api: Api<Event> = Api::namespaced(self.client.clone(), event_namespace(target));
        let (namespace, name, kind) = (target.namespace.clone(), target.name.clone(), target.kind);
        tokio::spawn(async move {
            let recorded = tokio::time::timeout(RECORD_TIMEOUT, record(&api, &slot, event));
            match recorded.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    warn!(%namespace, %kind, %name, reason, %error, "cannot record event")
                }
                Err(_) => warn!(%namespace, %kind, %name, reason, "recording event timed out"),
            }
        });
    }
}

/// Creates `event`, or, when its series already has an object, bumps that object's count,
/// last timestamp and message. An object that has gone (Events expire after an hour) is
/// created anew.
async fn record(api: &Api<Event>, slot: &Slot, event: Event) -> Result<(), kube::Error> {
    let mut recorded = slot.lock().await;
    if let Some(previous) = recorded.as_mut() {
        let count = previous.count.saturating_add(1);
        let patch = serde_json::json!({
            "count": count,
            "lastTimestamp": event.last_timestamp,
            "message": event.message,
        });
        match api
            .patch(
                &previous.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                previous.count = count;
                return Ok(());
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error),
        }
    }
    let created = api.create(&PostParams::default(), &event).await?;
    *recorded = Some(Recorded {
        name: created.metadata.name.unwrap_or_default(),
        count: 1,
    });
    Ok(())
}

/// The Event kubelet's own volume plugins would write for the pod.
pub fn pod_event(pod: &PodInfo, reason: &'static str, message: &str, node: &str) -> Event {
    let action = pod_action(reason);
    object_event(
        &EventTarget::pod(pod),
        WARNING,
        reason,
        action,
        message,
        node,
    )
}

/// The `action` of a pod Event with `reason`: what kubelet was doing.
fn pod_action(reason: &str) -> &'static str {
    if reason == REFRESH_FAILED {
        "Refresh"
    } else {
        "NodePublishVolume"
    }
}

/// Where Events about `target` live: its namespace, or `default` for a cluster-scoped object
/// (where `kubectl describe` looks for them).
fn event_namespace(target: &EventTarget) -> &str {
    if target.namespace.is_empty() {
        "default"
    } else {
        &target.namespace
    }
}

/// An Event about `target`, reported by `instance` (a node, or a controller replica).
fn object_event(
    target: &EventTarget,
    type_: &'static str,
    reason: &'static str,
    action: &'static str,
    message: &str,
    instance: &str,
) -> Event {
    let now = Timestamp::now();
    let mut message = message.to_string();
    if message.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    Event {
        metadata: ObjectMeta {
            // The API server rejects generateName collisions rarely; a timestamp keeps names unique.
            name: Some(format!("{}.{:x}", target.name, now.as_nanosecond())),
            namespace: Some(event_namespace(target).to_string()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some(target.api_version.into()),
            kind: Some(target.kind.into()),
            name: Some(target.name.clone()),
            namespace: (!target.namespace.is_empty()).then(|| target.namespace.clone()),
            uid: Some(target.uid.clone()),
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(message),
        type_: Some(type_.into()),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        action: Some(action.into()),
        reporting_component: Some(crate::api::DRIVER_NAME.into()),
        reporting_instance: Some(instance.into()),
        source: Some(EventSource {
            component: Some(crate::api::DRIVER_NAME.into()),
            host: Some(instance.into()),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::PodTokens;

    /// docs/troubleshooting.md explains every reason the agent records on pods.
    #[test]
    fn every_pod_event_reason_is_documented() {
        let doc = include_str!("../../../docs/troubleshooting.md");
        for reason in [MOUNT_FAILED, REFRESH_FAILED] {
            assert!(
                doc.contains(&format!("| `{reason}` |")),
                "{reason} is not documented"
            );
        }
    }

    #[test]
    fn event_names_the_pod_and_bounds_the_message() {
        let pod = PodInfo {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: "u-1".into(),
            service_account: "web".into(),
            tokens: PodTokens::default(),
        };
        let e = pod_event(&pod, MOUNT_FAILED, &"é".repeat(2000), "node-1");
        assert_eq!(e.involved_object.name.as_deref(), Some("web-0"));
        assert_eq!(e.involved_object.uid.as_deref(), Some("u-1"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.reason.as_deref(), Some("MountFailed"));
        assert!(e.message.unwrap().len() <= MAX_MESSAGE);
        assert!(e.metadata.name.unwrap().starts_with("web-0."));
    }
}
