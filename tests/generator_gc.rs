//! End to end: the real `latchkey controller` against the fake API server cleans up
//! GeneratorStates being deleted (finalizer), never wedges a deletion (bounded retries, then the
//! credential is left to its TTL), deletes states past their garbage-collection deadline, and
//! acts only as the state's own opted-in service account. Also checks the fake API server's
//! finalizer and namespace-termination behaviour these tests rely on.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::apiserver::{FakeApiServer, Identity};
use support::controller::ControllerProcess;
use support::openbao::OpenBao;

const CONTROLLER_TOKEN: &str = "controller-token-gc";
const ADMIN_TOKEN: &str = "admin-token-gc";
const GROUP: &str = "generators.latchkey.dev/v1alpha1";
const FINALIZER: &str = "generators.latchkey.dev/cleanup";
/// `--generator-cleanup-timeout` of these tests (the default is 5m).
const TIMEOUT: Duration = Duration::from_secs(3);

fn controller_identity() -> Identity {
    Identity::service_account("latchkey", "latchkey-controller")
}

/// Grants the controller what `daemonset/components/mirror/rbac.yaml` grants it, plus the
/// GeneratorState verbs the collector uses.
fn allow_controller(s: &FakeApiServer, generator_states: bool) {
    let who = controller_identity();
    s.allow_roles_of(who.clone(), "daemonset/components/mirror/rbac.yaml");
    let verbs: &[&str] = if generator_states {
        &["get", "list", "watch", "patch", "delete"]
    } else {
        &[]
    };
    for verb in verbs {
        s.allow(
            who.clone(),
            verb,
            "generators.latchkey.dev",
            "generatorstates",
            None,
        );
    }
}

async fn cluster(namespaces: &[&str]) -> FakeApiServer {
    cluster_with(namespaces, true).await
}

