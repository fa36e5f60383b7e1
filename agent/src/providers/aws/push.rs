//! PushSecret writes to AWS Secrets Manager: created with the tag `managed-by: latchkey`, updated
//! with one `PutSecretValue` per remote secret (every pushed property at once), and never written
//! over or deleted without that tag unless the store allows adopting it.

use crate::api::push_metadata::PushMetadataSpec;
use async_trait::async_trait;
use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_secretsmanager::primitives::Blob;
use aws_sdk_secretsmanager::types::Tag;

use super::super::push::{
    MARK_KEY, MARK_VALUE, PushError, PushPolicy, PushValue, Pushed, Pusher, fits, merge_properties,
    remove_properties,
};
use super::super::{BuildContext, ProviderError};
use super::errors::map_err;
use super::{auth, value};
use crate::api::store::AwsProvider;
use crate::secret::SecretBytes;

/// Writes Secrets Manager as one identity.
pub struct AwsPush {
    client: Client,
}

impl AwsPush {
    /// Authenticates as the store says (reusing cached sessions).
    pub async fn new(spec: &AwsProvider, ctx: &BuildContext<'_>) -> Result<Self, ProviderError> {
        Ok(Self::from_client(auth::client(spec, ctx).await?))
    }

    /// Writes with `client` as it is.
    pub fn from_client(client: Client) -> Self {
        Self { client }
    }

    /// Whether `remote_key` exists, and if so whether it carries Latchkey's mark.
    async fn marked(&self, remote_key: &str) -> Result<Option<bool>, PushError> {
        match self
            .client
            .describe_secret()
            .secret_id(remote_key)
            .send()
            .await
        {
            Ok(d) => Ok(Some(d.tags().iter().any(|t| {
                t.key() == Some(MARK_KEY) && t.value() == Some(MARK_VALUE)
            }))),
            Err(e) => match map_err("DescribeSecret", e) {
                ProviderError::NotFound => Ok(None),
                other => Err(other.into()),
            },
        }
    }

    /// The current value of `remote_key`.
    async fn current(&self, remote_key: &str) -> Result<SecretBytes, PushError> {
        let out = self
            .client
            .get_secret_value()
            .secret_id(remote_key)
            .send()
            .await
            .map_err(|e| map_err("GetSecretValue", e))?;
        Ok(value(out.secret_string(), out.secret_binary())?)
    }

    async fn put(&self, remote_key: &str, bytes: &SecretBytes) -> Result<String, PushError> {
        let call = self.client.put_secret_value().secret_id(remote_key);
        let call = match std::str::from_utf8(bytes.expose()) {
            Ok(text) => call.secret_string(text),
            Err(_) => call.secret_binary(Blob::new(bytes.expose())),
        };
        let out = call
            .send()
            .await
            .map_err(|e| map_err("PutSecretValue", e))?;
        Ok(out.version_id().unwrap_or_default().to_string())
    }

    async fn remove(&self, remote_key: &str) -> Result<(), PushError> {
        // Without recovery: a later push of the same key must be able to create it again.
        match self
            .client
            .delete_secret()
            .secret_id(remote_key)
            .force_delete_without_recovery(true)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match map_err("DeleteSecret", e) {
                ProviderError::NotFound => Ok(()),
                other => Err(other.into()),
            },
        }
    }
}

fn mark() -> Tag {
    Tag::builder().key(MARK_KEY).value(MARK_VALUE).build()
}

#[async_trait]
impl Pusher for AwsPush {
    async fn push_with(
        &self,
        remote_key: &str,
        value: &PushValue,
        policy: PushPolicy,
        _metadata: &PushMetadataSpec,
    ) -> Result<Pushed, PushError> {
        let conflict = || PushError::Conflict {
            remote_key: remote_key.to_string(),
        };
        let Some(marked) = self.marked(remote_key).await? else {
            let bytes = match value {
                PushValue::Whole(bytes) => fits(remote_key, bytes.clone())?,
                PushValue::Properties(properties) => {
                    merge_properties(remote_key, None, properties)?
                }
            };
            let call = self.client.create_secret().name(remote_key).tags(mark());
            let call = match std::str::from_utf8(bytes.expose()) {
                Ok(text) => call.secret_string(text),
                Err(_) => call.secret_binary(Blob::new(bytes.expose())),
            };
            return match call.send().await {
                Ok(out) => Ok(Pushed::Written {
                    version: out.version_id().unwrap_or_default().to_string(),
                }),
                // Created by someone else since it was looked at: theirs.
                Err(SdkError::ServiceError(e))
                    if e.err().code() == Some("ResourceExistsException") =>
                {
                    Err(conflict())
                }
                Err(e) => Err(map_err("CreateSecret", e).into()),
            };
        };
        if policy.if_not_exists {
            return Ok(Pushed::Kept);
        }
        if !marked && !policy.adopt {
            return Err(conflict());
        }
        // Built whole before the one write: every property goes in, or none.
        let bytes = match value {
            PushValue::Whole(bytes) => fits(remote_key, bytes.clone())?,
            PushValue::Properties(properties) => {
                let current = self.current(remote_key).await?;
                merge_properties(remote_key, Some(&current), properties)?
            }
        };
        let version = self.put(remote_key, &bytes).await?;
        // Marked only once written: a failed write must not leave someone else's secret
        // looking like Latchkey's (which `deletionPolicy: Delete` would then remove).
        if !marked {
            self.client
                .tag_resource()
                .secret_id(remote_key)
                .tags(mark())
                .send()
                .await
                .map_err(|e| map_err("TagResource", e))?;
        }
        Ok(Pushed::Written { version })
    }

    async fn delete(&self, remote_key: &str, properties: &[String]) -> Result<(), PushError> {
        let Some(marked) = self.marked(remote_key).await? else {
            return Ok(());
        };
        if properties.is_empty() {
            if !marked {
                return Err(PushError::Conflict {
                    remote_key: remote_key.to_string(),
                });
            }
            return self.remove(remote_key).await;
        }
        let current = self.current(remote_key).await?;
        match remove_properties(remote_key, &current, properties)? {
            Some(left) => self.put(remote_key, &left).await.map(|_| ()),
            None if marked => self.remove(remote_key).await,
            None => self
                .put(remote_key, &SecretBytes::from("{}"))
                .await
                .map(|_| ()),
        }
    }
}
