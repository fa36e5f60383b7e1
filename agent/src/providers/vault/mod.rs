//! The `vault` provider: HashiCorp Vault / OpenBao KV v1 and v2, with token, kubernetes, jwt,
//! AppRole, userpass or cert auth. kubernetes and jwt logins use the pod's own projected token.
//!
//! Login tokens are kept in a [`tokens::TokenCache`] shared by every publish (it lives in
//! [`super::Env`]), keyed by (server, namespace, auth mount, role, identity), so pods of one
//! service account log in once per token lifetime. Values are not cached here: the shared value
//! cache sits in front of every provider.
//!
//! A read returns the JSON of the secret's data map; resolution applies `property`.
//! Tokens, secret ids and values never appear in an error or a log line.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use vaultrs::api::EndpointMiddleware;
use vaultrs::api::kv1::requests::{GetSecretRequest, ListSecretRequest};
use vaultrs::api::kv2::requests::{ListSecretsRequest, ReadSecretRequest};
use vaultrs::error::ClientError;

mod auth;
pub(crate) mod errors;
pub mod iam;
pub mod push;
pub mod push_v1;
pub mod pusher;
mod secret_auth;
pub mod tokens;
pub(crate) mod transport;
use auth::authenticate;
use errors::server_error;
use transport::Transport;

use super::{BuildContext, FindQuery, Provider, ProviderError, RemoteKey, found};
use crate::api::store::VaultProvider;
use crate::secret::SecretBytes;

/// How long one request to Vault may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
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
        let (mount, kv) = mount_and_kv(spec)?;
        let client = logged_in(spec, ctx).await?;
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

/// The store's KV mount (`vault.path`, default `secret`) and engine version.
fn mount_and_kv(spec: &VaultProvider) -> Result<(String, Kv), ProviderError> {
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
    Ok((mount, kv))
}

/// A transport for `spec`'s server, logged in as `ctx`'s identity exactly as a store read is
/// (same auth methods, same shared token cache): for callers beyond KV reads (generators).
pub(crate) async fn logged_in(
    spec: &VaultProvider,
    ctx: &BuildContext<'_>,
) -> Result<Transport, ProviderError> {
    let ca_pem = ca_pem(spec, ctx).await?;
    let mut client = new_client(spec, ca_pem.as_deref(), None)?;
    let token = authenticate(spec, ctx, &client, ca_pem.as_deref()).await?;
    client.set_token(token.expose());
    Ok(client)
}

/// The PEM roots the store trusts beyond the system's, if any: `caBundle` and the bundle
/// `caProvider` names, together when both are set (as ESO's Vault provider does). Read anew
/// for every client, so an edited ConfigMap or Secret counts from the next connection on.
async fn ca_pem(
    spec: &VaultProvider,
    ctx: &BuildContext<'_>,
) -> Result<Option<Vec<u8>>, ProviderError> {
    let mut pem = Vec::new();
    if let Some(b64) = spec.ca_bundle.as_deref().filter(|b| !b.trim().is_empty()) {
        pem = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|_| ProviderError::Config("vault.caBundle is not base64".into()))?;
    }
    if let Some(ca) = &spec.ca_provider {
        let from = super::ca_provider::read(ctx, "vault.caProvider", ca).await?;
        if reqwest::Certificate::from_pem_bundle(&from).map_or(true, |c| c.is_empty()) {
            return Err(ProviderError::Config(format!(
                "vault.caProvider: {:?} {}/{} holds no valid PEM certificate",
                ca.kind,
                ca.namespace.as_deref().unwrap_or_default(),
                ca.name
            )));
        }
        pem.push(b'\n');
        pem.extend_from_slice(&from);
    }
    Ok(Some(pem).filter(|p| !p.is_empty()))
}

/// A transport for the store's server, namespace and CA (`ca_pem`), with `identity` as its TLS
/// client certificate if any; no token yet. Nothing is taken from the agent's environment
/// (`VAULT_*`, proxies).
fn new_client(
    spec: &VaultProvider,
    ca_pem: Option<&[u8]>,
    identity: Option<reqwest::Identity>,
) -> Result<Transport, ProviderError> {
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
    } else if let Some(pem) = ca_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .ok()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| {
                ProviderError::Config("vault.caBundle holds no valid PEM certificate".into())
            })?;
        http = http.tls_certs_merge(certs);
    }
    if let Some(identity) = identity {
        http = http.identity(identity);
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
