//! End to end with a real secret-store plugin: the `latchkey node` binary, the `plugin-file`
//! example on a real unix socket (latchkey.plugin.v1, or ess.proto.v1alpha1 only) and on TCP with
//! mutual TLS, real tmpfs mounts. Values, properties, extract, find, versions, the caller's
//! identity with only the listed audience's token, every error a plugin can cause (not found,
//! denied, slow, crashed, oversize, garbage, refused certificates), the socket directory rule,
//! the mount storm, and that no value or token reaches a log or a status.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use latchkey::csi::client::{PodVolume, volume_id_for};
use support::pki::Pki;
use support::store_forms::Form;
use support::{Agent, require_root};
use tonic::Code;

const DB_PASSWORD: &str = "plugin-db-password-e2e-7731";
const API_KEY: &str = "plugin-api-key-e2e-9154";
const BINARY: &[u8] = &[0xff, 0xfe, 0x00, 0x42, 0x80];
const OLD_API_KEY: &str = "plugin-old-api-key-e2e-4410";
const TEAM_A: &str = "plugin-team-a-e2e-5120";
const TEAM_B: &str = "plugin-team-b-e2e-6231";
/// The pod's tokens: the plugin's audience, and one it must never get.
const PLUGIN_TOKEN: &str = "eyJhbGciOiJub25lIn0.plugin-audience-token-e2e-8812";
const OTHER_TOKEN: &str = "eyJhbGciOiJub25lIn0.other-audience-token-e2e-9923";

