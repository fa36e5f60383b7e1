//! Backends that hold secret values. One trait; one file (or folder) per provider. Providers know
//! their backend and nothing of CSI, volumes or ExternalSecrets.

pub mod fake;

use std::sync::Arc;

use async_trait::async_trait;

use crate::api::validate::ProviderSpec;
use crate::secret::SecretBytes;

/// One remote value to fetch: a key and an optional provider-specific version.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RemoteKey {
    /// Secret name or path in the backend.
    pub key: String,
    /// Version (AWS VersionStage or `uuid/<id>`, Vault KV version); `None` = current.
    pub version: Option<String>,
}

impl std::fmt::Display for RemoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.version {
            Some(v) => write!(f, "remote key \"{}\" version \"{v}\"", self.key),
            None => write!(f, "remote key \"{}\"", self.key),
        }
    }
}

/// Why a backend did not return a value. Messages never contain values or credentials.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The key (or version) does not exist.
    #[error("not found in the backend")]
    NotFound,
    /// The backend refused the identity.
    #[error("access denied by the backend: {0}")]
    PermissionDenied(String),
    /// The backend could not be reached or failed.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// The backend throttled the request.
    #[error("backend throttled the request: {0}")]
    Throttled(String),
    /// The backend did not answer in time.
    #[error("backend timed out: {0}")]
    Timeout(String),
    /// The store names a provider this build cannot use.
    #[error("provider {0} is not available in this version of Latchkey")]
    Unsupported(&'static str),
}

/// A source of secret values.
#[async_trait]
pub trait Provider: Send + Sync {
    /// Fetches one remote value.
    async fn get(&self, key: &RemoteKey) -> Result<SecretBytes, ProviderError>;
}

/// Builds the provider a store's (validated) spec selects.
pub fn build(spec: ProviderSpec<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    match spec {
        ProviderSpec::Fake(f) => Ok(Arc::new(fake::Fake::new(f))),
        other => Err(ProviderError::Unsupported(other.name())),
    }
}
