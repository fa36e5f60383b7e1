//! What a PushSecret writes: its entries grouped by remote secret (all keys of one remote
//! secret go in one write), each with a fingerprint of what it holds, and the record of the
//! fingerprints last written per store, so a push of unchanged data is skipped.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{LazyLock, Mutex};

use ring::hmac;

use crate::api::push_metadata::PushMetadataSpec;
use crate::api::push_secret::PushSecretSpec;
use crate::providers::push::{PushError, PushValue};
use crate::secret::SecretBytes;

/// Most fingerprints remembered; past it the record starts over, which costs one write per
/// remote secret, never a missed change.
const MAX_RECORDED: usize = 100_000;

/// Why a PushSecret cannot be planned. Names keys, never values.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    /// The source Secret lacks a key an entry names.
    #[error("Secret {secret:?} has no key {key:?} (spec.data[{index}].match.secretKey)")]
    MissingKey {
        /// The source Secret.
        secret: String,
        /// The key.
        key: String,
        /// The entry naming it.
        index: usize,
    },
}

/// A keyed digest of what one remote secret receives. Keyed with a key of this process only,
/// so that it says nothing of the value outside of it, and `Debug` shows nothing at all.
#[derive(Clone, PartialEq, Eq)]
pub struct Fingerprint(Vec<u8>);

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fingerprint(..)")
    }
}

/// The process's fingerprint key, random at start.
static KEY: LazyLock<Option<hmac::Key>> =
    LazyLock::new(|| hmac::Key::generate(hmac::HMAC_SHA256, &ring::rand::SystemRandom::new()).ok());

/// One remote secret's share of a push.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteWrite {
    /// The remote secret.
    pub remote_key: String,
    /// What is written into it.
    pub value: PushValue,
    /// The provider settings of its entries (validation keeps them equal; none: default).
    pub metadata: PushMetadataSpec,
    /// Digest of `remote_key`, `value` and `metadata`.
    pub fingerprint: Fingerprint,
}

impl RemoteWrite {
    /// The properties written (empty: the whole remote secret), as recorded in the status.
    pub fn properties(&self) -> Vec<String> {
        match &self.value {
            PushValue::Whole(_) => Vec::new(),
            PushValue::Properties(p) => p.keys().cloned().collect(),
        }
    }
}

/// The writes of `spec` given the source Secret `secret`'s `data`, one per remote secret in
/// remote-key order. `spec` is validated (no remote place written twice).
pub fn plan(
    spec: &PushSecretSpec,
    secret: &str,
    data: &BTreeMap<String, SecretBytes>,
) -> Result<Vec<RemoteWrite>, PlanError> {
    let mut grouped: BTreeMap<&str, PushValue> = BTreeMap::new();
    let mut settings: BTreeMap<&str, &PushMetadataSpec> = BTreeMap::new();
    for (index, entry) in spec.data.iter().enumerate() {
        let m = &entry.match_;
        let value = data
            .get(&m.secret_key)
            .ok_or_else(|| PlanError::MissingKey {
                secret: secret.to_string(),
                key: m.secret_key.clone(),
                index,
            })?
            .clone();
        let remote = m.remote_ref.remote_key.as_str();
        if let Some(metadata) = &entry.metadata {
            settings.insert(remote, &metadata.spec);
        }
        match &m.remote_ref.property {
            None => {
                grouped.insert(remote, PushValue::Whole(value));
            }
            Some(property) => {
                let slot = grouped
                    .entry(remote)
                    .or_insert_with(|| PushValue::Properties(BTreeMap::new()));
                if let PushValue::Properties(properties) = slot {
                    properties.insert(property.clone(), value);
                }
            }
        }
    }
    Ok(grouped
        .into_iter()
        .map(|(remote_key, value)| {
            let metadata = settings
                .get(remote_key)
                .map_or_else(Default::default, |m| (*m).clone());
            RemoteWrite {
                fingerprint: fingerprint(remote_key, &value, &metadata),
                remote_key: remote_key.to_string(),
                value,
                metadata,
            }
        })
        .collect())
}

/// Length-prefixed parts, so that no two different writes give the same input.
fn fingerprint(remote_key: &str, value: &PushValue, metadata: &PushMetadataSpec) -> Fingerprint {
    let Some(key) = KEY.as_ref() else {
        // No randomness for a key: an empty fingerprint never matches a recorded one (those
        // are never empty), so every push writes.
        return Fingerprint(Vec::new());
    };
    let mut ctx = hmac::Context::with_key(key);
    let mut part = |bytes: &[u8]| {
        ctx.update(&(bytes.len() as u64).to_be_bytes());
        ctx.update(bytes);
    };
    part(remote_key.as_bytes());
    match value {
        PushValue::Whole(v) => {
            part(b"whole");
            part(v.expose());
        }
        PushValue::Properties(properties) => {
            part(b"properties");
            for (name, v) in properties {
                part(name.as_bytes());
                part(v.expose());
            }
        }
    }
    // Maps are ordered, so the same settings always give the same text; a change of them
    // alone is a change to write.
    part(&serde_json::to_vec(metadata).unwrap_or_default());
    Fingerprint(ctx.sign().as_ref().to_vec())
}

