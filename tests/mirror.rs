//! End to end: the real `latchkey controller` against the fake API server mirrors ExternalSecrets
//! that ask for it into Secrets, repairs drift, refuses Secrets that are not its own, applies the
//! deletion policies only when the remote value is gone, and writes only while it leads.

mod support;

use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};
use support::apiserver::{API_AUDIENCE, FakeApiServer, Identity};
use support::controller::ControllerProcess;
use support::store_forms::Form;

const CONTROLLER_TOKEN: &str = "controller-token-e2e";
const OTHER_REPLICA_TOKEN: &str = "controller-token-e2e-b";
const PASSWORD: &str = "mirror-e2e-hunter2";
const ROTATED: &str = "mirror-e2e-rotated-7";

fn controller_identity(name: &str) -> Identity {
    Identity::service_account("latchkey", name)
}

/// Grants `who` exactly what `daemonset/components/mirror/rbac.yaml` grants the controller's
/// service account (ClusterRoles through ClusterRoleBindings cluster-wide, Roles in their
/// namespace), so these tests fail when the deploy files lack a permission the controller uses.
fn allow_controller(s: &FakeApiServer, who: Identity) {
    let path = "daemonset/components/mirror/rbac.yaml";
    let granted = s.allow_roles_of(who, path);
    assert!(granted > 10, "no rules read from {path}");
}

/// The ClusterRoles and Roles of a deploy file (path from the repository root).
fn roles(path: &str) -> Vec<Value> {
    use serde::Deserialize as _;
    let text =
        std::fs::read_to_string(format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|d| serde_json::to_value(serde_norway::Value::deserialize(d).unwrap()).unwrap())
        .filter(|d| matches!(d["kind"].as_str(), Some("ClusterRole" | "Role")))
        .collect()
}

/// `(kind, verb)` of every rule of `roles` on core Secrets.
fn secret_verbs(roles: &[Value]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for role in roles {
        for rule in role["rules"].as_array().unwrap() {
            let has = |field: &str, want: &str| {
                rule[field]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v == want || v == "*")
            };
            if has("apiGroups", "") && has("resources", "secrets") {
                for verb in rule["verbs"].as_array().unwrap() {
                    out.push((
                        role["kind"].as_str().unwrap().into(),
                        verb.as_str().unwrap().into(),
                    ));
                }
            }
        }
    }
    out
}

/// A mount-only install can read no Secret beyond its own namespace and write none; Secret
/// writes exist only in the optional mirror component.
#[test]
fn secret_permissions_stay_where_the_design_puts_them() {
    let node = secret_verbs(&roles("daemonset/base/rbac.yaml"));
    assert_eq!(
        node,
        [("Role".to_string(), "get".to_string())],
        "node agent: {node:?}"
    );
    let mirror = secret_verbs(&roles("daemonset/components/mirror/rbac.yaml"));
    for verb in ["create", "patch", "delete"] {
        assert!(
            mirror.iter().any(|(_, v)| v == verb),
            "mirror lacks {verb}: {mirror:?}"
        );
    }
}

fn fake_store(value: &str) -> Value {
    json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "SecretStore",
    "metadata": {"name": "vault-like", "namespace": "shop"},
    "spec": {"provider": {"fake": {"data": [
        {"key": "shop/db", "value": json!({"password": value, "user": "shop"}).to_string()}
    ]}}}})
}

fn external_secret(name: &str, target: Value) -> Value {
    json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"secretStoreRef": {"name": "vault-like"}, "refreshInterval": "1s",
                 "data": [{"secretKey": "password",
                           "remoteRef": {"key": "shop/db", "property": "password"}}],
                 "target": target}})
}

async fn cluster() -> FakeApiServer {
    cluster_as(Form::Inline).await
}

/// [`cluster`] with the store in `form`.
async fn cluster_as(form: Form) -> FakeApiServer {
    let s = FakeApiServer::start().await;
    form.prepare(&s);
    s.add_identity(CONTROLLER_TOKEN, controller_identity("latchkey-controller"));
    allow_controller(&s, controller_identity("latchkey-controller"));
    for ns in ["shop", "latchkey"] {
        s.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
        s.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": ns}}));
    }
    for o in form.objects([fake_store(PASSWORD)]) {
        s.apply(o);
    }
    s
}

/// A ServiceAccount of `shop` whose manager lets the controller mint its tokens.
fn opted_in_service_account(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": "shop",
                     "annotations": {"latchkey.dev/allow-controller": "true"}}})
}

fn secret(s: &FakeApiServer, name: &str) -> Option<Value> {
    s.get("v1", "Secret", Some("shop"), name)
}

fn decoded(secret: &Value, key: &str) -> Option<String> {
    let b64 = secret.pointer(&format!("/data/{key}"))?.as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    String::from_utf8(bytes).ok()
}

/// The ExternalSecret `shop/name` as stored.
fn external(s: &FakeApiServer, name: &str) -> Option<Value> {
    s.get(
        "latchkey.dev/v1alpha1",
        "ExternalSecret",
        Some("shop"),
        name,
    )
}

fn ready(s: &FakeApiServer, name: &str) -> Option<(String, String, String)> {
    let es = external(s, name)?;
    let conditions = es.pointer("/status/conditions")?.as_array()?;
    let c = conditions.iter().find(|c| c["type"] == "Ready")?;
    Some((
        c["status"].as_str()?.to_string(),
        c["reason"].as_str()?.to_string(),
        c["message"].as_str().unwrap_or_default().to_string(),
    ))
}

