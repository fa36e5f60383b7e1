//! PushSecret writes to AWS Secrets Manager: created with the tag `managed-by: latchkey`, updated
//! with one `PutSecretValue` per remote secret (every pushed property at once; none when the
//! value read already holds what would be written), and never written over or deleted without
//! that tag unless the store allows adopting it.
//!
//! An entry's `metadata` (ESO's fields `tags`, `description`, `kmsKeyId`, `secretPushFormat`,
//! `replicationLocations`) goes into `CreateSecret`; on an update only the fields it sets are brought in line, compared
//! with the `DescribeSecret` answer every push reads anyway, so a push whose metadata already
//! holds costs no call more than one without: `description` or `kmsKeyId` differing turns the
//! value write into one `UpdateSecret`, and `tags` (when set: exactly those and the mark, as ESO
//! does) costs a `TagResource` and an `UntagResource` only for what differs, as
//! `replicationLocations` costs a `RemoveRegionsFromReplication` and a
//! `ReplicateSecretToRegions`. A change of tags, description or regions alone writes no value,
//! so it makes no new version. What each field asks is worked out in `push_settings`.

use async_trait::async_trait;
use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_secretsmanager::operation::describe_secret::DescribeSecretOutput;
use aws_sdk_secretsmanager::primitives::Blob;
use aws_sdk_secretsmanager::types::Tag;

use super::super::push::{
    MARK_KEY, MARK_VALUE, PushError, PushPolicy, PushValue, Pushed, Pusher, fits, merge_properties,
    remove_properties,
};
use super::super::{BuildContext, ProviderError};
use super::errors::map_err;
use super::push_settings::{
    FIELDS, check, replica_changes, replica_regions, replicas, same_kms_key, tag_changes,
};
use super::{auth, value};
use crate::api::push_metadata::{PushMetadataSpec, SecretPushFormat};
use crate::api::store::AwsProvider;
use crate::secret::SecretBytes;

/// Writes Secrets Manager as one identity.
pub struct AwsPush {
    client: Client,
}

/// A remote secret's current value, as `GetSecretValue` answers it.
struct Current {
    value: SecretBytes,
    /// Stored as `SecretBinary`.
    binary: bool,
    /// Its `VersionId`.
    version: String,
}