/// The first write whose metadata sets a field that no store in `used` (the fields each store
/// written uses) takes: an error naming them, before anything is written.
pub fn unused_metadata(writes: &[RemoteWrite], used: &BTreeSet<&str>) -> Option<PushError> {
    writes.iter().find_map(|write| {
        let unused: Vec<&str> = write
            .metadata
            .fields()
            .into_iter()
            .filter(|f| !used.contains(f))
            .collect();
        (!unused.is_empty()).then(|| PushError::Metadata {
            remote_key: write.remote_key.clone(),
            fields: unused.join(", "),
            used: if used.is_empty() {
                format!("no metadata field{}", owners(&unused))
            } else {
                let used = used.iter().copied().collect::<Vec<_>>().join(", ");
                format!("{used}{}", owners(&unused))
            },
        })
    })
}

/// Whose each of `fields` is, so that a field set for a store that does not take it (a KV v1
/// store has no metadata at all) says which store would.
fn owners(fields: &[&str]) -> String {
    let mut by: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for field in fields {
        let owner = match *field {
            "customMetadata" | "mergePolicy" => {
                "Vault KV v2's and plugins', KV v1 keeps no metadata"
            }
            "labels" | "annotations" | "sourceMergePolicy" | "targetMergePolicy"
            | "remoteNamespace" => "the kubernetes provider's",
            _ => "AWS Secrets Manager's",
        };
        by.entry(owner).or_default().push(field);
    }
    by.iter()
        .map(|(owner, fields)| {
            let verb = if fields.len() == 1 { "is" } else { "are" };
            format!("; {} {verb} {owner}", fields.join(" and "))
        })
        .collect()
}

/// What was last written per (store, remote key), to skip writes of unchanged data.
#[derive(Debug, Default)]
pub struct Recorded(Mutex<HashMap<(String, String), Fingerprint>>);

impl Recorded {
    /// Whether `write` to `store` would change nothing written by this process before.
    pub fn unchanged(&self, store: &str, write: &RemoteWrite) -> bool {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        !write.fingerprint.0.is_empty()
            && map.get(&(store.to_string(), write.remote_key.clone())) == Some(&write.fingerprint)
    }

