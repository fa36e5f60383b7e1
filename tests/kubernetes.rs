//! End to end in "cluster mode": the real `latchkey node` reads the fake API server through a
//! kubeconfig (watch-backed catalog), the `kubernetes` provider reads Secrets with the POD's token
//! (never the agent's), tenancy uses Namespace labels from the API, and failures become Events.

mod support;

use std::time::{Duration, Instant};

use csi_proto::v1::NodePublishVolumeRequest;
use latchkey::csi::client::{PodVolume, unpublish_request, volume_id_for};
use serde_json::json;
use support::Agent;
use support::apiserver::{FakeApiServer, Identity};
use support::store_forms::Form;
use tonic::Code;

const AGENT_TOKEN: &str = "agent-token-e2e";
const WEB_TOKEN: &str = "eyJ.web-pod-token-e2e.sig";
const INTRUDER_TOKEN: &str = "eyJ.intruder-pod-token-e2e.sig";
const PASSWORD: &str = "hunter2-k8s-provider-e2e";

/// A cluster with namespaces `shop` (team a) and `other` (team b), the agent's permissions from
/// daemonset/base/rbac.yaml, and one pod service account (`shop/web`) allowed to read its Secret.
async fn cluster() -> FakeApiServer {
    cluster_as(Form::Inline).await
}

/// [`cluster`] with the stores in `form`.
async fn cluster_as(form: Form) -> FakeApiServer {
    let s = FakeApiServer::start().await;
    form.prepare(&s);
    s.add_identity(AGENT_TOKEN, Identity::Agent);
    s.add_identity(WEB_TOKEN, Identity::service_account("shop", "web"));
    s.add_identity(
        INTRUDER_TOKEN,
        Identity::service_account("shop", "intruder"),
    );
    for verb in ["get", "list", "watch"] {
        for resource in ["externalsecrets", "secretstores", "clustersecretstores"] {
            s.allow(Identity::Agent, verb, "latchkey.dev", resource, None);
        }
        s.allow(Identity::Agent, verb, "", "namespaces", None);
    }
    s.allow(Identity::Agent, "create", "", "events", None);
    s.allow(Identity::Agent, "patch", "", "events", None);
    s.allow(
        Identity::service_account("shop", "web"),
        "get",
        "",
        "secrets",
        Some("shop"),
    );

    for (ns, team) in [("shop", "a"), ("other", "b"), ("latchkey", "system")] {
        s.apply(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"team": team}}}));
    }
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "app-credentials", "namespace": "shop"},
        "stringData": {"password": PASSWORD, "user": "shop"}}));
    for store in form.objects([
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "SecretStore",
        "metadata": {"name": "same-namespace", "namespace": "shop"},
        "spec": {"provider": {"kubernetes": {}}}}),
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ClusterSecretStore",
        "metadata": {"name": "team-a-only"},
        "spec": {"provider": {"fake": {"data": [{"key": "k", "value": "v"}]}},
                 "conditions": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]}}),
    ]) {
        s.apply(store);
    }
    for ns in ["shop", "other"] {
        s.apply(
            json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
            "metadata": {"name": "web-config", "namespace": ns},
            "spec": {"secretStoreRef": {"name": "same-namespace"},
                     "data": [{"secretKey": "db-password",
                               "remoteRef": {"key": "app-credentials", "property": "password"}}]}}),
        );
        s.apply(
            json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
            "metadata": {"name": "team-a", "namespace": ns},
            "spec": {"secretStoreRef": {"name": "team-a-only", "kind": "ClusterSecretStore"},
                     "data": [{"secretKey": "k", "remoteRef": {"key": "k"}}]}}),
        );
    }
    s
}

