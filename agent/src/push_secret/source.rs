//! The source Secret of a PushSecret, read AS the PushSecret's service account with a token for
//! the API server's audience: never with the controller's own rights, so a tenant cannot push a
//! Secret its own identity could not read.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::secret::{SecretBytes, SecretString};

/// Tokens of service accounts for the API server's own audience, under the mirror's opt-in
/// rules (`latchkey controller` gives the mirror's minter).
#[async_trait]
pub trait ApiTokens: Send + Sync {
    /// A token of `namespace/service_account` for the API server, or why there is none (a text
    /// that names the account and holds no token).
    async fn api_token(
        &self,
        namespace: &str,
        service_account: &str,
    ) -> Result<SecretString, String>;
}

/// Why the source Secret could not be read. Never contains a value or a token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SourceError {
    /// No token for the service account (not opted in, missing, refused).
    #[error("{0}")]
    Identity(String),
    /// The service account may not read the Secret.
    #[error(
        "service account {namespace}/{service_account} may not read Secret {namespace}/{secret}: \
         grant it get on that Secret (the controller never reads it with its own rights)"
    )]
    Forbidden {
        /// The namespace.
        namespace: String,
        /// The service account.
        service_account: String,
        /// The Secret.
        secret: String,
    },
    /// The Secret does not exist.
    #[error("Secret {namespace}/{secret} does not exist")]
    Missing {
        /// The namespace.
        namespace: String,
        /// The Secret.
        secret: String,
    },
    /// The API server failed or could not be reached.
    #[error("reading Secret {namespace}/{secret}: {reason}")]
    Api {
        /// The namespace.
        namespace: String,
        /// The Secret.
        secret: String,
        /// The API server's Status message or the transport error.
        reason: String,
    },
}

/// Reads source Secrets as service accounts.
pub struct SourceReader {
    /// The controller's connection settings, whose credentials are replaced by the account's.
    base: kube::Config,
    tokens: Arc<dyn ApiTokens>,
}

impl SourceReader {
    /// Reads through the API server `base` points at, with tokens from `tokens`.
    pub fn new(base: kube::Config, tokens: Arc<dyn ApiTokens>) -> Self {
        Self { base, tokens }
    }

    /// The data of Secret `namespace/secret`, read as `namespace/service_account`.
    pub async fn read(
        &self,
        namespace: &str,
        service_account: &str,
        secret: &str,
    ) -> Result<BTreeMap<String, SecretBytes>, SourceError> {
        let api_error = |reason: String| SourceError::Api {
            namespace: namespace.to_string(),
            secret: secret.to_string(),
            reason,
        };
        let token = self
            .tokens
            .api_token(namespace, service_account)
            .await
            .map_err(SourceError::Identity)?;
        let mut config = self.base.clone();
        // Only the account's token: no client certificate, exec plugin or file of the
        // controller's own.
        config.auth_info = kube::config::AuthInfo {
            token: Some(token.expose().to_string().into()),
            ..Default::default()
        };
        let client = Client::try_from(config)
            .map_err(|_| api_error("cannot build a client for the API server".into()))?;
        let api: Api<Secret> = Api::namespaced(client, namespace);
        match api.get(secret).await {
            Ok(found) => Ok(found
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, SecretBytes::new(v.0)))
                .collect()),
            Err(kube::Error::Api(status)) if status.code == 403 || status.code == 401 => {
                Err(SourceError::Forbidden {
                    namespace: namespace.to_string(),
                    service_account: service_account.to_string(),
                    secret: secret.to_string(),
                })
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Err(SourceError::Missing {
                namespace: namespace.to_string(),
                secret: secret.to_string(),
            }),
            Err(kube::Error::Api(status)) => {
                Err(api_error(format!("{} ({})", status.message, status.code)))
            }
            Err(_) => Err(api_error("the API server could not be reached".into())),
        }
    }
}

/// The mirror's minter, for the API server's own audience: its opt-in rule applies.
#[async_trait]
impl ApiTokens for crate::mirror::tokens::TokenMinter {
    async fn api_token(
        &self,
        namespace: &str,
        service_account: &str,
    ) -> Result<SecretString, String> {
        let tokens = self
            .tokens(namespace, service_account, &[String::new()])
            .await
            .map_err(|e| e.to_string())?;
        let token = tokens
            .for_audience("")
            .ok_or_else(|| format!("no token minted for {namespace}/{service_account}"))?;
        Ok(token.token.clone())
    }
}
