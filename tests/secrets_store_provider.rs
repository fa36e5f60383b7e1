//! End to end with a Secrets Store CSI Driver provider: the `latchkey node` binary, the
//! `secrets-store-provider` example (`v1alpha1.CSIDriverProvider`) on a real unix socket in the
//! agent's `--secrets-store-provider-dir`, real tmpfs mounts. Files picked by path and renamed,
//! every file mounted with the provider's modes made safe (unless the ExternalSecret sets its
//! own), hostile paths, provider errors, providers that write files themselves, object versions
//! sent back, tokens for the listed audiences only, the socket rules, the mount storms (gets and
//! finds), and that no value, token or attribute reaches a log or a status.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use latchkey::csi::client::{PodVolume, volume_id_for};
use support::store_forms::Form;
use support::{Agent, require_root};
use tonic::Code;

const DB_PASSWORD: &str = "sscsi-db-password-e2e-4471";
const API_KEY: &str = "sscsi-api-key-e2e-8810";
const VAULT_TOKEN: &str = "eyJ.sscsi-vault-token-e2e.sig";
const OTHER_TOKEN: &str = "eyJ.sscsi-other-token-e2e.sig";
/// A parameter value: attributes must not reach the agent's log either.
const PARAMETER: &str = "sscsi-parameter-marker-3392";
/// The value of the `nodePublishSecretRef` Secret: a provider credential.
const CLIENT_SECRET: &str = "sscsi-client-secret-e2e-5523";

/// A running provider and its scratch space.
struct Provider {
    child: Child,
    /// The provider directory (the agent's `--secrets-store-provider-dir`).
    dir: PathBuf,
    /// One JSON line per Mount call.
    calls: PathBuf,
    _scratch: tempfile::TempDir,
}

impl Provider {
    async fn start() -> Self {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("providers");
        let data = scratch.path().join("data");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(data.join("db")).unwrap();
        std::fs::write(data.join("db/password"), DB_PASSWORD).unwrap();
        std::fs::write(data.join("api"), API_KEY).unwrap();
        std::fs::write(data.join("db/user"), "shop").unwrap();
        // Modes the provider sends as they are: Latchkey must keep only read and execute bits.
        let chmod = |file: &str, mode: u32| {
            std::fs::set_permissions(data.join(file), std::fs::Permissions::from_mode(mode))
                .unwrap()
        };
        chmod("db/password", 0o600);
        chmod("api", 0o4755);
        chmod("db/user", 0o664);
        let socket = dir.join("files.sock");
        let calls = scratch.path().join("calls.jsonl");
        let child = Command::new(support::example_binary("secrets-store-provider"))
            .arg("--socket")
            .arg(&socket)
            .arg("--dir")
            .arg(&data)
            .arg("--calls")
            .arg(&calls)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start secrets-store-provider");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "the provider did not listen");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self {
            child,
            dir,
            calls,
            _scratch: scratch,
        }
    }

    /// Every Mount call so far.
    fn calls(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.calls)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A SecretStore `name` on provider `provider` with extra parameters (YAML flow entries).
fn store(name: &str, provider: &str, parameters: &str) -> String {
    format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {{name: {name}, namespace: shop}}\n\
         spec:\n  provider:\n    secretsStoreCSI:\n      provider: {provider}\n      audiences: [vault]\n\
         \x20     timeout: 2s\n      parameters: {{marker: {PARAMETER}{parameters}}}\n"
    )
}

/// A SecretStore `name` on the `files` provider sending Secret `secret` as the Mount's secrets.
fn store_with_secret(name: &str, secret: &str) -> String {
    format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {{name: {name}, namespace: shop}}\n\
         spec:\n  provider:\n    secretsStoreCSI:\n      provider: files\n      timeout: 2s\n\
         \x20     nodePublishSecretRef: {{name: {secret}}}\n"
    )
}

fn b64(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// An ExternalSecret `name` on `store` with the given `spec` lines after secretStoreRef.
fn es(name: &str, store: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {{name: {name}, namespace: shop}}\n\
         spec:\n  secretStoreRef: {{name: {store}}}\n{spec}"
    )
}

const ALL: &str = "  dataFrom: [{find: {name: {regexp: \".*\"}}}]\n";

