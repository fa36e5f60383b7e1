//! Who the `aws` provider signs as: the store's `auth` turned into credentials (the pod's token
//! exchanged through AssumeRoleWithWebIdentity, static keys from a Kubernetes Secret, or the
//! agent's own default chain, each then assuming `role` when set), and the [`SessionCache`] that
//! keeps temporary credentials and SDK clients across publishes, so pods of one identity log in
//! once per session lifetime instead of once per mount.
//!
//! Not for reading secrets (the provider in `mod.rs` and `batch` do that). Credentials are only
//! ever compared or fingerprinted with a per-process hasher, never printed.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::config::{BehaviorVersion, Region};

use super::super::{BuildContext, ProviderError};
use super::errors::{BodyLimit, map_err};
use super::{retry, timeouts};
use crate::api::store::{AwsProvider, AwsSecretRef};
use crate::telemetry::metrics::ProviderLabel;

/// Default audience of the pod token used for web identity.
pub const DEFAULT_AUDIENCE: &str = "sts.amazonaws.com";
/// Temporary credentials are renewed this long before they expire.
const RENEW_BEFORE: Duration = Duration::from_secs(5 * 60);
/// Most cached SDK clients; the cache is emptied when full (clients are cheap to rebuild).
const MAX_CLIENTS: usize = 256;
/// Most cached sessions; expired ones are dropped first.
const MAX_SESSIONS: usize = 4096;
/// How often sessions past their renewal time (whose pods are gone) are dropped.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

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
    /// Parameter Store clients, keyed the same way.
    ssm_clients: Mutex<HashMap<ClientKey, (Credentials, aws_sdk_ssm::Client)>>,
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
        let key = self.client_key(region, endpoint, &creds);
        reuse(&self.clients, key, creds, |creds| {
            let conf = aws_sdk_secretsmanager::Config::builder()
                .interceptor(BodyLimit::JSON)
                .behavior_version(BehaviorVersion::latest())
                .region(Region::new(region.to_string()))
                .credentials_provider(creds)
                .retry_config(retry())
                .timeout_config(timeouts());
            let conf = match endpoint {
                Some(e) => conf.endpoint_url(e),
                None => conf,
            };
            Client::from_conf(conf.build())
        })
    }

    /// A Parameter Store client for these credentials, reused while they stay the same.
    fn ssm_client(
        &self,
        region: &str,
        endpoint: Option<&str>,
        creds: Credentials,
    ) -> aws_sdk_ssm::Client {
        let key = self.client_key(region, endpoint, &creds);
        reuse(&self.ssm_clients, key, creds, |creds| {
            let conf = aws_sdk_ssm::Config::builder()
                .interceptor(BodyLimit::JSON)
                .behavior_version(aws_sdk_ssm::config::BehaviorVersion::latest())
                .region(aws_sdk_ssm::config::Region::new(region.to_string()))
                .credentials_provider(creds)
                .retry_config(retry())
                .timeout_config(timeouts());
            let conf = match endpoint {
                Some(e) => conf.endpoint_url(e),
                None => conf,
            };
            aws_sdk_ssm::Client::from_conf(conf.build())
        })
    }

    fn client_key(&self, region: &str, endpoint: Option<&str>, creds: &Credentials) -> ClientKey {
        (
            region.to_string(),
            endpoint.map(String::from),
            self.fingerprint(creds),
        )
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

/// The cached client for `key` when it was made with these very credentials, else a new one
/// (the map is emptied when full: clients are cheap to rebuild).
fn reuse<C: Clone>(
    clients: &Mutex<HashMap<ClientKey, (Credentials, C)>>,
    key: ClientKey,
    creds: Credentials,
    make: impl FnOnce(Credentials) -> C,
) -> C {
    let mut clients = clients.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((c, client)) = clients.get(&key)
        && *c == creds
    {
        return client.clone();
    }
    if clients.len() >= MAX_CLIENTS {
        clients.clear();
    }
    let client = make(creds.clone());
    clients.insert(key, (creds, client.clone()));
    client
}

fn fresh(c: Option<&Credentials>) -> bool {
    c.is_some_and(|c| {
        c.expiry()
            .is_none_or(|e| e > SystemTime::now() + RENEW_BEFORE)
    })
}

/// What a store's requests are signed with.
pub(super) enum Signer {
    /// Static keys, or temporary ones from STS (cached sessions).
    Keys(Credentials),
    /// The agent's own default chain, no role (a ClusterSecretStore's `agentIdentity`).
    Agent(Box<aws_config::SdkConfig>),
}

/// A Secrets Manager client signed as the store's `auth` says, reusing cached sessions.
pub(super) async fn client(
    spec: &AwsProvider,
    ctx: &BuildContext<'_>,
) -> Result<Client, ProviderError> {
    let (region, endpoint) = (spec.region.as_str(), spec.endpoint.as_deref());
    Ok(match signer(spec, ctx).await? {
        Signer::Keys(creds) => ctx.env.aws_sessions.client(region, endpoint, creds),
        Signer::Agent(sdk) => {
            let conf =
                aws_sdk_secretsmanager::config::Builder::from(&*sdk).interceptor(BodyLimit::JSON);
            let conf = match endpoint {
                Some(e) => conf.endpoint_url(e),
                None => conf,
            };
            Client::from_conf(conf.build())
        }
    })
}

/// A Parameter Store client signed as the store's `auth` says, reusing cached sessions.
pub(super) async fn ssm_client(
    spec: &AwsProvider,
    ctx: &BuildContext<'_>,
) -> Result<aws_sdk_ssm::Client, ProviderError> {
    let (region, endpoint) = (spec.region.as_str(), spec.endpoint.as_deref());
    Ok(match signer(spec, ctx).await? {
        Signer::Keys(creds) => ctx.env.aws_sessions.ssm_client(region, endpoint, creds),
        Signer::Agent(sdk) => {
            let conf = aws_sdk_ssm::config::Builder::from(&*sdk).interceptor(BodyLimit::JSON);
            let conf = match endpoint {
                Some(e) => conf.endpoint_url(e),
                None => conf,
            };
            aws_sdk_ssm::Client::from_conf(conf.build())
        }
    })
}

/// The credentials the store's `auth` (and `role`) give, through the session cache.
pub(super) async fn signer(
    spec: &AwsProvider,
    ctx: &BuildContext<'_>,
) -> Result<Signer, ProviderError> {
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
    let signer = match (&auth.jwt, &auth.secret_ref, &auth.agent_identity) {
        (Some(jwt), None, None) => {
            let role = spec.role.as_deref().ok_or_else(|| {
                ProviderError::Config(
                    "auth.jwt needs provider.aws.role: the role assumed with the pod's token"
                        .into(),
                )
            })?;
            let audience = jwt.audience.as_deref().unwrap_or(DEFAULT_AUDIENCE);
            Signer::Keys(web_identity(ctx, region, endpoint, role, audience).await?)
        }
        (None, Some(r), None) => {
            let base = static_keys(ctx, r).await?;
            match spec.role.as_deref() {
                None => Signer::Keys(base),
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
                    Signer::Keys(creds)
                }
            }
        }
        (None, None, Some(_)) => {
            // Validation refuses this at bind time already; never sign with the node's
            // identity for a tenant's store, whatever the caller checked.
            if ctx.store_kind() != crate::api::StoreKind::ClusterSecretStore {
                return Err(ProviderError::PermissionDenied(
                    "auth.agentIdentity is only allowed on a ClusterSecretStore".into(),
                ));
            }
            let sdk = cache.agent_config(region).await;
            match spec.role.as_deref() {
                None => Signer::Agent(Box::new(sdk)),
                Some(role) => {
                    let key = format!("agent\n{region}\n{end}\n{role}\n{who}");
                    let creds = cache
                        .session(key, || {
                            let conf = aws_sdk_sts::config::Builder::from(&sdk)
                                .interceptor(BodyLimit::XML);
                            let conf = match endpoint {
                                Some(e) => conf.endpoint_url(e),
                                None => conf,
                            };
                            let sts = aws_sdk_sts::Client::from_conf(conf.build());
                            assume_role(ctx, sts, role, &session_name)
                        })
                        .await?;
                    Signer::Keys(creds)
                }
            }
        }
        _ => {
            return Err(ProviderError::Config(
                "provider.aws.auth must set exactly one of jwt, secretRef, agentIdentity".into(),
            ));
        }
    };
    Ok(signer)
}