/// Polls `check` every 50 ms for up to `within`.
async fn eventually<T>(within: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until Secret `name` holds `value` under `password`.
async fn holds(s: &FakeApiServer, name: &str, value: &str) -> Value {
    eventually(
        Duration::from_secs(15),
        &format!("{name} holding its value"),
        || secret(s, name).filter(|x| decoded(x, "password").as_deref() == Some(value)),
    )
    .await
}

/// Waits until Secret `name` exists with its values: the controller creates a Secret empty,
/// then applies its values (with the data-hash annotation) in a second request.
async fn appears(s: &FakeApiServer, name: &str) -> Value {
    eventually(Duration::from_secs(20), &format!("Secret {name}"), || {
        secret(s, name).filter(|x| {
            x.pointer("/metadata/annotations/latchkey.dev~1data-hash")
                .is_some()
        })
    })
    .await
}

/// Waits until ExternalSecret `name` is Ready with `reason`; returns the condition's message.
async fn reason_is(s: &FakeApiServer, name: &str, reason: &str) -> String {
    eventually(
        Duration::from_secs(15),
        &format!("{name}: {reason}"),
        || ready(s, name).filter(|r| r.1 == reason),
    )
    .await
    .2
}

fn no_value_leaked(s: &FakeApiServer, c: &ControllerProcess) {
    let log = c.log_text();
    let events = serde_json::to_string(&s.events()).unwrap();
    let statuses =
        serde_json::to_string(&s.objects("latchkey.dev/v1alpha1", "ExternalSecret")).unwrap();
    for value in [PASSWORD, ROTATED, CONTROLLER_TOKEN] {
        assert!(!log.contains(value), "log shows {value:?}");
        assert!(!events.contains(value), "an Event shows {value:?}");
        assert!(!statuses.contains(value), "a status shows {value:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_secret_appears_is_repaired_and_follows_the_remote_value() {
    owner_secret_appears_is_repaired_and_follows_the_remote_value_as(Form::Inline).await;
}

/// The same with the store naming a provider object (issue #41).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_secret_appears_is_repaired_and_follows_the_remote_value_by_provider_ref() {
    owner_secret_appears_is_repaired_and_follows_the_remote_value_as(Form::ByReference).await;
}

async fn owner_secret_appears_is_repaired_and_follows_the_remote_value_as(form: Form) {
    let s = cluster_as(form).await;
    s.apply(external_secret(
        "db",
        json!({"creationPolicy": "Owner", "name": "db-secret",
        "template": {"type": "kubernetes.io/basic-auth",
                     "metadata": {"labels": {"team": "shop"}}}}),
    ));
    // Mount-only: the controller never touches it.
    s.apply(external_secret("mount-only", json!({})));
    let c = ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;

    let created = appears(&s, "db-secret").await;
    assert_eq!(decoded(&created, "password").as_deref(), Some(PASSWORD));
    assert_eq!(created["type"], "kubernetes.io/basic-auth");
    assert_eq!(created["metadata"]["labels"]["team"], "shop");
    let es = external(&s, "db").unwrap();
    let owner = &created["metadata"]["ownerReferences"][0];
    assert_eq!(owner["uid"], es["metadata"]["uid"]);
    assert_eq!(owner["kind"], "ExternalSecret");
    assert_eq!(owner["controller"], true);
    let managers: Vec<&str> = created["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert!(managers.contains(&"latchkey"), "{managers:?}");
    let (status, reason, _) = eventually(Duration::from_secs(10), "Ready", || {
        ready(&s, "db").filter(|r| r.0 == "True")
    })
    .await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", "SecretSynced"));
    let es = external(&s, "db").unwrap();
    assert_eq!(es["status"]["binding"]["name"], "db-secret");
    assert_eq!(
        es["status"]["syncedResourceVersion"],
        es["metadata"]["generation"].to_string()
    );
    assert!(secret(&s, "mount-only").is_none());

    // Unchanged data: refreshes every second write nothing.
    let rv = created["metadata"]["resourceVersion"].clone();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        secret(&s, "db-secret").unwrap()["metadata"]["resourceVersion"],
        rv
    );

    // Someone edits the Secret by hand: repaired from the cache, no backend call needed.
    let mut edited = secret(&s, "db-secret").unwrap();
    edited["data"]["password"] = json!(base64::engine::general_purpose::STANDARD.encode("oops"));
    s.apply(edited);
    holds(&s, "db-secret", PASSWORD).await;

    // Someone deletes it: written again.
    s.delete("v1", "Secret", Some("shop"), "db-secret");
    appears(&s, "db-secret").await;

    // The remote value changes: the Secret follows within the refresh interval.
    for o in form.objects([fake_store(ROTATED)]) {
        s.apply(o);
    }
    holds(&s, "db-secret", ROTATED).await;

    // The ExternalSecret goes: garbage collection takes the Secret with it, and the controller
    // forgets it (its refresh schedule is gone from the queue).
    assert_eq!(c.metric("latchkey_mirror_queued").await, 1.0);
    s.delete(
        "latchkey.dev/v1alpha1",
        "ExternalSecret",
        Some("shop"),
        "db",
    );
    s.collect_garbage();
    assert!(secret(&s, "db-secret").is_none());
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.metric("latchkey_mirror_queued").await != 0.0 {
        assert!(
            Instant::now() < deadline,
            "a deleted ExternalSecret is still queued"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(c.metric("latchkey_mirror_leader").await >= 1.0);
    no_value_leaked(&s, &c);
}

#[tokio::test(flavor = "multi_thread")]
async fn conflicts_merges_and_bad_targets_each_get_their_reason() {
    let s = cluster().await;
    let unowned = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "taken", "namespace": "shop"},
        "data": {"password": base64::engine::general_purpose::STANDARD.encode("theirs")}});
    s.apply(unowned);
    let before = secret(&s, "taken").unwrap();
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "shared", "namespace": "shop",
                     "annotations": {"latchkey.dev/merge-from": "merge"}},
        "data": {"other": base64::engine::general_purpose::STANDARD.encode("kept")}}));
    s.apply(external_secret(
        "conflict",
        json!({"creationPolicy": "Owner", "name": "taken"}),
    ));
    s.apply(external_secret(
        "merge",
        json!({"creationPolicy": "Merge", "name": "shared"}),
    ));
    s.apply(external_secret(
        "missing",
        json!({"creationPolicy": "Merge", "name": "absent"}),
    ));
    let mut slashed = external_secret("slashed", json!({"creationPolicy": "Owner"}));
    slashed["spec"]["data"][0]["secretKey"] = json!("db/password");
    s.apply(slashed);
    let c = ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;

    for (name, want) in [
        ("conflict", "SecretConflict"),
        ("missing", "SecretMissing"),
        ("slashed", "InvalidTarget"),
        ("merge", "SecretSynced"),
    ] {
        let (_, reason, message) = eventually(Duration::from_secs(15), name, || {
            ready(&s, name).filter(|r| r.1 == want)
        })
        .await;
        assert!(message.contains("namespace \"shop\""), "{message}");
        assert!(message.contains(name), "{message}");
        assert_eq!(reason, want);
    }
    // The unowned Secret is untouched, byte for byte (resourceVersion included).
    assert_eq!(secret(&s, "taken").unwrap(), before);
    assert!(secret(&s, "absent").is_none());
    let merged = secret(&s, "shared").unwrap();
    assert_eq!(decoded(&merged, "other").as_deref(), Some("kept"));
    assert_eq!(decoded(&merged, "password").as_deref(), Some(PASSWORD));
    assert!(merged["metadata"].get("ownerReferences").is_none());
    // A conflict is reported as a Warning Event on the ExternalSecret. Events are written in
    // the background, after the condition: wait for it (a loaded CI machine once read none yet).
    eventually(
        Duration::from_secs(15),
        "a SecretConflict Warning Event",
        || {
            s.events().into_iter().find(|e| {
                e["reason"] == "SecretConflict"
                    && e["involvedObject"]["kind"] == "ExternalSecret"
                    && e["type"] == "Warning"
            })
        },
    )
    .await;
    no_value_leaked(&s, &c);
}

