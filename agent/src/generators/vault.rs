//! The `VaultDynamicSecret` generator (ESO's): one call to a Vault path (a PKI certificate, a
//! database user, a token), logged in as the caller's identity exactly as the vault store is
//! (the pod's token for kubernetes/jwt, through the shared token cache). Unlike ESO, what it
//! makes is renewed (`sys/leases/renew`, `auth/token/renew-accessor`) and revoked
//! (`sys/leases/revoke`, `auth/token/revoke-accessor`).
//!
//! The state names the lease (or the token's accessor), never a value. Error messages name the
//! Vault path; Vault's own error strings carry neither tokens nor values.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use rustify::enums::RequestMethod;
use serde_json::{Map, Value, json};

use super::{Generated, Generator, GeneratorError, Lease};
use crate::api::generator::{VaultDynamicSecretSpec, VaultResultType};
use crate::providers::vault::errors::{reason, server_error};
use crate::providers::vault::logged_in;
use crate::providers::vault::transport::{Answer, Call, Transport};
use crate::providers::{BuildContext, ProviderError};
use crate::secret::SecretBytes;
use crate::telemetry::Metrics;
use crate::telemetry::metrics::BackendLabels;

/// The TTL asked for when a POST/PUT names none: a credential outlives an agent killed
/// between Generate and recording its state only by this much (renewal keeps a mounted one
/// alive), where the mount's default could be days.
pub const DEFAULT_TTL: &str = "1h";
/// Longest `path` accepted (the CRD's bound, re-checked: standalone manifests have no schema).
const MAX_PATH_LEN: usize = 1024;
/// Longest lease id or accessor read back from a state (a tenant may edit it).
const MAX_STATE_FIELD: usize = 1024;

/// A validated VaultDynamicSecret, logged in as one identity.
pub struct VaultDynamic {
    client: Transport,
    path: String,
    method: Method,
    parameters: Map<String, Value>,
    result_type: VaultResultType,
    allow_empty: bool,
    metrics: std::sync::Arc<Metrics>,
}

impl std::fmt::Debug for VaultDynamic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the client: it holds the token.
        f.debug_struct("VaultDynamic")
            .field("path", &self.path)
            .field("method", &self.method)
            .field("result_type", &self.result_type)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Get,
    Post,
    Put,
    List,
}

impl Method {
    fn parse(method: Option<&str>) -> Result<Self, GeneratorError> {
        match method.unwrap_or("GET") {
            "GET" => Ok(Self::Get),
            "POST" => Ok(Self::Post),
            "PUT" => Ok(Self::Put),
            "LIST" => Ok(Self::List),
            other => Err(GeneratorError::Invalid(format!(
                "VaultDynamicSecret method {:?} is not GET, POST, PUT or LIST",
                crate::telemetry::escape::printable(other, 20)
            ))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::List => "LIST",
        }
    }

    fn request(self) -> RequestMethod {
        match self {
            Self::Get => RequestMethod::GET,
            Self::Post => RequestMethod::POST,
            Self::Put => RequestMethod::PUT,
            Self::List => RequestMethod::LIST,
        }
    }

    fn has_body(self) -> bool {
        matches!(self, Self::Post | Self::Put)
    }
}

/// What a state says to renew or revoke.
enum Target {
    Lease { id: String, ttl: Option<u64> },
    Token { accessor: String, ttl: Option<u64> },
    Nothing,
}

impl VaultDynamic {
    /// Checks `spec` and logs in to its Vault as `ctx`'s identity.
    pub async fn new(
        spec: &VaultDynamicSecretSpec,
        ctx: &BuildContext<'_>,
    ) -> Result<Self, GeneratorError> {
        let path = check_path(&spec.path)?;
        let method = Method::parse(spec.method.as_deref())?;
        let client = logged_in(&spec.provider, ctx).await?;
        Ok(Self {
            client,
            path,
            method,
            parameters: spec.parameters.clone().unwrap_or_default(),
            result_type: spec.result_type.unwrap_or_default(),
            allow_empty: spec.allow_empty_response,
            metrics: std::sync::Arc::clone(&ctx.env.metrics),
        })
    }

