//! Pushes to a `plugin` store: the same channel, handshake, timeout and caller as reads.
//!
//! A latchkey.plugin.v1 plugin gets `PushSecret` / `DeleteSecret` with the caller (the
//! PushSecret's service account and its tokens for `plugin.audiences`); the plugin keeps the
//! contract written in latchkey_plugin.proto (marks what it creates, answers ALREADY_EXISTS for a
//! secret it did not mark unless `adopt`, writes all entries or none).
//!
//! An entry's `metadata.spec.customMetadata` (and `mergePolicy`) go with the push: to the plugin
//! in the request, or into the ESS secret's metadata beside the mark.
//!
//! An ESS-only plugin has no such RPCs and carries no identity: Latchkey reads the secret
//! (`GetSecret`), checks the mark in its `metadata` itself, then writes it whole (`ApplySecret`,
//! the entries kept plus those pushed, the mark added to the metadata) or removes keys
//! (`DeleteKeys`). ESS has no check-and-set: a write between the read and the apply is lost. A
//! store listing `plugin.audiences` is refused, as for reads.
//!
//! Writes are never retried (a timeout or a reset connection may hide a write that happened; the
//! next reconcile pushes again from what is there then); the handshake and the ESS read before
//! a write are retried as reads are. UNIMPLEMENTED from the plugin is [`PushError::ReadOnly`].

use std::collections::HashMap;
use std::future::Future;

use async_trait::async_trait;
use csi_proto::ess::v1alpha1 as ess;
use csi_proto::ess::v1alpha1::external_secret_store_plugin_service_client::ExternalSecretStorePluginServiceClient;
use csi_proto::latchkey_plugin::v1 as lk;
use csi_proto::latchkey_plugin::v1::secret_store_plugin_client::SecretStorePluginClient;
use tonic::{Code, Status};

use super::socket::Protocol;
use super::status::{self, Failure};
use super::{ESS_GET, ESS_GET_RPC, Plugin, grpc_answer};
use crate::api::push_metadata::{MetadataMergePolicy, PushMetadataSpec};
use crate::api::store::PluginProvider;
use crate::providers::push::{
    MARK_KEY, MARK_VALUE, MAX_PUSH_BYTES, PushError, PushPolicy, PushValue, Pushed, Pusher, fits,
};
use crate::providers::{BuildContext, ProviderError};
use crate::secret::SecretBytes;
use crate::telemetry::escape::printable;

const PUSH_RPC: &str = "latchkey.plugin.v1.SecretStorePlugin/PushSecret";
const DELETE_RPC: &str = "latchkey.plugin.v1.SecretStorePlugin/DeleteSecret";
const ESS_APPLY_RPC: &str = "ess.proto.v1alpha1.ExternalSecretStorePluginService/ApplySecret";
const ESS_DELETE_RPC: &str = "ess.proto.v1alpha1.ExternalSecretStorePluginService/DeleteKeys";

/// Largest answer to a write: a version (at most 256 characters) and a flag, with room to spare;
/// a larger one is garbage.
const MAX_WRITE_ANSWER_BYTES: usize = 4 << 10;

/// A write's result: the plugin's refusal as a push error, or a failed call.
type Written<T> = Result<Result<T, PushError>, Failure>;

/// Writes one `plugin` store as one caller.
pub struct PluginPush {
    plugin: Plugin,
}

impl PluginPush {
    /// The store's plugin, as the caller of `ctx` (the PushSecret's account); nothing is sent yet.
    pub async fn new(spec: &PluginProvider, ctx: &BuildContext<'_>) -> Result<Self, ProviderError> {
        Ok(Self {
            plugin: Plugin::new(spec, ctx).await?,
        })
    }

    /// The protocol served, asked as reads ask it (with their retries).
    async fn protocol(&self) -> Result<Protocol, PushError> {
        Ok(self.plugin.with_retries(|| self.plugin.protocol()).await?)
    }

    /// One write call, never repeated.
    async fn once<T, F, Fut>(&self, call: F) -> Result<T, PushError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Written<T>>,
    {
        self.plugin.with_retries_up_to(0, call).await?
    }