#[tokio::test(flavor = "multi_thread")]
async fn deletion_policies_apply_only_when_the_remote_value_is_gone() {
    let s = cluster().await;
    for (name, deletion) in [("retain", "Retain"), ("delete", "Delete")] {
        let mut es = external_secret(
            name,
            json!({"creationPolicy": "Owner", "deletionPolicy": deletion}),
        );
        es["spec"]["data"][0]["remoteRef"] = json!({"key": "shop/db", "property": "password"});
        s.apply(es);
    }
    let c = ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;
    for name in ["retain", "delete"] {
        appears(&s, name).await;
    }

    // The store disappears: an error, not a deletion. Both Secrets are kept as they are.
    s.delete(
        "latchkey.dev/v1alpha1",
        "SecretStore",
        Some("shop"),
        "vault-like",
    );
    for name in ["retain", "delete"] {
        let message = reason_is(&s, name, "SecretSyncedError").await;
        assert!(message.contains("vault-like"), "{message}");
    }
    assert!(secret(&s, "retain").is_some() && secret(&s, "delete").is_some());

    // The remote key is gone: Delete removes its Secret, Retain keeps it.
    let mut empty = fake_store(PASSWORD);
    empty["spec"]["provider"]["fake"]["data"] = json!([{"key": "other", "value": "x"}]);
    s.apply(empty);
    eventually(Duration::from_secs(15), "the Delete policy", || {
        secret(&s, "delete").is_none().then_some(())
    })
    .await;
    reason_is(&s, "delete", "SecretDeleted").await;
    let (_, _, message) = eventually(Duration::from_secs(10), "Retain", || {
        ready(&s, "retain").filter(|r| r.2.contains("deletionPolicy Retain"))
    })
    .await;
    assert!(message.contains("remote key \"shop/db\""), "{message}");
    assert_eq!(
        decoded(&secret(&s, "retain").unwrap(), "password").as_deref(),
        Some(PASSWORD)
    );
    no_value_leaked(&s, &c);
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_leader_writes_and_a_successor_takes_over() {
    let s = cluster().await;
    s.add_identity(
        OTHER_REPLICA_TOKEN,
        controller_identity("latchkey-controller-b"),
    );
    allow_controller(&s, controller_identity("latchkey-controller-b"));
    s.apply(external_secret("first", json!({"creationPolicy": "Owner"})));
    let mut a =
        ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;
    appears(&s, "first").await;
    let b =
        ControllerProcess::start(&s.kubeconfig_yaml(OTHER_REPLICA_TOKEN), "replica-b", &[]).await;
    let lease = s
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("latchkey"),
            "latchkey-controller",
        )
        .expect("the leader Lease");
    assert_eq!(lease["spec"]["holderIdentity"], "replica-a");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes_by = |who: &Identity| {
        s.requests()
            .iter()
            .filter(|r| r.identity.as_ref() == Some(who))
            .filter(|r| {
                r.path.contains("/secrets") && matches!(r.method.as_str(), "PATCH" | "POST" | "PUT")
            })
            .count()
    };
    let b_identity = controller_identity("latchkey-controller-b");
    assert_eq!(writes_by(&b_identity), 0, "the follower wrote a Secret");
    assert_eq!(b.metric("latchkey_mirror_leader").await, 0.0);

    // The leader dies without releasing its lease: the follower takes over within the lease
    // duration (3 s) plus a retry period, and serves a new ExternalSecret.
    a.kill9();
    let killed = Instant::now();
    s.apply(external_secret(
        "second",
        json!({"creationPolicy": "Owner"}),
    ));
    appears(&s, "second").await;
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "{:?}",
        killed.elapsed()
    );
    assert!(writes_by(&b_identity) > 0);
    let lease = s
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("latchkey"),
            "latchkey-controller",
        )
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "replica-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn api_server_errors_delay_but_never_lose_work() {
    let s = cluster().await;
    s.apply(external_secret("flaky", json!({"creationPolicy": "Owner"})));
    // The first writes meet a throttling and a failing API server: the create, then the apply
    // of the values.
    s.fail_next("PATCH", "/secrets/flaky", 429, 2);
    s.fail_next("PATCH", "/secrets/flaky", 500, 1);
    // The create that comes first, too (a create has no name in its path).
    s.fail_next("POST", "/namespaces/shop/secrets", 500, 1);
    let c = ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;
    holds(&s, "flaky", PASSWORD).await;
    // Watches expiring (410) are survived too.
    s.compact();
    s.close_watches();
    s.apply(external_secret(
        "after-compaction",
        json!({"creationPolicy": "Owner"}),
    ));
    appears(&s, "after-compaction").await;
    no_value_leaked(&s, &c);
}

