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
use std::sync::{Arc, Mutex};

use hyper_util::rt::TokioIo;
use rustix::fs::{FileType, Mode, OFlags};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tower::service_fn;

use super::super::ProviderError;
use super::CONNECT_TIMEOUT;
use super::tls::Material;
use crate::api::validate::plugin::PluginEndpoint;

/// Default of `--plugin-socket-dir`.
pub const DEFAULT_SOCKET_DIR: &str = "/var/run/latchkey/plugins";

/// Most plugin endpoints with a kept channel; past it the map starts over (channels of stores
/// still in use are re-created lazily on their next call).
const MAX_CHANNELS: usize = 256;

/// Which protocol a plugin serves, as its `Version` answer told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// `latchkey.plugin.v1` (identity, listing, versions).
    Latchkey,
    /// Only Crossplane's `ess.proto.v1alpha1`.
    Ess,
}

/// The handshake's answer for one channel, asked once and forgotten when the connection fails
/// (a restarted plugin may serve something else).
#[derive(Debug, Default)]
pub(crate) struct Handshake(Mutex<Option<Protocol>>);

impl Handshake {
    /// The answer, if known.
    pub(crate) fn get(&self) -> Option<Protocol> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the answer.
    pub(crate) fn set(&self, protocol: Protocol) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(protocol);
    }

    /// Forgets the answer: the next call asks again.
    pub(crate) fn forget(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// A channel to a plugin and its handshake's answer.
#[derive(Clone, Debug)]
pub(crate) struct Connection {
    /// The gRPC channel (shared by every store naming the endpoint with the same TLS).
    pub channel: Channel,
    /// Which protocol the plugin serves, once asked.
    pub handshake: Arc<Handshake>,
}

/// Shared by every publish: the allowed socket directory, and one gRPC channel per endpoint
/// and TLS material (connections are made lazily and kept).
pub struct Plugins {
    socket_dir: PathBuf,
    channels: Mutex<HashMap<String, Connection>>,
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

    /// The channel for `endpoint` (its text, as in the store), with TLS when `tls` is given (TCP
    /// only). A unix socket is checked here, before any connection, and again on every
    /// (re)connect.
    pub(crate) fn channel(
        &self,
        text: &str,
        endpoint: PluginEndpoint<'_>,
        tls: Option<&Material>,
    ) -> Result<Connection, ProviderError> {
        let socket = match endpoint {
            PluginEndpoint::Unix { dir, name } => {
                let path = self.allowed(text, dir, name)?;
                // Fails early and precisely (missing, symlink, not a socket).
                open_socket(&format!("plugin {text}"), &path)?;
                Some(path)
            }
            PluginEndpoint::Tcp { .. } => None,
        };
        let key = match tls {
            Some(material) => format!("{text}#tls-{}", material.fingerprint()),
            None => text.to_owned(),
        };
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(connection) = channels.get(&key) {
            return Ok(connection.clone());
        }
        let channel = match (socket, endpoint) {
            (Some(path), _) if tls.is_none() => unix_channel(format!("plugin {text}"), path),
            (Some(_), _) => {
                // Validation refuses `tls` with a unix endpoint; kept as a second line.
                return Err(ProviderError::Config(format!(
                    "plugin {text}: plugin.tls is only for a host:port endpoint"
                )));
            }
            (None, PluginEndpoint::Tcp { host, port }) => {
                let scheme = if tls.is_some() { "https" } else { "http" };
                let mut endpoint = Endpoint::from_shared(format!("{scheme}://{host}:{port}"))
                    .map_err(|_| {
                        ProviderError::Config(format!("plugin {text}: not a usable host:port"))
                    })?
                    .connect_timeout(CONNECT_TIMEOUT)
                    .tcp_nodelay(true);
                if let Some(material) = tls {
                    // Fails only for unusable material, which `Material::load` checked; tonic's
                    // message is not quoted (it could describe the key).
                    endpoint = endpoint
                        .tls_config(material.client_config(host))
                        .map_err(|_| {
                            ProviderError::Config(format!(
                                "plugin {text}: plugin.tls: the CA bundle or the client \
                                 certificate and key cannot be used together"
                            ))
                        })?;
                }
                endpoint.connect_lazy()
            }
            (None, PluginEndpoint::Unix { .. }) => {
                // `socket` is Some for every unix endpoint (set above).
                return Err(ProviderError::Config(format!(
                    "plugin {text}: unix endpoint without a socket path"
                )));
            }
        };
        let connection = Connection {
            channel,
            handshake: Arc::default(),
        };
        super::super::insert_bounded(&mut channels, MAX_CHANNELS, key, connection.clone());
        Ok(connection)
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
        assert!(plugins.channel("ok", unix(&dir, "p.sock"), None).is_ok());

        let other = "/var/run/containerd";
        let err = plugins
            .channel("x", unix(other, "containerd.sock"), None)
            .unwrap_err();
        assert!(matches!(err, ProviderError::Config(ref m) if m.contains("--plugin-socket-dir")));

        std::os::unix::fs::symlink(
            "/var/run/containerd/containerd.sock",
            tmp.path().join("l.sock"),
        )
        .unwrap();
        let err = plugins
            .channel("l", unix(&dir, "l.sock"), None)
            .unwrap_err();
        assert!(matches!(err, ProviderError::Config(ref m) if m.contains("symbolic link")));

        std::fs::write(tmp.path().join("f.sock"), "").unwrap();
        let err = plugins
            .channel("f", unix(&dir, "f.sock"), None)
            .unwrap_err();
        assert!(matches!(err, ProviderError::Config(ref m) if m.contains("not a socket")));

        let err = plugins
            .channel("m", unix(&dir, "missing.sock"), None)
            .unwrap_err();
        assert!(matches!(err, ProviderError::Unavailable(ref m) if m.contains("is it running")));
    }
}