/// Temporary credentials of `role`, assumed with the pod's token for `audience`
/// (`sts:AssumeRoleWithWebIdentity`), cached per (region, endpoint, role, pod identity,
/// audience) until shortly before they expire. Also what Vault's `iam` login signs with.
pub async fn web_identity(
    ctx: &BuildContext<'_>,
    region: &str,
    endpoint: Option<&str>,
    role: &str,
    audience: &str,
) -> Result<Credentials, ProviderError> {
    let who = format!("{}/{}", ctx.pod.namespace, ctx.pod.service_account);
    let end = endpoint.unwrap_or("");
    let key = format!("web\n{region}\n{end}\n{role}\n{who}\n{audience}");
    ctx.env
        .aws_sessions
        .session(key, || async {
            // Looked up only when a login is due, so cached sessions serve pods whose kubelet
            // sent the token earlier.
            let token = ctx.pod.tokens.for_audience(audience).ok_or_else(|| {
                ProviderError::Config(format!(
                    "kubelet passed no service-account token for audience {audience:?}: add it \
                     to the CSIDriver's tokenRequests"
                ))
            })?;
            login(ctx);
            let sts = sts_client(region, endpoint, None);
            let out = sts
                .assume_role_with_web_identity()
                .role_arn(role)
                .role_session_name(session_name(&ctx.pod.namespace, &ctx.pod.service_account))
                .web_identity_token(token.token.expose())
                .send()
                .await
                .map_err(|e| map_err("AssumeRoleWithWebIdentity", e))?;
            temporary(out.credentials(), "web-identity")
        })
        .await
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
    let id = super::super::credentials::read(ctx, &r.access_key_id_secret_ref).await?;
    let secret = super::super::credentials::read(ctx, &r.secret_access_key_secret_ref).await?;
    let token = match &r.session_token_secret_ref {
        Some(s) => Some(super::super::credentials::read(ctx, s).await?),
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
        .interceptor(BodyLimit::XML)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_names_fit_sts_rules() {
        assert_eq!(session_name("shop", "web"), "latchkey.shop.web");
        let long = session_name(&"n".repeat(63), &"s".repeat(63));
        assert_eq!(long.len(), 64);
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
