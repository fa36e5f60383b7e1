//! PushSecret pieces end to end. Writes to AWS Secrets Manager against a real `moto_server`: created with
//! Latchkey's tag, every property of one remote secret in one write, nothing written over or
//! deleted that Latchkey did not mark, and no value in any error. And the source Secret read
//! as the PushSecret's service account, against the fake API server with the deploy files'
//! RBAC for the controller.

mod support;

// Stores by `labelSelector` and `spec.template`, in a file of their own.
#[path = "push_secret/select.rs"]
mod select;

use std::collections::BTreeMap;
use std::sync::Arc;

use latchkey::mirror::tokens::TokenMinter;
use latchkey::providers::aws::push::AwsPush;
use latchkey::providers::push::{PushError, PushPolicy, PushValue, Pushed, Pusher};
use latchkey::push_secret::source::{ApiTokens, SourceError, SourceReader};
use latchkey::secret::SecretBytes;
use serde_json::json;
use support::apiserver::{API_AUDIENCE, FakeApiServer, Identity};
use support::controller::ControllerProcess;
use support::moto::{Moto, versions};
use support::push::{
    API, LOOP_TOKEN, OTHER_VALUE, PASSWORD, THEIRS, aws_store, b64, eventually, push_cluster,
    push_secret_to, secret,
};

const NEW_PASSWORD: &str = "push-e2e-password-rotated-4417";

const REPLACE: PushPolicy = PushPolicy {
    if_not_exists: false,
    adopt: false,
};

fn props(pairs: &[(&str, &[u8])]) -> PushValue {
    PushValue::Properties(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), SecretBytes::new(v.to_vec())))
            .collect::<BTreeMap<_, _>>(),
    )
}

async fn read(client: &aws_sdk_secretsmanager::Client, key: &str) -> serde_json::Value {
    let out = client
        .get_secret_value()
        .secret_id(key)
        .send()
        .await
        .unwrap();
    serde_json::from_str(out.secret_string().unwrap()).unwrap()
}

