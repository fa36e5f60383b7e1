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

#[path = "../../../tests/support/mod.rs"]
mod support;

mod agent;

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use agent::{Agent, VaultCalls, fmt_count};
use anyhow::{Context as _, Result, anyhow, bail, ensure};
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::{NodePublishVolumeRequest, NodeUnpublishVolumeRequest};
use latchkey::csi::client::{PodVolume, unpublish_request, volume_id_for};
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
