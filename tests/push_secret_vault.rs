//! PushSecret writes to Vault / OpenBao KV v2 against a real OpenBao dev server: created with
//! the custom metadata `managed-by: latchkey`, each write a check-and-set against the version
//! just read, nothing written over or deleted that Latchkey did not mark, KV v1 with the mark
//! in the secret (as ESO writes it), and no value or token in any error. Then the real controller pushing as the PushSecret's
//! service account (kubernetes login checked by the fake API server's TokenReview).

mod support;

use std::collections::BTreeMap;

use base64::Engine as _;
use latchkey::providers::ProviderError;
use latchkey::providers::push::{PushError, PushPolicy, PushValue, Pushed, Pusher};
use latchkey::secret::SecretBytes;
use serde_json::{Value, json};
use support::apiserver::FakeApiServer;
use support::controller::ControllerProcess;
use support::openbao::{JwtIssuer, OpenBao};
use support::push::{REPLACE, props};
use support::race_proxy::RaceProxy;
use support::vault_push::vault_pusher;

const PASSWORD: &str = "vault-push-password-3318";
const NEW_PASSWORD: &str = "vault-push-password-rotated-7720";
const THEIRS: &str = "someone-elses-vault-value-0451";
const AUDIENCE: &str = "vault";

/// What a pushing identity needs on the `secret/` mount (as docs/push-secret.md says).
const PUSH_POLICY: &str = r#"
path "secret/data/*" { capabilities = ["create", "read", "update", "delete"] }
path "secret/metadata/*" { capabilities = ["create", "read", "update", "delete"] }
path "kv1/*" { capabilities = ["create", "read", "update", "delete"] }
"#;
/// Reads only.
const READ_POLICY: &str = r#"
path "secret/data/*" { capabilities = ["read"] }
path "secret/metadata/*" { capabilities = ["read"] }
"#;

/// A dev server whose jwt roles `push` and `read` carry the policies above.
async fn bao(issuer: &JwtIssuer) -> OpenBao {
    let bao = OpenBao::start().await;
    bao.policy("push", PUSH_POLICY).await;
    bao.policy("read", READ_POLICY).await;
    bao.jwt(issuer, "push", AUDIENCE, &["push"]).await;
    bao.api(
        "POST",
        "auth/jwt/role/read",
        Some(
            json!({"role_type": "jwt", "bound_audiences": [AUDIENCE], "user_claim": "sub",
                    "token_policies": ["read"], "token_ttl": "1h"}),
        ),
    )
    .await;
    bao
}

/// A pusher for `mount` (KV `version`) logged in with jwt role `role`, as a PushSecret's account.
async fn pusher(
    bao: &OpenBao,
    issuer: &JwtIssuer,
    role: &str,
    mount: &str,
    version: &str,
) -> Result<Box<dyn Pusher>, ProviderError> {
    vault_pusher(&bao.url, issuer, (AUDIENCE, role), mount, version).await
}

/// `secret/<key>`'s current data, or Null when it has none.
async fn data(bao: &OpenBao, key: &str) -> Value {
    let (code, v) = bao
        .request("GET", &format!("secret/data/{key}"), None)
        .await;
    match code {
        200 => v["data"]["data"].clone(),
        404 => Value::Null,
        other => panic!("GET secret/data/{key}: {other} {v}"),
    }
}

fn assert_no_secret(err: &PushError, bao: &OpenBao) {
    let text = format!("{err} {err:?}");
    for value in [PASSWORD, NEW_PASSWORD, THEIRS, bao.root_token.as_str()] {
        assert!(!text.contains(value), "leaked: {text}");
    }
    assert!(!has_vault_token(&text), "a token leaked: {text}");
}

