//! Runs the real `latchkey controller` as a child process against a fake API server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{BIN, free_local_addr, http_get, lost_its_port, metric_value, terminate};

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
        let args: Vec<String> = [
            "--identity",
            identity,
            "--pod-namespace",
            "latchkey",
            "--leader-elect-lease-duration",
            "3s",
            "--leader-elect-renew-deadline",
            "2s",
            "--leader-elect-retry-period",
            "500ms",
        ]
        .iter()
        .chain(extra_args)
        .map(|a| a.to_string())
        .collect();
        let mut c = Self {
            child: None,
            dir,
            log,
            metrics_addr: free_local_addr(),
        };
        c.spawn(&args, &kubeconfig);
        c.wait_ready(&args, &kubeconfig).await;
        c
    }

    /// Starts the process on `self.metrics_addr`, its log begun anew.
    fn spawn(&mut self, args: &[String], kubeconfig: &Path) {
        let child = Command::new(BIN)
            .arg("controller")
            .arg("--metrics-addr")
            .arg(self.metrics_addr.to_string())
            .args(args)
            .env("RUST_LOG", "debug")
            .env("KUBECONFIG", kubeconfig)
            .env("HOME", self.dir.path())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&self.log).unwrap())
            .spawn()
            .expect("start latchkey controller");
        self.child = Some(child);
    }

    async fn wait_ready(&mut self, args: &[String], kubeconfig: &Path) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut port_retries = 3;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                let log = self.log_text();
                if port_retries > 0 && lost_its_port(&log) {
                    port_retries -= 1;
                    self.metrics_addr = free_local_addr();
                    self.spawn(args, kubeconfig);
                    continue;
                }
                panic!("controller exited early ({status}):\n{log}");
            }
            if matches!(http_get(self.metrics_addr, "/readyz").await, Some((200, _))) {
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

    /// Everything logged so far, once the log has settled (see [`super::settled_log`]).
    pub fn log_text(&self) -> String {
        super::settled_log(&self.log)
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
