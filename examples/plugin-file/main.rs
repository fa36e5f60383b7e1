//! `plugin-file`: a secret-store plugin serving secrets from a directory. It speaks Latchkey's
//! `latchkey.plugin.v1` (handshake, the caller's identity, listing, versions) and Crossplane's
//! External Secret Store protocol (`ess.proto.v1alpha1`), on a unix socket or on TCP with mutual
//! TLS. See README.md.
//!
//! A read of name `a/b` reads `<dir>/a/b`. A file holding a JSON object of strings becomes one
//! `data` entry per member; any other file becomes one entry named `value` with the file's
//! bytes. A missing file is NOT_FOUND. Version `v` of `a/b` is the file `<dir>/a/b@v`; the
//! current one is `<dir>/a/b`, whose version is its modification time. Values and tokens are
//! never logged.
//!
//! `--allow <file>` (a JSON object: namespace -> name prefixes) lets a caller's namespace read
//! only names under its prefixes, which is what the caller's identity is for; with it, ESS calls
//! (which carry no identity) are refused.
//!
//! `--misbehave` turns on test knobs chosen by the name's first segment: `slow/<name>` answers
//! after `--delay`, `denied/<name>` is PERMISSION_DENIED, `huge/<name>` answers 17 MiB,
//! `garbage/<name>` is DATA_LOSS with control characters in the message, `whoami/<any>` answers
//! the caller's identity (and its tokens, as entries `token.<audience>`). `--crash-when <file>`
//! exits in the middle of any call while that file exists.
//!
//! `--writable` serves PushSecret / DeleteSecret and ESS ApplySecret / DeleteKeys by writing
//! files (see `write.rs`); without it the plugin is read-only and they answer UNIMPLEMENTED.

mod write;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use clap::Parser;
use csi_proto::ess::v1alpha1 as ess;
use csi_proto::ess::v1alpha1::external_secret_store_plugin_service_server::{
    ExternalSecretStorePluginService, ExternalSecretStorePluginServiceServer,
};
use csi_proto::latchkey_plugin::v1 as lk;
use csi_proto::latchkey_plugin::v1::secret_store_plugin_server::{
    SecretStorePlugin, SecretStorePluginServer,
};
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

/// Flags of the plugin.
#[derive(Debug, Clone, Parser)]
#[command(about = "Serves secrets from a directory over latchkey.plugin.v1 and ess.proto.v1alpha1")]
struct Args {
    /// Unix socket to listen on (a stale socket file there is replaced).
    #[arg(long, required_unless_present = "listen", conflicts_with = "listen")]
    socket: Option<PathBuf>,
    /// TCP address to listen on instead, e.g. `127.0.0.1:4000`.
    #[arg(long)]
    listen: Option<String>,
    /// Server certificate chain (PEM), for TLS on `--listen`.
    #[arg(long, requires_all = ["tls_key", "listen"])]
    tls_cert: Option<PathBuf>,
    /// Server private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// CA (PEM) client certificates must be signed by: mutual TLS, clients without one refused.
    #[arg(long, requires = "tls_cert")]
    client_ca: Option<PathBuf>,
    /// Serve only ess.proto.v1alpha1 (as a plugin written for Crossplane does).
    #[arg(long)]
    ess_only: bool,
    /// Directory holding one file per secret.
    #[arg(long)]
    dir: PathBuf,
    /// JSON object of namespace -> name prefixes that namespace may read (latchkey.plugin.v1).
    #[arg(long)]
    allow: Option<PathBuf>,
    /// Append one line per GetSecret / ListSecrets call to this file (names, never a value).
    #[arg(long)]
    calls: Option<PathBuf>,
    /// Test knobs keyed by the name's first segment (slow/, denied/, huge/, garbage/, whoami/).
    #[arg(long)]
    misbehave: bool,
    /// How long `slow/` names wait before answering.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    delay: Duration,
    /// Exit in the middle of a call while this file exists (a plugin crash).
    #[arg(long)]
    crash_when: Option<PathBuf>,
    /// Serve writes (PushSecret, DeleteSecret, ApplySecret, DeleteKeys); read-only without.
    #[arg(long)]
    writable: bool,
}

/// Bytes of a `huge/` answer: above the 16 MiB that Latchkey accepts.
const HUGE: usize = 17 << 20;

/// Entries of one secret.
type Data = HashMap<String, Vec<u8>>;

