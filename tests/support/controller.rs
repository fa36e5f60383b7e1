//! Runs the real `latchkey controller` as a child process against a fake API server.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{ANY_LOCAL_PORT, BIN, bound_metrics_addr, http_get, metric_value, terminate};

/// A running `latchkey controller`.
pub struct ControllerProcess {
    child: Option<Child>,
    /// Scratch directory holding the kubeconfig and log.
    pub dir: tempfile::TempDir,
    /// Where stderr goes.
    pub log: PathBuf,
    /// The metrics endpoint.
    pub metrics_addr: std::net::SocketAddr,
}

impl ControllerProcess {
    /// Starts a controller that reads the API through `kubeconfig_yaml`, named `identity` in the
    /// leader Lease, with short election timings (lease 3 s) unless `extra_args` say otherwise.
    pub async fn start(kubeconfig_yaml: &str, identity: &str, extra_args: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("latchkey-controller-")
            .tempdir()
            .unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml).unwrap();
        let log = dir.path().join("controller.log");
        let child = Command::new(BIN)
            .arg("controller")
            .arg("--metrics-addr")
            .arg(ANY_LOCAL_PORT.to_string())
            .args(["--identity", identity, "--pod-namespace", "latchkey"])
            .args(["--leader-elect-lease-duration", "3s"])
            .args(["--leader-elect-renew-deadline", "2s"])
            .args(["--leader-elect-retry-period", "500ms"])
            .args(extra_args)
            .env("RUST_LOG", "debug")
            .env("KUBECONFIG", &kubeconfig)
            .env("HOME", dir.path())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start latchkey controller");
        let mut c = Self {
            child: Some(child),
            dir,
            log,
            metrics_addr: ANY_LOCAL_PORT,
        };
        c.wait_ready().await;
        c
    }

    /// Waits until the controller is ready, and learns the port its metrics endpoint was given.
    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("controller exited early ({status}):\n{}", self.log_text());
            }
            if let Some(bound) = bound_metrics_addr(&self.log, 0)
                && matches!(http_get(bound, "/readyz").await, Some((200, _)))
            {
                self.metrics_addr = bound;
                return;
            }
            assert!(
                Instant::now() < deadline,
                "controller not ready in time:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        http_get(self.metrics_addr, "/metrics")
            .await
            .expect("metrics endpoint")
            .1
    }

    /// The value of one metric series (`name{labels}`), 0 when absent.
    pub async fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics().await, series)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("controller running").id()
    }

    /// The controller's peak resident memory so far (`VmHWM`), in MiB.
    pub fn peak_rss_mib(&self) -> u64 {
        super::peak_rss_mib_of(self.pid())
    }

    /// Everything logged so far, once the log has settled (see [`super::settled_log`]).
    pub fn log_text(&self) -> String {
        super::settled_log(&self.log)
    }

    /// Polls the async `check` every 100 ms for up to 15 s; the log shows on a timeout.
    pub async fn until<T, F: std::future::Future<Output = Option<T>>>(
        &self,
        what: &str,
        mut check: impl FnMut() -> F,
    ) -> T {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(v) = check().await {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; controller log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills the process with SIGKILL: no lease release, no cleanup.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// SIGTERM and wait; returns the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        terminate(self.child.take().expect("controller running"))
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
