//! Generators: values made for one volume (or one mirrored Secret) instead of read from a store
//! (a password, a Vault dynamic secret or PKI certificate, an account from a plugin), and how they
//! are renewed and cleaned up. One trait, one file per kind; generators know their backend and
//! nothing of CSI, volumes or ExternalSecrets (like [`crate::providers`], which they build on for
//! logins and plugin channels).
//!
//! What was made is described by a state (lease id, serial, account id): JSON kept in a
//! `GeneratorState` object so that Cleanup can run later, by this process or another. A state
//! never holds a generated value.

pub mod password;
pub mod plugin;
pub mod states;
pub mod vault;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::api::StoreKind;
use crate::api::generator::{
    GeneratorKind, GeneratorObject, PasswordSpec, PluginGeneratorSpec, VaultDynamicSecretSpec,
};
use crate::api::validate::ProviderSpec;
use crate::providers::{BuildContext, ProviderError};
use crate::secret::SecretBytes;

/// A generator's spec, as found in the catalog (a namespaced kind or a ClusterGenerator's block).
#[derive(Debug, Clone, Copy)]
pub enum GeneratorSpec<'a> {
    /// `Password`.
    Password(&'a PasswordSpec),
    /// `VaultDynamicSecret`.
    VaultDynamicSecret(&'a VaultDynamicSecretSpec),
    /// `PluginGenerator`.
    Plugin(&'a PluginGeneratorSpec),
}

impl<'a> GeneratorSpec<'a> {
    /// The spec of a generator object; for a ClusterGenerator, the block its `kind` names
    /// (`None` when that block is missing, which validation refuses).
    pub fn of(object: &'a GeneratorObject) -> Option<Self> {
        match object {
            GeneratorObject::Password(g) => Some(Self::Password(&g.spec)),
            GeneratorObject::VaultDynamicSecret(g) => Some(Self::VaultDynamicSecret(&g.spec)),
            GeneratorObject::Plugin(g) => Some(Self::Plugin(&g.spec)),
            GeneratorObject::Cluster(g) => {
                let specs = &g.spec.generator;
                match g.spec.kind {
                    GeneratorKind::Password => specs.password_spec.as_ref().map(Self::Password),
                    GeneratorKind::VaultDynamicSecret => specs
                        .vault_dynamic_secret_spec
                        .as_ref()
                        .map(Self::VaultDynamicSecret),
                    GeneratorKind::PluginGenerator => {
                        specs.plugin_generator_spec.as_ref().map(Self::Plugin)
                    }
                }
            }
        }
    }

    /// Where a generator's credential Secrets may live follows the rule for stores: a
    /// ClusterGenerator is cluster-scoped (the agent's namespace only), the others namespaced.
    pub fn scope(object: &GeneratorObject) -> StoreKind {
        match object {
            GeneratorObject::Cluster(_) => StoreKind::ClusterSecretStore,
            _ => StoreKind::SecretStore,
        }
    }

    /// The provider block it reaches its backend with, for the rules stores follow (token
    /// audiences, credential Secrets); `None` for a generator without a backend.
    pub fn provider(&self) -> Option<ProviderSpec<'a>> {
        match *self {
            Self::Password(_) => None,
            Self::VaultDynamicSecret(v) => Some(ProviderSpec::Vault(&v.provider)),
            Self::Plugin(p) => Some(ProviderSpec::Plugin(&p.provider)),
        }
    }

    /// Whether what it makes needs no cleanup (a password): no GeneratorState is recorded.
    pub fn is_stateless(&self) -> bool {
        matches!(self, Self::Password(_))
    }

    /// The kind's name, for messages and metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Password(_) => "Password",
            Self::VaultDynamicSecret(_) => "VaultDynamicSecret",
            Self::Plugin(_) => "PluginGenerator",
        }
    }
}

/// A lease on a generated credential: it ends after `ttl` unless renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Time left from when the answer arrived.
    pub ttl: Duration,
    /// Whether the backend allows extending it.
    pub renewable: bool,
}

/// What one Generate call made.
pub struct Generated {
    /// The result, by key (`password`; a certificate's `certificate`, `private_key`, ...).
    pub values: BTreeMap<String, SecretBytes>,
    /// What Cleanup and renewal need (lease id, serial, account id); `None` when there is
    /// nothing to clean up (a password). Never holds a generated value.
    pub state: Option<serde_json::Value>,
    /// The lease, when the credential expires unless renewed.
    pub lease: Option<Lease>,
}

impl std::fmt::Debug for Generated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys only: the values are secrets.
        f.debug_struct("Generated")
            .field("keys", &self.values.keys().collect::<Vec<_>>())
            .field("state", &self.state)
            .field("lease", &self.lease)
            .finish()
    }
}

/// Why a generator did not make, renew or clean up a value. Never contains a generated value
/// or a token.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GeneratorError {
    /// The backend refused or failed (login included).
    #[error(transparent)]
    Backend(#[from] ProviderError),
    /// The generator's spec cannot be used.
    #[error("invalid generator: {0}")]
    Invalid(String),
    /// The backend does not implement the call (a plugin without Generate or Cleanup).
    #[error("{0}")]
    Unimplemented(String),
}

impl GeneratorError {
    /// A short, bounded name for metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Backend(e) => e.kind(),
            Self::Invalid(_) => "invalid",
            Self::Unimplemented(_) => "unimplemented",
        }
    }
}

/// Makes, renews and cleans up values of one kind for one identity.
#[async_trait]
pub trait Generator: Send + Sync {
    /// Makes a new value.
    async fn generate(&self) -> Result<Generated, GeneratorError>;

    /// Extends the lease `state` names. `Ok(None)`: it cannot be extended any more (past its
    /// max TTL, or not renewable), so a new value must be generated.
    async fn renew(&self, _state: &serde_json::Value) -> Result<Option<Lease>, GeneratorError> {
        Ok(None)
    }

    /// Undoes what Generate made (revokes the lease, deletes the account). Idempotent: what is
    /// already gone is success.
    async fn cleanup(&self, _state: &serde_json::Value) -> Result<(), GeneratorError> {
        Ok(())
    }
}

/// Builds the generator `spec` selects, acting as the identity in `ctx` (the pod's, or the
/// service account the controller minted a token for).
pub async fn build(
    spec: GeneratorSpec<'_>,
    ctx: &BuildContext<'_>,
) -> Result<Arc<dyn Generator>, GeneratorError> {
    match spec {
        GeneratorSpec::Password(p) => Ok(Arc::new(password::Password::new(p)?)),
        GeneratorSpec::VaultDynamicSecret(v) => {
            Ok(Arc::new(vault::VaultDynamic::new(v, ctx).await?))
        }
        GeneratorSpec::Plugin(p) => Ok(Arc::new(plugin::PluginGenerator::new(p, ctx).await?)),
    }
}