#[tokio::test]
async fn pushes_create_marked_versions_and_merge_every_property_in_one_write() {
    let issuer = JwtIssuer::new();
    let bao = bao(&issuer).await;
    let push = pusher(&bao, &issuer, "push", "secret", "v2").await.unwrap();
    let value = props(&[("username", "app"), ("password", PASSWORD)]);
    let first = push.push("prod/db", &value, REPLACE).await.unwrap();
    assert_eq!(
        first,
        Pushed::Written {
            version: "1".into()
        }
    );
    assert_eq!(
        data(&bao, "prod/db").await,
        json!({"username": "app", "password": PASSWORD})
    );
    let meta = bao.kv_metadata("prod/db").await;
    assert_eq!(meta["custom_metadata"], json!({"managed-by": "latchkey"}));

    // A change: a new version, the other property kept.
    let second = push
        .push("prod/db", &props(&[("password", NEW_PASSWORD)]), REPLACE)
        .await
        .unwrap();
    assert_eq!(
        second,
        Pushed::Written {
            version: "2".into()
        }
    );
    assert_eq!(
        data(&bao, "prod/db").await,
        json!({"username": "app", "password": NEW_PASSWORD})
    );
    // The same again (a restarted controller): read, no version 3.
    let again = push
        .push("prod/db", &props(&[("password", NEW_PASSWORD)]), REPLACE)
        .await
        .unwrap();
    assert_eq!(
        again,
        Pushed::Unchanged {
            version: "2".into()
        }
    );
    let whole = PushValue::Whole(SecretBytes::from(format!(
        r#"{{"password":"{NEW_PASSWORD}","username":"app"}}"#
    )));
    let again = push.push("prod/db", &whole, REPLACE).await.unwrap();
    assert!(matches!(again, Pushed::Unchanged { .. }), "{again:?}");
    assert_eq!(bao.kv_metadata("prod/db").await["current_version"], 2);

    // One property that cannot be text: nothing of the push is written.
    let bad = PushValue::Properties(BTreeMap::from([
        ("password".to_string(), SecretBytes::from("x")),
        ("blob".to_string(), SecretBytes::new(vec![0xff, 0xfe])),
    ]));
    let err = push.push("prod/db", &bad, REPLACE).await.unwrap_err();
    assert!(matches!(err, PushError::NotText { .. }), "{err}");
    assert_eq!(bao.kv_metadata("prod/db").await["current_version"], 2);

    // IfNotExists keeps what is there.
    let keep = PushPolicy {
        if_not_exists: true,
        adopt: false,
    };
    assert_eq!(
        push.push("prod/db", &value, keep).await.unwrap(),
        Pushed::Kept
    );
    assert_eq!(bao.kv_metadata("prod/db").await["current_version"], 2);

    // A whole value is the data map, nested values kept; anything but a JSON object is
    // refused (as ESO does), naming the key and never the value.
    let whole = PushValue::Whole(SecretBytes::from(
        json!({"tls.crt": "PEM", "nested": {"n": 1}})
            .to_string()
            .as_str(),
    ));
    push.push("prod/whole", &whole, REPLACE).await.unwrap();
    assert_eq!(
        data(&bao, "prod/whole").await,
        json!({"tls.crt": "PEM", "nested": {"n": 1}})
    );
    let text = PushValue::Whole(SecretBytes::from(PASSWORD));
    let err = push.push("prod/text", &text, REPLACE).await.unwrap_err();
    assert!(matches!(err, PushError::CannotPush { .. }), "{err}");
    assert!(err.to_string().contains("\"prod/text\""), "{err}");
    assert!(err.to_string().contains("remoteRef.property"), "{err}");
    assert_no_secret(&err, &bao);
    assert_eq!(bao.kv_metadata("prod/text").await, Value::Null);

    // A key that does not name one secret.
    for key in ["a/../b", "a//b", "dir/"] {
        let err = push.push(key, &value, REPLACE).await.unwrap_err();
        assert!(matches!(err, PushError::CannotPush { .. }), "{key}: {err}");
    }
}

