use std::collections::{BTreeMap, BTreeSet};

use super::plan::{self, Owned, SeenNamespace};
use super::{desired, refresh};
use crate::api::cluster_external_secret::{ClusterExternalSecret, ClusterExternalSecretSpec};
use crate::api::store::{LabelSelector, LabelSelectorRequirement};

fn spec(namespaces: &[&str], selectors: Vec<LabelSelector>) -> ClusterExternalSecretSpec {
    serde_json::from_value(serde_json::json!({
        "externalSecretSpec": {
            "secretStoreRef": {"name": "vault", "kind": "ClusterSecretStore"},
            "data": [{"secretKey": "password", "remoteRef": {"key": "db"}}],
        },
        "namespaces": namespaces,
        "namespaceSelectors": selectors,
    }))
    .unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn team(value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: labels(&[("team", value)]),
        ..Default::default()
    }
}

fn ns(name: &str, pairs: &[(&str, &str)], deleting: bool) -> SeenNamespace {
    SeenNamespace {
        name: name.into(),
        labels: labels(pairs),
        deleting,
    }
}

fn owned(namespace: &str, name: &str) -> Owned {
    Owned {
        namespace: namespace.into(),
        name: name.into(),
        uid: format!("uid-{namespace}"),
    }
}

#[test]
fn a_namespace_matches_by_name_or_any_selector() {
    // ESO's rule: `namespaces` OR any of `namespaceSelectors`.
    let s = spec(&["shop-legacy"], vec![team("shop"), team("billing")]);
    assert!(plan::matches(&s, "shop-legacy", &labels(&[])));
    assert!(plan::matches(&s, "shop", &labels(&[("team", "shop")])));
    assert!(plan::matches(
        &s,
        "billing",
        &labels(&[("team", "billing")])
    ));
    assert!(!plan::matches(&s, "other", &labels(&[("team", "other")])));
    // Nothing given matches nothing.
    assert!(!plan::matches(&spec(&[], vec![]), "shop", &labels(&[])));
    // An empty selector matches every namespace, as in Kubernetes and ESO.
    assert!(plan::matches(
        &spec(&[], vec![LabelSelector::default()]),
        "any",
        &labels(&[])
    ));
    // An invalid requirement matches nothing (a NotIn without values would match all).
    let invalid = LabelSelector {
        match_expressions: vec![LabelSelectorRequirement {
            key: "team".into(),
            operator: "NotIn".into(),
            values: vec![],
        }],
        ..Default::default()
    };
    assert!(!plan::matches(
        &spec(&[], vec![invalid]),
        "any",
        &labels(&[])
    ));
}

#[test]
fn the_plan_writes_matches_and_deletes_what_stopped_matching() {
    let s = spec(&["a"], vec![team("shop")]);
    let seen = [
        ns("a", &[], false),
        ns("b", &[("team", "shop")], false),
        ns("c", &[], false),
        ns("dying", &[("team", "shop")], true),
    ];
    let have = [
        owned("a", "db"),
        owned("c", "db"),
        owned("dying", "db"),
        // externalSecretName changed from `old`: the old one goes.
        owned("b", "old"),
    ];
    let p = plan::plan(&s, "db", &seen, &have, &[]);
    assert_eq!(p.write, ["a", "b"]);
    assert_eq!(p.delete, [owned("c", "db"), owned("b", "old")]);
    // Served namespaces only: `c` is another instance's business.
    let p = plan::plan(&s, "db", &seen, &have, &["a".into(), "b".into()]);
    assert_eq!(p.write, ["a", "b"]);
    assert_eq!(p.delete, [owned("b", "old")]);
}

#[test]
fn status_lists_namespaces_and_keeps_the_transition_time() {
    let provisioned: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
    let ok = plan::status(None, "db", &provisioned, &BTreeMap::new(), "t1");
    assert_eq!(ok.provisioned_namespaces, ["a", "b"]);
    assert_eq!(ok.conditions[0].status, "True");
    assert_eq!(ok.conditions[0].reason.as_deref(), Some("Provisioned"));
    let failed: BTreeMap<String, String> = [("c".to_string(), "taken\nover".to_string())].into();
    let partial = plan::status(Some(&ok), "db", &provisioned, &failed, "t2");
    assert_eq!(partial.conditions[0].status, "False");
    assert_eq!(
        partial.conditions[0].reason.as_deref(),
        Some("PartiallyProvisioned")
    );
    assert_eq!(
        partial.conditions[0].last_transition_time.as_deref(),
        Some("t2")
    );
    // The reason is one printable line.
    assert!(
        !partial.failed_namespaces[0]
            .reason
            .as_ref()
            .unwrap()
            .contains('\n')
    );
    let again = plan::status(Some(&partial), "db", &provisioned, &failed, "t3");
    assert_eq!(
        again.conditions[0].last_transition_time.as_deref(),
        Some("t2")
    );
    let none = plan::status(None, "db", &BTreeSet::new(), &failed, "t1");
    assert_eq!(
        none.conditions[0].reason.as_deref(),
        Some("ProvisioningFailed")
    );
}

#[test]
fn the_written_external_secret_is_owned_by_the_cluster_object() {
    let mut ces = ClusterExternalSecret::new("shared-db", spec(&["a"], vec![]));
    ces.spec.external_secret_metadata = Some(
        serde_json::from_value(serde_json::json!(
            {"labels": {"app": "web"}, "annotations": {"note": "x"}}
        ))
        .unwrap(),
    );
    let body = desired(&ces, "u-1", "db");
    assert_eq!(body["metadata"]["name"], "db");
    assert_eq!(body["metadata"]["labels"]["app"], "web");
    assert_eq!(body["metadata"]["labels"][super::LABEL], "shared-db");
    assert_eq!(body["metadata"]["annotations"]["note"], "x");
    let owner = &body["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "ClusterExternalSecret");
    assert_eq!(owner["uid"], "u-1");
    assert_eq!(owner["controller"], true);
    assert_eq!(body["spec"]["secretStoreRef"]["name"], "vault");
    // A name too long for a label value is marked by the uid.
    let long = ClusterExternalSecret::new(&"x".repeat(64), spec(&["a"], vec![]));
    assert_eq!(
        desired(&long, "u-2", "db")["metadata"]["labels"][super::LABEL],
        "u-2"
    );
}

#[test]
fn refresh_time_defaults_to_a_minute_and_is_bounded() {
    use std::time::Duration;
    assert_eq!(refresh(None), Duration::from_secs(60));
    assert_eq!(refresh(Some("1s")), Duration::from_secs(10));
    assert_eq!(refresh(Some("5m")), Duration::from_secs(300));
    assert_eq!(refresh(Some("0")), Duration::from_secs(86400));
}
