//! PushSecret writes to Vault / OpenBao KV v1, as the identity a store read logs in as.
//!
//! KV v1 keeps no metadata and no versions, so the mark lives in the secret itself, as ESO's
//! Vault provider puts it there: the key `custom_metadata` holding `{"managed-by": "latchkey"}`
//! (ESO writes the same key with its own name, so neither takes the other's secrets). A secret
//! without it is someone else's: a push is a conflict and a delete leaves it. Readers of the
//! whole secret see that key; a property read does not.
//!
//! KV v1 has no check-and-set either: a property merged into a secret that another writer
//! changes between Latchkey's read and its write can lose that writer's change (docs say so,
//! as for AWS Secrets Manager). Every property of one push still goes in one write.
//!
//! Errors name the path and the remote key, never a token or a value.

use crate::api::push_metadata::PushMetadataSpec;
use async_trait::async_trait;
use rustify::enums::RequestMethod;
use serde_json::{Map, Value};

use super::super::push::{
    MARK_KEY, MARK_VALUE, PushError, PushPolicy, PushValue, Pushed, Pusher, merge_properties,
    remove_properties,
};
use super::super::{BuildContext, ProviderError};
use super::push::{call, refused, status, valid_key, whole};
use super::transport::Transport;
use super::{logged_in, mount_and_kv};
use crate::api::store::VaultProvider;
use crate::secret::SecretBytes;

/// The key of a KV v1 secret that holds the mark (ESO's name for it).
pub const MARK_FIELD: &str = "custom_metadata";

/// Writes one store's KV v1 mount as one identity.
pub struct VaultV1Push {
    mount: String,
    client: Transport,
}

impl VaultV1Push {
    /// Logs in as the store says, exactly as a store read does.
    pub async fn new(spec: &VaultProvider, ctx: &BuildContext<'_>) -> Result<Self, ProviderError> {
        let (mount, _) = mount_and_kv(spec)?;
        let client = logged_in(spec, ctx).await?;
        Ok(Self { mount, client })
    }

    fn path(&self, key: &str) -> String {
        format!("{}/{key}", self.mount)
    }

    /// The secret's data map, `None` when it does not exist.
    async fn read(&self, key: &str) -> Result<Option<Map<String, Value>>, PushError> {
        let path = self.path(key);
        match self
            .client
            .json(call(RequestMethod::GET, &path, None, None))
            .await
        {
            Ok(answer) => match answer.value.as_ref().map(|v| &v["data"]) {
                Some(Value::Object(data)) => Ok(Some(data.clone())),
                _ => Err(not_kv1(&self.mount, &path)),
            },
            Err(e) if status(&e) == Some(404) => Ok(None),
            Err(e) => Err(failed(e, "read", &path)),
        }
    }

    /// Writes `data` (a JSON object, the mark included) as the whole secret.
    async fn write(&self, key: &str, data: &SecretBytes) -> Result<(), PushError> {
        let path = self.path(key);
        self.client
            .json(call(
                RequestMethod::POST,
                &path,
                None,
                Some(data.expose().to_vec()),
            ))
            .await
            .map(|_| ())
            .map_err(|e| failed(e, "update", &path))
    }

    async fn destroy(&self, key: &str) -> Result<(), PushError> {
        let path = self.path(key);
        match self
            .client
            .json(call(RequestMethod::DELETE, &path, None, None))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if status(&e) == Some(404) => Ok(()),
            Err(e) => Err(failed(e, "delete", &path)),
        }
    }
}