#[tokio::test]
async fn a_secret_latchkey_did_not_create_is_a_conflict_left_untouched() {
    let issuer = JwtIssuer::new();
    let bao = bao(&issuer).await;
    bao.put_v2("secret", "shared/app", json!({"owner": THEIRS}))
        .await;
    bao.api(
        "POST",
        "secret/metadata/shared/app",
        Some(json!({"custom_metadata": {"team": "payments"}})),
    )
    .await;
    let push = pusher(&bao, &issuer, "push", "secret", "v2").await.unwrap();
    for value in [
        props(&[("password", PASSWORD)]),
        PushValue::Whole(SecretBytes::from(
            json!({"password": PASSWORD}).to_string().as_str(),
        )),
    ] {
        let err = push.push("shared/app", &value, REPLACE).await.unwrap_err();
        assert!(matches!(err, PushError::Conflict { .. }), "{err}");
        assert!(err.to_string().contains("\"shared/app\""), "{err}");
        assert_no_secret(&err, &bao);
    }
    let err = push.delete("shared/app", &[]).await.unwrap_err();
    assert!(matches!(err, PushError::Conflict { .. }), "{err}");
    assert_eq!(data(&bao, "shared/app").await, json!({"owner": THEIRS}));
    let meta = bao.kv_metadata("shared/app").await;
    assert_eq!(meta["current_version"], 1);
    assert_eq!(meta["custom_metadata"], json!({"team": "payments"}));

    // A store that allows adoption: merged into, marked (their metadata kept), and later
    // only its property removed.
    let adopt = PushPolicy {
        if_not_exists: false,
        adopt: true,
    };
    let value = props(&[("password", PASSWORD)]);
    push.push("shared/app", &value, adopt).await.unwrap();
    assert_eq!(
        data(&bao, "shared/app").await,
        json!({"owner": THEIRS, "password": PASSWORD})
    );
    assert_eq!(
        bao.kv_metadata("shared/app").await["custom_metadata"],
        json!({"team": "payments", "managed-by": "latchkey"})
    );
    push.delete("shared/app", &["password".to_string()])
        .await
        .unwrap();
    assert_eq!(data(&bao, "shared/app").await, json!({"owner": THEIRS}));
}

