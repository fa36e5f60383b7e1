//! Pushes to the `kubernetes` provider against the fake API server, as the service account with
//! exactly the RBAC it is given: keys written into a Secret marked as Latchkey's, nothing
//! written over or deleted that is not marked, a Secret changed during a push not overwritten,
//! and no value in any error.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use latchkey::providers::ProviderError;
use latchkey::providers::kubernetes_push::{KubernetesPush, MARK_LABEL};
use latchkey::providers::push::{PushError, PushPolicy, PushValue, Pushed, Pusher};
use latchkey::secret::SecretBytes;
use serde_json::{Value, json};
use support::apiserver::{FakeApiServer, Identity};

const PASSWORD: &str = "k8s-push-password-3391";
const NEW_PASSWORD: &str = "k8s-push-password-rotated-7720";
const THEIRS: &str = "k8s-someone-elses-value-0415";
const WRITER: &str = "writer-token";
const READER: &str = "reader-token";

const REPLACE: PushPolicy = PushPolicy {
    if_not_exists: false,
    adopt: false,
};

fn props(pairs: &[(&str, &str)]) -> PushValue {
    PushValue::Properties(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), SecretBytes::from(*v)))
            .collect::<BTreeMap<_, _>>(),
    )
}

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
    assert!(
        matches!(&err, PushError::Backend(ProviderError::Unavailable(m)) if m.contains("changed while")),
        "{err:?}"
    );
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
