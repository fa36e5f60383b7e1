//! Referent auth (issue #41, ESO design 007's `ApplyReferent`): a ClusterSecretStore naming a
//! cluster-scoped provider object reads a credential reference that names no namespace from the
//! caller's namespace, as the caller. The real agent and controller, the fake API server with
//! RBAC, a real OpenBao: two tenants with their own Vault credentials behind one cluster Vault
//! provider each get their own tenant's value and nothing their RBAC does not give them.

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine as _;
use latchkey::csi::client::{PodVolume, volume_id_for};
use serde_json::{Value, json};
use support::Agent;
use support::apiserver::{FakeApiServer, Identity};
use support::controller::ControllerProcess;
use support::openbao::{OpenBao, random_hex};
use tonic::Code;

const AGENT_TOKEN: &str = "agent-token-referent-e2e";
const CONTROLLER_TOKEN: &str = "controller-token-referent-e2e";
const CLUSTER: &str = "cluster.providers.latchkey.dev/v1alpha1";

/// The pods: `web` in each tenant may read its own namespace's Secrets, `nobody` may not.
const WEB_A: &str = "eyJ.team-a-web.sig";
const WEB_B: &str = "eyJ.team-b-web.sig";
const NOBODY_A: &str = "eyJ.team-a-nobody.sig";

/// OpenBao with one KV path per tenant, a token per tenant that uses only its own path, and an
/// AppRole `shared` reading both (whose secret id only tenant A holds).
struct Backend {
    bao: OpenBao,
    token_a: String,
    token_b: String,
    role_id: String,
    secret_id: String,
    value_a: String,
    value_b: String,
}

async fn backend() -> Backend {
    let bao = OpenBao::start().await;
    let (value_a, value_b) = (
        format!("a-{}", random_hex(8)),
        format!("b-{}", random_hex(8)),
    );
    for (tenant, value) in [("a", &value_a), ("b", &value_b)] {
        bao.policy(
            tenant,
            &format!(
                r#"
path "secret/data/tenants/{tenant}/*" {{ capabilities = ["create", "read", "update"] }}
path "secret/metadata/tenants/{tenant}/*" {{ capabilities = ["create", "read", "update"] }}
"#
            ),
        )
        .await;
        bao.put_v2(
            "secret",
            &format!("tenants/{tenant}/db"),
            json!({"password": value}),
        )
        .await;
    }
    let token_a = bao.token(&["a"], "1h").await;
    let token_b = bao.token(&["b"], "1h").await;
    let (role_id, secret_id) = bao.approle("shared", &["a", "b"]).await;
    Backend {
        bao,
        token_a,
        token_b,
        role_id,
        secret_id,
        value_a,
        value_b,
    }
}

fn secret(namespace: &str, name: &str, key: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": {key: value}})
}

