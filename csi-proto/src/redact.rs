//! Hand-written `Debug` for CSI requests that carry credentials.
//!
//! `build.rs` turns off the derived `Debug` for every message with a
//! `csi_secret` field and for `NodePublishVolumeRequest`. The impls below print
//! all fields as usual except: `secrets` shows only its sorted key names, and
//! in `volume_context` the service account token entry has its value hidden.
//!
//! The same goes for the External Secret Store plugin protocol: its `Secret`
//! carries values in `data` (shown as sorted key names only) and free-form
//! `metadata` (keys only too: a plugin may put anything there). Messages that
//! contain a `Secret` keep their derived `Debug`, which prints the `Secret`
//! through this redacting one.
//!
//! And the Secrets Store CSI Driver's provider protocol: `MountRequest` hides
//! `attributes` (pod tokens inside a JSON string) and `secrets` whole, `File`
//! its `contents`; `MountResponse` keeps its derived `Debug`, which prints each
//! `File` through the redacting one.
//!
//! And Latchkey's own plugin protocol (`latchkey.plugin.v1`): `Token` hides its
//! JWT, `GetSecretResponse` and `SecretEntry` show only the names of their
//! `data` entries, `GenerateResponse` the names of its `values` and the length
//! of its `state` (which a plugin must keep free of secrets, but may not),
//! `CleanupRequest` that length too, `PushSecretRequest` the names of its
//! `data` entries and the length of its `value`. `Caller` and the other requests keep
//! their derived `Debug`, which prints each `Token` through the redacting one.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::ess::v1alpha1 as ess;
use crate::latchkey_plugin::v1 as lk;
use crate::secrets_store::v1alpha1 as sscsi;
use crate::v1;

/// `volume_context` key under which kubelet passes service account tokens.
pub const SERVICE_ACCOUNT_TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// Placeholder printed instead of a sensitive value.
struct Redacted;

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A `secrets` map: its keys (a BTreeMap's, so sorted), every value redacted.
struct SecretMap<'a>(&'a BTreeMap<String, String>);

impl fmt::Debug for SecretMap<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|k| (k, Redacted)))
            .finish()
    }
}

/// A map printed as its sorted keys, every value redacted, whatever the value type.
struct KeysOnly<'a, V>(&'a HashMap<String, V>);

impl<V> fmt::Debug for KeysOnly<'_, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys: Vec<_> = self.0.keys().collect();
        keys.sort();
        f.debug_map()
            .entries(keys.into_iter().map(|k| (k, Redacted)))
            .finish()
    }
}

/// Hand-written: `data` holds secret values. Destructured, so a field added to the proto fails
/// to compile here.
impl fmt::Debug for ess::Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ess::Secret {
            scoped_name,
            metadata,
            data,
        } = self;
        f.debug_struct("Secret")
            .field("scoped_name", scoped_name)
            .field("metadata", &KeysOnly(metadata))
            .field("data", &KeysOnly(data))
            .finish()
    }
}

/// ess.proto messages with a hand-written `Debug` in this module.
#[cfg(test)]
const IMPLEMENTED_ESS: &[&str] = &["Secret"];

/// Hand-written: `attributes` is a JSON string with the pod's tokens, `secrets` one with
/// credentials; neither can be shown in part without parsing, so both are hidden whole.
impl fmt::Debug for sscsi::MountRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sscsi::MountRequest {
            attributes: _,
            secrets: _,
            target_path,
            permission,
            current_object_version,
        } = self;
        f.debug_struct("MountRequest")
            .field("attributes", &Redacted)
            .field("secrets", &Redacted)
            .field("target_path", target_path)
            .field("permission", permission)
            .field("current_object_version", current_object_version)
            .finish()
    }
}

/// Hand-written: `contents` is a secret value; only its length is shown.
impl fmt::Debug for sscsi::File {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sscsi::File {
            path,
            mode,
            contents,
        } = self;
        f.debug_struct("File")
            .field("path", path)
            .field("mode", mode)
            .field("contents", &Redacted)
            .field("contents_len", &contents.len())
            .finish()
    }
}

