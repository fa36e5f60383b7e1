//! The Latchkey API: CRD types for `latchkey.dev/v1alpha1` (SecretStore, ClusterSecretStore,
//! ExternalSecret, ClusterExternalSecret, PushSecret) and `generators.latchkey.dev/v1alpha1` (see [`generator`]), the agent-side validation of objects it reads, and CRD YAML rendering.
//!
//! Field names follow the External Secrets Operator so an ESO manifest ports by changing
//! `apiVersion`. Types only: nothing here talks to a backend or the API server.

pub mod cluster_external_secret;
pub mod crd;
pub mod credential_scope;
pub mod duration;
pub mod external_secret;
pub mod generator;
pub mod mode;
pub mod provider_kind;
pub mod provider_kinds;
pub mod push_metadata;
pub mod push_secret;
pub mod rules;
#[cfg(test)]
mod rules_tests;
pub mod store;
pub mod store_push;
pub mod validate;

pub use credential_scope::CredentialScope;
pub use external_secret::{ExternalSecret, ExternalSecretSpec, RemoteRef, StoreKind};
pub use store::{ClusterSecretStore, SecretStore, StoreProvider};

/// The API group of every Latchkey kind.
pub const GROUP: &str = "latchkey.dev";
/// The served API version.
pub const VERSION: &str = "v1alpha1";
/// The CSI driver name kubelet knows Latchkey by (pods name it in their volumes).
pub const DRIVER_NAME: &str = "csi.latchkey.dev";
/// The volume attribute naming the ExternalSecret.
pub const ATTR_EXTERNAL_SECRET: &str = "externalSecret";
/// The API group of the generator kinds.
pub const GENERATOR_GROUP: &str = "generators.latchkey.dev";
/// `apiVersion` of the generator kinds.
pub const GENERATOR_API_VERSION: &str = "generators.latchkey.dev/v1alpha1";
/// The finalizer on a GeneratorState: its credential is cleaned up before the object goes.
pub const CLEANUP_FINALIZER: &str = "generators.latchkey.dev/cleanup";
/// kubectl's copy of the last applied object, an annotation holding the whole object again:
/// never carried over by `convert`, never kept in a controller's cache.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
