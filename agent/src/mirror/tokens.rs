//! Service-account tokens for the mirror controller, which has no pod: minted through the
//! TokenRequest API as an ExternalSecret's `spec.serviceAccountName`, for exactly the audiences
//! its store needs, valid for 10 minutes (the API server's minimum) and reused until 80% of
//! their life has passed. Tokens never reach logs, errors or `Debug` output.
//!
//! Only a ServiceAccount that opted in, annotated [`ALLOW_CONTROLLER_ANNOTATION`]`: "true"` by
//! whoever manages it, is minted for: without it, anyone who may create an ExternalSecret
//! would get tokens of every service account of the namespace, pod or not. The annotation is
//! read before every mint, so removing it stops new tokens at once; tokens already minted are
//! reused until they are renewed (at most [`TOKEN_LIFETIME`] times 0.8).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::{Api, Client};

use crate::identity::{PodTokens, ServiceAccountToken};
use crate::secret::SecretString;

/// Annotation by which a ServiceAccount lets the mirror controller mint its tokens.
pub const ALLOW_CONTROLLER_ANNOTATION: &str = "latchkey.dev/allow-controller";
/// Lifetime asked for: the shortest the API server grants.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(600);
/// Share of a token's life after which a new one is minted.
const REUSE_FRACTION: f64 = 0.8;
/// Most tokens remembered; past it expired ones are swept, then the oldest dropped.
const MAX_TOKENS: usize = 4096;

/// Why a token could not be minted. Never contains a token.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The API server refused or failed the TokenRequest.
    #[error(
        "cannot mint a token for service account {namespace}/{service_account} (audience \
         {audience:?}): {reason}"
    )]
    Refused {
        /// Namespace of the service account.
        namespace: String,
        /// The service account.
        service_account: String,
        /// Audience asked for (`""`: the API server's).
        audience: String,
        /// What the API server said (its Status message, which holds no token).
        reason: String,
    },
    /// The service account has not opted in to the controller acting as it.
    #[error(
        "service account {namespace}/{service_account} does not allow the mirror controller to \
         act as it: whoever manages it may annotate it with `kubectl annotate serviceaccount -n \
         {namespace} {service_account} {annotation}=true`, or set spec.serviceAccountName to one \
         that does"
    )]
    NotAllowed {
        /// Namespace of the service account.
        namespace: String,
        /// The service account.
        service_account: String,
        /// The annotation it lacks.
        annotation: &'static str,
    },
    /// The service account does not exist.
    #[error(
        "service account {namespace}/{service_account} does not exist: create it (annotated \
         {annotation}=true) or set spec.serviceAccountName"
    )]
    Missing {
        /// Namespace of the service account.
        namespace: String,
        /// The service account.
        service_account: String,
        /// The annotation it will need.
        annotation: &'static str,
    },
}

type Key = (String, String, String);

struct Minted {
    token: ServiceAccountToken,
    renew_at: Instant,
}

/// Mints and caches tokens per (namespace, service account, audience).
pub struct TokenMinter {
    client: Client,
    cache: Mutex<HashMap<Key, Minted>>,
    /// One mint at a time per key: ExternalSecrets of one service account reconciled together
    /// share one TokenRequest.
    minting: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<()>>>>,
}