#[async_trait]
impl Pusher for VaultV1Push {
    async fn push_with(
        &self,
        remote_key: &str,
        value: &PushValue,
        policy: PushPolicy,
        _metadata: &PushMetadataSpec,
    ) -> Result<Pushed, PushError> {
        let key = valid_key(remote_key)?;
        let current = self.read(key).await?;
        if current.is_some() && policy.if_not_exists {
            return Ok(Pushed::Kept);
        }
        if current.as_ref().is_some_and(|c| !marked(c)) && !policy.adopt {
            return Err(PushError::Conflict {
                remote_key: remote_key.to_string(),
            });
        }
        // Built whole, the mark included, before the one write: every property goes in, or
        // none, and the secret is never written without the mark.
        let data = match value {
            PushValue::Whole(bytes) => whole(remote_key, bytes)?,
            PushValue::Properties(properties) => {
                let current = current
                    .as_ref()
                    .map(serde_json::to_vec)
                    .transpose()
                    .map_err(|_| not_kv1(&self.mount, &self.path(key)))?
                    .map(SecretBytes::new);
                merge_properties(remote_key, current.as_ref(), properties)?
            }
        };
        let data = with_mark(&data)?;
        let wanted = serde_json::from_slice::<Value>(data.expose()).ok();
        if let (Some(Value::Object(wanted)), Some(current)) = (&wanted, &current)
            && wanted == current
        {
            // Already there, mark and all (a restarted controller): nothing written.
            return Ok(Pushed::Unchanged {
                version: String::new(),
            });
        }
        self.write(key, &data).await?;
        // KV v1 keeps no versions: the status lists none.
        Ok(Pushed::Written {
            version: String::new(),
        })
    }

    async fn delete(&self, remote_key: &str, properties: &[String]) -> Result<(), PushError> {
        let key = valid_key(remote_key)?;
        let Some(current) = self.read(key).await? else {
            return Ok(());
        };
        if !marked(&current) {
            // Someone else's: a whole delete is refused, a property is left where it is.
            return match properties.is_empty() {
                true => Err(PushError::Conflict {
                    remote_key: remote_key.to_string(),
                }),
                false => Ok(()),
            };
        }
        if properties.is_empty() {
            return self.destroy(key).await;
        }
        let mut rest = current;
        rest.remove(MARK_FIELD);
        let rest = SecretBytes::new(
            serde_json::to_vec(&Value::Object(rest))
                .map_err(|_| not_kv1(&self.mount, &self.path(key)))?,
        );
        match remove_properties(remote_key, &rest, properties)? {
            Some(left) => self.write(key, &with_mark(&left)?).await,
            // Only the mark would be left: the secret was all Latchkey's.
            None => self.destroy(key).await,
        }
    }
}

/// Whether the secret carries Latchkey's mark.
fn marked(data: &Map<String, Value>) -> bool {
    data.get(MARK_FIELD)
        .and_then(|m| m.get(MARK_KEY))
        .and_then(Value::as_str)
        == Some(MARK_VALUE)
}

/// `data` (a JSON object) with the mark set, over whatever `custom_metadata` it had.
fn with_mark(data: &SecretBytes) -> Result<SecretBytes, PushError> {
    let mut object: Map<String, Value> = serde_json::from_slice(data.expose())
        .map_err(|_| PushError::Backend(ProviderError::Config("not a JSON object".into())))?;
    let mut mark = Map::new();
    mark.insert(MARK_KEY.into(), Value::String(MARK_VALUE.into()));
    object.insert(MARK_FIELD.into(), Value::Object(mark));
    serde_json::to_vec(&Value::Object(object))
        .map(SecretBytes::new)
        .map_err(|_| PushError::Backend(ProviderError::Config("not a JSON object".into())))
}

/// A failed `op` on `path`, as for KV v2 but for v1's paths.
fn failed(e: vaultrs::error::ClientError, op: &str, path: &str) -> PushError {
    refused(e, op, path, "<mount>/*", "KV")
}

fn not_kv1(mount: &str, path: &str) -> PushError {
    PushError::Backend(ProviderError::Config(format!(
        "Vault's answer for {path:?} is not KV v1's: is {mount:?} a KV v1 mount?"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_is_the_key_eso_uses_with_latchkey_s_name() {
        let data =
            SecretBytes::from(r#"{"a":"1","custom_metadata":{"managed-by":"external-secrets"}}"#);
        let marked_data = with_mark(&data).unwrap();
        let map: Map<String, Value> = serde_json::from_slice(marked_data.expose()).unwrap();
        assert!(marked(&map));
        assert_eq!(map["a"], "1");
        assert_eq!(
            map[MARK_FIELD],
            serde_json::json!({"managed-by": "latchkey"})
        );
        let eso: Map<String, Value> = serde_json::from_slice(data.expose()).unwrap();
        assert!(!marked(&eso), "ESO's secret is not Latchkey's");
    }
}
