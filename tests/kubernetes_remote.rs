//! The `kubernetes` provider on another cluster (`server`) and another namespace
//! (`remoteNamespace`), end to end: the real `latchkey node` reads its objects from one fake API
//! server ("this cluster") and the pod's Secrets from a second one ("the remote cluster") behind
//! a real TLS front, with the pod's own token for the store's audience. Both servers judge the
//! tokens with their RBAC, so what a pod reads is what its identity may read there.

mod support;

use std::time::{Duration, Instant};

use base64::Engine as _;
use csi_proto::v1::NodePublishVolumeRequest;
use latchkey::csi::client::{PodVolume, volume_id_for};
use serde_json::json;
use support::Agent;
use support::apiserver::{FakeApiServer, Identity, Subject};
use support::hostile::{Answer, Hostile};
use support::pki::Pki;
use support::tls_front::TlsFront;
use tonic::Code;

const AGENT_TOKEN: &str = "agent-token-k8s-remote";
/// The pods' tokens for this cluster's API server (audience `""`).
const WEB_TOKEN: &str = "eyJ.web-local-token-k8s-remote.sig";
const INTRUDER_TOKEN: &str = "eyJ.intruder-local-token-k8s-remote.sig";
/// Their tokens for the remote cluster's audience, which trusts this cluster's issuer.
const WEB_REMOTE_TOKEN: &str = "eyJ.web-remote-token-k8s-remote.sig";
const INTRUDER_REMOTE_TOKEN: &str = "eyJ.intruder-remote-token-k8s-remote.sig";
const AUDIENCE: &str = "prod-cluster";

const REMOTE_PASSWORD: &str = "hunter2-remote-cluster";
const REMOTE_OTHER_PASSWORD: &str = "hunter2-remote-other-namespace";
const LOCAL_PASSWORD: &str = "hunter2-local-shared-namespace";

/// Both clusters, the TLS front of the remote one and the CA that signed its certificate.
struct Clusters {
    local: FakeApiServer,
    remote: FakeApiServer,
    front: TlsFront,
    pki: Pki,
}

fn secret(ns: &str, name: &str, password: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": ns},
        "stringData": {"password": password}})
}

fn store(name: &str, provider: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "SecretStore",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"provider": {"kubernetes": provider}}})
}

/// A store reading namespace `shared` of the remote cluster, trusting `ca`.
fn remote_store(name: &str, url: &str, ca: serde_json::Value) -> serde_json::Value {
    let mut server = json!({"url": url});
    server
        .as_object_mut()
        .unwrap()
        .extend(ca.as_object().unwrap().clone());
    store(
        name,
        json!({"audience": AUDIENCE, "remoteNamespace": "shared", "server": server}),
    )
}

async fn clusters() -> Clusters {
    let pki = Pki::new("remote cluster CA");
    let rogue = Pki::new("rogue CA");
    let (cert, key) = pki.issue(&["127.0.0.1"]);

    let remote = FakeApiServer::start().await;
    let front = TlsFront::start(remote.addr(), &cert, &key).await;
    // The remote cluster trusts this cluster's service-account issuer for its audience: it
    // knows the pods' tokens for that audience, and no other token of theirs.
    remote.add_identity(WEB_REMOTE_TOKEN, Identity::service_account("shop", "web"));
    remote.add_identity(
        INTRUDER_REMOTE_TOKEN,
        Identity::service_account("shop", "intruder"),
    );
    for ns in ["shared", "other"] {
        remote.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
        remote.allow(
            Identity::service_account("shop", "web"),
            "get",
            "",
            "secrets",
            Some(ns),
        );
    }
    remote.apply(secret("shared", "app-credentials", REMOTE_PASSWORD));
    remote.apply(secret("other", "app-credentials", REMOTE_OTHER_PASSWORD));

    let local = FakeApiServer::start().await;
    local.add_identity(AGENT_TOKEN, Identity::Agent);
    local.add_identity(WEB_TOKEN, Identity::service_account("shop", "web"));
    local.add_identity(
        INTRUDER_TOKEN,
        Identity::service_account("shop", "intruder"),
    );
    local.allow_defaults();
    // Both pods may read their own namespace's CA ConfigMap; only `web` the namespace `shared`.
    local.allow_in_own_namespace(Subject::AnyServiceAccount, "get", "", "configmaps");
    local.allow(
        Identity::service_account("shop", "web"),
        "get",
        "",
        "secrets",
        Some("shared"),
    );
    for ns in ["shop", "shared", "latchkey"] {
        local.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    local.apply(secret("shared", "app-credentials", LOCAL_PASSWORD));
    for (name, pem) in [("remote-ca", &pki.ca), ("rogue-ca", &rogue.ca)] {
        local.apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "shop"}, "data": {"ca.crt": pem}}));
    }
    local.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "remote-ca", "namespace": "shop"},
        "stringData": {"ca.crt": pki.ca}}));

    let url = front.url();
    let config_map =
        |name: &str| json!({"caProvider": {"type": "ConfigMap", "name": name, "key": "ca.crt"}});
    let stores = [
        remote_store("remote-map", &url, config_map("remote-ca")),
        remote_store(
            "remote-secret",
            &url,
            json!({"caProvider": {"type": "Secret", "name": "remote-ca", "key": "ca.crt"}}),
        ),
        // As ESO writes it: base64 of the PEM.
        remote_store(
            "remote-inline",
            &url,
            json!({"caBundle": base64::engine::general_purpose::STANDARD.encode(&pki.ca)}),
        ),
        remote_store("remote-rogue", &url, config_map("rogue-ca")),
        store("local-shared", json!({"remoteNamespace": "shared"})),
    ];
    for s in stores {
        add_store(&local, s);
    }
    Clusters {
        local,
        remote,
        front,
        pki,
    }
}