impl TokenMinter {
    /// A minter calling the API server through `client` (which needs `get` on
    /// `serviceaccounts` and `create` on `serviceaccounts/token` in the namespaces it serves).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            cache: Mutex::new(HashMap::new()),
            minting: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `namespace/service_account` opted in, read now, minting nothing: for what is
    /// done as the account without a token (a password generated for a PushSecret).
    pub async fn opted_in(&self, namespace: &str, service_account: &str) -> Result<(), TokenError> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        self.allowed(&api, namespace, service_account, "").await
    }

    /// The tokens of `namespace/service_account` for `audiences`, minted when not cached.
    pub async fn tokens(
        &self,
        namespace: &str,
        service_account: &str,
        audiences: &[String],
    ) -> Result<PodTokens, TokenError> {
        let mut out = Vec::with_capacity(audiences.len());
        for audience in audiences {
            let token = self.token(namespace, service_account, audience).await?;
            out.push((audience.clone(), token));
        }
        Ok(PodTokens::from_tokens(out))
    }

    async fn token(
        &self,
        namespace: &str,
        service_account: &str,
        audience: &str,
    ) -> Result<ServiceAccountToken, TokenError> {
        let key = (
            namespace.to_string(),
            service_account.to_string(),
            audience.to_string(),
        );
        if let Some(token) = self.cached(&key) {
            return Ok(token);
        }
        let gate = {
            let mut minting = self.minting.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(minting.entry(key.clone()).or_default())
        };
        let minted = {
            let _turn = gate.lock().await;
            // Whoever held the gate before may have minted it meanwhile.
            match self.cached(&key) {
                Some(token) => Ok(token),
                None => self.mint(&key).await,
            }
        };
        let mut minting = self.minting.lock().unwrap_or_else(|p| p.into_inner());
        // The map holds only keys being minted: the last one out removes its gate.
        if Arc::strong_count(&gate) <= 2 {
            minting.remove(&key);
        }
        minted
    }

    /// Whether `namespace/service_account` carries the opt-in annotation, read now.
    async fn allowed(
        &self,
        api: &Api<ServiceAccount>,
        namespace: &str,
        service_account: &str,
        audience: &str,
    ) -> Result<(), TokenError> {
        let account =
            api.get_metadata_opt(service_account)
                .await
                .map_err(|e| TokenError::Refused {
                    namespace: namespace.to_string(),
                    service_account: service_account.to_string(),
                    audience: audience.to_string(),
                    reason: format!("reading the service account: {}", describe(&e)),
                })?;
        let Some(account) = account else {
            return Err(TokenError::Missing {
                namespace: namespace.to_string(),
                service_account: service_account.to_string(),
                annotation: ALLOW_CONTROLLER_ANNOTATION,
            });
        };
        let allowed = account
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ALLOW_CONTROLLER_ANNOTATION))
            .is_some_and(|v| v == "true");
        if !allowed {
            return Err(TokenError::NotAllowed {
                namespace: namespace.to_string(),
                service_account: service_account.to_string(),
                annotation: ALLOW_CONTROLLER_ANNOTATION,
            });
        }
        Ok(())
    }

    async fn mint(&self, key: &Key) -> Result<ServiceAccountToken, TokenError> {
        let (namespace, service_account, audience) = (&key.0, &key.1, &key.2);
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        self.allowed(&api, namespace, service_account, audience)
            .await?;
        let request = TokenRequest {
            spec: TokenRequestSpec {
                // No audience: the API server's own.
                audiences: if audience.is_empty() {
                    Vec::new()
                } else {
                    vec![audience.to_string()]
                },
                expiration_seconds: Some(TOKEN_LIFETIME.as_secs() as i64),
                bound_object_ref: None,
            },
            ..Default::default()
        };
        let asked = Instant::now();
        let refused = |reason: String| TokenError::Refused {
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
            audience: audience.to_string(),
            reason,
        };
        let response = api
            .create_token_request(service_account, &PostParams::default(), &request)
            .await
            .map_err(|e| refused(describe(&e)))?;
        let status = response
            .status
            .filter(|s| !s.token.is_empty())
            .ok_or_else(|| refused("the API server returned no token".into()))?;
        // The API server may grant a different lifetime than asked; reuse by what it granted.
        let granted = status
            .expiration_timestamp
            .0
            .duration_since(k8s_openapi::jiff::Timestamp::now())
            .try_into()
            .unwrap_or(TOKEN_LIFETIME)
            .min(TOKEN_LIFETIME * 6);
        let token = ServiceAccountToken {
            token: SecretString::new(status.token),
            expiration: Some(status.expiration_timestamp.0.to_string()),
        };
        self.remember(
            key.clone(),
            Minted {
                token: token.clone(),
                renew_at: asked + granted.mul_f64(REUSE_FRACTION),
            },
        );
        Ok(token)
    }

    fn cached(&self, key: &Key) -> Option<ServiceAccountToken> {
        // Each critical section is one map operation: a poisoned lock still holds a whole map.
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .get(key)
            .filter(|m| Instant::now() < m.renew_at)
            .map(|m| m.token.clone())
    }

    fn remember(&self, key: Key, minted: Minted) {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= MAX_TOKENS && !cache.contains_key(&key) {
            let now = Instant::now();
            cache.retain(|_, m| now < m.renew_at);
            if cache.len() >= MAX_TOKENS
                && let Some(oldest) = cache
                    .iter()
                    .min_by_key(|(_, m)| m.renew_at)
                    .map(|(k, _)| k.clone())
            {
                cache.remove(&oldest);
            }
        }
        cache.insert(key, minted);
    }
}

/// A kube error as the API server's Status message (which holds no token).
fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}
