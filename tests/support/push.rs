//! A cluster for PushSecrets run by `latchkey controller`, shared by the PushSecret tests:
//! namespace `shop` with the Secret `db`, the accounts `pusher` and `tenant`, a `fake` store,
//! and on demand an `aws` store on moto.

use latchkey::providers::push::{PushPolicy, PushValue};
use latchkey::secret::SecretBytes;
use serde_json::json;

use super::apiserver::{FakeApiServer, Identity};
use super::controller::ControllerProcess;

/// The API group and version of Latchkey's kinds.
pub const API: &str = "latchkey.dev/v1alpha1";
/// The controller's bearer token at the fake API server.
pub const LOOP_TOKEN: &str = "push-loop-controller-token";
/// `db`'s `password` as [`push_cluster`] makes it.
pub const PASSWORD: &str = "push-e2e-password-9931";
/// The value of the `fake` store's remote secret `theirs`, which Latchkey did not write.
pub const THEIRS: &str = "someone-elses-value-e2e-0007";
/// `db`'s `other` as [`push_cluster`] makes it, never pushed.
pub const OTHER_VALUE: &str = "unrelated-e2e-value-5521";

/// `text` in base64, as a Secret's `data` holds it.
pub fn b64(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// A cluster with namespace `shop`, a `fake` SecretStore there (holding one remote secret of
/// someone else's, `theirs`), the Secret `db`, and the accounts `pusher` (may read Secrets of
/// `shop`) and `tenant` (may not); the controller has exactly the deploy files' rights.
pub async fn push_cluster() -> FakeApiServer {
    let s = controller_cluster(LOOP_TOKEN, &["pusher"]).await;
    opted_in(&s, "tenant");
    s.apply(json!({"apiVersion": API, "kind": "SecretStore",
        "metadata": {"name": "fake", "namespace": "shop"},
        "spec": {"provider": {"fake": {"data": [{"key": "theirs", "value": THEIRS}]}}}}));
    secret(&s, PASSWORD, OTHER_VALUE);
    s
}

/// Namespaces `latchkey` and `shop`; the controller (bearer `token`) with exactly the deploy
/// files' rights; and the opted-in accounts `readers` of `shop`, each allowed to get its Secrets.
pub async fn controller_cluster(token: &str, readers: &[&str]) -> FakeApiServer {
    let s = FakeApiServer::start().await;
    let who = Identity::service_account("latchkey", "latchkey-controller");
    s.add_identity(token, who.clone());
    assert!(s.allow_roles_of(who, "daemonset/components/mirror/rbac.yaml") > 10);
    for ns in ["latchkey", "shop"] {
        s.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    for name in readers {
        opted_in(&s, name);
        let account = Identity::service_account("shop", name);
        s.allow(account, "get", "", "secrets", Some("shop"));
    }
    s
}

/// What the kubernetes provider's controller tests add to a cluster that already has namespace
/// `shop` and the account `writer` with its rights: the controller (bearer `token`, the deploy
/// files' rights) and namespace `latchkey`, `writer` opted in, the Secret `db` holding
/// `password`, and the SecretStore `cluster` of the kubernetes provider.
pub fn kubernetes_push_controller(s: &FakeApiServer, token: &str, password: &str) {
    let controller = Identity::service_account("latchkey", "latchkey-controller");
    s.add_identity(token, controller.clone());
    assert!(s.allow_roles_of(controller, "daemonset/components/mirror/rbac.yaml") > 10);
    s.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "latchkey"}}));
    opted_in(s, "writer");
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "shop"},
        "data": {"password": b64(password)}}));
    s.apply(json!({"apiVersion": API, "kind": "SecretStore",
        "metadata": {"name": "cluster", "namespace": "shop"},
        "spec": {"provider": {"kubernetes": {}}}}));
}

/// The account `name` of `shop`, opted in to the controller (`latchkey.dev/allow-controller`).
pub fn opted_in(s: &FakeApiServer, name: &str) {
    s.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": "shop",
                     "annotations": {"latchkey.dev/allow-controller": "true"}}}));
}

/// Writes the Secret `db` of `shop`.
pub fn secret(s: &FakeApiServer, password: &str, other: &str) {
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "shop"},
        "data": {"password": b64(password), "username": b64("app"), "other": b64(other)}}));
}

/// The SecretStore `aws` of `shop` on moto at `endpoint`, with static keys from the Secret
/// `aws-creds` (read as the PushSecret's account, which may read Secrets of `shop`).
pub fn aws_store(s: &FakeApiServer, endpoint: &str) {
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "aws-creds", "namespace": "shop"},
        "data": {"id": b64("testing"), "secret": b64("testing")}}));
    s.apply(json!({"apiVersion": API, "kind": "SecretStore",
        "metadata": {"name": "aws", "namespace": "shop"},
        "spec": {"provider": {"aws": {"service": "SecretsManager", "region": "us-east-1",
            "endpoint": endpoint,
            "auth": {"secretRef": {
                "accessKeyIDSecretRef": {"name": "aws-creds", "key": "id"},
                "secretAccessKeySecretRef": {"name": "aws-creds", "key": "secret"}}}}}}}));
}

/// A PushSecret of `db`'s `password` and `username` into the properties of `remote` in `store`.
pub fn push_secret_to(
    name: &str,
    service_account: &str,
    remote: &str,
    deletion: &str,
    store: serde_json::Value,
) -> serde_json::Value {
    json!({"apiVersion": API, "kind": "PushSecret",
    "metadata": {"name": name, "namespace": "shop"},
    "spec": {
        "serviceAccountName": service_account,
        "refreshInterval": "1h",
        "deletionPolicy": deletion,
        "secretStoreRefs": [store],
        "selector": {"secret": {"name": "db"}},
        "data": [
            {"match": {"secretKey": "password",
                       "remoteRef": {"remoteKey": remote, "property": "password"}}},
            {"match": {"secretKey": "username",
                       "remoteRef": {"remoteKey": remote, "property": "username"}}},
        ]}})
}

/// The failing `Ready` condition of PushSecret `shop/name`, if it has one.
pub fn failed_ready(s: &FakeApiServer, name: &str) -> Option<serde_json::Value> {
    let ps = s.get(API, "PushSecret", Some("shop"), name)?;
    let conditions = ps["status"]["conditions"].as_array()?.clone();
    conditions
        .into_iter()
        .find(|c| c["type"] == "Ready" && c["status"] == "False")
}

/// Everything the controller shows: its log, the PushSecrets `names` of `shop` and every Event.
pub fn shown(s: &FakeApiServer, c: &ControllerProcess, names: &[&str]) -> String {
    let mut shown = c.log_text();
    for name in names {
        shown.push_str(
            &s.get(API, "PushSecret", Some("shop"), name)
                .unwrap()
                .to_string(),
        );
    }
    for event in s.events() {
        shown.push_str(&event.to_string());
    }
    shown
}

/// Polls `check` every 50 ms for up to `within`; the controller's log shows on a timeout.
pub async fn eventually<T>(
    c: &ControllerProcess,
    within: std::time::Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}; controller log:\n{}",
            c.log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `updatePolicy: Replace` without adopting: the policy most pushes in the tests use.
pub const REPLACE: PushPolicy = PushPolicy {
    if_not_exists: false,
    adopt: false,
};

/// Properties to push, from text pairs.
pub fn props(pairs: &[(&str, &str)]) -> PushValue {
    PushValue::Properties(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), SecretBytes::from(*v)))
            .collect(),
    )
}
