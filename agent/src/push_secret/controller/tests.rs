//! Unit tests of the PushSecret loop's pure helpers; the loop itself is tested end to end in
//! tests/push_secret.rs.

use super::helpers::*;
use super::*;
use crate::api::StoreKind;

fn object(refresh: Option<&str>) -> PushSecret {
    serde_json::from_value(json!({
        "apiVersion": "latchkey.dev/v1alpha1", "kind": "PushSecret",
        "metadata": {"name": "db", "namespace": "shop"},
        "spec": {
            "refreshInterval": refresh,
            "secretStoreRefs": [{"name": "aws", "kind": "ClusterSecretStore"}, {"name": "fake"}],
            "selector": {"secret": {"name": "db"}},
            "data": [
                {"match": {"secretKey": "a", "remoteRef": {"remoteKey": "prod/db", "property": "a"}}},
                {"match": {"secretKey": "b", "remoteRef": {"remoteKey": "prod/db", "property": "b"}}},
                {"match": {"secretKey": "c", "remoteRef": {"remoteKey": "prod/cert"}}},
            ]}
    }))
    .unwrap()
}

#[test]
fn store_keys_of_the_status_parse_back() {
    assert_eq!(
        parse_store_key("SecretStore/fake"),
        Some((StoreKind::SecretStore, "fake"))
    );
    assert_eq!(
        parse_store_key("ClusterSecretStore/aws"),
        Some((StoreKind::ClusterSecretStore, "aws"))
    );
    assert_eq!(parse_store_key("Vault/x"), None);
    assert_eq!(parse_store_key("nothing"), None);
}

#[test]
fn messages_name_stores_and_remote_keys_and_stay_bounded() {
    assert_eq!(
        describe_targets(&object(None)),
        "ClusterSecretStore/aws, SecretStore/fake (remote keys prod/cert, prod/db)"
    );
    let long = bounded("é".repeat(MAX_MESSAGE));
    assert!(long.len() <= MAX_MESSAGE + 3, "{}", long.len());
    assert!(long.ends_with("..."));
}

#[test]
fn a_tenant_cannot_make_the_controller_spin() {
    assert_eq!(refresh(&object(None)), DEFAULT_REFRESH);
    assert_eq!(refresh(&object(Some("1ms"))), MIN_REFRESH);
    assert_eq!(refresh(&object(Some("10m"))), Duration::from_secs(600));
    assert_eq!(refresh(&object(Some("0"))), Duration::from_secs(24 * 3600));
    assert_eq!(refresh(&object(Some("not a duration"))), DEFAULT_REFRESH);
}

#[test]
fn selector_refs_are_named_by_their_selector() {
    let mut ps = object(None);
    ps.spec.secret_store_refs = serde_json::from_value(json!([
        {"name": "fake"},
        {"labelSelector": {"matchLabels": {"push": "yes"},
                           "matchExpressions": [
                               {"key": "tier", "operator": "NotIn", "values": ["dev", "test"]},
                               {"key": "old", "operator": "DoesNotExist"},
                               {"key": "team", "operator": "Exists"}]}},
        {"kind": "ClusterSecretStore", "labelSelector": {}},
    ]))
    .unwrap();
    assert_eq!(
        describe_targets(&ps),
        "SecretStore/fake, SecretStore{push=yes,tier notin (dev,test),!old,team}, \
         ClusterSecretStore{} (remote keys prod/cert, prod/db)"
    );
}

#[test]
fn a_selector_that_could_not_be_expanded_keeps_only_its_kind() {
    let mut selection = store::Selection::default();
    selection
        .unresolved
        .insert(StoreKind::SecretStore.to_string());
    assert!(selection.keeps("SecretStore/a"));
    assert!(!selection.keeps("ClusterSecretStore/a"));
    selection.unresolved.clear();
    assert!(!selection.keeps("SecretStore/a"));
}

#[test]
fn only_a_change_of_a_stores_labels_starts_pushes() {
    let seen = store::StoreLabels::default();
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert!(seen.changed("shop/a".into(), &labels(&[("push", "yes")])));
    // A spec or status change of the store: the same labels.
    assert!(!seen.changed("shop/a".into(), &labels(&[("push", "yes")])));
    assert!(seen.changed("shop/a".into(), &labels(&[])));
    assert!(seen.changed("shop/b".into(), &labels(&[])));
}

#[tokio::test(start_paused = true)]
async fn a_label_change_starts_its_push_secrets_again_a_second_later() {
    let (echo, later) = Echo::new();
    let push_secret = ObjectRef::<Lenient<PushSecret>>::new("fanout").within("shop");
    let start = tokio::time::Instant::now();
    let now = echo.and_later(vec![push_secret.clone()]);
    assert_eq!(now, std::slice::from_ref(&push_secret));
    assert!(echo.and_later(Vec::new()).is_empty());
    let mut later = Box::pin(later);
    assert_eq!(later.next().await, Some(push_secret));
    assert!(start.elapsed() >= Duration::from_secs(1));
}
