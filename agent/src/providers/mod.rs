//! Backends that hold secret values. One trait; one file (or folder) per provider. Providers know
//! their backend and nothing of CSI, volumes or ExternalSecrets.

pub mod audiences;
pub mod aws;
pub mod ca_provider;
pub mod credentials;
pub mod fake;
pub mod fake_push;
pub mod grpc_answer;
pub mod kubernetes;
pub mod plugin;
pub mod push;
pub mod secrets_store_csi;
pub mod vault;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::api::validate::ProviderSpec;
use crate::api::{CredentialScope, StoreKind};
use crate::catalog::Catalog;
use crate::identity::PodInfo;
use crate::secret::SecretBytes;
use crate::telemetry::Metrics;
use crate::telemetry::metrics::BackendLabels;

/// One remote value to fetch: a key and an optional provider-specific version.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RemoteKey {
    /// Secret name or path in the backend.
    pub key: String,
    /// Version (AWS VersionStage or `uuid/<id>`, Vault KV version); `None` = current.
    pub version: Option<String>,
}

impl std::fmt::Display for RemoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.version {
            Some(v) => write!(f, "remote key \"{}\" version \"{v}\"", self.key),
            None => write!(f, "remote key \"{}\"", self.key),
        }
    }
}

/// Inserts into a map that must stay bounded although tenants choose its keys (endpoints,
/// stores, identities): a new key arriving at `max` entries starts the map over. What is kept
/// there is cheap to make again (a lazily connecting channel, a shared call), so a clean slate
/// costs one reconnect each, not a correctness problem.
pub(crate) fn insert_bounded<V>(
    map: &mut std::collections::HashMap<String, V>,
    max: usize,
    key: String,
    value: V,
) {
    if map.len() >= max && !map.contains_key(&key) {
        map.clear();
    }
    map.insert(key, value);
}

/// Largest HTTP response body a provider reads from a backend (Vault, AWS), checked as it
/// arrives: a store may name a backend a tenant runs, and a huge answer must fail the request,
/// not exhaust the agent's memory.
pub const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// Most secrets one `dataFrom.find` may return: a broader match is almost certainly a mistake,
/// and every result becomes a file.
pub const MAX_FIND_RESULTS: usize = 500;

/// The name filter of `dataFrom.find`: an optional path prefix and an optional regular expression.
#[derive(Debug, Clone)]
pub struct FindQuery {
    /// Only names below this path (prefix match).
    pub path: Option<String>,
    /// Only names this expression matches (unanchored, as in ESO).
    pub name: Option<regex::Regex>,
    /// Only secrets carrying every one of these tags; providers that cannot filter by tag
    /// (all but `aws`) refuse a query with tags (see [`Provider::finds_by_tags`]).
    pub tags: std::collections::BTreeMap<String, String>,
}

impl FindQuery {
    /// True when both queries select the same names (same path, pattern text and tags).
    pub fn same_as(&self, other: &FindQuery) -> bool {
        self.path == other.path
            && self.tags == other.tags
            && self.name.as_ref().map(regex::Regex::as_str)
                == other.name.as_ref().map(regex::Regex::as_str)
    }

    /// True when `name` passes both filters.
    pub fn matches(&self, name: &str) -> bool {
        self.path.as_deref().is_none_or(|p| name.starts_with(p))
            && self.name.as_ref().is_none_or(|re| re.is_match(name))
    }
}

/// Keeps the matching names, sorted, refusing an unreasonably broad match.
pub fn found(
    mut results: Vec<(String, SecretBytes)>,
) -> Result<Vec<(String, SecretBytes)>, ProviderError> {
    if results.len() > MAX_FIND_RESULTS {
        return Err(ProviderError::Config(format!(
            "dataFrom.find matched {} secrets, more than {MAX_FIND_RESULTS}; narrow the name or path",
            results.len()
        )));
    }
    results.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(results)
}

/// Why a backend did not return a value. Messages never contain values or credentials.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProviderError {
    /// The key (or version) does not exist.
    #[error("not found in the backend")]
    NotFound,
    /// The backend refused the identity.
    #[error("access denied by the backend: {0}")]
    PermissionDenied(String),
    /// The backend could not be reached or failed.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// The backend throttled the request.
    #[error("backend throttled the request: {0}")]
    Throttled(String),
    /// The backend did not answer in time.
    #[error("backend timed out: {0}")]
    Timeout(String),
    /// The store's provider settings are unusable.
    #[error("invalid provider configuration: {0}")]
    Config(String),
    /// The provider cannot list secrets, so `dataFrom.find` cannot be served.
    #[error("this provider cannot list secrets, so dataFrom.find is not available with it")]
    CannotFind,
    /// The store names a provider this build cannot use.
    #[error("provider {0} is not available in this version of Latchkey")]
    Unsupported(&'static str),
    /// The backend's answer would make the agent build more than its bounds allow (keys,
    /// depth, memory of answers being parsed); nothing of it was kept.
    #[error("answer refused: {0}")]
    TooLarge(String),
}

impl ProviderError {
    /// A short, bounded name for metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderError::NotFound => "not_found",
            ProviderError::PermissionDenied(_) => "permission_denied",
            ProviderError::Unavailable(_) => "unavailable",
            ProviderError::Throttled(_) => "throttled",
            ProviderError::Timeout(_) => "timeout",
            ProviderError::Config(_) => "config",
            ProviderError::CannotFind => "cannot_find",
            ProviderError::Unsupported(_) => "unsupported",
            ProviderError::TooLarge(_) => "too_large",
        }
    }
}

