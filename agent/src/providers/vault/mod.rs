//! The `vault` provider: HashiCorp Vault / OpenBao KV v1 and v2, with token, kubernetes, jwt or
//! AppRole auth. kubernetes and jwt logins use the pod's own projected token.
//!
//! Login tokens are kept in a [`TokenCache`] shared by every publish (it lives in
//! [`super::Env`]), keyed by (server, namespace, auth mount, role, identity), so pods of one
//! service account log in once per token lifetime. Values are not cached here: the shared value
//! cache sits in front of every provider.
//!
//! A read returns the JSON of the secret's data map; resolution applies `property`.
//! Tokens, secret ids and values never appear in an error or a log line.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine;
use vaultrs::api::auth::approle::requests::LoginWithApproleRequest;
use vaultrs::api::auth::kubernetes::requests::LoginWithKubernetesRequest;
use vaultrs::api::auth::oidc::requests::JWTLoginRequest;
use vaultrs::api::kv1::requests::{GetSecretRequest, ListSecretRequest};
use vaultrs::api::kv2::requests::{ListSecretsRequest, ReadSecretRequest};
use vaultrs::api::{AuthInfo, EndpointMiddleware};
use vaultrs::error::ClientError;

mod transport;
use transport::Transport;

use super::{BuildContext, FindQuery, Provider, ProviderError, RemoteKey, credentials, found};
use crate::api::StoreKind;
use crate::api::store::VaultProvider;
use crate::secret::{SecretBytes, SecretString};
use crate::telemetry::metrics::{BackendLabels, ProviderLabel};

/// How long one request to Vault may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Most cached login tokens; when full, stale entries are dropped first, then all idle ones.
const MAX_TOKENS: usize = 4096;
/// Longest a token is reused when Vault gives it no lifetime (lease duration 0, e.g. a root or
/// periodic token): such a token must not outlive the access decisions it was obtained under.
const MAX_TOKEN_REUSE: Duration = Duration::from_secs(3600);

/// What a cached login token is for. Two identities never share a token.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct TokenKey {
    server: String,
    namespace: String,
    /// Auth method and mount, e.g. `jwt:jwt`.
    mount: String,
    role: String,
    /// Who the login is for: the pod's `namespace/serviceaccount` (kubernetes, jwt); for AppRole
    /// the credential Secret's checked location, prefixed, for a SecretStore, by the pod's
    /// `namespace/serviceaccount` (see [`authenticate`]).
    identity: String,
}

/// How often the token cache drops tokens that have expired (whose pods are gone).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// A login token and when to stop using it.
struct CachedToken {
    token: SecretString,
    /// When to renew it (or log in again): two thirds into its lease.
    refresh_at: Instant,
    /// When Vault stops accepting it.
    expires_at: Instant,
    /// Its lease as granted; a renewal that grants much less (the role's max TTL is near)
    /// is not worth keeping.
    lease: Duration,
    renewable: bool,
}

impl CachedToken {
    fn from_auth(auth: AuthInfo, now: Instant) -> Self {
        // Re-login once two thirds of the lifetime are over: well before Vault rejects it. A
        // token without a lifetime is reused for a bounded time only.
        let (lease, reuse) = match auth.lease_duration {
            0 => (MAX_TOKEN_REUSE, MAX_TOKEN_REUSE),
            secs => (Duration::from_secs(secs), Duration::from_secs(secs) * 2 / 3),
        };
        Self {
            token: SecretString::new(auth.client_token),
            refresh_at: now.checked_add(reuse).unwrap_or(now),
            expires_at: now.checked_add(lease).unwrap_or(now),
            lease,
            renewable: auth.renewable && auth.lease_duration > 0,
        }
    }

    fn fresh(&self, now: Instant) -> bool {
        now < self.refresh_at
    }

    fn expired(&self, now: Instant) -> bool {
        now >= self.expires_at
    }

