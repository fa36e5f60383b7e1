//! PushSecret stores chosen by `labelSelector` and values computed by `spec.template`, end to
//! end: `latchkey controller` against the fake API server with the deploy files' RBAC, `fake`
//! stores (kept in the controller's memory; the status says where a push went) and a
//! `kubernetes` store (whose Secret shows what was written).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::support::apiserver::{FakeApiServer, Identity};
use crate::support::controller::ControllerProcess;
use base64::Engine as _;
use serde_json::{Value, json};

const API: &str = "latchkey.dev/v1alpha1";
const TOKEN: &str = "push-select-controller-token";
const PASSWORD: &str = "push-select-password-6620";

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// Namespaces `latchkey` and `shop`, the Secret `db` there, and the account `pusher`, which
/// may read and write Secrets of `shop`; the controller has exactly the deploy files' rights.
async fn cluster() -> FakeApiServer {
    let s = crate::support::push::controller_cluster(TOKEN, &["pusher"]).await;
    let pusher = Identity::service_account("shop", "pusher");
    for verb in ["create", "update", "delete"] {
        s.allow(pusher.clone(), verb, "", "secrets", Some("shop"));
    }
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "shop"},
        "data": {"password": b64(PASSWORD), "username": b64("app")}}));
    s
}

fn fake_store(s: &FakeApiServer, kind: &str, name: &str, labels: Value, conditions: Value) {
    let mut store = json!({"apiVersion": API, "kind": kind,
        "metadata": {"name": name, "labels": labels},
        "spec": {"provider": {"fake": {"data": []}}}});
    if kind == "SecretStore" {
        store["metadata"]["namespace"] = json!("shop");
    } else {
        store["spec"]["conditions"] = conditions;
    }
    s.apply(store);
}

