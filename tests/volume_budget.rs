//! The volume budget, tested the way the agent failed without it: the tmpfs pages of every
//! volume are charged to the memory cgroup of the process that wrote them, the agent's. The real
//! agent runs in a memory cgroup with the DaemonSet's memory limit and the DaemonSet's
//! `--volume-budget` / `--namespace-volume-share` (read from daemonset/base/daemonset.yaml), one
//! namespace mounts 3 MiB volumes until refused, another namespace still mounts, and the agent is
//! never OOM-killed. Without the budget it was killed at the ~60th volume of such a namespace, and
//! as the pages stay charged after a kill, killed again after its restart.
//!
//! Needs a writable memory cgroup: v1 (`/sys/fs/cgroup/memory`) or v2 with the memory
//! controller. Without one the tests fail, never skip.

mod support;

use std::path::{Path, PathBuf};

use latchkey::csi::client::{PodVolume, unpublish_request, volume_id_for};
use serde_json::Value;
use support::Agent;
use tonic::Code;

/// One value of the store; a volume holds it [`ENTRIES`] times (3 MiB, as in the report).
const VALUE_BYTES: usize = 128 << 10;
const ENTRIES: usize = 24;
/// More flood volumes than the DaemonSet's whole limit could hold: the loop ends by a refusal
/// or by the agent's death, never by running out of pods.
const MAX_FLOOD: usize = 200;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The agent container of daemonset/base/daemonset.yaml.
fn daemonset_agent() -> Value {
    let text = std::fs::read_to_string(repo().join("daemonset/base/daemonset.yaml")).unwrap();
    let ds: Value = serde_norway::from_str(&text).unwrap();
    ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "latchkey")
        .expect("the latchkey container")
        .clone()
}

/// A Kubernetes quantity such as `192Mi`, in bytes.
fn quantity(q: &str) -> u64 {
    let (digits, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = digits.parse().unwrap_or_else(|_| panic!("quantity {q:?}"));
    n * match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => panic!("quantity {q:?}"),
    }
}

