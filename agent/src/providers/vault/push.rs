//! PushSecret writes to Vault / OpenBao KV v2, as the identity a store read logs in as.
//!
//! - The mark is the secret's custom metadata `managed-by: latchkey`, set once Latchkey created
//!   it (or adopted it, when the store allows). A secret whose metadata lacks it is someone
//!   else's: a push is a conflict and a delete leaves it.
//! - Every data write is a check-and-set against the version read just before (0: create only),
//!   so a secret written by someone else between the read and the write fails the push
//!   ([`PushError::Changed`]) instead of being overwritten; the next push reads it again.
//! - `customMetadata` of a push goes into the same custom metadata as the mark (`mergePolicy:
//!   Merge` keeps the keys already there, `Replace` leaves exactly these and the mark), written
//!   after the data like the mark, and only when it differs from what was read.
//! - KV v1 mounts are written by [`super::push_v1`], which keeps the mark in the secret itself.
//!
//! Errors name the path and the remote key, never a token or a value.

use crate::api::push_metadata::{MAX_CUSTOM_METADATA, MetadataMergePolicy, PushMetadataSpec};
use async_trait::async_trait;
use rustify::enums::RequestMethod;
use rustify::errors::ClientError as RestError;
use serde_json::{Map, Value, json};
use vaultrs::error::ClientError;

use super::super::push::{
    MARK_KEY, MARK_VALUE, PushError, PushPolicy, PushValue, Pushed, Pusher, fits, merge_properties,
    remove_properties,
};
use super::super::{BuildContext, ProviderError};
use super::errors::{reason, server_error};
use super::transport::{Call, Transport};
use super::{logged_in, mount_and_kv};
use crate::api::store::VaultProvider;
use crate::secret::SecretBytes;

/// Longest custom metadata key Vault takes, in bytes (KV v2 refuses more with a 400).
const MAX_CUSTOM_KEY_BYTES: usize = 128;
/// Longest custom metadata value Vault takes, in bytes.
const MAX_CUSTOM_VALUE_BYTES: usize = 512;

/// Writes one store's KV v2 mount as one identity.
pub struct VaultPush {
    mount: String,
    client: Transport,
}

/// What `metadata/<key>` says of an existing secret.
struct Metadata {
    /// 0 when the secret has metadata but no version yet.
    current_version: u64,
    /// Its custom metadata, kept whole when the mark is added (a write replaces all of it).
    custom: Map<String, Value>,
}

impl Metadata {
    fn marked(&self) -> bool {
        self.custom.get(MARK_KEY).and_then(Value::as_str) == Some(MARK_VALUE)
    }
}

impl VaultPush {
    /// Logs in as the store says, exactly as a store read does (same auth methods, same shared
    /// token cache). For a KV v2 store ([`super::pusher`] picks).
    pub async fn new(spec: &VaultProvider, ctx: &BuildContext<'_>) -> Result<Self, ProviderError> {
        let (mount, _) = mount_and_kv(spec)?;
        let client = logged_in(spec, ctx).await?;
        Ok(Self { mount, client })
    }

