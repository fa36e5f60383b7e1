//! When a PushSecret's generator makes a new value: the pure decisions, over states and
//! statuses as the API server holds them. The loop itself: tests/push_generated.rs.

use serde_json::json;

use super::*;

fn object(refresh: Option<&str>) -> PushSecret {
    serde_json::from_value(json!({
        "apiVersion": "latchkey.dev/v1alpha1", "kind": "PushSecret",
        "metadata": {"name": "db", "namespace": "shop", "uid": "u-1"},
        "spec": {
            "refreshInterval": refresh,
            "secretStoreRefs": [{"name": "a"}, {"name": "b"}],
            "selector": {"generatorRef": {"kind": "Password", "name": "pw"}},
            "data": [{"match": {"secretKey": "password",
                                "remoteRef": {"remoteKey": "prod/db"}}}]}
    }))
    .unwrap()
}

fn reference() -> GeneratorRef {
    serde_json::from_value(json!({"kind": "Password", "name": "pw"})).unwrap()
}

/// Every store of [`object`] lists `prod/db`.
fn synced() -> PushSecretStatus {
    serde_json::from_value(json!({"syncedPushSecrets": {
        "SecretStore/a": {"prod/db": {"version": "1"}},
        "SecretStore/b": {"prod/db": {"version": "4"}}}}))
    .unwrap()
}

/// The stores the PushSecret of [`object`] writes.
fn stores() -> std::collections::BTreeSet<String> {
    ["SecretStore/a".to_string(), "SecretStore/b".to_string()].into()
}

fn state(name: &str, created: &str, pushed: bool, deadline: bool) -> GeneratorState {
    let mut annotations = serde_json::Map::new();
    if pushed {
        annotations.insert(ANNOTATION_PUSHED.into(), json!(created));
    }
    serde_json::from_value(json!({
        "apiVersion": "generators.latchkey.dev/v1alpha1", "kind": "GeneratorState",
        "metadata": {"name": name, "namespace": "shop", "creationTimestamp": created,
                     "labels": {LABEL_GENERATOR: "Password.pw", LABEL_PUSH_SECRET: "db"},
                     "annotations": annotations},
        "spec": {"resource": {}, "garbageCollectionDeadline":
                    if deadline { json!("2026-01-01T00:00:00Z") } else { json!(null) }}
    }))
    .unwrap()
}

fn at(text: &str) -> SystemTime {
    SystemTime::from(text.parse::<k8s_openapi::jiff::Timestamp>().unwrap())
}

const HOUR: Duration = Duration::from_secs(3600);

#[test]
fn the_newest_state_pushed_everywhere_tells_when_the_next_value_is_due() {
    let o = object(Some("1h"));
    let due = |states: Vec<GeneratorState>, status: &PushSecretStatus, now: &str| {
        newest_due(
            states,
            "shop",
            &reference(),
            &o,
            Reached {
                status,
                stores: &stores(),
            },
            Some(HOUR),
            at(now),
        )
    };
    let now = "2026-11-29T10:20:00Z";
    let older = state("db-1", "2026-11-29T09:00:00Z", true, true);
    let newest = state("db-2", "2026-11-29T10:00:00Z", true, false);
    // 20 minutes after the last generation: 40 minutes to go, nothing new now.
    assert_eq!(
        due(vec![older.clone(), newest.clone()], &synced(), now),
        Some(Some(Duration::from_secs(40 * 60)))
    );
    // Past the interval: due now.
    assert_eq!(
        due(vec![newest.clone()], &synced(), "2026-11-29T11:00:01Z"),
        Some(Some(Duration::ZERO))
    );
    // No state, or only retired ones: a new value.
    assert_eq!(due(vec![], &synced(), now), None);
    assert_eq!(due(vec![older.clone()], &synced(), now), None);
    // The newest push did not reach every store before a restart: a new value everywhere.
    let unfinished = state("db-3", "2026-11-29T10:10:00Z", false, false);
    assert_eq!(due(vec![newest.clone(), unfinished], &synced(), now), None);
    // A store the status does not list (added while this process had no value): a new value.
    let mut partial = synced();
    partial.synced_push_secrets.remove("SecretStore/b");
    assert_eq!(due(vec![newest.clone()], &partial, now), None);
    // Another generator made it: a new value.
    let mut other = newest.clone();
    other
        .labels_mut()
        .insert(LABEL_GENERATOR.into(), "Password.other".into());
    assert_eq!(due(vec![other], &synced(), now), None);
    // A state of another namespace with the same label is not this PushSecret's.
    let mut elsewhere = newest.clone();
    elsewhere.metadata.namespace = Some("billing".into());
    assert_eq!(due(vec![elsewhere], &synced(), now), None);
    // refreshInterval 0: never again.
    assert_eq!(
        newest_due(
            vec![newest],
            "shop",
            &reference(),
            &o,
            Reached {
                status: &synced(),
                stores: &stores(),
            },
            None,
            at("2030-01-01T00:00:00Z")
        ),
        Some(None)
    );
}

#[test]
fn the_interval_follows_the_controller_s_refresh_rules() {
    let (default, floor) = (HOUR, Duration::from_secs(5));
    let every = |r: Option<&str>| interval(&object(r), default, floor);
    assert_eq!(every(None), Some(HOUR));
    assert_eq!(every(Some("720h")), Some(720 * HOUR));
    assert_eq!(every(Some("1ms")), Some(floor));
    assert_eq!(every(Some("0")), None);
    assert_eq!(every(Some("not a duration")), Some(HOUR));
    let made = at("2026-11-29T10:00:00Z");
    assert_eq!(
        due_in(made, Some(HOUR), at("2026-11-29T10:45:00Z")),
        Some(Duration::from_secs(15 * 60))
    );
    assert_eq!(
        due_in(made, Some(HOUR), at("2026-11-29T12:00:00Z")),
        Some(Duration::ZERO)
    );
    assert_eq!(due_in(made, None, at("2027-01-01T00:00:00Z")), None);
}

#[test]
fn a_key_the_output_lacks_is_named_without_any_value() {
    let o = object(None);
    let values = BTreeMap::from([("pass".to_string(), SecretBytes::from("hunter2-value"))]);
    let message = missing_key(&o, &values).unwrap();
    assert_eq!(
        message,
        "PushSecret shop/db: the generator's output has no key \"password\" \
         (spec.data[0].match.secretKey); it has pass"
    );
    let values = BTreeMap::from([("password".to_string(), SecretBytes::from("x"))]);
    assert_eq!(missing_key(&o, &values), None);
}
