//! Pushes to the `kubernetes` provider against the fake API server, as the service account with
//! exactly the RBAC it is given: keys written into a Secret marked as Latchkey's, nothing
//! written over or deleted that is not marked, a Secret changed during a push not overwritten,
//! and no value in any error.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use latchkey::providers::ProviderError;
use latchkey::providers::kubernetes::push::{KubernetesPush, MARK_LABEL};
use latchkey::providers::push::{PushError, PushPolicy, PushValue, Pushed, Pusher};
use latchkey::secret::SecretBytes;
use serde_json::{Value, json};
use support::apiserver::{FakeApiServer, Identity};
use support::push::{REPLACE, props};

const PASSWORD: &str = "k8s-push-password-3391";
const NEW_PASSWORD: &str = "k8s-push-password-rotated-7720";
const THEIRS: &str = "k8s-someone-elses-value-0415";
const WRITER: &str = "writer-token";
const READER: &str = "reader-token";

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn data(s: &FakeApiServer, name: &str) -> Option<BTreeMap<String, String>> {
    let secret = s.get("v1", "Secret", Some("shop"), name)?;
    let map = secret["data"].as_object().cloned().unwrap_or_default();
    Some(
        map.into_iter()
            .map(|(k, v)| {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(v.as_str().unwrap())
                    .unwrap();
                (k, String::from_utf8(bytes).unwrap())
            })
            .collect(),
    )
}

fn label(s: &FakeApiServer, name: &str) -> Value {
    s.get("v1", "Secret", Some("shop"), name).unwrap()["metadata"]["labels"][MARK_LABEL].clone()
}

fn assert_no_value(err: &PushError) {
    let text = format!("{err} {err:?}");
    for value in [PASSWORD, NEW_PASSWORD, THEIRS] {
        assert!(!text.contains(value), "a value leaked: {text}");
    }
}

/// Namespace `shop` with someone else's Secret `theirs`; `writer` may get, create, update and
/// delete Secrets there, `reader` only get them.
async fn cluster() -> FakeApiServer {
    let s = FakeApiServer::start().await;
    s.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}));
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "theirs", "namespace": "shop"},
        "data": {"password": b64(THEIRS)}}));
    let writer = Identity::service_account("shop", "writer");
    s.add_identity(WRITER, writer.clone());
    for verb in ["get", "create", "update", "delete"] {
        s.allow(writer.clone(), verb, "", "secrets", Some("shop"));
    }
    let reader = Identity::service_account("shop", "reader");
    s.add_identity(READER, reader.clone());
    s.allow(reader, "get", "", "secrets", Some("shop"));
    s
}

