//! `secrets-store-provider`: a provider for the Kubernetes Secrets Store CSI Driver's protocol
//! (`v1alpha1.CSIDriverProvider`) serving the files of a directory on a unix socket, as the
//! driver's provider pods do. See README.md. Used by `tests/secrets_store_provider.rs`.
//!
//! `Mount` returns every regular file below `--dir` (or below `<dir>/<parameters.subdir>`), each
//! with its path relative to that directory, its mode and its contents, and one object version
//! per file (id = path, version = a hash of the contents). Test knobs are store parameters:
//! `hostilePath` adds a file with that path, `errorCode` answers with that provider error code,
//! `writesFiles: "true"` behaves like an old provider that writes to disk itself (object
//! versions, no files), `delay` waits that long (e.g. `200ms`) before answering.
//!
//! `--calls <file>` gets one line per Mount: the attribute keys, the token audiences, the pod,
//! the object versions sent back and the target path. Never a token or a value.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use clap::Parser;
use csi_proto::secrets_store::v1alpha1::csi_driver_provider_server::{
    CsiDriverProvider, CsiDriverProviderServer,
};
use csi_proto::secrets_store::v1alpha1::{
    Error, File, MountRequest, MountResponse, ObjectVersion, VersionRequest, VersionResponse,
};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// Flags of the provider.
#[derive(Debug, Clone, Parser)]
#[command(about = "Serves a directory over the Secrets Store CSI Driver's provider protocol")]
struct Args {
    /// Unix socket to listen on, `<provider dir>/<name>.sock` (a stale file there is replaced).
    #[arg(long)]
    socket: PathBuf,
    /// Directory whose files every Mount returns.
    #[arg(long)]
    dir: PathBuf,
    /// Append one line per Mount call to this file (never a token or a value).
    #[arg(long)]
    calls: Option<PathBuf>,
}

/// The key the driver passes the pod's tokens under, in the attributes.
const TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// The service: every answer comes from `args.dir`.
struct DirProvider {
    args: Args,
}

#[tonic::async_trait]
impl CsiDriverProvider for DirProvider {
    async fn version(
        &self,
        _request: Request<VersionRequest>,
    ) -> Result<Response<VersionResponse>, Status> {
        Ok(Response::new(VersionResponse {
            version: "v1alpha1".into(),
            runtime_name: "latchkey-example-provider".into(),
            runtime_version: env!("CARGO_PKG_VERSION").into(),
        }))
    }

    async fn mount(
        &self,
        request: Request<MountRequest>,
    ) -> Result<Response<MountResponse>, Status> {
        let request = request.into_inner();
        let attributes: BTreeMap<String, String> = serde_json::from_str(&request.attributes)
            .map_err(|_| Status::invalid_argument("attributes are not a JSON object of strings"))?;
        self.record(&request, &attributes)?;
        if let Some(delay) = attributes.get("delay") {
            let delay = humantime::parse_duration(delay)
                .map_err(|_| Status::invalid_argument("parameter delay is no duration"))?;
            tokio::time::sleep(delay).await;
        }
        let mut dir = self.args.dir.clone();
        if let Some(sub) = attributes.get("subdir") {
            dir.push(sub);
        }
        let mut files = Vec::new();
        collect(&dir, &dir, &mut files).map_err(|e| Status::internal(format!("reading: {e}")))?;
        if let Some(path) = attributes.get("hostilePath") {
            files.push(File {
                path: path.clone(),
                mode: 0o644,
                contents: b"hostile".to_vec(),
            });
        }
        let object_version = files
            .iter()
            .map(|f| ObjectVersion {
                id: f.path.clone(),
                version: format!("{:016x}", hash(&f.contents)),
            })
            .collect();
        let mut response = MountResponse {
            object_version,
            error: None,
            files,
        };
        if let Some(code) = attributes.get("errorCode") {
            response.error = Some(Error { code: code.clone() });
        }
        if attributes.get("writesFiles").is_some_and(|v| v == "true") {
            // An old provider writes to `target_path` itself and returns only versions. This
            // one writes nothing: Latchkey's target path does not exist anyway.
            response.files.clear();
        }
        Ok(Response::new(response))
    }
}

impl DirProvider {
    /// One line in `--calls`: what arrived, without a token or a value.
    fn record(
        &self,
        request: &MountRequest,
        attributes: &BTreeMap<String, String>,
    ) -> Result<(), Status> {
        let Some(calls) = &self.args.calls else {
            return Ok(());
        };
        let audiences: Vec<String> = attributes
            .get(TOKENS_KEY)
            .and_then(|t| serde_json::from_str::<BTreeMap<String, serde_json::Value>>(t).ok())
            .map(|t| {
                t.iter()
                    .map(|(aud, tok)| {
                        let has_token = tok["token"].as_str().is_some_and(|t| !t.is_empty());
                        format!("{aud}{}", if has_token { "" } else { "(no token)" })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let versions: Vec<String> = request
            .current_object_version
            .iter()
            .map(|v| format!("{}={}", v.id, v.version))
            .collect();
        let line = serde_json::json!({
            "keys": attributes.keys().collect::<Vec<_>>(),
            "audiences": audiences,
            "pod": format!(
                "{}/{}/{}/{}",
                attributes.get("csi.storage.k8s.io/pod.namespace").map_or("", String::as_str),
                attributes.get("csi.storage.k8s.io/pod.name").map_or("", String::as_str),
                attributes.get("csi.storage.k8s.io/pod.uid").map_or("", String::as_str),
                attributes.get("csi.storage.k8s.io/serviceAccount.name").map_or("", String::as_str),
            ),
            "versions": versions,
            "target": request.target_path,
            "permission": request.permission,
            "secrets": request.secrets,
        });
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(calls)
            .map_err(|e| Status::internal(format!("cannot record the call: {e}")))?;
        writeln!(file, "{line}").map_err(|e| Status::internal(format!("cannot record: {e}")))
    }
}

/// Every regular file below `dir`, path relative to `root`, sorted.
fn collect(root: &Path, dir: &Path, out: &mut Vec<File>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let meta = entry.metadata()?;
        if meta.is_dir() {
            collect(root, &path, out)?;
        } else if meta.is_file() {
            let relative = path.strip_prefix(root).unwrap_or(&path);
            out.push(File {
                path: relative.to_string_lossy().into_owned(),
                // The permission bits and setuid/setgid/sticky, as a provider might send them.
                mode: (meta.permissions().mode() & 0o7777) as i32,
                contents: std::fs::read(&path)?,
            });
        }
    }
    Ok(())
}

/// A stable hash of `bytes`, for object versions.
fn hash(bytes: &[u8]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
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
        "secrets-store-provider: serving {} on {}",
        args.dir.display(),
        args.socket.display()
    );
    tonic::transport::Server::builder()
        .add_service(CsiDriverProviderServer::new(DirProvider { args }))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
