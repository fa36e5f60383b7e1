//! Generated credentials in a cluster: the agent, talking to the in-process fake API server with
//! the permissions daemonset/ grants it, records a GeneratorState per credential (owned by the
//! pod, labelled with its node, holding a lease id and never a value); killed with SIGKILL and
//! restarted, it takes its states over: each mounted volume gets a new certificate at its next
//! republish and the old one is revoked after the grace period with the pod's fresh token, and
//! once every volume is unpublished no lease and no state is left. A state another tenant forges
//! for a pod's volume is never cleaned up with that pod's identity.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use latchkey::csi::client::{PodVolume, unpublish_request, volume_id_for};
use serde_json::json;
use support::apiserver::{FakeApiServer, Identity};
use support::openbao::{JwtIssuer, OpenBao};
use support::{Agent, eventually};

const AGENT_TOKEN: &str = "eyJ.agent-token-generated-restart.sig";
const ROLE: &str = "example-dot-com";
const STATES: (&str, &str) = ("generators.latchkey.dev/v1alpha1", "GeneratorState");

/// OpenBao with a PKI role, jwt auth for pods and a policy to issue and revoke.
async fn pki() -> (OpenBao, JwtIssuer) {
    let bao = OpenBao::start().await;
    bao.pki("pki", ROLE, "1h").await;
    bao.policy(
        "issue",
        &format!(
            "path \"pki/issue/{ROLE}\" {{ capabilities = [\"create\", \"update\"] }}\n\
             path \"sys/leases/revoke\" {{ capabilities = [\"update\"] }}\n"
        ),
    )
    .await;
    let issuer = JwtIssuer::new();
    bao.jwt(&issuer, "app", "vault", &["issue"]).await;
    (bao, issuer)
}

