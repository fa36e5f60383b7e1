//! What a ClusterExternalSecret needs, from what is seen: the namespaces it matches, the
//! ExternalSecrets to write and those to delete, the body written; and the status that reports
//! the outcome.
//! Pure: no API call here.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use crate::api::ExternalSecret;
use crate::api::cluster_external_secret::{
    ClusterExternalSecret, ClusterExternalSecretNamespaceFailure, ClusterExternalSecretSpec,
    ClusterExternalSecretStatus,
};
use crate::api::external_secret::Condition;
use crate::catalog::binding::selector_matches;

/// Label on every ExternalSecret a ClusterExternalSecret writes (its name, or its uid when the
/// name is too long for a label value), for `kubectl get lkes -l`. Ownership is the
/// ownerReference, never the label.
pub const LABEL: &str = "latchkey.dev/cluster-external-secret";
/// Default `refreshTime`, as ESO's.
const DEFAULT_REFRESH: Duration = Duration::from_secs(60);
/// Shortest `refreshTime` honoured: a look at every namespace is cheap, but not free.
const MIN_REFRESH: Duration = Duration::from_secs(10);
/// Most namespaces each status list names; the Ready condition's message gives the totals.
pub const MAX_STATUS_NAMESPACES: usize = 1000;
/// Longest reason kept for one failed namespace.
const MAX_REASON_CHARS: usize = 300;

/// A Namespace as the controller sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenNamespace {
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Being deleted: nothing is written there (its contents go with it).
    pub deleting: bool,
}

/// An ExternalSecret this ClusterExternalSecret owns (its controller ownerReference), as cached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owned {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its uid: a deletion is guarded by it.
    pub uid: String,
}

/// What to do.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Matching namespaces (not being deleted): the ExternalSecret is written there.
    pub write: Vec<String>,
    /// Owned ExternalSecrets no longer wanted: their namespace stopped matching, or
    /// `externalSecretName` changed.
    pub delete: Vec<Owned>,
}

/// Whether a namespace named `name` with `labels` matches (ESO's rule): named in `namespaces`,
/// or matching ANY of `namespaceSelectors`. An invalid selector matches nothing.
pub fn matches(
    spec: &ClusterExternalSecretSpec,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    spec.namespaces.iter().any(|n| n == name)
        || spec
            .namespace_selectors
            .iter()
            .any(|s| selector_matches(s, labels).is_ok())
}

/// The plan for a ClusterExternalSecret whose ExternalSecrets are named `es_name`, given the
/// namespaces seen, the ExternalSecrets it owns, and the namespaces this controller serves
/// (empty: all; others are neither written nor cleaned).
pub fn plan(
    spec: &ClusterExternalSecretSpec,
    es_name: &str,
    namespaces: &[SeenNamespace],
    owned: &[Owned],
    served: &[String],
) -> Plan {
    let in_scope = |ns: &str| served.is_empty() || served.iter().any(|s| s == ns);
    let mut wanted = BTreeSet::new();
    let mut deleting = BTreeSet::new();
    for ns in namespaces.iter().filter(|ns| in_scope(&ns.name)) {
        if ns.deleting {
            deleting.insert(ns.name.as_str());
        } else if matches(spec, &ns.name, &ns.labels) {
            wanted.insert(ns.name.clone());
        }
    }
    let delete = owned
        .iter()
        .filter(|o| in_scope(&o.namespace) && !deleting.contains(o.namespace.as_str()))
        .filter(|o| o.name != es_name || !wanted.contains(&o.namespace))
        .cloned()
        .collect();
    Plan {
        write: wanted.into_iter().collect(),
        delete,
    }
}

