//! The `aws` provider: AWS Secrets Manager.
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
//! stays as it was). `find` reads its matches in batches of 20 as well.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use aws_credential_types::Credentials;
use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::config::http::HttpResponse;
use aws_sdk_secretsmanager::config::retry::RetryConfig;
use aws_sdk_secretsmanager::config::timeout::TimeoutConfig;
use aws_sdk_secretsmanager::config::{BehaviorVersion, Region};
use aws_sdk_secretsmanager::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_secretsmanager::operation::batch_get_secret_value::BatchGetSecretValueOutput;
use aws_sdk_secretsmanager::primitives::Blob;
use aws_sdk_secretsmanager::types::{Filter, FilterNameStringType};
use tokio::sync::oneshot;

use aws_sdk_secretsmanager::config::interceptors::BeforeDeserializationInterceptorContextMut;
use aws_sdk_secretsmanager::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_secretsmanager::error::BoxError;
use aws_smithy_types::body::SdkBody;

use super::{
    BuildContext, FindQuery, MAX_FIND_RESULTS, MAX_RESPONSE_BYTES, Provider, ProviderError,
    RemoteKey, found,
};
use crate::api::store::{AwsProvider, AwsSecretRef};
use crate::secret::SecretBytes;
use crate::telemetry::Metrics;
use crate::telemetry::escape::printable;
use crate::telemetry::metrics::{BackendLabels, ProviderLabel};

/// Default audience of the pod token used for web identity.
pub const DEFAULT_AUDIENCE: &str = "sts.amazonaws.com";
/// Temporary credentials are renewed this long before they expire.
const RENEW_BEFORE: Duration = Duration::from_secs(5 * 60);
/// Attempts per request (first try plus retries, with exponential backoff and jitter).
const MAX_ATTEMPTS: u32 = 3;
/// Most cached SDK clients; the cache is emptied when full (clients are cheap to rebuild).
const MAX_CLIENTS: usize = 256;
/// Most cached sessions; expired ones are dropped first.
const MAX_SESSIONS: usize = 4096;
/// How often sessions past their renewal time (whose pods are gone) are dropped.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// `BatchGetSecretValue` takes at most this many ids.
const BATCH: usize = 20;
/// How many times the first queued `get` lets its task run on before the queue is flushed: the
/// other keys of a volume are requested in the same polls of the publish task.
const WINDOW_YIELDS: usize = 2;
/// The stage `BatchGetSecretValue` returns.
const CURRENT: &str = "AWSCURRENT";

type Reply = oneshot::Sender<Result<SecretBytes, ProviderError>>;
/// Current-version reads waiting for the next flush: (secret id, where its outcome goes).
type Queue = Arc<Mutex<Vec<(String, Reply)>>>;

type SessionSlot = Arc<tokio::sync::Mutex<Option<Credentials>>>;
/// (region, endpoint, credentials fingerprint).
type ClientKey = (String, Option<String>, u64);

/// STS sessions and SDK clients shared across publishes.
#[derive(Default)]
pub struct SessionCache {
    hasher: RandomState,
    /// Temporary credentials by session key; the async mutex makes one login per key at a time.
    sessions: Mutex<Sessions>,
    /// Secrets Manager clients by (region, endpoint, credentials fingerprint).
    clients: Mutex<HashMap<ClientKey, (Credentials, Client)>>,
    /// The agent's own SDK configuration (default chain) by region.
    agent: Mutex<HashMap<String, aws_config::SdkConfig>>,
}

/// The session slots and when they were last swept.
#[derive(Default)]
struct Sessions {
    by_key: HashMap<String, SessionSlot>,
    swept: Option<std::time::Instant>,
}

impl Sessions {
    /// Drops every session that is no longer fresh, except those being logged into (locked).
    fn drop_stale(&mut self) {
        self.by_key
            .retain(|_, s| s.try_lock().map(|c| fresh(c.as_ref())).unwrap_or(true));
    }
}

impl SessionCache {
    /// A fingerprint of credentials, keyed per process (never printed).
    fn fingerprint(&self, c: &Credentials) -> u64 {
        self.hasher.hash_one((
            c.access_key_id(),
            c.secret_access_key(),
            c.session_token().unwrap_or(""),
        ))
    }

