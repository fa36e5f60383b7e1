//! Serves Identity, Node and Controller on a unix socket that only root can open (0600): kubelet
//! is the only intended caller.

use std::future::Future;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use csi_proto::v1::controller_server::ControllerServer;
use csi_proto::v1::identity_server::IdentityServer;
use csi_proto::v1::node_server::NodeServer;
use tokio::sync::Notify;
use tonic::transport::Server;
use tracing::warn;

use super::connection::Incoming;
use super::controller::ControllerService;
use super::identity::IdentityService;
use super::node::NodeService;
use crate::publish::Publisher;
use crate::telemetry::Metrics;

/// Why the socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A filesystem operation on the socket path failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was attempted.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Another process answers on the socket.
    #[error("{0} is served by another running process; stop it first")]
    InUse(PathBuf),
    /// Something that is not a socket sits at the path; it is left alone.
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// A bound socket; removes its file when dropped.
pub struct BoundSocket {
    listener: Option<UnixListener>,
    path: PathBuf,
}

impl BoundSocket {
    /// The socket file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the socket: creates the parent directory, replaces a stale socket left by a previous
/// run, refuses a live one, and makes the socket 0600.
pub fn bind(path: &Path) -> Result<BoundSocket, ServeError> {
    let io = |op, source| ServeError::Io {
        op,
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| io("creating the directory of", e))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ServeError::InUse(path.to_path_buf()));
            }
            std::fs::remove_file(path).map_err(|e| io("removing stale socket", e))?;
        }
        Ok(_) => return Err(ServeError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("inspecting", e)),
    }
    // bind(2) creates the socket with the umask applied, so it would be reachable by others until
    // the chmod. It is bound in a fresh 0700 directory beside its final path instead, made 0600
    // there, then renamed into place: never reachable by others, and the process umask is never
    // changed (the volume writer relies on it staying as it was at start, see volume::modes).
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // A short name: a unix socket path is limited to 107 bytes, and this one is a little longer.
    let private = tempfile::Builder::new()
        .prefix(".lk")
        .tempdir_in(parent)
        .map_err(|e| io("creating a private directory beside", e))?;
    let staged = private.path().join("s");
    let listener = UnixListener::bind(&staged).map_err(|e| io("binding", e))?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| io("setting permissions of", e))?;
    std::fs::rename(&staged, path).map_err(|e| io("moving into place", e))?;
    let socket = BoundSocket {
        listener: Some(listener),
        path: path.to_path_buf(),
    };
    Ok(socket)
}

/// Serves the CSI services on a bound socket until `shutdown` completes.
pub async fn serve(
    mut socket: BoundSocket,
    publisher: Arc<Publisher>,
    metrics: Arc<Metrics>,
    node_id: String,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let io = |source| ServeError::Io {
        op: "serving",
        path: socket.path.clone(),
        source,
    };
    let listener = socket
        .listener
        .take()
        .ok_or_else(|| io(std::io::Error::other("socket already served")))?;
    let incoming = Incoming::new(listener).map_err(io)?;
    let stopping = Arc::new(Notify::new());
    let signalled = Arc::clone(&stopping);
    let server = Server::builder()
        .add_service(IdentityServer::new(IdentityService::new(Arc::clone(
            &publisher,
        ))))
        .add_service(NodeServer::new(NodeService::new(
            publisher, metrics, node_id,
        )))
        .add_service(ControllerServer::new(ControllerService))
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            signalled.notify_one();
        });
    // Graceful shutdown waits for every open connection; a client that keeps an idle one open
    // must not keep the agent alive past its pod's termination grace period.
    tokio::select! {
        served = server => served?,
        _ = async {
            stopping.notified().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => warn!("connections still open {SHUTDOWN_GRACE:?} after shutdown began; exiting anyway"),
    }
    Ok(())
}

/// How long in-flight calls may finish after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
