//! `plugin-file`: a secret-store plugin serving secrets from a directory, speaking the External
//! Secret Store protocol (`ess.proto.v1alpha1`) on a unix socket. See README.md.
//!
//! A `GetSecret` for scoped name `a/b` reads `<dir>/a/b`. A file holding a JSON object of strings
//! becomes one `data` entry per member; any other file becomes one entry named `value` with the
//! file's bytes. A missing file is NOT_FOUND. Values are never logged.
//!
//! `--misbehave` turns on test knobs chosen by the scoped name's first segment: `slow/<name>`
//! answers after `--delay`, `denied/<name>` is PERMISSION_DENIED, `huge/<name>` answers 17 MiB,
//! `garbage/<name>` is DATA_LOSS with control characters in the message. `--crash-when <file>`
//! exits in the middle of any call while that file exists.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use csi_proto::ess::v1alpha1::external_secret_store_plugin_service_server::{
    ExternalSecretStorePluginService, ExternalSecretStorePluginServiceServer,
};
use csi_proto::ess::v1alpha1::{GetSecretRequest, GetSecretResponse, Secret};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// Flags of the plugin.
#[derive(Debug, Clone, Parser)]
#[command(about = "Serves secrets from a directory over ess.proto.v1alpha1 on a unix socket")]
struct Args {
    /// Unix socket to listen on (a stale socket file there is replaced).
    #[arg(long)]
    socket: PathBuf,
    /// Directory holding one file per secret.
    #[arg(long)]
    dir: PathBuf,
    /// Append one line per GetSecret call to this file (the scoped name, never a value).
    #[arg(long)]
    calls: Option<PathBuf>,
    /// Test knobs keyed by the scoped name's first segment (slow/, denied/, huge/, garbage/).
    #[arg(long)]
    misbehave: bool,
    /// How long `slow/` names wait before answering.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    delay: Duration,
    /// Exit in the middle of a call while this file exists (a plugin crash).
    #[arg(long)]
    crash_when: Option<PathBuf>,
}

/// The service: every answer comes from `args.dir`.
struct FilePlugin {
    args: Args,
}

/// Bytes of a `huge/` answer: above the 16 MiB that Latchkey accepts.
const HUGE: usize = 17 << 20;

#[tonic::async_trait]
impl ExternalSecretStorePluginService for FilePlugin {
    async fn get_secret(
        &self,
        request: Request<GetSecretRequest>,
    ) -> Result<Response<GetSecretResponse>, Status> {
        let name = request
            .into_inner()
            .secret
            .map(|s| s.scoped_name)
            .unwrap_or_default();
        if let Some(calls) = &self.args.calls {
            let line = format!("GetSecret {}\n", name.escape_debug());
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(calls)
                .map_err(|e| Status::internal(format!("cannot record the call: {e}")))?;
            file.write_all(line.as_bytes())
                .map_err(|e| Status::internal(format!("cannot record the call: {e}")))?;
        }
        if self.args.crash_when.as_deref().is_some_and(Path::exists) {
            // Mid-call: the request is read, no answer will come.
            std::process::exit(3);
        }
        let mut name = name.as_str();
        if self.args.misbehave
            && let Some((knob, rest)) = name.split_once('/')
        {
            match knob {
                "slow" => {
                    tokio::time::sleep(self.args.delay).await;
                    name = rest;
                }
                "denied" => return Err(Status::permission_denied("this caller may not read it")),
                "garbage" => {
                    return Err(Status::data_loss("garbled\n\u{1b}[31mforged line\u{202e}"));
                }
                "huge" => return Ok(answer(rest, [("value".into(), vec![b'x'; HUGE])].into())),
                _ => {}
            }
        }
        let path = self.path(name)?;
        let bytes = match tokio::fs::read(&path).await {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Status::not_found(format!("no secret {name:?}")));
            }
            Err(e) => {
                return Err(Status::internal(format!(
                    "cannot read {name:?}: {}",
                    e.kind()
                )));
            }
        };
        Ok(answer(name, entries(bytes)))
    }
}

impl FilePlugin {
    /// The file of `name`: relative, no `.`, `..` or empty segments.
    fn path(&self, name: &str) -> Result<PathBuf, Status> {
        let ok = !name.is_empty()
            && !name.contains('\0')
            && name
                .split('/')
                .all(|seg| !seg.is_empty() && seg != "." && seg != "..");
        if !ok {
            return Err(Status::invalid_argument(
                "scoped_name must be a relative path without '.', '..' or empty segments",
            ));
        }
        Ok(self.args.dir.join(name))
    }
}

/// A JSON object of strings: one entry per member; anything else: one entry `value`.
fn entries(bytes: Vec<u8>) -> HashMap<String, Vec<u8>> {
    match serde_json::from_slice::<HashMap<String, String>>(&bytes) {
        Ok(map) => map.into_iter().map(|(k, v)| (k, v.into_bytes())).collect(),
        Err(_) => [("value".to_string(), bytes)].into(),
    }
}

fn answer(name: &str, data: HashMap<String, Vec<u8>>) -> Response<GetSecretResponse> {
    Response::new(GetSecretResponse {
        secret: Some(Secret {
            scoped_name: name.to_owned(),
            metadata: HashMap::new(),
            data,
        }),
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    match std::fs::remove_file(&args.socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("removing {}: {e}", args.socket.display()).into()),
    }
    let listener = UnixListener::bind(&args.socket)
        .map_err(|e| format!("listening on {}: {e}", args.socket.display()))?;
    eprintln!(
        "plugin-file: serving {} on {}",
        args.dir.display(),
        args.socket.display()
    );
    tonic::transport::Server::builder()
        .add_service(ExternalSecretStorePluginServiceServer::new(FilePlugin {
            args,
        }))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
