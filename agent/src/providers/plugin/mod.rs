//! The `plugin` provider: an out-of-tree secret-store plugin, over a unix socket or TCP (with TLS
//! when the store sets `tls`).
//!
//! Two protocols: Latchkey's own `latchkey.plugin.v1` (the caller's identity with only the
//! tokens of the store's `audiences`, `ListSecrets` for `dataFrom.find`, versions), and the
//! External Secret Store protocol that Crossplane defined (`ess.proto.v1alpha1`), which has none
//! of those. The first call on a channel asks the plugin's `Version`; a plugin that serves
//! latchkey.plugin.v1 is called with it, one that answers UNIMPLEMENTED (or does not list it) with
//! ESS. The answer is kept per channel and asked again after a transport failure.
//!
//! `remoteRef.key` becomes the secret's name (ESS: `secret.scoped_name`), the store's `configRef`
//! the request's `config`; the answer's `data` map becomes a JSON object (see [`value`]), so
//! `property` and `dataFrom.extract` work as with other providers.
//!
//! Calls have the store's timeout; transport failures (and `UNAVAILABLE`) are retried twice
//! with a short backoff, nothing else is. Responses are capped at
//! [`MAX_RESPONSE_BYTES`](super::MAX_RESPONSE_BYTES) and their entries counted before they are
//! decoded ([`grpc_answer`]).
//!
//! PushSecrets write through [`push`], over the same channel and handshake.

mod caller;
pub mod push;
pub(crate) mod socket;
pub(crate) mod status;
mod tls;
mod value;

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use csi_proto::ess::v1alpha1 as ess;
use csi_proto::latchkey_plugin::v1 as lk;
use csi_proto::latchkey_plugin::v1::secret_store_plugin_client::SecretStorePluginClient;
use tonic::Code;

pub use socket::{DEFAULT_SOCKET_DIR, Plugins};

use self::caller::Caller;
use self::socket::{Connection, Protocol};
use self::status::Failure;
use super::{
    BuildContext, FindQuery, MAX_FIND_RESULTS, Provider, ProviderError, RemoteKey, grpc_answer,
};
use crate::api::store::{PluginConfigRef, PluginProvider};
use crate::api::validate::plugin as validate;
use crate::secret::SecretBytes;
use crate::telemetry::escape::printable;

/// How long a TCP connection (and a TLS handshake) to a plugin may take to establish; shared by
/// the plain channels (`socket`) and the TLS ones (`tls`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Attempts after the first one, for transport failures only.
const RETRIES: u32 = 2;
/// Pause before the first retry; doubled for each further one.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// The RPCs called, for messages (an UNIMPLEMENTED answer names the one the plugin lacks).
const ESS_GET_RPC: &str = "ess.proto.v1alpha1.ExternalSecretStorePluginService/GetSecret";
const VERSION_RPC: &str = "latchkey.plugin.v1.SecretStorePlugin/Version";
const GET_RPC: &str = "latchkey.plugin.v1.SecretStorePlugin/GetSecret";
const LIST_RPC: &str = "latchkey.plugin.v1.SecretStorePlugin/ListSecrets";

/// The calls whose answers carry values, counted before they are decoded (see
/// [`grpc_answer`]): a `data` map at the top; a `Secret` (field 1) holding one; `secrets`
/// (field 1), each holding one.
const ESS_GET: grpc_answer::Method = grpc_answer::Method {
    path: "/ess.proto.v1alpha1.ExternalSecretStorePluginService/GetSecret",
    service: "ess.proto.v1alpha1.ExternalSecretStorePluginService",
    method: "GetSecret",
    nested: &[1],
};
const GET: grpc_answer::Method = grpc_answer::Method {
    path: "/latchkey.plugin.v1.SecretStorePlugin/GetSecret",
    service: "latchkey.plugin.v1.SecretStorePlugin",
    method: "GetSecret",
    nested: &[],
};
const LIST: grpc_answer::Method = grpc_answer::Method {
    path: "/latchkey.plugin.v1.SecretStorePlugin/ListSecrets",
    service: "latchkey.plugin.v1.SecretStorePlugin",
    method: "ListSecrets",
    nested: &[1],
};

/// Longest version string a plugin may return (longer is garbage, not a version).
const MAX_VERSION_CHARS: usize = 256;
/// Largest `Version` answer: a name, a version and a few service names.
const MAX_VERSION_RESPONSE_BYTES: usize = 64 << 10;