#[tokio::test(flavor = "multi_thread")]
async fn reads_as_the_external_secret_s_service_account_with_minted_tokens() {
    let s = cluster().await;
    s.apply(opted_in_service_account("reader"));
    // Opted in too, so what refuses it below is RBAC.
    s.apply(opted_in_service_account("default"));
    // Only `shop/reader` may read the source Secret; `default` may not.
    s.allow(
        Identity::service_account("shop", "reader"),
        "get",
        "",
        "secrets",
        Some("shop"),
    );
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "app-credentials", "namespace": "shop"},
        "stringData": {"password": PASSWORD}}));
    s.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "SecretStore",
        "metadata": {"name": "same-namespace", "namespace": "shop"},
        "spec": {"provider": {"kubernetes": {}}}}),
    );
    for (name, account) in [
        ("as-reader-1", "reader"),
        ("as-reader-2", "reader"),
        ("as-default", "default"),
    ] {
        s.apply(
            json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"secretStoreRef": {"name": "same-namespace"}, "refreshInterval": "1s",
                     "serviceAccountName": account,
                     "data": [{"secretKey": "password",
                               "remoteRef": {"key": "app-credentials", "property": "password"}}],
                     "target": {"creationPolicy": "Owner"}}}),
        );
    }
    let c = ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;
    for name in ["as-reader-1", "as-reader-2"] {
        let written = appears(&s, name).await;
        assert_eq!(decoded(&written, "password").as_deref(), Some(PASSWORD));
    }
    let (_, reason, message) = eventually(Duration::from_secs(15), "as-default refused", || {
        ready(&s, "as-default").filter(|r| r.1 == "SecretSyncedError")
    })
    .await;
    assert_eq!(reason, "SecretSyncedError");
    assert!(message.contains("app-credentials"), "{message}");
    assert!(secret(&s, "as-default").is_none());

    // Several refreshes later: one token per service account and audience, 10 minutes each.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let minted = s.token_requests();
    let for_reader = minted
        .iter()
        .filter(|t| t.namespace == "shop" && t.service_account == "reader")
        .count();
    assert_eq!(for_reader, 1, "{minted:?}");
    assert!(
        minted.iter().all(|t| t.expiration_seconds == 600),
        "{minted:?}"
    );
    // No audience asked for: the API server's own, as the `kubernetes` provider needs.
    assert!(
        minted.iter().all(|t| t.audiences == [API_AUDIENCE]),
        "{minted:?}"
    );
    no_value_leaked(&s, &c);
}

#[tokio::test(flavor = "multi_thread")]
async fn orphan_immutable_and_refresh_policies_behave_as_in_eso() {
    let s = cluster().await;
    s.apply(external_secret(
        "orphan",
        json!({"creationPolicy": "Orphan"}),
    ));
    s.apply(external_secret(
        "frozen",
        json!({"creationPolicy": "Owner", "immutable": true}),
    ));
    let mut once = external_secret("once", json!({"creationPolicy": "Owner"}));
    once["spec"]["refreshPolicy"] = json!("CreatedOnce");
    s.apply(once);
    let mut on_change = external_secret("on-change", json!({"creationPolicy": "Owner"}));
    on_change["spec"]["refreshPolicy"] = json!("OnChange");
    s.apply(on_change.clone());
    let c = ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;
    for name in ["orphan", "frozen", "once", "on-change"] {
        appears(&s, name).await;
    }
    assert!(
        secret(&s, "orphan").unwrap()["metadata"]
            .get("ownerReferences")
            .is_none()
    );
    assert_eq!(secret(&s, "frozen").unwrap()["immutable"], true);

    // The remote value rotates: periodic refreshes would follow it; these do not.
    s.apply(fake_store(ROTATED));
    let message = reason_is(&s, "frozen", "SecretImmutable").await;
    assert!(message.contains("immutable"), "{message}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in ["frozen", "once", "on-change"] {
        let kept = decoded(&secret(&s, name).unwrap(), "password");
        assert_eq!(kept.as_deref(), Some(PASSWORD), "{name} changed");
    }
    // OnChange follows a change of the spec; CreatedOnce writes a deleted Secret again.
    on_change["spec"]["refreshInterval"] = json!("2s");
    s.apply(on_change);
    holds(&s, "on-change", ROTATED).await;
    s.delete("v1", "Secret", Some("shop"), "once");
    appears(&s, "once").await;

    // An orphaned Secret outlives its ExternalSecret.
    s.delete(
        "latchkey.dev/v1alpha1",
        "ExternalSecret",
        Some("shop"),
        "orphan",
    );
    s.collect_garbage();
    assert!(secret(&s, "orphan").is_some());
    no_value_leaked(&s, &c);
}

#[tokio::test(flavor = "multi_thread")]
async fn merge_deletion_removes_only_the_keys_latchkey_wrote() {
    let s = cluster().await;
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "app", "namespace": "shop",
                     "annotations": {"latchkey.dev/merge-from": "into-app"}},
        "data": {"other": base64::engine::general_purpose::STANDARD.encode("kept")}}));
    s.apply(external_secret(
        "into-app",
        json!({"creationPolicy": "Merge", "name": "app",
        "deletionPolicy": "Merge"}),
    ));
    let c = ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;
    eventually(Duration::from_secs(15), "the merged key", || {
        secret(&s, "app").filter(|x| decoded(x, "password").is_some())
    })
    .await;
    let mut gone = fake_store(PASSWORD);
    gone["spec"]["provider"]["fake"]["data"] = json!([{"key": "other", "value": "x"}]);
    s.apply(gone);
    let kept = eventually(Duration::from_secs(15), "the merged key removed", || {
        secret(&s, "app").filter(|x| decoded(x, "password").is_none())
    })
    .await;
    assert_eq!(decoded(&kept, "other").as_deref(), Some("kept"));
    reason_is(&s, "into-app", "SecretDeleted").await;
    no_value_leaked(&s, &c);
}

