//! Stores by `spec.providerRef` (issue #41) in a cluster: the real agent, the fake API server,
//! real mounts. A store by reference mounts exactly like its inline twin, follows edits of the
//! provider object (never serving a value cached under the old spec, nor a Vault login of the
//! old server), and a missing object or a provider CRD that is not installed is a
//! FAILED_PRECONDITION naming what is missing, while the agent serves everything else and
//! never watches the missing kind.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use latchkey::csi::client::{PodVolume, volume_id_for};
use serde_json::{Value, json};
use support::Agent;
use support::apiserver::{FakeApiServer, Identity};
use support::openbao::{OpenBao, random_hex};
use tonic::Code;

const AGENT_TOKEN: &str = "agent-token-provider-refs-e2e";
const WEB_TOKEN: &str = "eyJ.web-pod-token-provider-refs.sig";
const NS: &str = "providers.latchkey.dev/v1alpha1";
const CLUSTER: &str = "cluster.providers.latchkey.dev/v1alpha1";

/// The API server with the agent's and the pod's identities and namespaces `shop`, `latchkey`.
async fn cluster() -> FakeApiServer {
    let api = FakeApiServer::start().await;
    api.add_identity(AGENT_TOKEN, Identity::Agent);
    api.allow_defaults();
    api.add_identity(WEB_TOKEN, Identity::service_account("shop", "web"));
    for ns in ["shop", "latchkey"] {
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    for kind in [
        "AWS",
        "Vault",
        "Kubernetes",
        "Fake",
        "Plugin",
        "SecretsStoreCSIProvider",
    ] {
        api.install(NS, kind);
        api.install(CLUSTER, kind);
    }
    api
}

async fn agent(api: &FakeApiServer) -> Agent {
    let agent = Agent::start_in_cluster(&api.kubeconfig_yaml(AGENT_TOKEN), &[]).await;
    support::eventually(Duration::from_secs(20), "catalog synced", || async {
        agent.http_get("/readyz").await.0 == 200
    })
    .await;
    agent
}

/// A store `name` of `kind` with `spec`, and an ExternalSecret of the same name reading `key`.
fn store(api: &FakeApiServer, kind: &str, name: &str, spec: Value, key: &str, property: &str) {
    let mut metadata = json!({"name": name});
    if kind == "SecretStore" {
        metadata["namespace"] = json!("shop");
    }
    api.apply(json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": kind,
        "metadata": metadata, "spec": spec}));
    let mut remote = json!({"key": key});
    if !property.is_empty() {
        remote["property"] = json!(property);
    }
    api.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"secretStoreRef": {"name": name, "kind": kind},
            "data": [{"secretKey": "value", "remoteRef": remote}]}}),
    );
}

fn provider(api: &FakeApiServer, api_version: &str, kind: &str, name: &str, spec: Value) {
    let mut metadata = json!({"name": name});
    if api_version == NS {
        metadata["namespace"] = json!("shop");
    }
    api.apply(
        json!({"apiVersion": api_version, "kind": kind, "metadata": metadata,
        "spec": spec}),
    );
}

fn by_ref(api_version: &str, kind: &str, name: &str) -> Value {
    json!({"providerRef": {"apiVersion": api_version, "kind": kind, "name": name}})
}

async fn publish(agent: &Agent, pod: &str, es: &str) -> Result<String, tonic::Status> {
    let target: PathBuf = agent.target(pod);
    let mut volume = PodVolume::new("shop", pod, es);
    volume.service_account = "web".into();
    volume.tokens_json = Some(json!({"": {"token": WEB_TOKEN}}).to_string());
    let req = volume.publish_request(&volume_id_for(&target), &target);
    agent.node().await.node_publish_volume(req).await?;
    Ok(std::fs::read_to_string(target.join("value")).unwrap())
}

