//! Pushes to the `fake` provider: kept in memory, per store, for the life of the process. The
//! store's inline values count as remote secrets someone else wrote (unmarked), so a push onto
//! one of them is a conflict, as it would be on a real backend.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard};

use async_trait::async_trait;

use super::ProviderError;
use super::push::{
    PushError, PushPolicy, PushValue, Pushed, Pusher, fits, merge_properties, remove_properties,
};
use crate::api::push_metadata::{ALL_FIELDS, PushMetadataSpec};
use crate::api::store::FakeProvider;
use crate::secret::SecretBytes;

/// Most stores kept: past it, a push to a new store is refused (a test or demo never gets near).
const MAX_STORES: usize = 1024;
/// Most remote secrets kept per store.
const MAX_KEYS: usize = 10_000;

/// One remote secret of a fake store.
#[derive(Debug, Clone)]
struct Remote {
    value: SecretBytes,
    /// Written by a push (created, or adopted), rather than one of the store's inline values.
    marked: bool,
    /// Bumped on every write.
    version: u64,
    /// The provider settings of the last push (the fake takes every field and keeps it).
    metadata: PushMetadataSpec,
}

/// Every fake store's remote secrets, by store id then remote key.
type Stores = HashMap<String, HashMap<String, Remote>>;

static STORES: LazyLock<Mutex<Stores>> = LazyLock::new(Mutex::default);

fn stores() -> MutexGuard<'static, Stores> {
    // A panic while holding the lock leaves plain data behind, still consistent per entry.
    STORES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A fake store, written to.
pub struct FakePush {
    store: String,
}

impl FakePush {
    /// The store `store` (an id unique per store, e.g. `SecretStore/<namespace>/<name>`); its
    /// inline values (those without a version) become its unmarked remote secrets the first
    /// time the store is seen.
    pub fn new(store: String, spec: &FakeProvider) -> Result<Self, ProviderError> {
        let mut all = stores();
        if !all.contains_key(&store) {
            if all.len() >= MAX_STORES {
                return Err(ProviderError::TooLarge(format!(
                    "the fake provider keeps at most {MAX_STORES} stores"
                )));
            }
            let seeded = spec
                .data
                .iter()
                .filter(|e| e.version.is_none())
                .map(|e| {
                    let remote = Remote {
                        value: SecretBytes::from(e.value.as_str()),
                        marked: false,
                        version: 1,
                        metadata: PushMetadataSpec::default(),
                    };
                    (e.key.clone(), remote)
                })
                .collect();
            all.insert(store.clone(), seeded);
        }
        Ok(Self { store })
    }

    /// What `remote_key` holds in `store`, whether Latchkey's mark is on it, and its version;
    /// for tests and the demo's inspection.
    pub fn remote(store: &str, remote_key: &str) -> Option<(SecretBytes, bool, u64)> {
        let all = stores();
        let r = all.get(store)?.get(remote_key)?;
        Some((r.value.clone(), r.marked, r.version))
    }

    /// The provider settings `remote_key` of `store` was last pushed with; for tests.
    pub fn metadata(store: &str, remote_key: &str) -> Option<PushMetadataSpec> {
        let all = stores();
        Some(all.get(store)?.get(remote_key)?.metadata.clone())
    }
}

