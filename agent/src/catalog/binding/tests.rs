//! Binding: tenancy of stores, and ClusterSecretStore `conditions` with ESO's meaning.

use super::*;
use crate::api::store::LabelSelectorRequirement;
use crate::catalog::ManifestCatalog;
use std::path::Path;

const OBJECTS: &str = r#"
apiVersion: latchkey.dev/v1alpha1
kind: SecretStore
metadata: {name: local, namespace: team-b}
spec: {provider: {fake: {data: []}}}
---
apiVersion: latchkey.dev/v1alpha1
kind: ClusterSecretStore
metadata: {name: only-prod}
spec:
  provider: {fake: {data: []}}
  conditions: [{namespaceRegexes: ["^prod-"]}, {namespaces: [billing]}]
---
apiVersion: latchkey.dev/v1alpha1
kind: ClusterSecretStore
metadata: {name: open}
spec: {provider: {fake: {data: []}}}
---
apiVersion: v1
kind: Namespace
metadata: {name: labelled, labels: {tier: gold}}
---
apiVersion: latchkey.dev/v1alpha1
kind: ClusterSecretStore
metadata: {name: gold}
spec:
  provider: {fake: {data: []}}
  conditions: [{namespaceSelector: {matchLabels: {tier: gold}}}]
"#;

fn es(ns: &str, store: &str, kind: &str) -> String {
    format!(
        "apiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {{name: es, namespace: {ns}}}\n\
             spec: {{secretStoreRef: {{name: {store}, kind: {kind}}}, data: [{{secretKey: a, remoteRef: {{key: a}}}}]}}\n"
    )
}

fn catalog(extra: &[String]) -> ManifestCatalog {
    let mut c = ManifestCatalog::default();
    c.add_documents(Path::new("objects.yaml"), OBJECTS).unwrap();
    for (i, doc) in extra.iter().enumerate() {
        c.add_documents(Path::new(&format!("es{i}.yaml")), doc)
            .unwrap();
    }
    c
}

#[tokio::test]
async fn a_binding_shares_the_catalog_store_and_its_debug_shows_no_value() {
    let store = "apiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\n\
                     metadata: {name: inline, namespace: team-c}\n\
                     spec: {provider: {fake: {data: [{key: a, value: hunter2-inline}]}}}\n";
    let c = catalog(&[store.to_string(), es("team-c", "inline", "SecretStore")]);
    let binding = bind(&c, "team-c", "es").await.unwrap();
    let held = c.secret_store("team-c", "inline").await.unwrap().unwrap();
    match &binding.store {
        BoundStore::Namespaced(store) => assert!(Arc::ptr_eq(store, &held)),
        other => panic!("{other:?}"),
    }
    assert_eq!(binding.provider(), &held.spec.provider);
    let debug = format!("{binding:?}");
    assert!(
        debug.contains("inline") && !debug.contains("hunter2"),
        "{debug}"
    );
}

#[tokio::test]
async fn secret_store_of_another_namespace_is_never_used() {
    let c = catalog(&[es("team-a", "local", "SecretStore")]);
    let err = bind(&c, "team-a", "es").await.unwrap_err();
    assert!(matches!(err, BindingError::StoreNotFound { .. }), "{err}");
    assert!(
        err.to_string().contains("SecretStore \"local\" not found"),
        "{err}"
    );
}

