//! Cleanup of one state's credential: the generator rebuilt from `spec.resource`, acting as the
//! service account the state names in its own namespace.
//!
//! Everything here is tenant-written (a GeneratorState is an ordinary namespaced object), so the
//! identity is never the controller's: credential Secrets are read as that service account from
//! the state's namespace (store-kind `SecretStore` rules, whatever kind the resource claims),
//! and tokens come only from [`Identities`], which applies the mirror's opt-in rules.

use std::sync::Arc;

use async_trait::async_trait;
use kube::ResourceExt;
use serde_json::Value;

use crate::api::StoreKind;
use crate::api::generator::{GeneratorObject, GeneratorState};
use crate::generators::states::{LABEL_POD, LABEL_POD_UID, LABEL_SERVICE_ACCOUNT};
use crate::generators::{self, GeneratorError, GeneratorSpec};
use crate::identity::{PodInfo, PodTokens};
use crate::providers::{self, BuildContext};

/// Largest `spec.resource` read, encoded: a generator's spec is well under a kilobyte, and a
/// tenant writes it.
const MAX_RESOURCE_BYTES: usize = 64 * 1024;

/// Why the controller cannot act as a service account. Never contains a token.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct IdentityError {
    /// What was refused and what to do (names the service account and audience).
    pub message: String,
    /// Retrying cannot help (the generator's auth asks for a token the controller never mints).
    pub permanent: bool,
}

/// Mints the tokens a generator's cleanup needs, as a service account.
#[async_trait]
pub trait Identities: Send + Sync {
    /// The tokens of `namespace/service_account` for exactly the audiences `generator` needs,
    /// only when the service account opted in (as the mirror controller's).
    async fn tokens(
        &self,
        namespace: &str,
        service_account: &str,
        generator: GeneratorSpec<'_>,
    ) -> Result<PodTokens, IdentityError>;
}

/// Builds a generator as an identity and runs its Cleanup.
#[async_trait]
pub trait Cleaner: Send + Sync {
    /// Undoes what `state` records, acting as `identity`.
    async fn cleanup(
        &self,
        generator: GeneratorSpec<'_>,
        identity: &PodInfo,
        state: &Value,
    ) -> Result<(), GeneratorError>;
}

/// The real generators ([`generators::build`]).
pub struct Generators {
    env: providers::Env,
}

impl Generators {
    /// Generators built with the controller's provider environment (shared login caches and
    /// plugin channels).
    pub fn new(env: providers::Env) -> Arc<Self> {
        Arc::new(Self { env })
    }
}

#[async_trait]
impl Cleaner for Generators {
    async fn cleanup(
        &self,
        generator: GeneratorSpec<'_>,
        identity: &PodInfo,
        state: &Value,
    ) -> Result<(), GeneratorError> {
        let ctx = BuildContext {
            env: &self.env,
            pod: identity,
            // Always the namespaced rules: credentials are read as the service account from
            // the state's namespace, never from the controller's own (see the module doc).
            scope: StoreKind::SecretStore.into(),
            max_age: None,
        };
        generators::build(generator, &ctx)
            .await?
            .cleanup(state)
            .await
    }
}

/// Why a credential was not cleaned up. Never contains a value or a token.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    /// `spec.resource` is not a generator this version knows.
    #[error("spec.resource: {0}")]
    Resource(String),
    /// The state names no usable service account.
    #[error("label {LABEL_SERVICE_ACCOUNT}: {0}")]
    ServiceAccount(String),
    /// No token for the service account.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The generator's Cleanup failed (login included).
    #[error("{kind} cleanup: {source}")]
    Generator {
        /// The generator's kind.
        kind: &'static str,
        /// What failed.
        source: GeneratorError,
    },
}

impl CleanupError {
    /// Retrying cannot help: the state itself is unusable.
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::Resource(_) | Self::ServiceAccount(_) => true,
            Self::Identity(e) => e.permanent,
            Self::Generator { source, .. } => !matches!(source, GeneratorError::Backend(_)),
        }
    }
}

/// The generator `spec.resource` recorded (as [`GeneratorObject::to_resource`] writes it),
/// checked as a live generator would be; a ClusterGenerator's wrapped spec is used, with
/// namespaced credential rules all the same (see the module doc).
pub(crate) fn decode(resource: &Value) -> Result<GeneratorObject, CleanupError> {
    let size = serde_json::to_vec(resource).map_or(usize::MAX, |b| b.len());
    if size > MAX_RESOURCE_BYTES {
        return Err(CleanupError::Resource(format!(
            "larger than {MAX_RESOURCE_BYTES} bytes"
        )));
    }
    let object = GeneratorObject::from_resource(resource).map_err(CleanupError::Resource)?;
    crate::api::validate::generator::generator(&object)
        .map_err(|e| CleanupError::Resource(e.to_string()))?;
    if GeneratorSpec::of(&object).is_none() {
        return Err(CleanupError::Resource(format!(
            "the {} sets no generator block for its kind",
            object.kind()
        )));
    }
    Ok(object)
}

/// The service account the state names, checked to be a valid name.
pub(crate) fn service_account(state: &GeneratorState) -> Result<String, CleanupError> {
    let name = state
        .labels()
        .get(LABEL_SERVICE_ACCOUNT)
        .ok_or_else(|| CleanupError::ServiceAccount("missing".into()))?;
    crate::api::validate::object_name("service account", name)
        .map_err(|e| CleanupError::ServiceAccount(e.to_string()))?;
    Ok(name.clone())
}

/// Cleans up what `recorded` (the state's `spec.state`) names.
pub(crate) async fn clean(
    state: &GeneratorState,
    recorded: &Value,
    identities: &dyn Identities,
    cleaner: &dyn Cleaner,
) -> Result<(), CleanupError> {
    let object = decode(&state.spec.resource)?;
    let generator = GeneratorSpec::of(&object).ok_or_else(|| {
        CleanupError::Resource(format!("the {} sets no generator block", object.kind()))
    })?;
    let namespace = state.namespace().unwrap_or_default();
    let service_account = service_account(state)?;
    let tokens = identities
        .tokens(&namespace, &service_account, generator)
        .await?;
    let labels = state.labels();
    let identity = PodInfo {
        namespace,
        name: labels.get(LABEL_POD).cloned().unwrap_or_default(),
        uid: labels.get(LABEL_POD_UID).cloned().unwrap_or_default(),
        service_account,
        tokens,
    };
    cleaner
        .cleanup(generator, &identity, recorded)
        .await
        .map_err(|source| CleanupError::Generator {
            kind: generator.kind(),
            source,
        })
}
