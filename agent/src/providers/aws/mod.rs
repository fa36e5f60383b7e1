//! The `aws` provider: AWS Secrets Manager (here) and Systems Manager Parameter Store
//! ([`parameter_store`], `service: ParameterStore`), signed the same way.
//!
//! Authentication is chosen explicitly by the store, exactly one of:
//! - `jwt`: the pod's own projected token (audience `sts.amazonaws.com` unless the store says
//!   otherwise) exchanged through STS AssumeRoleWithWebIdentity for `role`;
//! - `secretRef`: static keys from a Kubernetes Secret (read through [`super::credentials`]),
//!   then `role` assumed with them when set;
//! - `agentIdentity: {}`: the agent's own default credential chain, then `role` when set.
//!
//! A store without `auth` is refused: the agent's identity is never used by accident.
//!
//! Temporary credentials are reused per (auth source, role, namespace/service account) until
//! shortly before they expire, and SDK clients per (region, endpoint, credentials), in the
//! [`SessionCache`] the agent shares across publishes. Values, keys and tokens never reach an
//! error message or a log line.
//!
//! Current values (no version, or `AWSCURRENT`) requested together are read with
//! `BatchGetSecretValue`, 20 names per call: the publish path asks for the keys of a volume
//! concurrently, one `get` each, so the first such `get` lets its task run on (a couple of
//! yields, no timer) while the others queue behind it, then one background flush reads the whole
//! queue. Each caller receives its own value or its own error; a lone key, and any key with
//! another stage or a `uuid/` version, is read with `GetSecretValue`. Every
//! `BatchGetSecretValue` call is counted as `operation="batch_get"` (the per-key `get` series
//! stays as it was). `find` reads its matches in batches of 20 as well; `find.tags` narrows
//! `ListSecrets` with tag filters and keeps the secrets that carry every tag exactly.

mod auth;
mod batch;
mod errors;
pub mod parameter_store;
pub mod push;
mod push_settings;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::config::retry::RetryConfig;
use aws_sdk_secretsmanager::config::timeout::TimeoutConfig;
use aws_sdk_secretsmanager::primitives::Blob;
use aws_sdk_secretsmanager::types::{Filter, FilterNameStringType};

pub use auth::{DEFAULT_AUDIENCE, SessionCache, web_identity};
use batch::{BATCH, CURRENT, Queue, batch_call, get_one};
use errors::{code_error, map_err};

use super::{BuildContext, FindQuery, MAX_FIND_RESULTS, Provider, ProviderError, RemoteKey, found};
use crate::api::store::AwsProvider;
use crate::secret::SecretBytes;
use crate::telemetry::Metrics;

/// Attempts per request (first try plus retries, with exponential backoff and jitter).
const MAX_ATTEMPTS: u32 = 3;

fn retry() -> RetryConfig {
    RetryConfig::standard().with_max_attempts(MAX_ATTEMPTS)
}

fn timeouts() -> TimeoutConfig {
    TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(5))
        .operation_attempt_timeout(Duration::from_secs(10))
        .operation_timeout(Duration::from_secs(30))
        .build()
}

/// The store's service, signed as its `auth` says: Secrets Manager, or Parameter Store.
pub async fn build(
    spec: &AwsProvider,
    ctx: &BuildContext<'_>,
) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(match spec.service.as_str() {
        "ParameterStore" => Arc::new(parameter_store::ParameterStore::new(spec, ctx).await?),
        _ => Arc::new(Aws::new(spec, ctx).await?),
    })
}

/// Reads Secrets Manager as one identity.
pub struct Aws {
    client: Client,
    /// Where the provider counts its `BatchGetSecretValue` calls.
    metrics: Arc<Metrics>,
    /// Current-version reads waiting to be batched.
    queue: Queue,
}

impl Aws {
    /// Authenticates as the store says (reusing cached sessions) and returns a client.
    pub async fn new(spec: &AwsProvider, ctx: &BuildContext<'_>) -> Result<Self, ProviderError> {
        Ok(Self {
            client: auth::client(spec, ctx).await?,
            metrics: Arc::clone(&ctx.env.metrics),
            queue: Queue::default(),
        })
    }