#[tokio::test]
async fn external_secret_is_only_looked_up_in_the_pod_namespace() {
    let c = catalog(&[es("team-b", "local", "SecretStore")]);
    assert!(bind(&c, "team-b", "es").await.is_ok());
    let err = bind(&c, "team-a", "es").await.unwrap_err();
    assert!(
        matches!(err, BindingError::ExternalSecretNotFound { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn cluster_store_conditions_admit_or_refuse_with_the_rule() {
    let c = catalog(&[
        es("prod-eu", "only-prod", "ClusterSecretStore"),
        es("billing", "only-prod", "ClusterSecretStore"),
        es("dev", "only-prod", "ClusterSecretStore"),
        es("dev2", "open", "ClusterSecretStore"),
        es("labelled", "gold", "ClusterSecretStore"),
        es("plain", "gold", "ClusterSecretStore"),
    ]);
    assert!(bind(&c, "prod-eu", "es").await.is_ok());
    assert!(bind(&c, "billing", "es").await.is_ok());
    assert!(bind(&c, "dev2", "es").await.is_ok());
    assert!(bind(&c, "labelled", "es").await.is_ok());
    let err = bind(&c, "dev", "es").await.unwrap_err().to_string();
    assert!(err.contains("does not admit"), "{err}");
    assert!(
        err.contains("namespaceRegexes") && err.contains("not in namespaces"),
        "{err}"
    );
    let err = bind(&c, "plain", "es").await.unwrap_err().to_string();
    assert!(err.contains("label tier=gold required"), "{err}");
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn shop_selector() -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: BTreeMap::from([("team".to_string(), "shop".to_string())]),
        ..Default::default()
    })
}

#[test]
fn a_condition_with_names_only_admits_exactly_those_names() {
    let c = [ClusterStoreCondition {
        namespaces: vec!["shop-legacy".into(), "billing".into()],
        ..Default::default()
    }];
    assert!(admits(&c, "shop-legacy", &labels(&[])).is_ok());
    assert!(admits(&c, "billing", &labels(&[("team", "shop")])).is_ok());
    let err = admits(&c, "shop", &labels(&[("team", "shop")])).unwrap_err();
    assert_eq!(err, "conditions[0]: namespace not in namespaces");
}

#[test]
fn a_condition_with_regexes_only_admits_any_match_and_skips_invalid_ones() {
    let c = [ClusterStoreCondition {
        namespace_regexes: vec!["(".into(), "^prod-".into(), "^billing$".into()],
        ..Default::default()
    }];
    assert!(admits(&c, "prod-eu", &labels(&[])).is_ok());
    assert!(admits(&c, "billing", &labels(&[])).is_ok());
    let err = admits(&c, "dev", &labels(&[])).unwrap_err();
    assert_eq!(
        err,
        "conditions[0]: namespace matches none of namespaceRegexes, \
             namespaceRegexes[0] is invalid"
    );
    // Only invalid regexes: nothing is admitted.
    let c = [ClusterStoreCondition {
        namespace_regexes: vec!["[".into()],
        ..Default::default()
    }];
    assert!(admits(&c, "[", &labels(&[])).is_err());
}

#[test]
fn a_condition_with_a_selector_only_admits_matching_labels() {
    let c = [ClusterStoreCondition {
        namespace_selector: shop_selector(),
        ..Default::default()
    }];
    assert!(admits(&c, "anything", &labels(&[("team", "shop")])).is_ok());
    let err = admits(&c, "shop", &labels(&[("team", "ops")])).unwrap_err();
    assert_eq!(
        err,
        "conditions[0]: namespaceSelector does not match: label team=shop required"
    );
}

/// ESO's rule: each criterion of one condition admits on its own (a union, not an
/// intersection), as a store converted from ESO expects.
#[test]
fn a_combined_condition_admits_by_each_criterion_separately() {
    let c = [ClusterStoreCondition {
        namespaces: vec!["shop-legacy".into()],
        namespace_regexes: vec!["^shop-v[0-9]+$".into()],
        namespace_selector: shop_selector(),
    }];
    // By name alone: unlabelled, and no regex matches.
    assert!(admits(&c, "shop-legacy", &labels(&[])).is_ok());
    // By regex alone.
    assert!(admits(&c, "shop-v2", &labels(&[("team", "ops")])).is_ok());
    // By selector alone.
    assert!(admits(&c, "storefront", &labels(&[("team", "shop")])).is_ok());
    // None of them: each criterion says why, under its condition.
    let err = admits(&c, "ops", &labels(&[("team", "ops")])).unwrap_err();
    assert_eq!(
        err,
        "conditions[0]: namespace not in namespaces, namespace matches none of \
             namespaceRegexes, namespaceSelector does not match: label team=shop required"
    );
}

#[test]
fn an_invalid_criterion_admits_nothing_but_leaves_the_others_in_force() {
    let c = [ClusterStoreCondition {
        namespaces: vec!["shop-legacy".into()],
        // `NotIn` without values would match every namespace if read literally.
        namespace_selector: Some(req("NotIn", &[])),
        ..Default::default()
    }];
    assert!(admits(&c, "shop-legacy", &labels(&[])).is_ok());
    let err = admits(&c, "other", &labels(&[])).unwrap_err();
    assert!(err.contains("invalid requirement on \"env\""), "{err}");
    assert!(
        err.starts_with("conditions[0]: namespace not in namespaces, "),
        "{err}"
    );
}

#[test]
fn empty_conditions_admit_all_and_an_empty_condition_admits_nothing() {
    assert!(admits(&[], "any", &labels(&[])).is_ok());
    let c = [ClusterStoreCondition::default()];
    assert_eq!(
        admits(&c, "any", &labels(&[])).unwrap_err(),
        "conditions[0]: empty condition admits nothing"
    );
    // A later condition still admits.
    let c = [
        ClusterStoreCondition::default(),
        ClusterStoreCondition {
            namespaces: vec!["any".into()],
            ..Default::default()
        },
    ];
    assert!(admits(&c, "any", &labels(&[])).is_ok());
}

/// The store `latchkey convert` writes from ESO's `{namespaces: [shop-legacy],
/// namespaceSelector: {matchLabels: {team: shop}}}`: both kinds of namespace bind.
#[tokio::test]
async fn a_converted_store_admits_the_listed_and_the_labelled_namespaces() {
    let store = "apiVersion: latchkey.dev/v1alpha1\nkind: ClusterSecretStore\n\
                     metadata: {name: shop}\nspec:\n  provider: {fake: {data: []}}\n  \
                     conditions: [{namespaces: [shop-legacy], namespaceSelector: {matchLabels: {team: shop}}}]\n\
                     ---\napiVersion: v1\nkind: Namespace\nmetadata: {name: shop-eu, labels: {team: shop}}\n";
    let c = catalog(&[
        store.to_string(),
        es("shop-legacy", "shop", "ClusterSecretStore"),
        es("shop-eu", "shop", "ClusterSecretStore"),
        es("ops", "shop", "ClusterSecretStore"),
    ]);
    assert!(bind(&c, "shop-legacy", "es").await.is_ok());
    assert!(bind(&c, "shop-eu", "es").await.is_ok());
    let err = bind(&c, "ops", "es").await.unwrap_err();
    assert!(matches!(err, BindingError::NotAdmitted { .. }), "{err}");
}

/// A selector with one requirement on the label `env`.
fn req(op: &str, values: &[&str]) -> LabelSelector {
    LabelSelector {
        match_expressions: vec![LabelSelectorRequirement {
            key: "env".into(),
            operator: op.into(),
            values: values.iter().map(|s| s.to_string()).collect(),
        }],
        ..Default::default()
    }
}

#[test]
fn selector_expressions() {
    let labels = BTreeMap::from([("env".to_string(), "prod".to_string())]);
    assert!(selector_matches(&req("In", &["prod"]), &labels).is_ok());
    assert!(selector_matches(&req("NotIn", &["prod"]), &labels).is_err());
    assert!(selector_matches(&req("Exists", &[]), &labels).is_ok());
    assert!(selector_matches(&req("DoesNotExist", &[]), &labels).is_err());
    assert!(selector_matches(&req("Bogus", &[]), &labels).is_err());
}

#[test]
fn invalid_selector_requirements_admit_nothing() {
    // `NotIn` with no values would match every namespace; Kubernetes calls it invalid.
    let none = BTreeMap::new();
    for (op, values) in [
        ("NotIn", &[][..]),
        ("In", &[][..]),
        ("Exists", &["x"][..]),
        ("DoesNotExist", &["x"][..]),
    ] {
        let err = selector_matches(&req(op, values), &none).unwrap_err();
        assert!(err.contains("invalid requirement"), "{op}: {err}");
    }
}