async fn tags(client: &aws_sdk_secretsmanager::Client, key: &str) -> Vec<(String, String)> {
    let out = client
        .describe_secret()
        .secret_id(key)
        .send()
        .await
        .unwrap();
    out.tags()
        .iter()
        .map(|t| {
            (
                t.key().unwrap_or_default().to_string(),
                t.value().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

async fn exists(client: &aws_sdk_secretsmanager::Client, key: &str) -> bool {
    client.describe_secret().secret_id(key).send().await.is_ok()
}

fn assert_no_value(err: &PushError) {
    let text = format!("{err} {err:?}");
    for value in [PASSWORD, NEW_PASSWORD, THEIRS] {
        assert!(!text.contains(value), "a value leaked: {text}");
    }
}

#[tokio::test]
async fn pushes_create_tagged_secrets_and_merge_every_property_in_one_write() {
    let moto = Moto::start().await;
    let admin = moto.client();
    let push = AwsPush::from_client(moto.client());
    let value = props(&[("username", b"app"), ("password", PASSWORD.as_bytes())]);
    let first = push.push("prod/db", &value, REPLACE).await.unwrap();
    assert!(matches!(first, Pushed::Written { ref version } if !version.is_empty()));
    assert_eq!(
        read(&admin, "prod/db").await,
        serde_json::json!({"username": "app", "password": PASSWORD})
    );
    assert_eq!(
        tags(&admin, "prod/db").await,
        [("managed-by".to_string(), "latchkey".to_string())]
    );
    assert_eq!(versions(&admin, "prod/db").await, 1);

    // A change: one new version, the other property kept.
    let changed = props(&[("password", NEW_PASSWORD.as_bytes())]);
    let second = push.push("prod/db", &changed, REPLACE).await.unwrap();
    assert_ne!(first, second);
    assert_eq!(
        read(&admin, "prod/db").await,
        serde_json::json!({"username": "app", "password": NEW_PASSWORD})
    );
    assert_eq!(versions(&admin, "prod/db").await, 2);

    // One property that cannot be a JSON string: nothing of the push is written.
    let bad = props(&[("password", b"x"), ("blob", &[0xff, 0xfe])]);
    let err = push.push("prod/db", &bad, REPLACE).await.unwrap_err();
    assert!(matches!(err, PushError::NotText { .. }), "{err}");
    assert_no_value(&err);
    assert_eq!(versions(&admin, "prod/db").await, 2);
    assert_eq!(read(&admin, "prod/db").await["password"], NEW_PASSWORD);

    // IfNotExists keeps what is there.
    let keep = PushPolicy {
        if_not_exists: true,
        adopt: false,
    };
    let got = push.push("prod/db", &value, keep).await.unwrap();
    assert_eq!(got, Pushed::Kept);
    assert_eq!(versions(&admin, "prod/db").await, 2);

    // A whole binary value.
    let binary = PushValue::Whole(SecretBytes::new(vec![0, 159, 255]));
    push.push("prod/blob", &binary, REPLACE).await.unwrap();
    let out = admin
        .get_secret_value()
        .secret_id("prod/blob")
        .send()
        .await
        .unwrap();
    assert_eq!(out.secret_binary().unwrap().as_ref(), [0, 159, 255]);
}

#[tokio::test]
async fn a_secret_latchkey_did_not_create_is_a_conflict_left_untouched() {
    let moto = Moto::start().await;
    let admin = moto.client();
    let theirs = serde_json::json!({"owner": THEIRS}).to_string();
    admin
        .create_secret()
        .name("shared/app")
        .secret_string(&theirs)
        .send()
        .await
        .unwrap();
    let push = AwsPush::from_client(moto.client());
    for value in [
        props(&[("password", PASSWORD.as_bytes())]),
        PushValue::Whole(SecretBytes::from(PASSWORD)),
    ] {
        let err = push.push("shared/app", &value, REPLACE).await.unwrap_err();
        assert!(matches!(err, PushError::Conflict { .. }), "{err}");
        assert!(err.to_string().contains("\"shared/app\""), "{err}");
        assert_no_value(&err);
    }
    let err = push.delete("shared/app", &[]).await.unwrap_err();
    assert!(matches!(err, PushError::Conflict { .. }), "{err}");
    assert_eq!(read(&admin, "shared/app").await["owner"], THEIRS);
    assert!(tags(&admin, "shared/app").await.is_empty());
    assert_eq!(versions(&admin, "shared/app").await, 1);

    // A store that allows adoption: marked, merged into, and later only its property removed.
    let adopt = PushPolicy {
        if_not_exists: false,
        adopt: true,
    };
    let value = props(&[("password", PASSWORD.as_bytes())]);
    push.push("shared/app", &value, adopt).await.unwrap();
    assert_eq!(
        read(&admin, "shared/app").await,
        serde_json::json!({"owner": THEIRS, "password": PASSWORD})
    );
    assert_eq!(
        tags(&admin, "shared/app").await,
        [("managed-by".to_string(), "latchkey".to_string())]
    );
    push.delete("shared/app", &["password".to_string()])
        .await
        .unwrap();
    assert_eq!(
        read(&admin, "shared/app").await,
        serde_json::json!({"owner": THEIRS})
    );
}

#[tokio::test]
async fn delete_removes_only_what_was_pushed() {
    let moto = Moto::start().await;
    let admin = moto.client();
    let push = AwsPush::from_client(moto.client());
    let two = props(&[("a", b"1"), ("b", b"2")]);
    push.push("prod/pair", &two, REPLACE).await.unwrap();
    push.delete("prod/pair", &["a".to_string()]).await.unwrap();
    assert_eq!(
        read(&admin, "prod/pair").await,
        serde_json::json!({"b": "2"})
    );
    // The last pushed property of a secret Latchkey created: the secret goes.
    push.delete("prod/pair", &["b".to_string()]).await.unwrap();
    assert!(!exists(&admin, "prod/pair").await);
    // A whole one goes, gone twice is fine, and it can be pushed again at once.
    let whole = PushValue::Whole(SecretBytes::from(PASSWORD));
    push.push("prod/whole", &whole, REPLACE).await.unwrap();
    push.delete("prod/whole", &[]).await.unwrap();
    push.delete("prod/whole", &[]).await.unwrap();
    assert!(!exists(&admin, "prod/whole").await);
    push.push("prod/whole", &whole, REPLACE).await.unwrap();
    assert!(exists(&admin, "prod/whole").await);
}

/// The mirror's minter, for the API server's audience: what `latchkey controller` gives the
/// PushSecret controller.
struct Minted(latchkey::mirror::tokens::TokenMinter);

#[async_trait::async_trait]
impl ApiTokens for Minted {
    async fn api_token(
        &self,
        namespace: &str,
        service_account: &str,
    ) -> Result<latchkey::secret::SecretString, String> {
        let tokens = self
            .0
            .tokens(namespace, service_account, &[String::new()])
            .await
            .map_err(|e| e.to_string())?;
        let token = tokens.for_audience("").ok_or("no token minted")?;
        Ok(token.token.clone())
    }
}

const CONTROLLER_TOKEN: &str = "push-controller-token";

#[tokio::test]
async fn the_source_secret_is_read_as_the_service_account_never_as_the_controller() {
    let s = FakeApiServer::start().await;
    let controller = Identity::service_account("latchkey", "latchkey-controller");
    s.add_identity(CONTROLLER_TOKEN, controller.clone());
    // The controller's own rights (which include reading Secrets of the namespaces it serves)
    // as the deploy files grant them: the refusals below come from the accounts' rights.
    let granted = s.allow_roles_of(controller, "daemonset/components/mirror/rbac.yaml");
    assert!(granted > 10);
    s.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}));
    for (name, opted_in) in [("pusher", true), ("tenant", true), ("shy", false)] {
        let annotations = if opted_in {
            json!({"latchkey.dev/allow-controller": "true"})
        } else {
            json!({})
        };
        s.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": "shop", "annotations": annotations}}));
    }
    s.allow(
        Identity::service_account("shop", "pusher"),
        "get",
        "",
        "secrets",
        Some("shop"),
    );
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "shop"},
        "data": {"password": b64(PASSWORD)}}));

    let base = kube::Config::new(s.url().parse().unwrap());
    let minter = TokenMinter::new(s.client(CONTROLLER_TOKEN).await);
    let reader = SourceReader::new(base, Arc::new(Minted(minter)));

    let data = reader.read("shop", "pusher", "db").await.unwrap();
    assert_eq!(data["password"].expose(), PASSWORD.as_bytes());
    let requests = s.token_requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].service_account, "pusher");
    // No audience asked: the API server's own, as the API server records it.
    assert_eq!(requests[0].audiences, [API_AUDIENCE]);

    let err = reader.read("shop", "pusher", "gone").await.unwrap_err();
    assert!(matches!(err, SourceError::Missing { .. }), "{err}");

    // An account without get on the Secret is refused, though the controller could read it.
    let err = reader.read("shop", "tenant", "db").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "service account shop/tenant may not read Secret shop/db: grant it get on that Secret \
         (the controller never reads it with its own rights)"
    );
    // An account that did not opt in gets no token at all.
    let err = reader.read("shop", "shy", "db").await.unwrap_err();
    assert!(matches!(err, SourceError::Identity(_)), "{err}");
    assert!(
        err.to_string().contains("latchkey.dev/allow-controller"),
        "{err}"
    );
    assert_eq!(s.token_requests().len(), 2);
    // No Secret was read with the controller's token.
    for request in s.requests() {
        if request.path.contains("/secrets/") {
            assert_ne!(
                request.identity,
                Some(Identity::service_account("latchkey", "latchkey-controller")),
                "{}",
                request.path
            );
        }
    }
}

