//! The Vault provider's SecretProviderClass parameters -> `vault` stores with kubernetes auth (one
//! per KV mount) and one entry per object. The CSI provider reads raw API paths
//! (`secret/data/app` for KV v2); Latchkey addresses KV by mount, engine version and key.

use serde_norway::Value;

use super::fields::Fields;
use super::notes::{Notes, quoted};
use super::output::Meta;
use super::spc_entries::{Entry, Group, file_name_ok, read_mode};
use crate::api::RemoteRef;
use crate::api::external_secret::DecodingStrategy;
use crate::api::store::{StoreProvider, VaultAuth, VaultProvider, VaultRoleAuth};

/// Written where the class names no Vault address (the provider's `-vault-addr` applied).
pub const SERVER_PLACEHOLDER: &str = "https://REPLACE_ME:8200";
/// Written where the class names no role.
pub const ROLE_PLACEHOLDER: &str = "REPLACE_ME";

/// KV engine version of a mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kv {
    /// Unversioned.
    V1,
    /// Versioned: API paths have `/data/` after the mount.
    V2,
}

/// A CSI `secretPath` split into what a Latchkey store and remote reference need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPath {
    /// KV mount (the store's `path`).
    pub mount: String,
    /// Engine version.
    pub kv: Kv,
    /// The secret below the mount (`remoteRef.key`).
    pub key: String,
    /// `?version=N` (`remoteRef.version`).
    pub version: Option<String>,
    /// Whether the mount and version were guessed (no `/data/` segment).
    pub guessed: bool,
}

/// Splits a CSI `secretPath`: `<mount>/data/<key>[?version=N]` is KV v2; anything else is taken
/// as KV v1 `<first segment>/<rest>`, which is a guess.
pub fn kv_path(raw: &str) -> Result<KvPath, String> {
    let (path, query) = match raw.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (raw, None),
    };
    let mut version = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("version", v)) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => {
                version = Some(v.to_string())
            }
            _ => {
                return Err(format!(
                    "query {} is not supported (only version=N)",
                    quoted(pair)
                ));
            }
        }
    }
    let path = path.trim_matches('/');
    if path.ends_with("/data") {
        return Err("has no secret after /data/".into());
    }
    if let Some((mount, key)) = path.split_once("/data/") {
        if mount.is_empty() || key.trim_matches('/').is_empty() {
            return Err("has no secret after /data/".into());
        }
        return Ok(KvPath {
            mount: mount.to_string(),
            kv: Kv::V2,
            key: key.trim_matches('/').to_string(),
            version,
            guessed: false,
        });
    }
    if path.contains("/metadata/") || path.ends_with("/metadata") {
        return Err("is a KV v2 metadata path; Latchkey reads secret data only".into());
    }
    let Some((mount, key)) = path.split_once('/') else {
        return Err("names no secret below a mount".into());
    };
    if version.is_some() {
        return Err("has ?version but no /data/ segment (KV v1 has no versions)".into());
    }
    Ok(KvPath {
        mount: mount.to_string(),
        kv: Kv::V1,
        key: key.to_string(),
        version: None,
        guessed: true,
    })
}

/// The `objects` parameter (YAML inside a string) of the class at `objects_path`, refused past
/// the same bounds as the input (it can hold aliases of its own).
pub fn objects_yaml(text: &str, objects_path: &str) -> Result<Value, String> {
    use crate::catalog::yaml_limits::{Limits, check};
    check(text, &Limits::CONVERT).map_err(|refused| format!("{objects_path}: {refused}"))?;
    serde_norway::from_str(text).map_err(|e| format!("{objects_path}: {}", yaml_error(&e)))
}

/// Where a YAML error in an embedded `objects` string is.
pub fn yaml_error(e: &serde_norway::Error) -> String {
    match e.location() {
        Some(l) => format!(
            "not valid YAML (error at line {}, column {} of the string)",
            l.line(),
            l.column()
        ),
        None => "not valid YAML".to_string(),
    }
}