/// One store's plugin for one pod: its channel (shared with every store naming the same
/// endpoint and TLS material), config reference, the pod's identity and the call timeout.
pub struct Plugin {
    /// The endpoint as the store writes it, for messages.
    at: String,
    connection: Connection,
    config: Option<PluginConfigRef>,
    caller: Caller,
    timeout: Duration,
    /// The TLS material and `host:port`, to tell why a TLS connection failed.
    tls: Option<(tls::Material, String, u16)>,
}

impl Plugin {
    /// Checks the endpoint (a unix socket must be directly in `--plugin-socket-dir`, and no
    /// symbolic link), reads the TLS material (the client certificate Secret as other
    /// credentials), takes the channel and the pod's identity; nothing is sent to the plugin yet.
    pub async fn new(spec: &PluginProvider, ctx: &BuildContext<'_>) -> Result<Self, ProviderError> {
        let timeout = validate::plugin(spec).map_err(|e| ProviderError::Config(e.to_string()))?;
        let endpoint = validate::plugin_endpoint(&spec.endpoint)
            .map_err(|e| ProviderError::Config(e.to_string()))?;
        let caller = Caller::new(&spec.endpoint, ctx.pod, &spec.audiences)?;
        let tls = match &spec.tls {
            Some(t) => Some(tls::Material::load(&spec.endpoint, t, ctx).await?),
            None => None,
        };
        let connection = ctx
            .env
            .plugins
            .channel(&spec.endpoint, endpoint, tls.as_ref())?;
        let tls = match (tls, endpoint) {
            (Some(m), validate::PluginEndpoint::Tcp { host, port }) => {
                Some((m, host.to_owned(), port))
            }
            _ => None,
        };
        Ok(Self {
            at: spec.endpoint.clone(),
            connection,
            config: spec.config_ref.clone(),
            caller,
            timeout,
            tls,
        })
    }