    /// `write` reached `store`.
    pub fn written(&self, store: &str, write: &RemoteWrite) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let key = (store.to_string(), write.remote_key.clone());
        if map.len() >= MAX_RECORDED && !map.contains_key(&key) {
            map.clear();
        }
        map.insert(key, write.fingerprint.clone());
    }

    /// `remote_key` of `store` was deleted or failed: the next push writes it again.
    pub fn forget(&self, store: &str, remote_key: &str) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(&(store.to_string(), remote_key.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::push_secret::PushSecretSpec;

    fn spec(entries: serde_json::Value) -> PushSecretSpec {
        serde_json::from_value(serde_json::json!({
            "secretStoreRefs": [{"name": "fake"}],
            "selector": {"secret": {"name": "db"}},
            "data": entries,
        }))
        .unwrap()
    }

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, SecretBytes> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), SecretBytes::from(*v)))
            .collect()
    }

    fn entry(key: &str, remote: &str, property: Option<&str>) -> serde_json::Value {
        serde_json::json!({"match": {"secretKey": key,
                                     "remoteRef": {"remoteKey": remote, "property": property}}})
    }

    #[test]
    fn entries_of_one_remote_secret_are_one_write() {
        let s = spec(serde_json::json!([
            entry("user", "prod/db", Some("user")),
            entry("tls.crt", "prod/cert", None),
            entry("password", "prod/db", Some("password")),
        ]));
        let d = data(&[("user", "app"), ("password", "pw"), ("tls.crt", "CERT")]);
        let writes = plan(&s, "db", &d).unwrap();
        let keys: Vec<_> = writes.iter().map(|w| w.remote_key.as_str()).collect();
        assert_eq!(keys, ["prod/cert", "prod/db"]);
        assert_eq!(writes[0].value, PushValue::Whole(SecretBytes::from("CERT")));
        assert_eq!(writes[1].properties(), ["password", "user"]);
        assert!(writes[0].properties().is_empty());
    }

    #[test]
    fn a_missing_key_names_the_secret_and_entry_not_values() {
        let s = spec(serde_json::json!([entry("password", "prod/db", None)]));
        let err = plan(&s, "db", &data(&[("user", "secret-user")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Secret \"db\" has no key \"password\" (spec.data[0].match.secretKey)"
        );
        assert!(!format!("{err:?}").contains("secret-user"));
    }

    #[test]
    fn only_a_change_of_data_needs_a_write() {
        let s = spec(serde_json::json!([entry(
            "password",
            "prod/db",
            Some("password")
        )]));
        let recorded = Recorded::default();
        let first = plan(&s, "db", &data(&[("password", "one")])).unwrap();
        assert!(!recorded.unchanged("SecretStore/fake", &first[0]));
        recorded.written("SecretStore/fake", &first[0]);
        let again = plan(&s, "db", &data(&[("password", "one"), ("other", "x")])).unwrap();
        assert!(recorded.unchanged("SecretStore/fake", &again[0]));
        // Another store has its own record.
        assert!(!recorded.unchanged("ClusterSecretStore/fake", &again[0]));
        let changed = plan(&s, "db", &data(&[("password", "two")])).unwrap();
        assert!(!recorded.unchanged("SecretStore/fake", &changed[0]));
        // A value moved between properties is a change too.
        let moved = spec(serde_json::json!([entry(
            "password",
            "prod/db",
            Some("pass")
        )]));
        let moved = plan(&moved, "db", &data(&[("password", "one")])).unwrap();
        assert!(!recorded.unchanged("SecretStore/fake", &moved[0]));
        recorded.forget("SecretStore/fake", "prod/db");
        assert!(!recorded.unchanged("SecretStore/fake", &again[0]));
    }

    #[test]
    fn settings_go_with_their_remote_secret_and_count_as_a_change() {
        let meta = |tags: serde_json::Value| {
            serde_json::json!({"apiVersion": "kubernetes.external-secrets.io/v1alpha1",
                               "kind": "PushSecretMetadata", "spec": {"tags": tags}})
        };
        let with = |tags| {
            let mut first = entry("user", "prod/db", Some("user"));
            first["metadata"] = meta(tags);
            spec(serde_json::json!([
                first,
                entry("password", "prod/db", Some("password")),
                entry("cert", "prod/cert", None),
            ]))
        };
        let d = data(&[("user", "app"), ("password", "pw"), ("cert", "C")]);
        let writes = plan(&with(serde_json::json!({"team": "a"})), "db", &d).unwrap();
        assert!(writes[0].metadata.is_empty(), "prod/cert has none");
        assert_eq!(writes[1].metadata.fields(), ["tags"]);
        let recorded = Recorded::default();
        recorded.written("SecretStore/s", &writes[1]);
        let retagged = plan(&with(serde_json::json!({"team": "b"})), "db", &d).unwrap();
        assert!(!recorded.unchanged("SecretStore/s", &retagged[1]));
        let used: BTreeSet<&str> = ["tags", "description"].into();
        assert!(unused_metadata(&writes, &used).is_none());
        let err = unused_metadata(&writes, &["customMetadata"].into()).unwrap();
        assert_eq!(
            err.to_string(),
            "spec.data[].metadata.spec of remote key \"prod/db\" sets tags, which none of the \
             stores written uses (they use customMetadata; tags is AWS Secrets Manager's)"
        );
    }

    #[test]
    fn a_field_no_store_takes_says_whose_it_is() {
        let mut first = entry("user", "prod/db", Some("user"));
        first["metadata"] = serde_json::json!({
            "apiVersion": "kubernetes.external-secrets.io/v1alpha1", "kind": "PushSecretMetadata",
            "spec": {"customMetadata": {"team": "a"}, "mergePolicy": "Replace"}});
        let s = spec(serde_json::json!([first]));
        let writes = plan(&s, "db", &data(&[("user", "app")])).unwrap();
        let err = unused_metadata(&writes, &BTreeSet::new()).unwrap();
        assert_eq!(
            err.to_string(),
            "spec.data[].metadata.spec of remote key \"prod/db\" sets customMetadata, \
             mergePolicy, which none of the stores written uses (they use no metadata field; \
             customMetadata and mergePolicy are Vault KV v2's and plugins', KV v1 keeps no \
             metadata)"
        );
    }

    #[test]
    fn fingerprints_and_writes_show_no_value() {
        let s = spec(serde_json::json!([entry("password", "prod/db", None)]));
        let writes = plan(&s, "db", &data(&[("password", "hunter2-secret")])).unwrap();
        let shown = format!("{writes:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("Fingerprint(..)"), "{shown}");
    }
}
