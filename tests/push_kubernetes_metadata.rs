//! `spec.data[].metadata` pushed to the `kubernetes` provider against the fake API server:
//! labels and annotations set on a new Secret, `targetMergePolicy` Merge / Replace / Ignore on
//! an existing one, all in the one write that carries the data and the mark (kept in every
//! case), labels Kubernetes would refuse and another `remoteNamespace` refused before any
//! request, and no value in any error.

mod support;

use std::collections::BTreeMap;

use base64::Engine as _;
use latchkey::api::push_metadata::{PushMetadataSpec, TargetMergePolicy};
use latchkey::providers::kubernetes::push::{KubernetesPush, MARK_LABEL};
use latchkey::providers::push::{MAX_PUSH_BYTES, PushError, Pusher};
use serde_json::{Value, json};
use support::apiserver::{FakeApiServer, Identity};
use support::push::{REPLACE, props};

const PASSWORD: &str = "k8s-meta-password-6671";
const NEW_PASSWORD: &str = "k8s-meta-password-rotated-1208";
const WRITER: &str = "writer-token";
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn settings(
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
    target: Option<TargetMergePolicy>,
) -> PushMetadataSpec {
    PushMetadataSpec {
        labels: map(labels),
        annotations: map(annotations),
        target_merge_policy: target,
        ..Default::default()
    }
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn secret(s: &FakeApiServer, name: &str) -> Value {
    s.get("v1", "Secret", Some("shop"), name).unwrap()
}

/// Labels and annotations of Secret `name` (Null when it has none).
fn meta(s: &FakeApiServer, name: &str) -> (Value, Value) {
    let m = &secret(s, name)["metadata"];
    (m["labels"].clone(), m["annotations"].clone())
}

/// The writes (anything but GET) to Secret `name` so far.
fn writes(s: &FakeApiServer, name: &str) -> usize {
    s.requests()
        .iter()
        .filter(|r| r.method != "GET" && r.path.ends_with(&format!("/secrets/{name}")))
        .count()
        + s.requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/secrets"))
            .count()
}

fn assert_no_value(err: &PushError) {
    let text = format!("{err} {err:?}");
    for value in [PASSWORD, NEW_PASSWORD] {
        assert!(!text.contains(value), "a value leaked: {text}");
    }
}

/// Namespace `shop`, where `writer` may get, create, update and delete Secrets.
async fn cluster() -> FakeApiServer {
    let s = FakeApiServer::start().await;
    s.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}));
    let writer = Identity::service_account("shop", "writer");
    s.add_identity(WRITER, writer.clone());
    for verb in ["get", "create", "update", "delete"] {
        s.allow(writer.clone(), verb, "", "secrets", Some("shop"));
    }
    s
}

#[tokio::test]
async fn labels_and_annotations_follow_the_target_merge_policy_in_the_one_write() {
    let s = cluster().await;
    let push = KubernetesPush::from_client(s.client(WRITER).await, "shop");
    let value = props(&[("password", PASSWORD)]);

    // Created: ours and the mark, whatever the policy (Ignore has nothing to leave).
    let first = settings(
        &[("team", "shop")],
        &[("example.com/owner", "ops")],
        Some(TargetMergePolicy::Ignore),
    );
    push.push_with("db", &value, REPLACE, &first).await.unwrap();
    assert_eq!(
        meta(&s, "db"),
        (
            json!({"team": "shop", MARK_LABEL: "latchkey"}),
            json!({"example.com/owner": "ops"})
        )
    );
    assert_eq!(writes(&s, "db"), 1);

    // Someone else labels and annotates it, kubectl's copy of its values included.
    let mut theirs = secret(&s, "db");
    theirs["metadata"]["labels"]["theirs"] = json!("yes");
    theirs["metadata"]["annotations"]["example.com/audit"] = json!("2026-11");
    theirs["metadata"]["annotations"][LAST_APPLIED] = json!(format!(
        "{{\"data\":{{\"password\":\"{}\"}}}}",
        b64(PASSWORD)
    ));
    s.apply(theirs);

    // Merge (the default): theirs kept, ours set, in the data's own update.
    s.clear_requests();
    let value = props(&[("password", NEW_PASSWORD)]);
    let merge = settings(
        &[("team", "payments")],
        &[("example.com/owner", "sec")],
        None,
    );
    push.push_with("db", &value, REPLACE, &merge).await.unwrap();
    let (labels, annotations) = meta(&s, "db");
    assert_eq!(
        labels,
        json!({"team": "payments", "theirs": "yes", MARK_LABEL: "latchkey"})
    );
    assert_eq!(annotations["example.com/owner"], "sec");
    assert_eq!(annotations["example.com/audit"], "2026-11");
    assert_eq!(writes(&s, "db"), 1, "one write: {:?}", s.requests());

    // Ignore: left as they are.
    let ignore = settings(
        &[("team", "other")],
        &[("example.com/owner", "other")],
        Some(TargetMergePolicy::Ignore),
    );
    push.push_with("db", &props(&[("password", PASSWORD)]), REPLACE, &ignore)
        .await
        .unwrap();
    let (labels, annotations) = meta(&s, "db");
    assert_eq!(
        labels,
        json!({"team": "payments", "theirs": "yes", MARK_LABEL: "latchkey"})
    );
    assert_eq!(annotations["example.com/owner"], "sec");
    let data = &secret(&s, "db")["data"];
    assert_eq!(data["password"], b64(PASSWORD), "the data is still pushed");

    // Replace: exactly ours and the mark; theirs and kubectl's copy gone.
    let replace = settings(
        &[("team", "final")],
        &[("example.com/owner", "sec")],
        Some(TargetMergePolicy::Replace),
    );
    push.push_with("db", &value, REPLACE, &replace)
        .await
        .unwrap();
    assert_eq!(
        meta(&s, "db"),
        (
            json!({"team": "final", MARK_LABEL: "latchkey"}),
            json!({"example.com/owner": "sec"})
        )
    );
    // Replace with no annotations leaves none.
    let bare = settings(&[], &[], Some(TargetMergePolicy::Replace));
    push.push_with("db", &value, REPLACE, &bare).await.unwrap();
    assert_eq!(
        meta(&s, "db"),
        (json!({MARK_LABEL: "latchkey"}), Value::Null)
    );
}