/// Converts the `vault` parameters into one group per KV mount, in order of first use.
pub fn convert(
    params: &mut Fields<'_>,
    meta: &Meta,
    notes: &mut Notes,
) -> Result<Vec<Group>, String> {
    let server = params.string("vaultAddress", notes).unwrap_or_else(|| {
        notes.warn(
            params.at("vaultAddress"),
            format!(
                "is not set (the provider's -vault-addr applied): replace the placeholder \
                 server {SERVER_PLACEHOLDER} in SecretStore {}",
                meta.name
            ),
        );
        SERVER_PLACEHOLDER.into()
    });
    let role = params.string("roleName", notes).unwrap_or_else(|| {
        notes.warn(
            params.at("roleName"),
            format!(
                "is not set: replace the placeholder role {ROLE_PLACEHOLDER} in SecretStore {}",
                meta.name
            ),
        );
        ROLE_PLACEHOLDER.into()
    });
    let old_mount = params.string("vaultKubernetesMountPath", notes);
    let new_mount = params.string("vaultAuthMountPath", notes);
    if let (Some(a), Some(b)) = (&old_mount, &new_mount)
        && a != b
    {
        notes.warn(
            params.at("vaultKubernetesMountPath"),
            "differs from vaultAuthMountPath, which the provider prefers; not carried over",
        );
    }
    let mount_path = new_mount
        .or(old_mount)
        .map(|m| m.trim_matches('/').trim_start_matches("auth/").to_string());
    let namespace = params.string("vaultNamespace", notes);
    let audience = params.string("audience", notes);
    if let Some(a) = &audience {
        notes.warn(
            params.at("audience"),
            format!(
                "kept; the csi.latchkey.dev CSIDriver must request a token for it: add \
                 `- audience: {a}` to its tokenRequests (daemonset/base/csidriver.yaml)"
            ),
        );
    }
    if params.flag("vaultSkipTLSVerify", notes) == Some(true) {
        notes.warn(
            params.at("vaultSkipTLSVerify"),
            "Latchkey always verifies Vault's certificate; not carried over (a private CA goes \
             into spec.provider.vault.caBundle)",
        );
    }
    for key in ["vaultCACertPath", "vaultCADirectory"] {
        params.drop_field(
            key,
            notes,
            "a path on the provider's node; Latchkey takes the CA certificate inline, as \
             base64-encoded PEM in spec.provider.vault.caBundle: not carried over",
        );
    }
    params.drop_field(
        "vaultTLSServerName",
        notes,
        "Latchkey checks the certificate against the host of the server URL; not carried over",
    );
    for key in ["vaultTLSClientCertPath", "vaultTLSClientKeyPath"] {
        params.drop_field(
            key,
            notes,
            "Latchkey has no TLS client certificates for Vault; not carried over",
        );
    }
    let objects_path = params.at("objects");
    let text = params
        .string("objects", notes)
        .ok_or_else(|| format!("{objects_path} is missing: nothing to mount"))?;
    let objects = objects_yaml(&text, &objects_path)?;
    let Value::Sequence(items) = &objects else {
        return Err(format!("{objects_path}: is not a YAML list of objects"));
    };
    let mut groups: Vec<((String, Kv), Group)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("{objects_path}[{i}]");
        let Some(mut f) = Fields::of(item, &path, notes) else {
            continue;
        };
        let Some((at, entry)) = object(&mut f, notes) else {
            continue;
        };
        let slot = match groups
            .iter()
            .position(|(k, _)| *k == (at.mount.clone(), at.kv))
        {
            Some(i) => i,
            None => {
                let provider = StoreProvider {
                    vault: Some(VaultProvider {
                        server: server.clone(),
                        path: Some(at.mount.clone()),
                        version: Some(
                            match at.kv {
                                Kv::V1 => "v1",
                                Kv::V2 => "v2",
                            }
                            .into(),
                        ),
                        namespace: namespace.clone(),
                        ca_bundle: None,
                        ca_provider: None,
                        auth: VaultAuth {
                            kubernetes: Some(VaultRoleAuth {
                                mount_path: mount_path.clone(),
                                role: role.clone(),
                                audience: audience.clone(),
                            }),
                            ..Default::default()
                        },
                    }),
                    ..Default::default()
                };
                groups.push((
                    (at.mount.clone(), at.kv),
                    Group {
                        suffix: suffix(&at.mount, at.kv, &groups),
                        provider,
                        entries: Vec::new(),
                    },
                ));
                groups.len() - 1
            }
        };
        groups[slot].1.entries.push(entry);
    }
    Ok(groups.into_iter().map(|(_, g)| g).collect())
}

