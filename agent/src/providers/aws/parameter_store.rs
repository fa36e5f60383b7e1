//! The `aws` provider's second service, Systems Manager Parameter Store (`service:
//! ParameterStore`, as in ESO), signed exactly as Secrets Manager is (same `auth`, same sessions).
//!
//! Values are read with decryption (a SecureString arrives as its plain text; a StringList as its
//! comma-separated text, as ESO gives it). `remoteRef.version` is a version number or a label,
//! appended as SSM's `name:selector` (ESO does the same). Unversioned keys requested together
//! are read with `GetParameters`, 10 names per call, through the same queue as Secrets Manager's
//! batches ([`super::batch::queued`]); each such call is counted as `operation="get_parameters"`.
//! `find` reads a path with `GetParametersByPath` (recursive), and a name or tags search with
//! `DescribeParameters` then `GetParameters`; both stop at [`MAX_FIND_RESULTS`] matches and
//! [`MAX_FIND_BYTES`] of names and values.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use aws_sdk_ssm::Client;
use aws_sdk_ssm::operation::get_parameters::GetParametersOutput;
use aws_sdk_ssm::types::{Parameter, ParameterStringFilter};

use super::super::{
    BuildContext, FindQuery, MAX_FIND_RESULTS, MAX_RESPONSE_BYTES, Provider, ProviderError,
    RemoteKey, found,
};
use super::batch::{self, Queue, Reply};
use super::errors::map_err;
use crate::api::store::AwsProvider;
use crate::secret::SecretBytes;
use crate::telemetry::Metrics;

/// `GetParameters` takes at most this many names.
pub(super) const BATCH: usize = 10;
/// Largest page `GetParametersByPath` returns.
const BY_PATH_PAGE: i32 = 10;
/// Largest page `DescribeParameters` returns.
const DESCRIBE_PAGE: i32 = 50;
/// Most bytes of names and values one `find` gathers before it is refused.
pub const MAX_FIND_BYTES: usize = MAX_RESPONSE_BYTES;
/// Longest `remoteRef.version` (SSM labels have at most 100 characters).
const MAX_SELECTOR_LEN: usize = 100;

/// Reads Parameter Store as one identity.
pub struct ParameterStore {
    client: Client,
    /// Where the provider counts its `GetParameters` calls.
    metrics: Arc<Metrics>,
    /// Unversioned reads waiting to be batched.
    queue: Queue,
}

impl ParameterStore {
    /// Authenticates as the store says (reusing cached sessions) and returns a client.
    pub async fn new(spec: &AwsProvider, ctx: &BuildContext<'_>) -> Result<Self, ProviderError> {
        Ok(Self {
            client: super::auth::ssm_client(spec, ctx).await?,
            metrics: Arc::clone(&ctx.env.metrics),
            queue: Queue::default(),
        })
    }

    /// Current values of `names`, `BATCH` per call; names deleted meanwhile are skipped.
    async fn values(
        &self,
        names: &[String],
        bytes: &mut usize,
    ) -> Result<Vec<(String, SecretBytes)>, ProviderError> {
        let mut out = Vec::with_capacity(names.len());
        for chunk in names.chunks(BATCH) {
            let resp = get_parameters(&self.client, &self.metrics, chunk).await?;
            for p in resp.parameters() {
                let name = p.name().unwrap_or_default().to_string();
                let v = value(p)?;
                add_bytes(bytes, name.len() + v.len())?;
                out.push((name, v));
            }
        }
        Ok(out)
    }

    /// Every parameter below `path` (recursive) the query's name matches, with its value.
    async fn by_path(
        &self,
        path: &str,
        query: &FindQuery,
    ) -> Result<Vec<(String, SecretBytes)>, ProviderError> {
        let mut out = Vec::new();
        let mut bytes = 0;
        let mut next = None;
        loop {
            let page = self
                .client
                .get_parameters_by_path()
                .path(path)
                .recursive(true)
                .with_decryption(true)
                .max_results(BY_PATH_PAGE)
                .set_next_token(next)
                .send()
                .await
                .map_err(|e| map_err("GetParametersByPath", e))?;
            for p in page.parameters() {
                let Some(name) = p.name().filter(|n| query.matches(n)) else {
                    continue;
                };
                let v = value(p)?;
                add_bytes(&mut bytes, name.len() + v.len())?;
                out.push((name.to_string(), v));
            }
            if out.len() > MAX_FIND_RESULTS {
                return found(out);
            }
            next = page.next_token().map(String::from);
            if next.is_none() {
                return found(out);
            }
        }
    }