    /// The plugin's answer to a write that failed: its refusals as push errors (UNIMPLEMENTED:
    /// read-only; ALREADY_EXISTS: not Latchkey's), the rest as reads map them.
    fn refused<T>(&self, remote_key: &str, rpc: &'static str, s: &Status) -> Written<T> {
        // A status with a source was made by the client (transport, deadline), not answered.
        let answered = std::error::Error::source(s).is_none();
        match s.code() {
            Code::Unimplemented if answered => Ok(Err(PushError::ReadOnly {
                plugin: self.plugin.at().to_string(),
                rpc,
                remote_key: remote_key.to_string(),
            })),
            Code::AlreadyExists if answered => Ok(Err(PushError::Conflict {
                remote_key: remote_key.to_string(),
            })),
            Code::OutOfRange if s.message().contains("decoded message length too large") => {
                Err(Failure {
                    error: ProviderError::Unavailable(format!(
                        "plugin {} answered {rpc} with more than {MAX_WRITE_ANSWER_BYTES} bytes",
                        self.plugin.at()
                    )),
                    retry: false,
                })
            }
            _ => Err(status::failure(
                self.plugin.at(),
                rpc,
                self.plugin.timeout(),
                s,
            )),
        }
    }

    /// latchkey.plugin.v1 PushSecret.
    async fn push_latchkey(
        &self,
        remote_key: &str,
        value: &PushValue,
        policy: PushPolicy,
        metadata: &PushMetadataSpec,
    ) -> Written<Pushed> {
        let (data, whole) = match value {
            PushValue::Whole(bytes) => (HashMap::new(), Some(bytes.expose().to_vec())),
            PushValue::Properties(properties) => (
                properties
                    .iter()
                    .map(|(k, v)| (k.clone(), v.expose().to_vec()))
                    .collect(),
                None,
            ),
        };
        let mut request = tonic::Request::new(lk::PushSecretRequest {
            config: self.plugin.lk_config(),
            caller: Some(self.plugin.caller()),
            name: remote_key.to_string(),
            data,
            value: whole,
            if_not_exists: policy.if_not_exists,
            adopt: policy.adopt,
            metadata: metadata.custom_metadata.clone().into_iter().collect(),
            replace_metadata: replaces(metadata),
        });
        let timeout = self.plugin.timeout();
        request.set_timeout(timeout);
        let mut client = SecretStorePluginClient::new(self.plugin.channel())
            .max_decoding_message_size(MAX_WRITE_ANSWER_BYTES);
        let answer = match tokio::time::timeout(timeout, client.push_secret(request)).await {
            Err(_) => return Err(status::timed_out(self.plugin.at(), PUSH_RPC, timeout)),
            Ok(Err(s)) => return self.refused(remote_key, PUSH_RPC, &s),
            Ok(Ok(answer)) => answer.into_inner(),
        };
        let version = self.plugin.checked_version(remote_key, &answer.version)?;
        if answer.kept {
            return Ok(Ok(Pushed::Kept));
        }
        tracing::debug!(plugin = %self.plugin.at(), key = %printable(remote_key, 200), version, "pushed to plugin");
        Ok(Ok(Pushed::Written {
            version: version.to_string(),
        }))
    }

    /// latchkey.plugin.v1 DeleteSecret.
    async fn delete_latchkey(&self, remote_key: &str, keys: &[String]) -> Written<()> {
        let mut request = tonic::Request::new(lk::DeleteSecretRequest {
            config: self.plugin.lk_config(),
            caller: Some(self.plugin.caller()),
            name: remote_key.to_string(),
            keys: keys.to_vec(),
        });
        let timeout = self.plugin.timeout();
        request.set_timeout(timeout);
        let mut client = SecretStorePluginClient::new(self.plugin.channel())
            .max_decoding_message_size(MAX_WRITE_ANSWER_BYTES);
        match tokio::time::timeout(timeout, client.delete_secret(request)).await {
            Err(_) => Err(status::timed_out(self.plugin.at(), DELETE_RPC, timeout)),
            // Gone already: done.
            Ok(Err(s)) if s.code() == Code::NotFound && std::error::Error::source(&s).is_none() => {
                Ok(Ok(()))
            }
            Ok(Err(s)) => self.refused(remote_key, DELETE_RPC, &s),
            Ok(Ok(_)) => Ok(Ok(())),
        }
    }

