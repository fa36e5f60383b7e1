//! What a store lets PushSecrets do beyond writing what Latchkey created (a store field; ESO has
//! none): kept apart from the provider blocks, which say how to reach a backend, not what may
//! be written over there.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `spec.push` of a SecretStore or ClusterSecretStore.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorePush {
    /// PushSecrets with `updatePolicy: Replace` may write over a remote secret Latchkey did not
    /// create, and mark it as Latchkey's (so `deletionPolicy: Delete` may later remove it).
    /// Default false: such a secret is a conflict, left untouched.
    #[serde(default)]
    pub adopt_existing: bool,
}