/// A name suffix for a mount's store: the mount in Kubernetes-name form, with the engine version
/// when another group already uses the mount.
fn suffix(mount: &str, kv: Kv, earlier: &[((String, Kv), Group)]) -> String {
    let mut s: String = mount
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    if earlier.iter().any(|((m, _), _)| m == mount) {
        s.push_str(if kv == Kv::V1 { "-v1" } else { "-v2" });
    }
    s.trim_matches('-').to_string()
}

/// Default mounts of Vault's secrets engines that make a credential per read (dynamic secrets,
/// certificates, one-time codes): a path below one of them is no KV secret.
const DYNAMIC_MOUNTS: &[&str] = &[
    "database",
    "pki",
    "aws",
    "azure",
    "gcp",
    "alicloud",
    "consul",
    "nomad",
    "rabbitmq",
    "ssh",
    "totp",
    "transit",
    "kubernetes",
    "ldap",
    "terraform",
];

/// Operations of those engines, right after their mount (`<mount>/creds/<role>`, also where the
/// engine is mounted under another name).
const DYNAMIC_OPERATIONS: &[&str] = &[
    "creds",
    "static-creds",
    "issue",
    "sign",
    "sign-verbatim",
    "sts",
];

/// Why `secret_path` (a path without `/data/`) reads a dynamic engine rather than a KV v1
/// secret, if it does: its mount is an engine's default mount, or its second segment one of
/// their operations.
pub fn dynamic_engine(secret_path: &str) -> Option<String> {
    let path = secret_path.split('?').next().unwrap_or_default();
    let path = path.trim_matches('/');
    if path.contains("/data/") {
        return None;
    }
    let mut segments = path.split('/');
    let mount = segments.next().unwrap_or_default();
    let operation = segments.next();
    if DYNAMIC_MOUNTS.contains(&mount) {
        return Some(format!(
            "is below {}, the default mount of Vault's {mount} secrets engine",
            quoted(&format!("{mount}/"))
        ));
    }
    let op = operation.filter(|op| DYNAMIC_OPERATIONS.contains(op))?;
    Some(format!(
        "has {}, an operation of a dynamic secrets engine (database, aws, pki, ssh, ...)",
        quoted(&format!("/{op}/"))
    ))
}

/// Where a dynamic secret goes instead: a generator.
const USE_A_GENERATOR: &str = "Latchkey makes such credentials with a generator: a \
     generators.latchkey.dev/v1alpha1 VaultDynamicSecret (path, method, parameters) named by the \
     ExternalSecret's dataFrom[].sourceRef.generatorRef, which also revokes the lease when the \
     volume goes (docs/generators.md); object not carried over";