/// A running `plugin-file` and its scratch space.
struct Plugin {
    child: Option<Child>,
    /// The allowed plugin socket directory (the agent's `--plugin-socket-dir`).
    socket_dir: PathBuf,
    /// The plugin's socket, in `socket_dir`.
    socket: PathBuf,
    /// One line per GetSecret call.
    calls: PathBuf,
    /// While this file exists, the plugin exits in the middle of a call.
    crash_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Plugin {
    async fn start() -> Self {
        Self::start_with(&[], None).await
    }

    /// A plugin with `extra` flags, on TCP `listen` (a `host:port`, with its TLS flags in
    /// `extra`) instead of the socket when given.
    async fn start_with(extra: &[&str], listen: Option<&str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket_dir = dir.path().join("plugins");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&socket_dir).unwrap();
        std::fs::create_dir_all(data.join("nested")).unwrap();
        std::fs::write(
            data.join("db"),
            format!(r#"{{"username":"shop","password":"{DB_PASSWORD}"}}"#),
        )
        .unwrap();
        std::fs::write(data.join("api"), API_KEY).unwrap();
        std::fs::write(data.join("nested/api"), API_KEY).unwrap();
        std::fs::write(data.join("bin"), BINARY).unwrap();
        // Version v1 of `api` (the plugin's `<name>@<version>` convention), and two of a kind
        // for `dataFrom.find`.
        std::fs::write(data.join("api@v1"), OLD_API_KEY).unwrap();
        std::fs::write(data.join("team-a"), TEAM_A).unwrap();
        std::fs::write(data.join("team-b"), TEAM_B).unwrap();
        let socket = socket_dir.join("files.sock");
        let calls = dir.path().join("calls.log");
        let crash_file = dir.path().join("crash");
        let mut command = Command::new(support::example_binary("plugin-file"));
        match listen {
            Some(address) => command.args(["--listen", address]),
            None => command.arg("--socket").arg(&socket),
        };
        let child = command
            .args(extra)
            .arg("--dir")
            .arg(&data)
            .arg("--calls")
            .arg(&calls)
            .arg("--crash-when")
            .arg(&crash_file)
            .args(["--misbehave", "--delay", "5s"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start plugin-file");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let up = match listen {
                Some(address) => tokio::net::TcpStream::connect(address).await.is_ok(),
                None => socket.exists(),
            };
            if up {
                break;
            }
            assert!(Instant::now() < deadline, "plugin-file did not listen");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self {
            child: Some(child),
            socket_dir,
            socket,
            calls,
            crash_file,
            _dir: dir,
        }
    }

    fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    fn calls(&self) -> usize {
        std::fs::read_to_string(&self.calls)
            .unwrap_or_default()
            .lines()
            .count()
    }

    /// Waits for the plugin to have exited (it crashes on purpose in one test).
    fn wait_exited(&mut self) {
        let mut child = self.child.take().expect("plugin running");
        child.wait().unwrap();
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A SecretStore `name` for `endpoint`, with extra lines under `plugin:`.
fn store(name: &str, endpoint: &str, extra: &str) -> String {
    format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {{name: {name}, namespace: shop}}\n\
         spec:\n  provider:\n    plugin:\n      endpoint: {endpoint:?}\n{extra}"
    )
}

/// An ExternalSecret `name` on store `store` reading `key` (with a `property` if not empty).
fn es(name: &str, store: &str, key: &str, property: &str) -> String {
    let property = if property.is_empty() {
        String::new()
    } else {
        format!(", property: {property}")
    };
    format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {{name: {name}, namespace: shop}}\n\
         spec:\n  secretStoreRef: {{name: {store}}}\n  data: [{{secretKey: value, remoteRef: {{key: {key:?}{property}}}}}]\n"
    )
}

fn manifests(plugin: &Plugin, outside: &Path) -> String {
    let ep = plugin.endpoint();
    let mut out = store(
        "files",
        &ep,
        "      timeout: 2s\n      configRef: {apiVersion: files.example/v1, kind: FileConfig, name: main}\n",
    );
    out += &store("quick", &ep, "      timeout: 300ms\n");
    out += &store(
        "containerd",
        "unix:///var/run/containerd/containerd.sock",
        "",
    );
    out += &store("dotdot", "unix://../x.sock", "");
    out += &store("outside", &format!("unix://{}", outside.display()), "");
    out += &store(
        "link",
        &format!("unix://{}", plugin.socket_dir.join("link.sock").display()),
        "",
    );
    out += r#"---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: app, namespace: shop}
spec:
  secretStoreRef: {name: files}
  refreshInterval: 200ms
  data:
  - {secretKey: password, remoteRef: {key: db, property: password}}
  - {secretKey: api, remoteRef: {key: nested/api, property: value}}
  - {secretKey: whole, remoteRef: {key: db}}
  - {secretKey: bin, remoteRef: {key: bin}}
  dataFrom:
  - extract: {key: db}
"#;
    out += &es("storm", "files", "api", "value");
    out += &es("missing", "files", "nope", "");
    out += &es("denied", "files", "denied/db", "");
    out += &es("slow", "quick", "slow/db", "");
    out += &es("huge", "files", "huge/db", "");
    out += &es("garbage", "files", "garbage/db", "");
    out += &es("containerd", "containerd", "db", "");
    out += &es("dotdot", "dotdot", "db", "");
    out += &es("outside", "outside", "db", "");
    out += &es("link", "link", "db", "");
    out
}

/// The agent and the plugin, with a socket outside the plugin directory that must never be
/// connected to.
struct Setup {
    agent: Agent,
    plugin: Plugin,
    outside: support::OutsideSocket,
}

async fn setup() -> Setup {
    setup_as(Form::Inline).await
}

/// [`setup`] with the stores in `form`.
async fn setup_as(form: Form) -> Setup {
    require_root();
    let plugin = Plugin::start().await;
    let outside = support::OutsideSocket::linked_from(&plugin.socket_dir);
    let m = form.manifests(&manifests(&plugin, &outside.path));
    let dir = plugin.socket_dir.display().to_string();
    let agent = Agent::start(&[("shop.yaml", &m)], &["--plugin-socket-dir", &dir]).await;
    Setup {
        agent,
        plugin,
        outside,
    }
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
    let req = p.publish_request(&volume_id_for(&target), &target);
    agent.node().await.node_publish_volume(req).await?;
    Ok(target)
}

fn read(target: &Path, file: &str) -> Vec<u8> {
    std::fs::read(target.join(file)).unwrap()
}

fn assert_no_leak(agent: &Agent, text: &str) {
    let log = agent.log_text();
    for secret in [DB_PASSWORD, API_KEY] {
        assert!(!text.contains(secret), "a status leaks a value: {text}");
        assert!(!log.contains(secret), "the agent log leaks a value");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_properties_and_extract_come_from_the_plugin() {
    values_properties_and_extract_come_from_the_plugin_as(Form::Inline).await;
}

/// The same with the store naming a provider object (issue #41).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_properties_and_extract_come_from_the_plugin_by_provider_ref() {
    values_properties_and_extract_come_from_the_plugin_as(Form::ByReference).await;
}

async fn values_properties_and_extract_come_from_the_plugin_as(form: Form) {
    let s = setup_as(form).await;
    let t = publish(&s.agent, "app", "default", "app").await.unwrap();
    assert_eq!(read(&t, "password"), DB_PASSWORD.as_bytes());
    assert_eq!(read(&t, "api"), API_KEY.as_bytes());
    assert_eq!(read(&t, "username"), b"shop", "extract yields every entry");
    assert_eq!(
        read(&t, "bin"),
        BINARY,
        "a single non-UTF-8 entry is mounted as it is"
    );
    let whole: serde_json::Value = serde_json::from_slice(&read(&t, "whole")).unwrap();
    assert_eq!(
        whole,
        serde_json::json!({"password": DB_PASSWORD, "username": "shop"}),
        "a whole value is the JSON object of the entries"
    );
    // Three remote keys (db serves three items): three calls.
    let (_, metrics) = s.agent.http_get("/metrics").await;
    assert!(
        metrics.contains(
            "latchkey_backend_requests_total{provider=\"plugin\",operation=\"get\",result=\"success\"} 3"
        ),
        "{metrics}"
    );
    assert_no_leak(&s.agent, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_errors_map_to_the_codes_of_built_in_providers() {
    let s = setup().await;
    let ep = s.plugin.endpoint();
    let cases: [(&str, Code, &[&str]); 5] = [
        (
            "missing",
            Code::FailedPrecondition,
            &["not found", "\"nope\""],
        ),
        (
            "denied",
            Code::PermissionDenied,
            &["PERMISSION_DENIED", &ep],
        ),
        (
            "slow",
            Code::DeadlineExceeded,
            &["did not answer within 300ms", &ep],
        ),
        (
            "huge",
            Code::Unavailable,
            &["larger than the 16 MiB limit", &ep],
        ),
        ("garbage", Code::Unavailable, &["DATA_LOSS", "garbled", &ep]),
    ];
    for (name, code, wants) in cases {
        // One service account each: a transient failure makes that identity back off.
        let err = publish(&s.agent, name, name, name).await.unwrap_err();
        assert_eq!(err.code(), code, "{name}: {err:?}");
        let message = err.message();
        assert!(message.contains("SecretStore \"files\"") || message.contains("\"quick\""));
        for want in wants {
            assert!(message.contains(want), "{name}: {message:?} lacks {want:?}");
        }
        assert!(
            !message.chars().any(char::is_control),
            "{name}: {message:?}"
        );
        assert!(!message.contains('\u{202e}'), "{name}: {message:?}");
        assert_no_leak(&s.agent, message);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_outside_the_plugin_directory_are_refused_without_connecting() {
    let s = setup().await;
    for (name, wants) in [
        ("containerd", "--plugin-socket-dir"),
        ("outside", "--plugin-socket-dir"),
        ("dotdot", "absolute socket path"),
        ("link", "symbolic link"),
    ] {
        let err = publish(&s.agent, name, "default", name).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{name}: {err:?}");
        assert!(
            err.message().contains(wants),
            "{name}: {:?} lacks {wants:?}",
            err.message()
        );
    }
    assert!(
        !s.outside.was_reached().await,
        "the agent connected to a socket outside the plugin directory"
    );
    assert_eq!(s.plugin.calls(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_crashing_mid_call_keeps_mounted_content_and_names_store_and_plugin() {
    let mut s = setup().await;
    let t = publish(&s.agent, "app", "default", "app").await.unwrap();
    assert_eq!(read(&t, "password"), DB_PASSWORD.as_bytes());

    std::fs::write(&s.plugin.crash_file, "").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Due, and the plugin dies in the middle of the call: the volume keeps its content.
    publish(&s.agent, "app", "default", "app")
        .await
        .expect("a failed refresh is not a failed publish");
    s.plugin.wait_exited();
    assert_eq!(read(&t, "password"), DB_PASSWORD.as_bytes());
    assert_eq!(read(&t, "username"), b"shop");
    assert!(
        s.agent
            .log_text()
            .contains("refresh failed; keeping the previous content"),
        "{}",
        s.agent.log_text()
    );

    // A new identity (no cache, no backoff shared): the plugin is gone.
    let err = publish(&s.agent, "fresh", "other", "app")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    for want in ["SecretStore \"files\"", s.plugin.endpoint().as_str()] {
        assert!(
            err.message().contains(want),
            "{:?} lacks {want:?}",
            err.message()
        );
    }
    assert_no_leak(&s.agent, err.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_storm_makes_one_plugin_call() {
    let s = setup().await;
    let mut tasks = Vec::new();
    for pod in 0..200 {
        let target = s.agent.target(&format!("storm-{pod}"));
        let p = PodVolume::new("shop", &format!("storm-{pod}"), "storm");
        let req = p.publish_request(&volume_id_for(&target), &target);
        let mut node = s.agent.node().await;
        tasks.push(tokio::spawn(async move {
            node.node_publish_volume(req).await.map(|_| target)
        }));
    }
    for t in tasks {
        let target = t.await.unwrap().unwrap();
        assert_eq!(read(&target, "value"), API_KEY.as_bytes());
    }
    assert_eq!(
        s.plugin.calls(),
        1,
        "200 pods on one remote key: one plugin call"
    );
    assert!(
        s.agent.metric(
            "latchkey_backend_requests_total{provider=\"plugin\",operation=\"get\",result=\"success\"}"
        )
        .await
            == 1.0
    );
    assert_no_leak(&s.agent, "");
}

/// Publishes `external_secret` for a pod with `tokens_json` (kubelet's tokens value).
async fn publish_with_tokens(
    agent: &Agent,
    pod: &str,
    external_secret: &str,
    tokens_json: &str,
) -> Result<PathBuf, tonic::Status> {
    let target = agent.target(pod);
    let mut p = PodVolume::new("shop", pod, external_secret);
    p.service_account = "web".into();
    p.tokens_json = Some(tokens_json.into());
    let req = p.publish_request(&volume_id_for(&target), &target);
    agent.node().await.node_publish_volume(req).await?;
    Ok(target)
}

fn text(target: &Path, file: &str) -> String {
    String::from_utf8(read(target, file)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latchkey_plugin_v1_passes_identity_with_only_the_listed_token_finds_and_reads_versions() {
    require_root();
    let plugin = Plugin::start_with(&[], None).await;
    let ep = plugin.endpoint();
    let mut m = store("ident", &ep, "      audiences: [plugin.example]\n");
    m += &store("plain", &ep, "");
    m += "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {name: whoami, namespace: shop}\n\
          spec:\n  secretStoreRef: {name: ident}\n  dataFrom:\n  - extract: {key: whoami/me}\n";
    m += "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {name: found, namespace: shop}\n\
          spec:\n  secretStoreRef: {name: plain}\n  dataFrom:\n  - find: {name: {regexp: \"^team-\"}}\n";
    m += "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {name: versions, namespace: shop}\n\
          spec:\n  secretStoreRef: {name: plain}\n  data:\n  - {secretKey: old, remoteRef: {key: api, version: v1, property: value}}\n  \
          - {secretKey: current, remoteRef: {key: api, property: value}}\n";
    let dir = plugin.socket_dir.display().to_string();
    let agent = Agent::start(&[("shop.yaml", &m)], &["--plugin-socket-dir", &dir]).await;
    let tokens = format!(
        r#"{{"plugin.example":{{"token":"{PLUGIN_TOKEN}","expirationTimestamp":"2030-01-01T00:00:00Z"}},"other":{{"token":"{OTHER_TOKEN}"}}}}"#
    );

    let t = publish_with_tokens(&agent, "web-0", "whoami", &tokens)
        .await
        .unwrap();
    assert_eq!(text(&t, "namespace"), "shop");
    assert_eq!(text(&t, "pod"), "web-0");
    assert_eq!(text(&t, "serviceAccount"), "web");
    assert_eq!(
        text(&t, "audiences"),
        "plugin.example",
        "only the listed audience"
    );
    assert_eq!(text(&t, "token.plugin.example"), PLUGIN_TOKEN);
    assert!(
        !t.join("token.other").exists(),
        "a token of another audience reached the plugin"
    );

    let t = publish_with_tokens(&agent, "web-1", "found", &tokens)
        .await
        .unwrap();
    let a: serde_json::Value = serde_json::from_slice(&read(&t, "team-a")).unwrap();
    let b: serde_json::Value = serde_json::from_slice(&read(&t, "team-b")).unwrap();
    assert_eq!(
        (a["value"].as_str(), b["value"].as_str()),
        (Some(TEAM_A), Some(TEAM_B))
    );
    assert!(
        !t.join("api").exists(),
        "find returned a name outside its regexp"
    );

    let t = publish_with_tokens(&agent, "web-2", "versions", &tokens)
        .await
        .unwrap();
    assert_eq!(text(&t, "old"), OLD_API_KEY);
    assert_eq!(text(&t, "current"), API_KEY);

    let calls = std::fs::read_to_string(&plugin.calls).unwrap();
    assert!(
        calls.contains("GetSecret \"whoami/me\"") || calls.contains("GetSecret whoami/me"),
        "{calls}"
    );
    assert!(
        calls.contains("caller=shop/web pod=web-0 audiences=[plugin.example]"),
        "{calls}"
    );
    assert!(calls.contains("ListSecrets path= regexp=^team-"), "{calls}");
    assert!(calls.contains("version=v1"), "{calls}");
    let log = agent.log_text();
    for secret in [
        PLUGIN_TOKEN,
        OTHER_TOKEN,
        API_KEY,
        OLD_API_KEY,
        TEAM_A,
        TEAM_B,
    ] {
        assert!(
            !log.contains(secret),
            "the agent log leaks a token or value"
        );
        assert!(
            !calls.contains(secret),
            "the call record holds a token or value"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ess_only_plugin_is_called_with_ess_after_the_handshake_fails() {
    require_root();
    let plugin = Plugin::start_with(&["--ess-only"], None).await;
    let ep = plugin.endpoint();
    let mut m = store("ess", &ep, "");
    m += &store("ident", &ep, "      audiences: [plugin.example]\n");
    m += &es("value", "ess", "db", "password");
    m += &es("ident", "ident", "db", "password");
    m += "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {name: found, namespace: shop}\n\
          spec:\n  secretStoreRef: {name: ess}\n  dataFrom:\n  - find: {name: {regexp: \"^team-\"}}\n";
    m += "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {name: versioned, namespace: shop}\n\
          spec:\n  secretStoreRef: {name: ess}\n  data:\n  - {secretKey: old, remoteRef: {key: api, version: v1}}\n";
    let dir = plugin.socket_dir.display().to_string();
    let agent = Agent::start(&[("shop.yaml", &m)], &["--plugin-socket-dir", &dir]).await;
    let t = publish(&agent, "a", "a", "value").await.unwrap();
    assert_eq!(read(&t, "value"), DB_PASSWORD.as_bytes());
    for (es, wants) in [
        ("found", "cannot list secrets"),
        ("versioned", "remoteRef.version is not available"),
        ("ident", "plugin.audiences"),
    ] {
        let err = publish(&agent, es, es, es).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{es}: {err:?}");
        assert!(
            err.message().contains(wants),
            "{es}: {:?} lacks {wants:?}",
            err.message()
        );
    }
    assert_no_leak(&agent, "");
}

/// A free TCP port on 127.0.0.1.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `kubernetes.io/tls` Secret `name` in `shop`.
fn tls_secret(name: &str, cert: &str, key: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: shop}}\ntype: kubernetes.io/tls\n\
         stringData:\n  tls.crt: {cert:?}\n  tls.key: {key:?}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_over_tcp_works_and_refuses_wrong_certificates() {
    require_root();
    latchkey::tls::install_crypto_provider();
    let pki = Pki::new("plugin test CA");
    let rogue = Pki::new("rogue CA");
    let (server_cert, server_key) = pki.issue(&["127.0.0.1", "localhost"]);
    let (client_cert, client_key) = pki.issue(&["latchkey-agent"]);
    let (rogue_cert, rogue_key) = rogue.issue(&["latchkey-agent"]);
    let certs = tempfile::tempdir().unwrap();
    let write = |name: &str, pem: &str| {
        let path = certs.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path.display().to_string()
    };
    let (cert_path, key_path, ca_path) = (
        write("server.crt", &server_cert),
        write("server.key", &server_key),
        write("ca.crt", &pki.ca),
    );
    let address = format!("127.0.0.1:{}", free_port());
    let plugin = Plugin::start_with(
        &[
            "--tls-cert",
            &cert_path,
            "--tls-key",
            &key_path,
            "--client-ca",
            &ca_path,
        ],
        Some(&address),
    )
    .await;
    let tls = |ca: &str, secret: &str| {
        format!(
            "      tls:\n        caBundle: {ca:?}\n        clientCertSecretRef: {{name: {secret}}}\n"
        )
    };
    let mut m = store("good", &address, &tls(&pki.ca, "client"));
    m += &store("wrong-client", &address, &tls(&pki.ca, "rogue"));
    m += &store("wrong-ca", &address, &tls(&rogue.ca, "client"));
    m += &store(
        "no-client",
        &address,
        &format!("      tls: {{caBundle: {:?}}}\n", pki.ca),
    );
    // The roots from a ConfigMap key (`caProvider`) instead of inline.
    let from_map = |map: &str| {
        format!(
            "      tls:\n        caProvider: {{type: ConfigMap, name: {map}, key: ca.crt}}\n        \
             clientCertSecretRef: {{name: client}}\n"
        )
    };
    m += &store("good-map", &address, &from_map("plugin-ca"));
    m += &store("wrong-map", &address, &from_map("rogue-ca"));
    for (name, ca) in [("plugin-ca", &pki.ca), ("rogue-ca", &rogue.ca)] {
        m += &format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: shop}}\n\
             data:\n  ca.crt: {ca:?}\n"
        );
    }
    m += &tls_secret("client", &client_cert, &client_key);
    m += &tls_secret("rogue", &rogue_cert, &rogue_key);
    for name in [
        "good",
        "wrong-client",
        "wrong-ca",
        "no-client",
        "good-map",
        "wrong-map",
    ] {
        m += &es(name, name, "api", "value");
    }
    let dir = plugin.socket_dir.display().to_string();
    let agent = Agent::start(&[("shop.yaml", &m)], &["--plugin-socket-dir", &dir]).await;

    for good in ["good", "good-map"] {
        let t = publish(&agent, good, good, good).await.unwrap();
        assert_eq!(read(&t, "value"), API_KEY.as_bytes());
    }

    for (name, code, wants) in [
        (
            "wrong-client",
            Code::PermissionDenied,
            "the plugin refused the connection",
        ),
        (
            "no-client",
            Code::PermissionDenied,
            "the plugin refused the connection",
        ),
        ("wrong-ca", Code::Unavailable, "certificate is not trusted"),
        ("wrong-map", Code::Unavailable, "certificate is not trusted"),
    ] {
        let err = publish(&agent, name, name, name).await.unwrap_err();
        assert_eq!(err.code(), code, "{name}: {err:?}");
        for want in [wants, address.as_str()] {
            assert!(
                err.message().contains(want),
                "{name}: {:?} lacks {want:?}",
                err.message()
            );
        }
        for key in [&client_key, &rogue_key] {
            let body = key.lines().nth(1).unwrap();
            assert!(!err.message().contains(body), "a private key in a status");
            assert!(!agent.log_text().contains(body), "a private key in the log");
        }
        assert_no_leak(&agent, err.message());
    }
    // Only the good connections reached the service.
    assert_eq!(plugin.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_authorizes_on_the_callers_namespace() {
    require_root();
    let allow = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(allow.path(), r#"{"shop": ["team-"], "billing": ["db"]}"#).unwrap();
    let allow_path = allow.path().display().to_string();
    let plugin = Plugin::start_with(&["--allow", &allow_path], None).await;
    let ep = plugin.endpoint();
    let mut m = store("files", &ep, "");
    m += &es("mine", "files", "team-a", "value");
    m += &es("theirs", "files", "db", "password");
    let dir = plugin.socket_dir.display().to_string();
    let agent = Agent::start(&[("shop.yaml", &m)], &["--plugin-socket-dir", &dir]).await;
    let t = publish(&agent, "mine", "mine", "mine").await.unwrap();
    assert_eq!(read(&t, "value"), TEAM_A.as_bytes());
    let err = publish(&agent, "theirs", "theirs", "theirs")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message()
            .contains(r#"namespace "shop" may not read "db""#),
        "{}",
        err.message()
    );
    assert_no_leak(&agent, err.message());
}

/// A tenant's plugin answering `map<string, bytes>` with a million tiny entries (14 MB, under
/// the 16 MiB cap): prost built the map before anything was checked (224 MB for a plain `data`,
/// 411 MB with `dataFrom.extract`). Now the entries are counted on the wire before decoding:
/// both publishes fail RESOURCE_EXHAUSTED naming store, key and the limit, the agent's peak RSS
/// (as a release build's) stays under 64 MiB, and the plugin's other secrets still mount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_answer_of_a_million_entries_is_refused_before_it_is_decoded() {
    require_root();
    let plugin = Plugin::start().await;
    let members: Vec<String> = (0..1_000_000)
        .map(|i| format!("\"k{i:06}\":\"v\""))
        .collect();
    let many = format!("{{{}}}", members.join(","));
    drop(members);
    for name in ["many-data", "many-extract"] {
        std::fs::write(plugin._dir.path().join("data").join(name), &many).unwrap();
    }
    drop(many);
    let mut m = store("files", &plugin.endpoint(), "      timeout: 20s\n");
    m += &es("app", "files", "db", "password");
    m += &es("many-data", "files", "many-data", "");
    m += "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\n\
          metadata: {name: many-extract, namespace: shop}\n\
          spec:\n  secretStoreRef: {name: files}\n  dataFrom:\n  - extract: {key: many-extract}\n";
    let dir = plugin.socket_dir.display().to_string();
    let agent = Agent::start(&[("shop.yaml", &m)], &["--plugin-socket-dir", &dir]).await;
    let baseline = agent.peak_rss_mib();
    let (data, extract) = tokio::join!(
        publish(&agent, "data", "default", "many-data"),
        publish(&agent, "extract", "default", "many-extract"),
    );
    let peak = agent.peak_rss_mib();
    let as_release = agent.peak_over_release_idle_mib(baseline);
    eprintln!("peak RSS {peak} MiB (baseline {baseline} MiB, as a release build {as_release} MiB)");
    for (es, result) in [("many-data", data), ("many-extract", extract)] {
        let err = result.unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted, "{es}: {err:?}");
        assert!(
            err.message().contains(&format!(
                "namespace \"shop\", ExternalSecret \"{es}\", SecretStore \"files\", remote key \"{es}\""
            )) && err.message().contains("answer holds more than 10000"),
            "{es}: {}",
            err.message()
        );
        assert!(!err.message().contains("k000"), "{}", err.message());
    }
    // tonic holds each message whole (up to the 16 MiB cap) before the codec counts it.
    assert!(
        as_release < 64,
        "peak RSS {peak} MiB (baseline {baseline} MiB, as a release build {as_release} MiB)"
    );
    let t = publish(&agent, "app", "default", "app").await.unwrap();
    assert_eq!(read(&t, "value"), DB_PASSWORD.as_bytes());
}