/// What a value is sent as: `SecretString` or `SecretBinary`.
enum Body<'a> {
    Text(&'a str),
    Binary(&'a [u8]),
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

    /// `remote_key` as it is now (tags, description, key), or `None` when it does not exist.
    async fn describe(&self, remote_key: &str) -> Result<Option<DescribeSecretOutput>, PushError> {
        match self
            .client
            .describe_secret()
            .secret_id(remote_key)
            .send()
            .await
        {
            Ok(d) => Ok(Some(d)),
            Err(e) => match map_err("DescribeSecret", e) {
                ProviderError::NotFound => Ok(None),
                other => Err(other.into()),
            },
        }
    }

    /// Whether `remote_key` exists, and if so whether it carries Latchkey's mark.
    /// The current value of `remote_key`, as it is stored.
    async fn current(&self, remote_key: &str) -> Result<Current, PushError> {
        let out = self
            .client
            .get_secret_value()
            .secret_id(remote_key)
            .send()
            .await
            .map_err(|e| map_err("GetSecretValue", e))?;
        Ok(Current {
            value: value(out.secret_string(), out.secret_binary())?,
            binary: out.secret_string().is_none(),
            version: out.version_id().unwrap_or_default().to_string(),
        })
    }

    async fn put(&self, remote_key: &str, body: Body<'_>) -> Result<String, PushError> {
        let call = self.client.put_secret_value().secret_id(remote_key);
        let call = match body {
            Body::Text(text) => call.secret_string(text),
            Body::Binary(bytes) => call.secret_binary(Blob::new(bytes)),
        };
        let out = call
            .send()
            .await
            .map_err(|e| map_err("PutSecretValue", e))?;
        Ok(out.version_id().unwrap_or_default().to_string())
    }

    /// The value (when given) and the `description` / `kmsKeyId` that differ, in one
    /// `UpdateSecret`; the new version, or `None` when no value went with it.
    async fn update(
        &self,
        remote_key: &str,
        body: Option<Body<'_>>,
        description: Option<&str>,
        kms_key_id: Option<&str>,
    ) -> Result<Option<String>, PushError> {
        let call = self
            .client
            .update_secret()
            .secret_id(remote_key)
            .set_description(description.map(String::from))
            .set_kms_key_id(kms_key_id.map(String::from));
        let call = match body {
            Some(Body::Text(text)) => call.secret_string(text),
            Some(Body::Binary(bytes)) => call.secret_binary(Blob::new(bytes)),
            None => call,
        };
        let out = call.send().await.map_err(|e| map_err("UpdateSecret", e))?;
        Ok(out.version_id().map(String::from))
    }

    /// After the value write: the tags [`tag_changes`] found to differ.
    async fn retag(
        &self,
        remote_key: &str,
        set: Vec<Tag>,
        unset: Vec<String>,
    ) -> Result<(), PushError> {
        // The mark (and the new tags) first: a failure in between leaves the secret marked
        // as Latchkey's, which it is once its value was written.
        if !set.is_empty() {
            self.client
                .tag_resource()
                .secret_id(remote_key)
                .set_tags(Some(set))
                .send()
                .await
                .map_err(|e| map_err("TagResource", e))?;
        }
        if !unset.is_empty() {
            self.client
                .untag_resource()
                .secret_id(remote_key)
                .set_tag_keys(Some(unset))
                .send()
                .await
                .map_err(|e| map_err("UntagResource", e))?;
        }
        Ok(())
    }

    /// Brings the replica regions in line: `remove` first, so a secret is never in more
    /// regions than asked.
    async fn replicate(
        &self,
        remote_key: &str,
        add: Vec<String>,
        remove: Vec<String>,
        kms_key_id: Option<&str>,
    ) -> Result<(), PushError> {
        if !remove.is_empty() {
            self.client
                .remove_regions_from_replication()
                .secret_id(remote_key)
                .set_remove_replica_regions(Some(remove))
                .send()
                .await
                .map_err(|e| map_err("RemoveRegionsFromReplication", e))?;
        }
        if !add.is_empty() {
            self.client
                .replicate_secret_to_regions()
                .secret_id(remote_key)
                .set_add_replica_regions(Some(replicas(&add, kms_key_id)))
                .send()
                .await
                .map_err(|e| map_err("ReplicateSecretToRegions", e))?;
        }
        Ok(())
    }

    async fn remove(
        &self,
        remote_key: &str,
        described: &DescribeSecretOutput,
    ) -> Result<(), PushError> {
        // Secrets Manager deletes no secret that still has replicas.
        self.replicate(remote_key, Vec::new(), replica_regions(described), None)
            .await?;
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

fn is_marked(described: &DescribeSecretOutput) -> bool {
    described
        .tags()
        .iter()
        .any(|t| t.key() == Some(MARK_KEY) && t.value() == Some(MARK_VALUE))
}

/// How `bytes` is sent under `format`: `string` refuses what is not UTF-8 (naming the remote
/// key, never the value); unset sends text as a string and anything else as binary.
fn body<'a>(
    remote_key: &str,
    bytes: &'a SecretBytes,
    format: Option<SecretPushFormat>,
) -> Result<Body<'a>, PushError> {
    let text = std::str::from_utf8(bytes.expose());
    match (format, text) {
        (Some(SecretPushFormat::Binary), _) => Ok(Body::Binary(bytes.expose())),
        (_, Ok(text)) => Ok(Body::Text(text)),
        (None, Err(_)) => Ok(Body::Binary(bytes.expose())),
        (Some(SecretPushFormat::String), Err(_)) => Err(PushError::CannotPush {
            remote_key: remote_key.to_string(),
            why: "its metadata says secretPushFormat: string, but the value is not UTF-8 text; \
                  use secretPushFormat: binary, or leave it unset"
                .into(),
        }),
    }
}

#[async_trait]
impl Pusher for AwsPush {
    async fn push_with(
        &self,
        remote_key: &str,
        value: &PushValue,
        policy: PushPolicy,
        metadata: &PushMetadataSpec,
    ) -> Result<Pushed, PushError> {
        // The controller checked already; a direct caller gets the same refusal, unwritten.
        self.check_metadata(metadata)?;
        let format = metadata.secret_push_format;
        let conflict = || PushError::Conflict {
            remote_key: remote_key.to_string(),
        };
        let Some(described) = self.describe(remote_key).await? else {
            let bytes = match value {
                PushValue::Whole(bytes) => fits(remote_key, bytes.clone())?,
                PushValue::Properties(properties) => {
                    merge_properties(remote_key, None, properties)?
                }
            };
            let tags = std::iter::once((MARK_KEY, MARK_VALUE))
                .chain(metadata.tags.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .map(|(k, v)| Tag::builder().key(k).value(v).build())
                .collect();
            let call = self
                .client
                .create_secret()
                .name(remote_key)
                .set_tags(Some(tags))
                .set_description(metadata.description.clone())
                .set_kms_key_id(metadata.kms_key_id.clone())
                .set_add_replica_regions(
                    metadata
                        .replication_locations
                        .as_deref()
                        .filter(|r| !r.is_empty())
                        .map(|r| replicas(r, metadata.kms_key_id.as_deref())),
                );
            let call = match body(remote_key, &bytes, format)? {
                Body::Text(text) => call.secret_string(text),
                Body::Binary(bytes) => call.secret_binary(Blob::new(bytes)),
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
        let marked = is_marked(&described);
        if !marked && !policy.adopt {
            return Err(conflict());
        }
        // Built whole before the one write: every property goes in, or none.
        let (bytes, current) = match value {
            // Read too: one already in place is not written again, so a restarted controller
            // makes no new version for every consumer (a real change costs one read more).
            PushValue::Whole(bytes) => {
                let bytes = fits(remote_key, bytes.clone())?;
                // A value the format refuses is refused before any read.
                body(remote_key, &bytes, format)?;
                let current = match self.current(remote_key).await {
                    Ok(current) => Some(current),
                    // A secret without a value yet has nothing to compare with.
                    Err(PushError::Backend(ProviderError::NotFound)) => None,
                    Err(e) => return Err(e),
                };
                (bytes, current)
            }
            PushValue::Properties(properties) => {
                let current = self.current(remote_key).await?;
                let merged = merge_properties(remote_key, Some(&current.value), properties)?;
                (merged, Some(current))
            }
        };
        let body = body(remote_key, &bytes, format)?;
        let description = metadata
            .description
            .as_deref()
            .filter(|d| described.description().unwrap_or_default() != *d);
        let kms_key_id = metadata
            .kms_key_id
            .as_deref()
            .filter(|k| !same_kms_key(described.kms_key_id(), k));
        let (set, unset) = tag_changes(&described, metadata);
        let (add, remove) = replica_changes(&described, metadata);
        let kms = metadata.kms_key_id.as_deref();
        // The value read already holds what would be written, in the same form.
        let in_place =
            current.filter(|c| c.value == bytes && c.binary == matches!(body, Body::Binary(_)));
        // A new key must encrypt the value again: AWS leaves existing versions as they are.
        if let Some(current) = in_place.filter(|_| kms_key_id.is_none()) {
            let replicated = add.is_empty() && remove.is_empty();
            if description.is_none() && set.is_empty() && unset.is_empty() && replicated {
                return Ok(Pushed::Unchanged {
                    version: current.version,
                });
            }
            // Settings alone: no new version for every consumer of the value. Marking an
            // adopted secret is safe here, its value being already the one Latchkey writes.
            if description.is_some() {
                self.update(remote_key, None, description, None).await?;
            }
            self.retag(remote_key, set, unset).await?;
            self.replicate(remote_key, add, remove, kms).await?;
            return Ok(Pushed::Written {
                version: current.version,
            });
        }
        let version = if description.is_some() || kms_key_id.is_some() {
            self.update(remote_key, Some(body), description, kms_key_id)
                .await?
                .unwrap_or_default()
        } else {
            self.put(remote_key, body).await?
        };
        // Marked only once written: a failed write must not leave someone else's secret
        // looking like Latchkey's (which `deletionPolicy: Delete` would then remove).
        self.retag(remote_key, set, unset).await?;
        self.replicate(remote_key, add, remove, kms).await?;
        Ok(Pushed::Written { version })
    }

    fn metadata_fields(&self) -> &'static [&'static str] {
        &FIELDS
    }

    fn check_metadata(&self, metadata: &PushMetadataSpec) -> Result<(), PushError> {
        let region = self.client.config().region().map(|r| r.as_ref());
        check(metadata, region)
    }

    async fn delete(&self, remote_key: &str, properties: &[String]) -> Result<(), PushError> {
        let Some(described) = self.describe(remote_key).await? else {
            return Ok(());
        };
        let marked = is_marked(&described);
        if properties.is_empty() {
            if !marked {
                return Err(PushError::Conflict {
                    remote_key: remote_key.to_string(),
                });
            }
            return self.remove(remote_key, &described).await;
        }
        let current = self.current(remote_key).await?.value;
        match remove_properties(remote_key, &current, properties)? {
            Some(left) => {
                let left = body(remote_key, &left, None)?;
                self.put(remote_key, left).await.map(|_| ())
            }
            None if marked => self.remove(remote_key, &described).await,
            None => self.put(remote_key, Body::Text("{}")).await.map(|_| ()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_decides_string_or_binary_and_string_refuses_bytes_unnamed() {
        let text = SecretBytes::from("hunter2-unit");
        let bytes = SecretBytes::new(vec![0xff, b'h', b'u', b'n', b't', 0x80]);
        let string = Some(SecretPushFormat::String);
        let binary = Some(SecretPushFormat::Binary);
        assert!(matches!(body("k", &text, None), Ok(Body::Text(_))));
        assert!(matches!(body("k", &text, string), Ok(Body::Text(_))));
        assert!(matches!(body("k", &text, binary), Ok(Body::Binary(_))));
        assert!(matches!(body("k", &bytes, None), Ok(Body::Binary(_))));
        assert!(matches!(body("k", &bytes, binary), Ok(Body::Binary(_))));
        let Err(err) = body("prod/db", &bytes, string) else {
            panic!("not refused")
        };
        let shown = format!("{err} {err:?}");
        assert!(
            shown.contains("\"prod/db\"") && !shown.contains("hunt"),
            "{shown}"
        );
    }
}