    /// Fresh temporary credentials for `key`, logging in with `login` only when there are none
    /// or they are about to expire. Concurrent callers for one key share one login.
    async fn session<F, Fut>(&self, key: String, login: F) -> Result<Credentials, ProviderError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Credentials, ProviderError>>,
    {
        let slot = {
            let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
            let now = std::time::Instant::now();
            if sessions
                .swept
                .is_none_or(|at| now.duration_since(at) >= SWEEP_EVERY)
            {
                sessions.drop_stale();
                sessions.swept = Some(now);
            }
            if sessions.by_key.len() >= MAX_SESSIONS && !sessions.by_key.contains_key(&key) {
                sessions.drop_stale();
                if sessions.by_key.len() >= MAX_SESSIONS {
                    sessions.by_key.clear();
                }
            }
            Arc::clone(sessions.by_key.entry(key).or_default())
        };
        let mut held = slot.lock().await;
        if let Some(c) = held.as_ref().filter(|c| fresh(Some(c))) {
            return Ok(c.clone());
        }
        let creds = login().await?;
        *held = Some(creds.clone());
        Ok(creds)
    }

    /// A Secrets Manager client for these credentials, reused while they stay the same.
    fn client(&self, region: &str, endpoint: Option<&str>, creds: Credentials) -> Client {
        let key = (
            region.to_string(),
            endpoint.map(String::from),
            self.fingerprint(&creds),
        );
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((c, client)) = clients.get(&key)
            && *c == creds
        {
            return client.clone();
        }
        if clients.len() >= MAX_CLIENTS {
            clients.clear();
        }
        let conf = aws_sdk_secretsmanager::Config::builder()
            .interceptor(BodyLimit)
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(region.to_string()))
            .credentials_provider(creds.clone())
            .retry_config(retry())
            .timeout_config(timeouts());
        let conf = match endpoint {
            Some(e) => conf.endpoint_url(e),
            None => conf,
        };
        let client = Client::from_conf(conf.build());
        clients.insert(key, (creds, client.clone()));
        client
    }

    /// The agent's own SDK configuration for `region` (loaded once; its chain caches itself).
    async fn agent_config(&self, region: &str) -> aws_config::SdkConfig {
        if let Some(c) = self
            .agent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(region)
        {
            return c.clone();
        }
        let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(Region::new(region.to_string()))
            .retry_config(retry())
            .timeout_config(timeouts())
            .load()
            .await;
        self.agent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(region.to_string(), config.clone());
        config
    }
}