#[tokio::test(flavor = "multi_thread")]
async fn templates_have_no_pod_and_a_dry_run_writes_nothing() {
    let s = cluster().await;
    s.apply(external_secret(
        "uses-pod",
        json!({"creationPolicy": "Owner",
        "template": {"data": {"who": "pod.name", "url": "'db://' + secret.password"}}}),
    ));
    s.apply(external_secret(
        "templated",
        json!({"creationPolicy": "Owner",
        "template": {"data": {"url": "'db://shop:' + secret.password + '@db'"}}}),
    ));
    let dry = ControllerProcess::start(
        &s.kubeconfig_yaml(CONTROLLER_TOKEN),
        "dry",
        &["--dry-run", "--leader-elect=false"],
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && !dry.log_text().contains("dry run: would apply") {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = dry.log_text();
    assert!(log.contains("dry run: would apply"), "{log}");
    assert!(log.contains("url"), "the dry run names the keys: {log}");
    assert!(secret(&s, "templated").is_none());
    assert!(ready(&s, "templated").is_none(), "a dry run wrote a status");
    no_value_leaked(&s, &dry);
    drop(dry);

    let c = ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;
    let written = appears(&s, "templated").await;
    assert_eq!(
        decoded(&written, "url"),
        Some(format!("db://shop:{PASSWORD}@db"))
    );
    let message = reason_is(&s, "uses-pod", "TemplateError").await;
    assert!(
        message.contains("\"who\""),
        "names the template key: {message}"
    );
    assert!(message.contains("pod"), "{message}");
    no_value_leaked(&s, &c);
}

/// Sum of every `latchkey_backend_requests_total` series of `provider` whose result is `result`
/// (`None`: any result).
async fn backend_requests(c: &ControllerProcess, provider: &str, result: Option<&str>) -> f64 {
    let prefix = format!("latchkey_backend_requests_total{{provider=\"{provider}\"");
    c.metrics()
        .await
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter(|l| result.is_none_or(|r| l.contains(&format!("result=\"{r}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn openbao_kubernetes_login_as_the_service_account_and_a_backend_outage_keeps_the_secret() {
    use support::openbao::OpenBao;

    let s = cluster().await;
    let bao = OpenBao::start().await;
    bao.policy(
        "read",
        r#"path "secret/data/shop/*" { capabilities = ["read"] }"#,
    )
    .await;
    bao.put_v2("secret", "shop/db", json!({"password": PASSWORD}))
        .await;
    // OpenBao checks the minted tokens with the fake API server's TokenReview.
    let reviewer = s.token_reviewer();
    bao.kubernetes(
        &s.url(),
        &reviewer,
        "shop",
        ("shop", "reader"),
        "vault",
        &["read"],
    )
    .await;
    s.apply(opted_in_service_account("reader"));
    s.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "SecretStore",
        "metadata": {"name": "vault", "namespace": "shop"},
        "spec": {"provider": {"vault": {"server": bao.url, "path": "secret", "version": "v2",
            "auth": {"kubernetes": {"mountPath": "kubernetes", "role": "shop",
                                    "audience": "vault"}}}}}}),
    );
    for name in ["vault-1", "vault-2", "vault-3"] {
        s.apply(
            json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"secretStoreRef": {"name": "vault"}, "refreshInterval": "1s",
                     "serviceAccountName": "reader",
                     "data": [{"secretKey": "password",
                               "remoteRef": {"key": "shop/db", "property": "password"}}],
                     "target": {"creationPolicy": "Owner"}}}),
        );
    }
    let mut c =
        ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;
    for name in ["vault-1", "vault-2", "vault-3"] {
        let written = appears(&s, name).await;
        assert_eq!(decoded(&written, "password").as_deref(), Some(PASSWORD));
    }
    assert_eq!(
        c.metric("latchkey_backend_logins_total{provider=\"vault\"}")
            .await,
        1.0,
        "one login for the service account, whatever the number of ExternalSecrets"
    );
    let minted = s.token_requests();
    assert_eq!(minted.len(), 1, "{minted:?}");
    assert_eq!(minted[0].audiences, ["vault"]);
    assert_eq!(minted[0].service_account, "reader");

    // The backend goes away: every Secret is kept, Ready turns False, and calls stay bounded.
    let mut bao = bao;
    bao.stop();
    for name in ["vault-1", "vault-2", "vault-3"] {
        let message = reason_is(&s, name, "SecretSyncedError").await;
        assert!(
            message.contains("remote key \"shop/db\"") || message.contains("backing off"),
            "{message}"
        );
    }
    let failed_before = backend_requests(&c, "vault", None).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let failed_during = backend_requests(&c, "vault", None).await - failed_before;
    // Healthy, 3 ExternalSecrets refreshing every second cost at most 6 reads in 6 s (one per
    // interval, shared); failing, backoff keeps it at or below that.
    assert!(
        failed_during <= 6.0,
        "{failed_during} backend requests in 6 s of outage"
    );
    for name in ["vault-1", "vault-2", "vault-3"] {
        assert_eq!(
            decoded(&secret(&s, name).unwrap(), "password").as_deref(),
            Some(PASSWORD)
        );
    }
    let log = c.log_text();
    assert!(!log.contains(&reviewer));
    no_value_leaked(&s, &c);
    let status = c.stop();
    assert!(status.success(), "SIGTERM: {status}\n{}", c.log_text());
}

#[tokio::test(flavor = "multi_thread")]
async fn namespaces_and_a_selector_split_the_work_between_instances() {
    let s = cluster().await;
    let mut team_a = external_secret("team-a", json!({"creationPolicy": "Owner"}));
    team_a["metadata"]["labels"] = json!({"team": "a"});
    let mut team_b = external_secret("team-b", json!({"creationPolicy": "Owner"}));
    team_b["metadata"]["labels"] = json!({"team": "b"});
    s.apply(team_a);
    s.apply(team_b);
    s.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}}));
    let mut elsewhere = fake_store(PASSWORD);
    elsewhere["metadata"]["namespace"] = json!("other");
    s.apply(elsewhere);
    let mut other = external_secret("team-a-other", json!({"creationPolicy": "Owner"}));
    other["metadata"]["namespace"] = json!("other");
    other["metadata"]["labels"] = json!({"team": "a"});
    s.apply(other);
    let c = ControllerProcess::start(
        &s.kubeconfig_yaml(CONTROLLER_TOKEN),
        "team-a",
        &[
            "--namespace",
            "shop",
            "--selector",
            "team=a",
            "--leader-elect=false",
        ],
    )
    .await;
    appears(&s, "team-a").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        secret(&s, "team-b").is_none(),
        "another instance's ExternalSecret"
    );
    assert!(
        s.get("v1", "Secret", Some("other"), "team-a-other")
            .is_none()
    );
    assert!(
        s.get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("latchkey"),
            "latchkey-controller"
        )
        .is_none(),
        "no election with --leader-elect=false"
    );
    no_value_leaked(&s, &c);
}

