//! The Latchkey API: CRD types for `latchkey.dev/v1alpha1` (SecretStore, ClusterSecretStore,
//! ExternalSecret), the agent-side validation of objects it reads, and CRD YAML rendering.
//!
//! Field names follow the External Secrets Operator so an ESO manifest ports by changing
//! `apiVersion`. Types only: nothing here talks to a backend or the API server.

pub mod crd;
pub mod duration;
pub mod external_secret;
pub mod mode;
pub mod rules;
#[cfg(test)]
mod rules_tests;
pub mod store;
pub mod validate;

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