/// What both services serve: every answer comes from `args.dir`.
struct Files {
    args: Args,
    /// Namespace -> name prefixes, when `--allow` is given.
    allow: Option<BTreeMap<String, Vec<String>>>,
    /// Held by each write: one read-modify-write at a time.
    writes: tokio::sync::Mutex<()>,
}

impl Files {
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

    /// Exits mid-call while the crash file exists.
    fn maybe_crash(&self) {
        if self.args.crash_when.as_deref().is_some_and(Path::exists) {
            // Mid-call: the request is read, no answer will come.
            std::process::exit(3);
        }
    }

    /// Whether `caller` (None: an ESS call, without identity) may read `name`.
    fn allowed(&self, caller: Option<&lk::Caller>, name: &str) -> bool {
        let Some(allow) = &self.allow else {
            return true;
        };
        caller
            .and_then(|c| allow.get(&c.namespace))
            .is_some_and(|prefixes| prefixes.iter().any(|p| name.starts_with(p.as_str())))
    }

    /// The test knobs: an answer, or the name to read instead.
    async fn knobs<'n>(
        &self,
        name: &'n str,
        caller: Option<&lk::Caller>,
    ) -> Result<Result<Data, &'n str>, Status> {
        if !self.args.misbehave {
            return Ok(Err(name));
        }
        let Some((knob, rest)) = name.split_once('/') else {
            return Ok(Err(name));
        };
        match knob {
            "slow" => {
                tokio::time::sleep(self.args.delay).await;
                Ok(Err(rest))
            }
            "denied" => Err(Status::permission_denied("this caller may not read it")),
            "garbage" => Err(Status::data_loss("garbled\n\u{1b}[31mforged line\u{202e}")),
            "huge" => Ok(Ok([("value".into(), vec![b'x'; HUGE])].into())),
            "whoami" => Ok(Ok(whoami(caller))),
            _ => Ok(Err(name)),
        }
    }

    /// The entries and version of `name` (at `version`, or the current one).
    async fn read(
        &self,
        name: &str,
        version: &str,
        caller: Option<&lk::Caller>,
    ) -> Result<(Data, String), Status> {
        self.maybe_crash();
        let name = match self.knobs(name, caller).await? {
            Ok(data) => return Ok((data, String::new())),
            Err(name) => name,
        };
        if !self.allowed(caller, name) {
            return Err(Status::permission_denied(format!(
                "namespace {:?} may not read {name:?}",
                caller
                    .map(|c| c.namespace.as_str())
                    .unwrap_or("(no identity: ESS)")
            )));
        }
        let mut path = self.path(name)?;
        if !version.is_empty() {
            // `@meta` and `@tmp` are the write side's files, not versions.
            if version.contains(['/', '\0']) || version == "meta" || version == "tmp" {
                return Err(Status::invalid_argument("a version has no '/'"));
            }
            path = self.args.dir.join(format!("{name}@{version}"));
        }
        let bytes = match tokio::fs::read(&path).await {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Status::not_found(format!("no secret {name:?} {version}")));
            }
            Err(e) => {
                return Err(Status::internal(format!(
                    "cannot read {name:?}: {}",
                    e.kind()
                )));
            }
        };
        let version = if version.is_empty() {
            modified(&path)
        } else {
            version.to_owned()
        };
        Ok((entries(bytes), version))
    }

    /// The file of `name`: relative, no `.`, `..` or empty segments, no `@` (versions).
    fn path(&self, name: &str) -> Result<PathBuf, Status> {
        let ok = !name.is_empty()
            && !name.contains(['\0', '@'])
            && name
                .split('/')
                .all(|seg| !seg.is_empty() && seg != "." && seg != "..");
        if !ok {
            return Err(Status::invalid_argument(
                "the name must be a relative path without '.', '..', empty segments or '@'",
            ));
        }
        Ok(self.args.dir.join(name))
    }

    /// Every current secret under the directory, by name.
    fn names(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![self.args.dir.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(path);
                } else if let Ok(rel) = path.strip_prefix(&self.args.dir)
                    && let Some(name) = rel.to_str()
                    && !name.contains('@')
                {
                    out.push(name.to_owned());
                }
            }
        }
        out.sort();
        out
    }
}

/// The caller's identity as entries (tokens included: it is a test knob).
fn whoami(caller: Option<&lk::Caller>) -> Data {
    let Some(c) = caller else {
        return [("identity".to_string(), b"none (ESS)".to_vec())].into();
    };
    let audiences: Vec<&str> = c.tokens.iter().map(|t| t.audience.as_str()).collect();
    let mut data: Data = [
        ("namespace".to_string(), c.namespace.clone().into_bytes()),
        ("pod".to_string(), c.pod_name.clone().into_bytes()),
        (
            "serviceAccount".to_string(),
            c.service_account.clone().into_bytes(),
        ),
        ("audiences".to_string(), audiences.join(",").into_bytes()),
    ]
    .into();
    for t in &c.tokens {
        data.insert(
            format!("token.{}", t.audience),
            t.token.clone().into_bytes(),
        );
    }
    data
}

