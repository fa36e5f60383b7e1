//! Test harness for end-to-end tests: runs the real `latchkey` binary as a child process on a
//! temporary unix socket and talks to it with the generated CSI client, as kubelet would.

#![allow(dead_code)]
pub mod apiserver;
pub mod bench;
pub mod controller;
pub mod hostile;
pub mod moto;
pub mod openbao;
pub mod pki;
pub mod push;
pub mod race_proxy;
pub mod store_forms;
pub mod tee_proxy;
pub mod tls_front;
pub mod vault_push;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::node_client::NodeClient;
use latchkey::csi::client;
use tonic::transport::Channel;

/// Path of the binary under test, built by Cargo for this test target.
pub const BIN: &str = env!("CARGO_BIN_EXE_latchkey");
/// What the release agent's RSS idles at (docs/benchmarks.md: 7-8 MiB), the base of the
/// memory targets tests check on a debug build ([`Agent::peak_over_release_idle_mib`]).
pub const RELEASE_IDLE_RSS_MIB: u64 = 8;

/// Fails loudly when the test cannot do real mounts, instead of skipping.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "end-to-end tests mount tmpfs and must run as root; use scripts/test.sh, which re-runs \
         itself in a user+mount namespace when not root"
    );
}

/// A running `latchkey node` with its own socket, manifests and work directory.
pub struct Agent {
    child: Option<Child>,
    /// Scratch directory holding the socket, manifests, log and targets.
    pub dir: tempfile::TempDir,
    /// The socket path.
    pub socket: PathBuf,
    /// Where the agent's stderr goes.
    pub log: PathBuf,
    /// The metrics endpoint.
    pub metrics_addr: std::net::SocketAddr,
    /// What the agent was started with, for restarts.
    args: Vec<String>,
    kubeconfig: Option<PathBuf>,
    /// The umask the agent starts with, when not the test's own.
    umask: Option<u32>,
}

impl Agent {
    /// Starts an agent over the given manifests (file name -> YAML text) with extra flags.
    pub async fn start(manifests: &[(&str, &str)], extra_args: &[&str]) -> Self {
        Self::start_with(manifests, extra_args, None).await
    }

    /// [`Self::start`] with the agent's process umask set to `umask` (what a node's container
    /// runtime might give it).
    pub async fn start_under_umask(manifests: &[(&str, &str)], umask: u32) -> Self {
        Self::start_with(manifests, &[], Some(umask)).await
    }

    async fn start_with(
        manifests: &[(&str, &str)],
        extra_args: &[&str],
        umask: Option<u32>,
    ) -> Self {
        let dir = scratch_dir();
        let manifest_dir = dir.path().join("manifests");
        std::fs::create_dir(&manifest_dir).unwrap();
        for (name, text) in manifests {
            std::fs::write(manifest_dir.join(name), text).unwrap();
        }
        let mut args = vec![
            "--manifests".to_string(),
            manifest_dir.display().to_string(),
        ];
        args.extend(extra_args.iter().map(|a| a.to_string()));
        Self::launch(dir, &args, None, umask).await
    }