/// Provider-protocol messages with a hand-written `Debug` in this module.
#[cfg(test)]
const IMPLEMENTED_SSCSI: &[&str] = &["File", "MountRequest"];

/// Hand-written: `token` is a pod's service-account JWT; only its length is shown.
impl fmt::Debug for lk::Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lk::Token {
            audience,
            token,
            expiration_timestamp,
        } = self;
        f.debug_struct("Token")
            .field("audience", audience)
            .field("token", &Redacted)
            .field("token_len", &token.len())
            .field("expiration_timestamp", expiration_timestamp)
            .finish()
    }
}

/// Hand-written: `data` holds secret values (shown as sorted key names only).
impl fmt::Debug for lk::GetSecretResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lk::GetSecretResponse { data, version } = self;
        f.debug_struct("GetSecretResponse")
            .field("data", &KeysOnly(data))
            .field("version", version)
            .finish()
    }
}

/// Hand-written: `data` holds secret values (shown as sorted key names only).
impl fmt::Debug for lk::SecretEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lk::SecretEntry {
            name,
            data,
            version,
        } = self;
        f.debug_struct("SecretEntry")
            .field("name", name)
            .field("data", &KeysOnly(data))
            .field("version", version)
            .finish()
    }
}

/// Hand-written: `values` are generated secrets (sorted key names only); `state` is shown by
/// length only, since a careless plugin may put a secret there.
impl fmt::Debug for lk::GenerateResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lk::GenerateResponse {
            values,
            state,
            ttl_seconds,
            renewable,
        } = self;
        f.debug_struct("GenerateResponse")
            .field("values", &KeysOnly(values))
            .field("state", &Redacted)
            .field("state_len", &state.len())
            .field("ttl_seconds", ttl_seconds)
            .field("renewable", renewable)
            .finish()
    }
}

/// Hand-written: `state` by length only (see `GenerateResponse`).
impl fmt::Debug for lk::CleanupRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lk::CleanupRequest {
            config,
            caller,
            state,
        } = self;
        f.debug_struct("CleanupRequest")
            .field("config", config)
            .field("caller", caller)
            .field("state", &Redacted)
            .field("state_len", &state.len())
            .finish()
    }
}

/// Hand-written: `data` and `value` are the values pushed (key names and a length only).
impl fmt::Debug for lk::PushSecretRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lk::PushSecretRequest {
            config,
            caller,
            name,
            data,
            value,
            if_not_exists,
            adopt,
            metadata,
            replace_metadata,
        } = self;
        f.debug_struct("PushSecretRequest")
            .field("config", config)
            .field("caller", caller)
            .field("name", name)
            .field("data", &KeysOnly(data))
            .field("value_len", &value.as_ref().map(Vec::len))
            .field("if_not_exists", if_not_exists)
            .field("adopt", adopt)
            // Settings the PushSecret's author wrote in the manifest, not secret values.
            .field("metadata", metadata)
            .field("replace_metadata", replace_metadata)
            .finish()
    }
}

/// latchkey.plugin.v1 messages with a hand-written `Debug` in this module.
#[cfg(test)]
const IMPLEMENTED_LATCHKEY: &[&str] = &[
    "CleanupRequest",
    "GenerateResponse",
    "GetSecretResponse",
    "PushSecretRequest",
    "SecretEntry",
    "Token",
];

/// A `volume_context` map: its entries (sorted, a BTreeMap's), the token value redacted.
struct ContextMap<'a>(&'a BTreeMap<String, String>);

impl fmt::Debug for ContextMap<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| {
                let v: &dyn fmt::Debug = if k == SERVICE_ACCOUNT_TOKENS_KEY {
                    &Redacted
                } else {
                    v
                };
                (k, v)
            }))
            .finish()
    }
}