    /// Names of the parameters the query selects, from `DescribeParameters` (tags and the
    /// literal name prefix filtered by SSM, the expression here).
    async fn describe(&self, query: &FindQuery) -> Result<Vec<String>, ProviderError> {
        let mut filters = Vec::new();
        for (k, v) in &query.tags {
            filters.push(filter(&format!("tag:{k}"), "Equals", v)?);
        }
        if let Some(prefix) = super::list_prefix(query) {
            filters.push(filter("Name", "BeginsWith", &prefix)?);
        }
        let filters = (!filters.is_empty()).then_some(filters);
        let mut names = Vec::new();
        let mut bytes = 0;
        let mut next = None;
        loop {
            let page = self
                .client
                .describe_parameters()
                .set_parameter_filters(filters.clone())
                .max_results(DESCRIBE_PAGE)
                .set_next_token(next)
                .send()
                .await
                .map_err(|e| map_err("DescribeParameters", e))?;
            for name in page
                .parameters()
                .iter()
                .filter_map(|p| p.name())
                .filter(|n| query.matches(n))
            {
                add_bytes(&mut bytes, name.len())?;
                names.push(name.to_string());
            }
            if names.len() > MAX_FIND_RESULTS {
                return Ok(names);
            }
            next = page.next_token().map(String::from);
            if next.is_none() {
                return Ok(names);
            }
        }
    }
}

#[async_trait]
impl Provider for ParameterStore {
    async fn get(&self, key: &RemoteKey) -> Result<SecretBytes, ProviderError> {
        match key.version.as_deref() {
            Some(v) => get_one(&self.client, &selector(&key.key, v)?).await,
            None => {
                let (client, metrics) = (self.client.clone(), Arc::clone(&self.metrics));
                batch::queued(
                    &self.queue,
                    &key.key,
                    "GetParameter",
                    move |queued| async move { flush(&client, &metrics, queued).await },
                )
                .await
            }
        }
    }

    async fn find(&self, query: &FindQuery) -> Result<Vec<(String, SecretBytes)>, ProviderError> {
        // GetParametersByPath cannot filter by tag: a search with tags lists names instead.
        if let Some(path) = query.path.as_deref().filter(|_| query.tags.is_empty()) {
            return self.by_path(path, query).await;
        }
        let mut names = self.describe(query).await?;
        if names.len() > MAX_FIND_RESULTS {
            // `found` refuses it with the count; no need to read the values.
            return found(
                names
                    .into_iter()
                    .map(|n| (n, SecretBytes::new(vec![])))
                    .collect(),
            );
        }
        names.sort();
        names.dedup();
        let mut bytes = names.iter().map(String::len).sum();
        found(self.values(&names, &mut bytes).await?)
    }

    fn finds_by_tags(&self) -> bool {
        true
    }
}

/// `name:version` or `name:label`, as SSM reads a selector; anything else in `version` is
/// refused here rather than sent as part of a name.
fn selector(name: &str, version: &str) -> Result<String, ProviderError> {
    let valid = !version.is_empty()
        && version.len() <= MAX_SELECTOR_LEN
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !valid {
        return Err(ProviderError::Config(
            "remoteRef.version must be a Parameter Store version number or label \
             (letters, digits, '.', '_', '-')"
                .into(),
        ));
    }
    Ok(format!("{name}:{version}"))
}

fn filter(key: &str, option: &str, value: &str) -> Result<ParameterStringFilter, ProviderError> {
    ParameterStringFilter::builder()
        .key(key)
        .option(option)
        .values(value)
        .build()
        .map_err(|_| ProviderError::Config("DescribeParameters: cannot build the filter".into()))
}

/// Adds to a find's running total, refusing it past [`MAX_FIND_BYTES`].
fn add_bytes(total: &mut usize, more: usize) -> Result<(), ProviderError> {
    *total = total.saturating_add(more);
    if *total > MAX_FIND_BYTES {
        return Err(ProviderError::TooLarge(format!(
            "dataFrom.find gathered more than {MAX_FIND_BYTES} bytes of parameters; \
             narrow the path, name or tags"
        )));
    }
    Ok(())
}

