//! The `fake` provider: values written inline in the store, for demos and tests. Behaves like a
//! real backend: unknown keys and versions are NotFound.

use std::collections::HashMap;

use async_trait::async_trait;

use super::{Provider, ProviderError, RemoteKey};
use crate::api::store::FakeProvider;
use crate::secret::SecretBytes;

/// Inline values indexed by (key, version).
pub struct Fake {
    values: HashMap<(String, Option<String>), SecretBytes>,
}

impl Fake {
    /// Indexes a store's inline data; a later duplicate entry wins, as in ESO.
    pub fn new(spec: &FakeProvider) -> Self {
        let values = spec
            .data
            .iter()
            .map(|e| {
                (
                    (e.key.clone(), e.version.clone()),
                    SecretBytes::from(e.value.as_str()),
                )
            })
            .collect();
        Self { values }
    }
}

#[async_trait]
impl Provider for Fake {
    async fn get(&self, key: &RemoteKey) -> Result<SecretBytes, ProviderError> {
        self.values
            .get(&(key.key.clone(), key.version.clone()))
            .cloned()
            .ok_or(ProviderError::NotFound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::store::FakeEntry;

    #[tokio::test]
    async fn serves_versions_and_reports_missing_keys() {
        let spec = FakeProvider {
            data: vec![
                FakeEntry {
                    key: "k".into(),
                    value: "current".into(),
                    version: None,
                },
                FakeEntry {
                    key: "k".into(),
                    value: "old".into(),
                    version: Some("v1".into()),
                },
            ],
        };
        let fake = Fake::new(&spec);
        let get = |key: &str, version: Option<&str>| RemoteKey {
            key: key.into(),
            version: version.map(String::from),
        };
        assert_eq!(
            fake.get(&get("k", None)).await.unwrap().expose(),
            b"current"
        );
        assert_eq!(
            fake.get(&get("k", Some("v1"))).await.unwrap().expose(),
            b"old"
        );
        assert!(matches!(
            fake.get(&get("k", Some("v2"))).await,
            Err(ProviderError::NotFound)
        ));
        assert!(matches!(
            fake.get(&get("nope", None)).await,
            Err(ProviderError::NotFound)
        ));
    }
}