/// The `Ready` condition and provider of a store, as `kubectl get lkss,lkcss` prints them.
fn store_status(
    s: &FakeApiServer,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> Option<Value> {
    s.get("latchkey.dev/v1alpha1", kind, namespace, name)?
        .get("status")
        .cloned()
}

fn store_ready(status: &Value) -> (String, String, String) {
    let c = status["conditions"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["type"] == "Ready"))
        .unwrap_or_else(|| panic!("no Ready condition: {status}"));
    let text = |field: &str| c[field].as_str().unwrap_or_default().to_string();
    (text("status"), text("reason"), text("message"))
}

/// Stores get the status their printer columns show: the provider, and whether the agent accepts
/// the spec. The leader writes it once (nothing while it is unchanged) and again when a fix
/// changes the verdict; no value of the store's spec reaches the status or the log.
#[tokio::test(flavor = "multi_thread")]
async fn stores_show_their_provider_and_whether_their_spec_is_usable() {
    let s = cluster().await;
    let two_providers = |providers: Value| {
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ClusterSecretStore",
               "metadata": {"name": "shared"}, "spec": {"provider": providers}})
    };
    s.apply(two_providers(json!({"kubernetes": {}, "fake": {"data": [
        {"key": "k", "value": PASSWORD}]}})));
    let c = ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;

    let valid = eventually(Duration::from_secs(15), "the SecretStore's status", || {
        store_status(&s, "SecretStore", Some("shop"), "vault-like")
    })
    .await;
    assert_eq!(valid["provider"], "fake");
    let (status, reason, message) = store_ready(&valid);
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Valid"));
    assert!(message.contains("checked at each mount"), "{message}");

    let invalid = eventually(
        Duration::from_secs(15),
        "the ClusterSecretStore's status",
        || store_status(&s, "ClusterSecretStore", None, "shared"),
    )
    .await;
    assert_eq!(invalid["provider"], "kubernetes,fake");
    let (status, reason, message) = store_ready(&invalid);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "InvalidProviderConfig")
    );
    assert!(message.starts_with("spec.provider:"), "{message}");

    // An unchanged verdict is not written again (each write is a watch event on every node).
    let stored = |kind, namespace, name| {
        s.get("latchkey.dev/v1alpha1", kind, namespace, name)
            .unwrap()["metadata"]["resourceVersion"]
            .clone()
    };
    let before = (
        stored("SecretStore", Some("shop"), "vault-like"),
        stored("ClusterSecretStore", None, "shared"),
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = (
        stored("SecretStore", Some("shop"), "vault-like"),
        stored("ClusterSecretStore", None, "shared"),
    );
    assert_eq!(before, after, "a store's status was rewritten unchanged");

    s.apply(two_providers(
        json!({"fake": {"data": [{"key": "k", "value": PASSWORD}]}}),
    ));
    let fixed = eventually(Duration::from_secs(15), "the fixed store Ready", || {
        store_status(&s, "ClusterSecretStore", None, "shared")
            .filter(|st| store_ready(st).0 == "True")
    })
    .await;
    assert_eq!(fixed["provider"], "fake");
    let statuses = [valid, invalid, fixed].map(|st| st.to_string()).join("\n");
    assert!(!statuses.contains(PASSWORD), "{statuses}");
    assert!(!c.log_text().contains(PASSWORD));
}

/// The Ready reason of every Event recorded for ExternalSecret `name`.
fn event_reasons(s: &FakeApiServer, name: &str) -> Vec<String> {
    s.events()
        .into_iter()
        .filter(|e| e["involvedObject"]["kind"] == "ExternalSecret")
        .filter(|e| e["involvedObject"]["name"] == name)
        .filter_map(|e| e["reason"].as_str().map(str::to_string))
        .collect()
}

/// Merge writes only into a Secret whose editor opted it in for this very ExternalSecret, never
/// into a service-account token Secret, and a template can neither produce a token Secret nor
/// set Latchkey's own marks. Every refusal comes before any backend call.
#[tokio::test(flavor = "multi_thread")]
async fn merge_needs_the_secret_s_opt_in_and_no_token_secret_is_ever_written() {
    let s = cluster().await;
    let b64 = |v: &str| base64::engine::general_purpose::STANDARD.encode(v);
    // A cert-manager TLS Secret nobody opted in, one opted in for another ExternalSecret, and a
    // token Secret that even carries an opt-in.
    s.apply(
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "web-tls", "namespace": "shop"},
        "data": {"tls.crt": b64("cert"), "tls.key": b64("the-real-key")}}),
    );
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "for-another", "namespace": "shop",
                     "annotations": {"latchkey.dev/merge-from": "someone-else"}},
        "data": {"other": b64("kept")}}));
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {"name": "deployer-token", "namespace": "shop",
                     "annotations": {"kubernetes.io/service-account.name": "deployer",
                                     "latchkey.dev/merge-from": "into-token"}},
        "data": {"token": b64("a-service-account-token")}}));
    let untouched: Vec<Value> = ["web-tls", "for-another", "deployer-token"]
        .iter()
        .map(|n| secret(&s, n).unwrap())
        .collect();
    let mut into_tls = external_secret(
        "into-tls",
        json!({"creationPolicy": "Merge", "name": "web-tls"}),
    );
    into_tls["spec"]["data"][0]["secretKey"] = json!("tls.key");
    s.apply(into_tls);
    s.apply(external_secret(
        "into-another",
        json!({"creationPolicy": "Merge", "name": "for-another"}),
    ));
    s.apply(external_secret(
        "into-token",
        json!({"creationPolicy": "Merge", "name": "deployer-token"}),
    ));
    s.apply(external_secret(
        "makes-token",
        json!({"creationPolicy": "Owner",
               "template": {"type": "kubernetes.io/service-account-token"}}),
    ));
    s.apply(external_secret(
        "forges-marks",
        json!({"creationPolicy": "Owner",
               "template": {"metadata": {"annotations": {"latchkey.dev/created-for": "x"}}}}),
    ));
    let c = ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;

    for (name, want, says) in [
        (
            "into-tls",
            "SecretConflict",
            "latchkey.dev/merge-from=into-tls",
        ),
        ("into-another", "SecretConflict", "someone-else"),
        ("into-token", "SecretConflict", "service-account token"),
        ("makes-token", "InvalidTarget", "service-account token"),
        ("forges-marks", "InvalidTarget", "latchkey.dev/created-for"),
    ] {
        let message = reason_is(&s, name, want).await;
        assert!(message.contains("namespace \"shop\""), "{message}");
        assert!(message.contains(name), "{message}");
        assert!(message.contains(says), "{name}: {message}");
    }
    // Retried a few times: still nothing written, nothing read from the backend.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for before in &untouched {
        let name = before["metadata"]["name"].as_str().unwrap();
        assert_eq!(&secret(&s, name).unwrap(), before, "{name} was written");
    }
    assert!(secret(&s, "makes-token").is_none());
    assert!(secret(&s, "forges-marks").is_none());
    assert_eq!(backend_requests(&c, "fake", None).await, 0.0);
    no_value_leaked(&s, &c);
}