async fn cluster_with(namespaces: &[&str], generator_states: bool) -> FakeApiServer {
    let s = FakeApiServer::start().await;
    s.add_identity(CONTROLLER_TOKEN, controller_identity());
    s.add_identity(ADMIN_TOKEN, Identity::User("admin".into()));
    s.allow(Identity::User("admin".into()), "*", "*", "*", None);
    allow_controller(&s, generator_states);
    for ns in namespaces.iter().chain(&["latchkey"]) {
        s.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    s
}

fn service_account(namespace: &str, name: &str, opted_in: bool) -> Value {
    let mut sa = json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": namespace}});
    if opted_in {
        sa["metadata"]["annotations"] = json!({"latchkey.dev/allow-controller": "true"});
    }
    sa
}

/// A generator as the agent records it in `spec.resource` (`GeneratorObject::to_resource`).
fn resource(kind: &str, spec: Value) -> Value {
    json!({"apiVersion": GROUP, "kind": kind, "metadata": {"name": "gen"}, "spec": spec})
}

fn password() -> Value {
    resource("Password", json!({"length": 16}))
}

/// A Vault generator whose server nobody answers on: every cleanup fails as "unavailable".
fn unreachable_vault() -> Value {
    resource(
        "VaultDynamicSecret",
        json!({"path": "pki/issue/example-dot-com", "method": "POST",
            "parameters": {"common_name": "localhost"},
            "provider": {"server": "http://127.0.0.1:9",
                         "auth": {"kubernetes": {"role": "shop", "audience": "vault",
                                                  "mountPath": "kubernetes"}}}}),
    )
}

/// A GeneratorState as the agent records it: finalizer, labels, the generator as it was.
fn generator_state(
    namespace: &str,
    name: &str,
    service_account: &str,
    resource: Value,
    recorded: Option<Value>,
) -> Value {
    let kind = resource["kind"].as_str().unwrap().to_string();
    let mut spec = json!({"resource": resource});
    if let Some(recorded) = recorded {
        spec["state"] = recorded;
    }
    json!({"apiVersion": GROUP, "kind": "GeneratorState",
        "metadata": {"name": name, "namespace": namespace, "finalizers": [FINALIZER],
            "labels": {
                "generators.latchkey.dev/generator": format!("{kind}.gen"),
                "generators.latchkey.dev/pod": "web-0",
                "generators.latchkey.dev/service-account": service_account,
                "generators.latchkey.dev/node": "node-a"}},
        "spec": spec})
}

fn state(s: &FakeApiServer, namespace: &str, name: &str) -> Option<Value> {
    s.get(GROUP, "GeneratorState", Some(namespace), name)
}

/// Waits until `done` holds, at most `limit`; returns how long it took.
async fn until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "not in {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

async fn start_controller(s: &FakeApiServer) -> ControllerProcess {
    let timeout = humantime::format_duration(TIMEOUT).to_string();
    ControllerProcess::start(
        &s.kubeconfig_yaml(CONTROLLER_TOKEN),
        "gc-a",
        &["--generator-cleanup-timeout", &timeout],
    )
    .await
}

/// What the controller logged must hold no minted token (all are JWTs: `eyJ...`).
fn assert_no_token_logged(c: &ControllerProcess) {
    let log = c.log_text();
    assert!(!log.contains("eyJ"), "a token reached the log:\n{log}");
}

#[tokio::test]
async fn a_state_with_only_the_intent_is_released_at_once() {
    let s = cluster(&["shop"]).await;
    s.apply(service_account("shop", "web", true));
    s.apply(generator_state("shop", "intent", "web", password(), None));
    let c = start_controller(&s).await;

    let marked = s
        .delete(GROUP, "GeneratorState", Some("shop"), "intent")
        .unwrap();
    assert!(marked["metadata"]["deletionTimestamp"].is_string());
    let took = until(
        Duration::from_secs(10),
        "intent-only state released",
        || state(&s, "shop", "intent").is_none(),
    )
    .await;
    assert!(
        took < TIMEOUT,
        "released at once, not at the timeout: {took:?}"
    );
    let series = "latchkey_generator_cleanups_total{kind=\"Password\",result=\"no_state\"}";
    assert_eq!(c.metric(series).await, 1.0);
    assert!(
        s.token_requests().is_empty(),
        "nothing to clean: no token minted"
    );
    assert_no_token_logged(&c);
}

/// Cleanup runs as the state's own service account: its token is minted (for exactly the
/// generator's audiences), Cleanup is called, the finalizer released.
#[tokio::test]
async fn a_recorded_password_is_cleaned_up_and_released() {
    let s = cluster(&["shop"]).await;
    s.apply(service_account("shop", "web", true));
    s.apply(generator_state(
        "shop",
        "pw",
        "web",
        password(),
        Some(json!({})),
    ));
    let c = start_controller(&s).await;
    s.delete(GROUP, "GeneratorState", Some("shop"), "pw");
    until(Duration::from_secs(10), "password state released", || {
        state(&s, "shop", "pw").is_none()
    })
    .await;
    let series = "latchkey_generator_cleanups_total{kind=\"Password\",result=\"cleaned\"}";
    assert_eq!(c.metric(series).await, 1.0, "{}", c.log_text());
    assert_eq!(
        c.metric("latchkey_generator_left_to_ttl_total{kind=\"Password\"}")
            .await,
        0.0
    );
    assert_no_token_logged(&c);
}

/// Never wedge a deletion: a service account that is gone, one that did not opt in, and a
/// backend that cannot be reached each end with the finalizer released within the timeout,
/// the credential counted as left to its TTL and one warning naming it.
#[tokio::test]
async fn failing_cleanups_release_the_finalizer_within_the_timeout() {
    let s = cluster(&["shop"]).await;
    s.apply(service_account("shop", "web", true));
    s.apply(service_account("shop", "shy", false));
    let lease = || Some(json!({"leaseId": "pki/issue/example-dot-com/abc", "serial": "01"}));
    let cases = [
        ("sa-gone", "deleted-sa"),
        ("not-opted-in", "shy"),
        ("backend-down", "web"),
    ];
    for (name, sa) in cases {
        s.apply(generator_state(
            "shop",
            name,
            sa,
            unreachable_vault(),
            lease(),
        ));
    }
    let c = start_controller(&s).await;
    s.clear_requests();
    let started = Instant::now();
    for (name, _) in cases {
        s.delete(GROUP, "GeneratorState", Some("shop"), name);
    }
    until(TIMEOUT + Duration::from_secs(10), "all released", || {
        cases
            .iter()
            .all(|(name, _)| state(&s, "shop", name).is_none())
    })
    .await;
    // deletionTimestamp has one-second resolution: the earliest release is a second early.
    assert!(
        started.elapsed() >= TIMEOUT - Duration::from_secs(1),
        "identity failures are retried until the timeout, not given up at once: {:?}",
        started.elapsed()
    );
    // Counted as each finalizer is released: the last count may land just after its state went.
    let left_series = "latchkey_generator_left_to_ttl_total{kind=\"VaultDynamicSecret\"}";
    let counted = Instant::now();
    while c.metric(left_series).await < 3.0 && counted.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(c.metric(left_series).await, 3.0);
    let retried =
        "latchkey_generator_cleanups_total{kind=\"VaultDynamicSecret\",result=\"retried\"}";
    assert!(c.metric(retried).await >= 2.0);
    let log = c.log_text();
    for (name, _) in cases {
        let warned = log
            .lines()
            .filter(|l| l.contains("left to its TTL") && l.contains(name))
            .count();
        assert_eq!(warned, 1, "one warning for {name}:\n{log}");
    }
    assert!(
        log.contains("VaultDynamicSecret.gen"),
        "names the generator"
    );

    // The service account that did not opt in was never acted as, and the controller read no
    // credential with its own rights meanwhile.
    assert!(
        s.token_requests()
            .iter()
            .all(|t| t.service_account == "web"),
        "{:?}",
        s.token_requests()
    );
    // (The mirror's metadata-only watch of its own Secrets is not a read of one.)
    let own_reads: Vec<_> = s
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/secrets/"))
        .collect();
    assert!(own_reads.is_empty(), "{own_reads:?}");
    assert_no_token_logged(&c);
}

/// A namespace deleted with live states (its service account goes with it, so cleanup cannot
/// authenticate) is gone within the timeout instead of hanging in Terminating.
#[tokio::test]
async fn deleting_a_namespace_with_live_states_does_not_hang() {
    let s = cluster(&["doomed"]).await;
    s.apply(service_account("doomed", "web", true));
    for i in 0..3 {
        s.apply(generator_state(
            "doomed",
            &format!("state-{i}"),
            "web",
            unreachable_vault(),
            Some(json!({"leaseId": format!("lease-{i}")})),
        ));
    }
    let c = start_controller(&s).await;
    let ns = s.delete("v1", "Namespace", None, "doomed").unwrap();
    assert_eq!(ns["status"]["phase"], "Terminating");
    assert!(
        s.get("v1", "ServiceAccount", Some("doomed"), "web")
            .is_none()
    );
    until(TIMEOUT + Duration::from_secs(10), "namespace gone", || {
        s.get("v1", "Namespace", None, "doomed").is_none()
    })
    .await;
    assert!(s.objects(GROUP, "GeneratorState").is_empty());
    let left = c
        .metric("latchkey_generator_left_to_ttl_total{kind=\"VaultDynamicSecret\"}")
        .await;
    assert_eq!(left, 3.0);
    assert_no_token_logged(&c);
}

/// A state past its `garbageCollectionDeadline` is deleted (then released through the
/// finalizer); one before it is left alone until then, without polling the list.
#[tokio::test]
async fn states_past_their_deadline_are_collected_at_the_deadline() {
    let s = cluster(&["shop"]).await;
    s.apply(service_account("shop", "web", true));
    let in_2s = k8s_openapi::jiff::Timestamp::now() + Duration::from_secs(2);
    let mut later = generator_state("shop", "later", "web", password(), None);
    later["spec"]["garbageCollectionDeadline"] = json!(in_2s.to_string());
    s.apply(later);
    let mut past = generator_state("shop", "past", "web", password(), None);
    past["spec"]["garbageCollectionDeadline"] = json!("2020-01-01T00:00:00Z");
    s.apply(past);
    let mut never = generator_state("shop", "never", "web", password(), None);
    never["spec"]["garbageCollectionDeadline"] = json!("not a time");
    s.apply(never);
    let c = start_controller(&s).await;

    until(Duration::from_secs(5), "past state collected", || {
        state(&s, "shop", "past").is_none()
    })
    .await;
    assert!(
        state(&s, "shop", "later").is_some(),
        "not before its deadline"
    );
    until(Duration::from_secs(8), "later state collected", || {
        state(&s, "shop", "later").is_none()
    })
    .await;
    assert!(
        in_2s <= k8s_openapi::jiff::Timestamp::now(),
        "collected at its deadline, not before"
    );
    assert!(state(&s, "shop", "never").is_some());
    assert_eq!(
        c.metric("latchkey_generator_states_collected_total").await,
        2.0
    );
    let lists = s
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/generatorstates") && r.method == "GET" && !r.is_watch())
        .count();
    assert!(lists <= 2, "GeneratorStates listed {lists} times: polled");
}

/// Without access to GeneratorStates (RBAC or CRD not installed yet) the collector's watch
/// never lists: the controller still serves and stops promptly on SIGTERM.
// Multi-threaded: the fake API server must answer the controller's last calls while this
// thread waits for it to exit.
#[tokio::test(flavor = "multi_thread")]
async fn a_controller_that_cannot_watch_states_still_stops_promptly() {
    let s = cluster_with(&["shop"], false).await;
    let mut c = start_controller(&s).await;
    until(
        Duration::from_secs(10),
        "the collector tried to list",
        || {
            s.requests()
                .iter()
                .any(|r| r.path.ends_with("/generatorstates"))
        },
    )
    .await;
    let asked = Instant::now();
    let status = c.stop();
    assert!(status.success(), "{status}\n{}", c.log_text());
    assert!(
        asked.elapsed() < Duration::from_secs(8),
        "stopped in {:?}",
        asked.elapsed()
    );
}

/// The fake API server handles finalizers and namespace termination as the real one does.
#[tokio::test]
async fn the_fake_api_server_honours_finalizers() {
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
    let s = cluster(&["shop", "gone"]).await;
    let admin = s.client(ADMIN_TOKEN).await;
    let api: Api<kube::core::DynamicObject> = Api::namespaced_with(
        admin.clone(),
        "shop",
        &kube::core::ApiResource {
            group: "generators.latchkey.dev".into(),
            version: "v1alpha1".into(),
            api_version: GROUP.into(),
            kind: "GeneratorState".into(),
            plural: "generatorstates".into(),
        },
    );
    let object: kube::core::DynamicObject =
        serde_json::from_value(generator_state("shop", "held", "web", password(), None)).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();

    // Delete: only marked, twice the same.
    let first = api.delete("held", &DeleteParams::default()).await.unwrap();
    let marked = first.left().expect("still there, marked");
    let stamp = marked.metadata.deletion_timestamp.clone().unwrap();
    let again = api.delete("held", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        again.left().unwrap().metadata.deletion_timestamp,
        Some(stamp)
    );

    // No new finalizer; the deletion fields cannot be cleared by a write.
    let add = json!({"metadata": {"finalizers": [FINALIZER, "example.com/other"]}});
    let refused = api
        .patch("held", &PatchParams::default(), &Patch::Merge(&add))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(e) if e.code == 422
            && e.message.contains("no new finalizers can be added")),
        "{refused:?}"
    );
    let clear = json!({"metadata": {"deletionTimestamp": null}});
    let kept = api
        .patch("held", &PatchParams::default(), &Patch::Merge(&clear))
        .await
        .unwrap();
    assert!(kept.metadata.deletion_timestamp.is_some());

    // Removing the last finalizer deletes it.
    let release = json!({"metadata": {"finalizers": []}});
    api.patch("held", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
    assert!(state(&s, "shop", "held").is_none());

    // A terminating namespace refuses new content and goes once its last finalizer does.
    s.apply(generator_state("gone", "held", "web", password(), None));
    s.delete("v1", "Namespace", None, "gone");
    let ns = s.get("v1", "Namespace", None, "gone").unwrap();
    assert_eq!(ns["status"]["phase"], "Terminating");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(admin, "gone");
    let refused = secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "late"}})).unwrap(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(e) if e.code == 403
            && e.message.contains("because it is being terminated")),
        "{refused:?}"
    );
    let held = state(&s, "gone", "held").unwrap();
    assert!(held["metadata"]["deletionTimestamp"].is_string());
    s.apply(json!({"apiVersion": GROUP, "kind": "GeneratorState",
        "metadata": {"name": "held", "namespace": "gone", "finalizers": []},
        "spec": held["spec"].clone()}));
    assert!(s.get("v1", "Namespace", None, "gone").is_none());
}

