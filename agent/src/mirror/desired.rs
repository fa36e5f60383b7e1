//! The Secret an ExternalSecret asks for: the server-side-apply body the controller sends, and the
//! hash that tells whether a write is needed. Pure: no API calls.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::{Map, Value, json};

use crate::api::ExternalSecret;
use crate::api::external_secret::CreationPolicy;
use crate::secret::SecretBytes;

/// Field manager of every write, as the issue and ESO users expect to see in `managedFields`.
pub const FIELD_MANAGER: &str = "latchkey";
/// Label on every Secret the controller writes: its metadata watch selects on it.
pub const MANAGED_LABEL: &str = "latchkey.dev/managed";
/// Annotation naming the ExternalSecret (same namespace) a Secret is written for.
pub const EXTERNAL_SECRET_ANNOTATION: &str = "latchkey.dev/external-secret";
/// Annotation with a keyed hash of what was written, so unchanged data causes no write.
pub const DATA_HASH_ANNOTATION: &str = "latchkey.dev/data-hash";
/// Annotation holding the uid of the ExternalSecret whose create made the Secret: set only by
/// this controller's own create (never by a Merge), so it proves the Secret is the controller's.
pub const CREATED_FOR_ANNOTATION: &str = "latchkey.dev/created-for";
/// Annotation by which whoever may edit a Secret lets one ExternalSecret (by name, same
/// namespace) merge into it. Nothing else opens a Secret to `creationPolicy: Merge`.
pub const MERGE_FROM_ANNOTATION: &str = "latchkey.dev/merge-from";
/// Prefix of Latchkey's own labels and annotations: a template may set none of them.
pub const RESERVED_PREFIX: &str = "latchkey.dev/";
/// Secret type the controller never writes: a token Secret is the token controller's.
pub const SERVICE_ACCOUNT_TOKEN_TYPE: &str = "kubernetes.io/service-account-token";
/// Largest Secret the API server stores (its `data`, decoded).
pub const MAX_SECRET_BYTES: usize = 1 << 20;
/// Longest Secret data key the API server accepts.
const MAX_KEY_LEN: usize = 253;

/// Why the entries cannot become the Secret. Names keys, never values.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DesiredError {
    /// An entry name is not a valid Secret data key (files may have `/`, Secret keys may not).
    #[error(
        "entry {0:?} is not a valid Secret key (letters, digits, '-', '_' and '.' only, at most \
         253): rename it with a template or rewrite"
    )]
    InvalidKey(String),
    /// The data is larger than a Secret may be.
    #[error("the Secret would hold {0} bytes, more than the 1 MiB a Secret may hold")]
    TooLarge(usize),
    /// The template asks for a type the controller never writes.
    #[error(
        "spec.target.template.type {0:?}: Latchkey never writes service-account token Secrets \
         (the token controller owns them); use another type"
    )]
    ForbiddenType(String),
    /// The template sets a label or annotation that is Latchkey's own mark.
    #[error(
        "spec.target.template.metadata sets {0:?}: labels and annotations under latchkey.dev/ \
         are Latchkey's own marks and cannot come from a template; rename it"
    )]
    ReservedMark(String),
}

/// The Secret to apply and what identifies its content.
#[derive(Clone)]
pub struct Desired {
    /// Secret name (namespace: the ExternalSecret's).
    pub name: String,
    /// The server-side-apply body.
    pub body: Value,
    /// Keyed hash of the content (data, type, labels, annotations, immutability).
    pub hash: String,
    /// The data keys, for logs and dry runs.
    pub keys: Vec<String>,
}

/// Leaves out the body: its `data` holds the values (base64 is not a secret).
impl std::fmt::Debug for Desired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Desired")
            .field("name", &self.name)
            .field("hash", &self.hash)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

/// The name of the Secret `es` mirrors into.
pub fn target_name(es: &ExternalSecret) -> String {
    es.spec
        .target
        .as_ref()
        .and_then(|t| t.name.clone())
        .unwrap_or_else(|| es.metadata.name.clone().unwrap_or_default())
}