    /// Runs `call` until it succeeds, fails for good, or the retries are spent. A transport
    /// failure also forgets the handshake: the plugin may have been replaced.
    async fn with_retries<T, F, Fut>(&self, call: F) -> Result<T, ProviderError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        self.with_retries_up_to(RETRIES, call).await
    }

    /// [`Self::with_retries`] with `retries` attempts after the first; 0 for calls that must
    /// not be repeated (a generator's Generate), which still get the handshake forgotten and
    /// the TLS diagnosis.
    pub(crate) async fn with_retries_up_to<T, F, Fut>(
        &self,
        retries: u32,
        call: F,
    ) -> Result<T, ProviderError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 0;
        loop {
            match call().await {
                Ok(value) => return Ok(value),
                Err(f) if f.retry => {
                    self.connection.handshake.forget();
                    if let Some(error) = self.tls_diagnosis().await {
                        // Certificates do not change between attempts: no retry.
                        return Err(error);
                    }
                    if attempt >= retries {
                        return Err(f.error);
                    }
                    attempt += 1;
                    tracing::debug!(plugin = %self.at, attempt, error = %f.error, "retrying plugin call");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
                Err(f) => return Err(f.error),
            }
        }
    }

    /// Why a TLS connection failed, when a certificate is the reason (see [`tls::Material::probe`]).
    async fn tls_diagnosis(&self) -> Option<ProviderError> {
        let (material, host, port) = self.tls.as_ref()?;
        let text = material.probe(host, *port).await?;
        status::tls_failure_in(&format!("plugin {}", self.at), &text)
    }

    /// The endpoint as the store (or generator) writes it, for messages.
    pub(crate) fn at(&self) -> &str {
        &self.at
    }

    /// The call timeout (`plugin.timeout`).
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The channel to the plugin (shared; cloning is cheap).
    pub(crate) fn channel(&self) -> tonic::transport::Channel {
        self.connection.channel.clone()
    }

    /// The caller's identity, as every latchkey.plugin.v1 request carries it.
    pub(crate) fn caller(&self) -> lk::Caller {
        self.caller.message()
    }

    /// The protocol the plugin serves: the kept answer, or one `Version` call.
    pub(crate) async fn protocol(&self) -> Result<Protocol, Failure> {
        if let Some(protocol) = self.connection.handshake.get() {
            return Ok(protocol);
        }
        let mut client = SecretStorePluginClient::new(self.connection.channel.clone())
            .max_decoding_message_size(MAX_VERSION_RESPONSE_BYTES);
        let mut request = tonic::Request::new(lk::VersionRequest {
            version: "v1".into(),
        });
        request.set_timeout(self.timeout);
        let protocol = match tokio::time::timeout(self.timeout, client.version(request)).await {
            Err(_) => return Err(status::timed_out(&self.at, VERSION_RPC, self.timeout)),
            // The plugin's answer (no source: not made by the client): it has no handshake,
            // so it serves only ESS.
            Ok(Err(s))
                if s.code() == Code::Unimplemented && std::error::Error::source(&s).is_none() =>
            {
                Protocol::Ess
            }
            Ok(Err(s)) => return Err(status::failure(&self.at, VERSION_RPC, self.timeout, &s)),
            Ok(Ok(answer)) => {
                let answer = answer.into_inner();
                let latchkey = answer
                    .services
                    .iter()
                    .any(|s| s == csi_proto::latchkey_plugin::SERVICE);
                tracing::debug!(
                    plugin = %self.at,
                    name = %printable(&answer.name, 64),
                    version = %printable(&answer.version, 64),
                    latchkey,
                    "plugin handshake"
                );
                if latchkey {
                    Protocol::Latchkey
                } else {
                    Protocol::Ess
                }
            }
        };
        self.connection.handshake.set(protocol);
        Ok(protocol)
    }

    /// One read, with the protocol the plugin serves.
    async fn get_once(&self, key: &RemoteKey) -> Result<SecretBytes, Failure> {
        match self.protocol().await? {
            Protocol::Latchkey => self.get_latchkey(key).await,
            Protocol::Ess => {
                if key.version.is_some() {
                    return Err(config_failure(format!(
                        "plugin {}: remoteRef.version is not available, the plugin serves only \
                         ess.proto.v1alpha1, which has no versions (latchkey.plugin.v1 has)",
                        self.at
                    )));
                }
                self.ess_has_no_identity()?;
                self.get_ess(&key.key).await
            }
        }
    }

    /// A store that lists audiences expects the plugin to act as the pod: an ESS-only plugin
    /// cannot, and silently reading with the plugin's own identity would surprise.
    fn ess_has_no_identity(&self) -> Result<(), Failure> {
        if self.caller.has_tokens() {
            return Err(config_failure(format!(
                "plugin {}: plugin.audiences is set but the plugin serves only \
                 ess.proto.v1alpha1, which carries no identity; it needs latchkey.plugin.v1",
                self.at
            )));
        }
        Ok(())
    }

    /// One ESS GetSecret call, bounded by the store's timeout.
    async fn get_ess(&self, key: &str) -> Result<SecretBytes, Failure> {
        let mut request = tonic::Request::new(ess::GetSecretRequest {
            config: self.config.as_ref().map(|c| ess::ConfigReference {
                api_version: c.api_version.clone(),
                kind: c.kind.clone(),
                name: c.name.clone(),
            }),
            secret: Some(ess::Secret {
                scoped_name: key.to_owned(),
                ..Default::default()
            }),
        });
        // Tells the plugin the deadline too (`grpc-timeout`), so it can give up in time.
        request.set_timeout(self.timeout);
        let call = grpc_answer::unary::<_, ess::GetSecretResponse>(
            self.connection.channel.clone(),
            &ESS_GET,
            request,
        );
        // `_held` keeps the answer's share of the parse budget until it is converted.
        let (answer, _held) = match tokio::time::timeout(self.timeout, call).await {
            Err(_) => return Err(status::timed_out(&self.at, ESS_GET_RPC, self.timeout)),
            Ok(Err(s)) => return Err(status::failure(&self.at, ESS_GET_RPC, self.timeout, &s)),
            Ok(Ok(answer)) => {
                let counted = answer.into_inner();
                (counted.value, counted.held)
            }
        };
        // Plugins written for Crossplane answer a missing secret with an empty one.
        match answer.secret {
            Some(secret) if !secret.data.is_empty() => Ok(value::from_data(secret.data)),
            _ => Err(not_found()),
        }
    }

    /// The `config` of latchkey.plugin.v1 requests.
    pub(crate) fn lk_config(&self) -> Option<lk::ConfigReference> {
        self.config.as_ref().map(|c| lk::ConfigReference {
            api_version: c.api_version.clone(),
            kind: c.kind.clone(),
            name: c.name.clone(),
        })
    }

    /// One latchkey.plugin.v1 GetSecret call as the pod, bounded by the store's timeout.
    async fn get_latchkey(&self, key: &RemoteKey) -> Result<SecretBytes, Failure> {
        let mut request = tonic::Request::new(lk::GetSecretRequest {
            config: self.lk_config(),
            caller: Some(self.caller.message()),
            name: key.key.clone(),
            version: key.version.clone().unwrap_or_default(),
        });
        request.set_timeout(self.timeout);
        let call = grpc_answer::unary::<_, lk::GetSecretResponse>(
            self.connection.channel.clone(),
            &GET,
            request,
        );
        let (answer, _held) = match tokio::time::timeout(self.timeout, call).await {
            Err(_) => return Err(status::timed_out(&self.at, GET_RPC, self.timeout)),
            Ok(Err(s)) => return Err(status::failure(&self.at, GET_RPC, self.timeout, &s)),
            Ok(Ok(answer)) => {
                let counted = answer.into_inner();
                (counted.value, counted.held)
            }
        };
        if answer.data.is_empty() {
            return Err(not_found());
        }
        let version = self.checked_version(&key.key, &answer.version)?;
        tracing::debug!(plugin = %self.at, key = %printable(&key.key, 200), version, "plugin value");
        Ok(value::from_data(answer.data))
    }

    /// One ListSecrets call as the pod. The plugin is asked for one more than Latchkey accepts,
    /// so a broader match is refused rather than cut; names outside the query are dropped (a
    /// plugin may ignore the filter).
    async fn list(&self, query: &FindQuery) -> Result<Vec<(String, SecretBytes)>, Failure> {
        let mut request = tonic::Request::new(lk::ListSecretsRequest {
            config: self.lk_config(),
            caller: Some(self.caller.message()),
            path: query.path.clone().unwrap_or_default(),
            name_regexp: query
                .name
                .as_ref()
                .map(|r| r.as_str().to_owned())
                .unwrap_or_default(),
            max_results: u32::try_from(MAX_FIND_RESULTS + 1).unwrap_or(u32::MAX),
        });
        request.set_timeout(self.timeout);
        let call = grpc_answer::unary::<_, lk::ListSecretsResponse>(
            self.connection.channel.clone(),
            &LIST,
            request,
        );
        let (answer, _held) = match tokio::time::timeout(self.timeout, call).await {
            Err(_) => return Err(status::timed_out(&self.at, LIST_RPC, self.timeout)),
            Ok(Err(s)) => return Err(status::failure(&self.at, LIST_RPC, self.timeout, &s)),
            Ok(Ok(answer)) => {
                let counted = answer.into_inner();
                (counted.value, counted.held)
            }
        };
        let mut seen = HashSet::new();
        let mut results = Vec::new();
        for entry in answer.secrets {
            if !seen.insert(entry.name.clone()) {
                return Err(Failure {
                    error: ProviderError::Unavailable(format!(
                        "plugin {}: ListSecrets returned {:?} twice",
                        self.at,
                        printable(&entry.name, 200)
                    )),
                    retry: false,
                });
            }
            if entry.data.is_empty() || !query.matches(&entry.name) {
                continue;
            }
            self.checked_version(&entry.name, &entry.version)?;
            results.push((entry.name, value::from_data(entry.data)));
        }
        super::found(results).map_err(|error| Failure {
            error,
            retry: false,
        })
    }

    /// A returned version, if it is one: bounded and printable (it reaches logs).
    fn checked_version<'v>(&self, name: &str, version: &'v str) -> Result<&'v str, Failure> {
        if version.chars().count() > MAX_VERSION_CHARS || version.chars().any(char::is_control) {
            return Err(Failure {
                error: ProviderError::Unavailable(format!(
                    "plugin {}: the version returned for {:?} is not one (more than \
                     {MAX_VERSION_CHARS} characters, or control characters)",
                    self.at,
                    printable(name, 200)
                )),
                retry: false,
            });
        }
        Ok(version)
    }
}

/// A failure that another attempt cannot fix.
fn config_failure(message: String) -> Failure {
    Failure {
        error: ProviderError::Config(message),
        retry: false,
    }
}

fn not_found() -> Failure {
    Failure {
        error: ProviderError::NotFound,
        retry: false,
    }
}

#[async_trait]
impl Provider for Plugin {
    async fn get(&self, key: &RemoteKey) -> Result<SecretBytes, ProviderError> {
        self.with_retries(|| self.get_once(key)).await
    }

    async fn find(&self, query: &FindQuery) -> Result<Vec<(String, SecretBytes)>, ProviderError> {
        self.with_retries(|| async {
            match self.protocol().await? {
                Protocol::Latchkey => self.list(query).await,
                Protocol::Ess => Err(Failure {
                    error: ProviderError::CannotFind,
                    retry: false,
                }),
            }
        })
        .await
    }
}
