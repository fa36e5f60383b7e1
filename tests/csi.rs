//! End to end over the real socket: the `latchkey node` binary, the generated CSI client, real
//! tmpfs mounts. Covers every RPC, every publish error code, idempotency, cleanup after failure,
//! and that no secret value reaches a log line or a status message.

mod support;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use csi_proto::v1::controller_service_capability::{Type as CType, rpc};
use csi_proto::v1::node_service_capability;
use csi_proto::v1::volume_capability::{AccessType, BlockVolume};
use csi_proto::v1::{
    ControllerGetCapabilitiesRequest, CreateVolumeRequest, GetPluginCapabilitiesRequest,
    GetPluginInfoRequest, NodeGetCapabilitiesRequest, NodeGetInfoRequest,
    NodeGetVolumeStatsRequest, NodePublishVolumeRequest, NodeStageVolumeRequest, ProbeRequest,
};
use latchkey::csi::client::{PodVolume, unpublish_request, volume_id_for};
use support::{Agent, mounts_at};
use tonic::Code;

const DB_PASSWORD: &str = "hunter2-db-password-e2e";
const API_KEY: &str = "sk-test-api-key-e2e-4242";
const POD_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.pod-token-e2e.c2lnbmF0dXJl";

fn manifests(big_value_len: usize) -> String {
    let big = "Z".repeat(big_value_len);
    // Entry names from backend data (extract, find) are not schema-checked: the volume's path
    // rules are what stop them.
    let long = "x".repeat(300);
    let es = |name: &str, store: &str, kind: &str, data: &str| {
        format!(
            "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {{name: {name}, namespace: shop}}\n\
             spec:\n  secretStoreRef: {{name: {store}, kind: {kind}}}\n  data:\n{data}"
        )
    };
    let one = |secret_key: &str, key: &str, property: &str| {
        format!(
            "  - secretKey: {secret_key:?}\n    remoteRef: {{key: {key}, property: {property:?}}}\n"
        )
    };
    let mut out = format!(
        r#"apiVersion: latchkey.dev/v1alpha1
kind: SecretStore
metadata: {{name: fake, namespace: shop}}
spec:
  provider:
    fake:
      data:
      - {{key: db, value: '{{"username":"shop","password":"{DB_PASSWORD}"}}'}}
      - {{key: api, value: {API_KEY}}}
      - {{key: config, value: '{{"LOG_LEVEL":"debug","nested":{{"a":1}}}}'}}
      - {{key: big, value: {big}}}
      - {{key: long-names, value: '{{"{long}":"v"}}'}}
---
apiVersion: latchkey.dev/v1alpha1
kind: SecretStore
metadata: {{name: aws, namespace: shop}}
spec: {{provider: {{aws: {{region: eu-west-1}}}}}}
---
apiVersion: latchkey.dev/v1alpha1
kind: ClusterSecretStore
metadata: {{name: elsewhere}}
spec:
  provider: {{fake: {{data: [{{key: db, value: {DB_PASSWORD}}}]}}}}
  conditions: [{{namespaces: [billing]}}]
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {{name: app, namespace: shop}}
spec:
  secretStoreRef: {{name: fake}}
  refreshInterval: 100ms
  data:
  - {{secretKey: db-password, remoteRef: {{key: db, property: password}}}}
  - {{secretKey: api-key, remoteRef: {{key: api}}}}
  dataFrom:
  - extract: {{key: config}}
  target:
    files:
      defaultMode: 0440
      items:
      - {{key: db-password, path: db/password, mode: 0400}}
      - {{key: api-key, path: api-key}}
      - {{key: LOG_LEVEL, path: LOG_LEVEL}}
"#
    );
    // `app` with a refresh interval that a loaded machine cannot overrun between two
    // back-to-back publishes (the metrics test counts a "not due" republish).
    out += &out
        .rsplit_once("---\n")
        .expect("the app document is last")
        .1
        .replace("name: app,", "name: app-1s,")
        .replace("refreshInterval: 100ms", "refreshInterval: 1s")
        .replace("apiVersion:", "---\napiVersion:");
    out += r#"
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: too-long, namespace: shop}
spec:
  secretStoreRef: {name: fake}
  dataFrom: [{extract: {key: long-names}}]
"#;
    // (ExternalSecret, store, store kind, secretKey, remote key, property)
    let broken = [
        ("dotdot", "fake", "SecretStore", "../evil", "api", ""),
        ("absolute", "fake", "SecretStore", "/etc/evil", "api", ""),
        ("empty-segment", "fake", "SecretStore", "a//b", "api", ""),
        ("no-store", "nope", "SecretStore", "a", "api", ""),
        ("no-key", "fake", "SecretStore", "a", "missing-key", ""),
        ("no-property", "fake", "SecretStore", "a", "db", "nope"),
        ("big", "fake", "SecretStore", "big", "big", ""),
        ("denied", "elsewhere", "ClusterSecretStore", "a", "db", ""),
        ("aws-no-auth", "aws", "SecretStore", "a", "db", ""),
    ];
    for (name, store, kind, secret_key, key, property) in broken {
        out += &es(name, store, kind, &one(secret_key, key, property));
    }
    out
}

