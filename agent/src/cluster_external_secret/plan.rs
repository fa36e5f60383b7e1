//! What a ClusterExternalSecret needs, from what is seen: the namespaces it matches, the
//! ExternalSecrets to write and those to delete; and the status that reports the outcome.
//! Pure: no API call here.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::cluster_external_secret::{
    ClusterExternalSecretNamespaceFailure, ClusterExternalSecretSpec, ClusterExternalSecretStatus,
};
use crate::api::external_secret::Condition;
use crate::catalog::binding::selector_matches;

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