/// The parameter's (decrypted) value.
fn value(p: &Parameter) -> Result<SecretBytes, ProviderError> {
    p.value()
        .map(SecretBytes::from)
        .ok_or(ProviderError::NotFound)
}

/// One parameter with `GetParameter`, decrypted; `name` may carry a `:version` selector.
async fn get_one(client: &Client, name: &str) -> Result<SecretBytes, ProviderError> {
    let out = client
        .get_parameter()
        .name(name)
        .with_decryption(true)
        .send()
        .await
        .map_err(|e| map_err("GetParameter", e))?;
    out.parameter().map_or(Err(ProviderError::NotFound), value)
}

/// One `GetParameters` call (at most `BATCH` names), counted and timed as `get_parameters`.
async fn get_parameters(
    client: &Client,
    metrics: &Metrics,
    names: &[String],
) -> Result<GetParametersOutput, ProviderError> {
    let start = Instant::now();
    let result = client
        .get_parameters()
        .set_names(Some(names.to_vec()))
        .with_decryption(true)
        .send()
        .await
        .map_err(|e| map_err("GetParameters", e));
    batch::count(metrics, "get_parameters", start, result.as_ref().err());
    result
}

/// Reads everything queued and answers every caller: one name with `GetParameter`, more with
/// concurrent `GetParameters` calls of `BATCH` names.
async fn flush(client: &Client, metrics: &Metrics, queued: Vec<(String, Reply)>) {
    let (names, replies) = batch::by_name(queued);
    let results = if let [name] = names.as_slice() {
        vec![(name.clone(), get_one(client, name).await)]
    } else {
        futures::future::join_all(
            names
                .chunks(BATCH)
                .map(|chunk| batch_current(client, metrics, chunk)),
        )
        .await
        .into_iter()
        .flatten()
        .collect()
    };
    batch::answer(replies, results);
}

/// The value, or the error, of each of `names` (at most `BATCH`): one `GetParameters` call,
/// with `GetParameter` for the names its answer does not mention (an ARN, say) and for all of
/// them when the identity may not use `GetParameters` or one name of the call is denied.
async fn batch_current(
    client: &Client,
    metrics: &Metrics,
    names: &[String],
) -> Vec<(String, Result<SecretBytes, ProviderError>)> {
    let call = get_parameters(client, metrics, names).await;
    batch::settle(
        names,
        call,
        |resp| {
            let mut answered = std::collections::HashMap::new();
            for p in resp.parameters() {
                let asked = names
                    .iter()
                    .find(|n| p.name() == Some(n.as_str()) || p.arn() == Some(n.as_str()));
                if let Some(n) = asked {
                    answered.insert(n.as_str(), value(p));
                }
            }
            for invalid in resp.invalid_parameters() {
                if let Some(n) = names.iter().find(|n| *n == invalid) {
                    answered
                        .entry(n.as_str())
                        .or_insert(Err(ProviderError::NotFound));
                }
            }
            answered
        },
        |name| async move { get_one(client, &name).await },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_labels_become_selectors_and_nothing_else_does() {
        assert_eq!(selector("/app/db", "3").unwrap(), "/app/db:3");
        assert_eq!(
            selector("/app/db", "prod-1.x_y").unwrap(),
            "/app/db:prod-1.x_y"
        );
        for bad in ["", "a:b", "a/b", "a b", &"x".repeat(101)] {
            let err = selector("/app/db", bad).unwrap_err();
            assert!(matches!(err, ProviderError::Config(_)), "{bad:?}: {err:?}");
        }
    }

    #[test]
    fn a_parameter_value_is_never_in_debug_output() {
        let p = Parameter::builder()
            .name("/app/db")
            .value("ssm-debug-secret-value")
            .build();
        let out = aws_sdk_ssm::operation::get_parameter::GetParameterOutput::builder()
            .parameter(p.clone())
            .build();
        for text in [
            format!("{p:?}"),
            format!("{out:?}"),
            format!("{:?}", value(&p)),
        ] {
            assert!(!text.contains("ssm-debug-secret-value"), "{text}");
        }
    }

    #[test]
    fn finds_stop_at_their_byte_bound() {
        let mut total = 0;
        add_bytes(&mut total, MAX_FIND_BYTES).unwrap();
        let err = add_bytes(&mut total, 1).unwrap_err();
        assert!(matches!(err, ProviderError::TooLarge(_)), "{err:?}");
    }
}