fn manifests() -> String {
    let mut out = store("files", "files", "");
    out += &store("slow", "files", ", delay: 200ms");
    out += &store("dotdot", "files", ", hostilePath: ../x");
    out += &store("absolute", "files", ", hostilePath: /abs");
    out += &store("empty-segment", "files", ", hostilePath: a//b");
    out += &store("failing", "files", ", errorCode: KeyVaultAccessDenied");
    out += &store("old", "files", ", writesFiles: \"true\"");
    out += &store("link", "link", "");
    out += &store("absent", "absent", "");
    // Provider credentials from a Secret of the store's namespace, as a pod volume's
    // nodePublishSecretRef; and one naming a Secret that does not exist.
    out += &store_with_secret("creds", "provider-creds");
    out += &store_with_secret("no-creds", "not-there");
    out += &format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: provider-creds, namespace: shop}}\n\
         data: {{clientid: {}, clientsecret: {}}}\n",
        b64("shop-client"),
        b64(CLIENT_SECRET)
    );
    out += &es("creds", "creds", ALL);
    out += &es("no-creds", "no-creds", ALL);
    out += &es(
        "pick",
        "files",
        "  refreshInterval: 200ms\n  data: [{secretKey: password, remoteRef: {key: db/password}}]\n",
    );
    out += &es("all", "files", ALL);
    // 0o440: the ExternalSecret's defaultMode, which wins over the provider's modes.
    out += &es(
        "pinned",
        "files",
        &format!("{ALL}  target: {{files: {{defaultMode: 288}}}}\n"),
    );
    out += &es("storm-find", "slow", ALL);
    out += &es(
        "storm",
        "slow",
        "  data:\n  - {secretKey: password, remoteRef: {key: db/password}}\n  - {secretKey: api, remoteRef: {key: api}}\n",
    );
    out += &es(
        "missing",
        "files",
        "  data: [{secretKey: x, remoteRef: {key: nope}}]\n",
    );
    for name in [
        "dotdot",
        "absolute",
        "empty-segment",
        "failing",
        "old",
        "link",
        "absent",
    ] {
        out += &es(name, name, ALL);
    }
    out
}

/// The agent and the provider, with a socket outside the provider directory (linked from
/// `link.sock` in it) that must never be connected to.
struct Setup {
    agent: Agent,
    provider: Provider,
    outside: support::OutsideSocket,
}

async fn setup() -> Setup {
    setup_as(Form::Inline).await
}

/// [`setup`] with the stores in `form`.
async fn setup_as(form: Form) -> Setup {
    require_root();
    let provider = Provider::start().await;
    let outside = support::OutsideSocket::linked_from(&provider.dir);
    let dir = provider.dir.display().to_string();
    let agent = Agent::start(
        &[("shop.yaml", &form.manifests(&manifests()))],
        &["--secrets-store-provider-dir", &dir],
    )
    .await;
    Setup {
        agent,
        provider,
        outside,
    }
}

/// The pod's tokens: two audiences, of which the stores list one.
fn tokens() -> String {
    format!(
        r#"{{"vault":{{"token":"{VAULT_TOKEN}","expirationTimestamp":"2030-01-01T00:00:00Z"}},"other":{{"token":"{OTHER_TOKEN}"}}}}"#
    )
}

async fn publish(
    agent: &Agent,
    pod: &str,
    service_account: &str,
    external_secret: &str,
) -> Result<PathBuf, tonic::Status> {
    let target = agent.target(pod);
    let mut p = PodVolume::new("shop", pod, external_secret);
    p.service_account = service_account.into();
    p.tokens_json = Some(tokens());
    let req = p.publish_request(&volume_id_for(&target), &target);
    agent.node().await.node_publish_volume(req).await?;
    Ok(target)
}

fn read(target: &Path, file: &str) -> Vec<u8> {
    std::fs::read(target.join(file)).unwrap()
}