    /// Starts an agent that reads the Kubernetes API through `kubeconfig` (no `--manifests`).
    pub async fn start_in_cluster(kubeconfig_yaml: &str, extra_args: &[&str]) -> Self {
        let dir = scratch_dir();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml).unwrap();
        let args: Vec<String> = extra_args.iter().map(|a| a.to_string()).collect();
        Self::launch(dir, &args, Some(&kubeconfig), None).await
    }

    async fn launch(
        dir: tempfile::TempDir,
        args: &[String],
        kubeconfig: Option<&Path>,
        umask: Option<u32>,
    ) -> Self {
        let socket = dir.path().join("plugin").join("csi.sock");
        let log = dir.path().join("agent.log");
        let mut agent = Self {
            child: None,
            socket,
            log,
            dir,
            metrics_addr: ANY_LOCAL_PORT,
            args: args.to_vec(),
            kubeconfig: kubeconfig.map(Path::to_path_buf),
            umask,
        };
        let log_start = agent.spawn();
        agent.wait_ready(log_start).await;
        agent
    }

    /// Kills the agent with SIGKILL, as the OOM killer or a node crash would: no cleanup at all.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("agent running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Starts the agent again with the same socket, directory and arguments.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "stop or kill the agent first");
        let log_start = self.spawn();
        self.wait_ready(log_start).await;
    }

    /// Starts the agent; returns where its lines begin in the log.
    fn spawn(&mut self) -> u64 {
        let (args, kubeconfig) = (self.args.clone(), self.kubeconfig.clone());
        // Appends: a restarted agent's log follows the first one's.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = match self.umask {
            // The shell sets the umask and execs the agent: the pid stays the agent's.
            Some(mask) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("umask {mask:04o} && exec \"$0\" \"$@\""))
                    .arg(BIN);
                sh
            }
            None => Command::new(BIN),
        };
        // Only this agent's own volumes count against its budget: by default an agent counts
        // every Latchkey tmpfs of the machine, which here includes other tests' volumes (and
        // one unmounted while it counts would be measured on the disk beneath it).
        let count_below = self.dir.path().display().to_string();
        let counts_own = !args.iter().any(|a| a == "--count-volumes-below");
        cmd.arg("node")
            .arg("--endpoint")
            .arg(format!("unix://{}", self.socket.display()))
            .args(["--node-id", "test-node"])
            .arg("--metrics-addr")
            .arg(ANY_LOCAL_PORT.to_string())
            .args(&args)
            .args(if counts_own {
                vec!["--count-volumes-below", count_below.as_str()]
            } else {
                Vec::new()
            })
            .env("RUST_LOG", "debug")
            // Never the developer's own cluster: no kubeconfig unless the test gives one.
            .env_remove("KUBECONFIG")
            .env("HOME", self.dir.path())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(path) = kubeconfig {
            cmd.env("KUBECONFIG", path);
        }
        let log_start = std::fs::metadata(&self.log).map_or(0, |m| m.len());
        self.child = Some(cmd.spawn().expect("start latchkey node"));
        log_start
    }

    /// Waits until the agent started with its log lines from `log_start` on serves, and learns
    /// the port its metrics endpoint was given.
    async fn wait_ready(&mut self, log_start: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("agent exited early ({status}):\n{}", self.log_text());
            }
            // A test that reads /readyz or /metrics next must find both endpoints served.
            if let Some(bound) = bound_metrics_addr(&self.log, log_start)
                && self.socket.exists()
                && client::connect(&self.socket).await.is_ok()
                && http_get(bound, "/healthz").await.is_some()
            {
                self.metrics_addr = bound;
                return;
            }
            assert!(
                Instant::now() < deadline,
                "agent did not serve in time:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A fresh channel to the agent.
    pub async fn channel(&self) -> Channel {
        client::connect(&self.socket)
            .await
            .expect("connect to agent")
    }

    /// Node client.
    pub async fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel().await)
    }

    /// Identity client.
    pub async fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel().await)
    }

    /// Controller client.
    pub async fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel().await)
    }

    /// A target path inside the scratch directory (not created).
    pub fn target(&self, name: &str) -> PathBuf {
        self.dir.path().join("pods").join(name).join("mount")
    }

    /// GET a path of the metrics endpoint: (status code, body).
    pub async fn http_get(&self, path: &str) -> (u16, String) {
        http_get(self.metrics_addr, path)
            .await
            .expect("agent metrics endpoint")
    }

    /// The value of one metric series (`name{labels}`), 0 when absent.
    pub async fn metric(&self, series: &str) -> f64 {
        metric_value(&self.http_get("/metrics").await.1, series)
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("agent running").id()
    }

    /// The peak RSS a release build would have reached: what the agent added over
    /// `baseline_mib` (an earlier [`Self::peak_rss_mib`]) on top of [`RELEASE_IDLE_RSS_MIB`].
    /// Tests run a debug build, which idles ~30 MiB higher, so an absolute figure would
    /// measure the build, not the agent's behaviour.
    pub fn peak_over_release_idle_mib(&self, baseline_mib: u64) -> u64 {
        self.peak_rss_mib().saturating_sub(baseline_mib) + RELEASE_IDLE_RSS_MIB
    }

    /// The agent's peak resident memory so far (`VmHWM`), in MiB.
    pub fn peak_rss_mib(&self) -> u64 {
        peak_rss_mib_of(self.pid())
    }

    /// Everything the agent logged so far, once its log has settled (see [`settled_log`]).
    pub fn log_text(&self) -> String {
        settled_log(&self.log)
    }

    /// Sends SIGTERM and waits for a clean exit; returns the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        terminate(self.child.take().expect("agent running"))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Never leave a mount behind, whatever the test did.
        for m in latchkey::volume::mountinfo::below(self.dir.path()).unwrap_or_default() {
            let _ = nix::mount::umount2(&m.mount_point, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// A scratch directory for one agent; fails the test when it cannot mount.
fn scratch_dir() -> tempfile::TempDir {
    require_root();
    tempfile::Builder::new()
        .prefix("latchkey-e2e-")
        .tempdir()
        .unwrap()
}

/// `GET path` on a plain HTTP endpoint: (status code, body); `None` when it does not answer.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: latchkey\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    let code = out.get(9..12)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((code, body))
}

/// A listening unix socket outside the directory a store may name sockets in, linked from
/// `<dir>/link.sock`: what the agent must never connect to, through the link or directly.
pub struct OutsideSocket {
    /// The socket's listener: a connection here means the agent got out.
    pub listener: tokio::net::UnixListener,
    /// The socket's path.
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl OutsideSocket {
    /// Binds the socket in a directory of its own and links `<dir>/link.sock` to it.
    pub fn linked_from(dir: &Path) -> Self {
        let outside = tempfile::tempdir().unwrap();
        let path = outside.path().join("evil.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        std::os::unix::fs::symlink(&path, dir.join("link.sock")).unwrap();
        Self {
            listener,
            path,
            _dir: outside,
        }
    }

    /// Whether anything connected within 200 ms.
    pub async fn was_reached(&self) -> bool {
        tokio::time::timeout(Duration::from_millis(200), self.listener.accept())
            .await
            .is_ok()
    }
}

/// A cargo example of the agent crate (`[[example]]`), which `cargo test` builds beside the test
/// binaries: `target/<profile>/deps/<test>` -> `target/<profile>/examples/<name>`.
pub fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary is in target/<profile>/deps")
        .join("examples")
        .join(name);
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p latchkey --example {name}` (cargo test \
         builds it too)",
        bin.display()
    );
    bin
}

/// The value of one series (`name{labels}`) in a Prometheus text body, 0 when absent.
pub fn metric_value(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// Sends SIGTERM to `child` and waits for it to exit.
pub fn terminate(mut child: Child) -> std::process::ExitStatus {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    child.wait().unwrap()
}

/// A loopback address with a port that was free a moment ago.
pub fn free_local_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// `--metrics-addr` for the agent and the controller: the kernel picks the port as the process
/// binds it, so no other process can take it in between (as one picked by [`free_local_addr`]
/// and passed on can be); the process logs where it bound ([`bound_metrics_addr`]).
pub const ANY_LOCAL_PORT: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// The metrics endpoint a process started with [`ANY_LOCAL_PORT`] logged once bound, read from
/// byte `from` of its log on (a restarted agent's lines follow the previous run's); text or JSON.
pub fn bound_metrics_addr(log: &Path, from: u64) -> Option<std::net::SocketAddr> {
    let log = std::fs::read(log).ok()?;
    let log = String::from_utf8_lossy(log.get(usize::try_from(from).ok()?..)?);
    let line = log.lines().find(|l| l.contains("serving /metrics"))?;
    let host = format!("{}:", ANY_LOCAL_PORT.ip());
    let port = &line[line.find(&host)? + host.len()..];
    let digits = port
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(port.len());
    let port = port[..digits].parse().ok()?;
    Some(std::net::SocketAddr::new(ANY_LOCAL_PORT.ip(), port))
}

/// Number of mounts whose mount point is exactly `path`.
pub fn mounts_at(path: &Path) -> usize {
    latchkey::volume::mountinfo::read()
        .unwrap()
        .iter()
        .filter(|m| m.mount_point == path)
        .count()
}

/// Reads `user` and `pass` through one resolution of `..data` until told to stop, panicking on a
/// mix of generations. Returns how many consistent pairs it read.
pub fn read_pairs_until_stopped(target: PathBuf, stop: &std::sync::atomic::AtomicBool) -> usize {
    use std::os::fd::AsRawFd;
    let mut pairs = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        // The directory resolved here may be removed right after a swap: ENOENT is fine.
        let Ok(dir) = std::fs::File::open(target.join("..data")) else {
            continue;
        };
        let at = |name: &str| {
            std::fs::read_to_string(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd())).ok()
        };
        if let (Some(user), Some(pass)) = (at("user"), at("pass")) {
            assert_eq!(
                user.strip_prefix("user-"),
                pass.strip_prefix("pass-"),
                "one snapshot mixes two rotations"
            );
            pairs += 1;
        }
    }
    pairs
}

/// The text of a log file once it has stopped growing for 20 ms (at most 5 s): lines of work
/// the agent does on its own (refreshes, the controller's reconciles) land at any moment.
pub fn settled_log(path: &std::path::Path) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut text = std::fs::read_to_string(path).unwrap_or_default();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let now = std::fs::read_to_string(path).unwrap_or_default();
        if now == text || std::time::Instant::now() >= deadline {
            return now;
        }
        text = now;
    }
}

/// A process's peak resident memory so far (`VmHWM`), in MiB.
pub fn peak_rss_mib_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib / 1024
}

/// Waits until the asynchronous `check` holds, polling every 200 ms for at most `limit`.
pub async fn eventually<F, Fut>(limit: std::time::Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while !check().await {
        assert!(start.elapsed() < limit, "timed out waiting for: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