#[tokio::test]
async fn delete_removes_only_what_was_pushed() {
    let issuer = JwtIssuer::new();
    let bao = bao(&issuer).await;
    let push = pusher(&bao, &issuer, "push", "secret", "v2").await.unwrap();
    push.push("prod/pair", &props(&[("a", "1"), ("b", "2")]), REPLACE)
        .await
        .unwrap();
    // Someone else adds a key to the secret Latchkey created.
    let v = bao.api("GET", "secret/data/prod/pair", None).await;
    let mut shared = v["data"]["data"].clone();
    shared["c"] = json!("3");
    bao.put_v2("secret", "prod/pair", shared).await;
    push.delete("prod/pair", &["a".to_string()]).await.unwrap();
    assert_eq!(data(&bao, "prod/pair").await, json!({"b": "2", "c": "3"}));
    // The last pushed property goes; theirs keeps the secret.
    push.delete("prod/pair", &["b".to_string()]).await.unwrap();
    assert_eq!(data(&bao, "prod/pair").await, json!({"c": "3"}));

    // Left empty, a marked secret goes with its metadata.
    push.push("prod/only", &props(&[("a", "1")]), REPLACE)
        .await
        .unwrap();
    push.delete("prod/only", &["a".to_string()]).await.unwrap();
    assert_eq!(bao.kv_metadata("prod/only").await, Value::Null);

    // A marked secret whose current version was deleted (not destroyed): a push starts from
    // nothing, as a new version.
    push.push("prod/soft", &props(&[("a", "1")]), REPLACE)
        .await
        .unwrap();
    bao.api("DELETE", "secret/data/prod/soft", None).await;
    let after = push
        .push("prod/soft", &props(&[("b", "2")]), REPLACE)
        .await
        .unwrap();
    assert_eq!(
        after,
        Pushed::Written {
            version: "2".into()
        }
    );
    assert_eq!(data(&bao, "prod/soft").await, json!({"b": "2"}));

    // A whole one goes, gone twice is fine, and it can be pushed again at once.
    let whole = PushValue::Whole(SecretBytes::from(r#"{"k":"v"}"#));
    push.push("prod/whole", &whole, REPLACE).await.unwrap();
    push.delete("prod/whole", &[]).await.unwrap();
    push.delete("prod/whole", &[]).await.unwrap();
    assert_eq!(bao.kv_metadata("prod/whole").await, Value::Null);
    let again = push.push("prod/whole", &whole, REPLACE).await.unwrap();
    assert_eq!(
        again,
        Pushed::Written {
            version: "1".into()
        }
    );
}

#[tokio::test]
async fn a_policy_without_write_is_permission_denied_naming_the_path() {
    let issuer = JwtIssuer::new();
    let bao = bao(&issuer).await;
    let push = pusher(&bao, &issuer, "read", "secret", "v2").await.unwrap();
    let err = push
        .push("prod/db", &props(&[("password", PASSWORD)]), REPLACE)
        .await
        .unwrap_err();
    assert!(
        matches!(err, PushError::Backend(ProviderError::PermissionDenied(_))),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("Vault denied update on \"secret/data/prod/db\""),
        "{text}"
    );
    assert_no_secret(&err, &bao);
    assert_eq!(bao.kv_metadata("prod/db").await, Value::Null);
}

/// `kv1/<key>` as OpenBao holds it, Null when it does not exist.
async fn v1_data(bao: &OpenBao, key: &str) -> Value {
    let (code, v) = bao.request("GET", &format!("kv1/{key}"), None).await;
    if code == 404 {
        return Value::Null;
    }
    assert_eq!(code, 200, "{v}");
    v["data"].clone()
}

/// KV v1 keeps no metadata: the mark is the secret's `custom_metadata` key, as ESO writes it;
/// someone else's secret (ESO's included) is a conflict, and deletes remove only what was
/// pushed.
#[tokio::test]
async fn kv_v1_carries_the_mark_in_the_secret_as_eso_does() {
    let issuer = JwtIssuer::new();
    let bao = bao(&issuer).await;
    bao.enable_kv("kv1", 1).await;
    let push = pusher(&bao, &issuer, "push", "kv1", "v1").await.unwrap();
    let mark = json!({"managed-by": "latchkey"});
    let pushed = push
        .push("prod/db", &props(&[("password", PASSWORD)]), REPLACE)
        .await
        .unwrap();
    assert!(matches!(pushed, Pushed::Written { .. }));
    assert_eq!(
        v1_data(&bao, "prod/db").await,
        json!({"password": PASSWORD, "custom_metadata": mark})
    );
    // A second property goes into the same secret.
    push.push("prod/db", &props(&[("user", "shop")]), REPLACE)
        .await
        .unwrap();
    assert_eq!(
        v1_data(&bao, "prod/db").await,
        json!({"password": PASSWORD, "user": "shop", "custom_metadata": mark})
    );
    // The same again: read, nothing written.
    let again = push
        .push("prod/db", &props(&[("user", "shop")]), REPLACE)
        .await
        .unwrap();
    assert_eq!(
        again,
        Pushed::Unchanged {
            version: String::new()
        }
    );

    // Someone else's secrets, ESO's among them: a conflict, nothing written or deleted.
    for (key, theirs) in [
        ("theirs", json!({"owner": THEIRS})),
        (
            "esos",
            json!({"owner": THEIRS, "custom_metadata": {"managed-by": "external-secrets"}}),
        ),
    ] {
        bao.request("POST", &format!("kv1/{key}"), Some(theirs.clone()))
            .await;
        let err = push
            .push(key, &props(&[("password", PASSWORD)]), REPLACE)
            .await
            .unwrap_err();
        assert!(matches!(err, PushError::Conflict { .. }), "{err}");
        assert_no_secret(&err, &bao);
        let err = push.delete(key, &[]).await.unwrap_err();
        assert!(matches!(err, PushError::Conflict { .. }), "{err}");
        push.delete(key, &["owner".into()]).await.unwrap();
        assert_eq!(v1_data(&bao, key).await, theirs, "{key}");
    }

    // Deleting the pushed properties: the rest stays, the last one takes the secret with it.
    push.delete("prod/db", &["password".into()]).await.unwrap();
    assert_eq!(
        v1_data(&bao, "prod/db").await,
        json!({"user": "shop", "custom_metadata": mark})
    );
    push.delete("prod/db", &["user".into()]).await.unwrap();
    assert_eq!(v1_data(&bao, "prod/db").await, Value::Null);

    // A store that says v2 for what is a v1 mount: refused before anything is written.
    let push = pusher(&bao, &issuer, "push", "kv1", "v2").await.unwrap();
    let err = push
        .push("other", &props(&[("password", PASSWORD)]), REPLACE)
        .await
        .unwrap_err();
    assert!(matches!(err, PushError::CannotPush { .. }), "{err}");
    assert!(err.to_string().contains("vault.version: v1"), "{err}");
    assert_eq!(v1_data(&bao, "data/other").await, Value::Null);
    assert_eq!(v1_data(&bao, "other").await, Value::Null);
}

/// A proxy to OpenBao that first writes `secret/<key>` itself (root token) when Latchkey's
/// data write to it arrives: someone else's write between Latchkey's read and its write.
async fn racing_proxy(bao: &OpenBao, key: &str) -> RaceProxy {
    let backend: std::net::SocketAddr = bao.url.trim_start_matches("http://").parse().unwrap();
    let body = json!({"data": {"owner": THEIRS}}).to_string();
    let interloper = format!(
        "POST /v1/secret/data/{key} HTTP/1.0\r\nX-Vault-Token: {}\r\n\
         Content-Length: {}\r\n\r\n{body}",
        bao.root_token,
        body.len()
    );
    let trigger = format!("POST /v1/secret/data/{key} ");
    RaceProxy::start(backend, &trigger, interloper.into_bytes()).await
}

#[tokio::test]
async fn a_write_behind_latchkeys_back_fails_the_check_and_set() {
    let issuer = JwtIssuer::new();
    let bao = bao(&issuer).await;
    let proxy = racing_proxy(&bao, "prod/race").await;
    let push = vault_pusher(&proxy.url, &issuer, (AUDIENCE, "push"), "secret", "v2")
        .await
        .unwrap();
    // Created by someone else between Latchkey's read (absent) and its create.
    let value = props(&[("password", PASSWORD)]);
    let err = push.push("prod/race", &value, REPLACE).await.unwrap_err();
    assert!(
        matches!(err, PushError::Changed { ref version, .. } if version == "0"),
        "{err}"
    );
    assert_eq!(err.reason(), "ConcurrentWrite");
    assert!(err.to_string().contains("\"prod/race\""), "{err}");
    assert_no_secret(&err, &bao);
    assert_eq!(data(&bao, "prod/race").await, json!({"owner": THEIRS}));
    let meta = bao.kv_metadata("prod/race").await;
    assert_eq!(meta["current_version"], 1);
    assert_eq!(meta["custom_metadata"], Value::Null, "not marked");

    // An update: Latchkey's secret, written over by someone else meanwhile.
    let direct = pusher(&bao, &issuer, "push", "secret", "v2").await.unwrap();
    direct.push("prod/race2", &value, REPLACE).await.unwrap();
    let proxy2 = racing_proxy(&bao, "prod/race2").await;
    let push = vault_pusher(&proxy2.url, &issuer, (AUDIENCE, "push"), "secret", "v2")
        .await
        .unwrap();
    let changed = props(&[("password", NEW_PASSWORD)]);
    let err = push
        .push("prod/race2", &changed, REPLACE)
        .await
        .unwrap_err();
    assert!(
        matches!(err, PushError::Changed { ref version, .. } if version == "1"),
        "{err}"
    );
    assert_eq!(data(&bao, "prod/race2").await, json!({"owner": THEIRS}));
    // The next push reads again and merges into what is there now.
    direct.push("prod/race2", &changed, REPLACE).await.unwrap();
    assert_eq!(
        data(&bao, "prod/race2").await,
        json!({"owner": THEIRS, "password": NEW_PASSWORD})
    );
    assert_eq!((proxy.raced(), proxy2.raced()), (1, 1));
}

// ---- the controller loop, end to end: `latchkey controller` against the fake API server ----

const API: &str = "latchkey.dev/v1alpha1";
const CONTROLLER_TOKEN: &str = "vault-push-controller-token";

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn source_secret(s: &FakeApiServer, password: &str) {
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "shop"},
        "data": {"password": b64(password), "username": b64("app")}}));
}

