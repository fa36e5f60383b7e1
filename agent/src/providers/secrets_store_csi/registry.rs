//! What every Secrets Store CSI Driver store shares: the provider directory, one gRPC channel
//! per provider socket, the object versions each (store, identity) last got, and each (store,
//! identity)'s latest Mount, so that concurrent fetches (gets and `dataFrom.find` alike) share
//! one call.
//!
//! A provider name matches `^[a-zA-Z0-9_-]{1,30}$` (checked before this is reached), so
//! `<dir>/<name>.sock` is always directly in the directory; the socket is opened as plugin
//! sockets are (no symbolic link followed, checked and connected through one descriptor).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csi_proto::secrets_store::v1alpha1::ObjectVersion;
use tokio::sync::OnceCell;
use tonic::transport::Channel;

use super::super::plugin::socket::{open_socket, unix_channel};
use super::super::{ProviderError, insert_bounded};
use super::response::Mounted;

/// Default of `--secrets-store-provider-dir` (the driver's default; it also knows
/// `/etc/kubernetes/secrets-store-csi-providers`).
pub const DEFAULT_PROVIDER_DIR: &str = "/var/run/secrets-store-csi-providers";

/// Most kept channels, and most kept object-version lists; past it a map starts over.
const MAX_KEPT: usize = 4096;

/// Longest a finished Mount is reused, whatever the fetch's refresh interval: its files are
/// secret values, kept no longer than a storm of pods needs them.
pub const MAX_MOUNT_REUSE: Duration = Duration::from_secs(10);

/// One Mount: empty while in flight, then when it started and what it returned.
pub(super) type SharedMount = Arc<OnceCell<(Instant, Result<Arc<Mounted>, ProviderError>)>>;

/// Shared by every publish.
pub struct SecretsStoreProviders {
    dir: PathBuf,
    channels: Mutex<HashMap<String, Channel>>,
    versions: Mutex<HashMap<String, Vec<ObjectVersion>>>,
    mounts: Mutex<HashMap<String, SharedMount>>,
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
            mounts: Mutex::new(HashMap::new()),
        }
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
        let channel = unix_channel(what.to_owned(), path);
        insert_bounded(&mut channels, MAX_KEPT, name.to_owned(), channel.clone());
        Ok(channel)
    }

    /// The object versions the last Mount for `key` (store and identity) returned.
    pub(super) fn versions(&self, key: &str) -> Vec<ObjectVersion> {
        let versions = self.versions.lock().unwrap_or_else(|e| e.into_inner());
        versions.get(key).cloned().unwrap_or_default()
    }

    /// The Mount a fetch for `key` (store and identity) uses: the one in flight, or one that
    /// succeeded less than `max_age` ago (at most [`MAX_MOUNT_REUSE`]); else a new, empty one
    /// that the caller fills. A failed Mount is shared only with the fetches that waited on it.
    pub(super) fn mount(&self, key: &str, max_age: Option<Duration>) -> SharedMount {
        let max_age = max_age.map_or(MAX_MOUNT_REUSE, |a| a.min(MAX_MOUNT_REUSE));
        let now = Instant::now();
        let mut mounts = self.mounts.lock().unwrap_or_else(|e| e.into_inner());
        // Values no fetch may reuse any more are dropped, not kept until the key comes back.
        mounts.retain(|_, m| reusable(m, now, MAX_MOUNT_REUSE));
        if let Some(m) = mounts.get(key).filter(|m| reusable(m, now, max_age)) {
            return Arc::clone(m);
        }
        let fresh = SharedMount::default();
        insert_bounded(&mut mounts, MAX_KEPT, key.to_owned(), Arc::clone(&fresh));
        fresh
    }

    /// Keeps what a Mount for `key` returned, to send back on the next one.
    pub(super) fn set_versions(&self, key: String, got: Vec<ObjectVersion>) {
        let mut versions = self.versions.lock().unwrap_or_else(|e| e.into_inner());
        insert_bounded(&mut versions, MAX_KEPT, key, got);
    }
}

/// True for a Mount still in flight (if its caller was cancelled, the next one runs it), or one
/// that succeeded less than `max_age` ago.
fn reusable(mount: &SharedMount, now: Instant, max_age: Duration) -> bool {
    match mount.get() {
        None => true,
        Some((started, Ok(_))) => now.saturating_duration_since(*started) < max_age,
        Some((_, Err(_))) => false,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn done(at: Instant, ok: bool) -> (Instant, Result<Arc<Mounted>, ProviderError>) {
        let result = if ok {
            Ok(Arc::new(Mounted {
                files: BTreeMap::new(),
                versions: Vec::new(),
            }))
        } else {
            Err(ProviderError::NotFound)
        };
        (at, result)
    }

    #[test]
    fn mounts_are_shared_in_flight_and_while_fresh_and_never_after_a_failure() {
        let p = SecretsStoreProviders::new(PathBuf::from("/nonexistent"));
        let a = p.mount("shop/web/1", None);
        assert!(Arc::ptr_eq(&a, &p.mount("shop/web/1", None)), "in flight");
        assert!(
            !Arc::ptr_eq(&a, &p.mount("shop/api/1", None)),
            "another key"
        );
        assert!(a.set(done(Instant::now(), true)).is_ok());
        let minute = Some(Duration::from_secs(60));
        assert!(Arc::ptr_eq(&a, &p.mount("shop/web/1", minute)), "fresh");
        let b = p.mount("shop/web/1", Some(Duration::ZERO));
        assert!(!Arc::ptr_eq(&a, &b), "older than this fetch accepts");
        assert!(b.set(done(Instant::now(), false)).is_ok());
        assert!(!Arc::ptr_eq(&b, &p.mount("shop/web/1", None)), "a failure");
        // Past MAX_MOUNT_REUSE a success is dropped whatever the fetch accepts.
        if let Some(old) = Instant::now().checked_sub(MAX_MOUNT_REUSE + Duration::from_secs(1)) {
            let c = p.mount("shop/old/1", None);
            assert!(c.set(done(old, true)).is_ok());
            let hour = Some(Duration::from_secs(3600));
            assert!(!Arc::ptr_eq(&c, &p.mount("shop/old/1", hour)));
        }
    }
}