#[async_trait]
impl Pusher for FakePush {
    fn metadata_fields(&self) -> &'static [&'static str] {
        // A test double: it keeps whatever it is given, for tests to look at.
        &ALL_FIELDS
    }

    async fn push_with(
        &self,
        remote_key: &str,
        value: &PushValue,
        policy: PushPolicy,
        metadata: &PushMetadataSpec,
    ) -> Result<Pushed, PushError> {
        let mut all = stores();
        let store = all.entry(self.store.clone()).or_default();
        let current = store.get(remote_key);
        if let Some(existing) = current {
            if policy.if_not_exists {
                return Ok(Pushed::Kept);
            }
            if !existing.marked && !policy.adopt {
                return Err(PushError::Conflict {
                    remote_key: remote_key.to_string(),
                });
            }
        } else if store.len() >= MAX_KEYS {
            return Err(ProviderError::TooLarge(format!(
                "the fake provider keeps at most {MAX_KEYS} remote keys per store"
            ))
            .into());
        }
        // Built whole before anything is stored: every property goes in, or none.
        let bytes = match value {
            PushValue::Whole(bytes) => fits(remote_key, bytes.clone())?,
            PushValue::Properties(properties) => {
                merge_properties(remote_key, current.map(|r| &r.value), properties)?
            }
        };
        if let Some(r) = current.filter(|r| r.marked && r.value == bytes && r.metadata == *metadata)
        {
            return Ok(Pushed::Unchanged {
                version: r.version.to_string(),
            });
        }
        let version = current.map_or(1, |r| r.version + 1);
        store.insert(
            remote_key.to_string(),
            Remote {
                value: bytes,
                marked: true,
                version,
                metadata: metadata.clone(),
            },
        );
        Ok(Pushed::Written {
            version: version.to_string(),
        })
    }

    async fn delete(&self, remote_key: &str, properties: &[String]) -> Result<(), PushError> {
        let mut all = stores();
        let Some(store) = all.get_mut(&self.store) else {
            return Ok(());
        };
        let Some(current) = store.get(remote_key) else {
            return Ok(());
        };
        let left = if properties.is_empty() {
            None
        } else {
            remove_properties(remote_key, &current.value, properties)?
        };
        match left {
            Some(value) => {
                let version = current.version + 1;
                let (marked, metadata) = (current.marked, current.metadata.clone());
                store.insert(
                    remote_key.to_string(),
                    Remote {
                        value,
                        marked,
                        version,
                        metadata,
                    },
                );
            }
            None if current.marked => {
                store.remove(remote_key);
            }
            // Not ours to delete: what is left of it stays (with the pushed properties gone).
            None if properties.is_empty() => {
                return Err(PushError::Conflict {
                    remote_key: remote_key.to_string(),
                });
            }
            None => {
                let (version, metadata) = (current.version + 1, current.metadata.clone());
                store.insert(
                    remote_key.to_string(),
                    Remote {
                        value: SecretBytes::from("{}"),
                        marked: false,
                        version,
                        metadata,
                    },
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A fake store of its own (the map is process-wide and tests run in parallel), with one
    /// inline value someone else "wrote".
    fn store(id: &str) -> FakePush {
        let spec: FakeProvider = serde_json::from_value(serde_json::json!({
            "data": [{"key": "theirs", "value": "{\"owner\":\"someone-else\"}"},
                     {"key": "theirs", "value": "old", "version": "1"}]
        }))
        .unwrap();
        FakePush::new(format!("test/{id}"), &spec).unwrap()
    }

    fn props(pairs: &[(&str, &[u8])]) -> PushValue {
        PushValue::Properties(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), SecretBytes::new(v.to_vec())))
                .collect::<BTreeMap<_, _>>(),
        )
    }

    fn held(id: &str, key: &str) -> (String, bool, u64) {
        let (value, marked, version) = FakePush::remote(&format!("test/{id}"), key).unwrap();
        (
            String::from_utf8(value.expose().to_vec()).unwrap(),
            marked,
            version,
        )
    }

    const REPLACE: PushPolicy = PushPolicy {
        if_not_exists: false,
        adopt: false,
    };

    #[tokio::test]
    async fn a_push_creates_a_marked_secret_and_each_write_is_a_new_version() {
        let s = store("create");
        let whole = PushValue::Whole(SecretBytes::from("v1"));
        let got = s.push("app/cert", &whole, REPLACE).await.unwrap();
        assert_eq!(
            got,
            Pushed::Written {
                version: "1".into()
            }
        );
        assert_eq!(held("create", "app/cert"), ("v1".into(), true, 1));
        let whole = PushValue::Whole(SecretBytes::from("v2"));
        let got = s.push("app/cert", &whole, REPLACE).await.unwrap();
        assert_eq!(
            got,
            Pushed::Written {
                version: "2".into()
            }
        );
        assert_eq!(held("create", "app/cert"), ("v2".into(), true, 2));
        // The same again (a restarted controller): nothing written.
        let got = s.push("app/cert", &whole, REPLACE).await.unwrap();
        assert_eq!(
            got,
            Pushed::Unchanged {
                version: "2".into()
            }
        );
        // New settings alone are a write.
        let tagged = PushMetadataSpec {
            tags: [("team".to_string(), "shop".to_string())].into(),
            ..Default::default()
        };
        let got = s.push_with("app/cert", &whole, REPLACE, &tagged).await;
        assert!(matches!(got, Ok(Pushed::Written { .. })));
        assert_eq!(FakePush::metadata("test/create", "app/cert"), Some(tagged));
    }

    #[tokio::test]
    async fn properties_merge_into_one_json_object_all_or_none() {
        let s = store("merge");
        let two = props(&[("user", b"app"), ("password", b"s3cret")]);
        s.push("db", &two, REPLACE).await.unwrap();
        let (text, _, _) = held("merge", "db");
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"user": "app", "password": "s3cret"})
        );
        // One value that cannot be a JSON string: nothing of the push lands.
        let bad = props(&[("user", b"other"), ("blob", &[0xff, 0xfe])]);
        let err = s.push("db", &bad, REPLACE).await.unwrap_err();
        assert!(matches!(err, PushError::NotText { .. }), "{err}");
        assert_eq!(held("merge", "db").0, text);
        assert_eq!(held("merge", "db").2, 1);
        // A later push of one property keeps the others.
        s.push("db", &props(&[("password", b"n3w")]), REPLACE)
            .await
            .unwrap();
        let json: serde_json::Value = serde_json::from_str(&held("merge", "db").0).unwrap();
        assert_eq!(json, serde_json::json!({"user": "app", "password": "n3w"}));
    }

    #[tokio::test]
    async fn what_latchkey_did_not_write_is_a_conflict_unless_adopted() {
        let s = store("conflict");
        let before = held("conflict", "theirs");
        assert!(!before.1);
        for value in [
            PushValue::Whole(SecretBytes::from("mine")),
            props(&[("owner", b"me")]),
        ] {
            let err = s.push("theirs", &value, REPLACE).await.unwrap_err();
            assert!(matches!(err, PushError::Conflict { .. }), "{err}");
            assert_eq!(err.reason(), "Conflict");
            assert!(err.to_string().contains("\"theirs\""), "{err}");
        }
        assert_eq!(held("conflict", "theirs"), before);
        // Deleting it is refused as well.
        let err = s.delete("theirs", &[]).await.unwrap_err();
        assert!(matches!(err, PushError::Conflict { .. }), "{err}");
        assert_eq!(held("conflict", "theirs"), before);
        // IfNotExists leaves it, whoever wrote it.
        let keep = PushPolicy {
            if_not_exists: true,
            adopt: false,
        };
        let got = s.push("theirs", &props(&[("owner", b"me")]), keep).await;
        assert_eq!(got.unwrap(), Pushed::Kept);
        assert_eq!(held("conflict", "theirs"), before);
        // A store that allows adoption takes it over, keeping the properties already there.
        let adopt = PushPolicy {
            if_not_exists: false,
            adopt: true,
        };
        s.push("theirs", &props(&[("pushed", b"x")]), adopt)
            .await
            .unwrap();
        let (text, marked, version) = held("conflict", "theirs");
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"owner": "someone-else", "pushed": "x"})
        );
        assert!(marked);
        assert_eq!(version, 2);
    }

    #[tokio::test]
    async fn delete_removes_only_what_was_pushed() {
        let s = store("delete");
        let adopt = PushPolicy {
            if_not_exists: false,
            adopt: true,
        };
        s.push("theirs", &props(&[("pushed", b"x")]), adopt)
            .await
            .unwrap();
        s.delete("theirs", &["pushed".to_string()]).await.unwrap();
        let json: serde_json::Value = serde_json::from_str(&held("delete", "theirs").0).unwrap();
        assert_eq!(json, serde_json::json!({"owner": "someone-else"}));
        // A secret Latchkey created goes when its last pushed property does.
        s.push("ours", &props(&[("a", b"1"), ("b", b"2")]), REPLACE)
            .await
            .unwrap();
        s.delete("ours", &["a".to_string()]).await.unwrap();
        assert!(FakePush::remote("test/delete", "ours").is_some());
        s.delete("ours", &["b".to_string()]).await.unwrap();
        assert!(FakePush::remote("test/delete", "ours").is_none());
        // Whole secrets: gone, and gone again is fine.
        s.push("whole", &PushValue::Whole(SecretBytes::from("w")), REPLACE)
            .await
            .unwrap();
        s.delete("whole", &[]).await.unwrap();
        s.delete("whole", &[]).await.unwrap();
        assert!(FakePush::remote("test/delete", "whole").is_none());
    }

    #[tokio::test]
    async fn oversized_and_non_object_remotes_are_refused_without_writing() {
        let s = store("limits");
        let big = PushValue::Whole(SecretBytes::new(vec![
            b'a';
            super::super::push::MAX_PUSH_BYTES + 1
        ]));
        let err = s.push("big", &big, REPLACE).await.unwrap_err();
        assert!(matches!(err, PushError::TooLarge { .. }), "{err}");
        assert!(FakePush::remote("test/limits", "big").is_none());
        s.push(
            "plain",
            &PushValue::Whole(SecretBytes::from("text")),
            REPLACE,
        )
        .await
        .unwrap();
        let err = s
            .push("plain", &props(&[("p", b"v")]), REPLACE)
            .await
            .unwrap_err();
        assert!(matches!(err, PushError::NotAnObject { .. }), "{err}");
        assert_eq!(held("limits", "plain"), ("text".into(), true, 1));
    }

    #[tokio::test]
    async fn no_value_reaches_errors_or_debug_output() {
        let s = store("leak");
        let secret = "hunter2-very-secret";
        let value = props(&[("password", secret.as_bytes()), ("blob", &[0xff])]);
        assert!(!format!("{value:?}").contains(secret));
        let err = s.push("x", &value, REPLACE).await.unwrap_err();
        assert!(!format!("{err} {err:?}").contains(secret));
        let value = props(&[("password", secret.as_bytes())]);
        let err = s.push("theirs", &value, REPLACE).await.unwrap_err();
        assert!(!format!("{err} {err:?}").contains(secret));
        assert!(!format!("{err} {err:?}").contains("someone-else"));
        let unimplemented = crate::providers::push::unimplemented("vault");
        assert_eq!(unimplemented.reason(), "Unimplemented");
        assert!(unimplemented.to_string().contains("vault"));
    }
}