// ---- the controller loop, end to end: `latchkey controller` against the fake API server ----

fn push_secret(
    name: &str,
    service_account: &str,
    remote: &str,
    deletion: &str,
) -> serde_json::Value {
    let store = json!({"name": "fake", "kind": "SecretStore"});
    push_secret_to(name, service_account, remote, deletion, store)
}

fn ready(s: &FakeApiServer, name: &str) -> Option<serde_json::Value> {
    let ps = s.get(API, "PushSecret", Some("shop"), name)?;
    let conditions = ps["status"]["conditions"].as_array()?.clone();
    conditions.into_iter().find(|c| c["type"] == "Ready")
}

fn synced_version(s: &FakeApiServer, name: &str, remote: &str) -> Option<String> {
    let ps = s.get(API, "PushSecret", Some("shop"), name)?;
    ps["status"]["syncedPushSecrets"]["SecretStore/fake"][remote]["version"]
        .as_str()
        .map(String::from)
}

fn writes_logged(c: &ControllerProcess, remote: &str) -> usize {
    c.log_text()
        .lines()
        .filter(|l| l.contains("pushed") && l.contains(&format!("remote_key={remote}")))
        .count()
}

#[tokio::test]
async fn the_controller_pushes_follows_the_secret_and_writes_only_on_change() {
    let s = push_cluster().await;
    s.apply(push_secret("db", "pusher", "prod/db", "None"));
    s.apply(push_secret("denied", "tenant", "prod/denied", "None"));
    s.apply(push_secret("clash", "pusher", "theirs", "None"));
    // A ClusterSecretStore that does not admit `shop`, and a provider that cannot be written.
    s.apply(json!({"apiVersion": API, "kind": "ClusterSecretStore",
        "metadata": {"name": "elsewhere"},
        "spec": {"conditions": [{"namespaces": ["billing"]}],
                 "provider": {"fake": {"data": []}}}}));
    s.apply(json!({"apiVersion": API, "kind": "SecretStore",
        "metadata": {"name": "csi", "namespace": "shop"},
        "spec": {"provider": {"secretsStoreCSI": {"provider": "files"}}}}));
    let cluster = json!({"name": "elsewhere", "kind": "ClusterSecretStore"});
    s.apply(push_secret_to(
        "outside",
        "pusher",
        "prod/outside",
        "None",
        cluster,
    ));
    let csi = json!({"name": "csi", "kind": "SecretStore"});
    s.apply(push_secret_to("to-csi", "pusher", "prod/csi", "None", csi));
    let c = ControllerProcess::start(&s.kubeconfig_yaml(LOOP_TOKEN), "push-a", &[]).await;

    // Pushed: both properties in one write, listed in the status, Ready.
    let version = std::time::Duration::from_secs(15);
    eventually(&c, version, "the first push", || {
        (synced_version(&s, "db", "prod/db")? == "1").then_some(())
    })
    .await;
    let ps = s.get(API, "PushSecret", Some("shop"), "db").unwrap();
    assert_eq!(
        ps["status"]["syncedPushSecrets"]["SecretStore/fake"]["prod/db"]["properties"],
        json!(["password", "username"])
    );
    let condition = ready(&s, "db").unwrap();
    assert_eq!(condition["status"], "True", "{condition}");
    assert_eq!(writes_logged(&c, "prod/db"), 1);

    // A change of a key nobody pushes: the Secret is read again, nothing is written.
    secret(&s, PASSWORD, "changed-unrelated");
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(synced_version(&s, "db", "prod/db").as_deref(), Some("1"));
    assert_eq!(writes_logged(&c, "prod/db"), 1, "{}", c.log_text());

    // The pushed key changes: pushed again within seconds.
    let changed = std::time::Instant::now();
    secret(&s, NEW_PASSWORD, "changed-unrelated");
    eventually(
        &c,
        std::time::Duration::from_secs(5),
        "the second push",
        || (synced_version(&s, "db", "prod/db")? == "2").then_some(()),
    )
    .await;
    eprintln!("pushed {:?} after the Secret changed", changed.elapsed());
    assert_eq!(writes_logged(&c, "prod/db"), 2);

    // An account that may not read the Secret: nothing pushed, the condition names all.
    let condition = eventually(&c, version, "the refusal", || {
        ready(&s, "denied").filter(|c| c["status"] == "False")
    })
    .await;
    let message = condition["message"].as_str().unwrap();
    for part in [
        "PushSecret shop/denied",
        "SecretStore/fake",
        "prod/denied",
        "service account shop/tenant may not read Secret shop/db",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    assert_eq!(condition["reason"], "SourceUnavailable");
    assert!(synced_version(&s, "denied", "prod/denied").is_none());

    // Someone else's remote secret: a conflict, left alone.
    let condition = eventually(&c, version, "the conflict", || {
        ready(&s, "clash").filter(|c| c["status"] == "False")
    })
    .await;
    assert_eq!(condition["reason"], "Conflict", "{condition}");
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.contains("PushSecret shop/clash, SecretStore/fake, remote key \"theirs\""),
        "{message}"
    );
    for (name, reason, parts) in [
        (
            "outside",
            "NotAdmitted",
            &["PushSecret shop/outside", "ClusterSecretStore/elsewhere"][..],
        ),
        (
            "to-csi",
            "Unimplemented",
            &[
                "PushSecret shop/to-csi",
                "SecretStore/csi",
                "secretsStoreCSI provider",
            ][..],
        ),
    ] {
        let condition = eventually(&c, version, name, || {
            ready(&s, name).filter(|c| c["status"] == "False")
        })
        .await;
        assert_eq!(condition["reason"], reason, "{condition}");
        let message = condition["message"].as_str().unwrap();
        for part in parts {
            assert!(message.contains(part), "{part}: {message}");
        }
    }
    let reasons: Vec<String> = s
        .events()
        .iter()
        .filter_map(|e| e["reason"].as_str().map(String::from))
        .collect();
    assert!(reasons.iter().any(|r| r == "PushFailed"), "{reasons:?}");

    // No value anywhere the controller reports.
    let shown = support::push::shown(&s, &c, &["db", "denied", "clash", "outside", "to-csi"]);
    for value in [
        PASSWORD,
        NEW_PASSWORD,
        OTHER_VALUE,
        THEIRS,
        "changed-unrelated",
    ] {
        assert!(!shown.contains(value), "{value} shown");
        assert!(!shown.contains(&b64(value)), "{value} shown in base64");
    }
}