    /// The ESS secret as it is (None: missing), read as reads are (with their retries).
    async fn ess_current(&self, remote_key: &str) -> Result<Option<ess::Secret>, PushError> {
        let read = self
            .plugin
            .with_retries(|| async {
                let mut request = tonic::Request::new(ess::GetSecretRequest {
                    config: self.ess_config(),
                    secret: Some(ess::Secret {
                        scoped_name: remote_key.to_string(),
                        ..Default::default()
                    }),
                });
                let timeout = self.plugin.timeout();
                request.set_timeout(timeout);
                let call = grpc_answer::unary::<_, ess::GetSecretResponse>(
                    self.plugin.channel(),
                    &ESS_GET,
                    request,
                );
                match tokio::time::timeout(timeout, call).await {
                    Err(_) => Err(status::timed_out(self.plugin.at(), ESS_GET_RPC, timeout)),
                    Ok(Err(s)) => Err(status::failure(self.plugin.at(), ESS_GET_RPC, timeout, &s)),
                    // The parse budget's share is released here: the answer is small (bounded
                    // by the push limit once checked below) or refused.
                    Ok(Ok(answer)) => Ok(answer.into_inner().value.secret),
                }
            })
            .await;
        match read {
            // Plugins written for Crossplane answer a missing secret with an empty one.
            Ok(Some(secret)) if !secret.data.is_empty() => Ok(Some(secret)),
            Ok(_) | Err(ProviderError::NotFound) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn ess_config(&self) -> Option<ess::ConfigReference> {
        self.plugin.config.as_ref().map(|c| ess::ConfigReference {
            api_version: c.api_version.clone(),
            kind: c.kind.clone(),
            name: c.name.clone(),
        })
    }

    /// One ESS ApplySecret (`rpc` names it) or DeleteKeys of `secret`, never repeated.
    async fn ess_write(&self, secret: &ess::Secret, delete: bool) -> Result<(), PushError> {
        let rpc = if delete {
            ESS_DELETE_RPC
        } else {
            ESS_APPLY_RPC
        };
        let remote_key = secret.scoped_name.as_str();
        self.once(|| async {
            let timeout = self.plugin.timeout();
            let mut client = ExternalSecretStorePluginServiceClient::new(self.plugin.channel())
                .max_decoding_message_size(MAX_WRITE_ANSWER_BYTES);
            let config = self.ess_config();
            let call = async {
                if delete {
                    let mut request = tonic::Request::new(ess::DeleteKeysRequest {
                        config,
                        secret: Some(secret.clone()),
                    });
                    request.set_timeout(timeout);
                    client.delete_keys(request).await.map(|_| ())
                } else {
                    let mut request = tonic::Request::new(ess::ApplySecretRequest {
                        config,
                        secret: Some(secret.clone()),
                    });
                    request.set_timeout(timeout);
                    client.apply_secret(request).await.map(|_| ())
                }
            };
            match tokio::time::timeout(timeout, call).await {
                Err(_) => Err(status::timed_out(self.plugin.at(), rpc, timeout)),
                Ok(Err(s)) => self.refused(remote_key, rpc, &s),
                Ok(Ok(())) => Ok(Ok(())),
            }
        })
        .await
    }

    /// ESS: read, check the mark, apply the whole secret.
    async fn push_ess(
        &self,
        remote_key: &str,
        value: &PushValue,
        policy: PushPolicy,
        settings: &PushMetadataSpec,
    ) -> Result<Pushed, PushError> {
        self.plugin.ess_has_no_identity().map_err(|f| f.error)?;
        let current = self.ess_current(remote_key).await?;
        // Taken apart, not copied: the data holds the secret's values.
        let (read_metadata, read_data) = match current {
            Some(current) => {
                if policy.if_not_exists {
                    return Ok(Pushed::Kept);
                }
                if !marked(&current) && !policy.adopt {
                    return Err(PushError::Conflict {
                        remote_key: remote_key.to_string(),
                    });
                }
                (Some(current.metadata), Some(current.data))
            }
            None => (None, None),
        };
        let (data, same_data) = match value {
            PushValue::Whole(bytes) => {
                let data = whole_entries(remote_key, bytes)?;
                let same = read_data.is_some_and(|read| read == data);
                (data, same)
            }
            PushValue::Properties(properties) => {
                let existed = read_data.is_some();
                let mut data = read_data.unwrap_or_default();
                let same = existed
                    && properties
                        .iter()
                        .all(|(k, v)| data.get(k).is_some_and(|b| b.as_slice() == v.expose()));
                for (k, v) in properties {
                    data.insert(k.clone(), v.expose().to_vec());
                }
                (data, same)
            }
        };
        let size: usize = data.iter().map(|(k, v)| k.len() + v.len()).sum();
        if size > MAX_PUSH_BYTES {
            return Err(PushError::TooLarge {
                remote_key: remote_key.to_string(),
                size,
                max: MAX_PUSH_BYTES,
            });
        }
        let mut metadata = match &read_metadata {
            Some(read) if !replaces(settings) => read.clone(),
            _ => HashMap::new(),
        };
        metadata.extend(settings.custom_metadata.clone());
        metadata.insert(MARK_KEY.to_string(), MARK_VALUE.to_string());
        // ESS answers no version.
        if same_data && read_metadata.as_ref() == Some(&metadata) {
            return Ok(Pushed::Unchanged {
                version: String::new(),
            });
        }
        let secret = ess::Secret {
            scoped_name: remote_key.to_string(),
            metadata,
            data,
        };
        self.ess_write(&secret, false).await?;
        Ok(Pushed::Written {
            version: String::new(),
        })
    }

    /// ESS: read, check the mark, then DeleteKeys (no keys: the whole secret, as Crossplane's
    /// plugins do).
    async fn delete_ess(&self, remote_key: &str, properties: &[String]) -> Result<(), PushError> {
        self.plugin.ess_has_no_identity().map_err(|f| f.error)?;
        let Some(current) = self.ess_current(remote_key).await? else {
            return Ok(());
        };
        // Someone else's (or no longer ours): nothing of it is deleted.
        if !marked(&current) {
            return Err(PushError::Conflict {
                remote_key: remote_key.to_string(),
            });
        }
        let present: HashMap<String, Vec<u8>> = properties
            .iter()
            .filter(|p| current.data.contains_key(*p))
            .map(|p| (p.clone(), Vec::new()))
            .collect();
        if !properties.is_empty() && present.is_empty() {
            return Ok(());
        }
        // No keys (the whole secret, or every key it holds): DeleteKeys deletes the secret.
        let data = match present.len() == current.data.len() {
            true => HashMap::new(),
            false => present,
        };
        let keys = ess::Secret {
            scoped_name: remote_key.to_string(),
            data,
            ..Default::default()
        };
        self.ess_write(&keys, true).await
    }
}

/// Whether the secret's metadata becomes exactly the entry's (and the mark).
fn replaces(settings: &PushMetadataSpec) -> bool {
    settings.merge_policy == Some(MetadataMergePolicy::Replace)
}

/// Whether an ESS secret carries Latchkey's mark in its metadata.
fn marked(secret: &ess::Secret) -> bool {
    secret.metadata.get(MARK_KEY).map(String::as_str) == Some(MARK_VALUE)
}

/// A whole value as ESS entries: a JSON object of strings is its members (what a read makes of
/// them again), anything else the one entry `value`.
fn whole_entries(
    remote_key: &str,
    bytes: &SecretBytes,
) -> Result<HashMap<String, Vec<u8>>, PushError> {
    let bytes = fits(remote_key, bytes.clone())?;
    Ok(
        match serde_json::from_slice::<HashMap<String, String>>(bytes.expose()) {
            Ok(members) => members
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect(),
            Err(_) => [("value".to_string(), bytes.expose().to_vec())].into(),
        },
    )
}

#[async_trait]
impl Pusher for PluginPush {
    fn metadata_fields(&self) -> &'static [&'static str] {
        &["customMetadata", "mergePolicy"]
    }

    async fn push_with(
        &self,
        remote_key: &str,
        value: &PushValue,
        policy: PushPolicy,
        metadata: &PushMetadataSpec,
    ) -> Result<Pushed, PushError> {
        let size = match value {
            PushValue::Whole(bytes) => bytes.len(),
            PushValue::Properties(p) => p.iter().map(|(k, v)| k.len() + v.len()).sum(),
        };
        if size > MAX_PUSH_BYTES {
            return Err(PushError::TooLarge {
                remote_key: remote_key.to_string(),
                size,
                max: MAX_PUSH_BYTES,
            });
        }
        match self.protocol().await? {
            Protocol::Latchkey => {
                self.once(|| self.push_latchkey(remote_key, value, policy, metadata))
                    .await
            }
            Protocol::Ess => self.push_ess(remote_key, value, policy, metadata).await,
        }
    }

    async fn delete(&self, remote_key: &str, properties: &[String]) -> Result<(), PushError> {
        match self.protocol().await? {
            Protocol::Latchkey => {
                self.once(|| self.delete_latchkey(remote_key, properties))
                    .await
            }
            Protocol::Ess => self.delete_ess(remote_key, properties).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_values_become_ess_entries_as_reads_make_them_again() {
        let members = whole_entries("k", &SecretBytes::from(r#"{"a":"1","b":"2"}"#)).unwrap();
        assert_eq!(members.len(), 2);
        assert_eq!(members["a"], b"1");
        let other = whole_entries("k", &SecretBytes::from("plain")).unwrap();
        assert_eq!(other.len(), 1);
        assert_eq!(other["value"], b"plain");
        let huge = SecretBytes::new(vec![b'x'; MAX_PUSH_BYTES + 1]);
        assert!(matches!(
            whole_entries("k", &huge),
            Err(PushError::TooLarge { .. })
        ));
    }

    #[test]
    fn only_the_exact_mark_is_latchkeys() {
        let with = |k: &str, v: &str| ess::Secret {
            metadata: [(k.to_string(), v.to_string())].into(),
            ..Default::default()
        };
        assert!(marked(&with(MARK_KEY, MARK_VALUE)));
        assert!(!marked(&with(MARK_KEY, "someone")));
        assert!(!marked(&with("owner", MARK_VALUE)));
        assert!(!marked(&ess::Secret::default()));
    }
}
