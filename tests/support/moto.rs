//! A real AWS Secrets Manager / Parameter Store / STS for tests: `moto_server` (PyPI `moto[server]`) on a free
//! loopback port, killed on drop. Missing `moto_server` fails the test; it never skips.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_secretsmanager::config::{BehaviorVersion, Credentials, Region};

/// Dummy keys the test client signs with (moto checks nothing unless told to).
pub const ADMIN_KEY_ID: &str = "AKIDMOTOADMIN0000000";
/// Dummy secret key of the test client.
pub const ADMIN_SECRET: &str = "moto-admin-secret-key-not-used";

/// A running `moto_server`.
pub struct Moto {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    log: tempfile::NamedTempFile,
}

impl Moto {
    /// Starts moto with no access checks.
    pub async fn start() -> Self {
        Self::start_with_env(&[]).await
    }

    /// Starts moto with extra environment (e.g. `INITIAL_NO_AUTH_ACTION_COUNT=0` for IAM checks).
    pub async fn start_with_env(env: &[(&str, &str)]) -> Self {
        let addr = super::free_local_addr();
        let log = tempfile::NamedTempFile::new().unwrap();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &addr.port().to_string()])
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run moto_server ({e}): the AWS tests need it on PATH. Install it with \
                     `pip install 'moto[server]'` or run scripts/test.sh, which puts \
                     .venv-test/bin first on PATH"
                )
            });
        let mut moto = Self {
            child,
            endpoint: format!("http://{addr}"),
            log,
        };
        moto.wait_ready(addr).await;
        moto
    }

    async fn wait_ready(&mut self, addr: std::net::SocketAddr) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("moto_server exited early ({status}):\n{}", self.log_text());
            }
            if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let req = "GET /moto-api/ HTTP/1.1\r\nHost: moto\r\nConnection: close\r\n\r\n";
                let mut out = Vec::new();
                if s.write_all(req.as_bytes()).await.is_ok()
                    && s.read_to_end(&mut out).await.is_ok()
                    // 200 only: another test's process that took the port first (an agent's
                    // metrics endpoint) answers HTTP too, with a 404.
                    && out.starts_with(b"HTTP/1.1 200")
                {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "moto_server did not answer in time:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What moto printed.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// A Secrets Manager client for setting up test data, with dummy keys.
    pub fn client(&self) -> aws_sdk_secretsmanager::Client {
        let conf = aws_sdk_secretsmanager::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(&self.endpoint)
            .credentials_provider(Credentials::new(
                ADMIN_KEY_ID,
                ADMIN_SECRET,
                None,
                None,
                "test",
            ))
            .build();
        aws_sdk_secretsmanager::Client::from_conf(conf)
    }

    /// A Systems Manager (Parameter Store) client for setting up test data, with dummy keys.
    pub fn ssm_client(&self) -> aws_sdk_ssm::Client {
        let conf = aws_sdk_ssm::Config::builder()
            .behavior_version(aws_sdk_ssm::config::BehaviorVersion::latest())
            .region(aws_sdk_ssm::config::Region::new("us-east-1"))
            .endpoint_url(&self.endpoint)
            .credentials_provider(Credentials::new(
                ADMIN_KEY_ID,
                ADMIN_SECRET,
                None,
                None,
                "test",
            ))
            .build();
        aws_sdk_ssm::Client::from_conf(conf)
    }
}

/// How many versions Secrets Manager keeps of `key` (deprecated ones included): one more per
/// write.
pub async fn versions(client: &aws_sdk_secretsmanager::Client, key: &str) -> usize {
    let out = client
        .list_secret_version_ids()
        .secret_id(key)
        .include_deprecated(true)
        .send()
        .await
        .unwrap();
    out.versions().len()
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
