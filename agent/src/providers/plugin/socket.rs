//! Where a plugin may listen, and the connection to it.
//!
//! The node agent runs as root: a tenant's store must not make it connect to containerd,
//! kubelet or any other socket of the host. A `unix://` endpoint must name a socket directly in
//! the directory the admin gave as `--plugin-socket-dir` (compared as written), and the socket is
//! opened without following a symbolic link: the agent opens it `O_PATH | O_NOFOLLOW`, checks
//! that the file it got is a socket, and connects through that descriptor
//! (`/proc/self/fd/<n>`), so nothing can be swapped in between the check and the connect.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustix::fs::{FileType, Mode, OFlags};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tower::service_fn;

use super::super::ProviderError;
use crate::api::validate::PluginEndpoint;

/// Default of `--plugin-socket-dir`.
pub const DEFAULT_SOCKET_DIR: &str = "/var/run/latchkey/plugins";

/// Most plugin endpoints with a kept channel; past it the map starts over (channels of stores
/// still in use are re-created lazily on their next call).
const MAX_CHANNELS: usize = 256;

/// How long a TCP connection to a plugin may take to establish.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Shared by every publish: the allowed socket directory, and one gRPC channel per endpoint
/// (connections are made lazily and kept).
pub struct Plugins {
    socket_dir: PathBuf,
    channels: Mutex<HashMap<String, Channel>>,
}

impl Default for Plugins {
    fn default() -> Self {
        Self::new(PathBuf::from(DEFAULT_SOCKET_DIR))
    }
}

impl Plugins {
    /// Plugins whose unix sockets must be directly in `socket_dir`.
    pub fn new(socket_dir: PathBuf) -> Self {
        Self {
            socket_dir,
            channels: Mutex::new(HashMap::new()),
        }
    }

    /// The directory unix endpoints must be in (`--plugin-socket-dir`).
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The channel for `endpoint` (its text, as in the store). A unix socket is checked here,
    /// before any connection, and again on every (re)connect.
    pub fn channel(
        &self,
        text: &str,
        endpoint: PluginEndpoint<'_>,
    ) -> Result<Channel, ProviderError> {
        let socket = match endpoint {
            PluginEndpoint::Unix { dir, name } => {
                let path = self.allowed(text, dir, name)?;
                // Fails early and precisely (missing, symlink, not a socket).
                open_socket(&format!("plugin {text}"), &path)?;
                Some(path)
            }
            PluginEndpoint::Tcp { .. } => None,
        };
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(channel) = channels.get(text) {
            return Ok(channel.clone());
        }
        if channels.len() >= MAX_CHANNELS {
            channels.clear();
        }
        let channel = match (socket, endpoint) {
            (Some(path), _) => unix_channel(format!("plugin {text}"), path),
            (None, PluginEndpoint::Tcp { host, port }) => {
                Endpoint::from_shared(format!("http://{host}:{port}"))
                    .map_err(|_| {
                        ProviderError::Config(format!("plugin {text}: not a usable host:port"))
                    })?
                    .connect_timeout(CONNECT_TIMEOUT)
                    .tcp_nodelay(true)
                    .connect_lazy()
            }
            (None, PluginEndpoint::Unix { .. }) => {
                // `socket` is Some for every unix endpoint (set above).
                return Err(ProviderError::Config(format!(
                    "plugin {text}: unix endpoint without a socket path"
                )));
            }
        };
        channels.insert(text.to_owned(), channel.clone());
        Ok(channel)
    }

    /// `dir/name` when `dir` is the allowed directory.
    fn allowed(&self, text: &str, dir: &str, name: &str) -> Result<PathBuf, ProviderError> {
        let allowed = self.socket_dir.to_string_lossy();
        let allowed = match allowed.trim_end_matches('/') {
            "" => "/",
            trimmed => trimmed,
        };
        if dir != allowed {
            return Err(ProviderError::Config(format!(
                "plugin {text}: the socket must be directly in the plugin socket directory {} \
                 (the agent's --plugin-socket-dir); other paths are refused",
                self.socket_dir.display()
            )));
        }
        Ok(self.socket_dir.join(name))
    }
}

/// A lazily connecting channel to the socket at `path`, re-checked on every connect; `what`
/// names the callee in errors (`plugin unix:///...`). Also used for the Secrets Store CSI
/// Driver's providers.
pub(crate) fn unix_channel(what: String, path: PathBuf) -> Channel {
    // The URI is required by the HTTP/2 client but unused: the connector picks the socket.
    Endpoint::from_static("http://plugin.invalid").connect_with_connector_lazy(service_fn(
        move |_: Uri| {
            let (what, path) = (what.clone(), path.clone());
            async move {
                let fd = open_socket(&what, &path).map_err(std::io::Error::other)?;
                // Through the descriptor: the inode checked is the one connected to.
                let via = format!("/proc/self/fd/{}", fd.as_raw_fd());
                let stream = UnixStream::connect(via).await;
                drop(fd);
                Ok::<_, std::io::Error>(TokioIo::new(stream?))
            }
        },
    ))
}

/// Opens the socket file at `path` without following a symbolic link, checking that it is a
/// socket; `what` names the callee in errors.
pub(crate) fn open_socket(what: &str, path: &Path) -> Result<OwnedFd, ProviderError> {
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::open(path, flags, Mode::empty()).map_err(|e| {
        if e == rustix::io::Errno::NOENT {
            ProviderError::Unavailable(format!(
                "{what}: no socket at {} (is it running?)",
                path.display()
            ))
        } else {
            ProviderError::Unavailable(format!("{what}: cannot open {}: {e}", path.display()))
        }
    })?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| {
        ProviderError::Unavailable(format!("{what}: cannot stat {}: {e}", path.display()))
    })?;
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Socket => Ok(fd),
        FileType::Symlink => Err(ProviderError::Config(format!(
            "{what}: {} is a symbolic link; sockets must be directly in the allowed \
             directory, links are not followed",
            path.display()
        ))),
        _ => Err(ProviderError::Config(format!(
            "{what}: {} is not a socket",
            path.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unix<'a>(dir: &'a str, name: &'a str) -> PluginEndpoint<'a> {
        PluginEndpoint::Unix { dir, name }
    }

    #[tokio::test]
    async fn only_sockets_directly_in_the_directory_are_used() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_str().unwrap().to_owned();
        let plugins = Plugins::new(tmp.path().join("")); // a trailing '/' is ignored
        let _listener = tokio::net::UnixListener::bind(tmp.path().join("p.sock")).unwrap();
        assert!(plugins.channel("ok", unix(&dir, "p.sock")).is_ok());

        let other = "/var/run/containerd";
        let err = plugins
            .channel("x", unix(other, "containerd.sock"))
            .unwrap_err();
        assert!(matches!(err, ProviderError::Config(ref m) if m.contains("--plugin-socket-dir")));

        std::os::unix::fs::symlink(
            "/var/run/containerd/containerd.sock",
            tmp.path().join("l.sock"),
        )
        .unwrap();
        let err = plugins.channel("l", unix(&dir, "l.sock")).unwrap_err();
        assert!(matches!(err, ProviderError::Config(ref m) if m.contains("symbolic link")));

        std::fs::write(tmp.path().join("f.sock"), "").unwrap();
        let err = plugins.channel("f", unix(&dir, "f.sock")).unwrap_err();
        assert!(matches!(err, ProviderError::Config(ref m) if m.contains("not a socket")));

        let err = plugins
            .channel("m", unix(&dir, "missing.sock"))
            .unwrap_err();
        assert!(matches!(err, ProviderError::Unavailable(ref m) if m.contains("is it running")));
    }
}