    /// The generator's request: parameters as the body of a POST/PUT (with [`DEFAULT_TTL`]
    /// unless they name a ttl), as the query of a GET/LIST.
    fn request(&self) -> Result<Call, GeneratorError> {
        let (query, body) = if self.method.has_body() {
            let mut body = self.parameters.clone();
            body.entry("ttl")
                .or_insert_with(|| Value::String(DEFAULT_TTL.into()));
            let bytes = serde_json::to_vec(&body)
                .map_err(|_| GeneratorError::Invalid("parameters cannot be encoded".into()))?;
            (None, Some(bytes))
        } else if self.parameters.is_empty() {
            (None, None)
        } else {
            let mut url = reqwest::Url::parse("http://query/")
                .map_err(|_| GeneratorError::Invalid("parameters cannot be encoded".into()))?;
            {
                let mut pairs = url.query_pairs_mut();
                for (k, v) in &self.parameters {
                    match v {
                        Value::String(s) => pairs.append_pair(k, s),
                        other => pairs.append_pair(k, &other.to_string()),
                    };
                }
            }
            (url.query().map(str::to_string), None)
        };
        Ok(Call {
            method: self.method.request(),
            path: self.path.clone(),
            query,
            body,
        })
    }

    /// Runs `call`, counted in the backend metrics as `operation`; errors name `what`. The
    /// answer keeps its share of the node's parse budget until the caller drops it.
    async fn send(
        &self,
        call: Call,
        operation: &'static str,
        what: &str,
    ) -> Result<Answer<Option<Value>>, VaultFailure> {
        let result = self
            .client
            .json(call)
            .await
            .map_err(|e| VaultFailure::new(e, what));
        self.metrics
            .backend_requests
            .get_or_create(&BackendLabels {
                provider: "vault",
                operation,
                result: result.as_ref().err().map_or("success", |f| f.error.kind()),
            })
            .inc();
        result
    }