async fn agent() -> Agent {
    // 64 KiB volumes, and a 100 KiB value to overflow them.
    let m = manifests(100 * 1024);
    Agent::start(&[("shop.yaml", &m)], &["--volume-size-limit", "64Ki"]).await
}

/// What kubelet sends for pod `name`, including a projected service-account token.
fn publish_req(agent: &Agent, name: &str, external_secret: &str) -> NodePublishVolumeRequest {
    let target = agent.target(name);
    let mut pod = PodVolume::new("shop", name, external_secret);
    pod.tokens_json = Some(format!(r#"{{"vault":{{"token":"{POD_TOKEN}"}}}}"#));
    pod.publish_request(&volume_id_for(&target), &target)
}

fn assert_nothing_left(target: &Path) {
    assert_eq!(
        mounts_at(target),
        0,
        "a mount was left at {}",
        target.display()
    );
    assert!(!target.exists(), "{} was left behind", target.display());
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_and_informational_rpcs() {
    let agent = agent().await;
    let mut id = agent.identity().await;
    let info = id
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "csi.latchkey.dev");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    let caps = id
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap();
    assert!(
        caps.into_inner().capabilities.is_empty(),
        "no CONTROLLER_SERVICE advertised"
    );
    let probe = id.probe(ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));

    let mut node = agent.node().await;
    let info = node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "test-node");
    let caps = node
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    let rpcs: Vec<_> = caps
        .iter()
        .filter_map(|c| {
            let node_service_capability::Type::Rpc(r) = c.r#type.as_ref()?;
            Some(r.r#type)
        })
        .collect();
    assert_eq!(
        rpcs,
        [node_service_capability::rpc::Type::VolumeMountGroup as i32],
        "only VOLUME_MOUNT_GROUP: kubelet passes fsGroup, no staging"
    );
    let stage = node
        .node_stage_volume(NodeStageVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(stage.code(), Code::Unimplemented);
    let stats = node
        .node_get_volume_stats(NodeGetVolumeStatsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(stats.code(), Code::Unimplemented);

    let mut ctrl = agent.controller().await;
    let caps = ctrl
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(
        caps.len(),
        1,
        "exactly one capability, so conformance tools see a list"
    );
    match &caps[0].r#type {
        Some(CType::Rpc(r)) => assert_eq!(r.r#type, rpc::Type::Unknown as i32),
        other => panic!("unexpected capability {other:?}"),
    }
    let create = ctrl
        .create_volume(CreateVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(create.code(), Code::Unimplemented);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_mounts_a_tmpfs_with_the_files_and_unpublish_removes_it() {
    let agent = agent().await;
    let mut node = agent.node().await;
    let req = publish_req(&agent, "web-0", "app");
    let target = agent.target("web-0");
    node.node_publish_volume(req.clone()).await.unwrap();

    let m = latchkey::volume::mountinfo::find(&target)
        .unwrap()
        .expect("target is a mount");
    assert_eq!(m.fstype, "tmpfs");
    // The pod's namespace is recorded in the source, for the volume budget after a restart.
    assert_eq!(m.source, "latchkey/shop");
    for opt in ["nosuid", "nodev", "noexec"] {
        assert!(
            m.has_mount_option(opt),
            "missing {opt}: {:?}",
            m.mount_options
        );
    }
    let size_kib: u64 = m
        .super_option("size")
        .unwrap()
        .trim_end_matches('k')
        .parse()
        .unwrap();
    assert!(
        (128..256).contains(&size_kib),
        "size {size_kib}k: twice the 64Ki limit plus slack"
    );
    assert_eq!(m.super_option("mode"), Some("755"));

    assert_eq!(
        std::fs::metadata(&target).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    assert_eq!(read(&target.join("db/password")), DB_PASSWORD);
    assert_eq!(read(&target.join("api-key")), API_KEY);
    assert_eq!(read(&target.join("LOG_LEVEL")), "debug");
    assert!(!target.join("nested").exists(), "items select keys");
    let mode = |p: &str| {
        std::fs::metadata(target.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("db/password"), 0o400);
    assert_eq!(mode("api-key"), 0o440);
    assert!(
        std::fs::symlink_metadata(target.join("..data"))
            .unwrap()
            .file_type()
            .is_symlink()
    );

    // Idempotent: same volume again -> success, still exactly one mount, same content.
    node.node_publish_volume(req.clone()).await.unwrap();
    assert_eq!(mounts_at(&target), 1);
    assert_eq!(read(&target.join("api-key")), API_KEY);

    let unreq = unpublish_request(&req.volume_id, &target);
    node.node_unpublish_volume(unreq.clone()).await.unwrap();
    assert_nothing_left(&target);
    // Unpublishing again, or a target that never existed, succeeds.
    node.node_unpublish_volume(unreq).await.unwrap();
    let never = agent.target("never");
    node.node_unpublish_volume(unpublish_request("csi-never", &never))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_invalid_argument_and_write_nothing() {
    let agent = agent().await;
    let mut node = agent.node().await;
    let good = publish_req(&agent, "bad", "app");
    let target = agent.target("bad");
    // The good request with one change.
    let with = |change: &dyn Fn(&mut NodePublishVolumeRequest)| {
        let mut r = good.clone();
        change(&mut r);
        r
    };
    let cases: Vec<(&str, NodePublishVolumeRequest, &str)> = vec![
        (
            "no volume id",
            NodePublishVolumeRequest {
                volume_id: String::new(),
                ..good.clone()
            },
            "volume_id is required",
        ),
        (
            "no target",
            NodePublishVolumeRequest {
                target_path: String::new(),
                ..good.clone()
            },
            "target_path is required",
        ),
        (
            "relative target",
            NodePublishVolumeRequest {
                target_path: "rel/x".into(),
                ..good.clone()
            },
            "absolute",
        ),
        (
            "no capability",
            NodePublishVolumeRequest {
                volume_capability: None,
                ..good.clone()
            },
            "volume_capability is required",
        ),
        (
            "block",
            with(&|r| {
                r.volume_capability.as_mut().unwrap().access_type =
                    Some(AccessType::Block(BlockVolume {}));
            }),
            "block volumes are not supported",
        ),
        (
            "writable",
            NodePublishVolumeRequest {
                readonly: false,
                ..good.clone()
            },
            "readOnly: true",
        ),
        (
            "no externalSecret",
            with(&|r| {
                r.volume_context.remove("externalSecret");
            }),
            "externalSecret is required",
        ),
        (
            "typo attribute",
            with(&|r| {
                r.volume_context
                    .insert("externalSecrets".into(), "x".into());
            }),
            "unknown volume attribute \"externalSecrets\"",
        ),
        (
            "no pod info",
            with(&|r| {
                r.volume_context.remove("csi.storage.k8s.io/pod.namespace");
            }),
            "podInfoOnMount",
        ),
        (
            "non-numeric fsGroup",
            with(&|r| {
                if let Some(AccessType::Mount(m)) =
                    &mut r.volume_capability.as_mut().unwrap().access_type
                {
                    m.volume_mount_group = "wheel".into();
                }
            }),
            "volume_mount_group \"wheel\" is not a numeric group id",
        ),
        (
            "malformed tokens",
            with(&|r| {
                r.volume_context.insert(
                    "csi.storage.k8s.io/serviceAccount.tokens".into(),
                    format!("[\"{POD_TOKEN}\"]"),
                );
            }),
            "serviceAccount.tokens is not a JSON object",
        ),
    ];
    for (what, req, want) in cases {
        let err = node.node_publish_volume(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{what}: {err:?}");
        assert!(
            err.message().contains(want),
            "{what}: {:?} lacks {want:?}",
            err.message()
        );
        assert!(
            !err.message().contains(POD_TOKEN),
            "{what}: status leaks the token"
        );
        assert_nothing_left(&target);
    }
    assert!(
        !agent.log_text().contains(POD_TOKEN),
        "the agent log leaks the pod token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_errors_have_precise_codes_and_leave_nothing_behind() {
    let agent = agent().await;
    let mut node = agent.node().await;
    let cases = [
        // Bad secretKeys are refused with the ExternalSecret, by the same rule as the CRD's;
        // bad names from a backend (dataFrom) when the files are built ("too-long").
        (
            "dotdot",
            Code::FailedPrecondition,
            vec![
                "ExternalSecret \"dotdot\"",
                "spec.data[0].secretKey: must be a relative file path",
            ],
        ),
        (
            "absolute",
            Code::FailedPrecondition,
            vec!["spec.data[0].secretKey: must be a relative file path"],
        ),
        (
            "empty-segment",
            Code::FailedPrecondition,
            vec!["spec.data[0].secretKey: must be a relative file path"],
        ),
        ("too-long", Code::InvalidArgument, vec!["maximum"]),
        (
            "missing-es",
            Code::FailedPrecondition,
            vec![
                "namespace \"shop\"",
                "ExternalSecret \"missing-es\" not found",
            ],
        ),
        (
            "no-store",
            Code::FailedPrecondition,
            vec![
                "ExternalSecret \"no-store\"",
                "SecretStore \"nope\" not found",
            ],
        ),
        (
            "no-key",
            Code::FailedPrecondition,
            vec![
                "SecretStore \"fake\"",
                "remote key \"missing-key\"",
                "not found",
            ],
        ),
        (
            "no-property",
            Code::FailedPrecondition,
            vec!["remote key \"db\"", "property \"nope\" not found"],
        ),
        ("big", Code::ResourceExhausted, vec!["limit is 65536 bytes"]),
        (
            "denied",
            Code::PermissionDenied,
            vec![
                "ClusterSecretStore \"elsewhere\" does not admit",
                "not in namespaces",
            ],
        ),
        (
            "aws-no-auth",
            Code::FailedPrecondition,
            vec!["sets no auth", "agentIdentity"],
        ),
    ];
    for (es, code, wants) in cases {
        let req = publish_req(&agent, es, es);
        let target = agent.target(es);
        let err = node.node_publish_volume(req).await.unwrap_err();
        assert_eq!(err.code(), code, "{es}: {err:?}");
        for want in wants {
            assert!(
                err.message().contains(want),
                "{es}: {:?} lacks {want:?}",
                err.message()
            );
        }
        for secret in [DB_PASSWORD, API_KEY, POD_TOKEN, "ZZZZZZZZZZZZ"] {
            assert!(
                !err.message().contains(secret),
                "{es}: status leaks a value"
            );
        }
        assert_nothing_left(&target);
    }
    let log = agent.log_text();
    assert!(
        log.contains("publish failed"),
        "failures are logged:\n{log}"
    );
    for secret in [DB_PASSWORD, API_KEY, POD_TOKEN, "ZZZZZZZZZZZZ"] {
        assert!(!log.contains(secret), "the agent log leaks a secret value");
    }
}

/// The writer leaves out chmod/fchmod when the umask cannot have cleared a requested bit: under
/// a strict umask every mode must still come out exactly as asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modes_are_exact_whatever_the_agent_umask() {
    support::require_root();
    let m = manifests(16);
    let agent = Agent::start_under_umask(&[("shop.yaml", &m)], 0o077).await;
    let socket = std::fs::metadata(&agent.socket).unwrap();
    assert_eq!(socket.permissions().mode() & 0o777, 0o600);
    let mut node = agent.node().await;
    let req = publish_req(&agent, "strict", "app");
    let target = agent.target("strict");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    node.node_publish_volume(req.clone()).await.unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&target), 0o755, "volume root");
    assert_eq!(mode(&target.join("..data")), 0o755, "payload directory");
    assert_eq!(mode(&target.join("..data/db")), 0o755, "nested directory");
    assert_eq!(mode(&target.join("db/password")), 0o400);
    assert_eq!(mode(&target.join("api-key")), 0o440);
    assert_eq!(mode(&target.join("LOG_LEVEL")), 0o440);
    node.node_unpublish_volume(unpublish_request(&req.volume_id, &target))
        .await
        .unwrap();
    assert_nothing_left(&target);

    // A target whose parent is missing is made with its parents, whatever the umask.
    let req = publish_req(&agent, "deep/strict", "app");
    let deep = agent.target("deep/strict");
    node.node_publish_volume(req.clone()).await.unwrap();
    assert_eq!(mode(&deep), 0o755);
    assert_eq!(mode(deep.parent().unwrap()), 0o750);
    node.node_unpublish_volume(unpublish_request(&req.volume_id, &deep))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_is_root_only_and_removed_on_sigterm() {
    let mut agent = agent().await;
    let meta = std::fs::metadata(&agent.socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // The socket is bound in a private directory and moved into place: nothing of that is left.
    let beside: Vec<_> = std::fs::read_dir(agent.socket.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|name| name.to_string_lossy().starts_with(".lk"))
        .collect();
    assert!(beside.is_empty(), "left beside the socket: {beside:?}");
    let status = agent.stop();
    assert!(status.success(), "clean shutdown: {status}");
    assert!(!agent.socket.exists(), "socket removed on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_is_logged_before_the_agent_says_it_stopped() {
    let mut agent = agent().await;
    let mut node = agent.node().await;
    node.node_publish_volume(publish_req(&agent, "last", "app"))
        .await
        .unwrap();
    drop(node);
    assert!(agent.stop().success());
    // Read at once, not settled: the process has exited, so nothing it held is still to come.
    let log = std::fs::read_to_string(&agent.log).unwrap();
    let published = log
        .find("published")
        .unwrap_or_else(|| panic!("no line:\n{log}"));
    let stopped = log
        .rfind("stopped")
        .unwrap_or_else(|| panic!("no line:\n{log}"));
    assert!(published < stopped, "out of order:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_and_unpublish_lines_are_written_before_the_answer_and_survive_sigkill() {
    let mut agent = agent().await;
    let mut node = agent.node().await;
    let req = publish_req(&agent, "killed", "app");
    node.node_publish_volume(req.clone()).await.unwrap();
    let target = agent.target("killed");
    node.node_unpublish_volume(unpublish_request(&req.volume_id, &target))
        .await
        .unwrap();
    drop(node);
    // At once, as the OOM killer would: no time for anything still to be written.
    agent.kill9();
    let log = std::fs::read_to_string(&agent.log).unwrap();
    assert!(log.contains("published"), "no publish line:\n{log}");
    assert!(
        log.contains("volume unmounted"),
        "no unpublish line:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_still_running_at_sigterm_gets_the_grace_period_and_no_more() {
    let slow = "apiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {name: stuck, namespace: shop}\n\
                spec: {provider: {fake: {latency: 120s, data: [{key: k, value: v}]}}}\n---\n\
                apiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {name: stuck, namespace: shop}\n\
                spec: {secretStoreRef: {name: stuck}, data: [{secretKey: v, remoteRef: {key: k}}]}\n";
    let mut agent = Agent::start(&[("stuck.yaml", slow)], &[]).await;
    let mut node = agent.node().await;
    let req = publish_req(&agent, "stuck", "stuck");
    std::fs::create_dir_all(agent.target("stuck").parent().unwrap()).unwrap();
    let call = tokio::spawn(async move { node.node_publish_volume(req).await });
    // The call is inside the agent, waiting on the backend, once its cache miss is counted.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while agent.metric("latchkey_cache_misses_total").await < 1.0 {
        assert!(std::time::Instant::now() < deadline, "{}", agent.log_text());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let stopping = std::time::Instant::now();
    assert!(agent.stop().success());
    let took = stopping.elapsed();
    // The server's 5 s grace for calls in flight, then the process exits, call or no call.
    assert!(
        (4..30).contains(&took.as_secs()),
        "exited {took:?} after SIGTERM"
    );
    let log = std::fs::read_to_string(&agent.log).unwrap();
    assert!(log.contains("connections still open"), "{log}");
    assert!(
        call.await.unwrap().is_err(),
        "the call cannot have succeeded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_socket_is_replaced_and_a_live_one_refused() {
    let first = agent().await;
    // A second agent on the same live socket must refuse to start.
    let out = std::process::Command::new(support::BIN)
        .args([
            "node",
            "--node-id",
            "n",
            "--metrics-addr",
            "none",
            "--manifests",
        ])
        .arg(first.dir.path().join("manifests"))
        .arg("--endpoint")
        .arg(format!("unix://{}", first.socket.display()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("served by another running process"));

    // A socket file nobody listens on (a crashed agent) is replaced.
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join("csi.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let mut child = std::process::Command::new(support::BIN)
        .args([
            "node",
            "--node-id",
            "n",
            "--metrics-addr",
            "none",
            "--manifests",
        ])
        .arg(first.dir.path().join("manifests"))
        .arg("--endpoint")
        .arg(format!("unix://{}", stale.display()))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while latchkey::csi::client::connect(&stale).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "agent did not take over the stale socket"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_publish_and_unpublish_work_like_kubelet() {
    let agent = agent().await;
    let target = agent.target("cli");
    let endpoint = format!("unix://{}", agent.socket.display());
    let run = |args: &[&str]| {
        std::process::Command::new(support::BIN)
            .args(args)
            .output()
            .unwrap()
    };
    let publish = |target: &str, external_secret: &str| {
        run(&[
            "publish",
            "--endpoint",
            &endpoint,
            "--target",
            target,
            "--namespace",
            "shop",
            "--external-secret",
            external_secret,
        ])
    };
    let out = run(&["probe", "--endpoint", &endpoint]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.starts_with("csi.latchkey.dev ") && stdout.trim_end().ends_with(": ready"),
        "{stdout}"
    );
    let t = target.to_str().unwrap();
    let out = publish(t, "app");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(read(&target.join("api-key")), API_KEY);
    // A failure on a fresh target is reported with its gRPC code and leaves nothing behind.
    let fresh = agent.target("cli-fresh");
    let f = fresh.to_str().unwrap();
    let out = publish(f, "no-key");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("NodePublishVolume: FailedPrecondition"),
        "{stderr}"
    );
    assert_nothing_left(&fresh);
    // Once the refresh is due (100ms), the same failure on a mounted target is a failed
    // refresh: old content kept, success.
    std::thread::sleep(std::time::Duration::from_millis(150));
    let out = publish(t, "no-key");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(read(&target.join("api-key")), API_KEY);
    let out = run(&["unpublish", "--endpoint", &endpoint, "--target", t]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_nothing_left(&target);
}

/// The data-loss guard, through the real binary as an operator would hit it: `latchkey
/// unpublish` and `publish` on paths that are not Latchkey volumes touch nothing and say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_never_destroys_or_hides_what_latchkey_did_not_create() {
    let agent = agent().await;
    let endpoint = format!("unix://{}", agent.socket.display());
    let run = |args: &[&str]| {
        let out = std::process::Command::new(support::BIN)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let unpublish = |target: &Path| {
        run(&[
            "unpublish",
            "--endpoint",
            &endpoint,
            "--target",
            target.to_str().unwrap(),
        ])
    };
    let publish = |target: &Path| {
        run(&[
            "publish",
            "--endpoint",
            &endpoint,
            "--target",
            target.to_str().unwrap(),
            "--namespace",
            "shop",
            "--external-secret",
            "app",
        ])
    };

    // A directory with somebody's files in it.
    let home = agent.target("home");
    std::fs::create_dir_all(home.join("projects")).unwrap();
    std::fs::write(home.join("projects/plan.md"), b"do not lose").unwrap();
    std::fs::write(home.join(".profile"), b"export A=1\n").unwrap();
    let intact = || {
        assert_eq!(read(&home.join("projects/plan.md")), "do not lose");
        assert_eq!(read(&home.join(".profile")), "export A=1\n");
        assert_eq!(mounts_at(&home), 0);
    };
    let (ok, stderr) = unpublish(&home);
    assert!(!ok);
    assert!(
        stderr.contains("NodeUnpublishVolume: FailedPrecondition")
            && stderr.contains("left")
            && stderr.contains("in place")
            && stderr.contains("2 entries"),
        "{stderr}"
    );
    intact();
    let (ok, stderr) = publish(&home);
    assert!(!ok);
    assert!(
        stderr.contains("NodePublishVolume: FailedPrecondition") && stderr.contains("not empty"),
        "{stderr}"
    );
    intact();

    // A regular file and a symlink (to that directory) where a target should be.
    let file = agent.target("file");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, b"a file").unwrap();
    let link = agent.target("link");
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&home, &link).unwrap();
    for target in [&file, &link] {
        for (rpc, (ok, stderr)) in [
            ("NodeUnpublishVolume", unpublish(target)),
            ("NodePublishVolume", publish(target)),
        ] {
            assert!(!ok, "{rpc} {}", target.display());
            assert!(
                stderr.contains(&format!("{rpc}: FailedPrecondition"))
                    && stderr.contains("is not a directory"),
                "{stderr}"
            );
        }
    }
    assert_eq!(read(&file), "a file");
    assert_eq!(std::fs::read_link(&link).unwrap(), home);
    intact();
}

fn metric(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or_else(|| panic!("no series {series} in:\n{body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_health_endpoints_report_publishes_failures_and_refreshes() {
    let agent = agent().await;
    assert_eq!(agent.http_get("/healthz").await.0, 200);
    let (code, body) = agent.http_get("/readyz").await;
    assert_eq!(code, 200, "{body}");

    let mut node = agent.node().await;
    let req = publish_req(&agent, "m-0", "app-1s");
    node.node_publish_volume(req.clone()).await.unwrap(); // mounted
    node.node_publish_volume(req.clone()).await.unwrap(); // not due (refreshInterval 1s)
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    node.node_publish_volume(req.clone()).await.unwrap(); // refreshed, unchanged
    node.node_publish_volume(publish_req(&agent, "m-1", "no-key"))
        .await
        .unwrap_err(); // failed_precondition

    let (code, body) = agent.http_get("/metrics").await;
    assert_eq!(code, 200);
    let series = [
        (
            "latchkey_node_publish_duration_seconds_count{result=\"success\",reason=\"mounted\"}",
            1.0,
        ),
        (
            "latchkey_node_publish_duration_seconds_count{result=\"success\",reason=\"unchanged\"}",
            1.0,
        ),
        (
            "latchkey_node_publish_duration_seconds_count{result=\"success\",reason=\"not_due\"}",
            1.0,
        ),
        (
            "latchkey_node_publish_duration_seconds_count{result=\"error\",reason=\"failed_precondition\"}",
            1.0,
        ),
        ("latchkey_node_publish_total{result=\"success\"}", 3.0),
        ("latchkey_node_refresh_total{result=\"not_due\"}", 1.0),
        ("latchkey_node_publish_total{result=\"error\"}", 1.0),
        ("latchkey_node_refresh_total{result=\"unchanged\"}", 1.0),
        ("latchkey_volumes_active", 1.0),
        // `app` reads 3 remote keys, twice; `no-key` fails on its only key.
        (
            "latchkey_backend_requests_total{provider=\"fake\",operation=\"get\",result=\"success\"}",
            6.0,
        ),
        (
            "latchkey_backend_requests_total{provider=\"fake\",operation=\"get\",result=\"not_found\"}",
            1.0,
        ),
        (
            "latchkey_backend_request_duration_seconds_count{provider=\"fake\",operation=\"get\",result=\"success\"}",
            6.0,
        ),
    ];
    for (s, want) in series {
        assert_eq!(metric(&body, s), want, "{s}");
    }
    for family in [
        "latchkey_cache_hits",
        "latchkey_cache_misses",
        "latchkey_cache_singleflight_joins",
        "latchkey_backend_logins",
    ] {
        assert!(
            body.contains(&format!("# TYPE {family} counter")),
            "{family} missing"
        );
    }
    // Labels are closed sets: no pod names, targets, keys or values.
    for unbounded in [
        "m-0",
        "m-1",
        "no-key",
        "app",
        DB_PASSWORD,
        API_KEY,
        POD_TOKEN,
    ] {
        let leaked = body
            .lines()
            .filter(|l| !l.starts_with('#'))
            .any(|l| l.contains(unbounded));
        assert!(!leaked, "{unbounded:?} appears in a metric line");
    }

    node.node_unpublish_volume(unpublish_request(&req.volume_id, &agent.target("m-0")))
        .await
        .unwrap();
    let (_, body) = agent.http_get("/metrics").await;
    assert_eq!(metric(&body, "latchkey_volumes_active"), 0.0);
    assert_eq!(
        metric(&body, "latchkey_node_unpublish_total{result=\"success\"}"),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_publish_span_without_values() {
    let m = manifests(16);
    let agent = Agent::start(&[("shop.yaml", &m)], &["--log-format", "json"]).await;
    let mut node = agent.node().await;
    node.node_publish_volume(publish_req(&agent, "j-0", "app"))
        .await
        .unwrap();
    node.node_publish_volume(publish_req(&agent, "j-1", "no-property"))
        .await
        .unwrap_err();
    let log = agent.log_text();
    let published = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["message"] == "published")
        .unwrap_or_else(|| panic!("no JSON 'published' line in:\n{log}"));
    let span = &published["span"];
    assert_eq!(span["name"], "publish");
    assert_eq!(span["pod_namespace"], "shop");
    assert_eq!(span["pod"], "j-0");
    assert_eq!(span["external_secret"], "app");
    assert_eq!(span["store"], "SecretStore/fake");
    assert!(span["volume_id"].as_str().unwrap().starts_with("csi-"));
    assert!(log.contains("property \\\"nope\\\" not found"), "{log}");
    for secret in [DB_PASSWORD, API_KEY, POD_TOKEN] {
        assert!(!log.contains(secret), "JSON log leaks a secret value");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fs_group_from_kubelet_owns_the_files() {
    use std::os::unix::fs::MetadataExt;
    let agent = agent().await;
    let mut node = agent.node().await;
    let mut req = publish_req(&agent, "fsgroup", "app");
    if let Some(AccessType::Mount(m)) = &mut req.volume_capability.as_mut().unwrap().access_type {
        m.volume_mount_group = "2000".into();
    }
    node.node_publish_volume(req.clone()).await.unwrap();
    let target = agent.target("fsgroup");
    let root = std::fs::metadata(&target).unwrap();
    assert_eq!((root.mode() & 0o7777, root.gid()), (0o750, 2000));
    for (path, mode) in [
        ("db/password", 0o400),
        ("api-key", 0o440),
        ("LOG_LEVEL", 0o440),
    ] {
        let meta = std::fs::metadata(target.join(path)).unwrap();
        assert_eq!((meta.mode() & 0o7777, meta.gid()), (mode, 2000), "{path}");
    }
    node.node_unpublish_volume(unpublish_request(&req.volume_id, &target))
        .await
        .unwrap();
    assert_nothing_left(&target);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_by_name_with_rewrite_mounts_every_match() {
    let m = manifests(16)
        + r#"
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: found, namespace: shop}
spec:
  secretStoreRef: {name: fake}
  dataFrom:
  - find: {name: {regexp: "^(api|db)$"}}
    rewrite: [{regexp: {source: "^", target: "remote-"}}]
"#;
    let agent = Agent::start(&[("shop.yaml", &m)], &[]).await;
    let mut node = agent.node().await;
    node.node_publish_volume(publish_req(&agent, "find-0", "found"))
        .await
        .unwrap();
    let target = agent.target("find-0");
    assert_eq!(read(&target.join("remote-api")), API_KEY);
    assert!(read(&target.join("remote-db")).contains(DB_PASSWORD));
    let names: Vec<_> = std::fs::read_dir(&target)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with(".."))
        .collect();
    assert_eq!(names.len(), 2, "only the matches: {names:?}");
    let (_, metrics) = agent.http_get("/metrics").await;
    assert!(
        metrics.contains(
            "latchkey_backend_requests_total{provider=\"fake\",operation=\"find\",result=\"success\"} 1"
        ),
        "{metrics}"
    );
}

/// Ten ExternalSecrets, one remote key each, from a store with a 5 ms backend (the issue's
/// mount storm: 500 pods over 10 remote secrets).
fn storm_manifests() -> String {
    let mut out = String::from(
        "apiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {name: slow, namespace: shop}\n\
         spec:\n  provider:\n    fake:\n      latency: 5ms\n      data:\n",
    );
    for i in 0..10 {
        out += &format!("      - {{key: k{i}, value: v{i}}}\n");
    }
    for i in 0..10 {
        out += &format!(
            "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {{name: es{i}, namespace: shop}}\n\
             spec:\n  secretStoreRef: {{name: slow}}\n  data: [{{secretKey: value, remoteRef: {{key: k{i}}}}}]\n"
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_storm_reads_each_remote_value_once_per_service_account() {
    let agent = Agent::start(&[("storm.yaml", &storm_manifests())], &[]).await;
    let calls = |body: &str| {
        metric(
            body,
            "latchkey_backend_requests_total{provider=\"fake\",operation=\"get\",result=\"success\"}",
        )
    };
    for (round, service_accounts, expected_total) in [(0, 1, 10.0), (1, 2, 30.0)] {
        let mut tasks = Vec::new();
        for pod in 0..500 {
            let target = agent.target(&format!("storm-{round}-{pod}"));
            let mut p = PodVolume::new(
                "shop",
                &format!("p{round}-{pod}"),
                &format!("es{}", pod % 10),
            );
            // Round 0: one service account. Round 1: two new ones, which share nothing.
            p.service_account = format!("sa{round}-{}", (pod / 10) % service_accounts);
            let req = p.publish_request(&volume_id_for(&target), &target);
            let mut node = agent.node().await;
            tasks.push(tokio::spawn(
                async move { node.node_publish_volume(req).await },
            ));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let (_, body) = agent.http_get("/metrics").await;
        assert_eq!(calls(&body), expected_total, "round {round}");
    }
    let (_, body) = agent.http_get("/metrics").await;
    assert!(
        metric(&body, "latchkey_cache_singleflight_joins_total")
            + metric(&body, "latchkey_cache_hits_total")
            >= 970.0
    );
}

/// Standalone mode loads like the cluster catalog: other kinds are skipped with a line, a bad
/// object is reported and named to the pod that uses it, the others are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_manifest_is_named_to_its_pod_while_the_others_are_served() {
    let es = |name: &str, extra: &str| {
        format!(
            "apiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\n\
             metadata: {{name: {name}, namespace: shop}}\nspec:\n  secretStoreRef: {{name: fake}}\n\
             {extra}  data: [{{secretKey: api, remoteRef: {{key: api}}}}]\n"
        )
    };
    let app = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: shop}}\n\
         spec: {{replicas: 1}}\n---\n{}---\n{}",
        es("good", ""),
        es("bad", "  refreshInterval: 90\n")
    );
    let twice = es("twice", "");
    let files = [
        ("shop.yaml", manifests(16)),
        ("app.yaml", app),
        ("twice-a.yaml", twice.clone()),
        ("twice-b.yaml", twice),
    ];
    let files: Vec<_> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let agent = Agent::start(&files, &[]).await;
    let mut node = agent.node().await;
    node.node_publish_volume(publish_req(&agent, "good-0", "good"))
        .await
        .unwrap();
    assert_eq!(read(&agent.target("good-0").join("api")), API_KEY);
    for (name, want) in [
        ("bad", "ExternalSecret \"shop/bad\" was not loaded from "),
        ("twice", "defined twice, also in "),
    ] {
        let err = node
            .node_publish_volume(publish_req(&agent, &format!("{name}-0"), name))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert!(err.message().contains(want), "{}", err.message());
        assert_nothing_left(&agent.target(&format!("{name}-0")));
    }
    let log = agent.log_text();
    for line in [
        "skipping a manifest of a kind this agent does not read",
        "app.yaml document 3 (ExternalSecret shop/bad): spec.refreshInterval: invalid type",
        "ExternalSecret shop/twice is defined twice",
    ] {
        assert!(log.contains(line), "{line}:\n{log}");
    }
    assert!(
        !log.contains(API_KEY) && !log.contains(DB_PASSWORD),
        "{log}"
    );
}