/// Publishes `es` for new pods until it reads `want` (the agent's watch sees an edit a moment
/// after the API server stored it).
async fn eventually_reads(agent: &Agent, es: &str, want: &str) {
    for attempt in 0..100 {
        let pod = format!("{es}-{}-{attempt}", random_hex(3));
        if publish(agent, &pod, es).await.ok().as_deref() == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{es}: never read the edited provider's value");
}

fn fake(value: &str) -> Value {
    json!({"data": [{"key": "k", "value": value}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fake_store_by_reference_mounts_like_its_inline_twin_and_follows_edits() {
    let (inline, shared, cluster_value) = (
        format!("inline-{}", random_hex(8)),
        format!("by-ref-{}", random_hex(8)),
        format!("cluster-{}", random_hex(8)),
    );
    let api = cluster().await;
    // The Vault provider kinds are not installed in this cluster.
    api.uninstall(NS, "Vault");
    api.uninstall(CLUSTER, "Vault");
    provider(&api, NS, "Fake", "values", fake(&shared));
    provider(&api, CLUSTER, "Fake", "values", fake(&cluster_value));
    store(
        &api,
        "SecretStore",
        "inline",
        json!({"provider": {"fake": fake(&inline)}}),
        "k",
        "",
    );
    store(
        &api,
        "SecretStore",
        "by-ref",
        by_ref(NS, "Fake", "values"),
        "k",
        "",
    );
    store(
        &api,
        "ClusterSecretStore",
        "cluster-by-ref",
        by_ref(CLUSTER, "Fake", "values"),
        "k",
        "",
    );
    store(
        &api,
        "SecretStore",
        "missing",
        by_ref(NS, "Fake", "nope"),
        "k",
        "",
    );
    store(
        &api,
        "SecretStore",
        "no-crd",
        by_ref(NS, "Vault", "vault"),
        "k",
        "",
    );
    let agent = agent(&api).await;

    // Twins: the same volume through either form.
    for (es, want) in [
        ("inline", &inline),
        ("by-ref", &shared),
        ("cluster-by-ref", &cluster_value),
    ] {
        let got = publish(&agent, &format!("{es}-0"), es)
            .await
            .unwrap_or_else(|e| panic!("{es}: {e:?}"));
        assert_eq!(&got, want, "{es}");
    }

    // An edit of the provider object counts at the next publish: the value cached under the
    // old spec (for an hour, the default refresh) is not served.
    let edited = format!("edited-{}", random_hex(8));
    provider(&api, NS, "Fake", "values", fake(&edited));
    eventually_reads(&agent, "by-ref", &edited).await;

    let missing = publish(&agent, "missing-0", "missing").await.unwrap_err();
    assert_eq!(
        missing.code(),
        Code::FailedPrecondition,
        "{}",
        missing.message()
    );
    assert!(
        missing.message().contains(
            "SecretStore \"missing\": spec.providerRef names Fake \"nope\", which does not exist \
             in the store's namespace"
        ),
        "{}",
        missing.message()
    );
    let no_crd = publish(&agent, "no-crd-0", "no-crd").await.unwrap_err();
    assert_eq!(
        no_crd.code(),
        Code::FailedPrecondition,
        "{}",
        no_crd.message()
    );
    for part in [
        "Vault (providers.latchkey.dev/v1alpha1) is not served by the API server",
        "the CRD vaults.providers.latchkey.dev is not installed",
        "latchkey crds --provider vault | kubectl apply -f -",
        "kubectl apply -k crds/providers/vault",
    ] {
        assert!(no_crd.message().contains(part), "{}", no_crd.message());
    }
    // The agent still serves, and never listed or watched the kind that is not there.
    assert_eq!(publish(&agent, "by-ref-1", "by-ref").await.unwrap(), edited);
    let requests = api.requests();
    let vaults: Vec<&str> = requests
        .iter()
        .map(|r| r.path.as_str())
        .filter(|p| p.contains("/vaults"))
        .collect();
    assert!(vaults.is_empty(), "{vaults:?}");
    let fakes = requests
        .iter()
        .filter(|r| r.path == "/apis/providers.latchkey.dev/v1alpha1/fakes")
        .count();
    assert!(fakes > 0, "the installed kind is watched");
    let log = agent.log_text();
    for value in [&inline, &shared, &cluster_value, &edited] {
        assert!(!log.contains(value.as_str()), "the log holds a value");
        assert!(!missing.message().contains(value.as_str()));
        assert!(!no_crd.message().contains(value.as_str()));
    }
}

/// Deleting a provider CRD ends the agent's watch of the kind (no watch retried against a kind
/// that is not there), its stores fail naming the CRD, and installing it again brings the kind
/// back at the next discovery (at most 30 s later), without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_provider_crd_ends_its_watch_and_comes_back_when_installed() {
    let value = format!("again-{}", random_hex(8));
    let api = cluster().await;
    provider(&api, NS, "Fake", "values", fake(&value));
    store(
        &api,
        "SecretStore",
        "by-ref",
        by_ref(NS, "Fake", "values"),
        "k",
        "",
    );
    let agent = agent(&api).await;
    assert_eq!(publish(&agent, "before-0", "by-ref").await.unwrap(), value);

    api.uninstall(NS, "Fake");
    let mut attempt = 0;
    let gone = loop {
        attempt += 1;
        // The agent's watch sees the deletion a moment after the API server made it.
        let result = publish(&agent, &format!("gone-{attempt}"), "by-ref").await;
        match result {
            Err(err) if err.message().contains("is not installed") => break err,
            _ if attempt == 100 => panic!("the deleted kind is still served: {result:?}"),
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(gone.code(), Code::FailedPrecondition, "{}", gone.message());
    assert!(
        gone.message()
            .contains("the CRD fakes.providers.latchkey.dev is not installed"),
        "{}",
        gone.message()
    );
    assert!(agent.log_text().contains("no longer served"));
    // No watch or list of the kind is retried once the agent knows it is gone.
    let fakes = || {
        api.requests()
            .iter()
            .filter(|r| r.path == "/apis/providers.latchkey.dev/v1alpha1/fakes")
            .count()
    };
    let seen = fakes();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(fakes(), seen, "the watch of the deleted kind is retried");

    api.install(NS, "Fake");
    provider(&api, NS, "Fake", "values", fake(&value));
    for attempt in 0.. {
        match publish(&agent, &format!("back-{attempt}"), "by-ref").await {
            Ok(read) => {
                assert_eq!(read, value);
                break;
            }
            Err(e) if attempt < 200 => {
                assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("the reinstalled kind is never served: {}", e.message()),
        }
    }
    assert!(fakes() > seen, "the reinstalled kind is watched again");
}

const POLICY: &str = r#"path "secret/data/app/*" { capabilities = ["read"] }"#;

/// An OpenBao dev server holding `value` at `app/db`, with user `shop` / `password`.
async fn bao_with(value: &str, password: &str) -> OpenBao {
    let bao = OpenBao::start().await;
    bao.policy("read", POLICY).await;
    bao.put_v2("secret", "app/db", json!({"password": value}))
        .await;
    bao.api(
        "POST",
        "sys/auth/userpass",
        Some(json!({"type": "userpass"})),
    )
    .await;
    bao.api(
        "POST",
        "auth/userpass/users/shop",
        Some(json!({"password": password, "token_policies": ["read"]})),
    )
    .await;
    bao
}

fn vault_spec(server: &str) -> Value {
    json!({"server": server, "auth": {"userPass": {"username": "shop",
        "secretRef": {"name": "vault-userpass", "key": "password"}}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vault_store_by_reference_reads_from_the_new_server_after_an_edit() {
    let password = random_hex(16);
    let (from_a, from_b) = (
        format!("a-{}", random_hex(8)),
        format!("b-{}", random_hex(8)),
    );
    let (a, b) = (
        bao_with(&from_a, &password).await,
        bao_with(&from_b, &password).await,
    );
    let api = cluster().await;
    api.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "vault-userpass", "namespace": "shop"},
        "stringData": {"password": password}}));
    provider(&api, NS, "Vault", "vault", vault_spec(&a.url));
    store(
        &api,
        "SecretStore",
        "inline",
        json!({"provider": {"vault": vault_spec(&a.url)}}),
        "app/db",
        "password",
    );
    store(
        &api,
        "SecretStore",
        "by-ref",
        by_ref(NS, "Vault", "vault"),
        "app/db",
        "password",
    );
    let agent = agent(&api).await;
    for es in ["inline", "by-ref"] {
        let got = publish(&agent, &format!("{es}-0"), es)
            .await
            .unwrap_or_else(|e| panic!("{es}: {e:?}"));
        assert_eq!(got, from_a, "{es}");
    }
    let logins = || agent.metric("latchkey_backend_logins_total{provider=\"vault\"}");
    assert_eq!(
        logins().await,
        1.0,
        "the twins share one login to the same server"
    );

    provider(&api, NS, "Vault", "vault", vault_spec(&b.url));
    eventually_reads(&agent, "by-ref", &from_b).await;
    assert_eq!(
        logins().await,
        2.0,
        "a login to the new server, not the old token"
    );
    // The inline twin still reads from the first server.
    assert_eq!(publish(&agent, "inline-1", "inline").await.unwrap(), from_a);
    let log = agent.log_text();
    for secret in [&password, &a.root_token, &b.root_token, &from_a, &from_b] {
        assert!(!log.contains(secret.as_str()), "the log holds a secret");
    }
}