    /// Revokes what a failed Generate made, best effort: the caller only sees the failure.
    async fn undo(&self, state: Option<&Value>) {
        if let Some(state) = state
            && let Err(error) = self.cleanup(state).await
        {
            tracing::warn!(
                path = %self.path,
                error = %error,
                "could not revoke a credential Vault made for a failed generate; its TTL ends it"
            );
        }
    }
}

#[async_trait]
impl Generator for VaultDynamic {
    async fn generate(&self) -> Result<Generated, GeneratorError> {
        let what = format!("{} {}", self.method.name(), self.path);
        let Answer { value, held: _held } = self
            .send(self.request()?, "generate", &what)
            .await
            .map_err(|f| f.into_error(GenerateNotFound::Config))?;
        let Some(answer) = value.filter(|v| !v.is_null()) else {
            return self.empty(&what);
        };
        let lease_id = answer
            .get("lease_id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty());
        let part = match self.result_type {
            VaultResultType::Data => answer.get("data"),
            VaultResultType::Auth => answer.get("auth"),
            VaultResultType::Raw => Some(&answer),
        };
        let (state, lease) = match self.result_type {
            VaultResultType::Auth => {
                let auth = part.unwrap_or(&Value::Null);
                let lease = lease_of(auth);
                let state = auth
                    .get("accessor")
                    .and_then(Value::as_str)
                    .filter(|a| !a.is_empty())
                    .map(|accessor| {
                        let ttl = lease.map(|l| l.ttl.as_secs());
                        json!({ "accessor": accessor, "ttl": ttl })
                    });
                (state, lease)
            }
            VaultResultType::Data | VaultResultType::Raw => {
                let lease = lease_id.and_then(|_| lease_of(&answer));
                let state = lease_id.map(|id| {
                    let mut state = json!({"leaseId": id, "path": self.path});
                    if let Some(serial) = answer
                        .pointer("/data/serial_number")
                        .and_then(Value::as_str)
                    {
                        state["serial"] = json!(serial);
                    }
                    if let Some(lease) = lease {
                        state["ttl"] = json!(lease.ttl.as_secs());
                    }
                    state
                });
                (state, lease)
            }
        };
        // What to revoke if the answer turns out unusable: whatever Vault made, even when it
        // is not the part asked for (a leased certificate asked for as `Auth`).
        let made = state
            .clone()
            .or_else(|| lease_id.map(|id| json!({ "leaseId": id })));
        let values = match (self.result_type, part) {
            (VaultResultType::Raw, _) => {
                let text = serde_json::to_vec(&answer).map_err(|_| {
                    GeneratorError::Backend(ProviderError::Unavailable(format!(
                        "cannot encode Vault's answer to {what}"
                    )))
                })?;
                BTreeMap::from([("response".to_string(), SecretBytes::new(text))])
            }
            (_, Some(Value::Object(map))) => map
                .iter()
                .map(|(k, v)| {
                    let bytes = match v {
                        Value::String(s) => s.as_bytes().to_vec(),
                        other => other.to_string().into_bytes(),
                    };
                    (k.clone(), SecretBytes::new(bytes))
                })
                .collect(),
            (_, None | Some(Value::Null)) => BTreeMap::new(),
            (_, Some(_)) => {
                self.undo(made.as_ref()).await;
                return Err(GeneratorError::Backend(ProviderError::Unavailable(
                    format!(
                        "Vault's answer to {what} has a {} that is not an object",
                        part_name(self.result_type)
                    ),
                )));
            }
        };
        if values.is_empty() && !self.allow_empty {
            self.undo(made.as_ref()).await;
            return self.empty(&what);
        }
        Ok(Generated {
            values,
            state,
            lease,
        })
    }

    async fn renew(&self, state: &Value) -> Result<Option<Lease>, GeneratorError> {
        let (call, what, ttl) = match target(state)? {
            Target::Nothing => return Ok(None),
            Target::Lease { id, ttl } => {
                let mut body = json!({"lease_id": id});
                if let Some(ttl) = ttl {
                    body["increment"] = json!(ttl);
                }
                (
                    body_call(RequestMethod::PUT, "sys/leases/renew", &body),
                    format!("sys/leases/renew of lease {id}"),
                    ttl,
                )
            }
            Target::Token { accessor, ttl } => {
                let mut body = json!({"accessor": accessor});
                if let Some(ttl) = ttl {
                    body["increment"] = json!(ttl);
                }
                (
                    body_call(RequestMethod::POST, "auth/token/renew-accessor", &body),
                    format!("auth/token/renew-accessor of accessor {accessor}"),
                    ttl,
                )
            }
        };
        let answer = match self.send(call, "renew", &what).await {
            Ok(answer) => answer.value.unwrap_or(Value::Null),
            // Not renewable, or already gone: a new credential is the answer either way.
            Err(f) if f.gone_or_fixed() => return Ok(None),
            Err(f) => return Err(f.into_error(GenerateNotFound::Gone)),
        };
        // Tokens answer in `auth`, leases at the top.
        let granted = lease_of(answer.get("auth").unwrap_or(&answer));
        Ok(match (granted, ttl) {
            (None, _) => None,
            // Capped by the max TTL: it ends soon whatever we do, so make a new one now.
            (Some(lease), Some(asked)) if lease.ttl < Duration::from_secs(asked) => None,
            (Some(lease), _) => Some(lease),
        })
    }

    async fn cleanup(&self, state: &Value) -> Result<(), GeneratorError> {
        let (call, what) = match target(state)? {
            Target::Nothing => return Ok(()),
            Target::Lease { id, .. } => (
                body_call(
                    RequestMethod::PUT,
                    "sys/leases/revoke",
                    &json!({"lease_id": id}),
                ),
                format!("sys/leases/revoke of lease {id}"),
            ),
            Target::Token { accessor, .. } => (
                body_call(
                    RequestMethod::POST,
                    "auth/token/revoke-accessor",
                    &json!({"accessor": accessor}),
                ),
                format!("auth/token/revoke-accessor of accessor {accessor}"),
            ),
        };
        match self.send(call, "revoke", &what).await {
            Ok(_) => Ok(()),
            // Expired, revoked before, or never known: nothing left to undo.
            Err(f) if f.gone() => Ok(()),
            Err(f) => Err(f.into_error(GenerateNotFound::Gone)),
        }
    }
}

impl VaultDynamic {
    fn empty(&self, what: &str) -> Result<Generated, GeneratorError> {
        if self.allow_empty {
            return Ok(Generated {
                values: BTreeMap::new(),
                state: None,
                lease: None,
            });
        }
        Err(GeneratorError::Backend(ProviderError::Unavailable(
            format!(
                "Vault answered {what} without {}; set allowEmptyResponse if that is expected",
                part_name(self.result_type)
            ),
        )))
    }
}

fn part_name(result_type: VaultResultType) -> &'static str {
    match result_type {
        VaultResultType::Data => "data",
        VaultResultType::Auth => "auth",
        VaultResultType::Raw => "a body",
    }
}

/// A lease from an answer's (or its `auth` block's) `lease_duration` and `renewable`.
fn lease_of(v: &Value) -> Option<Lease> {
    let secs = v.get("lease_duration").and_then(Value::as_u64)?;
    (secs > 0).then(|| Lease {
        ttl: Duration::from_secs(secs),
        renewable: v.get("renewable").and_then(Value::as_bool).unwrap_or(false),
    })
}

fn body_call(method: RequestMethod, path: &str, body: &Value) -> Call {
    Call {
        method,
        path: path.into(),
        query: None,
        body: Some(body.to_string().into_bytes()),
    }
}

/// What a state (possibly edited by a tenant) names, checked.
fn target(state: &Value) -> Result<Target, GeneratorError> {
    let field = |name: &str| -> Result<Option<String>, GeneratorError> {
        match state.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s))
                if !s.is_empty()
                    && s.len() <= MAX_STATE_FIELD
                    && s.chars().all(|c| c.is_ascii_graphic()) =>
            {
                Ok(Some(s.clone()))
            }
            Some(_) => Err(GeneratorError::Invalid(format!(
                "generator state field {name} is not a printable string of at most \
                 {MAX_STATE_FIELD} characters"
            ))),
        }
    };
    let ttl = state.get("ttl").and_then(Value::as_u64).filter(|t| *t > 0);
    if let Some(accessor) = field("accessor")? {
        return Ok(Target::Token { accessor, ttl });
    }
    if let Some(id) = field("leaseId")? {
        return Ok(Target::Lease { id, ttl });
    }
    Ok(Target::Nothing)
}