/// Writes `Debug` for each listed message. Every field must be listed (the
/// impl destructures `self`, so a field added to the proto fails to compile
/// here); `secrets: secret` and `volume_context: context` pick the redacting
/// views.
macro_rules! redacted_debug {
    ($($ty:ident { $($field:ident $(: $kind:ident)?),* $(,)? })*) => {
        $(impl fmt::Debug for v1::$ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let v1::$ty { $($field),* } = self;
                f.debug_struct(stringify!($ty))
                    $(.field(stringify!($field), &redacted_debug!(@view $($kind)? $field)))*
                    .finish()
            }
        })*

        /// Messages with a hand-written `Debug` in this module.
        #[cfg(test)]
        const IMPLEMENTED: &[&str] = &[$(stringify!($ty)),*];
    };
    (@view $field:ident) => { $field };
    (@view secret $field:ident) => { SecretMap($field) };
    (@view context $field:ident) => { ContextMap($field) };
}

redacted_debug! {
    CreateVolumeRequest {
        name, capacity_range, volume_capabilities, parameters, secrets: secret,
        volume_content_source, accessibility_requirements, mutable_parameters,
    }
    DeleteVolumeRequest { volume_id, secrets: secret }
    ControllerPublishVolumeRequest {
        volume_id, node_id, volume_capability, readonly, secrets: secret,
        volume_context: context,
    }
    ControllerUnpublishVolumeRequest { volume_id, node_id, secrets: secret }
    ValidateVolumeCapabilitiesRequest {
        volume_id, volume_context: context, volume_capabilities, parameters,
        secrets: secret, mutable_parameters,
    }
    ControllerModifyVolumeRequest { volume_id, secrets: secret, mutable_parameters }
    CreateSnapshotRequest { source_volume_id, name, secrets: secret, parameters }
    DeleteSnapshotRequest { snapshot_id, secrets: secret }
    ListSnapshotsRequest {
        max_entries, starting_token, source_volume_id, snapshot_id, secrets: secret,
    }
    GetSnapshotRequest { snapshot_id, secrets: secret }
    ControllerExpandVolumeRequest {
        volume_id, capacity_range, secrets: secret, volume_capability,
    }
    NodeStageVolumeRequest {
        volume_id, publish_context, staging_target_path, volume_capability,
        secrets: secret, volume_context: context,
    }
    NodePublishVolumeRequest {
        volume_id, publish_context, staging_target_path, target_path,
        volume_capability, readonly, secrets: secret, volume_context: context,
    }
    NodeExpandVolumeRequest {
        volume_id, volume_path, capacity_range, staging_target_path,
        volume_capability, secrets: secret,
    }
    CreateVolumeGroupSnapshotRequest { name, source_volume_ids, secrets: secret, parameters }
    DeleteVolumeGroupSnapshotRequest { group_snapshot_id, snapshot_ids, secrets: secret }
    GetVolumeGroupSnapshotRequest { group_snapshot_id, snapshot_ids, secrets: secret }
    GetMetadataAllocatedRequest { snapshot_id, starting_offset, max_results, secrets: secret }
    GetMetadataDeltaRequest {
        base_snapshot_id, target_snapshot_id, starting_offset, max_results, secrets: secret,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    include!(concat!(env!("OUT_DIR"), "/redacted_types.rs"));

    const SECRET_VALUES: [&str; 3] = ["hunter2", "s3cr3t-user", "eyJhbGciOiJSUzI1NiJ9.tok"];

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn secrets() -> BTreeMap<String, String> {
        map(&[("username", "s3cr3t-user"), ("password", "hunter2")])
    }

    fn volume_context() -> BTreeMap<String, String> {
        map(&[
            ("csi.storage.k8s.io/pod.name", "web-0"),
            (
                SERVICE_ACCOUNT_TOKENS_KEY,
                r#"{"vault":{"token":"eyJhbGciOiJSUzI1NiJ9.tok","expirationTimestamp":"2030-01-01T00:00:00Z"}}"#,
            ),
        ])
    }

    /// Formats with `{:?}` and `{:#?}` and checks both hide every secret
    /// value but keep the given keys and visible values.
    fn check(value: &dyn fmt::Debug, visible: &[&str]) {
        for out in [format!("{value:?}"), format!("{value:#?}")] {
            for secret in SECRET_VALUES {
                assert!(!out.contains(secret), "{secret:?} leaked in {out}");
            }
            for shown in visible {
                assert!(out.contains(shown), "{shown:?} missing from {out}");
            }
            assert!(out.contains("<redacted>"), "no placeholder in {out}");
        }
    }

    #[test]
    fn node_publish_hides_secrets_and_tokens() {
        let req = v1::NodePublishVolumeRequest {
            volume_id: "vol-1".into(),
            target_path: "/var/lib/kubelet/pods/x/volumes/y/mount".into(),
            readonly: true,
            secrets: secrets(),
            volume_context: volume_context(),
            ..Default::default()
        };
        check(
            &req,
            &[
                "NodePublishVolumeRequest",
                "vol-1",
                "/var/lib/kubelet/pods/x/volumes/y/mount",
                "readonly: true",
                "\"password\"",
                "\"username\"",
                SERVICE_ACCOUNT_TOKENS_KEY,
                "csi.storage.k8s.io/pod.name",
                "web-0",
            ],
        );
        // Keys are sorted, so the output is stable.
        let out = format!("{req:?}");
        assert!(out.find("\"password\"") < out.find("\"username\""));
    }

    #[test]
    fn node_stage_hides_secrets_and_tokens() {
        let req = v1::NodeStageVolumeRequest {
            volume_id: "vol-2".into(),
            staging_target_path: "/staging/vol-2".into(),
            secrets: secrets(),
            volume_context: volume_context(),
            ..Default::default()
        };
        check(
            &req,
            &[
                "NodeStageVolumeRequest",
                "vol-2",
                "/staging/vol-2",
                "\"password\"",
                "\"username\"",
                SERVICE_ACCOUNT_TOKENS_KEY,
                "web-0",
            ],
        );
    }

    #[test]
    fn create_volume_hides_secrets() {
        let req = v1::CreateVolumeRequest {
            name: "pvc-123".into(),
            parameters: map(&[("type", "ssd")]),
            secrets: secrets(),
            ..Default::default()
        };
        check(
            &req,
            &[
                "CreateVolumeRequest",
                "pvc-123",
                "ssd",
                "\"password\"",
                "\"username\"",
            ],
        );
    }

    #[test]
    fn every_skipped_message_has_a_redacting_impl() {
        let mut implemented = IMPLEMENTED.to_vec();
        implemented.sort_unstable();
        assert_eq!(implemented, SKIP_DEBUG);
        let mut implemented = IMPLEMENTED_ESS.to_vec();
        implemented.sort_unstable();
        assert_eq!(implemented, SKIP_DEBUG_ESS);
        let mut implemented = IMPLEMENTED_SSCSI.to_vec();
        implemented.sort_unstable();
        assert_eq!(implemented, SKIP_DEBUG_SSCSI);
        let mut implemented = IMPLEMENTED_LATCHKEY.to_vec();
        implemented.sort_unstable();
        assert_eq!(implemented, SKIP_DEBUG_LATCHKEY);
    }

    fn lk_data() -> HashMap<String, Vec<u8>> {
        [
            ("password".to_string(), b"hunter2".to_vec()),
            ("username".to_string(), b"s3cr3t-user".to_vec()),
        ]
        .into()
    }

    #[test]
    fn latchkey_plugin_messages_hide_tokens_and_values() {
        let caller = lk::Caller {
            namespace: "shop".into(),
            pod_name: "web-0".into(),
            service_account: "web".into(),
            tokens: vec![lk::Token {
                audience: "vault".into(),
                token: "eyJhbGciOiJSUzI1NiJ9.tok".into(),
                expiration_timestamp: "2030-01-01T00:00:00Z".into(),
            }],
            pod_uid: "uid-1".into(),
        };
        let config = lk::ConfigReference {
            api_version: "v1".into(),
            kind: "FileConfig".into(),
            name: "main".into(),
        };
        let visible = [
            "shop",
            "web-0",
            "\"vault\"",
            "2030-01-01T00:00:00Z",
            "token_len: 24",
        ];
        check(&caller, &visible);
        check(
            &lk::GetSecretRequest {
                config: Some(config.clone()),
                caller: Some(caller.clone()),
                name: "team/db".into(),
                version: "v3".into(),
            },
            &["FileConfig", "team/db", "v3", "\"vault\""],
        );
        check(
            &lk::ListSecretsRequest {
                config: Some(config),
                caller: Some(caller),
                path: "team/".into(),
                name_regexp: "db.*".into(),
                max_results: 501,
            },
            &["team/", "db.*", "501"],
        );
        check(
            &lk::GetSecretResponse {
                data: lk_data(),
                version: "v3".into(),
            },
            &["\"password\"", "\"username\"", "v3"],
        );
        check(
            &lk::ListSecretsResponse {
                secrets: vec![lk::SecretEntry {
                    name: "team/db".into(),
                    data: lk_data(),
                    version: "v9".into(),
                }],
            },
            &["team/db", "\"password\"", "v9"],
        );
        let state = br#"{"account":"acct-1","oops":"s3cr3t-user"}"#.to_vec();
        check(
            &lk::GenerateResponse {
                values: lk_data(),
                state: state.clone(),
                ttl_seconds: Some(300),
                renewable: true,
            },
            &["\"password\"", "\"username\"", "state_len: 41", "300"],
        );
        check(
            &lk::CleanupRequest {
                config: None,
                caller: Some(lk::Caller {
                    namespace: "shop".into(),
                    ..Default::default()
                }),
                state,
            },
            &["shop", "state_len: 41"],
        );
    }

    #[test]
    fn provider_messages_hide_tokens_credentials_and_contents() {
        let versions = vec![sscsi::ObjectVersion {
            id: "secret/db".into(),
            version: "v7".into(),
        }];
        let attributes = format!(
            r#"{{"keyvaultName":"kv","csi.storage.k8s.io/serviceAccount.tokens":{:?}}}"#,
            volume_context()[SERVICE_ACCOUNT_TOKENS_KEY]
        );
        check(
            &sscsi::MountRequest {
                attributes,
                secrets: r#"{"clientsecret":"hunter2"}"#.into(),
                target_path: "/nonexistent/target".into(),
                permission: "420".into(),
                current_object_version: versions.clone(),
            },
            &["/nonexistent/target", "420", "secret/db", "v7"],
        );
        let file = sscsi::File {
            path: "db/password".into(),
            mode: 0o640,
            contents: b"hunter2".to_vec(),
        };
        check(&file, &["db/password", "416", "contents_len: 7"]);
        check(
            &sscsi::MountResponse {
                object_version: versions,
                error: None,
                files: vec![file],
            },
            &["db/password", "secret/db"],
        );
    }

    fn ess_secret() -> ess::Secret {
        ess::Secret {
            scoped_name: "team/db".into(),
            metadata: map(&[("owner", "hunter2")]).into_iter().collect(),
            data: [
                ("password".to_string(), b"hunter2".to_vec()),
                ("username".to_string(), b"s3cr3t-user".to_vec()),
            ]
            .into(),
        }
    }

    #[test]
    fn ess_messages_hide_values_and_metadata() {
        let visible = ["team/db", "\"password\"", "\"username\"", "\"owner\""];
        check(&ess_secret(), &visible);
        let config = ess::ConfigReference {
            api_version: "v1".into(),
            kind: "VaultConfig".into(),
            name: "main".into(),
        };
        check(
            &ess::GetSecretRequest {
                config: Some(config.clone()),
                secret: Some(ess_secret()),
            },
            &["VaultConfig", "team/db"],
        );
        check(
            &ess::GetSecretResponse {
                secret: Some(ess_secret()),
            },
            &visible,
        );
        check(
            &ess::ApplySecretRequest {
                config: Some(config.clone()),
                secret: Some(ess_secret()),
            },
            &visible,
        );
        check(
            &ess::DeleteKeysRequest {
                config: Some(config),
                secret: Some(ess_secret()),
            },
            &visible,
        );
    }
}