/// The status after a reconcile: `provisioned` namespaces, `failed` ones with why; the Ready
/// condition keeps its `lastTransitionTime` while its status does not change.
pub fn status(
    previous: Option<&ClusterExternalSecretStatus>,
    es_name: &str,
    provisioned: &BTreeSet<String>,
    failed: &BTreeMap<String, String>,
    now: &str,
) -> ClusterExternalSecretStatus {
    let (ready, reason, message) = if failed.is_empty() {
        (
            "True",
            "Provisioned",
            format!(
                "ExternalSecret {es_name:?} is written in {} namespace(s)",
                provisioned.len()
            ),
        )
    } else {
        let first = failed
            .keys()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        (
            "False",
            if provisioned.is_empty() {
                "ProvisioningFailed"
            } else {
                "PartiallyProvisioned"
            },
            format!(
                "ExternalSecret {es_name:?} is written in {} namespace(s) and failed in {} ({first}{}); see status.failedNamespaces",
                provisioned.len(),
                failed.len(),
                if failed.len() > 3 { ", ..." } else { "" },
            ),
        )
    };
    ClusterExternalSecretStatus {
        external_secret_name: Some(es_name.to_string()),
        provisioned_namespaces: provisioned
            .iter()
            .take(MAX_STATUS_NAMESPACES)
            .cloned()
            .collect(),
        failed_namespaces: failed
            .iter()
            .take(MAX_STATUS_NAMESPACES)
            .map(|(namespace, why)| ClusterExternalSecretNamespaceFailure {
                namespace: namespace.clone(),
                reason: Some(crate::telemetry::escape::printable(why, MAX_REASON_CHARS)),
            })
            .collect(),
        conditions: vec![condition(previous, ready, reason, message, now)],
    }
}

/// The status of an object the controller cannot use: `why` names the field.
pub fn invalid(
    previous: Option<&ClusterExternalSecretStatus>,
    why: &str,
    now: &str,
) -> ClusterExternalSecretStatus {
    let mut status = previous.cloned().unwrap_or_default();
    status.conditions = vec![condition(
        previous,
        "False",
        "Invalid",
        format!("{why}; nothing is written or removed until it is fixed"),
        now,
    )];
    status
}

fn condition(
    previous: Option<&ClusterExternalSecretStatus>,
    status: &str,
    reason: &str,
    message: String,
    now: &str,
) -> Condition {
    let since = previous
        .and_then(|p| p.conditions.iter().find(|c| c.type_ == "Ready"))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.to_string());
    Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(crate::telemetry::escape::printable(&message, 1024)),
        last_transition_time: Some(since),
    }
}

/// The uid of the controller ownerReference, if any.
pub(super) fn controller_uid(owners: &[OwnerReference]) -> Option<&str> {
    owners
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

/// Why an existing ExternalSecret is not touched.
pub(super) fn foreign(owners: &[OwnerReference]) -> String {
    match owners.iter().find(|o| o.controller == Some(true)) {
        Some(o) => format!(
            "an ExternalSecret of that name exists and is controlled by {} {:?}; it is left \
             untouched",
            o.kind, o.name
        ),
        None => "an ExternalSecret of that name exists and is not this ClusterExternalSecret's; \
                 it is left untouched (delete it, or rename externalSecretName)"
            .into(),
    }
}

/// The apply configuration of the ExternalSecret written for `ces` (namespace set per write).
pub(super) fn desired(ces: &ClusterExternalSecret, uid: &str, es_name: &str) -> Value {
    let ces_name = ces.name_any();
    let mut labels = BTreeMap::new();
    let mut annotations = BTreeMap::new();
    if let Some(meta) = &ces.spec.external_secret_metadata {
        labels.extend(meta.labels.clone());
        annotations.extend(meta.annotations.clone());
    }
    // A label value is at most 63 characters; a longer name is told by its uid.
    let mark = if ces_name.len() <= 63 {
        ces_name.clone()
    } else {
        uid.to_string()
    };
    labels.insert(LABEL.to_string(), mark);
    json!({
        "apiVersion": ExternalSecret::api_version(&()),
        "kind": ExternalSecret::kind(&()),
        "metadata": {
            "name": es_name,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [{
                "apiVersion": ClusterExternalSecret::api_version(&()),
                "kind": ClusterExternalSecret::kind(&()),
                "name": ces_name,
                "uid": uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": ces.spec.external_secret_spec,
    })
}

/// A digest of what is written, to tell whether it changed since the last write.
pub(super) fn digest(body: &Value) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    body.to_string().hash(&mut hasher);
    hasher.finish()
}

/// When to look again without a change seen: `refreshTime` (default 1m), at least 10s; `0`:
/// only on changes.
pub(super) fn refresh(text: Option<&str>) -> Duration {
    match text.map(crate::api::duration::parse) {
        None | Some(None) => DEFAULT_REFRESH,
        Some(Some(d)) if d.is_zero() => Duration::from_secs(24 * 3600),
        Some(Some(d)) => d.clamp(MIN_REFRESH, Duration::from_secs(24 * 3600)),
    }
}