/// The modification time of `path` as a version (changes when the file is rewritten).
fn modified(path: &Path) -> String {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| format!("mtime-{}.{:09}", d.as_secs(), d.subsec_nanos()))
        .unwrap_or_default()
}

/// A JSON object of strings: one entry per member; anything else: one entry `value`.
fn entries(bytes: Vec<u8>) -> Data {
    match serde_json::from_slice::<HashMap<String, String>>(&bytes) {
        Ok(map) => map.into_iter().map(|(k, v)| (k, v.into_bytes())).collect(),
        Err(_) => [("value".to_string(), bytes)].into(),
    }
}

/// The ESS service (no identity, no versions, no listing).
struct EssService(Arc<Files>);

#[tonic::async_trait]
impl ExternalSecretStorePluginService for EssService {
    async fn get_secret(
        &self,
        request: Request<ess::GetSecretRequest>,
    ) -> Result<Response<ess::GetSecretResponse>, Status> {
        let name = request
            .into_inner()
            .secret
            .map(|s| s.scoped_name)
            .unwrap_or_default();
        self.0
            .record(&format!("GetSecret {}", name.escape_debug()))?;
        let (data, _version) = self.0.read(&name, "", None).await?;
        let metadata = self.0.metadata(&name);
        Ok(Response::new(ess::GetSecretResponse {
            secret: Some(ess::Secret {
                scoped_name: name,
                metadata,
                data,
            }),
        }))
    }

    async fn apply_secret(
        &self,
        request: Request<ess::ApplySecretRequest>,
    ) -> Result<Response<ess::ApplySecretResponse>, Status> {
        let secret = request.into_inner().secret.unwrap_or_default();
        let name = secret.scoped_name;
        self.0
            .record(&format!("ApplySecret {}", name.escape_debug()))?;
        self.0.writable()?;
        if !self.0.allowed(None, &name) {
            return Err(Status::permission_denied("ESS calls carry no identity"));
        }
        self.0.apply(&name, secret.data, &secret.metadata).await?;
        Ok(Response::new(ess::ApplySecretResponse { changed: true }))
    }

    async fn delete_keys(
        &self,
        request: Request<ess::DeleteKeysRequest>,
    ) -> Result<Response<ess::DeleteKeysResponse>, Status> {
        let secret = request.into_inner().secret.unwrap_or_default();
        let name = secret.scoped_name;
        let keys: Vec<String> = secret.data.into_keys().collect();
        self.0.record(&format!(
            "DeleteKeys {} keys={}",
            name.escape_debug(),
            keys.len()
        ))?;
        self.0.writable()?;
        if !self.0.allowed(None, &name) {
            return Err(Status::permission_denied("ESS calls carry no identity"));
        }
        self.0.delete_keys(&name, keys).await?;
        Ok(Response::new(ess::DeleteKeysResponse {}))
    }
}

/// The latchkey.plugin.v1 service.
struct LatchkeyService(Arc<Files>);

/// A call's identity, for the calls file: namespace, service account and token audiences.
fn describe(caller: Option<&lk::Caller>) -> String {
    caller.map_or_else(
        || "caller=none".to_owned(),
        |c| {
            let audiences: Vec<&str> = c.tokens.iter().map(|t| t.audience.as_str()).collect();
            format!(
                "caller={}/{} pod={} audiences=[{}]",
                c.namespace,
                c.service_account,
                c.pod_name,
                audiences.join(",")
            )
        },
    )
}

#[tonic::async_trait]
impl SecretStorePlugin for LatchkeyService {
    async fn version(
        &self,
        _request: Request<lk::VersionRequest>,
    ) -> Result<Response<lk::VersionResponse>, Status> {
        Ok(Response::new(lk::VersionResponse {
            name: "plugin-file".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            services: vec![
                csi_proto::latchkey_plugin::SERVICE.into(),
                csi_proto::latchkey_plugin::ESS_SERVICE.into(),
            ],
        }))
    }

