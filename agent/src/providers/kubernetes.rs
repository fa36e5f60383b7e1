//! The `kubernetes` provider: Secrets read AS THE POD with its projected service-account token,
//! of the pod's own namespace or `remoteNamespace`, on the agent's API server or on `server`
//! (another cluster, see [`remote`]). The agent's own identity is never used, so the agent
//! needs no permission on Secrets and a pod reads exactly what its RBAC allows.
//!
//! `remoteRef.key` names the Secret; the value is the Secret's data as a JSON object, so
//! `property` picks one key (as in ESO) and `dataFrom.extract` maps every key.

pub mod push;
mod remote;

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ListParams;
use kube::{Api, Client};

use super::{
    BuildContext, FindQuery, MAX_FIND_RESULTS, MAX_RESPONSE_BYTES, Provider, ProviderError,
    RemoteKey, found,
};
use crate::api::store::KubernetesProvider;
use crate::identity::PodInfo;
use crate::json;
use crate::secret::SecretBytes;
use crate::telemetry::escape::printable;

/// Reads Secrets of one namespace with one pod's token.
pub struct KubernetesSecrets {
    secrets: Api<Secret>,
    /// A remote server's URL, the token it was sent and whose, to name the server and scrub
    /// the token from errors; `None` for the agent's API server.
    remote: Option<remote::Remote>,
}

impl KubernetesSecrets {
    /// Secrets of the pod's own namespace on the agent's API server, as the pod (credential
    /// Secrets of a SecretStore).
    pub fn local(
        agent_config: Option<&kube::Config>,
        pod: &PodInfo,
    ) -> Result<Self, ProviderError> {
        let client = pod_client(agent_config, pod, "")?;
        Ok(Self {
            secrets: Api::namespaced(client, &pod.namespace),
            remote: None,
        })
    }

    /// The reader a store's `spec` selects for `ctx.pod`: its `remoteNamespace` (default: the
    /// pod's) on its `server` (default: the agent's API server), with the pod's token for its
    /// `audience`.
    pub async fn build(
        spec: &KubernetesProvider,
        ctx: &BuildContext<'_>,
    ) -> Result<Self, ProviderError> {
        let audience = spec.audience.as_deref().unwrap_or("");
        let namespace = spec
            .remote_namespace
            .as_deref()
            .unwrap_or(&ctx.pod.namespace);
        // Validated with the store; it goes into request paths, so checked again here.
        if !crate::identity::is_dns_label(namespace) {
            return Err(ProviderError::Config(format!(
                "kubernetes.remoteNamespace {:?} is not a namespace name",
                printable(namespace, 80)
            )));
        }
        let (client, remote) = match &spec.server {
            None => (pod_client(ctx.env.kube.as_ref(), ctx.pod, audience)?, None),
            Some(server) => {
                let remote = remote::client(server, spec, ctx).await?;
                (remote.client.clone(), Some(remote))
            }
        };
        Ok(Self {
            secrets: Api::namespaced(client, namespace),
            remote,
        })
    }

    /// `call`, bounded in time, its error in the words of the server it went to.
    async fn call<T>(
        &self,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ProviderError> {
        match tokio::time::timeout(remote::REQUEST_TIMEOUT, call).await {
            Err(_) => Err(remote::timed_out(
                self.remote.as_ref().map_or("", |r| r.url.as_str()),
            )),
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(match &self.remote {
                Some(r) => remote::api_error(e, r),
                None => api_error(e),
            }),
        }
    }
}

/// A client for the agent's API server that authenticates as the pod, with its token for
/// `audience`.
pub(crate) fn pod_client(
    agent_config: Option<&kube::Config>,
    pod: &PodInfo,
    audience: &str,
) -> Result<Client, ProviderError> {
    let base = agent_config.ok_or_else(|| {
        ProviderError::Config(
            "the kubernetes provider needs the Kubernetes API; standalone mode has none".into(),
        )
    })?;
    let token = pod.tokens.for_audience(audience).ok_or_else(|| {
        ProviderError::Config(format!(
            "kubelet passed no service-account token for audience {audience:?}: add it to the \
             CSIDriver's tokenRequests"
        ))
    })?;
    let mut config = base.clone();
    // Only the pod's token: no client certificate, exec plugin or file of the agent's own.
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.token.expose().to_string().into()),
        ..Default::default()
    };
    bounded_client(config)
}

/// A client whose every answer is cut at [`MAX_RESPONSE_BYTES`] as it arrives: a page of Secrets
/// fits, and a server that sends more (a remote one may be anyone's) fails the request instead
/// of filling the agent's memory.
fn bounded_client(config: kube::Config) -> Result<Client, ProviderError> {
    let limit =
        tower::util::MapResponseLayer::new(|answer: http::Response<Box<kube::client::DynBody>>| {
            answer.map(|body| http_body_util::Limited::new(body, MAX_RESPONSE_BYTES))
        });
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(|_| ProviderError::Config("cannot build a client for the API server".into()))?;
    Ok(builder.with_layer(&limit).build())
}

#[async_trait]
impl Provider for KubernetesSecrets {
    async fn get(&self, key: &RemoteKey) -> Result<SecretBytes, ProviderError> {
        if key.version.is_some() {
            return Err(ProviderError::Config(
                "Kubernetes Secrets have no versions".into(),
            ));
        }
        // The name goes into the request path: anything but a Kubernetes name is refused here.
        crate::api::validate::object_name("remoteRef.key (a Secret name)", &key.key)
            .map_err(|e| ProviderError::Config(e.to_string()))?;
        let secret = self.call(self.secrets.get(&key.key)).await?;
        as_json(secret)
    }