    /// Whether a renewal granting `auth` is worth keeping: at least half the lease of the
    /// login. Near the role's max TTL Vault grants less and less; a new login is better then
    /// than a renewal every few seconds.
    fn keeps(&self, auth: &AuthInfo) -> bool {
        auth.lease_duration > 0 && Duration::from_secs(auth.lease_duration) >= self.lease / 2
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<CachedToken>>>;

/// Vault login tokens shared by every publish, with one login in flight per key.
pub struct TokenCache {
    slots: Mutex<Slots>,
}

struct Slots {
    by_key: HashMap<TokenKey, Slot>,
    next_sweep: Instant,
}

impl Default for TokenCache {
    fn default() -> Self {
        Self {
            slots: Mutex::new(Slots {
                by_key: HashMap::new(),
                next_sweep: Instant::now() + SWEEP_EVERY,
            }),
        }
    }
}

/// How a cached token was obtained, for the caller's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Obtained {
    Cached,
    Renewed,
    LoggedIn,
}

impl TokenCache {
    fn slot(&self, key: &TokenKey) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if now >= slots.next_sweep {
            // Tokens Vault no longer accepts are of no use: drop them (a slot being logged into
            // is locked and kept).
            slots.by_key.retain(|_, slot| {
                slot.try_lock()
                    .map(|t| t.as_ref().is_some_and(|t| !t.expired(now)))
                    .unwrap_or(true)
            });
            slots.next_sweep = now + SWEEP_EVERY;
        }
        if slots.by_key.len() >= MAX_TOKENS && !slots.by_key.contains_key(key) {
            // A slot being logged into is locked: keep it; drop stale and empty ones.
            slots.by_key.retain(|_, slot| {
                slot.try_lock()
                    .map(|t| t.as_ref().is_some_and(|t| t.fresh(now)))
                    .unwrap_or(true)
            });
            if slots.by_key.len() >= MAX_TOKENS {
                slots.by_key.retain(|_, slot| slot.try_lock().is_err());
            }
        }
        Arc::clone(slots.by_key.entry(key.clone()).or_default())
    }

    /// How many logins are cached (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_key
            .len()
    }

    /// The cached token for `key`; when it is due, the same token renewed with `renew` (if
    /// Vault allows), else a fresh one from `login`. Runs once for concurrent callers. Nothing
    /// is revoked: other publishes may still be using a token.
    async fn get<R, RFut, L, LFut>(
        &self,
        key: &TokenKey,
        renew: R,
        login: L,
    ) -> Result<(SecretString, Obtained), ProviderError>
    where
        R: FnOnce(SecretString) -> RFut,
        RFut: std::future::Future<Output = Result<AuthInfo, ProviderError>>,
        L: FnOnce() -> LFut,
        LFut: std::future::Future<Output = Result<AuthInfo, ProviderError>>,
    {
        let slot = self.slot(key);
        let mut guard = slot.lock().await;
        if let Some(cached) = guard.as_ref() {
            let now = Instant::now();
            if cached.fresh(now) {
                return Ok((cached.token.clone(), Obtained::Cached));
            }
            if cached.renewable && !cached.expired(now) {
                match renew(cached.token.clone()).await {
                    Ok(mut auth) if cached.keeps(&auth) => {
                        if auth.client_token.is_empty() {
                            auth.client_token = cached.token.expose().to_string();
                        }
                        let renewed = CachedToken::from_auth(auth, Instant::now());
                        let token = renewed.token.clone();
                        *guard = Some(renewed);
                        return Ok((token, Obtained::Renewed));
                    }
                    Ok(_) => tracing::debug!("Vault token near its max TTL; logging in again"),
                    // Only the kind: the server's own words come from a server the token was
                    // just sent to, which may be a tenant's.
                    Err(error) => tracing::debug!(
                        error_kind = error.kind(),
                        "renewing the Vault token failed; logging in again"
                    ),
                }
            }
        }
        let auth = login().await?;
        let cached = CachedToken::from_auth(auth, Instant::now());
        let token = cached.token.clone();
        *guard = Some(cached);
        Ok((token, Obtained::LoggedIn))
    }
}

/// KV engine version of the store's mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kv {
    V1,
    V2,
}

/// A Vault client logged in for one store and one pod.
pub struct Vault {
    client: Transport,
    mount: String,
    kv: Kv,
}

