//! What every Secrets Store CSI Driver store shares: the provider directory, one gRPC channel
//! per provider socket, and the object versions each (store, identity) last got.
//!
//! A provider name matches `^[a-zA-Z0-9_-]{1,30}$` (checked before this is reached), so
//! `<dir>/<name>.sock` is always directly in the directory; the socket is opened as plugin
//! sockets are (no symbolic link followed, checked and connected through one descriptor).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use csi_proto::secrets_store::v1alpha1::ObjectVersion;
use tonic::transport::Channel;

use super::super::ProviderError;
use super::super::plugin::socket::{open_socket, unix_channel};

/// Default of `--secrets-store-provider-dir` (the driver's default; it also knows
/// `/etc/kubernetes/secrets-store-csi-providers`).
pub const DEFAULT_PROVIDER_DIR: &str = "/var/run/secrets-store-csi-providers";

/// Most kept channels, and most kept object-version lists; past it a map starts over.
const MAX_KEPT: usize = 4096;

/// Shared by every publish.
pub struct SecretsStoreProviders {
    dir: PathBuf,
    channels: Mutex<HashMap<String, Channel>>,
    versions: Mutex<HashMap<String, Vec<ObjectVersion>>>,
}

impl Default for SecretsStoreProviders {
    fn default() -> Self {
        Self::new(PathBuf::from(DEFAULT_PROVIDER_DIR))
    }
}

impl SecretsStoreProviders {
    /// Providers whose sockets are `<dir>/<provider>.sock`.
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            channels: Mutex::new(HashMap::new()),
            versions: Mutex::new(HashMap::new()),
        }
    }

    /// The provider directory (`--secrets-store-provider-dir`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The channel to provider `name` (already validated); `what` names it in errors. The
    /// socket is checked here and again on every (re)connect.
    pub(super) fn channel(&self, what: &str, name: &str) -> Result<Channel, ProviderError> {
        let path = self.dir.join(format!("{name}.sock"));
        // Fails early and precisely (missing, symbolic link, not a socket).
        open_socket(what, &path)?;
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(channel) = channels.get(name) {
            return Ok(channel.clone());
        }
        if channels.len() >= MAX_KEPT {
            channels.clear();
        }
        let channel = unix_channel(what.to_owned(), path);
        channels.insert(name.to_owned(), channel.clone());
        Ok(channel)
    }

    /// The object versions the last Mount for `key` (store and identity) returned.
    pub(super) fn versions(&self, key: &str) -> Vec<ObjectVersion> {
        let versions = self.versions.lock().unwrap_or_else(|e| e.into_inner());
        versions.get(key).cloned().unwrap_or_default()
    }

    /// Keeps what a Mount for `key` returned, to send back on the next one.
    pub(super) fn set_versions(&self, key: String, got: Vec<ObjectVersion>) {
        let mut versions = self.versions.lock().unwrap_or_else(|e| e.into_inner());
        if versions.len() >= MAX_KEPT && !versions.contains_key(&key) {
            versions.clear();
        }
        versions.insert(key, got);
    }
}