    async fn find(&self, query: &FindQuery) -> Result<Vec<(String, SecretBytes)>, ProviderError> {
        // Listing needs `list` on Secrets for the pod's service account. Page by page: a
        // namespace's Secrets (each up to ~1.5 MiB, tenant-written) are never all in memory.
        let mut params = ListParams::default().limit(LIST_PAGE);
        let mut matches = Vec::new();
        let mut bytes = 0usize;
        for _ in 0..MAX_LIST_PAGES {
            let list = self.call(self.secrets.list(&params)).await?;
            for secret in list.items {
                let name = secret.metadata.name.clone().unwrap_or_default();
                if !query.matches(&name) {
                    continue;
                }
                let value = as_json(secret)?;
                bytes += name.len() + value.len();
                if bytes > MAX_RESPONSE_BYTES {
                    return Err(ProviderError::TooLarge(format!(
                        "the Secrets dataFrom.find matched hold more than {MAX_RESPONSE_BYTES} \
                         bytes"
                    )));
                }
                matches.push((name, value));
                if matches.len() > MAX_FIND_RESULTS {
                    // `found` reports it.
                    return found(matches);
                }
            }
            match list.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => return found(matches),
            }
        }
        // A server that keeps handing out continue tokens (a remote one may be anyone's).
        Err(ProviderError::TooLarge(format!(
            "dataFrom.find listed more than {} Secrets without reaching the end of the namespace",
            MAX_LIST_PAGES * LIST_PAGE as usize
        )))
    }
}

/// Secrets per page of a `dataFrom.find` list.
const LIST_PAGE: u32 = 10;

/// Most pages one `dataFrom.find` lists.
const MAX_LIST_PAGES: usize = 1000;

/// A Secret's data as a JSON object of strings, so `property` and `extract` work as in ESO.
/// A Secret of more keys than a JSON value may hold is refused ([`json::MAX_ITEMS`]).
fn as_json(secret: Secret) -> Result<SecretBytes, ProviderError> {
    let data = secret.data.unwrap_or_default();
    if data.len() > json::MAX_ITEMS {
        return Err(ProviderError::TooLarge(format!(
            "the Secret holds {} keys, more than {} (the agent's limit)",
            data.len(),
            json::MAX_ITEMS
        )));
    }
    let mut map = BTreeMap::new();
    for (k, v) in data {
        let text = String::from_utf8(v.0).map_err(|_| {
            ProviderError::Config(format!(
                "Secret key {k:?} holds binary data, which cannot be exposed as JSON text"
            ))
        })?;
        map.insert(k, text);
    }
    serde_json::to_vec(&map)
        .map(SecretBytes::new)
        .map_err(|_| ProviderError::Config("cannot encode the Secret's data".into()))
}

/// The API server's answer as a provider error; only the server's own message is kept.
pub(crate) fn api_error(e: kube::Error) -> ProviderError {
    match e {
        kube::Error::Api(s) => match s.code {
            404 => ProviderError::NotFound,
            401 => {
                ProviderError::PermissionDenied("the API server rejected the pod's token".into())
            }
            403 => ProviderError::PermissionDenied(printable(&s.message, 300)),
            429 => ProviderError::Throttled(printable(&s.message, 300)),
            _ => ProviderError::Unavailable(format!(
                "API server answered {}: {}",
                s.code,
                printable(&s.message, 300)
            )),
        },
        _ => ProviderError::Unavailable("the API server could not be reached".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::tokens::PodTokens;

    #[test]
    fn a_secret_of_too_many_keys_is_refused_without_naming_one() {
        let data = (0..=json::MAX_ITEMS)
            .map(|i| {
                (
                    format!("k{i}"),
                    k8s_openapi::ByteString(b"hunter2".to_vec()),
                )
            })
            .collect();
        let secret = Secret {
            data: Some(data),
            ..Default::default()
        };
        let err = as_json(secret).unwrap_err();
        assert!(matches!(&err, ProviderError::TooLarge(_)), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("10001 keys, more than 10000"), "{text}");
        assert!(!text.contains("hunter2") && !text.contains("k1"), "{text}");
    }

    #[tokio::test]
    async fn a_key_that_is_not_a_secret_name_never_reaches_the_api_server() {
        crate::tls::install_crypto_provider();
        // Nothing listens here: a request that went out would fail as Unavailable instead.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let pod = PodInfo {
            namespace: "shop".into(),
            name: "p".into(),
            uid: "u".into(),
            service_account: "default".into(),
            tokens: PodTokens::parse(Some(r#"{"":{"token":"t"}}"#)).unwrap(),
        };
        let secrets = KubernetesSecrets::local(Some(&config), &pod).unwrap();
        for key in ["../kube-system/secrets/x", "a/b", "..", "UPPER"] {
            let err = secrets
                .get(&RemoteKey {
                    key: key.into(),
                    version: None,
                })
                .await
                .unwrap_err();
            assert!(
                matches!(&err, ProviderError::Config(m) if m.contains("not a valid Kubernetes name")),
                "{key}: {err:?}"
            );
        }
    }
}
