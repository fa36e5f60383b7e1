//! The login tokens shared by every publish: one login per (server, namespace, auth mount, role,
//! identity) and token lifetime, renewed before it runs out, bounded and swept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vaultrs::api::AuthInfo;

use super::super::ProviderError;
use crate::secret::SecretString;

/// Most cached login tokens; when full, stale entries are dropped first, then all idle ones.
const MAX_TOKENS: usize = 4096;
/// Longest a token is reused when Vault gives it no lifetime (lease duration 0, e.g. a root or
/// periodic token): such a token must not outlive the access decisions it was obtained under.
const MAX_TOKEN_REUSE: Duration = Duration::from_secs(3600);

/// What a cached login token is for. Two identities never share a token.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct TokenKey {
    pub(super) server: String,
    pub(super) namespace: String,
    /// Auth method and mount, e.g. `jwt:jwt`.
    pub(super) mount: String,
    pub(super) role: String,
    /// Who the login is for: the pod's `namespace/serviceaccount` (kubernetes, jwt); for AppRole
    /// the credential Secret's checked location, prefixed, for a SecretStore, by the pod's
    /// `namespace/serviceaccount` (see [`super::auth::authenticate`]).
    pub(super) identity: String,
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
pub(super) enum Obtained {
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
    pub(super) async fn get<R, RFut, L, LFut>(
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
}