fn fresh(c: Option<&Credentials>) -> bool {
    c.is_some_and(|c| {
        c.expiry()
            .is_none_or(|e| e > SystemTime::now() + RENEW_BEFORE)
    })
}

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
        let cache = &ctx.env.aws_sessions;
        let region = spec.region.as_str();
        let endpoint = spec.endpoint.as_deref();
        let auth = spec.auth.as_ref().ok_or_else(|| {
            ProviderError::Config(
                "the aws store sets no auth: choose auth.jwt (the pod's service account), \
                 auth.secretRef, or auth: {agentIdentity: {}} to use the agent's own AWS identity"
                    .into(),
            )
        })?;
        let who = format!("{}/{}", ctx.pod.namespace, ctx.pod.service_account);
        let session_name = session_name(&ctx.pod.namespace, &ctx.pod.service_account);
        let end = endpoint.unwrap_or("");
        let client = match (&auth.jwt, &auth.secret_ref, &auth.agent_identity) {
            (Some(jwt), None, None) => {
                let role = spec.role.as_deref().ok_or_else(|| {
                    ProviderError::Config(
                        "auth.jwt needs provider.aws.role: the role assumed with the pod's token"
                            .into(),
                    )
                })?;
                let audience = jwt.audience.as_deref().unwrap_or(DEFAULT_AUDIENCE);
                let key = format!("web\n{region}\n{end}\n{role}\n{who}\n{audience}");
                let creds = cache
                    .session(key, || async {
                        // Looked up only when a login is due, so cached sessions serve pods
                        // whose kubelet sent the token earlier.
                        let token = ctx.pod.tokens.for_audience(audience).ok_or_else(|| {
                            ProviderError::Config(format!(
                                "kubelet passed no service-account token for audience \
                                 {audience:?}: add it to the CSIDriver's tokenRequests"
                            ))
                        })?;
                        login(ctx);
                        let sts = sts_client(region, endpoint, None);
                        let out = sts
                            .assume_role_with_web_identity()
                            .role_arn(role)
                            .role_session_name(&session_name)
                            .web_identity_token(token.token.expose())
                            .send()
                            .await
                            .map_err(|e| map_err("AssumeRoleWithWebIdentity", e))?;
                        temporary(out.credentials(), "web-identity")
                    })
                    .await?;
                cache.client(region, endpoint, creds)
            }
            (None, Some(r), None) => {
                let base = static_keys(ctx, r).await?;
                match spec.role.as_deref() {
                    None => cache.client(region, endpoint, base),
                    Some(role) => {
                        let key = format!(
                            "keys\n{region}\n{end}\n{role}\n{who}\n{:x}",
                            cache.fingerprint(&base)
                        );
                        let creds = cache
                            .session(key, || {
                                let sts = sts_client(region, endpoint, Some(base));
                                assume_role(ctx, sts, role, &session_name)
                            })
                            .await?;
                        cache.client(region, endpoint, creds)
                    }
                }
            }
            (None, None, Some(_)) => {
                // Validation refuses this at bind time already; never sign with the node's
                // identity for a tenant's store, whatever the caller checked.
                if ctx.store_kind != crate::api::StoreKind::ClusterSecretStore {
                    return Err(ProviderError::PermissionDenied(
                        "auth.agentIdentity is only allowed on a ClusterSecretStore".into(),
                    ));
                }
                let sdk = cache.agent_config(region).await;
                match spec.role.as_deref() {
                    None => {
                        let conf = aws_sdk_secretsmanager::config::Builder::from(&sdk)
                            .interceptor(BodyLimit);
                        let conf = match endpoint {
                            Some(e) => conf.endpoint_url(e),
                            None => conf,
                        };
                        Client::from_conf(conf.build())
                    }
                    Some(role) => {
                        let key = format!("agent\n{region}\n{end}\n{role}\n{who}");
                        let creds = cache
                            .session(key, || {
                                let conf =
                                    aws_sdk_sts::config::Builder::from(&sdk).interceptor(BodyLimit);
                                let conf = match endpoint {
                                    Some(e) => conf.endpoint_url(e),
                                    None => conf,
                                };
                                let sts = aws_sdk_sts::Client::from_conf(conf.build());
                                assume_role(ctx, sts, role, &session_name)
                            })
                            .await?;
                        cache.client(region, endpoint, creds)
                    }
                }
            }
            _ => {
                return Err(ProviderError::Config(
                    "provider.aws.auth must set exactly one of jwt, secretRef, agentIdentity"
                        .into(),
                ));
            }
        };
        Ok(Self {
            client,
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
        let (tx, rx) = oneshot::channel();
        let first = {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.push((key.key.clone(), tx));
            queue.len() == 1
        };
        if first {
            // The flush waits until this caller has let its task run on, or was dropped.
            let (go, wait) = oneshot::channel::<()>();
            let queue = Arc::clone(&self.queue);
            let client = self.client.clone();
            let metrics = Arc::clone(&self.metrics);
            tokio::spawn(async move {
                let _ = wait.await;
                let queued =
                    std::mem::take(&mut *queue.lock().unwrap_or_else(PoisonError::into_inner));
                flush(&client, &metrics, queued).await;
            });
            for _ in 0..WINDOW_YIELDS {
                tokio::task::yield_now().await;
            }
            drop(go);
        }
        rx.await.unwrap_or_else(|_| {
            Err(ProviderError::Unavailable(
                "GetSecretValue: the batched read was abandoned".into(),
            ))
        })
    }

    async fn find(&self, query: &FindQuery) -> Result<Vec<(String, SecretBytes)>, ProviderError> {
        let prefix = list_prefix(query);
        let filters = prefix.map(|p| {
            vec![
                Filter::builder()
                    .key(FilterNameStringType::Name)
                    .values(p)
                    .build(),
            ]
        });
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
}

/// One secret with `GetSecretValue`: its current value, or the given stage or `uuid/` version.
async fn get_one(
    client: &Client,
    id: &str,
    version: Option<&str>,
) -> Result<SecretBytes, ProviderError> {
    let req = client.get_secret_value().secret_id(id);
    let req = match version {
        Some(v) => match v.strip_prefix("uuid/") {
            Some(id) => req.version_id(id),
            None => req.version_stage(v),
        },
        None => req,
    };
    let out = req.send().await.map_err(|e| map_err("GetSecretValue", e))?;
    value(out.secret_string(), out.secret_binary())
}

/// One `BatchGetSecretValue` call (at most `BATCH` ids), counted and timed as `batch_get`.
async fn batch_call(
    client: &Client,
    metrics: &Metrics,
    ids: &[String],
) -> Result<BatchGetSecretValueOutput, ProviderError> {
    let start = Instant::now();
    let result = client
        .batch_get_secret_value()
        .set_secret_id_list(Some(ids.to_vec()))
        .send()
        .await
        .map_err(|e| map_err("BatchGetSecretValue", e));
    let labels = BackendLabels {
        provider: "aws",
        operation: "batch_get",
        result: result.as_ref().err().map_or("success", ProviderError::kind),
    };
    metrics.backend_requests.get_or_create(&labels).inc();
    metrics
        .backend_duration
        .get_or_create(&labels)
        .observe(start.elapsed().as_secs_f64());
    result
}

/// Reads the current values of everything queued and answers every caller: one name with
/// `GetSecretValue`, more with concurrent `BatchGetSecretValue` calls of `BATCH` names.
async fn flush(client: &Client, metrics: &Metrics, queued: Vec<(String, Reply)>) {
    let mut names: Vec<String> = Vec::new();
    let mut replies: HashMap<String, Vec<Reply>> = HashMap::new();
    for (name, tx) in queued {
        let waiting = replies.entry(name).or_insert_with_key(|n| {
            names.push(n.clone());
            Vec::new()
        });
        waiting.push(tx);
    }
    let results = if let [name] = names.as_slice() {
        vec![(name.clone(), get_one(client, name, None).await)]
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
    for (name, result) in results {
        for tx in replies.remove(&name).unwrap_or_default() {
            let _ = tx.send(result.clone());
        }
    }
}

/// The current value, or the error, of each of `ids` (at most `BATCH`): one
/// `BatchGetSecretValue` call, with `GetSecretValue` for the ids its answer does not name (a
/// partial ARN, say) and for all of them when the identity may not batch.
async fn batch_current(
    client: &Client,
    metrics: &Metrics,
    ids: &[String],
) -> Vec<(String, Result<SecretBytes, ProviderError>)> {
    let one_by_one = |ids: Vec<String>| {
        futures::future::join_all(ids.into_iter().map(|id| async move {
            let result = get_one(client, &id, None).await;
            (id, result)
        }))
    };
    let resp = match batch_call(client, metrics, ids).await {
        Ok(resp) => resp,
        // Allowed GetSecretValue but not BatchGetSecretValue, or an endpoint without it.
        Err(ProviderError::PermissionDenied(_) | ProviderError::Config(_)) => {
            return one_by_one(ids.to_vec()).await;
        }
        Err(e) => return ids.iter().map(|id| (id.clone(), Err(e.clone()))).collect(),
    };
    let mut answered: HashMap<&str, Result<SecretBytes, ProviderError>> = HashMap::new();
    for v in resp.secret_values() {
        let id = ids
            .iter()
            .find(|id| v.name() == Some(id.as_str()) || v.arn() == Some(id.as_str()));
        if let Some(id) = id {
            answered.insert(id, value(v.secret_string(), v.secret_binary()));
        }
    }
    for e in resp.errors() {
        let id = ids.iter().find(|id| e.secret_id() == Some(id.as_str()));
        if let Some(id) = id {
            answered.entry(id).or_insert_with(|| {
                Err(code_error(
                    "BatchGetSecretValue",
                    e.error_code().unwrap_or(""),
                    e.message(),
                    400,
                ))
            });
        }
    }
    let unanswered: Vec<String> = ids
        .iter()
        .filter(|id| !answered.contains_key(id.as_str()))
        .cloned()
        .collect();
    let mut out: Vec<_> = answered
        .into_iter()
        .map(|(id, r)| (id.to_string(), r))
        .collect();
    out.extend(one_by_one(unanswered).await);
    out
}

/// Records one STS call.
fn login(ctx: &BuildContext<'_>) {
    ctx.env
        .metrics
        .logins
        .get_or_create(&ProviderLabel { provider: "aws" })
        .inc();
}

async fn assume_role(
    ctx: &BuildContext<'_>,
    sts: aws_sdk_sts::Client,
    role: &str,
    session_name: &str,
) -> Result<Credentials, ProviderError> {
    login(ctx);
    let out = sts
        .assume_role()
        .role_arn(role)
        .role_session_name(session_name)
        .send()
        .await
        .map_err(|e| map_err("AssumeRole", e))?;
    temporary(out.credentials(), "assume-role")
}

/// Static keys from the store's `secretRef`.
async fn static_keys(
    ctx: &BuildContext<'_>,
    r: &AwsSecretRef,
) -> Result<Credentials, ProviderError> {
    let id = super::credentials::read(ctx, &r.access_key_id_secret_ref).await?;
    let secret = super::credentials::read(ctx, &r.secret_access_key_secret_ref).await?;
    let token = match &r.session_token_secret_ref {
        Some(s) => Some(super::credentials::read(ctx, s).await?),
        None => None,
    };
    Ok(Credentials::new(
        id.expose().trim(),
        secret.expose().trim(),
        token.map(|t| t.expose().trim().to_string()),
        None,
        "latchkey-secret-ref",
    ))
}

fn sts_client(
    region: &str,
    endpoint: Option<&str>,
    creds: Option<Credentials>,
) -> aws_sdk_sts::Client {
    let conf = aws_sdk_sts::Config::builder()
        .interceptor(BodyLimit)
        .behavior_version(aws_sdk_sts::config::BehaviorVersion::latest())
        .region(aws_sdk_sts::config::Region::new(region.to_string()))
        .retry_config(retry())
        .timeout_config(timeouts());
    let conf = match endpoint {
        Some(e) => conf.endpoint_url(e),
        None => conf,
    };
    let conf = match creds {
        Some(c) => conf.credentials_provider(c),
        None => conf,
    };
    aws_sdk_sts::Client::from_conf(conf.build())
}

/// STS credentials as SDK credentials with their expiry.
fn temporary(
    c: Option<&aws_sdk_sts::types::Credentials>,
    source: &'static str,
) -> Result<Credentials, ProviderError> {
    let c = c.ok_or_else(|| ProviderError::Unavailable("STS returned no credentials".into()))?;
    let expiry = SystemTime::try_from(*c.expiration()).ok();
    Ok(Credentials::new(
        c.access_key_id(),
        c.secret_access_key(),
        Some(c.session_token().to_string()),
        expiry,
        source,
    ))
}

/// `latchkey.<namespace>.<service account>`, within STS's 64 characters and alphabet.
fn session_name(namespace: &str, service_account: &str) -> String {
    let name: String = format!("latchkey.{namespace}.{service_account}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "+=,.@-_".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    name.chars().take(64).collect()
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

/// An SDK failure as a provider error: the AWS error code and message (never values or keys).
fn map_err<E>(op: &str, err: SdkError<E, HttpResponse>) -> ProviderError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match err {
        SdkError::ServiceError(e) => {
            let status = e.raw().status().as_u16();
            let inner = e.into_err();
            code_error(op, inner.code().unwrap_or(""), inner.message(), status)
        }
        SdkError::TimeoutError(_) => ProviderError::Timeout(format!("{op}: no answer in time")),
        SdkError::DispatchFailure(e) => ProviderError::Unavailable(format!(
            "{op}: cannot reach AWS ({})",
            if e.is_timeout() {
                "timeout"
            } else if e.is_io() {
                "connection failed"
            } else {
                "request not sent"
            }
        )),
        SdkError::ResponseError(_) if body_too_large(&err) => ProviderError::Unavailable(format!(
            "{op}: the answer is larger than {MAX_RESPONSE_BYTES} bytes"
        )),
        SdkError::ResponseError(_) => {
            ProviderError::Unavailable(format!("{op}: unreadable response from AWS"))
        }
        SdkError::ConstructionFailure(_) => {
            ProviderError::Config(format!("{op}: cannot build the request"))
        }
        _ => ProviderError::Unavailable(format!("{op}: request failed")),
    }
}

/// True when reading the body stopped at [`BodyLimit`]'s cap.
fn body_too_large(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |e| e.source())
        .any(|e| e.is::<http_body_util::LengthLimitError>())
}

/// Caps every response body the SDK reads (Secrets Manager and STS) at
/// [`MAX_RESPONSE_BYTES`], checked as it arrives: `endpoint` may name a server a tenant runs.
#[derive(Debug)]
struct BodyLimit;

impl Intercept for BodyLimit {
    fn name(&self) -> &'static str {
        "LatchkeyBodyLimit"
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let response = context.response_mut();
        let body = response.take_body();
        *response.body_mut() =
            SdkBody::from_body_1_x(http_body_util::Limited::new(body, MAX_RESPONSE_BYTES));
        Ok(())
    }
}

fn code_error(op: &str, code: &str, message: Option<&str>, status: u16) -> ProviderError {
    // Both come from the endpoint, which a ClusterSecretStore may point anywhere: escaped.
    let message = printable(message.unwrap_or(""), 300);
    let code = &printable(code, 100);
    let detail = format!("{op}: {code}: {message}");
    match code.as_str() {
        "ResourceNotFoundException" => ProviderError::NotFound,
        "AccessDeniedException"
        | "AccessDenied"
        | "UnrecognizedClientException"
        | "InvalidClientTokenId"
        | "InvalidSignatureException"
        | "SignatureDoesNotMatch"
        | "ExpiredTokenException"
        | "ExpiredToken"
        | "InvalidIdentityToken"
        | "IDPRejectedClaim"
        | "DecryptionFailure" => ProviderError::PermissionDenied(detail),
        "ThrottlingException"
        | "Throttling"
        | "TooManyRequestsException"
        | "RequestLimitExceeded" => ProviderError::Throttled(detail),
        // Codes the protocol parser could not read: the HTTP status still says what happened.
        _ if status == 401 || status == 403 => ProviderError::PermissionDenied(format!(
            "{op}: HTTP {status} {code}{}",
            if message.is_empty() {
                String::new()
            } else {
                format!(": {message}")
            }
        )),
        _ if status == 429 => ProviderError::Throttled(detail),
        _ if status >= 500 || code.starts_with("InternalService") => {
            ProviderError::Unavailable(detail)
        }
        "InvalidParameterException" | "InvalidRequestException" | "ValidationException" => {
            ProviderError::Config(detail)
        }
        _ => ProviderError::Unavailable(detail),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(path: Option<&str>, name: Option<&str>) -> FindQuery {
        FindQuery {
            path: path.map(String::from),
            name: name.map(|n| regex::Regex::new(n).unwrap()),
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

    #[test]
    fn session_names_fit_sts_rules() {
        assert_eq!(session_name("shop", "web"), "latchkey.shop.web");
        let long = session_name(&"n".repeat(63), &"s".repeat(63));
        assert_eq!(long.len(), 64);
    }

    #[test]
    fn error_codes_map_to_kinds_without_values() {
        assert!(matches!(
            code_error("Get", "ResourceNotFoundException", None, 400),
            ProviderError::NotFound
        ));
        assert!(matches!(
            code_error("Get", "AccessDeniedException", Some("no"), 400),
            ProviderError::PermissionDenied(_)
        ));
        assert!(matches!(
            code_error("Get", "ThrottlingException", None, 400),
            ProviderError::Throttled(_)
        ));
        assert!(matches!(
            code_error("Get", "Whatever", None, 503),
            ProviderError::Unavailable(_)
        ));
    }

    #[test]
    fn credentials_fresh_until_shortly_before_expiry() {
        let soon = Credentials::new(
            "a",
            "b",
            None,
            Some(SystemTime::now() + Duration::from_secs(60)),
            "t",
        );
        let later = Credentials::new(
            "a",
            "b",
            None,
            Some(SystemTime::now() + Duration::from_secs(3600)),
            "t",
        );
        assert!(!fresh(Some(&soon)));
        assert!(fresh(Some(&later)));
        assert!(!fresh(None));

        // A sweep keeps only sessions still worth reusing.
        let mut sessions = Sessions::default();
        for (key, creds) in [("soon", soon), ("later", later)] {
            sessions
                .by_key
                .insert(key.into(), Arc::new(tokio::sync::Mutex::new(Some(creds))));
        }
        sessions
            .by_key
            .insert("empty".into(), SessionSlot::default());
        sessions.drop_stale();
        let kept: Vec<_> = sessions.by_key.keys().cloned().collect();
        assert_eq!(kept, ["later"]);
    }
}