/// A Merge's marks never make a Secret the controller's: switching the ExternalSecret to Owner
/// with deletionPolicy Delete neither adopts nor deletes the Secret it merged into.
#[tokio::test(flavor = "multi_thread")]
async fn a_secret_merged_into_is_never_adopted_nor_deleted() {
    let s = cluster().await;
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "app", "namespace": "shop",
                     "annotations": {"latchkey.dev/merge-from": "db"}},
        "data": {"other": base64::engine::general_purpose::STANDARD.encode("kept")}}));
    let mut es = external_secret("db", json!({"creationPolicy": "Merge", "name": "app"}));
    s.apply(es.clone());
    let c = ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;
    holds(&s, "app", PASSWORD).await;
    reason_is(&s, "db", "SecretSynced").await;

    for policy in ["Owner", "Orphan"] {
        es["spec"]["target"] =
            json!({"creationPolicy": policy, "name": "app", "deletionPolicy": "Delete"});
        s.apply(es.clone());
        let message = reason_is(&s, "db", "SecretConflict").await;
        assert!(message.contains("not created by Latchkey"), "{message}");
        let app = secret(&s, "app").unwrap();
        assert!(app["metadata"].get("ownerReferences").is_none(), "{app}");
        // Back to Merge in between, so the next policy starts from a synced Secret.
        es["spec"]["target"] = json!({"creationPolicy": "Merge", "name": "app"});
        s.apply(es.clone());
        reason_is(&s, "db", "SecretSynced").await;
    }
    // Owner + Delete, and the remote value goes: the Secret stays.
    es["spec"]["target"] =
        json!({"creationPolicy": "Owner", "name": "app", "deletionPolicy": "Delete"});
    s.apply(es);
    reason_is(&s, "db", "SecretConflict").await;
    let mut gone = fake_store(PASSWORD);
    gone["spec"]["provider"]["fake"]["data"] = json!([{"key": "other", "value": "x"}]);
    s.apply(gone);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let app = secret(&s, "app").expect("a Secret Latchkey did not create was deleted");
    assert_eq!(decoded(&app, "other").as_deref(), Some("kept"));
    assert_eq!(ready(&s, "db").unwrap().1, "SecretConflict");
    let deletes = s
        .requests()
        .iter()
        .filter(|r| r.method == "DELETE" && r.path.contains("/secrets/"))
        .count();
    assert_eq!(deletes, 0);
    no_value_leaked(&s, &c);
}

/// Two Owner ExternalSecrets name one Secret and check for it at the same moment (both reads
/// held together by the API server): one create wins, the other reports SecretConflict and
/// never SecretSynced, and the Secret is the winner's alone.
#[tokio::test(flavor = "multi_thread")]
async fn two_owners_racing_for_one_target_leave_one_winner() {
    let s = cluster().await;
    for name in ["first", "second"] {
        s.apply(external_secret(
            name,
            json!({"creationPolicy": "Owner", "name": "contested"}),
        ));
    }
    s.delay_next(
        "GET",
        "/namespaces/shop/secrets/contested",
        Duration::from_millis(1500),
        2,
    );
    let c = ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;
    holds(&s, "contested", PASSWORD).await;
    let outcome = |name| {
        ready(&s, name)
            .filter(|r| r.1 == "SecretSynced" || r.1 == "SecretConflict")
            .map(|r| r.1)
    };
    let first = eventually(Duration::from_secs(15), "first's outcome", || {
        outcome("first")
    })
    .await;
    let second = eventually(Duration::from_secs(15), "second's outcome", || {
        outcome("second")
    })
    .await;
    let (winner, loser) = match (first.as_str(), second.as_str()) {
        ("SecretSynced", "SecretConflict") => ("first", "second"),
        ("SecretConflict", "SecretSynced") => ("second", "first"),
        other => panic!("not one winner: {other:?}"),
    };
    // Both checked at once: both reads were held, answered "absent", and both tried to create
    // it; the create is what decided.
    let creates = s
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/namespaces/shop/secrets"))
        .count();
    assert_eq!(
        creates, 2,
        "both saw the Secret absent and tried to create it"
    );
    // Several refreshes later the verdict holds, and the loser never reported SecretSynced.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(ready(&s, winner).unwrap().1, "SecretSynced");
    assert_eq!(ready(&s, loser).unwrap().1, "SecretConflict");
    let reasons = event_reasons(&s, loser);
    assert!(
        !reasons.iter().any(|r| r == "SecretSynced"),
        "{loser}: {reasons:?}"
    );
    let contested = secret(&s, "contested").unwrap();
    let owners = contested["metadata"]["ownerReferences"].as_array().unwrap();
    let uid = external(&s, winner).unwrap()["metadata"]["uid"].clone();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(owners[0]["uid"], uid);
    assert_eq!(
        contested["metadata"]["annotations"]["latchkey.dev/created-for"],
        uid
    );
    no_value_leaked(&s, &c);
}