/// Applies store `s` and an ExternalSecret of its name reading `app-credentials`' password.
fn add_store(local: &FakeApiServer, s: serde_json::Value) {
    let name = s["metadata"]["name"].as_str().unwrap().to_string();
    local.apply(s);
    local.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"secretStoreRef": {"name": name},
                 "data": [{"secretKey": "password",
                           "remoteRef": {"key": "app-credentials", "property": "password"}}]}}),
    );
}

async fn agent(server: &FakeApiServer) -> Agent {
    let agent = Agent::start_in_cluster(&server.kubeconfig_yaml(AGENT_TOKEN), &[]).await;
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

/// The publish of ExternalSecret `es` for pod `pod` of service account `sa`, with its tokens
/// for this cluster and for the remote one.
fn request(agent: &Agent, pod: &str, sa: &str, es: &str) -> NodePublishVolumeRequest {
    let (local, remote) = match sa {
        "web" => (WEB_TOKEN, WEB_REMOTE_TOKEN),
        _ => (INTRUDER_TOKEN, INTRUDER_REMOTE_TOKEN),
    };
    let target = agent.target(pod);
    let mut p = PodVolume::new("shop", pod, es);
    p.service_account = sa.into();
    p.tokens_json = Some(json!({"": {"token": local}, AUDIENCE: {"token": remote}}).to_string());
    p.publish_request(&volume_id_for(&target), &target)
}

async fn publish(agent: &Agent, pod: &str, sa: &str, es: &str) -> Result<String, tonic::Status> {
    agent
        .node()
        .await
        .node_publish_volume(request(agent, pod, sa, es))
        .await?;
    Ok(std::fs::read_to_string(agent.target(pod).join("password")).unwrap())
}

/// No token and no value in the agent's log, the pods' Events or `messages`.
fn assert_no_leak(agent: &Agent, local: &FakeApiServer, messages: &[String]) {
    let events = serde_json::to_string(&local.events()).unwrap();
    let log = agent.log_text();
    for secret in [
        AGENT_TOKEN,
        WEB_TOKEN,
        INTRUDER_TOKEN,
        WEB_REMOTE_TOKEN,
        INTRUDER_REMOTE_TOKEN,
        REMOTE_PASSWORD,
        REMOTE_OTHER_PASSWORD,
        LOCAL_PASSWORD,
    ] {
        assert!(!log.contains(secret), "the log leaks {secret}");
        assert!(!events.contains(secret), "an Event leaks {secret}");
        for m in messages {
            assert!(!m.contains(secret), "{m:?} leaks {secret}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_reads_another_cluster_with_its_own_token_and_a_ca_from_a_config_map_or_a_secret() {
    support::require_root();
    let c = clusters().await;
    let agent = agent(&c.local).await;

    for (pod, es) in [
        ("map-0", "remote-map"),
        ("secret-0", "remote-secret"),
        ("inline-0", "remote-inline"),
    ] {
        let value = publish(&agent, pod, "web", es)
            .await
            .unwrap_or_else(|e| panic!("{es}: {e:?}\n{}", agent.log_text()));
        assert_eq!(value, REMOTE_PASSWORD, "{es}");
    }

    // The remote cluster saw only the pod's identity (a token it does not know, such as the one
    // for this cluster's API server, would have been recorded without one), and the Secret read
    // is the one of `remoteNamespace`.
    let remote_reads = c.remote.requests();
    assert!(!remote_reads.is_empty());
    for r in &remote_reads {
        assert_eq!(
            r.identity,
            Some(Identity::service_account("shop", "web")),
            "{} {}",
            r.method,
            r.path
        );
        assert_eq!(r.path, "/api/v1/namespaces/shared/secrets/app-credentials");
    }
    // This cluster served the CA as the pod (ConfigMap and Secret of its namespace), and no
    // Secret of `shared`.
    let local_reads = c.local.requests();
    assert!(
        !local_reads
            .iter()
            .any(|r| r.path.starts_with("/api/v1/namespaces/shared/")),
        "a remote read went to this cluster"
    );
    for path in [
        "/api/v1/namespaces/shop/configmaps/remote-ca",
        "/api/v1/namespaces/shop/secrets/remote-ca",
    ] {
        let read = local_reads.iter().find(|r| r.path == path);
        assert_eq!(
            read.and_then(|r| r.identity.clone()),
            Some(Identity::service_account("shop", "web")),
            "{path}"
        );
    }

    // A CA that did not sign the server's certificate: refused, and the message says why.
    let err = publish(&agent, "rogue-0", "web", "remote-rogue")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{}", err.message());
    for want in [
        "ExternalSecret \"remote-rogue\"",
        &format!("the API server {}", c.front.url()),
        "TLS certificate is not trusted",
        "kubernetes.server.caBundle or caProvider must hold the CA that signed it",
    ] {
        assert!(
            err.message().contains(want),
            "{:?} lacks {want:?}",
            err.message()
        );
    }
    assert!(!agent.target("rogue-0").join("password").exists());
    assert_no_leak(&agent, &c.local, &[err.message().to_string()]);
}

/// The cached value of one identity is never served to another, nor under another server or
/// namespace: the value cache keys by store identity (kind, namespace, name and a hash of the
/// whole provider block: server URL, CA, audience, remoteNamespace) and the pod's
/// `namespace/serviceaccount`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_namespace_reads_follow_the_pod_s_rbac_and_values_never_cross_identities_or_servers()
{
    support::require_root();
    let c = clusters().await;
    let agent = agent(&c.local).await;
    let mut messages = Vec::new();

    // `web` may read `shared` on both clusters; the same key holds different values there.
    assert_eq!(
        publish(&agent, "web-0", "web", "remote-map").await.unwrap(),
        REMOTE_PASSWORD
    );
    assert_eq!(
        publish(&agent, "web-1", "web", "local-shared")
            .await
            .unwrap(),
        LOCAL_PASSWORD
    );

    // `intruder` may not, on either: the value `web` just read is not served to it.
    c.remote.clear_requests();
    for (pod, es) in [("in-0", "remote-map"), ("in-1", "local-shared")] {
        let err = publish(&agent, pod, "intruder", es).await.unwrap_err();
        assert_eq!(
            err.code(),
            Code::PermissionDenied,
            "{es}: {}",
            err.message()
        );
        for want in [
            "system:serviceaccount:shop:intruder",
            "cannot get resource \"secrets\"",
            "namespace \"shared\"",
        ] {
            assert!(
                err.message().contains(want),
                "{es}: {:?} lacks {want:?}",
                err.message()
            );
        }
        assert!(!agent.target(pod).join("password").exists());
        messages.push(err.message().to_string());
    }
    let asked = c.remote.requests();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(
        asked[0].identity,
        Some(Identity::service_account("shop", "intruder"))
    );

    // The store now names another namespace: its next reader gets that namespace's value, not
    // the one cached under the old provider block.
    let mut edited = remote_store(
        "remote-map",
        &c.front.url(),
        json!({"caProvider": {"type": "ConfigMap", "name": "remote-ca", "key": "ca.crt"}}),
    );
    edited["spec"]["provider"]["kubernetes"]["remoteNamespace"] = json!("other");
    c.local.apply(edited);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let pod = format!("web-edit-{attempt}");
        let value = publish(&agent, &pod, "web", "remote-map").await.unwrap();
        if value == REMOTE_OTHER_PASSWORD {
            break;
        }
        assert_eq!(value, REMOTE_PASSWORD);
        assert!(Instant::now() < deadline, "the edited store was never used");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_no_leak(&agent, &c.local, &messages);
}

/// A store may name a server its author runs: its answers are cut at 16 MiB as they arrive,
/// and a message echoing the pod's token reaches no error, Event or log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_remote_server_is_bounded_and_never_gets_the_token_into_an_error() {
    support::require_root();
    let c = clusters().await;
    let (cert, key) = c.pki.issue(&["127.0.0.1"]);
    let endless = Hostile::start(Answer::Endless).await;
    let forged = format!(
        r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,"message":"no access for Bearer {WEB_REMOTE_TOKEN} here"}}"#
    );
    let echo = Hostile::start(Answer::Fixed(403, forged)).await;
    let mut fronts = Vec::new();
    for (name, hostile) in [("endless", &endless), ("echo", &echo)] {
        let backend = hostile.url.trim_start_matches("http://").parse().unwrap();
        let front = TlsFront::start(backend, &cert, &key).await;
        let ca = json!({"caProvider": {"type": "ConfigMap", "name": "remote-ca", "key": "ca.crt"}});
        add_store(&c.local, remote_store(name, &front.url(), ca));
        fronts.push(front);
    }
    let agent = agent(&c.local).await;

    let err = publish(&agent, "endless-0", "web", "endless")
        .await
        .unwrap_err();
    assert!(
        err.message().contains("answered more than 16 MiB"),
        "{:?}",
        err.message()
    );
    assert!(
        endless.sent() < 64 << 20,
        "read {} bytes of an endless answer",
        endless.sent()
    );

    let err2 = publish(&agent, "echo-0", "web", "echo").await.unwrap_err();
    assert_eq!(err2.code(), Code::PermissionDenied, "{}", err2.message());
    assert!(
        err2.message().contains("no access for Bearer [token] here"),
        "{:?}",
        err2.message()
    );
    assert_eq!(echo.requests(), 1);
    assert_no_leak(
        &agent,
        &c.local,
        &[err.message().to_string(), err2.message().to_string()],
    );
}

/// ESO's `auth.token`: a bearer token from a credential Secret (a SecretStore's, read as the
/// pod) is the identity on the remote cluster; the pod needs no token for its audience.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_bearer_token_reads_the_remote_cluster_as_its_own_identity() {
    support::require_root();
    const ROBOT_TOKEN: &str = "eyJ.robot-reader-token-k8s-remote.sig";
    let c = clusters().await;
    let robot = Identity::service_account("robots", "reader");
    c.remote.add_identity(ROBOT_TOKEN, robot.clone());
    c.remote
        .allow(robot.clone(), "get", "", "secrets", Some("shared"));
    c.local.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "remote-token", "namespace": "shop"},
        "stringData": {"token": format!("{ROBOT_TOKEN}\n")}}));
    add_store(
        &c.local,
        store(
            "remote-bearer",
            json!({"remoteNamespace": "shared",
                   "auth": {"token": {"bearerToken": {"name": "remote-token", "key": "token"}}},
                   "server": {"url": c.front.url(), "caProvider":
                       {"type": "ConfigMap", "name": "remote-ca", "key": "ca.crt"}}}),
        ),
    );
    let agent = agent(&c.local).await;

    // Only the token for this cluster's API server (to read the credential and CA as the pod).
    let target = agent.target("bearer-0");
    let mut p = PodVolume::new("shop", "bearer-0", "remote-bearer");
    p.service_account = "web".into();
    p.tokens_json = Some(json!({"": {"token": WEB_TOKEN}}).to_string());
    agent
        .node()
        .await
        .node_publish_volume(p.publish_request(&volume_id_for(&target), &target))
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", agent.log_text()));
    assert_eq!(
        std::fs::read_to_string(target.join("password")).unwrap(),
        REMOTE_PASSWORD
    );
    let remote_reads = c.remote.requests();
    assert!(!remote_reads.is_empty());
    assert!(
        remote_reads
            .iter()
            .all(|r| r.identity.as_ref() == Some(&robot)),
        "{remote_reads:?}"
    );
    let credential = c
        .local
        .requests()
        .into_iter()
        .find(|r| r.path == "/api/v1/namespaces/shop/secrets/remote-token");
    assert_eq!(
        credential.and_then(|r| r.identity),
        Some(Identity::service_account("shop", "web")),
        "the credential Secret is read as the pod"
    );
    assert_no_leak(&agent, &c.local, &[]);
    assert!(!agent.log_text().contains(ROBOT_TOKEN));
}