    /// The client, and `remote_key` as a path below the mount.
    fn target<'k>(&self, remote_key: &'k str) -> Result<(&Transport, &'k str), PushError> {
        Ok((&self.client, valid_key(remote_key)?))
    }

    fn path(&self, part: &str, key: &str) -> String {
        format!("{}/{part}/{key}", self.mount)
    }

    /// The secret's metadata, `None` when it does not exist.
    async fn metadata(
        &self,
        client: &Transport,
        remote_key: &str,
        key: &str,
    ) -> Result<Option<Metadata>, PushError> {
        let path = self.path("metadata", key);
        let answer = match client
            .json(call(RequestMethod::GET, &path, None, None))
            .await
        {
            Ok(answer) => answer,
            Err(e) if status(&e) == Some(404) => return Ok(None),
            Err(e) => return Err(failed(e, "read", &path, remote_key, None)),
        };
        let data = answer.value.as_ref().map_or(&Value::Null, |v| &v["data"]);
        if !data.is_object() {
            return Err(not_kv2(&self.mount, &path));
        }
        let current_version = data["current_version"].as_u64().unwrap_or(0);
        let custom = match &data["custom_metadata"] {
            Value::Object(map) => map.clone(),
            _ => Map::new(),
        };
        Ok(Some(Metadata {
            current_version,
            custom,
        }))
    }

    /// The data map of the secret's current version as JSON, `None` when it has none (deleted,
    /// destroyed, or never written).
    async fn current(
        &self,
        client: &Transport,
        remote_key: &str,
        key: &str,
        meta: &Metadata,
    ) -> Result<Option<SecretBytes>, PushError> {
        // Whether that version is deleted is asked of the data itself: the metadata's
        // `deletion_time` is also set, in the future, on mounts with `delete_version_after`.
        if meta.current_version == 0 {
            return Ok(None);
        }
        let path = self.path("data", key);
        // That very version: what is merged into is what the check-and-set is against.
        let query = format!("version={}", meta.current_version);
        let answer = match client
            .json(call(RequestMethod::GET, &path, Some(query), None))
            .await
        {
            Ok(answer) => answer,
            // Deleted since the metadata was read.
            Err(e) if status(&e) == Some(404) => return Ok(None),
            Err(e) => return Err(failed(e, "read", &path, remote_key, None)),
        };
        match answer.value.as_ref().map(|v| &v["data"]["data"]) {
            Some(Value::Null) | None => Ok(None),
            Some(data) => {
                let bytes = serde_json::to_vec(data).map_err(|_| not_kv2(&self.mount, &path))?;
                Ok(Some(SecretBytes::new(bytes)))
            }
        }
    }

    /// Writes `data` (a JSON object) as the new version, if the current one is still `cas`;
    /// the version written.
    async fn write(
        &self,
        client: &Transport,
        remote_key: &str,
        key: &str,
        data: &SecretBytes,
        cas: u64,
    ) -> Result<u64, PushError> {
        let path = self.path("data", key);
        // Spliced rather than built as a JSON tree: the value is not copied into strings that
        // outlive the request.
        let head = format!("{{\"options\":{{\"cas\":{cas}}},\"data\":");
        let mut body = Vec::with_capacity(head.len() + data.len() + 1);
        body.extend_from_slice(head.as_bytes());
        body.extend_from_slice(data.expose());
        body.push(b'}');
        let answer = client
            .json(call(RequestMethod::POST, &path, None, Some(body)))
            .await
            .map_err(|e| failed(e, "update", &path, remote_key, Some(cas)))?;
        // A KV v1 mount answers a write with no body (and has stored it under `data/`).
        answer
            .value
            .as_ref()
            .and_then(|v| v["data"]["version"].as_u64())
            .ok_or_else(|| not_kv2(&self.mount, &path))
    }

    /// Sets the secret's custom metadata to `custom` (which holds the mark), all of it: a
    /// write replaces what was there.
    async fn mark(
        &self,
        client: &Transport,
        remote_key: &str,
        key: &str,
        custom: &Map<String, Value>,
    ) -> Result<(), PushError> {
        let path = self.path("metadata", key);
        let body = json!({ "custom_metadata": custom })
            .to_string()
            .into_bytes();
        client
            .json(call(RequestMethod::POST, &path, None, Some(body)))
            .await
            .map(|_| ())
            .map_err(|e| failed(e, "update", &path, remote_key, None))
    }

    /// Deletes the secret with every version and its metadata; gone already is fine.
    async fn destroy(
        &self,
        client: &Transport,
        remote_key: &str,
        key: &str,
    ) -> Result<(), PushError> {
        let path = self.path("metadata", key);
        match client
            .json(call(RequestMethod::DELETE, &path, None, None))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if status(&e) == Some(404) => Ok(()),
            Err(e) => Err(failed(e, "delete", &path, remote_key, None)),
        }
    }

    /// Refuses a mount Vault reports as KV v1 before a secret is created there, which a v2
    /// write would otherwise store as a v1 secret named `data/<key>`. Not knowing (a token
    /// without access to the mount's description) goes on: the write's answer tells then.
    async fn refuse_v1_mount(&self, client: &Transport, remote_key: &str) -> Result<(), PushError> {
        let path = format!("sys/internal/ui/mounts/{}", self.mount);
        let Ok(answer) = client
            .json(call(RequestMethod::GET, &path, None, None))
            .await
        else {
            return Ok(());
        };
        let data = answer.value.as_ref().map_or(&Value::Null, |v| &v["data"]);
        let kv = matches!(data["type"].as_str(), Some("kv" | "generic"));
        if kv && data["options"]["version"].as_str() != Some("2") {
            return Err(PushError::CannotPush {
                remote_key: remote_key.to_string(),
                why: format!(
                    "the store says KV v2, but Vault describes mount {:?} as KV v1: set \
                     vault.version: v1 in the store",
                    self.mount
                ),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl Pusher for VaultPush {
    fn metadata_fields(&self) -> &'static [&'static str] {
        &["customMetadata", "mergePolicy"]
    }

    fn check_metadata(&self, metadata: &PushMetadataSpec) -> Result<(), PushError> {
        check_custom(metadata)
    }

    async fn push_with(
        &self,
        remote_key: &str,
        value: &PushValue,
        policy: PushPolicy,
        metadata: &PushMetadataSpec,
    ) -> Result<Pushed, PushError> {
        check_custom(metadata)?;
        let (client, key) = self.target(remote_key)?;
        let Some(meta) = self.metadata(client, remote_key, key).await? else {
            let data = match value {
                PushValue::Whole(bytes) => whole(remote_key, bytes)?,
                PushValue::Properties(properties) => {
                    merge_properties(remote_key, None, properties)?
                }
            };
            let custom = wanted(remote_key, &Map::new(), metadata)?;
            self.refuse_v1_mount(client, remote_key).await?;
            // Written first, marked after: marking first would put the mark on a secret
            // someone else created in between (the write then fails its check-and-set).
            let version = self.write(client, remote_key, key, &data, 0).await?;
            self.mark(client, remote_key, key, &custom)
                .await
                .map_err(|e| unmarked(e, version))?;
            return Ok(Pushed::Written {
                version: version.to_string(),
            });
        };
        if policy.if_not_exists {
            return Ok(Pushed::Kept);
        }
        let marked = meta.marked();
        if !marked && !policy.adopt {
            return Err(PushError::Conflict {
                remote_key: remote_key.to_string(),
            });
        }
        // Read for a whole value too: one that is already there is not written again (a
        // restarted controller would otherwise make a new version of every secret).
        let current = self.current(client, remote_key, key, &meta).await?;
        // Built whole before the one write: every property goes in, or none.
        let data = match value {
            PushValue::Whole(bytes) => whole(remote_key, bytes)?,
            PushValue::Properties(properties) => {
                merge_properties(remote_key, current.as_ref(), properties)?
            }
        };
        // Known before the data is written, so that metadata Vault would refuse fails the
        // push with nothing written.
        let custom = wanted(remote_key, &meta.custom, metadata)?;
        if marked && custom == meta.custom && current.is_some_and(|c| same_object(&c, &data)) {
            return Ok(Pushed::Unchanged {
                version: meta.current_version.to_string(),
            });
        }
        let version = self
            .write(client, remote_key, key, &data, meta.current_version)
            .await?;
        // Marked only once written: a failed write must not leave someone else's secret
        // looking like Latchkey's (which `deletionPolicy: Delete` would then remove). Custom
        // metadata that is already as wanted costs no write.
        if custom != meta.custom {
            self.mark(client, remote_key, key, &custom).await?;
        }
        Ok(Pushed::Written {
            version: version.to_string(),
        })
    }

    async fn delete(&self, remote_key: &str, properties: &[String]) -> Result<(), PushError> {
        let (client, key) = self.target(remote_key)?;
        let Some(meta) = self.metadata(client, remote_key, key).await? else {
            return Ok(());
        };
        let marked = meta.marked();
        if properties.is_empty() {
            if !marked {
                return Err(PushError::Conflict {
                    remote_key: remote_key.to_string(),
                });
            }
            return self.destroy(client, remote_key, key).await;
        }
        let Some(current) = self.current(client, remote_key, key, &meta).await? else {
            // No current data: no property of it is left to remove.
            return match marked {
                true => self.destroy(client, remote_key, key).await,
                false => Ok(()),
            };
        };
        let cas = meta.current_version;
        match remove_properties(remote_key, &current, properties)? {
            Some(left) => self
                .write(client, remote_key, key, &left, cas)
                .await
                .map(|_| ()),
            None if marked => self.destroy(client, remote_key, key).await,
            None => self
                .write(client, remote_key, key, &SecretBytes::from("{}"), cas)
                .await
                .map(|_| ()),
        }
    }
}

/// Refuses `customMetadata` that Vault would refuse (its own bounds on keys and values), naming
/// the key, never the value.
fn check_custom(metadata: &PushMetadataSpec) -> Result<(), PushError> {
    let bad = |why: String| PushError::BadMetadata {
        field: "customMetadata",
        why,
    };
    let custom = &metadata.custom_metadata;
    // The mark takes one of Vault's keys.
    if custom.len() >= MAX_CUSTOM_METADATA {
        return Err(bad(format!(
            "{} keys and Latchkey's {MARK_KEY:?} mark are over Vault's limit of \
             {MAX_CUSTOM_METADATA} custom metadata keys",
            custom.len()
        )));
    }
    for (k, v) in custom {
        if k.len() > MAX_CUSTOM_KEY_BYTES || !printable(k) {
            return Err(bad(format!(
                "key {:?} is not a Vault custom metadata key (at most {MAX_CUSTOM_KEY_BYTES} \
                 bytes, printable characters only)",
                shown(k)
            )));
        }
        if v.len() > MAX_CUSTOM_VALUE_BYTES || !printable(v) {
            return Err(bad(format!(
                "the value of key {k:?} is not a Vault custom metadata value (at most \
                 {MAX_CUSTOM_VALUE_BYTES} bytes, printable characters only)"
            )));
        }
    }
    Ok(())
}

/// Whether Vault takes `text` as custom metadata (Go's `unicode.IsPrint`: no control, format,
/// private-use or separator characters but the ASCII space). Erring towards refusing matters:
/// metadata Vault refuses on a new secret would leave it written but unmarked.
fn printable(text: &str) -> bool {
    text.chars().all(|c| {
        c == ' '
            || !(c.is_control()
                || c.is_whitespace()
                || matches!(c,
                    '\u{ad}' | '\u{600}'..='\u{605}' | '\u{61c}' | '\u{6dd}' | '\u{70f}'
                    | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
                    | '\u{2060}'..='\u{206f}' | '\u{e000}'..='\u{f8ff}' | '\u{feff}'
                    | '\u{fff9}'..='\u{fffb}' | '\u{e0000}'..='\u{e007f}'
                    | '\u{f0000}'..)
                || (c as u32 & 0xfffe) == 0xfffe)
    })
}

/// At most 64 characters of a key refused, for a bounded message.
fn shown(key: &str) -> String {
    key.chars().take(64).collect()
}

/// The custom metadata the secret holds after a push with `metadata`, given what it holds now
/// (`current`, nothing for a new secret): refused when over Vault's key limit (before
/// anything is written; those already there count with `mergePolicy: Merge`).
fn wanted(
    remote_key: &str,
    current: &Map<String, Value>,
    metadata: &PushMetadataSpec,
) -> Result<Map<String, Value>, PushError> {
    let mut custom = match metadata.merge_policy.unwrap_or_default() {
        MetadataMergePolicy::Merge => current.clone(),
        MetadataMergePolicy::Replace => Map::new(),
    };
    for (k, v) in &metadata.custom_metadata {
        custom.insert(k.clone(), Value::String(v.clone()));
    }
    custom.insert(MARK_KEY.into(), Value::String(MARK_VALUE.into()));
    if custom.len() > MAX_CUSTOM_METADATA {
        return Err(PushError::CannotPush {
            remote_key: remote_key.to_string(),
            why: format!(
                "its custom metadata would hold {} keys (with mergePolicy: Merge, those \
                 already there are kept), over Vault's limit of {MAX_CUSTOM_METADATA}: set \
                 mergePolicy: Replace, or remove keys in Vault",
                custom.len()
            ),
        });
    }
    Ok(custom)
}

/// `remote_key` as a path below the mount (a leading slash is not part of the name, as on the
/// read side); refused when it does not name one secret.
pub(super) fn valid_key(remote_key: &str) -> Result<&str, PushError> {
    let key = remote_key.trim_start_matches('/');
    if key.is_empty()
        || key
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == ".." || s.chars().any(char::is_control))
    {
        return Err(PushError::CannotPush {
            remote_key: remote_key.to_string(),
            why: "a Vault secret path needs non-empty segments, without `.` or `..`".into(),
        });
    }
    Ok(key)
}

/// Whether two JSON objects hold the same members (in whatever order).
fn same_object(a: &SecretBytes, b: &SecretBytes) -> bool {
    let parse = |s: &SecretBytes| serde_json::from_slice::<Value>(s.expose()).ok();
    matches!((parse(a), parse(b)), (Some(a), Some(b)) if a == b)
}

/// A whole value as a KV data map. As ESO's Vault provider (which unmarshals a pushed whole
/// Secret key into the secret's data map and fails otherwise), only a JSON object is stored:
/// KV holds a map of keys, and wrapping any other value under an invented key would make a
/// secret ESO users do not expect. `remoteRef.property` pushes a value as one key instead.
pub(super) fn whole(remote_key: &str, bytes: &SecretBytes) -> Result<SecretBytes, PushError> {
    let bytes = fits(remote_key, bytes.clone())?;
    match serde_json::from_slice::<Value>(bytes.expose()) {
        Ok(Value::Object(_)) => Ok(bytes),
        _ => Err(PushError::CannotPush {
            remote_key: remote_key.to_string(),
            why: "a whole value pushed to Vault KV must be a JSON object (a KV secret is a map \
                  of keys, as ESO requires too); set remoteRef.property to push it as one key"
                .into(),
        }),
    }
}

pub(super) fn call(
    method: RequestMethod,
    path: &str,
    query: Option<String>,
    body: Option<Vec<u8>>,
) -> Call {
    Call {
        method,
        path: path.to_string(),
        query,
        body,
    }
}

/// The HTTP status Vault answered with, if it answered.
pub(super) fn status(e: &ClientError) -> Option<u16> {
    match e {
        ClientError::APIError { code, .. } => Some(*code),
        // An error answer without Vault's `errors` list (a deleted version's 404 carries its
        // metadata instead).
        ClientError::RestClientError {
            source: RestError::ServerResponseError { code, .. },
        } => Some(*code),
        _ => None,
    }
}

/// A failed `op` on `path` as a push error: a failed check-and-set (`cas`) is
/// [`PushError::Changed`], the rest as [`refused`] says.
fn failed(e: ClientError, op: &str, path: &str, remote_key: &str, cas: Option<u64>) -> PushError {
    match (&e, cas) {
        (ClientError::APIError { code: 400, errors }, Some(version))
            if errors.iter().any(|m| m.contains("check-and-set")) =>
        {
            PushError::Changed {
                remote_key: remote_key.to_string(),
                version: version.to_string(),
            }
        }
        _ => refused(
            e,
            op,
            path,
            "<mount>/data/* and <mount>/metadata/*",
            "KV v2",
        ),
    }
}

/// A failed `op` on `path`: a refusal names the path and the paths the policy needs (`needs`),
/// a 404 says no `engine` is mounted, the rest reads as for a store read.
pub(super) fn refused(
    e: ClientError,
    op: &str,
    path: &str,
    needs: &str,
    engine: &str,
) -> PushError {
    match &e {
        ClientError::APIError {
            code: 401 | 403,
            errors,
        } => PushError::Backend(ProviderError::PermissionDenied(format!(
            "Vault denied {op} on {path:?}{}: its policy needs create, read, update and \
             delete on {needs}",
            reason(errors)
        ))),
        _ if status(&e) == Some(404) => PushError::Backend(ProviderError::Config(format!(
            "Vault answered 404 to {op} on {path:?}: no {engine} engine is mounted there"
        ))),
        _ => PushError::Backend(server_error(e)),
    }
}

fn not_kv2(mount: &str, path: &str) -> PushError {
    PushError::Backend(ProviderError::Config(format!(
        "Vault's answer for {path:?} is not KV v2's: is {mount:?} a KV v2 mount?"
    )))
}

/// A failed mark of a secret just created: it stays unmarked, so the next push is a conflict.
fn unmarked(e: PushError, version: u64) -> PushError {
    match e {
        PushError::Backend(ProviderError::PermissionDenied(why)) => {
            PushError::Backend(ProviderError::PermissionDenied(format!(
                "{why}; version {version} was created but not marked, so it is not Latchkey's \
                 and the next push is a conflict until someone deletes it"
            )))
        }
        other => other,
    }
}

#[cfg(test)]
#[path = "push_tests.rs"]
mod tests;