/// Tokens are minted only for a service account that opted in, and never for the API server's
/// own audience when the store would send it to a backend; the controller's own identity is
/// refused for a ClusterSecretStore's agentIdentity unless allowed. Each refusal says which
/// namespace, ExternalSecret and service account, and what to do.
#[tokio::test(flavor = "multi_thread")]
async fn tokens_only_for_opted_in_service_accounts_and_audiences_a_backend_checks() {
    let s = cluster().await;
    // A powerful service account its manager never opted in.
    s.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "cluster-deployer", "namespace": "shop"}}));
    s.apply(opted_in_service_account("reader"));
    s.allow(
        Identity::service_account("shop", "reader"),
        "get",
        "",
        "secrets",
        Some("shop"),
    );
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "app-credentials", "namespace": "shop"},
        "stringData": {"password": PASSWORD}}));
    s.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "SecretStore",
        "metadata": {"name": "same-namespace", "namespace": "shop"},
        "spec": {"provider": {"kubernetes": {}}}}),
    );
    // A tenant's "Vault" that would receive an API-server token (no audience set).
    s.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "SecretStore",
        "metadata": {"name": "tenant-vault", "namespace": "shop"},
        "spec": {"provider": {"vault": {"server": "http://127.0.0.1:9", "path": "secret",
            "version": "v2", "auth": {"kubernetes": {"role": "shop"}}}}}}),
    );
    s.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ClusterSecretStore",
        "metadata": {"name": "as-the-node"},
        "spec": {"provider": {"aws": {"service": "SecretsManager", "region": "eu-west-1",
            "auth": {"agentIdentity": {}}}}}}),
    );
    let es = |name: &str, store: Value, account: &str| {
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"secretStoreRef": store, "refreshInterval": "1s",
                     "serviceAccountName": account,
                     "data": [{"secretKey": "password",
                               "remoteRef": {"key": "app-credentials", "property": "password"}}],
                     "target": {"creationPolicy": "Owner"}}})
    };
    s.apply(es(
        "as-deployer",
        json!({"name": "same-namespace"}),
        "cluster-deployer",
    ));
    s.apply(es("as-ghost", json!({"name": "same-namespace"}), "ghost"));
    s.apply(es(
        "to-tenant-vault",
        json!({"name": "tenant-vault"}),
        "reader",
    ));
    s.apply(es(
        "as-the-controller",
        json!({"name": "as-the-node", "kind": "ClusterSecretStore"}),
        "reader",
    ));
    s.apply(es("as-reader", json!({"name": "same-namespace"}), "reader"));
    let c = ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;

    let written = appears(&s, "as-reader").await;
    assert_eq!(decoded(&written, "password").as_deref(), Some(PASSWORD));
    for (name, says) in [
        (
            "as-deployer",
            "kubectl annotate serviceaccount -n shop cluster-deployer \
             latchkey.dev/allow-controller=true",
        ),
        ("as-ghost", "service account shop/ghost does not exist"),
        ("to-tenant-vault", "API server's own audience"),
        ("as-the-controller", "--allow-agent-identity"),
    ] {
        let message = reason_is(&s, name, "SecretSyncedError").await;
        assert!(message.contains("namespace \"shop\""), "{message}");
        assert!(message.contains(&format!("\"{name}\"")), "{message}");
        assert!(message.contains(says), "{name}: {message}");
        assert!(secret(&s, name).is_none());
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let minted = s.token_requests();
    assert!(
        minted.iter().all(|t| t.service_account == "reader"),
        "{minted:?}"
    );
    assert_eq!(minted.len(), 1, "{minted:?}");
    no_value_leaked(&s, &c);
}

/// A tenant's ClusterSecretStore-admitted Vault answering 14 MB holding one million tiny keys
/// (under the 16 MiB byte cap): the controller parsed it into a JSON tree (~185 MB) on every
/// retry, in a 128Mi container. Now the keys are counted as the answer arrives: the
/// ExternalSecret reports the limit, naming store and key, no Secret is written, and retries
/// leave the controller's memory where it was.
#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_answer_of_a_million_keys_is_refused_without_growing_the_controller() {
    use support::hostile::{Answer, Hostile, many_keys_answer};

    let s = cluster().await;
    let hostile = Hostile::start(Answer::Fixed(200, many_keys_answer(1_000_000, 1))).await;
    let token = base64::engine::general_purpose::STANDARD.encode("s.hostile-token");
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "vault-token", "namespace": "latchkey"},
        "data": {"token": token}}));
    s.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ClusterSecretStore",
        "metadata": {"name": "tenant-vault"},
        "spec": {"provider": {"vault": {"server": hostile.url, "path": "secret", "version": "v2",
            "auth": {"tokenSecretRef": {"name": "vault-token", "key": "token",
                                        "namespace": "latchkey"}}}}}}),
    );
    let mut c =
        ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;
    let baseline = c.peak_rss_mib();
    s.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
        "metadata": {"name": "flood", "namespace": "shop"},
        "spec": {"secretStoreRef": {"name": "tenant-vault", "kind": "ClusterSecretStore"},
                 "refreshInterval": "1s",
                 "dataFrom": [{"extract": {"key": "app/flood"}}],
                 "target": {"creationPolicy": "Owner"}}}),
    );
    let message = reason_is(&s, "flood", "SecretSyncedError").await;
    // The first retry comes after RETRY_FLOOR (5 s): three answers read in all.
    eventually(Duration::from_secs(20), "two retries", || {
        (hostile.requests() >= 3).then_some(())
    })
    .await;
    let peak = c.peak_rss_mib();
    eprintln!("peak RSS {peak} MiB (baseline {baseline} MiB)");
    assert!(
        peak.saturating_sub(baseline) < 32,
        "peak RSS {peak} MiB (baseline {baseline} MiB) after {} answers",
        hostile.requests()
    );
    assert!(
        message.contains("namespace \"shop\"")
            && message.contains("ExternalSecret \"flood\"")
            && message.contains("ClusterSecretStore \"tenant-vault\"")
            && message.contains("remote key \"app/flood\"")
            && message.contains("more than 10000"),
        "{message}"
    );
    assert!(secret(&s, "flood").is_none(), "a Secret was written");
    let log = c.log_text();
    let statuses =
        serde_json::to_string(&s.objects("latchkey.dev/v1alpha1", "ExternalSecret")).unwrap();
    for text in [log.as_str(), statuses.as_str()] {
        assert!(!text.contains("k000123") && !text.contains("s.hostile-token"));
    }
    c.stop();
}