/// A source of secret values.
#[async_trait]
pub trait Provider: Send + Sync {
    /// Fetches one remote value.
    async fn get(&self, key: &RemoteKey) -> Result<SecretBytes, ProviderError>;

    /// Every remote secret the query matches, with its current value, sorted by name.
    async fn find(&self, _query: &FindQuery) -> Result<Vec<(String, SecretBytes)>, ProviderError> {
        Err(ProviderError::CannotFind)
    }

    /// True when `find` honours [`FindQuery::tags`]; a query with tags is refused otherwise,
    /// rather than answered with every secret the other filters match.
    fn finds_by_tags(&self) -> bool {
        false
    }
}

/// What providers need from the agent itself.
#[derive(Clone)]
pub struct Env {
    /// Where backend requests are counted.
    pub metrics: Arc<Metrics>,
    /// The agent's API server connection (URL, CA), for providers that act as the pod there;
    /// `None` in standalone mode.
    pub kube: Option<kube::Config>,
    /// Where credential Secrets are looked up (`secretRef` of stores).
    pub catalog: Arc<dyn Catalog>,
    /// The agent's own namespace: the only place a ClusterSecretStore's credentials may live.
    pub agent_namespace: String,
    /// AWS STS sessions and SDK clients, shared across publishes.
    pub aws_sessions: Arc<aws::SessionCache>,
    /// Vault login tokens, shared by every publish (one login per identity per token lifetime).
    pub vault_tokens: Arc<vault::tokens::TokenCache>,
    /// Secret-store plugins: the allowed socket directory and one channel per endpoint.
    pub plugins: Arc<plugin::Plugins>,
    /// Secrets Store CSI Driver providers: their socket directory, channels and the object
    /// versions last returned.
    pub secrets_store: Arc<secrets_store_csi::SecretsStoreProviders>,
}

/// Everything a provider may need to be built for one publish.
pub struct BuildContext<'a> {
    /// The agent's side.
    pub env: &'a Env,
    /// The pod the values are for (namespace, service account, tokens).
    pub pod: &'a PodInfo,
    /// Where the store's credential references may point and who reads them (a SecretStore,
    /// an inline ClusterSecretStore, or a referent cluster-scoped provider object).
    pub scope: CredentialScope,
    /// How old a value this fetch accepts (its refresh interval); `None`: any age. Lets a
    /// provider that reads many values in one call share that call across fetches.
    pub max_age: Option<Duration>,
}

impl BuildContext<'_> {
    /// Kind of the store the values are read from.
    pub fn store_kind(&self) -> StoreKind {
        self.scope.store_kind()
    }
}

/// Builds the provider a store's (validated) spec selects for one pod, with every request
/// counted and timed.
pub async fn build(
    spec: ProviderSpec<'_>,
    ctx: &BuildContext<'_>,
) -> Result<Arc<dyn Provider>, ProviderError> {
    let inner: Arc<dyn Provider> = match spec {
        ProviderSpec::Aws(a) => aws::build(a, ctx).await?,
        ProviderSpec::Fake(f) => Arc::new(fake::Fake::new(f)?),
        ProviderSpec::Kubernetes(k) => {
            Arc::new(kubernetes::KubernetesSecrets::build(k, ctx).await?)
        }
        ProviderSpec::Vault(v) => Arc::new(vault::Vault::new(v, ctx).await?),
        ProviderSpec::Plugin(p) => Arc::new(plugin::Plugin::new(p, ctx).await?),
        ProviderSpec::SecretsStoreCsi(p) => {
            Arc::new(secrets_store_csi::SecretsStoreCsi::new(p, ctx).await?)
        }
    };
    Ok(Arc::new(Instrumented {
        inner,
        provider: spec.name(),
        metrics: Arc::clone(&ctx.env.metrics),
    }))
}

/// Records every backend request in the metrics, whatever the provider.
struct Instrumented {
    inner: Arc<dyn Provider>,
    provider: &'static str,
    metrics: Arc<Metrics>,
}

#[async_trait]
impl Provider for Instrumented {
    async fn get(&self, key: &RemoteKey) -> Result<SecretBytes, ProviderError> {
        let start = Instant::now();
        let result = self.inner.get(key).await;
        self.record("get", start, result.as_ref().err());
        result
    }

    async fn find(&self, query: &FindQuery) -> Result<Vec<(String, SecretBytes)>, ProviderError> {
        if !query.tags.is_empty() && !self.inner.finds_by_tags() {
            return Err(ProviderError::Config(
                "dataFrom.find.tags is only supported by provider.aws (SecretsManager and \
                 ParameterStore)"
                    .into(),
            ));
        }
        let start = Instant::now();
        let result = self.inner.find(query).await;
        self.record("find", start, result.as_ref().err());
        result
    }
}

impl Instrumented {
    fn record(&self, operation: &'static str, start: Instant, error: Option<&ProviderError>) {
        let labels = BackendLabels {
            provider: self.provider,
            operation,
            result: error.map_or("success", ProviderError::kind),
        };
        self.metrics.backend_requests.get_or_create(&labels).inc();
        self.metrics
            .backend_duration
            .get_or_create(&labels)
            .observe(start.elapsed().as_secs_f64());
    }
}