/// What the pods' Vault role may do with the PKI engine: issue, and revoke what it made.
const PKI_POLICY: &str = r#"
path "pki/issue/example-dot-com" { capabilities = ["create", "update"] }
path "sys/leases/revoke" { capabilities = ["update"] }
"#;

/// OpenBao with a PKI role and kubernetes auth (role `shop`, bound to `shop/web`, audience
/// `vault`), checking tokens with the fake API server's TokenReview.
async fn openbao_for(s: &FakeApiServer) -> OpenBao {
    let bao = OpenBao::start().await;
    bao.pki("pki", "example-dot-com", "72h").await;
    bao.policy("gen", PKI_POLICY).await;
    let reviewer = s.token_reviewer();
    bao.kubernetes(
        &s.url(),
        &reviewer,
        "shop",
        ("shop", "web"),
        "vault",
        &["gen"],
    )
    .await;
    bao
}

/// Real OpenBao: a PKI certificate made for a pod whose node is gone is revoked by the
/// controller, logged in through kubernetes auth as the pod's own service account (a token it
/// minted for the `vault` audience only). A state a tenant re-labelled to a service account
/// that did not opt in is never revoked by anyone: its lease is left to its TTL.
#[tokio::test(flavor = "multi_thread")]
async fn a_real_lease_is_revoked_as_the_state_s_own_service_account() {
    let s = cluster(&["shop"]).await;
    let bao = openbao_for(&s).await;
    s.apply(service_account("shop", "web", true));
    s.apply(service_account("shop", "shy", false));

    let generator = resource(
        "VaultDynamicSecret",
        json!({"path": "pki/issue/example-dot-com", "method": "POST",
            "parameters": {"common_name": "localhost"},
            "provider": {"server": bao.url,
                         "auth": {"kubernetes": {"mountPath": "kubernetes", "role": "shop",
                                                  "audience": "vault"}}}}),
    );
    // Two certificates as the agent on a node now gone made them.
    let mut leases = Vec::new();
    for (name, sa) in [("made-for-web", "web"), ("relabelled", "shy")] {
        let issued = bao
            .api(
                "POST",
                "pki/issue/example-dot-com",
                Some(json!({"common_name": "localhost", "ttl": "1h"})),
            )
            .await;
        let lease_id = issued["lease_id"].as_str().unwrap().to_string();
        let serial = issued["data"]["serial_number"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(bao.lease_exists(&lease_id).await);
        let recorded = json!({"leaseId": lease_id, "path": "pki/issue/example-dot-com",
                              "serial": serial, "ttl": 3600});
        s.apply(generator_state(
            "shop",
            name,
            sa,
            generator.clone(),
            Some(recorded),
        ));
        leases.push((lease_id, serial));
    }
    let c = start_controller(&s).await;
    for name in ["made-for-web", "relabelled"] {
        s.delete(GROUP, "GeneratorState", Some("shop"), name);
    }
    until(TIMEOUT + Duration::from_secs(15), "both released", || {
        state(&s, "shop", "made-for-web").is_none() && state(&s, "shop", "relabelled").is_none()
    })
    .await;

    let (revoked, revoked_serial) = &leases[0];
    assert!(!bao.lease_exists(revoked).await, "{}", c.log_text());
    assert!(
        bao.revoked_serials("pki")
            .await
            .iter()
            .any(|s| s == revoked_serial)
    );
    let (kept, kept_serial) = &leases[1];
    assert!(
        bao.lease_exists(kept).await,
        "never revoked without its service account's opt-in"
    );
    assert!(
        !bao.revoked_serials("pki")
            .await
            .iter()
            .any(|s| s == kept_serial)
    );
    let cleaned =
        "latchkey_generator_cleanups_total{kind=\"VaultDynamicSecret\",result=\"cleaned\"}";
    assert_eq!(c.metric(cleaned).await, 1.0);
    let left = "latchkey_generator_left_to_ttl_total{kind=\"VaultDynamicSecret\"}";
    assert_eq!(c.metric(left).await, 1.0);
    for minted in s.token_requests() {
        assert_eq!(
            (minted.service_account.as_str(), minted.audiences.as_slice()),
            ("web", ["vault".to_string()].as_slice()),
            "only the opted-in account, only the generator's audience"
        );
    }
    assert!(!s.token_requests().is_empty());
    assert_no_token_logged(&c);
}

/// A cluster for the mirror tests: OpenBao as [`openbao_for`], the opted-in service account
/// `shop/web`, and a VaultDynamicSecret `shop/cert` issuing 30-minute certificates as it.
async fn mirror_cluster() -> (FakeApiServer, OpenBao) {
    let s = cluster(&["shop"]).await;
    let bao = openbao_for(&s).await;
    s.apply(service_account("shop", "web", true));
    s.apply(json!({"apiVersion": GROUP, "kind": "VaultDynamicSecret",
        "metadata": {"name": "cert", "namespace": "shop"},
        "spec": {"path": "pki/issue/example-dot-com", "method": "POST",
            "parameters": {"common_name": "localhost", "ttl": "30m"},
            "provider": {"server": bao.url,
                "auth": {"kubernetes": {"mountPath": "kubernetes", "role": "shop",
                                         "audience": "vault"}}}}}));
    (s, bao)
}

/// The controller with the short cleanup timeout of these tests and a 1 s grace period.
async fn start_mirroring_controller(s: &FakeApiServer) -> ControllerProcess {
    let timeout = humantime::format_duration(TIMEOUT).to_string();
    ControllerProcess::start(
        &s.kubeconfig_yaml(CONTROLLER_TOKEN),
        "gc-a",
        &[
            "--generator-cleanup-timeout",
            &timeout,
            "--generator-grace-period",
            "1s",
        ],
    )
    .await
}

/// The serial of the certificate in the mirrored Secret `shop/tls`, once there is one.
fn mirrored_serial(s: &FakeApiServer) -> Option<String> {
    use base64::Engine as _;
    let secret = s.get("v1", "Secret", Some("shop"), "tls")?;
    let encoded = secret["data"]["serial_number"].as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    String::from_utf8(bytes).ok()
}

/// ESO design 011 in the mirror, against real OpenBao: every sync that writes the Secret issues a
/// new certificate as the ExternalSecret's service account and records its state; the earlier
/// state gets a deadline one grace period away, after which it is collected and its certificate
/// revoked. Deleting the ExternalSecret (deletionPolicy Delete) revokes the last one too.
#[tokio::test(flavor = "multi_thread")]
async fn a_mirrored_secret_gets_new_credentials_each_sync_and_the_old_ones_are_revoked() {
    let (s, bao) = mirror_cluster().await;
    s.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
        "metadata": {"name": "tls", "namespace": "shop"},
        "spec": {"serviceAccountName": "web", "refreshInterval": "2s",
            "target": {"name": "tls", "creationPolicy": "Owner", "deletionPolicy": "Delete"},
            "dataFrom": [{"sourceRef": {"generatorRef": {"apiVersion": GROUP,
                "kind": "VaultDynamicSecret", "name": "cert"}}}]}}),
    );
    let c = start_mirroring_controller(&s).await;
    let limit = Duration::from_secs(30);
    until(limit, "the Secret holds a certificate", || {
        mirrored_serial(&s).is_some()
    })
    .await;
    let first = mirrored_serial(&s).unwrap();
    until(limit, "a later sync writes a new certificate", || {
        mirrored_serial(&s).is_some_and(|now| now != first)
    })
    .await;
    let start = Instant::now();
    while !is_revoked(&bao, &first).await {
        assert!(
            start.elapsed() < limit,
            "the first certificate was never revoked:\n{}",
            c.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for st in s.objects(GROUP, "GeneratorState") {
        let text = st.to_string();
        assert!(
            !text.contains("PRIVATE KEY"),
            "a GeneratorState holds a key"
        );
        assert_eq!(
            st["metadata"]["labels"]["generators.latchkey.dev/external-secret"],
            "tls"
        );
        assert_eq!(
            st["metadata"]["ownerReferences"][0]["kind"],
            "ExternalSecret"
        );
    }

    // Deleting the ExternalSecret: its states go with it, and their certificates are revoked.
    s.delete(
        "latchkey.dev/v1alpha1",
        "ExternalSecret",
        Some("shop"),
        "tls",
    );
    until(limit, "the ExternalSecret is gone", || {
        s.get(
            "latchkey.dev/v1alpha1",
            "ExternalSecret",
            Some("shop"),
            "tls",
        )
        .is_none()
    })
    .await;
    let start = Instant::now();
    loop {
        s.collect_garbage();
        let left = s.objects(GROUP, "GeneratorState");
        let (code, leases) = bao
            .request("LIST", "sys/leases/lookup/pki/issue/example-dot-com/", None)
            .await;
        let live = if code == 404 {
            0
        } else {
            leases["data"]["keys"].as_array().map_or(0, Vec::len)
        };
        if left.is_empty() && live == 0 {
            break;
        }
        assert!(
            start.elapsed() < limit,
            "{} states and {live} leases left:\n{}",
            left.len(),
            c.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_no_token_logged(&c);
}

/// Whether OpenBao lists `serial` as revoked.
async fn is_revoked(bao: &OpenBao, serial: &str) -> bool {
    bao.revoked_serials("pki")
        .await
        .iter()
        .any(|r| r.eq_ignore_ascii_case(serial))
}

/// Switching a mirrored ExternalSecret from a generator to a store retires the generated
/// certificate; switching back makes a new one, which later syncs and collections never revoke.
#[tokio::test(flavor = "multi_thread")]
async fn switching_a_generator_to_a_store_and_back_never_revokes_the_newer_credential() {
    let (s, bao) = mirror_cluster().await;
    s.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "SecretStore",
        "metadata": {"name": "fake", "namespace": "shop"},
        "spec": {"provider": {"fake": {"data": [{"key": "serial", "value": "from-a-store"}]}}}}),
    );
    let es = |from_generator: bool| {
        let data = if from_generator {
            json!({"dataFrom": [{"sourceRef": {"generatorRef": {"apiVersion": GROUP,
                "kind": "VaultDynamicSecret", "name": "cert"}}}]})
        } else {
            json!({"data": [{"secretKey": "serial_number", "remoteRef": {"key": "serial"}}]})
        };
        let mut spec = json!({"serviceAccountName": "web", "refreshInterval": "1h",
            "secretStoreRef": {"name": "fake"},
            "target": {"name": "tls", "creationPolicy": "Owner", "deletionPolicy": "Delete"}});
        spec.as_object_mut()
            .unwrap()
            .extend(data.as_object().unwrap().clone());
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
            "metadata": {"name": "tls", "namespace": "shop"}, "spec": spec})
    };
    s.apply(es(true));
    let c = start_mirroring_controller(&s).await;
    let limit = Duration::from_secs(30);
    until(limit, "the Secret holds a certificate", || {
        mirrored_serial(&s).is_some()
    })
    .await;
    let first = mirrored_serial(&s).unwrap();

    // To the store: the generated certificate retires.
    s.apply(es(false));
    until(limit, "the Secret holds the store's value", || {
        mirrored_serial(&s).as_deref() == Some("from-a-store")
    })
    .await;
    let start = Instant::now();
    while !is_revoked(&bao, &first).await {
        assert!(start.elapsed() < limit, "never revoked:\n{}", c.log_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // And back: a new certificate, which stays valid.
    s.apply(es(true));
    until(limit, "the Secret holds a new certificate", || {
        mirrored_serial(&s).is_some_and(|now| now != "from-a-store" && now != first)
    })
    .await;
    let second = mirrored_serial(&s).unwrap();
    // Several grace periods and collections later, the newer one is still valid.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!is_revoked(&bao, &second).await, "{}", c.log_text());
    assert_eq!(mirrored_serial(&s).as_deref(), Some(second.as_str()));
    let live: Vec<Value> = s
        .objects(GROUP, "GeneratorState")
        .into_iter()
        .filter(|st| st["metadata"]["deletionTimestamp"].is_null())
        .collect();
    assert_eq!(
        live.len(),
        1,
        "only the newer credential's state is left: {live:#?}"
    );
    assert!(live[0]["spec"]["garbageCollectionDeadline"].is_null());
}