fn mode(target: &Path, file: &str) -> u32 {
    std::fs::metadata(target.join(file))
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

fn assert_no_leak(agent: &Agent, text: &str) {
    let log = agent.log_text();
    for secret in [
        DB_PASSWORD,
        API_KEY,
        VAULT_TOKEN,
        OTHER_TOKEN,
        PARAMETER,
        CLIENT_SECRET,
    ] {
        assert!(!text.contains(secret), "a status leaks {secret:?}: {text}");
        assert!(!log.contains(secret), "the agent log leaks {secret:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_is_picked_by_path_and_renamed_as_the_pod_with_only_the_listed_tokens() {
    a_file_is_picked_by_path_and_renamed_as_the_pod_with_only_the_listed_tokens_as(Form::Inline)
        .await;
}

/// The same with the store naming a provider object (issue #41).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_is_picked_by_path_and_renamed_as_the_pod_with_only_the_listed_tokens_by_provider_ref()
 {
    a_file_is_picked_by_path_and_renamed_as_the_pod_with_only_the_listed_tokens_as(
        Form::ByReference,
    )
    .await;
}

async fn a_file_is_picked_by_path_and_renamed_as_the_pod_with_only_the_listed_tokens_as(
    form: Form,
) {
    let s = setup_as(form).await;
    let t = publish(&s.agent, "app", "web", "pick").await.unwrap();
    assert_eq!(read(&t, "password"), DB_PASSWORD.as_bytes());
    assert!(!t.join("api").exists() && !t.join("db").exists());
    assert_eq!(
        mode(&t, "password"),
        0o400,
        "the provider's 0600, made read-only"
    );

    let calls = s.provider.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = &calls[0];
    assert_eq!(call["audiences"], serde_json::json!(["vault"]), "{call}");
    assert_eq!(
        call["keys"],
        serde_json::json!([
            "csi.storage.k8s.io/pod.name",
            "csi.storage.k8s.io/pod.namespace",
            "csi.storage.k8s.io/pod.uid",
            "csi.storage.k8s.io/serviceAccount.name",
            "csi.storage.k8s.io/serviceAccount.tokens",
            "marker",
        ]),
        "exactly the parameters and the driver's pod attributes: {call}"
    );
    let uid = PodVolume::new("shop", "app", "pick").pod_uid;
    assert_eq!(call["pod"], format!("shop/app/{uid}/web"));
    assert_eq!(call["permission"], "420");
    assert_eq!(call["secrets"], "{}");
    assert_eq!(
        call["target"],
        latchkey::providers::secrets_store_csi::TARGET_PATH
    );
    assert!(!Path::new(latchkey::providers::secrets_store_csi::TARGET_PATH).exists());
    assert_eq!(
        call["versions"],
        serde_json::json!([]),
        "nothing mounted yet"
    );
    assert_no_leak(&s.agent, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_mounts_every_file_and_a_missing_path_is_not_found() {
    let s = setup().await;
    let t = publish(&s.agent, "all", "web", "all").await.unwrap();
    assert_eq!(read(&t, "db/password"), DB_PASSWORD.as_bytes());
    assert_eq!(read(&t, "db/user"), b"shop");
    assert_eq!(read(&t, "api"), API_KEY.as_bytes());
    // The provider's modes, with setuid, setgid, sticky and write bits stripped.
    assert_eq!(mode(&t, "db/password"), 0o400, "0600");
    assert_eq!(mode(&t, "api"), 0o555, "04755");
    assert_eq!(mode(&t, "db/user"), 0o444, "0664");

    // The ExternalSecret's own mode wins over the provider's.
    let t = publish(&s.agent, "pinned", "pinned", "pinned")
        .await
        .unwrap();
    for file in ["db/password", "api", "db/user"] {
        assert_eq!(mode(&t, file), 0o440, "{file}");
    }

    let err = publish(&s.agent, "missing", "other", "missing")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("\"nope\""), "{:?}", err.message());
    assert_no_leak(&s.agent, err.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_versions_are_sent_back_on_refresh() {
    let s = setup().await;
    let t = publish(&s.agent, "app", "web", "pick").await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    publish(&s.agent, "app", "web", "pick").await.unwrap();
    assert_eq!(read(&t, "password"), DB_PASSWORD.as_bytes());
    let calls = s.provider.calls();
    assert_eq!(calls.len(), 2, "the refresh is a second Mount: {calls:?}");
    let sent = calls[1]["versions"].as_array().unwrap();
    let ids: Vec<&str> = sent
        .iter()
        .map(|v| v.as_str().unwrap().split('=').next().unwrap())
        .collect();
    assert_eq!(ids, ["api", "db/password", "db/user"], "{sent:?}");
    assert_no_leak(&s.agent, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_paths_provider_errors_and_providers_writing_files_are_refused() {
    let s = setup().await;
    let cases: [(&str, Code, &[&str]); 7] = [
        ("dotdot", Code::Unavailable, &["unusable path", "\"../x\""]),
        (
            "absolute",
            Code::Unavailable,
            &["unusable path", "\"/abs\""],
        ),
        (
            "empty-segment",
            Code::Unavailable,
            &["unusable path", "\"a//b\""],
        ),
        (
            "failing",
            Code::Unavailable,
            &["error code \"KeyVaultAccessDenied\""],
        ),
        (
            "old",
            Code::FailedPrecondition,
            &["wrote its files itself", "driver-written files"],
        ),
        ("link", Code::FailedPrecondition, &["symbolic link"]),
        (
            "absent",
            Code::Unavailable,
            &["no socket at", "absent.sock"],
        ),
    ];
    for (name, code, wants) in cases {
        // One service account each: a transient failure makes that identity back off.
        let err = publish(&s.agent, name, name, name).await.unwrap_err();
        assert_eq!(err.code(), code, "{name}: {err:?}");
        let message = err.message();
        let store = format!("SecretStore \"{name}\"");
        for want in wants
            .iter()
            .copied()
            .chain([store.as_str(), "secretsStoreCSI provider"])
        {
            assert!(message.contains(want), "{name}: {message:?} lacks {want:?}");
        }
        assert!(!message.contains("hostile"), "{name}: {message:?}");
        assert_no_leak(&s.agent, message);
    }
    // The link points outside the directory: never followed, never connected to; the other
    // stores each made one call.
    assert!(
        !s.outside.was_reached().await,
        "the agent connected through a symbolic link"
    );
    assert_eq!(s.provider.calls().len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_storm_makes_one_mount_call() {
    let s = setup().await;
    let mut tasks = Vec::new();
    for pod in 0..200 {
        let target = s.agent.target(&format!("storm-{pod}"));
        let mut p = PodVolume::new("shop", &format!("storm-{pod}"), "storm");
        p.tokens_json = Some(tokens());
        let req = p.publish_request(&volume_id_for(&target), &target);
        let mut node = s.agent.node().await;
        tasks.push(tokio::spawn(async move {
            node.node_publish_volume(req).await.map(|_| target)
        }));
    }
    for t in tasks {
        let target = t.await.unwrap().unwrap();
        assert_eq!(read(&target, "password"), DB_PASSWORD.as_bytes());
        assert_eq!(read(&target, "api"), API_KEY.as_bytes());
    }
    assert_eq!(
        s.provider.calls().len(),
        1,
        "200 pods, two keys of one store: one Mount call"
    );
    assert!(
        s.agent
            .metric(
                "latchkey_backend_requests_total{provider=\"secretsStoreCSI\",operation=\"get\",result=\"success\"}"
            )
            .await
            == 2.0
    );

    // Finds are not in the shared value cache: the provider shares its Mount instead.
    let mut tasks = Vec::new();
    for pod in 0..200 {
        let name = format!("finder-{pod}");
        let target = s.agent.target(&name);
        let mut p = PodVolume::new("shop", &name, "storm-find");
        p.service_account = "finder".into();
        p.tokens_json = Some(tokens());
        let req = p.publish_request(&volume_id_for(&target), &target);
        let mut node = s.agent.node().await;
        tasks.push(tokio::spawn(async move {
            node.node_publish_volume(req).await.map(|_| target)
        }));
    }
    for t in tasks {
        let target = t.await.unwrap().unwrap();
        assert_eq!(read(&target, "db/password"), DB_PASSWORD.as_bytes());
        assert_eq!(mode(&target, "api"), 0o555);
    }
    assert_eq!(
        s.provider.calls().len(),
        2,
        "200 more pods, dataFrom.find on one store as one service account: one more Mount call"
    );
    assert_no_leak(&s.agent, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_publish_secret_is_sent_as_the_mount_secrets_and_a_missing_one_is_named() {
    let s = setup().await;
    let t = publish(&s.agent, "creds", "creds", "creds").await.unwrap();
    assert_eq!(read(&t, "db/password"), DB_PASSWORD.as_bytes());
    let calls = s.provider.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let sent: std::collections::BTreeMap<String, String> =
        serde_json::from_str(calls[0]["secrets"].as_str().unwrap()).unwrap();
    assert_eq!(
        sent,
        [
            ("clientid".to_string(), "shop-client".to_string()),
            ("clientsecret".to_string(), CLIENT_SECRET.to_string()),
        ]
        .into(),
        "every key of the Secret, as the driver sends a nodePublishSecretRef"
    );

    let err = publish(&s.agent, "no-creds", "no-creds", "no-creds")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    for want in [
        "nodePublishSecretRef",
        "credential Secret shop/not-there not found",
        "SecretStore \"no-creds\"",
    ] {
        assert!(
            err.message().contains(want),
            "{:?} lacks {want:?}",
            err.message()
        );
    }
    assert_eq!(
        s.provider.calls().len(),
        1,
        "no Mount without its credentials"
    );
    assert_no_leak(&s.agent, err.message());
}

/// In a cluster, a SecretStore's `nodePublishSecretRef` Secret is read as the pod, with its
/// token: a pod whose service account may not read it gets no Mount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_the_node_publish_secret_is_read_as_the_pod() {
    use serde_json::json;
    use support::apiserver::{FakeApiServer, Identity};
    const AGENT_TOKEN: &str = "agent-token-sscsi-e2e";
    const WEB_TOKEN: &str = "eyJ.web-sscsi-e2e.sig";
    const OTHER: &str = "eyJ.intruder-sscsi-e2e.sig";
    require_root();
    let provider = Provider::start().await;
    let server = FakeApiServer::start().await;
    server.add_identity(AGENT_TOKEN, Identity::Agent);
    server.add_identity(WEB_TOKEN, Identity::service_account("shop", "web"));
    server.add_identity(OTHER, Identity::service_account("shop", "intruder"));
    server.allow_roles_of(Identity::Agent, "daemonset/base/rbac.yaml");
    server.allow(
        Identity::service_account("shop", "web"),
        "get",
        "",
        "secrets",
        Some("shop"),
    );
    for ns in ["shop", "latchkey"] {
        server.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    server.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "provider-creds", "namespace": "shop"},
        "stringData": {"clientsecret": CLIENT_SECRET}}));
    server.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "SecretStore",
        "metadata": {"name": "creds", "namespace": "shop"},
        "spec": {"provider": {"secretsStoreCSI": {"provider": "files",
                 "nodePublishSecretRef": {"name": "provider-creds"}}}}}),
    );
    server.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
        "metadata": {"name": "creds", "namespace": "shop"},
        "spec": {"secretStoreRef": {"name": "creds"},
                 "data": [{"secretKey": "password", "remoteRef": {"key": "db/password"}}]}}),
    );
    let dir = provider.dir.display().to_string();
    let agent = Agent::start_in_cluster(
        &server.kubeconfig_yaml(AGENT_TOKEN),
        &["--secrets-store-provider-dir", &dir],
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while agent.http_get("/readyz").await.0 != 200 {
        assert!(
            Instant::now() < deadline,
            "never ready:\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let publish_as = |pod: &str, sa: &str, token: &str| {
        let target = agent.target(pod);
        let mut p = PodVolume::new("shop", pod, "creds");
        p.service_account = sa.into();
        p.tokens_json = Some(format!(r#"{{"":{{"token":"{token}"}}}}"#));
        (p.publish_request(&volume_id_for(&target), &target), target)
    };

    let (req, target) = publish_as("web-0", "web", WEB_TOKEN);
    agent.node().await.node_publish_volume(req).await.unwrap();
    assert_eq!(read(&target, "password"), DB_PASSWORD.as_bytes());
    let calls = provider.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let sent: std::collections::BTreeMap<String, String> =
        serde_json::from_str(calls[0]["secrets"].as_str().unwrap()).unwrap();
    assert_eq!(sent["clientsecret"], CLIENT_SECRET);

    let (req, _) = publish_as("intruder-0", "intruder", OTHER);
    let err = agent
        .node()
        .await
        .node_publish_volume(req)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("nodePublishSecretRef"),
        "{:?}",
        err.message()
    );
    assert_eq!(
        provider.calls().len(),
        1,
        "no Mount without its credentials"
    );
    assert_no_leak(&agent, err.message());
}
