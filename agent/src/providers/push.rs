//! The write side of a provider, for PushSecrets: one remote secret written at a time, all of
//! its pushed keys at once (never half of them), and nothing written over or deleted that
//! Latchkey did not write, unless the store allows adopting it.
//!
//! `fake`, AWS Secrets Manager, Vault KV v2, `kubernetes` and `plugin` implement it. Every other provider answers
//! [`PushError::Unimplemented`] through [`unimplemented`].

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::ProviderError;
use crate::api::push_metadata::PushMetadataSpec;
use crate::secret::SecretBytes;

pub use crate::api::push_metadata::{MARK_KEY, MARK_VALUE};

/// Largest remote secret written, in bytes: AWS Secrets Manager's limit (64 KiB), which no
/// other backend Latchkey writes goes below; a tenant's Secret is bounded by the API server at
/// about 1 MiB, so this is what keeps one push small.
pub const MAX_PUSH_BYTES: usize = 64 << 10;

/// What is written into one remote secret.
#[derive(Debug, Clone, PartialEq)]
pub enum PushValue {
    /// The value is the whole remote secret.
    Whole(SecretBytes),
    /// These properties (keys of a JSON object) are merged into the remote secret, all at once;
    /// the others it holds are kept.
    Properties(BTreeMap<String, SecretBytes>),
}

/// How a push treats a remote secret that already exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PushPolicy {
    /// `updatePolicy: IfNotExists`: an existing remote secret is left as it is.
    pub if_not_exists: bool,
    /// The store allows writing over a remote secret Latchkey did not create (and marks it).
    pub adopt: bool,
}

/// What a push did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pushed {
    /// Written; the backend's version of it.
    Written {
        /// AWS VersionId, Vault KV version, the fake's counter.
        version: String,
    },
    /// The remote secret exists and `IfNotExists` kept it as it was.
    Kept,
    /// The remote secret already held exactly what would be written (value and settings):
    /// nothing was written, so a restarted controller costs a read, not a new version; its
    /// version.
    Unchanged {
        /// As for [`Pushed::Written`].
        version: String,
    },
}

/// Why a push or delete did not happen. Names the remote key, never a value.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// The remote secret exists without Latchkey's mark: it belongs to someone else.
    #[error(
        "remote key {remote_key:?} exists and was not created by Latchkey (no {MARK_KEY}: \
         {MARK_VALUE} mark); it is left untouched. Push elsewhere, or let the store adopt it"
    )]
    Conflict {
        /// The remote secret.
        remote_key: String,
    },
    /// The remote secret is not a JSON object, so a property cannot be merged into it.
    #[error(
        "remote key {remote_key:?} does not hold a JSON object, so property {property:?} cannot be merged into it"
    )]
    NotAnObject {
        /// The remote secret.
        remote_key: String,
        /// The property asked for.
        property: String,
    },
    /// A value written as a property must be text (a JSON string).
    #[error("the value for property {property:?} of remote key {remote_key:?} is not UTF-8 text")]
    NotText {
        /// The remote secret.
        remote_key: String,
        /// The property.
        property: String,
    },
    /// What would be written is over the backend's size limit; nothing was written.
    #[error("remote key {remote_key:?} would hold {size} bytes, over the limit of {max}")]
    TooLarge {
        /// The remote secret.
        remote_key: String,
        /// Bytes it would hold.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// The remote secret changed between Latchkey's read of it and its write (a check-and-set
    /// or resourceVersion precondition failed): someone else wrote it meanwhile. Nothing was written; the next push reads again.
    #[error(
        "remote key {remote_key:?} was written by someone else while Latchkey pushed it (its \
         version is no longer {version:?}); nothing was written, the next push tries again"
    )]
    Changed {
        /// The remote secret.
        remote_key: String,
        /// The version Latchkey read and wrote against (Vault's KV version, a resourceVersion).
        version: String,
    },
    /// This remote secret cannot be pushed to this store, whatever is retried (the store's
    /// engine cannot hold Latchkey's mark, or the value has no shape it can store).
    #[error("remote key {remote_key:?} cannot be pushed: {why}")]
    CannotPush {
        /// The remote secret.
        remote_key: String,
        /// Why, and what to do instead.
        why: String,
    },
    /// An entry's `metadata` sets fields that none of the stores written uses; nothing was
    /// written.
    #[error(
        "spec.data[].metadata.spec of remote key {remote_key:?} sets {fields}, which none of \
         the stores written uses (they use {used})"
    )]
    Metadata {
        /// The remote secret.
        remote_key: String,
        /// The fields set that no store uses.
        fields: String,
        /// Those they use.
        used: String,
    },
    /// A value of `spec.data[].metadata.spec` that this store's backend cannot hold; checked
    /// before any write, so nothing was written.
    #[error("spec.data[].metadata.spec.{field}: {why}")]
    BadMetadata {
        /// The field, as named in the manifest.
        field: &'static str,
        /// Why, naming the key at fault (never a value: it may be copied from a secret).
        why: String,
    },
    /// The store's provider cannot be written to (yet).
    #[error("the {provider} provider cannot be pushed to")]
    Unimplemented {
        /// The provider's name as written in the store.
        provider: &'static str,
    },
    /// The store's plugin answered UNIMPLEMENTED to a write: it is read-only.
    #[error(
        "plugin {plugin} does not serve {rpc} (it answered UNIMPLEMENTED): it is read-only, so \
         remote key {remote_key:?} cannot be pushed to it"
    )]
    ReadOnly {
        /// The plugin's endpoint as the store writes it.
        plugin: String,
        /// The RPC it lacks.
        rpc: &'static str,
        /// The remote secret.
        remote_key: String,
    },
    /// The backend refused or failed.
    #[error(transparent)]
    Backend(#[from] ProviderError),
}