    /// Current values of `names`, `BATCH` per call; names deleted meanwhile are skipped.
    async fn batch(&self, names: &[String]) -> Result<Vec<(String, SecretBytes)>, ProviderError> {
        let mut out = Vec::with_capacity(names.len());
        for chunk in names.chunks(BATCH) {
            let resp = batch_call(&self.client, &self.metrics, chunk).await?;
            for e in resp.errors() {
                let code = e.error_code().unwrap_or("");
                if code != "ResourceNotFoundException" {
                    return Err(code_error("BatchGetSecretValue", code, e.message(), 400));
                }
            }
            for v in resp.secret_values() {
                let name = v.name().unwrap_or_default().to_string();
                out.push((name, value(v.secret_string(), v.secret_binary())?));
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl Provider for Aws {
    async fn get(&self, key: &RemoteKey) -> Result<SecretBytes, ProviderError> {
        if key.version.as_deref().is_some_and(|v| v != CURRENT) {
            return get_one(&self.client, &key.key, key.version.as_deref()).await;
        }
        batch::current(&self.queue, &self.client, &self.metrics, &key.key).await
    }

    async fn find(&self, query: &FindQuery) -> Result<Vec<(String, SecretBytes)>, ProviderError> {
        let mut filters = Vec::new();
        if let Some(p) = list_prefix(query) {
            filters.push(filter(FilterNameStringType::Name, [p]));
        }
        // ListSecrets matches tag keys and values by prefix and apart from each other: it
        // narrows the listing, `has_tags` decides.
        if !query.tags.is_empty() {
            filters.push(filter(FilterNameStringType::TagKey, query.tags.keys()));
            filters.push(filter(FilterNameStringType::TagValue, query.tags.values()));
        }
        let filters = (!filters.is_empty()).then_some(filters);
        let mut names = Vec::new();
        let mut next = None;
        loop {
            let out = self
                .client
                .list_secrets()
                .set_filters(filters.clone())
                .max_results(100)
                .set_next_token(next)
                .send()
                .await
                .map_err(|e| map_err("ListSecrets", e))?;
            names.extend(
                out.secret_list()
                    .iter()
                    .filter(|s| has_tags(s, &query.tags))
                    .filter_map(|s| s.name())
                    .filter(|n| query.matches(n))
                    .map(String::from),
            );
            if names.len() > MAX_FIND_RESULTS {
                // `found` refuses it with the count; no need to read the values.
                return found(
                    names
                        .into_iter()
                        .map(|n| (n, SecretBytes::new(vec![])))
                        .collect(),
                );
            }
            next = out.next_token().map(String::from);
            if next.is_none() {
                break;
            }
        }
        names.sort();
        names.dedup();
        found(self.batch(&names).await?)
    }

    fn finds_by_tags(&self) -> bool {
        true
    }
}

fn filter<T: ToString>(key: FilterNameStringType, values: impl IntoIterator<Item = T>) -> Filter {
    Filter::builder()
        .key(key)
        .set_values(Some(values.into_iter().map(|v| v.to_string()).collect()))
        .build()
}

/// True when the secret carries every one of `tags` (key and value, exactly).
fn has_tags(
    secret: &aws_sdk_secretsmanager::types::SecretListEntry,
    tags: &std::collections::BTreeMap<String, String>,
) -> bool {
    tags.iter().all(|(k, v)| {
        secret
            .tags()
            .iter()
            .any(|t| t.key() == Some(k.as_str()) && t.value() == Some(v.as_str()))
    })
}

/// The secret's value: its string or its binary bytes.
fn value(string: Option<&str>, binary: Option<&Blob>) -> Result<SecretBytes, ProviderError> {
    match (string, binary) {
        (Some(s), _) => Ok(SecretBytes::from(s)),
        (None, Some(b)) => Ok(SecretBytes::new(b.as_ref().to_vec())),
        (None, None) => Err(ProviderError::NotFound),
    }
}

/// The literal prefix every match must have, for ListSecrets' name filter: the store's path or
/// the literal start of an anchored (`^...`) name expression, whichever is longer.
fn list_prefix(query: &FindQuery) -> Option<String> {
    let from_regex = query.name.as_ref().and_then(|re| {
        let rest = re.as_str().strip_prefix('^')?;
        let mut prefix = String::new();
        let mut chars = rest.chars().peekable();
        while let Some(c) = chars.next() {
            let literal = if c == '\\' {
                match chars.peek() {
                    Some(&n) if "./-_+=@".contains(n) => {
                        chars.next();
                        n
                    }
                    _ => break,
                }
            } else if c.is_ascii_alphanumeric() || "/-_+=@,".contains(c) {
                c
            } else {
                break;
            };
            // A quantifier after it makes this character optional.
            if chars.peek().is_some_and(|n| "?*{".contains(*n)) {
                break;
            }
            prefix.push(literal);
        }
        Some(prefix)
    });
    let path = query.path.clone();
    let best = match (path, from_regex) {
        (Some(p), Some(r)) if r.starts_with(&p) => Some(r),
        (Some(p), _) => Some(p),
        (None, r) => r,
    };
    best.filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(path: Option<&str>, name: Option<&str>) -> FindQuery {
        FindQuery {
            path: path.map(String::from),
            name: name.map(|n| regex::Regex::new(n).unwrap()),
            tags: Default::default(),
        }
    }

    #[test]
    fn list_prefix_is_only_what_every_match_starts_with() {
        assert_eq!(
            list_prefix(&q(None, Some("^prod/db-.*"))),
            Some("prod/db-".into())
        );
        assert_eq!(
            list_prefix(&q(None, Some("^app\\.x"))),
            Some("app.x".into())
        );
        assert_eq!(list_prefix(&q(None, Some("^abc?"))), Some("ab".into()));
        assert_eq!(list_prefix(&q(None, Some("db"))), None, "unanchored");
        assert_eq!(list_prefix(&q(None, Some("^(a|b)"))), None);
        assert_eq!(
            list_prefix(&q(Some("prod/"), Some("x"))),
            Some("prod/".into())
        );
        assert_eq!(
            list_prefix(&q(Some("prod/"), Some("^prod/api"))),
            Some("prod/api".into())
        );
        assert_eq!(list_prefix(&q(None, None)), None);
    }
}
