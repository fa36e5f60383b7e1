//! The generators benchmark's agent process (`latchkey node --manifests`) and what it counts.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use latchkey::csi::client;
use tonic::transport::Channel;

use crate::support;

/// The agent's Vault calls so far, from its metrics.
#[derive(Default)]
pub(crate) struct VaultCalls {
    /// `latchkey_backend_requests_total{provider="vault"}` by operation, whatever the result.
    pub(crate) by_operation: BTreeMap<String, f64>,
    /// Those whose result is not `success`.
    pub(crate) failed: f64,
    /// `latchkey_backend_logins_total{provider="vault"}`.
    pub(crate) logins: f64,
}

impl VaultCalls {
    pub(crate) async fn read(agent: &Agent) -> Result<Self> {
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
    pub(crate) fn since(&self, earlier: &Self) -> Self {
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

    pub(crate) fn operation(&self, operation: &str) -> f64 {
        self.by_operation.get(operation).copied().unwrap_or(0.0)
    }

    /// `generate 100, revoke 100`, or `none`.
    pub(crate) fn summary(&self) -> String {
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
pub(crate) struct Agent {
    child: Option<Child>,
    socket: PathBuf,
    log: PathBuf,
    metrics_addr: SocketAddr,
    /// Socket, manifests, log, targets. Declared last: removed after `drop` unmounted.
    pub(crate) dir: tempfile::TempDir,
}

impl Agent {
    pub(crate) async fn start(manifests: &str) -> Result<Self> {
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

    pub(crate) async fn channel(&self) -> Result<Channel> {
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
    pub(crate) async fn metric(&self, series: &str) -> Result<f64> {
        Ok(support::metric_value(&self.metrics().await?, series))
    }

    /// A `kB` field of /proc/PID/status, in MiB.
    pub(crate) fn status_mib(&self, field: &str) -> Result<f64> {
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
    pub(crate) fn check_no_leak<'a>(
        &self,
        secrets: impl Iterator<Item = &'a String>,
    ) -> Result<()> {
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

/// A counter's value as a whole number.
pub(crate) fn fmt_count(n: f64) -> String {
    format!("{n:.0}")
}