impl Vault {
    /// Builds a client for the store and authenticates it (reusing a cached login if any).
    pub async fn new(spec: &VaultProvider, ctx: &BuildContext<'_>) -> Result<Self, ProviderError> {
        let kv = match spec.version.as_deref() {
            None | Some("v2") => Kv::V2,
            Some("v1") => Kv::V1,
            Some(other) => {
                return Err(ProviderError::Config(format!(
                    "vault.version {other:?} is neither v1 nor v2"
                )));
            }
        };
        let mount = spec
            .path
            .as_deref()
            .unwrap_or("secret")
            .trim_matches('/')
            .to_string();
        if mount.is_empty() {
            return Err(ProviderError::Config("vault.path is empty".into()));
        }
        let mut client = new_client(spec)?;
        let token = authenticate(spec, ctx, &client).await?;
        client.set_token(token.expose());
        Ok(Self { client, mount, kv })
    }

    async fn read(&self, path: &str, version: Option<u64>) -> Result<SecretBytes, ProviderError> {
        let (mount, c) = (self.mount.as_str(), &self.client);
        // `_held`: the answer's share of the node's parse budget, kept until its tree is
        // encoded again and dropped.
        let (data, _held) = match self.kv {
            Kv::V2 => {
                let request = ReadSecretRequest::builder()
                    .mount(mount)
                    .path(path)
                    .version(version)
                    .build()
                    .map_err(|_| bad_request())?;
                c.data(request).await.map(|r| (r.value.data, r.held))
            }
            Kv::V1 => {
                let request = GetSecretRequest::builder()
                    .mount(mount)
                    .path(path)
                    .build()
                    .map_err(|_| bad_request())?;
                c.raw(request).await.map(|r| (r.value.data, r.held))
            }
        }
        .map_err(server_error)?;
        let data: BTreeMap<String, serde_json::Value> = serde_json::from_value(data)
            .map_err(|_| ProviderError::Unavailable("Vault's answer is not a KV secret".into()))?;
        // Sized once (the answer's text is at least as long): a doubling buffer would take up
        // to twice the value while it grows.
        let mut out = Vec::with_capacity(_held.as_ref().map_or(0, transport::Held::answer_len));
        serde_json::to_writer(&mut out, &data)
            .map_err(|_| ProviderError::Unavailable("cannot encode the secret's data".into()))?;
        out.shrink_to_fit();
        Ok(SecretBytes::new(out))
    }

    async fn list(&self, dir: &str) -> Result<Vec<String>, ProviderError> {
        let (mount, c) = (self.mount.as_str(), &self.client);
        let listed = match self.kv {
            Kv::V2 => {
                let request = ListSecretsRequest::builder()
                    .mount(mount)
                    .path(dir)
                    .build()
                    .map_err(|_| bad_request())?;
                c.data(request).await.map(|r| r.value.keys)
            }
            Kv::V1 => {
                let request = ListSecretRequest::builder()
                    .mount(mount)
                    .path(dir)
                    .build()
                    .map_err(|_| bad_request())?;
                c.raw(request).await.map(|r| r.value.data.keys)
            }
        };
        match listed {
            Ok(keys) => Ok(keys),
            // An empty folder (or mount) lists as 404.
            Err(ClientError::APIError { code: 404, .. }) => Ok(Vec::new()),
            Err(e) => Err(server_error(e)),
        }
    }
}

#[async_trait]
impl Provider for Vault {
    async fn get(&self, key: &RemoteKey) -> Result<SecretBytes, ProviderError> {
        let version = match &key.version {
            None => None,
            Some(_) if self.kv == Kv::V1 => {
                return Err(ProviderError::Config(
                    "KV v1 secrets have no versions; remove remoteRef.version".into(),
                ));
            }
            Some(v) => Some(v.parse::<u64>().map_err(|_| {
                ProviderError::Config(format!("Vault KV version {v:?} is not a number"))
            })?),
        };
        self.read(key.key.trim_start_matches('/'), version).await
    }