    async fn get_secret(
        &self,
        request: Request<lk::GetSecretRequest>,
    ) -> Result<Response<lk::GetSecretResponse>, Status> {
        let r = request.into_inner();
        let caller = r.caller.as_ref();
        self.0.record(&format!(
            "GetSecret {} version={} {}",
            r.name.escape_debug(),
            r.version.escape_debug(),
            describe(caller)
        ))?;
        let (data, version) = self.0.read(&r.name, &r.version, caller).await?;
        Ok(Response::new(lk::GetSecretResponse { data, version }))
    }

    async fn list_secrets(
        &self,
        request: Request<lk::ListSecretsRequest>,
    ) -> Result<Response<lk::ListSecretsResponse>, Status> {
        let r = request.into_inner();
        let caller = r.caller.as_ref();
        self.0.record(&format!(
            "ListSecrets path={} regexp={} {}",
            r.path.escape_debug(),
            r.name_regexp.escape_debug(),
            describe(caller)
        ))?;
        self.0.maybe_crash();
        let re = if r.name_regexp.is_empty() {
            None
        } else {
            Some(
                regex::Regex::new(&r.name_regexp)
                    .map_err(|_| Status::invalid_argument("name_regexp does not compile"))?,
            )
        };
        let mut secrets = Vec::new();
        for name in self.0.names() {
            let selected = name.starts_with(&r.path)
                && re.as_ref().is_none_or(|re| re.is_match(&name))
                && self.0.allowed(caller, &name);
            if !selected {
                continue;
            }
            if secrets.len() as u32 >= r.max_results.max(1) {
                break;
            }
            let (data, version) = self.0.read(&name, "", caller).await?;
            secrets.push(lk::SecretEntry {
                name,
                data,
                version,
            });
        }
        Ok(Response::new(lk::ListSecretsResponse { secrets }))
    }

    async fn push_secret(
        &self,
        request: Request<lk::PushSecretRequest>,
    ) -> Result<Response<lk::PushSecretResponse>, Status> {
        let r = request.into_inner();
        let caller = r.caller.as_ref();
        self.0.record(&format!(
            "PushSecret {} {}",
            r.name.escape_debug(),
            describe(caller)
        ))?;
        self.0.writable()?;
        if !self.0.allowed(caller, &r.name) {
            return Err(Status::permission_denied("this caller may not write it"));
        }
        let (version, kept) = self
            .0
            .push(
                &r.name,
                (r.data, r.value),
                (r.if_not_exists, r.adopt),
                (r.metadata, r.replace_metadata),
            )
            .await?;
        Ok(Response::new(lk::PushSecretResponse { version, kept }))
    }

    async fn delete_secret(
        &self,
        request: Request<lk::DeleteSecretRequest>,
    ) -> Result<Response<lk::DeleteSecretResponse>, Status> {
        let r = request.into_inner();
        let caller = r.caller.as_ref();
        self.0.record(&format!(
            "DeleteSecret {} keys={} {}",
            r.name.escape_debug(),
            r.keys.len(),
            describe(caller)
        ))?;
        self.0.writable()?;
        if !self.0.allowed(caller, &r.name) {
            return Err(Status::permission_denied("this caller may not delete it"));
        }
        self.0.delete(&r.name, &r.keys).await?;
        Ok(Response::new(lk::DeleteSecretResponse {}))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    // Two rustls backends are in the tree (as in the agent): pick ring before any TLS config.
    latchkey::tls::install_crypto_provider();
    let allow = match &args.allow {
        Some(path) => Some(serde_json::from_slice(&std::fs::read(path)?)?),
        None => None,
    };
    let files = Arc::new(Files {
        args: args.clone(),
        allow,
        writes: tokio::sync::Mutex::new(()),
    });
    let mut server = Server::builder();
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(
            std::fs::read(cert)?,
            std::fs::read(key)?,
        ));
        if let Some(ca) = &args.client_ca {
            tls = tls.client_ca_root(Certificate::from_pem(std::fs::read(ca)?));
        }
        server = server.tls_config(tls)?;
    }
    let latchkey =
        (!args.ess_only).then(|| SecretStorePluginServer::new(LatchkeyService(Arc::clone(&files))));
    let router = server
        .add_service(ExternalSecretStorePluginServiceServer::new(EssService(
            files,
        )))
        .add_optional_service(latchkey);
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    if let Some(address) = &args.listen {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|e| format!("listening on {address}: {e}"))?;
        eprintln!("plugin-file: serving {} on {address}", args.dir.display());
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
    eprintln!(
        "plugin-file: serving {} on {}",
        args.dir.display(),
        socket.display()
    );
    router
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await?;
    Ok(())
}
