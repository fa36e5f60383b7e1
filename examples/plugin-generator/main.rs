//! `plugin-generator`: a generator plugin for Latchkey's `PluginGenerator`, serving
//! `latchkey.plugin.v1` `Generate` and `Cleanup` on a unix socket (or plain TCP). See README.md.
//!
//! Its backend is a small fake account service held in memory: Generate creates an account for
//! the caller and answers `username` and `password` with the state `{"account": "<id>"}`;
//! Cleanup deletes the account the state names. Cleanup is idempotent (an account already gone
//! is OK) and authorized: only a caller of the namespace the account was made for may delete
//! it, since a tenant can edit the state Latchkey sends back. Passwords and tokens are never
//! logged; `--calls` records one line per call with the live account count.
//!
//! `--misbehave <mode>` makes Generate answer what Latchkey must refuse or check (see `Misbehave`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine;
use clap::{Parser, ValueEnum};
use csi_proto::latchkey_plugin::v1 as lk;
use csi_proto::latchkey_plugin::v1::secret_store_plugin_server::{
    SecretStorePlugin, SecretStorePluginServer,
};
use ring::rand::{SecureRandom, SystemRandom};
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::Server;
use tonic::{Request, Response, Status};

/// Flags of the plugin.
#[derive(Debug, Clone, Parser)]
#[command(about = "Creates and deletes accounts of a fake service over latchkey.plugin.v1")]
struct Args {
    /// Unix socket to listen on (a stale socket file there is replaced).
    #[arg(long, required_unless_present = "listen", conflicts_with = "listen")]
    socket: Option<PathBuf>,
    /// TCP address to listen on instead (no TLS: for local tries only), e.g. `127.0.0.1:4001`.
    #[arg(long)]
    listen: Option<String>,
    /// Append one line per Generate / Cleanup call to this file (never a password or token).
    #[arg(long)]
    calls: Option<PathBuf>,
    /// Accounts expire after this long (answered as `ttl_seconds`), e.g. `1h`.
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Option<Duration>,
    /// A wrong answer, for tests of Latchkey's checks.
    #[arg(long, value_enum)]
    misbehave: Option<Misbehave>,
    /// Give every account this password instead of a random one, so that tests can look for
    /// it where it must not be. Tests only.
    #[arg(long)]
    password: Option<String>,
}

/// Answers Latchkey must refuse or check. Each still creates the account, as a faulty plugin
/// would.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Misbehave {
    /// 10,001 values: more entries than Latchkey decodes.
    TooManyValues,
    /// A JSON state over 4 KiB (padded with the password: it must never be quoted).
    HugeState,
    /// A state that is not JSON (holding the password: it must never be quoted).
    TextState,
    /// Values describing the caller, its tokens included (`caller.*`, `token.<audience>`).
    EchoCaller,
    /// Cleanup of an account already gone answers NOT_FOUND (as some plugins do) instead of OK.
    CleanupNotFound,
}

/// An account of the fake service.
struct Account {
    /// The namespace it was made for: only callers of it may delete it.
    namespace: String,
}

/// The fake service: accounts by id, and the calls file.
struct Accounts {
    args: Args,
    accounts: Mutex<BTreeMap<String, Account>>,
    next: Mutex<u64>,
    random: SystemRandom,
}

impl Accounts {
    /// Appends `line` to the calls file.
    fn record(&self, line: &str) -> Result<(), Status> {
        let Some(calls) = &self.args.calls else {
            return Ok(());
        };
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(calls)
            .map_err(|e| Status::internal(format!("cannot record the call: {e}")))?;
        file.write_all(format!("{line}\n").as_bytes())
            .map_err(|e| Status::internal(format!("cannot record the call: {e}")))
    }

    fn live(&self) -> usize {
        self.accounts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// A new account for `namespace`: its id.
    fn create(&self, namespace: &str) -> String {
        let id = {
            let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
            *next += 1;
            format!("acct-{next}")
        };
        self.accounts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                id.clone(),
                Account {
                    namespace: namespace.to_owned(),
                },
            );
        id
    }

    /// A random password (or `--password`): 24 characters of URL-safe base64 from the OS CSPRNG.
    fn password(&self) -> Result<String, Status> {
        if let Some(fixed) = &self.args.password {
            return Ok(fixed.clone());
        }
        let mut bytes = [0u8; 18];
        self.random
            .fill(&mut bytes)
            .map_err(|_| Status::unavailable("no randomness"))?;
        Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
    }
}

/// A call's identity, for the calls file: never a token, only its audience.
fn describe(caller: &lk::Caller) -> String {
    let audiences: Vec<&str> = caller.tokens.iter().map(|t| t.audience.as_str()).collect();
    format!(
        "caller={}/{} pod={} uid={} audiences=[{}]",
        caller.namespace,
        caller.service_account,
        caller.pod_name,
        caller.pod_uid,
        audiences.join(",")
    )
}

/// The latchkey.plugin.v1 service: Version, Generate, Cleanup (GetSecret and ListSecrets
/// answer UNIMPLEMENTED).
struct Generator(Arc<Accounts>);

#[tonic::async_trait]
impl SecretStorePlugin for Generator {
    async fn version(
        &self,
        _request: Request<lk::VersionRequest>,
    ) -> Result<Response<lk::VersionResponse>, Status> {
        Ok(Response::new(lk::VersionResponse {
            name: "plugin-generator".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            services: vec![csi_proto::latchkey_plugin::SERVICE.into()],
        }))
    }