impl PushError {
    /// A short, bounded reason for conditions, Events and metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            PushError::Conflict { .. } => "Conflict",
            PushError::NotAnObject { .. } | PushError::NotText { .. } => "InvalidRemote",
            PushError::TooLarge { .. } => "TooLarge",
            PushError::Changed { .. } => "ConcurrentWrite",
            PushError::CannotPush { .. }
            | PushError::Metadata { .. }
            | PushError::BadMetadata { .. } => "Unsupported",
            PushError::Unimplemented { .. } | PushError::ReadOnly { .. } => "Unimplemented",
            PushError::Backend(_) => "BackendError",
        }
    }
}

/// Writes and removes remote secrets of one store, as the identity it was made with.
#[async_trait]
pub trait Pusher: Send + Sync {
    /// Writes `value` into `remote_key`, creating it (marked) when it does not exist, with the
    /// provider settings of `metadata` (checked by [`Pusher::check_metadata`] first).
    async fn push_with(
        &self,
        remote_key: &str,
        value: &PushValue,
        policy: PushPolicy,
        metadata: &PushMetadataSpec,
    ) -> Result<Pushed, PushError>;

    /// [`Pusher::push_with`] without provider settings.
    async fn push(
        &self,
        remote_key: &str,
        value: &PushValue,
        policy: PushPolicy,
    ) -> Result<Pushed, PushError> {
        self.push_with(remote_key, value, policy, &PushMetadataSpec::default())
            .await
    }

    /// The fields of `spec.data[].metadata.spec` this store uses; those of other providers it
    /// ignores (a PushSecret may write stores of several providers with one entry).
    fn metadata_fields(&self) -> &'static [&'static str] {
        &[]
    }

    /// Whether the values of the fields it uses can be written here; checked for every remote
    /// secret before the first write to the store.
    fn check_metadata(&self, _metadata: &PushMetadataSpec) -> Result<(), PushError> {
        Ok(())
    }

    /// Removes what a push wrote: these `properties`, or (empty) the whole remote secret, which
    /// goes only if it carries the mark. A remote secret left an empty object by removing
    /// properties goes too, if marked. Gone already: done.
    async fn delete(&self, remote_key: &str, properties: &[String]) -> Result<(), PushError>;
}

/// The answer of a provider that cannot be written to: every call fails naming it.
pub fn unimplemented(provider: &'static str) -> PushError {
    PushError::Unimplemented { provider }
}

/// `current` (a JSON object, or nothing) with `properties` set, as the bytes to write.
///
/// The JSON document holds the values as plain strings while it is built; only the bytes
/// returned are zeroized when dropped.
pub fn merge_properties(
    remote_key: &str,
    current: Option<&SecretBytes>,
    properties: &BTreeMap<String, SecretBytes>,
) -> Result<SecretBytes, PushError> {
    let not_object = |property: &str| PushError::NotAnObject {
        remote_key: remote_key.to_string(),
        property: property.to_string(),
    };
    let first = || properties.keys().next().map(String::as_str).unwrap_or("");
    let mut object = match current {
        Some(bytes) => match serde_json::from_slice::<serde_json::Value>(bytes.expose()) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => return Err(not_object(first())),
        },
        None => serde_json::Map::new(),
    };
    for (property, value) in properties {
        let text = std::str::from_utf8(value.expose()).map_err(|_| PushError::NotText {
            remote_key: remote_key.to_string(),
            property: property.clone(),
        })?;
        object.insert(
            property.clone(),
            serde_json::Value::String(text.to_string()),
        );
    }
    let bytes =
        serde_json::to_vec(&serde_json::Value::Object(object)).map_err(|_| not_object(first()))?;
    fits(remote_key, SecretBytes::new(bytes))
}

/// `current` without `properties`, as the bytes to write; `None` when nothing is left.
pub fn remove_properties(
    remote_key: &str,
    current: &SecretBytes,
    properties: &[String],
) -> Result<Option<SecretBytes>, PushError> {
    let not_object = || PushError::NotAnObject {
        remote_key: remote_key.to_string(),
        property: properties.first().cloned().unwrap_or_default(),
    };
    let mut object = match serde_json::from_slice::<serde_json::Value>(current.expose()) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => return Err(not_object()),
    };
    for property in properties {
        object.remove(property);
    }
    if object.is_empty() {
        return Ok(None);
    }
    let bytes = serde_json::to_vec(&serde_json::Value::Object(object)).map_err(|_| not_object())?;
    Ok(Some(SecretBytes::new(bytes)))
}

/// `bytes`, if within [`MAX_PUSH_BYTES`].
pub fn fits(remote_key: &str, bytes: SecretBytes) -> Result<SecretBytes, PushError> {
    if bytes.len() > MAX_PUSH_BYTES {
        return Err(PushError::TooLarge {
            remote_key: remote_key.to_string(),
            size: bytes.len(),
            max: MAX_PUSH_BYTES,
        });
    }
    Ok(bytes)
}
