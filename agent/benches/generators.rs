//! Generator benchmark: the real `latchkey node` binary in standalone mode (`--manifests`) and a
//! real OpenBao dev server (tests/support/openbao.rs). A `VaultDynamicSecret` issues a PKI
//! certificate (`pki/issue/<role>`, a role with `generate_lease`) through jwt auth with the pod's
//! own token, and an ExternalSecret names it in `dataFrom[].sourceRef.generatorRef`. Measures:
//!
//! 1. N pods (100) of ONE service account publish at once: the time until every volume is
//!    mounted, the agent's Vault calls by operation (target: N generates) and logins (target:
//!    1), and that every pod holds a certificate of its own (N distinct serials);
//! 2. all N unpublished at once: the time until no lease is left under the role
//!    (`LIST sys/leases/lookup/pki/issue/<role>/`, target: 0) and `latchkey_generator_leases`
//!    is back to 0, the revoke calls (target: N) and the certificates OpenBao lists as revoked;
//! 3. the agent's peak RSS over the whole run (`VmHWM`).
//!
//! Every pod brings a token of its own (as kubelet's projected tokens are), all of the same
//! service account. Target directories are created below `$TMPDIR`, as kubelet creates them on
//! the node's disk. Needs root (tmpfs mounts) and OpenBao's `bao` on PATH (scripts/test.sh puts
//! its venv there):
//!
//! ```text
//! cargo bench -p latchkey --bench generators                          # 100 pods, release build
//! LATCHKEY_BENCH_GENERATOR_PODS=500 cargo bench -p latchkey --bench generators
//! LATCHKEY_BENCH_QUICK=1 cargo test -p latchkey --bench generators    # 10 pods (CI)
//! ```
//!
//! Prints a table and writes JSON to `target/bench/generators.json`. Targets are reported as
//! PASS/MISS and never enforced; times and memory have no target (a quick or debug run's mean
//! nothing). The exit code is non-zero only when something breaks: the agent or OpenBao does not
//! start, a publish or unpublish fails, or a generated value or token shows in the agent's log.
//! See docs/benchmarks.md.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::{NodePublishVolumeRequest, NodeUnpublishVolumeRequest};
use latchkey::csi::client::{self, PodVolume, unpublish_request, volume_id_for};
use serde_json::json;
use support::openbao::{JwtIssuer, OpenBao};
use tokio::task::JoinSet;
use tonic::transport::Channel;

const NAMESPACE: &str = "bench";
/// The one service account of every pod.
const SERVICE_ACCOUNT: &str = "app";
const PKI_MOUNT: &str = "pki";
const PKI_ROLE: &str = "bench-cert";
/// The jwt auth role the pods log in with, and the audience of their tokens.
const JWT_ROLE: &str = "app";
const AUDIENCE: &str = "vault";
const PODS: usize = 100;
const QUICK_PODS: usize = 10;
/// How long the agent gets to revoke every lease once the pods are gone.
const CLEANUP_LIMIT: Duration = Duration::from_secs(120);
/// Where the JSON report goes (the workspace's target directory).
const REPORT_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/bench");
const LEASES_SERIES: &str = "latchkey_generator_leases{kind=\"VaultDynamicSecret\"}";