/// A cluster with namespace `shop`, a VaultDynamicSecret issuing certificates, an ExternalSecret
/// naming it, and the agent's permissions of daemonset/base/rbac.yaml.
async fn cluster(bao: &OpenBao) -> FakeApiServer {
    let s = FakeApiServer::start().await;
    s.add_identity(AGENT_TOKEN, Identity::Agent);
    s.allow_defaults();
    for resource in [
        "passwords",
        "vaultdynamicsecrets",
        "plugingenerators",
        "clustergenerators",
    ] {
        s.allow(
            Identity::Agent,
            "get",
            "generators.latchkey.dev",
            resource,
            None,
        );
    }
    for verb in ["create", "get", "list", "watch", "patch", "delete"] {
        s.allow(
            Identity::Agent,
            verb,
            "generators.latchkey.dev",
            "generatorstates",
            None,
        );
    }
    for ns in ["shop", "other"] {
        s.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    s.apply(json!({
        "apiVersion": "generators.latchkey.dev/v1alpha1", "kind": "VaultDynamicSecret",
        "metadata": {"name": "cert", "namespace": "shop"},
        "spec": {"path": format!("pki/issue/{ROLE}"), "method": "POST",
                 "parameters": {"common_name": "localhost", "ttl": "30m"},
                 "provider": {"server": bao.url,
                              "auth": {"jwt": {"role": "app", "audience": "vault"}}}}}));
    s.apply(json!({
        "apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
        "metadata": {"name": "tls", "namespace": "shop"},
        "spec": {"dataFrom": [{"sourceRef": {"generatorRef":
            {"apiVersion": "generators.latchkey.dev/v1alpha1", "kind": "VaultDynamicSecret",
             "name": "cert"}}}]}}));
    s
}

async fn start_agent(server: &FakeApiServer) -> Agent {
    let agent = Agent::start_in_cluster(
        &server.kubeconfig_yaml(AGENT_TOKEN),
        &["--generator-grace-period", "1s"],
    )
    .await;
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

async fn publish(agent: &Agent, pod: &str, jwt: &str) -> PathBuf {
    let target = agent.target(pod);
    let mut volume = PodVolume::new("shop", pod, "tls");
    volume.service_account = "app".into();
    volume.tokens_json = Some(json!({"vault": {"token": jwt}}).to_string());
    let req = volume.publish_request(&volume_id_for(&target), &target);
    agent
        .node()
        .await
        .node_publish_volume(req)
        .await
        .unwrap_or_else(|e| panic!("publish {pod}: {e:?}\n{}", agent.log_text()));
    target
}

async fn unpublish(agent: &Agent, target: &Path) {
    agent
        .node()
        .await
        .node_unpublish_volume(unpublish_request(&volume_id_for(target), target))
        .await
        .unwrap();
}

fn serial(target: &Path) -> String {
    std::fs::read_to_string(target.join("serial_number")).unwrap()
}

async fn live_leases(bao: &OpenBao) -> usize {
    let (code, listed) = bao
        .request(
            "LIST",
            &format!("sys/leases/lookup/pki/issue/{ROLE}/"),
            None,
        )
        .await;
    assert!(
        code == 200 || code == 404,
        "listing leases: {code} {listed}"
    );
    listed["data"]["keys"].as_array().map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_takes_its_states_over_and_leaves_no_lease_behind() {
    support::require_root();
    let (bao, issuer) = pki().await;
    let server = cluster(&bao).await;
    let mut agent = start_agent(&server).await;
    let jwt = issuer.token("shop", "app", "vault");
    let pods: Vec<String> = (0..5).map(|i| format!("web-{i}")).collect();
    let mut targets = Vec::new();
    for pod in &pods {
        targets.push(publish(&agent, pod, &jwt).await);
    }
    let before: Vec<String> = targets.iter().map(|t| serial(t)).collect();
    let key = std::fs::read_to_string(targets[0].join("private_key")).unwrap();

    // One state per volume, linked to its pod and node, holding what cleanup needs and no value.
    let states = server.objects(STATES.0, STATES.1);
    assert_eq!(states.len(), 5, "{states:#?}");
    for s in &states {
        let labels = &s["metadata"]["labels"];
        assert_eq!(labels["generators.latchkey.dev/node"], "test-node", "{s:#}");
        assert_eq!(labels["generators.latchkey.dev/service-account"], "app");
        assert_eq!(s["metadata"]["ownerReferences"][0]["kind"], "Pod");
        assert!(s["spec"]["state"]["leaseId"].is_string(), "{s:#}");
        assert_eq!(s["spec"]["resource"]["kind"], "VaultDynamicSecret");
        let text = s.to_string();
        assert!(
            !text.contains(key.trim()),
            "a GeneratorState holds the private key"
        );
        assert!(
            !text.contains("BEGIN CERTIFICATE"),
            "a GeneratorState holds the certificate"
        );
    }
    assert_eq!(live_leases(&bao).await, 5);

    // Another tenant writes a state claiming web-0's volume (its target, node and pod uid): it
    // must never be cleaned up with web-0's identity.
    let mut forged = states[0].clone();
    forged["metadata"] = json!({"name": "forged", "namespace": "other",
        "labels": states[0]["metadata"]["labels"].clone(),
        "annotations": states[0]["metadata"]["annotations"].clone()});
    forged["spec"]["state"]["leaseId"] = json!(format!("pki/issue/{ROLE}/forged"));
    server.apply(forged);

    agent.kill9();
    agent.restart().await;
    // kubelet republishes every mounted volume, with fresh tokens.
    for pod in &pods {
        publish(&agent, pod, &jwt).await;
    }
    for (t, old) in targets.iter().zip(&before) {
        assert_ne!(
            &serial(t),
            old,
            "a taken-over volume gets a new certificate"
        );
    }
    eventually(
        Duration::from_secs(20),
        "the old certificates are revoked",
        || async {
            let revoked = bao.revoked_serials("pki").await;
            before
                .iter()
                .all(|old| revoked.iter().any(|r| r.eq_ignore_ascii_case(old)))
        },
    )
    .await;
    assert_eq!(
        live_leases(&bao).await,
        5,
        "only the new certificates are leased"
    );

    for t in &targets {
        unpublish(&agent, t).await;
    }
    let own = || {
        server
            .objects(STATES.0, STATES.1)
            .into_iter()
            .filter(|s| s["metadata"]["namespace"] == "shop")
            .count()
    };
    eventually(
        Duration::from_secs(20),
        "no lease and no state of shop is left",
        || async { live_leases(&bao).await == 0 && own() == 0 },
    )
    .await;
    assert!(
        server
            .get(STATES.0, STATES.1, Some("other"), "forged")
            .is_some(),
        "a state another tenant forged is left alone"
    );
    assert!(
        agent
            .log_text()
            .contains("was not recorded for this pod; it is left alone"),
        "{}",
        agent.log_text()
    );
    let log = agent.log_text();
    assert!(
        !log.contains(key.trim()),
        "the agent log holds a private key"
    );
    assert!(!log.contains(&jwt), "the agent log holds a pod token");
}