#[tokio::test]
async fn what_kubernetes_would_refuse_is_refused_before_any_request() {
    let s = cluster().await;
    let push = KubernetesPush::from_client(s.client(WRITER).await, "shop");
    let value = props(&[("password", PASSWORD)]);
    push.push("db", &value, REPLACE).await.unwrap();
    let version = secret(&s, "db")["metadata"]["resourceVersion"].clone();

    let long_value = format!("{PASSWORD}-{}", "x".repeat(63));
    let big = "a".repeat(MAX_PUSH_BYTES / 2);
    let cases: Vec<(PushMetadataSpec, &str, &str)> = vec![
        (
            settings(&[("bad key!", "x")], &[], None),
            "labels",
            "\"bad key!\" is not a Kubernetes label key",
        ),
        (
            settings(&[("UPPER.example.com/x", "x")], &[], None),
            "labels",
            "is not a Kubernetes label key",
        ),
        (
            settings(&[("team", &long_value)], &[], None),
            "labels",
            "the value of label \"team\" is not a Kubernetes label value",
        ),
        (
            settings(&[("team", "-x")], &[], None),
            "labels",
            "the value of label \"team\"",
        ),
        (
            settings(&[], &[("a b", PASSWORD)], None),
            "annotations",
            "\"a b\" is not a Kubernetes annotation key",
        ),
        (
            settings(&[], &[(LAST_APPLIED, PASSWORD)], None),
            "annotations",
            "is kubectl's copy of what was applied",
        ),
        (
            settings(
                &[],
                &[("example.com/a", &big), ("example.com/b", &big)],
                None,
            ),
            "annotations",
            "over the limit of 65536 for one push",
        ),
        (
            PushMetadataSpec {
                remote_namespace: Some("prod".into()),
                ..Default::default()
            },
            "remoteNamespace",
            "this store writes namespace \"shop\", not \"prod\"",
        ),
    ];
    s.clear_requests();
    for (bad, field, says) in &cases {
        let err = push.check_metadata(bad).unwrap_err();
        assert!(matches!(err, PushError::BadMetadata { .. }), "{err}");
        assert_eq!(err.reason(), "Unsupported");
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("spec.data[].metadata.spec.{field}: ")),
            "{text}"
        );
        assert!(text.contains(says), "{says}: {text}");
        assert_no_value(&err);
        // The push checks first: no request at all, for an existing Secret or a new one.
        for name in ["db", "new"] {
            let err = push
                .push_with(name, &props(&[("password", NEW_PASSWORD)]), REPLACE, bad)
                .await
                .unwrap_err();
            assert!(matches!(err, PushError::BadMetadata { .. }), "{err}");
        }
    }
    assert!(s.requests().is_empty(), "{:?}", s.requests());
    assert_eq!(secret(&s, "db")["metadata"]["resourceVersion"], version);
    assert!(s.get("v1", "Secret", Some("shop"), "new").is_none());

    // The store's own namespace, valid keys at the limits, ESO's prefixed keys: taken.
    let good = PushMetadataSpec {
        remote_namespace: Some("shop".into()),
        labels: map(&[
            (&format!("{}/{}", "p".repeat(253 - 2), "n"), &"v".repeat(63)),
            ("app.kubernetes.io/name", "db"),
            ("empty", ""),
        ]),
        annotations: map(&[("example.com/note", "any text, even: spaces / quotes \"")]),
        ..Default::default()
    };
    push.check_metadata(&good).unwrap();
    push.push_with("db", &value, REPLACE, &good).await.unwrap();
    assert_eq!(meta(&s, "db").0["app.kubernetes.io/name"], "db");
}