fn main() -> ExitCode {
    // No argument changes anything: `cargo bench` passes `--bench`, `cargo test` may pass filters.
    let quick = std::env::var("LATCHKEY_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let pods = match std::env::var("LATCHKEY_BENCH_GENERATOR_PODS") {
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("generators bench: LATCHKEY_BENCH_GENERATOR_PODS={v:?} is not a count");
                return ExitCode::FAILURE;
            }
        },
        Err(_) if quick => QUICK_PODS,
        Err(_) => PODS,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("generators bench: starting the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(pods, quick)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("generators bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(pods: usize, quick: bool) -> Result<()> {
    ensure!(
        nix::unistd::geteuid().is_root(),
        "the generators benchmark mounts tmpfs volumes and must run as root"
    );
    let bao = OpenBao::start().await;
    let issuer = JwtIssuer::new();
    configure(&bao, &issuer).await;
    let agent = Agent::start(&manifests(&bao)).await?;
    let node = NodeClient::new(agent.channel().await?);

    // Tokens signed and requests built before the clock starts: only the agent is timed.
    let tokens: Vec<String> = (0..pods)
        .map(|_| issuer.token(NAMESPACE, SERVICE_ACCOUNT, AUDIENCE))
        .collect();
    let volumes: Vec<Volume> = tokens
        .iter()
        .enumerate()
        .map(|(i, token)| Volume::new(&agent, i, token))
        .collect::<Result<_>>()?;

    let before = VaultCalls::read(&agent).await?;
    let start = Instant::now();
    concurrently(&node, &volumes, Rpc::Publish).await?;
    let all_mounted = start.elapsed();
    let mounted = VaultCalls::read(&agent).await?.since(&before);
    let leases_mounted = live_leases(&bao).await?;
    let gauge_mounted = agent.metric(LEASES_SERIES).await?;
    let rss_mounted = agent.status_mib("VmRSS")?;

    let mut serials = Vec::with_capacity(pods);
    let mut private_keys = Vec::with_capacity(pods);
    for v in &volumes {
        serials.push(v.read("serial_number")?.trim().to_string());
        private_keys.push(v.read("private_key")?);
        ensure!(
            v.read("certificate")?
                .starts_with("-----BEGIN CERTIFICATE-----"),
            "{}: no PEM certificate in the volume",
            v.target.display()
        );
    }
    let distinct = serials.iter().collect::<HashSet<_>>().len();

    let start = Instant::now();
    concurrently(&node, &volumes, Rpc::Unpublish).await?;
    let unpublished = start.elapsed();
    for v in &volumes {
        ensure!(
            !v.target.exists(),
            "{} is still there after its unpublish",
            v.target.display()
        );
    }
    let deadline = start + CLEANUP_LIMIT;
    let cleanup = loop {
        if live_leases(&bao).await? == 0 && agent.metric(LEASES_SERIES).await? == 0.0 {
            break Some(start.elapsed());
        }
        if Instant::now() >= deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let leases_left = live_leases(&bao).await?;
    let gauge_left = agent.metric(LEASES_SERIES).await?;
    let whole_run = VaultCalls::read(&agent).await?.since(&before);
    let revoked: HashSet<String> = bao
        .revoked_serials(PKI_MOUNT)
        .await
        .into_iter()
        .map(|s| s.to_ascii_lowercase())
        .collect();
    let serials_revoked = serials
        .iter()
        .filter(|s| revoked.contains(&s.to_ascii_lowercase()))
        .count();
    let peak_rss = agent.status_mib("VmHWM")?;
    let rss_after = agent.status_mib("VmRSS")?;
    agent.check_no_leak(private_keys.iter().chain(&tokens))?;

    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    let generates = mounted.operation("generate");
    let revokes = whole_run.operation("revoke");
    let mut out = format!(
        "generators benchmark: {pods} pods of one service account publish at once, a PKI \
         certificate each (VaultDynamicSecret, OpenBao {}, jwt auth){}\n\
         | measurement | value | target | |\n|---|---|---|---|\n",
        bao.url,
        if quick || cfg!(debug_assertions) {
            " (QUICK or debug build: times and memory mean nothing)"
        } else {
            ""
        }
    );
    let mut row = |what: &str, value: String, target: &str, judged: &str| {
        out.push_str(&format!("| {what} | {value} | {target} | {judged} |\n"));
    };
    row(
        &format!("{pods} publishes at once -> all mounted"),
        format!("{:.3} s", all_mounted.as_secs_f64()),
        "",
        "",
    );
    row(
        "Vault generate calls",
        fmt_count(generates),
        &format!("= {pods}"),
        verdict(generates == pods as f64),
    );
    row(
        "Vault logins",
        fmt_count(mounted.logins),
        "= 1",
        verdict(mounted.logins == 1.0),
    );
    row(
        "Vault calls while publishing, by operation (failed)",
        format!("{} ({})", mounted.summary(), fmt_count(mounted.failed)),
        "",
        "",
    );
    row(
        "distinct certificates (serials)",
        format!("{distinct} of {pods}"),
        &format!("= {pods}"),
        verdict(distinct == pods),
    );
    row(
        "live leases / latchkey_generator_leases, all mounted",
        format!("{leases_mounted} / {}", fmt_count(gauge_mounted)),
        &format!("= {pods} / {pods}"),
        verdict(leases_mounted == pods && gauge_mounted == pods as f64),
    );
    row(
        &format!("agent RSS, {pods} mounted"),
        format!("{rss_mounted:.1} MiB"),
        "",
        "",
    );
    row(
        &format!("{pods} unpublishes at once, wall time"),
        format!("{:.3} s", unpublished.as_secs_f64()),
        "",
        "",
    );
    row(
        "cleanup: unpublish -> no lease left and the gauge at 0",
        cleanup.map_or_else(
            || format!("not within {} s", CLEANUP_LIMIT.as_secs()),
            |d| format!("{:.3} s", d.as_secs_f64()),
        ),
        "",
        "",
    );
    row(
        "Vault revoke calls",
        fmt_count(revokes),
        &format!("= {pods}"),
        verdict(revokes == pods as f64),
    );
    row(
        "live leases / latchkey_generator_leases left",
        format!("{leases_left} / {}", fmt_count(gauge_left)),
        "= 0 / 0",
        verdict(leases_left == 0 && gauge_left == 0.0),
    );
    row(
        "certificates OpenBao lists as revoked",
        format!("{serials_revoked} of {pods}"),
        &format!("= {pods}"),
        verdict(serials_revoked == pods),
    );
    row(
        "Vault calls over the whole run, by operation (failed)",
        format!("{} ({})", whole_run.summary(), fmt_count(whole_run.failed)),
        "",
        "",
    );
    row(
        "agent peak RSS over the whole run (VmHWM)",
        format!("{peak_rss:.1} MiB"),
        "",
        "",
    );
    row(
        "agent RSS after cleanup",
        format!("{rss_after:.1} MiB"),
        "",
        "",
    );
    print!("{out}");

    let report = json!({
        "pods": pods, "quick": quick, "debug_build": cfg!(debug_assertions),
        "all_mounted_seconds": all_mounted.as_secs_f64(),
        "vault_generates": generates, "vault_logins": mounted.logins,
        "vault_calls_publishing": mounted.by_operation, "vault_failed_publishing": mounted.failed,
        "distinct_certificates": distinct,
        "live_leases_mounted": leases_mounted, "generator_leases_mounted": gauge_mounted,
        "rss_mounted_mib": rss_mounted,
        "unpublish_all_seconds": unpublished.as_secs_f64(),
        "cleanup_seconds": cleanup.map(|d| d.as_secs_f64()),
        "vault_revokes": revokes, "live_leases_left": leases_left,
        "generator_leases_left": gauge_left, "certificates_revoked": serials_revoked,
        "vault_calls_whole_run": whole_run.by_operation, "vault_logins_whole_run": whole_run.logins,
        "vault_failed_whole_run": whole_run.failed,
        "peak_rss_mib": peak_rss, "rss_after_cleanup_mib": rss_after,
    });
    std::fs::create_dir_all(REPORT_DIR).context("creating target/bench")?;
    let path = format!("{REPORT_DIR}/generators.json");
    std::fs::write(&path, report.to_string()).with_context(|| format!("writing {path}"))?;
    println!("JSON report: {path}");
    Ok(())
}

/// A PKI role issuing leased certificates, jwt auth for the pods' tokens, and a policy to issue,
/// renew and revoke (as tests/generated_volumes.rs sets them up).
async fn configure(bao: &OpenBao, issuer: &JwtIssuer) {
    bao.pki(PKI_MOUNT, PKI_ROLE, "1h").await;
    bao.policy(
        "issue",
        &format!(
            "path \"{PKI_MOUNT}/issue/{PKI_ROLE}\" {{ capabilities = [\"create\", \"update\"] }}\n\
             path \"sys/leases/renew\" {{ capabilities = [\"update\"] }}\n\
             path \"sys/leases/revoke\" {{ capabilities = [\"update\"] }}\n"
        ),
    )
    .await;
    bao.jwt(issuer, JWT_ROLE, AUDIENCE, &["issue"]).await;
}

fn manifests(bao: &OpenBao) -> String {
    format!(
        r#"
apiVersion: generators.latchkey.dev/v1alpha1
kind: VaultDynamicSecret
metadata: {{name: cert, namespace: {NAMESPACE}}}
spec:
  path: {PKI_MOUNT}/issue/{PKI_ROLE}
  method: POST
  parameters: {{common_name: localhost}}
  provider:
    server: {url}
    auth: {{jwt: {{role: {JWT_ROLE}, audience: {AUDIENCE}}}}}
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {{name: tls, namespace: {NAMESPACE}}}
spec:
  dataFrom:
  - sourceRef: {{generatorRef: {{kind: VaultDynamicSecret, name: cert}}}}
"#,
        url = bao.url
    )
}

/// Leases still alive under the role (`LIST sys/leases/lookup/...`; 404 when none is).
async fn live_leases(bao: &OpenBao) -> Result<usize> {
    let (code, listed) = bao
        .request(
            "LIST",
            &format!("sys/leases/lookup/{PKI_MOUNT}/issue/{PKI_ROLE}/"),
            None,
        )
        .await;
    match code {
        200 => Ok(listed["data"]["keys"].as_array().map_or(0, Vec::len)),
        404 => Ok(0),
        other => bail!("listing leases: OpenBao answered {other}: {listed}"),
    }
}

fn fmt_count(n: f64) -> String {
    format!("{n:.0}")
}

/// One pod's volume: its target and the requests kubelet would send for it.
struct Volume {
    target: PathBuf,
    publish: NodePublishVolumeRequest,
    unpublish: NodeUnpublishVolumeRequest,
}

impl Volume {
    fn new(agent: &Agent, i: usize, token: &str) -> Result<Self> {
        // As kubelet makes `.../pods/<uid>/volumes/.../mount`: the parent exists, the target not.
        let parent = agent.dir.path().join("pods").join(format!("pod-{i}"));
        std::fs::create_dir_all(&parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        let target = parent.join("mount");
        let mut pod = PodVolume::new(NAMESPACE, &format!("pod-{i}"), "tls");
        pod.service_account = SERVICE_ACCOUNT.into();
        pod.tokens_json = Some(json!({ AUDIENCE: {"token": token} }).to_string());
        let id = volume_id_for(&target);
        Ok(Self {
            publish: pod.publish_request(&id, &target),
            unpublish: unpublish_request(&id, &target),
            target,
        })
    }

    fn read(&self, file: &str) -> Result<String> {
        std::fs::read_to_string(self.target.join(file))
            .with_context(|| format!("reading {}/{file}", self.target.display()))
    }
}

#[derive(Clone, Copy)]
enum Rpc {
    Publish,
    Unpublish,
}

/// Sends `rpc` for every volume at once over one connection; fails on the first error.
async fn concurrently(node: &NodeClient<Channel>, volumes: &[Volume], rpc: Rpc) -> Result<()> {
    let mut calls = JoinSet::new();
    for v in volumes {
        let mut node = node.clone();
        let (publish, unpublish) = (v.publish.clone(), v.unpublish.clone());
        calls.spawn(async move {
            match rpc {
                Rpc::Publish => node.node_publish_volume(publish).await.map(drop),
                Rpc::Unpublish => node.node_unpublish_volume(unpublish).await.map(drop),
            }
        });
    }
    while let Some(done) = calls.join_next().await {
        // A status carries no generated value (tests/generated_volumes.rs checks it).
        done.context("an RPC task")?
            .map_err(|s| anyhow!("{:?}: {}", s.code(), s.message()))?;
    }
    Ok(())
}

/// The agent's Vault calls so far, from its metrics.
#[derive(Default)]
struct VaultCalls {
    /// `latchkey_backend_requests_total{provider="vault"}` by operation, whatever the result.
    by_operation: BTreeMap<String, f64>,
    /// Those whose result is not `success`.
    failed: f64,
    /// `latchkey_backend_logins_total{provider="vault"}`.
    logins: f64,
}

impl VaultCalls {
    async fn read(agent: &Agent) -> Result<Self> {
        let body = agent.metrics().await?;
        let mut calls = Self {
            logins: support::metric_value(
                &body,
                "latchkey_backend_logins_total{provider=\"vault\"}",
            ),
            ..Self::default()
        };
        for line in body.lines() {
            let Some((labels, value)) = line
                .strip_prefix("latchkey_backend_requests_total{")
                .and_then(|rest| rest.split_once("} "))
            else {
                continue;
            };
            let labels: BTreeMap<&str, &str> = labels
                .split(',')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k, v.trim_matches('"')))
                })
                .collect();
            if labels.get("provider") != Some(&"vault") {
                continue;
            }
            let value: f64 = value.trim().parse().context("a metric's value")?;
            let operation = labels.get("operation").copied().unwrap_or_default();
            *calls.by_operation.entry(operation.to_string()).or_default() += value;
            if labels.get("result") != Some(&"success") {
                calls.failed += value;
            }
        }
        Ok(calls)
    }

    /// What was counted after `earlier`.
    fn since(&self, earlier: &Self) -> Self {
        Self {
            by_operation: self
                .by_operation
                .iter()
                .map(|(op, n)| (op.clone(), n - earlier.operation(op)))
                .filter(|(_, n)| *n != 0.0)
                .collect(),
            failed: self.failed - earlier.failed,
            logins: self.logins - earlier.logins,
        }
    }

    fn operation(&self, operation: &str) -> f64 {
        self.by_operation.get(operation).copied().unwrap_or(0.0)
    }

    /// `generate 100, revoke 100`, or `none`.
    fn summary(&self) -> String {
        if self.by_operation.is_empty() {
            return "none".into();
        }
        self.by_operation
            .iter()
            .map(|(op, n)| format!("{op} {}", fmt_count(*n)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A running `latchkey node --manifests`, at the production log level (info).
struct Agent {
    child: Option<Child>,
    socket: PathBuf,
    log: PathBuf,
    metrics_addr: SocketAddr,
    /// Socket, manifests, log, targets. Declared last: removed after `drop` unmounted.
    dir: tempfile::TempDir,
}

impl Agent {
    async fn start(manifests: &str) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("latchkey-bench-")
            .tempdir()
            .context("creating the scratch directory")?;
        let manifest_dir = dir.path().join("manifests");
        std::fs::create_dir(&manifest_dir)?;
        std::fs::write(manifest_dir.join("generators.yaml"), manifests)?;
        let socket = dir.path().join("plugin").join("csi.sock");
        let log = dir.path().join("agent.log");
        let mut log_file = std::fs::File::create(&log)?;
        let mut child = Command::new(support::BIN)
            .arg("node")
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .args(["--node-id", "bench", "--manifests"])
            .arg(&manifest_dir)
            .arg("--metrics-addr")
            .arg(support::ANY_LOCAL_PORT.to_string())
            .env_remove("RUST_LOG")
            // Standalone: never the developer's own cluster.
            .env_remove("KUBECONFIG")
            .env("HOME", dir.path())
            .stdout(Stdio::null())
            // A pipe, as a container's stderr is: log lines are not writes to the filesystem
            // the targets are on.
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", support::BIN))?;
        let mut stderr = child.stderr.take().context("the agent's stderr")?;
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut log_file));
        let mut agent = Self {
            child: Some(child),
            socket,
            log,
            metrics_addr: support::ANY_LOCAL_PORT,
            dir,
        };
        agent.wait_ready().await?;
        Ok(agent)
    }

    /// Waits until the socket accepts gRPC and /readyz answers 200.
    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "the agent exited early ({status}); its log:\n{}",
                    self.log_text()
                );
            }
            if let Some(bound) = support::bound_metrics_addr(&self.log, 0)
                && client::connect(&self.socket).await.is_ok()
                && support::http_get(bound, "/readyz")
                    .await
                    .is_some_and(|(code, _)| code == 200)
            {
                self.metrics_addr = bound;
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the agent did not become ready in 30 s; its log:\n{}",
                    self.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn channel(&self) -> Result<Channel> {
        client::connect(&self.socket)
            .await
            .with_context(|| format!("connecting to {}", self.socket.display()))
    }

    async fn metrics(&self) -> Result<String> {
        match support::http_get(self.metrics_addr, "/metrics").await {
            Some((200, body)) => Ok(body),
            other => bail!("GET /metrics: {:?}", other.map(|(code, _)| code)),
        }
    }

    /// One series (`name{labels}`), 0 when absent.
    async fn metric(&self, series: &str) -> Result<f64> {
        Ok(support::metric_value(&self.metrics().await?, series))
    }

    /// A `kB` field of /proc/PID/status, in MiB.
    fn status_mib(&self, field: &str) -> Result<f64> {
        let pid = self
            .child
            .as_ref()
            .context("the agent is not running")?
            .id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
        Ok(kib / 1024.0)
    }

    fn log_text(&self) -> String {
        support::settled_log(&self.log)
    }

    /// Fails when any of `secrets` (generated values, pod tokens) is in the agent's log; names
    /// none of them.
    fn check_no_leak<'a>(&self, secrets: impl Iterator<Item = &'a String>) -> Result<()> {
        let log = self.log_text();
        for (i, s) in secrets.enumerate() {
            let s = s.trim();
            ensure!(
                s.is_empty() || !log.contains(s),
                "the agent's log holds a generated value or a pod token (secret #{i})"
            );
        }
        Ok(())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Never leave a mount behind, whatever went wrong.
        for m in latchkey::volume::mountinfo::below(self.dir.path()).unwrap_or_default() {
            let _ = nix::mount::umount2(&m.mount_point, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}
