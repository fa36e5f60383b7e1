//! End to end with a real secret-store plugin: the `latchkey node` binary, the `plugin-file`
//! example (ess.proto.v1alpha1) on a real unix socket, real tmpfs mounts. Values, properties,
//! extract, every error a plugin can cause (not found, denied, slow, crashed, oversize, garbage),
//! the socket directory rule, the mount storm, and that no value reaches a log or a status.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use latchkey::csi::client::{PodVolume, volume_id_for};
use support::{Agent, require_root};
use tonic::Code;

const DB_PASSWORD: &str = "plugin-db-password-e2e-7731";
const API_KEY: &str = "plugin-api-key-e2e-9154";
const BINARY: &[u8] = &[0xff, 0xfe, 0x00, 0x42, 0x80];

/// The example plugin, built by Cargo with this test (`[[example]]` of the agent crate).
fn plugin_binary() -> PathBuf {
    // target/debug/deps/plugin-<hash> -> target/debug/examples/plugin-file
    let exe = std::env::current_exe().expect("the test binary's path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary is in target/<profile>/deps")
        .join("examples")
        .join("plugin-file");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p latchkey --example plugin-file` (cargo test \
         builds it too)",
        bin.display()
    );
    bin
}

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
        let socket = socket_dir.join("files.sock");
        let calls = dir.path().join("calls.log");
        let crash_file = dir.path().join("crash");
        let child = Command::new(plugin_binary())
            .arg("--socket")
            .arg(&socket)
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
        while !socket.exists() {
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
    out += &store(
        "outside",
        &format!("unix://{}", outside.join("evil.sock").display()),
        "",
    );
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
    outside: tokio::net::UnixListener,
    _outside_dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    require_root();
    let plugin = Plugin::start().await;
    let outside_dir = tempfile::tempdir().unwrap();
    let outside = tokio::net::UnixListener::bind(outside_dir.path().join("evil.sock")).unwrap();
    // A link in the plugin directory to the socket outside it.
    std::os::unix::fs::symlink(
        outside_dir.path().join("evil.sock"),
        plugin.socket_dir.join("link.sock"),
    )
    .unwrap();
    let m = manifests(&plugin, outside_dir.path());
    let dir = plugin.socket_dir.display().to_string();
    let agent = Agent::start(&[("shop.yaml", &m)], &["--plugin-socket-dir", &dir]).await;
    Setup {
        agent,
        plugin,
        outside,
        _outside_dir: outside_dir,
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
    let s = setup().await;
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
    let accepted = tokio::time::timeout(Duration::from_millis(200), s.outside.accept()).await;
    assert!(
        accepted.is_err(),
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