/// One item of `objects`, with the KV location it reads.
fn object(f: &mut Fields<'_>, notes: &mut Notes) -> Option<(KvPath, Entry)> {
    // Every field is read before the object is judged, so that a typo is reported as unknown
    // even in an object dropped for another reason.
    let name = f.string("objectName", notes);
    let secret_path = f.string("secretPath", notes);
    let secret_args = f.value("secretArgs").is_some();
    let method = f.string("method", notes);
    let encoding = f.string("encoding", notes);
    let property = f.string("secretKey", notes);
    let mode = read_mode(f, notes);
    f.finish(notes);
    let (Some(name), Some(secret_path)) = (name, secret_path) else {
        notes.warn(
            f.path(),
            "needs objectName and secretPath; object not carried over",
        );
        return None;
    };
    if secret_args {
        notes.warn(
            f.at("secretArgs"),
            format!(
                "{}: a request body is sent to dynamic secrets engines and PKI, not to KV; \
                 {USE_A_GENERATOR}",
                quoted(&secret_path)
            ),
        );
        return None;
    }
    if let Some(method) = method
        && !method.eq_ignore_ascii_case("GET")
    {
        notes.warn(
            f.at("method"),
            format!(
                "{} on {}: a write makes a credential (dynamic secrets, PKI); KV is read with \
                 GET; {USE_A_GENERATOR}",
                quoted(&method),
                quoted(&secret_path)
            ),
        );
        return None;
    }
    if let Some(why) = dynamic_engine(&secret_path) {
        notes.warn(
            f.at("secretPath"),
            format!(
                "{} {why}, not a KV secret; {USE_A_GENERATOR} (if it is a KV v1 secret after \
                 all, write its ExternalSecret entry by hand)",
                quoted(&secret_path)
            ),
        );
        return None;
    }
    let decoding = match encoding.as_deref() {
        None | Some("utf-8") | Some("utf8") => None,
        Some("base64") => Some(DecodingStrategy::Base64),
        Some(other) => {
            notes.warn(
                f.at("encoding"),
                format!(
                    "{} has no Latchkey decoding strategy (None, Base64, Base64URL, Auto); \
                     object not carried over",
                    quoted(other)
                ),
            );
            return None;
        }
    };
    let at = match kv_path(&secret_path) {
        Ok(at) => at,
        Err(why) => {
            notes.warn(
                f.at("secretPath"),
                format!("{} {why}; object not carried over", quoted(&secret_path)),
            );
            return None;
        }
    };
    if at.guessed {
        notes.warn(
            f.at("secretPath"),
            format!(
                "{} has no /data/ segment, so it was read as KV v1 mount {} and key {} (a guess: \
                 fix spec.provider.vault.path/version and remoteRef.key if the mount is named \
                 otherwise; a dynamic engine mounted elsewhere needs a VaultDynamicSecret \
                 generator instead, docs/generators.md)",
                quoted(&secret_path),
                quoted(&at.mount),
                quoted(&at.key)
            ),
        );
    }
    if !file_name_ok(&f.at("objectName"), &name, notes) {
        return None;
    }
    let entry = Entry {
        secret_key: name,
        remote_ref: RemoteRef {
            key: at.key.clone(),
            property,
            version: at.version.clone(),
            decoding_strategy: decoding,
        },
        mode,
        path: f.path().to_string(),
    };
    Some((at, entry))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv2_paths_split_at_data() {
        let p = kv_path("secret/data/db/creds?version=3").unwrap();
        assert_eq!(
            (p.mount.as_str(), p.kv, p.key.as_str(), p.version.as_deref()),
            ("secret", Kv::V2, "db/creds", Some("3"))
        );
        assert!(!p.guessed);
        let p = kv_path("/kv/team-a/data/app").unwrap();
        assert_eq!((p.mount.as_str(), p.key.as_str()), ("kv/team-a", "app"));
    }

    #[test]
    fn other_paths_are_a_kv1_guess() {
        let p = kv_path("legacy/app/config").unwrap();
        assert_eq!(
            (p.mount.as_str(), p.kv, p.key.as_str(), p.guessed),
            ("legacy", Kv::V1, "app/config", true)
        );
    }

    #[test]
    fn dynamic_engines_are_told_from_kv() {
        for dynamic in [
            "database/creds/readonly",
            "pki/issue/example-dot-com",
            "aws/creds/deploy",
            "ssh-client/sign/admin",
            "db-prod/static-creds/app",
            "/totp/code/me",
        ] {
            assert!(dynamic_engine(dynamic).is_some(), "{dynamic}");
        }
        for kv in [
            "secret/data/db",
            "legacy/app/config",
            "kv/team/creds",
            "database/data/app",
        ] {
            assert!(dynamic_engine(kv).is_none(), "{kv}");
        }
    }

    #[test]
    fn unusable_paths_are_refused() {
        for bad in [
            "secret/data/",
            "secret/metadata/app",
            "secret",
            "secret/data/a?foo=1",
            "legacy/a?version=2",
        ] {
            assert!(kv_path(bad).is_err(), "{bad}");
        }
    }
}