    async fn find(&self, query: &FindQuery) -> Result<Vec<(String, SecretBytes)>, ProviderError> {
        // Walk the folders below the path prefix (its folder part), breadth first.
        let start = query
            .path
            .as_deref()
            .map(|p| p.trim_start_matches('/'))
            .map(|p| p.rfind('/').map_or("", |i| &p[..=i]))
            .unwrap_or("")
            .to_string();
        let mut folders = vec![start];
        let mut names = Vec::new();
        let mut visited = 0usize;
        while let Some(folder) = folders.pop() {
            visited += 1;
            if visited > 10 * super::MAX_FIND_RESULTS {
                return Err(ProviderError::Config(
                    "dataFrom.find walked too many Vault folders; set find.path".into(),
                ));
            }
            for entry in self.list(&folder).await? {
                let full = format!("{folder}{entry}");
                if full.ends_with('/') {
                    folders.push(full);
                } else if query.matches(&full) {
                    names.push(full);
                    if names.len() > super::MAX_FIND_RESULTS {
                        // `found` reports it.
                        break;
                    }
                }
            }
        }
        if names.len() > super::MAX_FIND_RESULTS {
            return found(
                names
                    .into_iter()
                    .map(|n| (n, SecretBytes::new(Vec::new())))
                    .collect(),
            );
        }
        let mut results = Vec::with_capacity(names.len());
        for name in names {
            match self.read(&name, None).await {
                Ok(value) => results.push((name, value)),
                // Deleted in the meantime (or a KV v2 secret whose current version is deleted).
                Err(ProviderError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        found(results)
    }
}

/// A transport for the store's server, namespace and CA; no token yet. Nothing is taken from
/// the agent's environment (`VAULT_*`, proxies).
fn new_client(spec: &VaultProvider) -> Result<Transport, ProviderError> {
    let server = reqwest::Url::parse(&spec.server)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
        .ok_or_else(|| {
            ProviderError::Config(format!(
                "vault.server {:?} is not an http(s) URL",
                crate::telemetry::escape::printable(&spec.server, 100)
            ))
        })?;
    let mut http = reqwest::ClientBuilder::new()
        .tls_backend_rustls()
        .timeout(REQUEST_TIMEOUT)
        .no_proxy();
    if server.scheme() == "http" {
        // reqwest with rustls needs roots even when it never uses them.
        http = http.tls_certs_only(Vec::new());
    } else if let Some(b64) = spec.ca_bundle.as_deref().filter(|b| !b.trim().is_empty()) {
        let pem = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|_| ProviderError::Config("vault.caBundle is not base64".into()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .ok()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| {
                ProviderError::Config("vault.caBundle holds no valid PEM certificate".into())
            })?;
        http = http.tls_certs_merge(certs);
    }
    let http = http
        .build()
        .map_err(|_| ProviderError::Config("cannot build a Vault client".into()))?;
    let middle = EndpointMiddleware {
        token: String::new(),
        version: "v1".into(),
        wrap: None,
        namespace: spec.namespace.clone().filter(|n| !n.is_empty()),
    };
    Ok(Transport::new(
        http,
        server.as_str().trim_end_matches('/'),
        middle,
    ))
}

/// A request vaultrs could not build (a required field missing: a bug here).
fn bad_request() -> ProviderError {
    ProviderError::Config("cannot build the Vault request".into())
}

/// The token the store's auth method yields: the Secret's token as is, or a (cached) login.
async fn authenticate(
    spec: &VaultProvider,
    ctx: &BuildContext<'_>,
    client: &Transport,
) -> Result<SecretString, ProviderError> {
    let auth = &spec.auth;
    if let Some(selector) = &auth.token_secret_ref {
        return credentials::read(ctx, selector).await;
    }
    let key = |method: &str, mount: &str, role: &str, identity: String| TokenKey {
        server: spec.server.clone(),
        namespace: spec.namespace.clone().unwrap_or_default(),
        mount: format!("{method}:{mount}"),
        role: role.to_string(),
        identity,
    };
    let cache = &ctx.env.vault_tokens;
    let pod_identity = format!("{}/{}", ctx.pod.namespace, ctx.pod.service_account);
    let count_login = || {
        ctx.env
            .metrics
            .logins
            .get_or_create(&ProviderLabel { provider: "vault" })
            .inc();
    };
    let renew = |token: SecretString| async move {
        let mut renewing = client.clone();
        renewing.set_token(token.expose());
        let renewed = renewing
            .login(transport::RenewSelf)
            .await
            .map_err(server_error);
        ctx.env
            .metrics
            .backend_requests
            .get_or_create(&BackendLabels {
                provider: "vault",
                operation: "renew",
                result: renewed
                    .as_ref()
                    .err()
                    .map_or("success", ProviderError::kind),
            })
            .inc();
        renewed
    };
    if let Some(role_auth) = auth.kubernetes.as_ref().or(auth.jwt.as_ref()) {
        let kubernetes = auth.kubernetes.is_some();
        let (method, default_mount) = if kubernetes {
            ("kubernetes", "kubernetes")
        } else {
            ("jwt", "jwt")
        };
        let mount = role_auth
            .mount_path
            .as_deref()
            .unwrap_or(default_mount)
            .trim_matches('/');
        let audience = role_auth.audience.as_deref().unwrap_or("");
        let role = role_auth.role.as_str();
        let key = key(method, mount, role, pod_identity);
        return cache
            .get(&key, renew, || async {
                let token = ctx.pod.tokens.for_audience(audience).ok_or_else(|| {
                    ProviderError::Config(format!(
                        "kubelet passed no service-account token for audience {audience:?}: add \
                         it to the CSIDriver's tokenRequests"
                    ))
                })?;
                count_login();
                let jwt = token.token.expose();
                let result = if kubernetes {
                    let request = LoginWithKubernetesRequest::builder()
                        .mount(mount)
                        .role(role)
                        .jwt(jwt)
                        .build()
                        .map_err(|_| bad_request())?;
                    client.login(request).await
                } else {
                    let request = JWTLoginRequest::builder()
                        .mount(mount)
                        .role(role.to_string())
                        .jwt(jwt)
                        .build()
                        .map_err(|_| bad_request())?;
                    client.login(request).await
                };
                result.map_err(|e| login_error(e, method, mount, Some(role)))
            })
            .await
            .map(|(token, _)| token);
    }
    if let Some(app_role) = &auth.app_role {
        let mount = app_role
            .path
            .as_deref()
            .unwrap_or("approle")
            .trim_matches('/');
        // Checked BEFORE the cache lookup: a cached login must never let a store use a
        // credential it may not read (fail closed).
        let location = credentials::locate(ctx, &app_role.secret_ref)?;
        let identity = match ctx.store_kind {
            // Only admitted namespaces reach a ClusterSecretStore; its credential is the agent's.
            StoreKind::ClusterSecretStore => format!("cluster:{location}"),
            // A SecretStore's credential is read as the pod: a service account that may not read
            // it must not reuse a token another service account of the namespace obtained.
            StoreKind::SecretStore => format!("{pod_identity}:{location}"),
        };
        let key = key("approle", mount, &app_role.role_id, identity);
        return cache
            .get(&key, renew, || async {
                let secret_id = credentials::read(ctx, &app_role.secret_ref).await?;
                count_login();
                let request = LoginWithApproleRequest::builder()
                    .mount(mount)
                    .role_id(app_role.role_id.as_str())
                    .secret_id(secret_id.expose())
                    .build()
                    .map_err(|_| bad_request())?;
                client
                    .login(request)
                    .await
                    .map_err(|e| login_error(e, "approle", mount, None))
            })
            .await
            .map(|(token, _)| token);
    }
    Err(ProviderError::Config(
        "vault.auth needs one of tokenSecretRef, kubernetes, jwt, appRole".into(),
    ))
}

/// A failed login: refused credentials are PermissionDenied, the rest as for reads.
fn login_error(e: ClientError, method: &str, mount: &str, role: Option<&str>) -> ProviderError {
    match e {
        ClientError::APIError { code, errors } if (400..500).contains(&code) && code != 429 => {
            let role = role.map(|r| format!(" for role {r:?}")).unwrap_or_default();
            ProviderError::PermissionDenied(format!(
                "Vault refused the {method} login at auth/{mount}{role}{}",
                reason(&errors)
            ))
        }
        other => match server_error(other) {
            ProviderError::NotFound => ProviderError::Config(format!(
                "no {method} auth method is mounted at auth/{mount}"
            )),
            e => e,
        },
    }
}

/// Vault's answer as a provider error. Vault's own messages carry neither tokens nor values.
fn server_error(e: ClientError) -> ProviderError {
    match e {
        ClientError::APIError { code, errors } => {
            let why = reason(&errors);
            match code {
                404 => ProviderError::NotFound,
                401 | 403 => ProviderError::PermissionDenied(format!("Vault denied access{why}")),
                429 => ProviderError::Throttled(format!("Vault answered 429{why}")),
                503 if errors.iter().any(|e| e.contains("sealed")) => {
                    ProviderError::Unavailable("Vault is sealed".into())
                }
                503 if errors.iter().any(|e| e.contains("standby")) => {
                    ProviderError::Unavailable("Vault is in standby".into())
                }
                500.. => ProviderError::Unavailable(format!("Vault answered {code}{why}")),
                _ => ProviderError::Config(format!("Vault rejected the request ({code}){why}")),
            }
        }
        e @ ClientError::RestClientError { .. } if transport::is_too_large(&e) => {
            ProviderError::Unavailable(transport::BodyTooLarge.to_string())
        }
        e @ ClientError::RestClientError { .. } if transport::refusal(&e).is_some() => {
            let why = transport::refusal(&e).map(ToString::to_string);
            ProviderError::TooLarge(format!("Vault's answer {}", why.unwrap_or_default()))
        }
        ClientError::RestClientError { .. } => {
            ProviderError::Unavailable("Vault could not be reached".into())
        }
        ClientError::ResponseEmptyError | ClientError::ResponseDataEmptyError => {
            ProviderError::NotFound
        }
        ClientError::JsonParseError { .. } => {
            ProviderError::Unavailable("Vault's answer is not a KV secret".into())
        }
        _ => ProviderError::Unavailable("the Vault request failed".into()),
    }
}

/// Vault's error strings, bounded and escaped (the server may be a tenant's), for a message.
fn reason(errors: &[String]) -> String {
    let text = errors
        .iter()
        .map(|e| e.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|e| !e.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    if text.is_empty() {
        String::new()
    } else {
        format!(": {}", crate::telemetry::escape::printable(&text, 200))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(token: &str, lease: u64) -> AuthInfo {
        AuthInfo {
            client_token: token.into(),
            accessor: String::new(),
            policies: vec![],
            token_policies: vec![],
            metadata: None,
            lease_duration: lease,
            renewable: true,
            entity_id: String::new(),
            token_type: "service".into(),
            orphan: true,
        }
    }

    /// A renewal that must not happen.
    async fn no_renewal(_: SecretString) -> Result<AuthInfo, ProviderError> {
        panic!("renewed a fresh token")
    }

    fn key(identity: &str) -> TokenKey {
        TokenKey {
            server: "http://vault".into(),
            namespace: String::new(),
            mount: "jwt:jwt".into(),
            role: "app".into(),
            identity: identity.into(),
        }
    }

    #[tokio::test]
    async fn one_login_per_key_and_lifetime() {
        let cache = TokenCache::default();
        let logins = std::sync::atomic::AtomicUsize::new(0);
        for _ in 0..3 {
            let (t, _) = cache
                .get(&key("shop/web"), no_renewal, || async {
                    logins.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok(auth("t1", 3600))
                })
                .await
                .unwrap();
            assert_eq!(t.expose(), "t1");
        }
        assert_eq!(logins.load(std::sync::atomic::Ordering::SeqCst), 1);
        let (other, _) = cache
            .get(&key("shop/other"), no_renewal, || async {
                Ok(auth("t2", 3600))
            })
            .await
            .unwrap();
        assert_eq!(other.expose(), "t2", "two identities never share a token");
    }

    #[test]
    fn tokens_are_refreshed_before_expiry() {
        let now = Instant::now();
        let t = CachedToken::from_auth(auth("t", 30), now);
        assert!(t.fresh(now + Duration::from_secs(19)));
        assert!(!t.fresh(now + Duration::from_secs(21)));
        let forever = CachedToken::from_auth(auth("t", 0), now);
        assert!(forever.fresh(now + MAX_TOKEN_REUSE - Duration::from_secs(1)));
        assert!(
            !forever.fresh(now + MAX_TOKEN_REUSE),
            "a token without a TTL is not reused forever"
        );
    }

    /// Makes the cached token of `key` due, as if two thirds of its lease had passed.
    async fn make_due(cache: &TokenCache, key: &TokenKey) {
        let slot = cache.slot(key);
        let mut held = slot.lock().await;
        let token = held.as_mut().unwrap();
        token.refresh_at = Instant::now();
    }

    #[tokio::test]
    async fn a_due_token_is_renewed_not_replaced() {
        let cache = TokenCache::default();
        let k = key("shop/web");
        let login = || async { Ok(auth("t1", 3600)) };
        cache.get(&k, no_renewal, login).await.unwrap();
        make_due(&cache, &k).await;
        let (t, how) = cache
            .get(
                &k,
                |token: SecretString| async move {
                    assert_eq!(token.expose(), "t1", "renews the token it holds");
                    Ok(auth("t1", 3600))
                },
                || async { panic!("logged in although the token could be renewed") },
            )
            .await
            .unwrap();
        assert_eq!((t.expose(), how), ("t1", Obtained::Renewed));
        let (_, how) = cache.get(&k, no_renewal, login).await.unwrap();
        assert_eq!(how, Obtained::Cached, "a renewed token is fresh again");
    }

    #[tokio::test]
    async fn a_failed_or_short_renewal_logs_in_again() {
        let cache = TokenCache::default();
        let k = key("shop/web");
        cache
            .get(&k, no_renewal, || async { Ok(auth("t1", 3600)) })
            .await
            .unwrap();
        make_due(&cache, &k).await;
        let (t, how) = cache
            .get(
                &k,
                |_| async { Err(ProviderError::PermissionDenied("revoked".into())) },
                || async { Ok(auth("t2", 3600)) },
            )
            .await
            .unwrap();
        assert_eq!((t.expose(), how), ("t2", Obtained::LoggedIn));
        make_due(&cache, &k).await;
        // Near the max TTL Vault grants a sliver: not worth keeping.
        let (t, how) = cache
            .get(
                &k,
                |_| async { Ok(auth("t2", 60)) },
                || async { Ok(auth("t3", 3600)) },
            )
            .await
            .unwrap();
        assert_eq!((t.expose(), how), ("t3", Obtained::LoggedIn));
    }

    #[test]
    fn tokens_without_a_lease_are_not_renewed() {
        let now = Instant::now();
        assert!(!CachedToken::from_auth(auth("t", 0), now).renewable);
        let mut fixed = auth("t", 60);
        fixed.renewable = false;
        assert!(!CachedToken::from_auth(fixed, now).renewable);
        let t = CachedToken::from_auth(auth("t", 30), now);
        assert!(!t.expired(now + Duration::from_secs(29)));
        assert!(t.expired(now + Duration::from_secs(30)));
    }

    #[tokio::test]
    async fn the_cache_is_bounded() {
        let cache = TokenCache::default();
        for i in 0..MAX_TOKENS + 10 {
            cache
                .get(&key(&format!("ns/sa-{i}")), no_renewal, || async {
                    Ok(auth("t", 3600))
                })
                .await
                .unwrap();
        }
        assert!(cache.len() <= MAX_TOKENS, "{}", cache.len());
    }

    #[tokio::test]
    async fn a_failed_login_is_not_cached() {
        let cache = TokenCache::default();
        let err = cache
            .get(&key("shop/web"), no_renewal, || async {
                Err(ProviderError::PermissionDenied("no".into()))
            })
            .await
            .unwrap_err();
        assert!(matches!(err, ProviderError::PermissionDenied(_)));
        let (t, _) = cache
            .get(&key("shop/web"), no_renewal, || async { Ok(auth("t", 60)) })
            .await
            .unwrap();
        assert_eq!(t.expose(), "t");
    }

    #[test]
    fn errors_map_to_provider_errors() {
        let api = |code, msg: &str| ClientError::APIError {
            code,
            errors: vec![msg.into()],
        };
        assert!(matches!(
            server_error(api(404, "")),
            ProviderError::NotFound
        ));
        assert!(matches!(
            server_error(api(403, "permission denied")),
            ProviderError::PermissionDenied(_)
        ));
        match server_error(api(503, "Vault is sealed")) {
            ProviderError::Unavailable(m) => assert!(m.contains("sealed")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            server_error(api(500, "boom")),
            ProviderError::Unavailable(_)
        ));
    }
}