#[tokio::test]
async fn keys_are_written_into_a_marked_secret_and_only_what_was_pushed_is_removed() {
    let s = cluster().await;
    let push = KubernetesPush::from_client(s.client(WRITER).await, "shop");
    let first = push
        .push(
            "db",
            &props(&[("username", "app"), ("password", PASSWORD)]),
            REPLACE,
        )
        .await
        .unwrap();
    let Pushed::Written { version: v1 } = first else {
        panic!("not written: {first:?}");
    };
    assert_eq!(
        data(&s, "db").unwrap(),
        [("password", PASSWORD), ("username", "app")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into()
    );
    assert_eq!(label(&s, "db"), "latchkey");

    // A change: a new resourceVersion, the other key kept.
    let second = push
        .push("db", &props(&[("password", NEW_PASSWORD)]), REPLACE)
        .await
        .unwrap();
    assert!(
        matches!(&second, Pushed::Written { version } if *version != v1),
        "{second:?}"
    );
    assert_eq!(data(&s, "db").unwrap()["password"], NEW_PASSWORD);
    assert_eq!(data(&s, "db").unwrap()["username"], "app");

    // The same again (a restarted controller): read, and nothing written.
    let Pushed::Written { version: v2 } = second else {
        unreachable!()
    };
    let again = push
        .push("db", &props(&[("password", NEW_PASSWORD)]), REPLACE)
        .await
        .unwrap();
    assert_eq!(again, Pushed::Unchanged { version: v2 });

    // IfNotExists keeps what is there.
    let keep = PushPolicy {
        if_not_exists: true,
        adopt: false,
    };
    let kept = push
        .push("db", &props(&[("password", "x")]), keep)
        .await
        .unwrap();
    assert_eq!(kept, Pushed::Kept);
    assert_eq!(data(&s, "db").unwrap()["password"], NEW_PASSWORD);

    // A push without `property` cannot name a key.
    let whole = PushValue::Whole(SecretBytes::from(PASSWORD));
    let err = push.push("db", &whole, REPLACE).await.unwrap_err();
    assert!(err.to_string().contains("remoteRef.property"), "{err}");
    assert_no_value(&err);

    // Deleting one key leaves the others; deleting the rest removes the Secret it created.
    push.delete("db", &["password".to_string()]).await.unwrap();
    assert_eq!(
        data(&s, "db").unwrap(),
        [("username".to_string(), "app".to_string())].into()
    );
    push.delete("db", &["username".to_string()]).await.unwrap();
    assert!(s.get("v1", "Secret", Some("shop"), "db").is_none());
    // Gone already: done.
    push.delete("db", &[]).await.unwrap();
}

#[tokio::test]
async fn a_secret_latchkey_did_not_create_is_left_alone_unless_adopted() {
    let s = cluster().await;
    let push = KubernetesPush::from_client(s.client(WRITER).await, "shop");
    let err = push
        .push("theirs", &props(&[("password", PASSWORD)]), REPLACE)
        .await
        .unwrap_err();
    assert!(matches!(err, PushError::Conflict { .. }), "{err}");
    assert_no_value(&err);
    assert_eq!(data(&s, "theirs").unwrap()["password"], THEIRS);
    let err = push.delete("theirs", &[]).await.unwrap_err();
    assert!(matches!(err, PushError::Conflict { .. }), "{err}");
    assert!(s.get("v1", "Secret", Some("shop"), "theirs").is_some());

    // A store that adopts: the key is written beside theirs and the Secret marked. Deleting
    // what was pushed keeps their key.
    let adopt = PushPolicy {
        if_not_exists: false,
        adopt: true,
    };
    push.push("theirs", &props(&[("pushed", PASSWORD)]), adopt)
        .await
        .unwrap();
    assert_eq!(data(&s, "theirs").unwrap()["password"], THEIRS);
    assert_eq!(data(&s, "theirs").unwrap()["pushed"], PASSWORD);
    assert_eq!(label(&s, "theirs"), "latchkey");
    push.delete("theirs", &["pushed".to_string()])
        .await
        .unwrap();
    assert_eq!(
        data(&s, "theirs").unwrap(),
        [("password".to_string(), THEIRS.to_string())].into()
    );
}

#[tokio::test]
async fn a_secret_changed_during_a_push_is_not_written_over() {
    let s = cluster().await;
    let push = KubernetesPush::from_client(s.client(WRITER).await, "shop");
    push.push("db", &props(&[("password", PASSWORD)]), REPLACE)
        .await
        .unwrap();
    // The update is held while someone else changes the Secret: it then carries a stale
    // resourceVersion, and the API server refuses it.
    s.delay_next("PUT", "/secrets/db", Duration::from_millis(800), 1);
    let pushing = tokio::spawn(async move {
        push.push("db", &props(&[("password", NEW_PASSWORD)]), REPLACE)
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut theirs = s.get("v1", "Secret", Some("shop"), "db").unwrap();
    theirs["data"]["note"] = json!(b64(THEIRS));
    s.apply(theirs);
    let err = pushing.await.unwrap().unwrap_err();
    assert!(matches!(&err, PushError::Changed { .. }), "{err:?}");
    assert_no_value(&err);
    let now = data(&s, "db").unwrap();
    assert_eq!(now["password"], PASSWORD);
    assert_eq!(now["note"], THEIRS);
}

#[tokio::test]
async fn an_account_that_may_not_write_is_refused_by_name() {
    let s = cluster().await;
    let push = KubernetesPush::from_client(s.client(READER).await, "shop");
    let err = push
        .push("db", &props(&[("password", PASSWORD)]), REPLACE)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, PushError::Backend(ProviderError::PermissionDenied(_))),
        "{err:?}"
    );
    assert!(text.contains("cannot create Secret shop/db"), "{text}");
    assert_no_value(&err);
    assert!(s.get("v1", "Secret", Some("shop"), "db").is_none());
}

const CONTROLLER_TOKEN: &str = "k8s-push-controller-token";

/// The real controller, with the deploy files' RBAC, pushes into a Secret of the PushSecret's
/// namespace as its service account: every write to the target Secret is made with the
/// account's token, never the controller's.
#[tokio::test(flavor = "multi_thread")]
async fn the_controller_pushes_into_a_secret_as_the_service_account() {
    let s = cluster().await;
    support::push::kubernetes_push_controller(&s, CONTROLLER_TOKEN, PASSWORD);
    let push_secret = |remote: &str| {
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "PushSecret",
            "metadata": {"name": format!("to-{remote}"), "namespace": "shop"},
            "spec": {"serviceAccountName": "writer", "deletionPolicy": "Delete",
                     "secretStoreRefs": [{"name": "cluster"}],
                     "selector": {"secret": {"name": "db"}},
                     "data": [{"match": {"secretKey": "password",
                               "remoteRef": {"remoteKey": remote, "property": "password"}}}]}})
    };
    s.apply(push_secret("published"));
    s.apply(push_secret("theirs"));
    // Installed before the controller starts, which discovers the provider kinds served.
    s.install("providers.latchkey.dev/v1alpha1", "Kubernetes");
    let c = support::controller::ControllerProcess::start(
        &s.kubeconfig_yaml(CONTROLLER_TOKEN),
        "k8s-push",
        &[],
    )
    .await;
    let within = Duration::from_secs(15);
    let ready = |name: &str| {
        let ps = s.get("latchkey.dev/v1alpha1", "PushSecret", Some("shop"), name)?;
        let conditions = ps["status"]["conditions"].as_array()?.clone();
        conditions.into_iter().find(|c| c["type"] == "Ready")
    };
    support::eventually(within, "pushed", || async {
        data(&s, "published")
            .is_some_and(|d| d.get("password").map(String::as_str) == Some(PASSWORD))
    })
    .await;
    assert_eq!(label(&s, "published"), "latchkey");
    // Someone else's Secret: a conflict named in the condition, the Secret untouched.
    support::eventually(within, "the conflict", || async {
        ready("to-theirs").is_some_and(|c| c["reason"] == "Conflict")
    })
    .await;
    let message = ready("to-theirs").unwrap()["message"].to_string();
    for part in ["PushSecret shop/to-theirs", "SecretStore/cluster", "theirs"] {
        assert!(message.contains(part), "{message}");
    }
    assert_eq!(data(&s, "theirs").unwrap()["password"], THEIRS);

    // Gone before the Secret is adopted: a marked Secret is any PushSecret's to write.
    s.delete(
        "latchkey.dev/v1alpha1",
        "PushSecret",
        Some("shop"),
        "to-theirs",
    );

    // A store that adopts (spec.push.adoptExisting), its provider by providerRef: the key goes
    // in beside theirs and the Secret is marked; with IfNotExists nothing is written.
    s.install("providers.latchkey.dev/v1alpha1", "Kubernetes");
    s.apply(
        json!({"apiVersion": "providers.latchkey.dev/v1alpha1", "kind": "Kubernetes",
        "metadata": {"name": "here", "namespace": "shop"}, "spec": {}}),
    );
    s.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "SecretStore",
        "metadata": {"name": "adopting", "namespace": "shop"},
        "spec": {"providerRef": {"apiVersion": "providers.latchkey.dev/v1alpha1",
                                 "kind": "Kubernetes", "name": "here"},
                 "push": {"adoptExisting": true}}}),
    );
    let mut adopt = push_secret("theirs");
    adopt["metadata"]["name"] = json!("adopt-theirs");
    adopt["spec"]["secretStoreRefs"] = json!([{"name": "adopting"}]);
    adopt["spec"]["deletionPolicy"] = json!("None");
    adopt["spec"]["data"][0]["match"]["remoteRef"]["property"] = json!("pushed");
    let mut keep = adopt.clone();
    keep["metadata"]["name"] = json!("keep-theirs");
    keep["spec"]["updatePolicy"] = json!("IfNotExists");
    keep["spec"]["data"][0]["match"]["remoteRef"]["property"] = json!("kept");
    s.apply(keep);
    let kept = support::eventually(within, "kept", || async {
        ready("keep-theirs").is_some_and(|c| c["status"] == "True")
    });
    if tokio::time::timeout(within + Duration::from_secs(1), kept)
        .await
        .is_err()
    {
        panic!("{:?}", ready("keep-theirs"));
    }
    assert!(!data(&s, "theirs").unwrap().contains_key("kept"));
    s.apply(adopt);
    support::eventually(within, "adopted", || async {
        data(&s, "theirs").is_some_and(|d| d.get("pushed").map(String::as_str) == Some(PASSWORD))
    })
    .await;
    assert_eq!(data(&s, "theirs").unwrap()["password"], THEIRS);
    assert_eq!(label(&s, "theirs"), "latchkey");
    s.delete(
        "latchkey.dev/v1alpha1",
        "PushSecret",
        Some("shop"),
        "adopt-theirs",
    );
    s.delete(
        "latchkey.dev/v1alpha1",
        "PushSecret",
        Some("shop"),
        "keep-theirs",
    );

    // A change is pushed; the write is the account's.
    s.clear_requests();
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "shop"},
        "data": {"password": b64(NEW_PASSWORD)}}));
    support::eventually(within, "the change pushed", || async {
        data(&s, "published").is_some_and(|d| d["password"] == NEW_PASSWORD)
    })
    .await;
    let writes: Vec<_> = s
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/secrets/published") && r.method != "GET")
        .collect();
    assert!(!writes.is_empty());
    for w in &writes {
        assert_eq!(
            w.identity,
            Some(Identity::service_account("shop", "writer")),
            "{} {}",
            w.method,
            w.path
        );
    }

    // Deleted with deletionPolicy Delete: the Secret it created goes, theirs stays.
    s.delete(
        "latchkey.dev/v1alpha1",
        "PushSecret",
        Some("shop"),
        "to-published",
    );
    support::eventually(within, "the pushed Secret deleted", || async {
        s.get("v1", "Secret", Some("shop"), "published").is_none()
    })
    .await;
    assert_eq!(data(&s, "theirs").unwrap()["password"], THEIRS);

    let log = c.log_text();
    let statuses =
        serde_json::to_string(&s.objects("latchkey.dev/v1alpha1", "PushSecret")).unwrap();
    let events = serde_json::to_string(&s.events()).unwrap();
    for text in [&log, &statuses, &events] {
        for value in [
            PASSWORD,
            NEW_PASSWORD,
            THEIRS,
            &b64(PASSWORD),
            CONTROLLER_TOKEN,
        ] {
            assert!(!text.contains(value), "a value leaked");
        }
    }
}