/// `path` if it is a plain relative Vault API path.
fn check_path(path: &str) -> Result<String, GeneratorError> {
    let trimmed = path.trim_matches('/');
    let bad = trimmed.is_empty()
        || path.len() > MAX_PATH_LEN
        || trimmed
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
        || trimmed
            .chars()
            .any(|c| c.is_control() || c == '?' || c == '#' || c == '\\');
    if bad {
        return Err(GeneratorError::Invalid(format!(
            "VaultDynamicSecret path {:?} is not a relative Vault path (segments without \
             `.`, `..`, `?`, `#`, at most {MAX_PATH_LEN} bytes)",
            crate::telemetry::escape::printable(path, 100)
        )));
    }
    Ok(trimmed.to_string())
}

/// How a 404 reads in the caller's context.
enum GenerateNotFound {
    /// Generate: the path does not exist (a spec mistake).
    Config,
    /// Renew / cleanup: what was named is gone.
    Gone,
}

/// A failed Vault call, with what it was for.
struct VaultFailure {
    error: ProviderError,
    /// Vault's own error strings, for recognizing "not renewable" and "not found".
    words: String,
    code: Option<u16>,
    what: String,
}

impl VaultFailure {
    fn new(e: vaultrs::error::ClientError, what: &str) -> Self {
        let (code, words) = match &e {
            vaultrs::error::ClientError::APIError { code, errors } => {
                (Some(*code), reason(errors).to_ascii_lowercase())
            }
            _ => (None, String::new()),
        };
        Self {
            error: server_error(e),
            words,
            code,
            what: what.to_string(),
        }
    }

    /// The lease or token no longer exists (or never did).
    fn gone(&self) -> bool {
        self.code == Some(404)
            || (self.code == Some(400)
                && ["not found", "invalid lease", "invalid accessor", "expired"]
                    .iter()
                    .any(|w| self.words.contains(w)))
    }

    /// Gone, or Vault will not extend it.
    fn gone_or_fixed(&self) -> bool {
        self.gone() || (self.code == Some(400) && self.words.contains("not renewable"))
    }

    fn into_error(self, not_found: GenerateNotFound) -> GeneratorError {
        let what = &self.what;
        GeneratorError::Backend(match self.error {
            ProviderError::NotFound => match not_found {
                GenerateNotFound::Config => ProviderError::Config(format!(
                    "Vault has no {what} (404): check the generator's path and method"
                )),
                GenerateNotFound::Gone => {
                    ProviderError::Config(format!("Vault found nothing for {what}"))
                }
            },
            ProviderError::PermissionDenied(m) => {
                ProviderError::PermissionDenied(format!("{m} (at {what})"))
            }
            ProviderError::Unavailable(m) => ProviderError::Unavailable(format!("{m} (at {what})")),
            ProviderError::Throttled(m) => ProviderError::Throttled(format!("{m} (at {what})")),
            ProviderError::Timeout(m) => ProviderError::Timeout(format!("{m} (at {what})")),
            ProviderError::Config(m) => ProviderError::Config(format!("{m} (at {what})")),
            ProviderError::TooLarge(m) => ProviderError::TooLarge(format!("{m} (at {what})")),
            other => other,
        })
    }
}

#[cfg(test)]
#[path = "vault_tests.rs"]
mod tests;