const CONTROLLER_TOKEN: &str = "k8s-meta-controller-token";

/// The real controller: an entry's labels and annotations reach the Secret; another
/// `remoteNamespace` or a label Kubernetes would refuse fails the PushSecret naming the field
/// and remote key, with nothing created.
#[tokio::test(flavor = "multi_thread")]
async fn the_controller_sets_labels_and_refuses_what_the_store_cannot_take() {
    let s = cluster().await;
    support::push::kubernetes_push_controller(&s, CONTROLLER_TOKEN, PASSWORD);
    let push_secret = |remote: &str, meta: Value| {
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "PushSecret",
            "metadata": {"name": format!("to-{remote}"), "namespace": "shop"},
            "spec": {"serviceAccountName": "writer", "deletionPolicy": "None",
                     "secretStoreRefs": [{"name": "cluster"}],
                     "selector": {"secret": {"name": "db"}},
                     "data": [{"match": {"secretKey": "password",
                               "remoteRef": {"remoteKey": remote, "property": "password"}},
                               "metadata": {
                                   "apiVersion": "kubernetes.external-secrets.io/v1alpha1",
                                   "kind": "PushSecretMetadata", "spec": meta}}]}})
    };
    s.apply(push_secret(
        "labelled",
        json!({"labels": {"team": "shop"}, "annotations": {"example.com/owner": "ops"},
               "remoteNamespace": "shop", "sourceMergePolicy": "Replace",
               "targetMergePolicy": "Replace"}),
    ));
    s.apply(push_secret("elsewhere", json!({"remoteNamespace": "prod"})));
    s.apply(push_secret(
        "badlabel",
        json!({"labels": {"bad key!": PASSWORD}}),
    ));
    let c = support::controller::ControllerProcess::start(
        &s.kubeconfig_yaml(CONTROLLER_TOKEN),
        "k8s-meta",
        &[],
    )
    .await;
    let within = std::time::Duration::from_secs(15);
    let failed = |name: &str| {
        let ps = s.get("latchkey.dev/v1alpha1", "PushSecret", Some("shop"), name)?;
        let conditions = ps["status"]["conditions"].as_array()?.clone();
        conditions
            .into_iter()
            .find(|c| c["type"] == "Ready" && c["status"] == "False")
    };
    support::eventually(within, "pushed with labels", || async {
        s.get("v1", "Secret", Some("shop"), "labelled").is_some()
    })
    .await;
    assert_eq!(
        meta(&s, "labelled"),
        (
            json!({"team": "shop", MARK_LABEL: "latchkey"}),
            json!({"example.com/owner": "ops"})
        )
    );
    for (name, says) in [
        (
            "to-elsewhere",
            "remote key \"elsewhere\": spec.data[].metadata.spec.remoteNamespace: this store \
             writes namespace \"shop\", not \"prod\"",
        ),
        (
            "to-badlabel",
            "remote key \"badlabel\": spec.data[].metadata.spec.labels: \"bad key!\" is not a \
             Kubernetes label key",
        ),
    ] {
        support::eventually(within, name, || async { failed(name).is_some() }).await;
        let condition = failed(name).unwrap();
        assert_eq!(condition["reason"], "Unsupported", "{condition}");
        let message = condition["message"].as_str().unwrap();
        assert!(message.contains("SecretStore/cluster"), "{message}");
        assert!(message.contains(says), "{says}: {message}");
    }
    for name in ["elsewhere", "badlabel"] {
        assert!(s.get("v1", "Secret", Some("shop"), name).is_none());
    }
    let log = c.log_text();
    let events = serde_json::to_string(&s.events()).unwrap();
    assert!(!log.contains(PASSWORD) && !log.contains(&b64(PASSWORD)));
    // The label value (the password here) is the PushSecret's own spec, which is shown as
    // written; what Latchkey reports (status and Events) never repeats it.
    let status_only = s
        .objects("latchkey.dev/v1alpha1", "PushSecret")
        .iter()
        .map(|p| p["status"].to_string())
        .collect::<String>();
    for text in [&status_only, &events] {
        assert!(!text.contains(PASSWORD), "a value leaked: {text}");
        assert!(!text.contains(&b64(PASSWORD)), "a value leaked");
    }
}