async fn agent(server: &FakeApiServer) -> Agent {
    let agent = Agent::start_in_cluster(&server.kubeconfig_yaml(AGENT_TOKEN), &[]).await;
    // Ready only once every reflector has listed.
    let deadline = Instant::now() + Duration::from_secs(20);
    while agent.http_get("/readyz").await.0 != 200 {
        assert!(
            Instant::now() < deadline,
            "catalog never synced:\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    agent
}

fn request(
    agent: &Agent,
    ns: &str,
    pod: &str,
    sa: &str,
    token: Option<&str>,
    es: &str,
) -> NodePublishVolumeRequest {
    let target = agent.target(pod);
    let mut p = PodVolume::new(ns, pod, es);
    p.service_account = sa.into();
    p.tokens_json = token.map(|t| format!(r#"{{"":{{"token":"{t}"}}}}"#));
    p.publish_request(&volume_id_for(&target), &target)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_provider_reads_the_secret_as_the_pod() {
    kubernetes_provider_reads_the_secret_as_the_pod_as(Form::Inline).await;
}

/// The same with the store naming a provider object (issue #41).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_provider_reads_the_secret_as_the_pod_by_provider_ref() {
    kubernetes_provider_reads_the_secret_as_the_pod_as(Form::ByReference).await;
}

async fn kubernetes_provider_reads_the_secret_as_the_pod_as(form: Form) {
    let server = cluster_as(form).await;
    let agent = agent(&server).await;
    form.watched(&server).await;
    let mut node = agent.node().await;
    let req = request(
        &agent,
        "shop",
        "web-0",
        "web",
        Some(WEB_TOKEN),
        "web-config",
    );
    server.clear_requests();
    node.node_publish_volume(req.clone()).await.unwrap();
    // The ExternalSecret and its store came from the watch caches: no round trip as the agent.
    let agent_calls: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.identity == Some(Identity::Agent) && !r.is_watch())
        .map(|r| r.path)
        .collect();
    assert!(
        agent_calls.is_empty(),
        "publish cost API calls: {agent_calls:?}"
    );
    let target = agent.target("web-0");
    assert_eq!(
        std::fs::read_to_string(target.join("db-password")).unwrap(),
        PASSWORD
    );

    // The Secret was read with the pod's identity; the agent never asked for it.
    let reads: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/api/v1/") && r.path.contains("/secrets"))
        .collect();
    assert!(!reads.is_empty());
    for r in &reads {
        assert_eq!(
            r.identity,
            Some(Identity::service_account("shop", "web")),
            "{}",
            r.path
        );
    }
    node.node_unpublish_volume(unpublish_request(&req.volume_id, &target))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_without_rbac_is_denied_and_the_pod_gets_an_event() {
    let server = cluster().await;
    let agent = agent(&server).await;
    let mut node = agent.node().await;
    let req = request(
        &agent,
        "shop",
        "intruder-0",
        "intruder",
        Some(INTRUDER_TOKEN),
        "web-config",
    );
    let err = node.node_publish_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    for want in [
        "namespace \"shop\"",
        "ExternalSecret \"web-config\"",
        "remote key \"app-credentials\"",
        "system:serviceaccount:shop:intruder",
        "cannot get resource \"secrets\"",
    ] {
        assert!(
            err.message().contains(want),
            "{:?} lacks {want:?}",
            err.message()
        );
    }
    assert!(!agent.target("intruder-0").exists());

    // The failure reaches `kubectl describe pod` as a Warning Event.
    let deadline = Instant::now() + Duration::from_secs(10);
    let event = loop {
        let found = server
            .events()
            .into_iter()
            .find(|e| e["reason"] == "MountFailed");
        if let Some(e) = found {
            break e;
        }
        assert!(
            Instant::now() < deadline,
            "no MountFailed event:\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["involvedObject"]["kind"], "Pod");
    assert_eq!(event["involvedObject"]["name"], "intruder-0");

    // kubelet retries the mount: the same Event object counts the attempts, as kubelet's own
    // FailedMount does, instead of a new object per attempt.
    for _ in 0..2 {
        let req = request(
            &agent,
            "shop",
            "intruder-0",
            "intruder",
            Some(INTRUDER_TOKEN),
            "web-config",
        );
        node.node_publish_volume(req).await.unwrap_err();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mount_failed: Vec<_> = server
            .events()
            .into_iter()
            .filter(|e| e["reason"] == "MountFailed" && e["involvedObject"]["name"] == "intruder-0")
            .collect();
        assert_eq!(
            mount_failed.len(),
            1,
            "one object per reason: {mount_failed:#?}"
        );
        if mount_failed[0]["count"] == 3 {
            assert_eq!(
                mount_failed[0]["metadata"]["name"],
                event["metadata"]["name"]
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "count never reached 3: {mount_failed:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(event["metadata"]["namespace"], "shop");
    let text = event.to_string();
    for secret in [PASSWORD, INTRUDER_TOKEN, WEB_TOKEN, AGENT_TOKEN] {
        assert!(!text.contains(secret), "event leaks a secret");
        assert!(!agent.log_text().contains(secret), "log leaks a secret");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_token_and_namespace_selector_refusals_are_precise() {
    let server = cluster().await;
    let agent = agent(&server).await;
    let mut node = agent.node().await;

    let err = node
        .node_publish_volume(request(
            &agent,
            "shop",
            "no-token",
            "web",
            None,
            "web-config",
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("tokenRequests"), "{}", err.message());

    // Namespace labels come from the API: `shop` (team a) is admitted, `other` is not.
    node.node_publish_volume(request(&agent, "shop", "a-0", "web", None, "team-a"))
        .await
        .unwrap();
    let err = node
        .node_publish_volume(request(&agent, "other", "b-0", "web", None, "team-a"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("namespaceSelector does not match"),
        "{}",
        err.message()
    );

    // A ref that leaves out `kind: ClusterSecretStore` (ESO users moving a store) is told so.
    server.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
        "metadata": {"name": "kindless", "namespace": "shop"},
        "spec": {"secretStoreRef": {"name": "team-a-only"},
                 "data": [{"secretKey": "k", "remoteRef": {"key": "k"}}]}}),
    );
    let err = node
        .node_publish_volume(request(&agent, "shop", "k-0", "web", None, "kindless"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().ends_with(
            "SecretStore \"team-a-only\" not found in this namespace; a ClusterSecretStore \
             named \"team-a-only\" exists: set secretStoreRef.kind: ClusterSecretStore"
        ),
        "{}",
        err.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_created_and_changed_after_start_are_used() {
    let server = cluster().await;
    let agent = agent(&server).await;
    let mut node = agent.node().await;
    server.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
        "metadata": {"name": "late", "namespace": "shop"},
        "spec": {"secretStoreRef": {"name": "same-namespace"}, "refreshInterval": "200ms",
                 "data": [{"secretKey": "user",
                           "remoteRef": {"key": "app-credentials", "property": "user"}}]}}),
    );
    let req = request(&agent, "shop", "late-0", "web", Some(WEB_TOKEN), "late");
    node.node_publish_volume(req.clone()).await.unwrap();
    let file = agent.target("late-0").join("user");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "shop");

    // A changed Secret reaches the mounted volume on the first republish after the refresh
    // interval; earlier republishes answer from the schedule and read nothing.
    server.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "app-credentials", "namespace": "shop"},
        "stringData": {"password": PASSWORD, "user": "shop-v2"}}));
    server.clear_requests();
    node.node_publish_volume(req.clone()).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "shop",
        "not due yet"
    );
    let reads = server
        .requests()
        .into_iter()
        .filter(|r| !r.is_watch())
        .count();
    assert_eq!(reads, 0, "a republish before due reads nothing");
    tokio::time::sleep(Duration::from_millis(250)).await;
    node.node_publish_volume(req).await.unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "shop-v2");

    // The Secret disappears: the next due refresh fails, the volume keeps its files, kubelet
    // gets success (it would unmount otherwise), and the pod gets a RefreshFailed event.
    server.delete("v1", "Secret", Some("shop"), "app-credentials");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let req = request(&agent, "shop", "late-0", "web", Some(WEB_TOKEN), "late");
    node.node_publish_volume(req).await.unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "shop-v2");
    let deadline = Instant::now() + Duration::from_secs(10);
    let event = loop {
        if let Some(e) = server
            .events()
            .into_iter()
            .find(|e| e["reason"] == "RefreshFailed")
        {
            break e;
        }
        assert!(
            Instant::now() < deadline,
            "no RefreshFailed event:\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(event["involvedObject"]["name"], "late-0");
    let message = event["message"].as_str().unwrap();
    assert!(
        message.contains("remote key \"app-credentials\""),
        "{message}"
    );
    assert!(message.contains("keeps its previous content"), "{message}");
    assert!(!message.contains(PASSWORD));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_lists_as_the_pod_and_a_token_of_another_namespace_is_refused() {
    let server = cluster().await;
    server.allow(
        Identity::service_account("shop", "web"),
        "list",
        "",
        "secrets",
        Some("shop"),
    );
    server.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
        "metadata": {"name": "all-app", "namespace": "shop"},
        "spec": {"secretStoreRef": {"name": "same-namespace"},
                 "dataFrom": [{"find": {"name": {"regexp": "^app-"}}}]}}),
    );
    let stranger = "eyJ.billing-pod-token-e2e.sig";
    server.add_identity(stranger, Identity::service_account("billing", "web"));
    let agent = agent(&server).await;
    let mut node = agent.node().await;

    node.node_publish_volume(request(
        &agent,
        "shop",
        "find-0",
        "web",
        Some(WEB_TOKEN),
        "all-app",
    ))
    .await
    .unwrap();
    let json = std::fs::read_to_string(agent.target("find-0").join("app-credentials")).unwrap();
    assert!(json.contains(PASSWORD), "the whole Secret as JSON");

    // kubelet would never pair these, but the agent must not trust the pair either: the API
    // server judges the token, and a token of another namespace reads nothing here.
    let err = node
        .node_publish_volume(request(
            &agent,
            "shop",
            "mixed-0",
            "web",
            Some(stranger),
            "web-config",
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("system:serviceaccount:billing:web"),
        "{}",
        err.message()
    );
}

/// Objects this agent cannot read (as a CRD from another release could produce) are skipped:
/// the catalog still syncs, every other object keeps working, a pod naming a bad one gets
/// FAILED_PRECONDITION saying which field, and the metric and the log say so once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_that_does_not_deserialize_never_stalls_the_catalog() {
    let server = cluster().await;
    let broken = |key: serde_json::Value| {
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
        "metadata": {"name": "from-the-future", "namespace": "shop"},
        "spec": {"secretStoreRef": {"name": "same-namespace"},
                 "data": [{"secretKey": "db-password",
                           "remoteRef": {"key": key, "property": "password"}}]}})
    };
    server.apply(broken(
        json!({"path": "app-credentials", "hunter": "hunter2-in-a-spec"}),
    ));
    server.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "SecretStore",
        "metadata": {"name": "newer-provider", "namespace": "shop"},
        "spec": {"provider": {"fake": {"data": "a list in a newer release"}}}}),
    );
    let agent = agent(&server).await;
    let mut node = agent.node().await;

    // The good objects are served.
    let good = request(
        &agent,
        "shop",
        "web-0",
        "web",
        Some(WEB_TOKEN),
        "web-config",
    );
    node.node_publish_volume(good.clone()).await.unwrap();

    // The bad one is refused precisely, without quoting it.
    let req = request(
        &agent,
        "shop",
        "ftr-0",
        "web",
        Some(WEB_TOKEN),
        "from-the-future",
    );
    let status = node.node_publish_volume(req.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    let message = status.message();
    assert!(
        message.contains("ExternalSecret \"shop/from-the-future\" cannot be used")
            && message.contains("spec.data[0].remoteRef.key"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
    assert!(!agent.target("ftr-0").exists());

    let (_, metrics) = agent.http_get("/metrics").await;
    for (kind, count) in [
        ("ExternalSecret", 1),
        ("SecretStore", 1),
        ("ClusterSecretStore", 0),
    ] {
        let series = format!("latchkey_catalog_unusable_objects{{kind=\"{kind}\"}} {count}");
        assert!(metrics.contains(&series), "{series} in:\n{metrics}");
    }
    let logs = agent.log_text();
    let skipped = logs
        .lines()
        .filter(|l| l.contains("cannot read") && l.contains("object=shop/from-the-future"))
        .count();
    assert_eq!(skipped, 1, "logged once:\n{logs}");
    assert!(!logs.contains("hunter2"));

    // Fixed, it is used at once.
    server.apply(broken(json!("app-credentials")));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match node.node_publish_volume(req.clone()).await {
            Ok(_) => break,
            Err(status) => assert!(Instant::now() < deadline, "{status:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        std::fs::read_to_string(agent.target("ftr-0").join("db-password")).unwrap(),
        PASSWORD
    );
    let (_, metrics) = agent.http_get("/metrics").await;
    assert!(
        metrics.contains("latchkey_catalog_unusable_objects{kind=\"ExternalSecret\"} 0"),
        "{metrics}"
    );
    for (r, pod) in [(good, "web-0"), (req, "ftr-0")] {
        node.node_unpublish_volume(unpublish_request(&r.volume_id, &agent.target(pod)))
            .await
            .unwrap();
    }
}