/// Namespaces `team-a`, `team-b`, `latchkey`; each tenant's own credential Secrets, and in the
/// agent's namespace a token of tenant A's; cluster Vault providers and a ClusterSecretStore of
/// the same name for each.
async fn cluster(b: &Backend) -> FakeApiServer {
    let api = FakeApiServer::start().await;
    api.add_identity(AGENT_TOKEN, Identity::Agent);
    // Only the agent's own permissions: no service account reads a Secret unless granted below.
    api.allow_agent_defaults();
    api.add_identity(WEB_A, Identity::service_account("team-a", "web"));
    api.add_identity(WEB_B, Identity::service_account("team-b", "web"));
    api.add_identity(NOBODY_A, Identity::service_account("team-a", "nobody"));
    for ns in ["team-a", "team-b"] {
        api.allow(
            Identity::service_account(ns, "web"),
            "get",
            "",
            "secrets",
            Some(ns),
        );
    }
    for ns in ["team-a", "team-b", "latchkey"] {
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    api.install(CLUSTER, "Vault");
    api.apply(secret("team-a", "vault-token", "token", &b.token_a));
    api.apply(secret("team-b", "vault-token", "token", &b.token_b));
    api.apply(secret("latchkey", "vault-token", "token", &b.token_a));
    api.apply(secret("team-a", "vault-approle", "secret-id", &b.secret_id));
    api.apply(secret(
        "team-b",
        "vault-approle",
        "secret-id",
        "not-a-secret-id",
    ));
    let token_ref = |namespace: Option<&str>| {
        let mut r = json!({"name": "vault-token", "key": "token"});
        if let Some(ns) = namespace {
            r["namespace"] = json!(ns);
        }
        json!({"server": b.bao.url, "path": "secret", "auth": {"tokenSecretRef": r}})
    };
    let approle = json!({"server": b.bao.url, "path": "secret", "auth": {"appRole": {
        "roleId": b.role_id, "secretRef": {"name": "vault-approle", "key": "secret-id"}}}});
    for (name, spec) in [
        ("tenant-token", token_ref(None)),
        ("tenant-approle", approle),
        ("named-team-b", token_ref(Some("team-b"))),
        ("named-agent", token_ref(Some("latchkey"))),
    ] {
        api.apply(json!({"apiVersion": CLUSTER, "kind": "Vault",
            "metadata": {"name": name}, "spec": spec}));
        api.apply(
            json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ClusterSecretStore",
            "metadata": {"name": name},
            "spec": {"providerRef": {"apiVersion": CLUSTER, "kind": "Vault", "name": name}}}),
        );
    }
    // The same reference inline: not referent, read from the agent's namespace as before.
    api.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ClusterSecretStore",
        "metadata": {"name": "inline"}, "spec": {"provider": {"vault": token_ref(None)}}}),
    );
    api
}

/// ExternalSecret `name` in `namespace` reading `tenants/<tenant>/db` through store `store`.
fn external_secret(namespace: &str, name: &str, store: &str, tenant: &str, mirror: bool) -> Value {
    let mut spec = json!({"secretStoreRef": {"name": store, "kind": "ClusterSecretStore"},
        "data": [{"secretKey": "value",
            "remoteRef": {"key": format!("tenants/{tenant}/db"), "property": "password"}}]});
    if mirror {
        spec["serviceAccountName"] = json!("web");
        spec["refreshInterval"] = json!("1s");
        spec["target"] = json!({"creationPolicy": "Owner"});
    }
    json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
        "metadata": {"name": name, "namespace": namespace}, "spec": spec})
}

async fn publish(
    agent: &Agent,
    namespace: &str,
    account: &str,
    token: &str,
    es: &str,
) -> Result<String, tonic::Status> {
    let pod = format!("{es}-{}", random_hex(4));
    let target: PathBuf = agent.target(&pod);
    let mut volume = PodVolume::new(namespace, &pod, es);
    volume.service_account = account.into();
    volume.tokens_json = Some(json!({"": {"token": token}}).to_string());
    let req = volume.publish_request(&volume_id_for(&target), &target);
    agent.node().await.node_publish_volume(req).await?;
    Ok(std::fs::read_to_string(target.join("value")).unwrap())
}