#[tokio::test]
async fn deletion_policy_delete_removes_what_was_pushed_then_releases_the_finalizer() {
    let s = push_cluster().await;
    s.apply(push_secret("gone", "pusher", "prod/gone", "Delete"));
    let c = ControllerProcess::start(&s.kubeconfig_yaml(LOOP_TOKEN), "push-b", &[]).await;
    let within = std::time::Duration::from_secs(15);
    eventually(&c, within, "the push and the finalizer", || {
        let ps = s.get(API, "PushSecret", Some("shop"), "gone")?;
        let ours = ps["metadata"]["finalizers"]
            .as_array()?
            .iter()
            .any(|f| f == "latchkey.dev/push-secret");
        (ours && synced_version(&s, "gone", "prod/gone").is_some()).then_some(())
    })
    .await;
    s.delete(API, "PushSecret", Some("shop"), "gone");
    eventually(&c, within, "the PushSecret gone", || {
        s.get(API, "PushSecret", Some("shop"), "gone")
            .is_none()
            .then_some(())
    })
    .await;
    let log = c.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("pushed remote secret deleted") && l.contains("prod/gone")),
        "{log}"
    );
    assert!(!log.contains(PASSWORD));
}

#[tokio::test]
async fn the_controller_pushes_to_secrets_manager_as_the_service_account() {
    let moto = Moto::start().await;
    let admin = moto.client();
    let s = push_cluster().await;
    aws_store(&s, &moto.endpoint);
    let store = json!({"name": "aws", "kind": "SecretStore"});
    s.apply(push_secret_to(
        "to-aws", "pusher", "prod/aws", "None", store,
    ));
    let c = ControllerProcess::start(&s.kubeconfig_yaml(LOOP_TOKEN), "push-aws", &[]).await;
    let within = std::time::Duration::from_secs(15);
    eventually(&c, within, "the push to Secrets Manager", || {
        s.get(API, "PushSecret", Some("shop"), "to-aws")?["status"]["syncedPushSecrets"]
            ["SecretStore/aws"]["prod/aws"]["version"]
            .as_str()
            .map(String::from)
    })
    .await;
    assert_eq!(
        read(&admin, "prod/aws").await,
        json!({"password": PASSWORD, "username": "app"})
    );
    secret(&s, NEW_PASSWORD, OTHER_VALUE);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while read(&admin, "prod/aws").await["password"] != NEW_PASSWORD {
        assert!(
            std::time::Instant::now() < deadline,
            "not pushed again:\n{}",
            c.log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let condition = ready(&s, "to-aws").unwrap();
    assert_eq!(condition["status"], "True", "{condition}");

    // deletionPolicy: Delete, and `username` no longer pushed: that property goes, the
    // finalizer comes.
    let mut edited = s.get(API, "PushSecret", Some("shop"), "to-aws").unwrap();
    edited["spec"]["deletionPolicy"] = json!("Delete");
    edited["spec"]["data"].as_array_mut().unwrap().truncate(1);
    s.apply(edited);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while read(&admin, "prod/aws").await != json!({"password": NEW_PASSWORD}) {
        assert!(
            std::time::Instant::now() < deadline,
            "username not removed:\n{}",
            c.log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    eventually(
        &c,
        within,
        "the finalizer and the status without username",
        || {
            let ps = s.get(API, "PushSecret", Some("shop"), "to-aws")?;
            let entry = &ps["status"]["syncedPushSecrets"]["SecretStore/aws"]["prod/aws"];
            (ps["metadata"]["finalizers"] == json!(["latchkey.dev/push-secret"])
                && entry["properties"] == json!(["password"]))
            .then_some(())
        },
    )
    .await;

    // Deleted: the remote secret Latchkey created goes with it, then the PushSecret.
    s.delete(API, "PushSecret", Some("shop"), "to-aws");
    eventually(&c, within, "the PushSecret gone", || {
        s.get(API, "PushSecret", Some("shop"), "to-aws")
            .is_none()
            .then_some(())
    })
    .await;
    let left = admin.describe_secret().secret_id("prod/aws").send().await;
    assert!(left.is_err(), "prod/aws is still there");

    let log = c.log_text();
    for value in [PASSWORD, NEW_PASSWORD, "testing"] {
        assert!(!log.contains(value), "{value} in the log");
    }
}