/// The DaemonSet's memory limit and its budget flags (`--flag=value`), as the agent gets them.
fn daemonset_limits() -> (u64, Vec<String>) {
    let agent = daemonset_agent();
    let limit = quantity(
        agent["resources"]["limits"]["memory"]
            .as_str()
            .expect("a memory limit"),
    );
    let flags: Vec<String> = agent["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|a| a.starts_with("--volume-budget=") || a.starts_with("--namespace-volume-share="))
        .map(String::from)
        .collect();
    (limit, flags)
}

/// A memory cgroup of its own, removed on drop.
struct Cgroup {
    dir: PathBuf,
    v1: bool,
}

impl Cgroup {
    /// A fresh memory cgroup limited to `limit` bytes. Fails (never skips) without one.
    fn new(name: &str, limit: u64) -> Self {
        let name = format!("latchkey-test-{}-{name}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists();
        let cgroup = if v1 {
            Self {
                dir: Path::new("/sys/fs/cgroup/memory").join(name),
                v1,
            }
        } else {
            let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
                .into_iter()
                .map(Path::new)
                .find(|root| {
                    std::fs::read_to_string(root.join("cgroup.subtree_control"))
                        .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
                })
                .expect(
                    "these tests need a memory cgroup: cgroup v1 at /sys/fs/cgroup/memory, or v2 \
                     with the memory controller enabled in the root's cgroup.subtree_control",
                );
            Self {
                dir: root.join(name),
                v1,
            }
        };
        std::fs::create_dir(&cgroup.dir)
            .unwrap_or_else(|e| panic!("creating {}: {e}", cgroup.dir.display()));
        if v1 {
            cgroup.write("memory.limit_in_bytes", &limit.to_string());
            // Swap would let tmpfs pages leave the limit; absent without swap accounting.
            if cgroup.dir.join("memory.memsw.limit_in_bytes").exists() {
                cgroup.write("memory.memsw.limit_in_bytes", &limit.to_string());
            }
        } else {
            cgroup.write("memory.max", &limit.to_string());
            // Swap would let tmpfs pages leave the limit; absent without swap accounting.
            if cgroup.dir.join("memory.swap.max").exists() {
                cgroup.write("memory.swap.max", "0");
            }
        }
        cgroup
    }

    fn write(&self, file: &str, value: &str) {
        std::fs::write(self.dir.join(file), value)
            .unwrap_or_else(|e| panic!("{}/{file} = {value}: {e}", self.dir.display()));
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_else(|e| panic!("{}/{file}: {e}", self.dir.display()))
    }

    /// Moves the process `pid` into this cgroup. What it allocated before stays charged where
    /// it was (charges do not move, as in v2 and recent v1 kernels): the agent joins right after
    /// it starts, before any volume, so only its few MiB at start are left out.
    fn add(&self, pid: u32) {
        self.write("cgroup.procs", &pid.to_string());
    }

    /// Bytes charged now.
    fn usage(&self) -> u64 {
        let file = if self.v1 {
            "memory.usage_in_bytes"
        } else {
            "memory.current"
        };
        self.read(file).trim().parse().unwrap()
    }

    /// Most bytes ever charged.
    fn peak(&self) -> u64 {
        let file = if self.v1 {
            "memory.max_usage_in_bytes"
        } else {
            "memory.peak"
        };
        self.read(file).trim().parse().unwrap()
    }

    /// Processes the kernel's OOM killer killed in this cgroup.
    fn oom_kills(&self) -> u64 {
        let file = if self.v1 {
            "memory.oom_control"
        } else {
            "memory.events"
        };
        self.read(file)
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .expect("an oom_kill counter")
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Empty once the agent is gone (Agent drops first); charges left go to the parent.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The pods' directory, below which the agent counts volumes at start (other tests' agents on
/// this machine have volumes of their own); unmounts whatever is left below it on drop.
struct Pods(tempfile::TempDir);

impl Pods {
    fn new() -> Self {
        Self(
            tempfile::Builder::new()
                .prefix("latchkey-budget-")
                .tempdir()
                .unwrap(),
        )
    }

    fn target(&self, name: &str) -> PathBuf {
        self.0.path().join(name).join("mount")
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        for m in latchkey::volume::mountinfo::below(self.0.path()).unwrap_or_default() {
            let _ = nix::mount::umount2(&m.mount_point, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// A store and an ExternalSecret `bundle` of 3 MiB in each namespace.
fn manifests(namespaces: &[&str]) -> String {
    let value = secret_value();
    let mut out = String::new();
    for ns in namespaces {
        out += &format!(
            "---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\n\
             metadata: {{name: certs, namespace: {ns}}}\n\
             spec:\n  provider:\n    fake:\n      data:\n      - {{key: bundle, value: '{value}'}}\n\
             ---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\n\
             metadata: {{name: bundle, namespace: {ns}}}\nspec:\n  secretStoreRef: {{name: certs}}\n  data:\n"
        );
        for i in 0..ENTRIES {
            out += &format!("  - {{secretKey: part-{i:02}, remoteRef: {{key: bundle}}}}\n");
        }
    }
    out
}

/// An agent over `pods` with the DaemonSet's budget flags, moved into `cgroup`.
async fn agent_in(cgroup: &Cgroup, pods: &Pods, flags: &[String]) -> Agent {
    let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let below = pods.0.path().display().to_string();
    args.extend(["--count-volumes-below", &below]);
    let agent = Agent::start(&[("bundle.yaml", &manifests(&["flood", "quiet"]))], &args).await;
    cgroup.add(agent.pid());
    agent
}

fn alive(agent: &Agent) -> bool {
    Path::new(&format!("/proc/{}", agent.pid())).exists()
        && !std::fs::read_to_string(format!("/proc/{}/stat", agent.pid()))
            .unwrap_or_default()
            .contains(") Z ")
}

/// Publishes `bundle` for pod `name` of `namespace`: Ok, or the status code and message.
async fn publish(
    agent: &Agent,
    pods: &Pods,
    namespace: &str,
    name: &str,
) -> Result<(), tonic::Status> {
    let target = pods.target(name);
    let req =
        PodVolume::new(namespace, name, "bundle").publish_request(&volume_id_for(&target), &target);
    agent.node().await.node_publish_volume(req).await.map(drop)
}

/// Mounts flood volumes until one is refused; returns how many were mounted and the refusal.
/// Panics, with the cgroup's numbers, if the agent dies on the way.
async fn flood(agent: &Agent, pods: &Pods, cgroup: &Cgroup, from: usize) -> (usize, tonic::Status) {
    for i in from..from + MAX_FLOOD {
        match publish(agent, pods, "flood", &format!("flood-{i}")).await {
            Ok(()) => {}
            Err(status) => {
                if status.code() != Code::ResourceExhausted {
                    // Let the kernel finish what it is doing to the agent, if anything.
                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                }
                assert!(
                    alive(agent) && cgroup.oom_kills() == 0,
                    "the agent died at flood volume {i} ({status}): OOM kills in its cgroup: {}, \
                     peak {} MiB",
                    cgroup.oom_kills(),
                    cgroup.peak() >> 20
                );
                return (i - from, status);
            }
        }
    }
    panic!("{MAX_FLOOD} flood volumes were mounted and none refused");
}

fn assert_refused_by_the_budget(status: &tonic::Status) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let message = status.message();
    for part in [
        "namespace flood holds",
        "share",
        "--volume-budget 64.0 MiB",
        "nothing was written",
        // The publish's objects: namespace, ExternalSecret, store.
        "ExternalSecret \"bundle\"",
        "SecretStore \"certs\"",
    ] {
        assert!(message.contains(part), "{part:?} missing: {message}");
    }
    assert!(
        !message.contains(&secret_value()[..64]),
        "the value leaked: {message}"
    );
}

fn secret_value() -> String {
    "b".repeat(VALUE_BYTES)
}

async fn volume_bytes(agent: &Agent, namespace: &str) -> f64 {
    agent
        .metric(&format!(
            "latchkey_volume_bytes{{namespace=\"{namespace}\"}}"
        ))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_filling_volumes_is_refused_before_the_agent_is_oom_killed() {
    support::require_root();
    let (limit, flags) = daemonset_limits();
    assert!(
        flags.iter().any(|f| f.starts_with("--volume-budget=")),
        "the DaemonSet passes no --volume-budget: {flags:?}"
    );
    let cgroup = Cgroup::new("flood", limit);
    let pods = Pods::new();
    let agent = agent_in(&cgroup, &pods, &flags).await;

    let (mounted, refusal) = flood(&agent, &pods, &cgroup, 0).await;
    assert_refused_by_the_budget(&refusal);
    let refused = pods.target(&format!("flood-{mounted}"));
    assert!(
        !refused.exists(),
        "a refused publish left {}",
        refused.display()
    );
    // The pages really are charged to the agent's cgroup: the failure this guards against.
    let flood_bytes = volume_bytes(&agent, "flood").await;
    assert!(
        cgroup.usage() as f64 >= flood_bytes,
        "cgroup usage {} < flood volumes {flood_bytes}: the test does not reproduce the charge",
        cgroup.usage()
    );

    // Another namespace still mounts.
    for i in 0..3 {
        publish(&agent, &pods, "quiet", &format!("quiet-{i}"))
            .await
            .unwrap_or_else(|s| panic!("quiet-{i}: {s:?}"));
    }
    assert!(alive(&agent));
    assert_eq!(cgroup.oom_kills(), 0);
    let quiet_bytes = volume_bytes(&agent, "quiet").await;
    assert!(
        quiet_bytes >= 3.0 * (ENTRIES * VALUE_BYTES) as f64,
        "{quiet_bytes}"
    );

    // Unpublishing gives the bytes back: the namespace mounts again.
    let first = pods.target("flood-0");
    agent
        .node()
        .await
        .node_unpublish_volume(unpublish_request(&volume_id_for(&first), &first))
        .await
        .unwrap();
    assert!(volume_bytes(&agent, "flood").await < flood_bytes);
    publish(&agent, &pods, "flood", &format!("flood-{mounted}"))
        .await
        .unwrap();
    assert!(alive(&agent));
    assert_eq!(cgroup.oom_kills(), 0);
    // A namespace whose volumes are all gone drops out of the metric.
    for i in 0..3 {
        let target = pods.target(&format!("quiet-{i}"));
        agent
            .node()
            .await
            .node_unpublish_volume(unpublish_request(&volume_id_for(&target), &target))
            .await
            .unwrap();
    }
    let body = agent.http_get("/metrics").await.1;
    assert!(!body.contains("namespace=\"quiet\""), "{body}");
    assert!(
        body.contains("latchkey_volume_bytes{namespace=\"flood\"}"),
        "{body}"
    );
    let log = agent.log_text();
    assert!(log.contains("volume budget"), "{log}");
    assert!(
        !log.contains(&secret_value()[..64]),
        "a value reached the log"
    );
    eprintln!(
        "limit {} MiB ({flags:?}): {mounted} flood volumes of 3 MiB mounted, the next refused; \
         flood holds {:.1} MiB, quiet {:.1} MiB; cgroup peak {:.1} MiB, now {:.1} MiB, 0 OOM kills",
        limit >> 20,
        flood_bytes / f64::from(1 << 20),
        quiet_bytes / f64::from(1 << 20),
        cgroup.peak() as f64 / f64::from(1 << 20),
        cgroup.usage() as f64 / f64::from(1 << 20),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kill_the_restarted_agent_counts_the_volumes_still_charged_to_it() {
    support::require_root();
    let (limit, flags) = daemonset_limits();
    let cgroup = Cgroup::new("restart", limit);
    let pods = Pods::new();
    let mut agent = agent_in(&cgroup, &pods, &flags).await;
    let (mounted, refusal) = flood(&agent, &pods, &cgroup, 0).await;
    assert_refused_by_the_budget(&refusal);
    let before = volume_bytes(&agent, "flood").await;

    // As the OOM killer or a node crash would: no cleanup. The pages stay charged.
    agent.kill9();
    let charged_after_kill = cgroup.usage();
    agent.restart().await;
    cgroup.add(agent.pid());
    // Rebuilt from the mounted volumes: same bytes, before any request.
    assert_eq!(volume_bytes(&agent, "flood").await, before);
    let (more, refusal) = flood(&agent, &pods, &cgroup, mounted).await;
    assert_eq!(
        more, 0,
        "the restarted agent took {more} more flood volumes"
    );
    assert_refused_by_the_budget(&refusal);
    // Mounted volumes refresh as before (kubelet republishes them), and others still mount.
    publish(&agent, &pods, "flood", "flood-0").await.unwrap();
    publish(&agent, &pods, "quiet", "quiet-0").await.unwrap();
    assert!(alive(&agent));
    assert_eq!(cgroup.oom_kills(), 0);
    // Unpublishing a volume mounted before the restart releases what the count found.
    let first = pods.target("flood-0");
    agent
        .node()
        .await
        .node_unpublish_volume(unpublish_request(&volume_id_for(&first), &first))
        .await
        .unwrap();
    publish(&agent, &pods, "flood", &format!("flood-{mounted}"))
        .await
        .unwrap();
    eprintln!(
        "restart: {mounted} flood volumes ({:.1} MiB) counted again after SIGKILL, \
         {:.1} MiB still charged to the cgroup after the kill; 0 more accepted, 0 OOM kills",
        before / f64::from(1 << 20),
        charged_after_kill as f64 / f64::from(1 << 20),
    );
}