    async fn generate(
        &self,
        request: Request<lk::GenerateRequest>,
    ) -> Result<Response<lk::GenerateResponse>, Status> {
        let caller = request
            .into_inner()
            .caller
            .ok_or_else(|| Status::invalid_argument("no caller"))?;
        if caller.namespace.is_empty() {
            return Err(Status::unauthenticated("no caller namespace"));
        }
        let id = self.0.create(&caller.namespace);
        let password = self.0.password()?;
        self.0.record(&format!(
            "Generate account={id} {} live={}",
            describe(&caller),
            self.0.live()
        ))?;
        let mut values: std::collections::HashMap<String, Vec<u8>> = [
            (
                "username".to_owned(),
                format!("{}-{id}", caller.service_account).into_bytes(),
            ),
            ("password".to_owned(), password.clone().into_bytes()),
        ]
        .into();
        let mut state = serde_json::to_vec(&serde_json::json!({ "account": id }))
            .map_err(|_| Status::internal("state"))?;
        match self.0.args.misbehave {
            None => {}
            Some(Misbehave::TooManyValues) => {
                for i in 0..10_001 {
                    values.insert(format!("v{i}"), b"x".to_vec());
                }
            }
            Some(Misbehave::HugeState) => {
                state = serde_json::to_vec(&serde_json::json!({
                    "account": id,
                    "pad": password.repeat(200),
                }))
                .map_err(|_| Status::internal("state"))?;
            }
            Some(Misbehave::TextState) => {
                state = format!("account={id} password={password}").into_bytes();
            }
            Some(Misbehave::CleanupNotFound) => {}
            Some(Misbehave::EchoCaller) => {
                values.insert("caller.namespace".into(), caller.namespace.clone().into());
                values.insert(
                    "caller.service_account".into(),
                    caller.service_account.clone().into(),
                );
                values.insert("caller.pod".into(), caller.pod_name.clone().into());
                values.insert("caller.pod_uid".into(), caller.pod_uid.clone().into());
                for t in &caller.tokens {
                    values.insert(format!("token.{}", t.audience), t.token.clone().into());
                }
            }
        }
        Ok(Response::new(lk::GenerateResponse {
            values,
            state,
            ttl_seconds: self
                .0
                .args
                .ttl
                .map(|t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX)),
            renewable: false,
        }))
    }

    async fn cleanup(
        &self,
        request: Request<lk::CleanupRequest>,
    ) -> Result<Response<lk::CleanupResponse>, Status> {
        let r = request.into_inner();
        let caller = r
            .caller
            .ok_or_else(|| Status::invalid_argument("no caller"))?;
        // The state comes back through an object the tenant can edit: parse it, trust nothing.
        let account = serde_json::from_slice::<serde_json::Value>(&r.state)
            .ok()
            .and_then(|v| v.get("account")?.as_str().map(str::to_owned));
        let Some(id) = account else {
            self.0.record(&format!(
                "Cleanup state-invalid {} live={}",
                describe(&caller),
                self.0.live()
            ))?;
            return Err(Status::invalid_argument(
                "the state is not {\"account\": \"<id>\"}",
            ));
        };
        let owned = {
            let mut accounts = self
                .0
                .accounts
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match accounts.get(&id).map(|a| a.namespace == caller.namespace) {
                None => Ok(false),
                Some(false) => Err(()),
                Some(true) => Ok(accounts.remove(&id).is_some()),
            }
        };
        let Ok(deleted) = owned else {
            self.0.record(&format!(
                "Cleanup account={} denied {}",
                id.escape_debug(),
                describe(&caller)
            ))?;
            return Err(Status::permission_denied(format!(
                "account {:?} was not made for namespace {:?}",
                id.escape_debug().to_string(),
                caller.namespace
            )));
        };
        // Already gone is success: Cleanup is idempotent.
        self.0.record(&format!(
            "Cleanup account={} deleted={deleted} {} live={}",
            id.escape_debug(),
            describe(&caller),
            self.0.live()
        ))?;
        if !deleted && self.0.args.misbehave == Some(Misbehave::CleanupNotFound) {
            return Err(Status::not_found(format!(
                "no account {:?}",
                id.escape_debug().to_string()
            )));
        }
        Ok(Response::new(lk::CleanupResponse {}))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let accounts = Arc::new(Accounts {
        args: args.clone(),
        accounts: Mutex::default(),
        next: Mutex::default(),
        random: SystemRandom::new(),
    });
    let router = Server::builder().add_service(SecretStorePluginServer::new(Generator(accounts)));
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    if let Some(address) = &args.listen {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|e| format!("listening on {address}: {e}"))?;
        eprintln!("plugin-generator: serving on {address}");
        router
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
            .await?;
        return Ok(());
    }
    let socket = args
        .socket
        .clone()
        .ok_or("--socket or --listen is required")?;
    match std::fs::remove_file(&socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("removing {}: {e}", socket.display()).into()),
    }
    let listener = UnixListener::bind(&socket)
        .map_err(|e| format!("listening on {}: {e}", socket.display()))?;
    eprintln!("plugin-generator: serving on {}", socket.display());
    router
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await?;
    Ok(())
}