fn secrets_of(b: &Backend) -> [&str; 5] {
    [
        &b.token_a,
        &b.token_b,
        &b.secret_id,
        &b.bao.root_token,
        "not-a-secret-id",
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_referent_cluster_provider_reads_each_tenant_s_own_credentials_as_the_pod() {
    let b = backend().await;
    let api = cluster(&b).await;
    for (ns, name, store, tenant) in [
        ("team-a", "mine", "tenant-token", "a"),
        ("team-b", "mine", "tenant-token", "b"),
        ("team-b", "cross", "tenant-token", "a"),
        ("team-a", "approle", "tenant-approle", "a"),
        ("team-b", "approle", "tenant-approle", "b"),
        ("team-a", "named-team-b", "named-team-b", "b"),
        ("team-a", "named-agent", "named-agent", "a"),
        ("team-b", "inline", "inline", "a"),
    ] {
        api.apply(external_secret(ns, name, store, tenant, false));
    }
    let agent = Agent::start_in_cluster(&api.kubeconfig_yaml(AGENT_TOKEN), &[]).await;
    support::eventually(Duration::from_secs(20), "catalog synced", || async {
        agent.http_get("/readyz").await.0 == 200
    })
    .await;
    let a = |es: &'static str| publish(&agent, "team-a", "web", WEB_A, es);
    let bb = |es: &'static str| publish(&agent, "team-b", "web", WEB_B, es);

    // One provider object, no namespace in its reference: each tenant's own token.
    assert_eq!(a("mine").await.unwrap(), b.value_a);
    assert_eq!(bb("mine").await.unwrap(), b.value_b);
    // Tenant B's token reads nothing of A's: Vault refuses it, so B's credential was used.
    let cross = bb("cross").await.unwrap_err();
    assert_eq!(cross.code(), Code::PermissionDenied, "{}", cross.message());

    // A pod whose service account may not read the Secret gets no value, and hears which
    // Secret it lacks.
    let nobody = publish(&agent, "team-a", "nobody", NOBODY_A, "mine")
        .await
        .unwrap_err();
    assert_eq!(
        nobody.code(),
        Code::PermissionDenied,
        "{}",
        nobody.message()
    );
    for part in ["secrets \"vault-token\"", "team-a"] {
        assert!(nobody.message().contains(part), "{}", nobody.message());
    }

    // AppRole: A's login is cached; B, holding a wrong secret id, never gets to reuse it.
    assert_eq!(a("approle").await.unwrap(), b.value_a);
    let refused = bb("approle").await.unwrap_err();
    assert_eq!(
        refused.code(),
        Code::PermissionDenied,
        "{}",
        refused.message()
    );
    assert_eq!(
        a("approle").await.unwrap(),
        b.value_a,
        "A's login still serves A"
    );

    // A reference naming another tenant's namespace is refused before anything is read; one
    // naming the agent's namespace is read there, by the agent.
    let named = a("named-team-b").await.unwrap_err();
    assert_eq!(named.code(), Code::PermissionDenied, "{}", named.message());
    assert!(
        named.message().contains(
            "credential Secret team-b/vault-token is outside the agent's namespace \
             (ClusterSecretStore), \"latchkey\""
        ),
        "{}",
        named.message()
    );
    assert_eq!(a("named-agent").await.unwrap(), b.value_a);
    // An inline ClusterSecretStore is not referent: tenant B reads the agent's Secret (A's
    // token here), not its own.
    assert_eq!(bb("inline").await.unwrap(), b.value_a);

    let team_b_reads: Vec<String> = api
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/namespaces/team-b/secrets/vault-token")
        .map(|r| {
            r.identity
                .as_ref()
                .map(Identity::username)
                .unwrap_or_default()
        })
        .collect();
    assert!(!team_b_reads.is_empty());
    assert!(
        team_b_reads
            .iter()
            .all(|u| u == "system:serviceaccount:team-b:web"),
        "tenant B's Secret is read as tenant B's pod only: {team_b_reads:?}"
    );

    let log = agent.log_text();
    for message in [&cross, &nobody, &refused, &named].map(|s| s.message().to_string()) {
        for secret in secrets_of(&b) {
            assert!(
                !message.contains(secret),
                "an error holds a secret: {message}"
            );
        }
    }
    for secret in secrets_of(&b).into_iter().chain([&*b.value_a, &*b.value_b]) {
        assert!(!log.contains(secret), "the log holds a secret");
    }
}

fn decoded(api: &FakeApiServer, namespace: &str, name: &str) -> Option<String> {
    let s = api.get("v1", "Secret", Some(namespace), name)?;
    let b64 = s.pointer("/data/value")?.as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    String::from_utf8(bytes).ok()
}

/// A PushSecret in `namespace` pushing its namespace's Secret `db` to `remote` through the
/// referent store, as `web`.
fn push_secret(namespace: &str, name: &str, remote: &str) -> Value {
    json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "PushSecret",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"serviceAccountName": "web", "refreshInterval": "1h", "deletionPolicy": "None",
            "secretStoreRefs": [{"name": "tenant-token", "kind": "ClusterSecretStore"}],
            "selector": {"secret": {"name": "db"}},
            "data": [{"match": {"secretKey": "password",
                "remoteRef": {"remoteKey": remote, "property": "password"}}}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mirror_and_pushes_read_a_referent_provider_s_credentials_as_their_account() {
    let b = backend().await;
    let api = cluster(&b).await;
    let controller = Identity::service_account("latchkey", "latchkey-controller");
    api.add_identity(CONTROLLER_TOKEN, controller.clone());
    let granted = api.allow_roles_of(controller, "daemonset/components/mirror/rbac.yaml");
    assert!(granted > 10);
    for ns in ["team-a", "team-b"] {
        api.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "web", "namespace": ns,
                "annotations": {"latchkey.dev/allow-controller": "true"}}}));
    }
    api.apply(external_secret(
        "team-a",
        "mirrored",
        "tenant-token",
        "a",
        true,
    ));
    api.apply(external_secret(
        "team-b",
        "mirrored",
        "tenant-token",
        "b",
        true,
    ));
    // B's account reads B's token, which Vault refuses for A's path.
    api.apply(external_secret(
        "team-b",
        "cross",
        "tenant-token",
        "a",
        true,
    ));
    // Pushes: each tenant's Secret `db`, written with its own token; B's to A's path refused.
    let pushed = format!("pushed-{}", random_hex(8));
    for ns in ["team-a", "team-b"] {
        api.apply(secret(ns, "db", "password", &pushed));
    }
    api.apply(push_secret("team-a", "push", "tenants/a/pushed"));
    api.apply(push_secret("team-b", "push", "tenants/a/from-b"));
    let c = ControllerProcess::start(&api.kubeconfig_yaml(CONTROLLER_TOKEN), "referent", &[]).await;

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let a = decoded(&api, "team-a", "mirrored");
        let bv = decoded(&api, "team-b", "mirrored");
        if a.as_deref() == Some(&*b.value_a) && bv.as_deref() == Some(&*b.value_b) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "mirrored Secrets: {a:?} {bv:?}\n{}",
            c.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let message = loop {
        let es = api.get(
            "latchkey.dev/v1alpha1",
            "ExternalSecret",
            Some("team-b"),
            "cross",
        );
        let ready = es.as_ref().and_then(|es| {
            es.pointer("/status/conditions")?
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Ready" && c["reason"] == "SecretSyncedError")
                .cloned()
        });
        if let Some(ready) = ready {
            break ready["message"].as_str().unwrap_or_default().to_string();
        }
        assert!(Instant::now() < deadline, "cross never failed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(decoded(&api, "team-b", "cross").is_none());

    let deadline = Instant::now() + Duration::from_secs(20);
    let read = |key: &'static str| {
        let bao = &b.bao;
        async move {
            let (code, v) = bao
                .request("GET", &format!("secret/data/tenants/a/{key}"), None)
                .await;
            (code == 200).then(|| v["data"]["data"]["password"].clone())
        }
    };
    while read("pushed").await != Some(json!(pushed)) {
        assert!(Instant::now() < deadline, "never pushed\n{}", c.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refused = loop {
        let ps = api.get(
            "latchkey.dev/v1alpha1",
            "PushSecret",
            Some("team-b"),
            "push",
        );
        let failed = ps.as_ref().and_then(|ps| {
            ps.pointer("/status/conditions")?
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Ready" && c["status"] == "False")
                .cloned()
        });
        if let Some(failed) = failed {
            break failed["message"].as_str().unwrap_or_default().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "B's push never refused\n{}",
            c.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(refused.contains("Vault denied"), "{refused}");
    assert_eq!(read("from-b").await, None);
    // The tenant Secrets were read with tokens minted for each ExternalSecret's account.
    let reads: Vec<(String, String)> = api
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/secrets/vault-token"))
        .map(|r| {
            let user = r.identity.as_ref().map(Identity::username);
            (r.path.clone(), user.unwrap_or_default())
        })
        .collect();
    for (path, user) in &reads {
        let ns = path.split('/').nth(4).unwrap_or_default();
        assert_eq!(
            user,
            &format!("system:serviceaccount:{ns}:web"),
            "{reads:?}"
        );
    }
    let log = c.log_text();
    for secret in secrets_of(&b) {
        assert!(!log.contains(secret), "the controller log holds a secret");
        assert!(!message.contains(secret), "{message}");
        assert!(!refused.contains(secret), "{refused}");
    }
    assert!(
        !log.contains(&pushed),
        "the controller log holds a pushed value"
    );
}
