//! The `plugin` provider: an out-of-tree secret-store plugin speaking the External Secret Store
//! protocol that Crossplane defined (`ess.proto.v1alpha1`), over a unix socket or TCP.
//!
//! `remoteRef.key` becomes the request's `secret.scoped_name`, the store's `configRef` its
//! `config`; the answer's `data` map becomes a JSON object (see [`value`]), so `property` and
//! `dataFrom.extract` work as with other providers. The protocol can neither list secrets
//! (`dataFrom.find`) nor name versions, and carries no identity: the plugin gets no pod token
//! (that comes with Latchkey's own `latchkey.plugin.v1` later).
//!
//! Calls have the store's timeout; transport failures (and `UNAVAILABLE`) are retried twice
//! with a short backoff, nothing else is. Responses are capped at [`MAX_RESPONSE_BYTES`].

pub(crate) mod socket;
pub(crate) mod status;
mod value;

use std::time::Duration;

use async_trait::async_trait;
use csi_proto::ess::v1alpha1::external_secret_store_plugin_service_client::ExternalSecretStorePluginServiceClient;
use csi_proto::ess::v1alpha1::{ConfigReference, GetSecretRequest, Secret};
use tonic::transport::Channel;

pub use socket::{DEFAULT_SOCKET_DIR, Plugins};

use super::{BuildContext, MAX_RESPONSE_BYTES, Provider, ProviderError, RemoteKey};
use crate::api::store::PluginProvider;
use crate::api::validate;
use crate::secret::SecretBytes;

/// Attempts after the first one, for transport failures only.
const RETRIES: u32 = 2;
/// Pause before the first retry; doubled for each further one.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// One store's plugin: its channel (shared with every store naming the same endpoint), config
/// reference and call timeout.
pub struct Plugin {
    /// The endpoint as the store writes it, for messages.
    at: String,
    channel: Channel,
    config: Option<ConfigReference>,
    timeout: Duration,
}

impl Plugin {
    /// Checks the endpoint (a unix socket must be directly in `--plugin-socket-dir`, and no
    /// symbolic link) and takes the endpoint's channel; nothing is sent yet.
    pub fn new(spec: &PluginProvider, ctx: &BuildContext<'_>) -> Result<Self, ProviderError> {
        let timeout = validate::plugin(spec).map_err(|e| ProviderError::Config(e.to_string()))?;
        let endpoint = validate::plugin_endpoint(&spec.endpoint)
            .map_err(|e| ProviderError::Config(e.to_string()))?;
        let channel = ctx.env.plugins.channel(&spec.endpoint, endpoint)?;
        Ok(Self {
            at: spec.endpoint.clone(),
            channel,
            config: spec.config_ref.as_ref().map(|c| ConfigReference {
                api_version: c.api_version.clone(),
                kind: c.kind.clone(),
                name: c.name.clone(),
            }),
            timeout,
        })
    }

    /// One GetSecret call, bounded by the store's timeout.
    async fn call(&self, key: &str) -> Result<SecretBytes, status::Failure> {
        let mut client = ExternalSecretStorePluginServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_RESPONSE_BYTES);
        let mut request = tonic::Request::new(GetSecretRequest {
            config: self.config.clone(),
            secret: Some(Secret {
                scoped_name: key.to_owned(),
                ..Default::default()
            }),
        });
        // Tells the plugin the deadline too (`grpc-timeout`), so it can give up in time.
        request.set_timeout(self.timeout);
        let answer = match tokio::time::timeout(self.timeout, client.get_secret(request)).await {
            Err(_) => return Err(status::timed_out(&self.at, self.timeout)),
            Ok(Err(s)) => return Err(status::failure(&self.at, self.timeout, &s)),
            Ok(Ok(answer)) => answer.into_inner(),
        };
        // Plugins written for Crossplane answer a missing secret with an empty one.
        match answer.secret {
            Some(secret) if !secret.data.is_empty() => Ok(value::from_data(secret.data)),
            _ => Err(status::Failure {
                error: ProviderError::NotFound,
                retry: false,
            }),
        }
    }
}

#[async_trait]
impl Provider for Plugin {
    async fn get(&self, key: &RemoteKey) -> Result<SecretBytes, ProviderError> {
        if key.version.is_some() {
            return Err(ProviderError::Config(format!(
                "plugin {}: remoteRef.version is not available, the plugin protocol has no \
                 versions",
                self.at
            )));
        }
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 0;
        loop {
            match self.call(&key.key).await {
                Ok(value) => return Ok(value),
                Err(f) if f.retry && attempt < RETRIES => {
                    attempt += 1;
                    tracing::debug!(plugin = %self.at, attempt, error = %f.error, "retrying plugin call");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
                Err(f) => return Err(f.error),
            }
        }
    }
}