fn push_secret(name: &str, refs: Value, extra: Value) -> Value {
    let mut ps = json!({"apiVersion": API, "kind": "PushSecret",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {
            "serviceAccountName": "pusher",
            "refreshInterval": "5s",
            "deletionPolicy": "Delete",
            "secretStoreRefs": refs,
            "selector": {"secret": {"name": "db"}},
            "data": [{"match": {"secretKey": "password",
                                "remoteRef": {"remoteKey": "prod/db", "property": "password"}}}]}});
    if let (Some(spec), Some(extra)) = (ps["spec"].as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    ps
}

/// Polls `check` every 50 ms for up to `within`; the controller's log shows on a timeout.
async fn eventually<T>(
    c: &ControllerProcess,
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; controller log:\n{}",
            c.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn ready(s: &FakeApiServer, name: &str) -> Option<Value> {
    let ps = s.get(API, "PushSecret", Some("shop"), name)?;
    let conditions = ps["status"]["conditions"].as_array()?.clone();
    conditions.into_iter().find(|c| c["type"] == "Ready")
}

/// The stores `status.syncedPushSecrets` lists.
fn synced_stores(s: &FakeApiServer, name: &str) -> Option<BTreeSet<String>> {
    let ps = s.get(API, "PushSecret", Some("shop"), name)?;
    Some(
        ps["status"]["syncedPushSecrets"]
            .as_object()?
            .keys()
            .cloned()
            .collect(),
    )
}

fn set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

fn assert_no_value(s: &FakeApiServer, c: &ControllerProcess, names: &[&str]) {
    let shown = crate::support::push::shown(s, c, names);
    assert!(!shown.contains(PASSWORD), "the password is shown");
    assert!(!shown.contains(&b64(PASSWORD)), "the password is shown");
}

#[tokio::test]
async fn a_label_selector_pushes_to_every_labelled_store_and_follows_the_labels() {
    let s = cluster().await;
    let yes = json!({"push": "yes"});
    fake_store(&s, "SecretStore", "a", yes.clone(), Value::Null);
    fake_store(&s, "SecretStore", "b", yes.clone(), Value::Null);
    fake_store(&s, "SecretStore", "c", json!({}), Value::Null);
    // Labelled alike: one admits `shop`, one does not (a named ref to it would be refused).
    fake_store(&s, "ClusterSecretStore", "wide", yes.clone(), json!([]));
    let billing = json!([{"namespaces": ["billing"]}]);
    fake_store(&s, "ClusterSecretStore", "narrow", yes.clone(), billing);
    for i in 0..17 {
        fake_store(
            &s,
            "SecretStore",
            &format!("bulk-{i}"),
            json!({"bulk": "yes"}),
            Value::Null,
        );
    }
    let by_label = |kind: &str, labels: &Value| json!({"kind": kind, "labelSelector": {"matchLabels": labels}});
    // Refreshed hourly: only the store watch can make it follow a relabelling in the test.
    s.apply(push_secret(
        "fanout",
        json!([
            by_label("SecretStore", &yes),
            by_label("ClusterSecretStore", &yes)
        ]),
        json!({"refreshInterval": "1h"}),
    ));
    s.apply(push_secret(
        "too-many",
        json!([{"name": "a"}, by_label("SecretStore", &json!({"bulk": "yes"}))]),
        json!({"deletionPolicy": "None"}),
    ));
    s.apply(push_secret(
        "none",
        json!([by_label("SecretStore", &json!({"nothing": "here"}))]),
        json!({"deletionPolicy": "None"}),
    ));
    let c = ControllerProcess::start(&s.kubeconfig_yaml(TOKEN), "push-select", &[]).await;
    let within = Duration::from_secs(15);

    // The two labelled SecretStores and the one ClusterSecretStore that admits `shop`.
    let expected = set(&["ClusterSecretStore/wide", "SecretStore/a", "SecretStore/b"]);
    eventually(&c, within, "the push to the labelled stores", || {
        (synced_stores(&s, "fanout")? == expected).then_some(())
    })
    .await;
    let condition = ready(&s, "fanout").unwrap();
    assert_eq!(condition["status"], "True", "{condition}");

    // More stores than a PushSecret may write: none of the selected ones written, said so;
    // the named store is written.
    let condition = eventually(&c, within, "the refusal of 17 stores", || {
        ready(&s, "too-many").filter(|c| c["status"] == "False")
    })
    .await;
    assert_eq!(condition["reason"], "TooManyStores", "{condition}");
    let message = condition["message"].as_str().unwrap();
    for part in [
        "PushSecret shop/too-many, secretStoreRefs[1] SecretStore{bulk=yes}",
        "selects 17 stores",
        "at most 16",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    eventually(&c, within, "the named store written", || {
        (synced_stores(&s, "too-many")? == set(&["SecretStore/a"])).then_some(())
    })
    .await;
    let condition = eventually(&c, within, "a selector matching nothing", || {
        ready(&s, "none").filter(|c| c["status"] == "False")
    })
    .await;
    assert_eq!(condition["reason"], "NoStoreSelected", "{condition}");

    // A store that gains the label is written within seconds (the controller watches the
    // stores' labels); one that loses it is treated as a ref removed from the spec: with
    // Delete, what was pushed there goes.
    // Past the reconcile its own status write starts, so that only the watch can notice.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let labelled = Instant::now();
    fake_store(&s, "SecretStore", "c", yes.clone(), Value::Null);
    fake_store(&s, "SecretStore", "a", json!({}), Value::Null);
    let expected = set(&["ClusterSecretStore/wide", "SecretStore/b", "SecretStore/c"]);
    eventually(&c, within, "the stores relabelled", || {
        (synced_stores(&s, "fanout")? == expected).then_some(())
    })
    .await;
    eprintln!("labels followed after {:?}", labelled.elapsed());
    let log = c.log_text();
    assert!(
        log.lines().any(|l| l.contains("no longer pushed: deleted")
            && l.contains("SecretStore/a")
            && l.contains("prod/db")),
        "{log}"
    );
    assert_no_value(&s, &c, &["fanout", "too-many", "none"]);
}

/// The data of the Secret `shop/name`, decoded.
fn secret_data(s: &FakeApiServer, name: &str, key: &str) -> Option<String> {
    let secret = s.get("v1", "Secret", Some("shop"), name)?;
    let encoded = secret["data"][key].as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    String::from_utf8(bytes).ok()
}

fn resource_version(s: &FakeApiServer, name: &str) -> Option<String> {
    let secret = s.get("v1", "Secret", Some("shop"), name)?;
    secret["metadata"]["resourceVersion"]
        .as_str()
        .map(String::from)
}

#[tokio::test]
async fn a_template_computes_what_is_pushed_and_a_change_of_it_pushes_again() {
    let s = cluster().await;
    s.apply(json!({"apiVersion": API, "kind": "SecretStore",
        "metadata": {"name": "cluster", "namespace": "shop"},
        "spec": {"provider": {"kubernetes": {}}}}));
    let templated = |name: &str, expression: &str| {
        push_secret(
            name,
            json!([{"name": "cluster"}]),
            json!({"template": {"data": {"url": expression}},
                   "data": [{"match": {"secretKey": "url",
                             "remoteRef": {"remoteKey": format!("{name}-out"),
                                           "property": "url"}}}]}),
        )
    };
    let url = "'postgres://%s:%s@db'.format([secret.username, secret.password])";
    s.apply(templated("url", url));
    // A value that is no number: the error must not quote it.
    s.apply(templated("broken", "int(secret.password)"));
    s.install("providers.latchkey.dev/v1alpha1", "Kubernetes");
    let c = ControllerProcess::start(&s.kubeconfig_yaml(TOKEN), "push-template", &[]).await;
    let within = Duration::from_secs(15);

    let expected = format!("postgres://app:{PASSWORD}@db");
    eventually(&c, within, "the computed value", || {
        (secret_data(&s, "url-out", "url")? == expected).then_some(())
    })
    .await;
    // The status follows the write.
    eventually(&c, within, "Ready", || {
        ready(&s, "url").filter(|c| c["status"] == "True")
    })
    .await;

    // Two refreshes (5 s each) with nothing changed: evaluated again, nothing written.
    let version = resource_version(&s, "url-out").unwrap();
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(resource_version(&s, "url-out").unwrap(), version);
    let writes = |c: &ControllerProcess| {
        c.log_text()
            .lines()
            .filter(|l| l.contains("pushed") && l.contains("remote_key=url-out"))
            .count()
    };
    assert_eq!(writes(&c), 1, "{}", c.log_text());

    // The template changes, the Secret does not: pushed again.
    let mut edited = s.get(API, "PushSecret", Some("shop"), "url").unwrap();
    edited["spec"]["template"]["data"]["url"] = json!("'mysql://%s@db'.format([secret.username])");
    s.apply(edited);
    eventually(&c, within, "the new template's value", || {
        (secret_data(&s, "url-out", "url")? == "mysql://app@db").then_some(())
    })
    .await;
    assert_eq!(writes(&c), 2, "{}", c.log_text());

    // An expression that fails: a condition naming the PushSecret and the key, no value.
    let condition = eventually(&c, within, "the template error", || {
        ready(&s, "broken").filter(|c| c["status"] == "False")
    })
    .await;
    assert_eq!(condition["reason"], "TemplateFailed", "{condition}");
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.contains("PushSecret shop/broken: spec.template.data[\"url\"]: "),
        "{message}"
    );
    assert!(s.get("v1", "Secret", Some("shop"), "broken-out").is_none());
    let reasons: Vec<String> = s
        .events()
        .iter()
        .filter_map(|e| e["reason"].as_str().map(String::from))
        .collect();
    assert!(reasons.iter().any(|r| r == "PushFailed"), "{reasons:?}");
    assert_no_value(&s, &c, &["url", "broken"]);
}
