//! The `fake` provider: values written inline in the store, for demos and tests. Behaves like a
//! real backend: unknown keys and versions are NotFound.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;

use super::{FindQuery, Provider, ProviderError, RemoteKey, found};
use crate::api::store::FakeProvider;
use crate::secret::SecretBytes;

/// Inline values indexed by (key, version).
pub struct Fake {
    values: HashMap<(String, Option<String>), SecretBytes>,
    latency: Duration,
}

impl Fake {
    /// Indexes a store's inline data; a later duplicate entry wins, as in ESO.
    pub fn new(spec: &FakeProvider) -> Result<Self, ProviderError> {
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
        let latency = match &spec.latency {
            Some(l) => crate::api::duration::parse(l).ok_or_else(|| {
                ProviderError::Config(format!("fake.latency {l:?} is not a duration like 5ms"))
            })?,
            None => Duration::ZERO,
        };
        Ok(Self { values, latency })
    }
}

#[async_trait]
impl Provider for Fake {
    async fn get(&self, key: &RemoteKey) -> Result<SecretBytes, ProviderError> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        self.values
            .get(&(key.key.clone(), key.version.clone()))
            .cloned()
            .ok_or(ProviderError::NotFound)
    }

    async fn find(&self, query: &FindQuery) -> Result<Vec<(String, SecretBytes)>, ProviderError> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        let matches = self
            .values
            .iter()
            .filter(|((name, version), _)| version.is_none() && query.matches(name))
            .map(|((name, _), value)| (name.clone(), value.clone()))
            .collect();
        found(matches)
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
            latency: None,
        };
        let fake = Fake::new(&spec).unwrap();
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

    #[tokio::test]
    async fn latency_is_simulated_and_validated() {
        let spec = FakeProvider {
            data: vec![],
            latency: Some("30ms".into()),
        };
        let fake = Fake::new(&spec).unwrap();
        let start = std::time::Instant::now();
        let _ = fake
            .get(&RemoteKey {
                key: "k".into(),
                version: None,
            })
            .await;
        assert!(start.elapsed() >= Duration::from_millis(30));
        let bad = FakeProvider {
            data: vec![],
            latency: Some("soon".into()),
        };
        assert!(matches!(Fake::new(&bad), Err(ProviderError::Config(_))));
    }
}