fn push_secret(name: &str, account: &str, store: &str, remote: &str) -> Value {
    let store = json!({"name": store, "kind": "SecretStore"});
    support::push::push_secret_to(name, account, remote, "None", store)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_controller_pushes_to_openbao_as_the_service_account() {
    let s = support::push::controller_cluster(CONTROLLER_TOKEN, &["pusher", "reader"]).await;
    source_secret(&s, PASSWORD);

    // OpenBao checks the minted tokens with the fake API server's TokenReview; `pusher` may
    // write the KV v2 mount, `reader` only read it.
    let bao = OpenBao::start().await;
    bao.policy("push", PUSH_POLICY).await;
    bao.policy("read", READ_POLICY).await;
    let reviewer = s.token_reviewer();
    let pusher = ("shop", "pusher");
    bao.kubernetes(&s.url(), &reviewer, "push", pusher, AUDIENCE, &["push"])
        .await;
    bao.api(
        "POST",
        "auth/kubernetes/role/read",
        Some(json!({"bound_service_account_names": ["reader"],
                    "bound_service_account_namespaces": ["shop"],
                    "audience": AUDIENCE, "token_policies": ["read"], "token_ttl": "1h"})),
    )
    .await;
    bao.put_v2("secret", "shared/theirs", json!({"owner": THEIRS}))
        .await;
    for (store, role) in [("vault", "push"), ("vault-ro", "read")] {
        s.apply(json!({"apiVersion": API, "kind": "SecretStore",
            "metadata": {"name": store, "namespace": "shop"},
            "spec": {"provider": {"vault": {"server": bao.url, "path": "secret", "version": "v2",
                "auth": {"kubernetes": {"mountPath": "kubernetes", "role": role,
                                        "audience": AUDIENCE}}}}}}));
    }
    s.apply(push_secret("db", "pusher", "vault", "prod/db"));
    s.apply(push_secret("clash", "pusher", "vault", "shared/theirs"));
    s.apply(push_secret("denied", "reader", "vault-ro", "prod/denied"));
    let c = ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "vault-push", &[]).await;

    // Pushed as one KV version, marked, listed in the status.
    let synced = |s: &FakeApiServer| {
        let ps = s.get(API, "PushSecret", Some("shop"), "db")?;
        ps["status"]["syncedPushSecrets"]["SecretStore/vault"]["prod/db"]["version"]
            .as_str()
            .map(String::from)
    };
    let version = c.until("the first push", || async { synced(&s) }).await;
    assert_eq!(version, "1");
    assert_eq!(
        data(&bao, "prod/db").await,
        json!({"password": PASSWORD, "username": "app"})
    );
    assert_eq!(
        bao.kv_metadata("prod/db").await["custom_metadata"],
        json!({"managed-by": "latchkey"})
    );
    let minted = s.token_requests();
    assert!(
        minted
            .iter()
            .any(|t| t.service_account == "pusher" && t.audiences == [AUDIENCE]),
        "{minted:?}"
    );

    // Someone else adds a key; then the Secret changes: a new KV version over theirs.
    let v = bao.api("GET", "secret/data/prod/db", None).await;
    let mut shared = v["data"]["data"].clone();
    shared["owner"] = json!("ops");
    bao.put_v2("secret", "prod/db", shared).await;
    source_secret(&s, NEW_PASSWORD);
    c.until("the second push", || async {
        (synced(&s)? == "3").then_some(())
    })
    .await;
    assert_eq!(
        data(&bao, "prod/db").await,
        json!({"password": NEW_PASSWORD, "username": "app", "owner": "ops"})
    );

    // Someone else's secret: a conflict naming all, left as it was.
    let condition = c
        .until("the conflict", || async {
            support::push::failed_ready(&s, "clash")
        })
        .await;
    assert_eq!(condition["reason"], "Conflict", "{condition}");
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.contains("PushSecret shop/clash, SecretStore/vault, remote key \"shared/theirs\""),
        "{message}"
    );
    assert_eq!(data(&bao, "shared/theirs").await, json!({"owner": THEIRS}));
    let meta = bao.kv_metadata("shared/theirs").await;
    assert_eq!(meta["current_version"], 1);
    assert_eq!(meta["custom_metadata"], Value::Null);

    // A Vault policy without write: a clear condition naming the path.
    let condition = c
        .until("the refusal", || async {
            support::push::failed_ready(&s, "denied")
        })
        .await;
    assert_eq!(condition["reason"], "BackendError", "{condition}");
    let message = condition["message"].as_str().unwrap();
    for part in [
        "PushSecret shop/denied",
        "SecretStore/vault-ro",
        "remote key \"prod/denied\"",
        "Vault denied update on \"secret/data/prod/denied\"",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    assert_eq!(bao.kv_metadata("prod/denied").await, Value::Null);

    // deletionPolicy: Delete, and `username` no longer pushed: only that property goes.
    let mut edited = s.get(API, "PushSecret", Some("shop"), "db").unwrap();
    edited["spec"]["deletionPolicy"] = json!("Delete");
    edited["spec"]["data"].as_array_mut().unwrap().truncate(1);
    s.apply(edited);
    let want = json!({"password": NEW_PASSWORD, "owner": "ops"});
    c.until("username removed", || async {
        (data(&bao, "prod/db").await == want).then_some(())
    })
    .await;
    // Deleted: the property it pushed goes, theirs keeps the secret.
    s.delete(API, "PushSecret", Some("shop"), "db");
    c.until("the PushSecret gone", || async {
        s.get(API, "PushSecret", Some("shop"), "db")
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(data(&bao, "prod/db").await, json!({"owner": "ops"}));

    // No value nor token anywhere the controller reports.
    let mut shown = c.log_text();
    for name in ["clash", "denied"] {
        let ps = s.get(API, "PushSecret", Some("shop"), name).unwrap();
        shown.push_str(&ps.to_string());
    }
    for event in s.events() {
        shown.push_str(&event.to_string());
    }
    let events = s.events();
    assert!(
        events.iter().any(|e| e["reason"] == "PushFailed"),
        "{events:?}"
    );
    for secret in [
        PASSWORD,
        NEW_PASSWORD,
        THEIRS,
        &reviewer,
        &bao.root_token,
        &b64(PASSWORD),
        &b64(NEW_PASSWORD),
    ] {
        assert!(!shown.contains(secret), "{secret} shown");
    }
    assert!(!has_vault_token(&shown), "a Vault token shown");
}

#[test]
fn the_token_check_sees_tokens() {
    assert!(has_vault_token("token=s.licWO3n1ovAifIzxAQH0leWs;"));
    assert!(!has_vault_token("remote keys.prod/db, accessors. more"));
}

/// Whether `text` holds something shaped like an OpenBao token (`s.` and 24 letters or digits).
fn has_vault_token(text: &str) -> bool {
    text.match_indices("s.").any(|(at, _)| {
        let rest = &text.as_bytes()[at + 2..];
        rest.len() >= 24
            && rest[..24].iter().all(u8::is_ascii_alphanumeric)
            && rest.get(24).is_none_or(|b| !b.is_ascii_alphanumeric())
    })
}