/// The apply body for `entries` (`None`: no data, which makes the apply drop the keys this
/// manager wrote before, for `deletionPolicy: Merge`).
pub fn secret(
    es: &ExternalSecret,
    policy: CreationPolicy,
    entries: Option<&BTreeMap<String, SecretBytes>>,
) -> Result<Desired, DesiredError> {
    let name = target_name(es);
    let namespace = es.metadata.namespace.clone().unwrap_or_default();
    let es_name = es.metadata.name.clone().unwrap_or_default();
    check_template(es)?;
    let template = es.spec.target.as_ref().and_then(|t| t.template.as_ref());
    let mut labels: BTreeMap<String, String> = template
        .and_then(|t| t.metadata.as_ref())
        .map(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(MANAGED_LABEL.into(), "true".into());
    let mut annotations: BTreeMap<String, String> = template
        .and_then(|t| t.metadata.as_ref())
        .map(|m| m.annotations.clone())
        .unwrap_or_default();
    annotations.insert(EXTERNAL_SECRET_ANNOTATION.into(), es_name.clone());
    let uid = es.metadata.uid.clone().unwrap_or_default();
    if policy != CreationPolicy::Merge {
        annotations.insert(CREATED_FOR_ANNOTATION.into(), uid.clone());
    }

    let mut data = Map::new();
    let mut size = 0usize;
    let mut keys = Vec::new();
    for (key, value) in entries.into_iter().flatten() {
        if !is_secret_key(key) {
            return Err(DesiredError::InvalidKey(key.clone()));
        }
        size = size.saturating_add(value.len());
        keys.push(key.clone());
        data.insert(
            key.clone(),
            Value::String(base64::engine::general_purpose::STANDARD.encode(value.expose())),
        );
    }
    if size > MAX_SECRET_BYTES {
        return Err(DesiredError::TooLarge(size));
    }
    // Merge writes into someone else's Secret: its type and immutability are theirs.
    let owns_secret = policy != CreationPolicy::Merge;
    let type_ = template
        .and_then(|t| t.type_.clone())
        .unwrap_or_else(|| "Opaque".into());
    let immutable = es
        .spec
        .target
        .as_ref()
        .and_then(|t| t.immutable)
        .unwrap_or(false);
    let hash = content_hash(
        &uid,
        entries,
        owns_secret.then_some(type_.as_str()),
        &labels,
        &annotations,
        owns_secret && immutable,
    );
    annotations.insert(DATA_HASH_ANNOTATION.into(), hash.clone());

    let mut metadata = json!({
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "annotations": annotations,
    });
    if policy == CreationPolicy::Owner {
        // Kubernetes deletes the Secret with its ExternalSecret (garbage collection).
        metadata["ownerReferences"] = json!([{
            "apiVersion": "latchkey.dev/v1alpha1",
            "kind": "ExternalSecret",
            "name": es_name,
            "uid": uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }]);
    }
    let mut body = json!({"apiVersion": "v1", "kind": "Secret", "metadata": metadata});
    if entries.is_some() {
        body["data"] = Value::Object(data);
    }
    if owns_secret {
        body["type"] = Value::String(type_);
        if immutable {
            body["immutable"] = Value::Bool(true);
        }
    }
    Ok(Desired {
        name,
        body,
        hash,
        keys,
    })
}

/// Refuses, before any backend call, a template that would write a service-account token
/// Secret or set one of Latchkey's own marks (which decide what the controller may write).
pub fn check_template(es: &ExternalSecret) -> Result<(), DesiredError> {
    let Some(template) = es.spec.target.as_ref().and_then(|t| t.template.as_ref()) else {
        return Ok(());
    };
    if let Some(type_) = template.type_.as_deref()
        && type_ == SERVICE_ACCOUNT_TOKEN_TYPE
    {
        return Err(DesiredError::ForbiddenType(type_.to_string()));
    }
    if let Some(metadata) = template.metadata.as_ref()
        && let Some(key) = metadata
            .labels
            .keys()
            .chain(metadata.annotations.keys())
            .find(|k| k.starts_with(RESERVED_PREFIX))
    {
        return Err(DesiredError::ReservedMark(key.clone()));
    }
    Ok(())
}

/// The body of the create that makes a missing Secret: its marks, owner and type only. The
/// values follow in a server-side apply, so they are owned by the apply manager alone and a
/// key the ExternalSecret stops producing is removed from the Secret later. Immutability comes
/// with that apply too (an immutable empty Secret could never receive its values).
pub fn creation_body(wanted: &Desired) -> Value {
    let mut metadata = json!({
        "name": wanted.body["metadata"]["name"],
        "namespace": wanted.body["metadata"]["namespace"],
        "labels": {MANAGED_LABEL: "true"},
        "annotations": {
            EXTERNAL_SECRET_ANNOTATION: wanted.body["metadata"]["annotations"][EXTERNAL_SECRET_ANNOTATION],
            CREATED_FOR_ANNOTATION: wanted.body["metadata"]["annotations"][CREATED_FOR_ANNOTATION],
        },
    });
    if let Some(owners) = wanted.body["metadata"].get("ownerReferences") {
        metadata["ownerReferences"] = owners.clone();
    }
    let mut body = json!({"apiVersion": "v1", "kind": "Secret", "metadata": metadata});
    if let Some(type_) = wanted.body.get("type") {
        body["type"] = type_.clone();
    }
    body
}

/// What the API server accepts as a Secret data key.
pub fn is_secret_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY_LEN
        && key != "."
        && key != ".."
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// HMAC-SHA-256 over an unambiguous encoding of the content, keyed with the ExternalSecret's
/// uid: equal content gives equal hashes across restarts, and the annotation is no plain
/// fingerprint of a value (ESO's is an unkeyed digest).
fn content_hash(
    uid: &str,
    entries: Option<&BTreeMap<String, SecretBytes>>,
    type_: Option<&str>,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    immutable: bool,
) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, uid.as_bytes());
    let mut ctx = ring::hmac::Context::with_key(&key);
    let mut field = |tag: u8, bytes: &[u8]| {
        ctx.update(&[tag]);
        ctx.update(&(bytes.len() as u64).to_be_bytes());
        ctx.update(bytes);
    };
    for (k, v) in entries.into_iter().flatten() {
        field(b'k', k.as_bytes());
        field(b'v', v.expose());
    }
    field(b'n', if entries.is_some() { b"1" } else { b"0" });
    field(b't', type_.unwrap_or("").as_bytes());
    for (k, v) in labels {
        field(b'l', k.as_bytes());
        field(b'L', v.as_bytes());
    }
    for (k, v) in annotations {
        field(b'a', k.as_bytes());
        field(b'A', v.as_bytes());
    }
    field(b'i', if immutable { b"1" } else { b"0" });
    let tag = ctx.sign();
    tag.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::external_secret::*;

    fn es(policy: CreationPolicy) -> ExternalSecret {
        let mut es = ExternalSecret::new(
            "db",
            ExternalSecretSpec {
                secret_store_ref: Some(SecretStoreRef {
                    name: "s".into(),
                    kind: StoreKind::SecretStore,
                }),
                refresh_interval: None,
                data: Vec::new(),
                data_from: Vec::new(),
                target: Some(Target {
                    creation_policy: Some(policy),
                    name: Some("db-secret".into()),
                    template: Some(Template {
                        type_: Some("kubernetes.io/basic-auth".into()),
                        metadata: Some(TemplateMetadata {
                            labels: [("team".to_string(), "shop".to_string())].into(),
                            annotations: BTreeMap::new(),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                service_account_name: None,
                refresh_policy: None,
            },
        );
        es.metadata.namespace = Some("shop".into());
        es.metadata.uid = Some("uid-1".into());
        es
    }

    fn entries(password: &str) -> BTreeMap<String, SecretBytes> {
        [(
            "password".to_string(),
            SecretBytes::new(password.as_bytes().to_vec()),
        )]
        .into()
    }

    #[test]
    fn owner_gets_an_owner_reference_type_and_labels() {
        let d = secret(
            &es(CreationPolicy::Owner),
            CreationPolicy::Owner,
            Some(&entries("pw")),
        )
        .unwrap();
        assert_eq!(d.name, "db-secret");
        assert_eq!(d.body["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(d.body["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(d.body["type"], "kubernetes.io/basic-auth");
        assert_eq!(d.body["metadata"]["labels"]["team"], "shop");
        assert_eq!(d.body["metadata"]["labels"][MANAGED_LABEL], "true");
        assert_eq!(d.body["data"]["password"], "cHc=");
        assert_eq!(d.keys, ["password"]);
    }

    #[test]
    fn merge_leaves_type_and_owner_to_the_secret_s_creator() {
        let d = secret(
            &es(CreationPolicy::Merge),
            CreationPolicy::Merge,
            Some(&entries("pw")),
        )
        .unwrap();
        assert!(d.body.get("type").is_none());
        assert!(d.body["metadata"].get("ownerReferences").is_none());
        let gone = secret(&es(CreationPolicy::Merge), CreationPolicy::Merge, None).unwrap();
        assert!(gone.body.get("data").is_none());
        assert_ne!(gone.hash, d.hash);
    }

    #[test]
    fn the_hash_follows_the_content_and_shows_no_value() {
        let e = es(CreationPolicy::Owner);
        let a = secret(&e, CreationPolicy::Owner, Some(&entries("pw"))).unwrap();
        let b = secret(&e, CreationPolicy::Owner, Some(&entries("pw"))).unwrap();
        let c = secret(&e, CreationPolicy::Owner, Some(&entries("pw2"))).unwrap();
        assert_eq!(a.hash, b.hash);
        assert_ne!(a.hash, c.hash);
        assert_eq!(
            a.body["metadata"]["annotations"][DATA_HASH_ANNOTATION],
            a.hash
        );
        let value = "hunter2-secret";
        let d = secret(&e, CreationPolicy::Owner, Some(&entries(value))).unwrap();
        let printed = format!("{d:?}");
        assert!(printed.contains("db-secret"), "{printed}");
        let encoded = base64::engine::general_purpose::STANDARD.encode(value);
        assert!(
            !printed.contains(value) && !printed.contains(&encoded),
            "{printed}"
        );
    }

    #[test]
    fn keys_and_size_are_checked_as_the_api_server_would() {
        let e = es(CreationPolicy::Owner);
        let bad: BTreeMap<_, _> = [("db/url".to_string(), SecretBytes::new(b"x".to_vec()))].into();
        assert_eq!(
            secret(&e, CreationPolicy::Owner, Some(&bad)).unwrap_err(),
            DesiredError::InvalidKey("db/url".into())
        );
        let big: BTreeMap<_, _> = [(
            "k".to_string(),
            SecretBytes::new(vec![0u8; MAX_SECRET_BYTES + 1]),
        )]
        .into();
        assert!(matches!(
            secret(&e, CreationPolicy::Owner, Some(&big)),
            Err(DesiredError::TooLarge(_))
        ));
        assert!(is_secret_key("tls.crt") && !is_secret_key("..") && !is_secret_key(""));
    }

    #[test]
    fn a_template_cannot_make_a_token_secret_or_set_latchkey_s_marks() {
        let mut token = es(CreationPolicy::Owner);
        if let Some(t) = token.spec.target.as_mut().and_then(|t| t.template.as_mut()) {
            t.type_ = Some(SERVICE_ACCOUNT_TOKEN_TYPE.into());
        }
        assert_eq!(
            secret(&token, CreationPolicy::Owner, Some(&entries("pw"))).unwrap_err(),
            DesiredError::ForbiddenType(SERVICE_ACCOUNT_TOKEN_TYPE.into())
        );
        for mark in [CREATED_FOR_ANNOTATION, MERGE_FROM_ANNOTATION, MANAGED_LABEL] {
            let mut forged = es(CreationPolicy::Owner);
            if let Some(m) = forged
                .spec
                .target
                .as_mut()
                .and_then(|t| t.template.as_mut())
                .and_then(|t| t.metadata.as_mut())
            {
                m.annotations.insert(mark.into(), "uid-1".into());
            }
            assert_eq!(
                check_template(&forged),
                Err(DesiredError::ReservedMark(mark.into()))
            );
        }
    }

    #[test]
    fn only_a_create_of_its_own_carries_the_created_for_mark() {
        let owner = secret(
            &es(CreationPolicy::Orphan),
            CreationPolicy::Orphan,
            Some(&entries("pw")),
        )
        .unwrap();
        assert_eq!(
            owner.body["metadata"]["annotations"][CREATED_FOR_ANNOTATION],
            "uid-1"
        );
        let merge = secret(
            &es(CreationPolicy::Merge),
            CreationPolicy::Merge,
            Some(&entries("pw")),
        )
        .unwrap();
        assert!(
            merge.body["metadata"]["annotations"]
                .get(CREATED_FOR_ANNOTATION)
                .is_none()
        );
        // The create carries the marks and type, never a value nor immutability.
        let create = creation_body(&owner);
        assert_eq!(
            create["metadata"]["annotations"][CREATED_FOR_ANNOTATION],
            "uid-1"
        );
        assert_eq!(create["type"], "kubernetes.io/basic-auth");
        assert!(create.get("data").is_none() && create.get("immutable").is_none());
    }
}
