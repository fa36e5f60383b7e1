//! `PluginGenerator`: an out-of-tree generator, `latchkey.plugin.v1` `Generate` and `Cleanup`.
//!
//! Everything but the two calls is the `plugin` store provider's: the endpoint rules (a socket
//! directly in `--plugin-socket-dir`, never through a link; TLS on TCP), the shared channel and
//! its handshake, the caller's identity with only the tokens of `plugin.audiences`, the timeout,
//! and the answer bounds (counted before decoding, at most 16 MiB). A plugin serving only
//! Crossplane's ESS protocol cannot generate.
//!
//! Generate is never retried: a call that failed mid-way may still have made a credential, and
//! a second call would make another. Cleanup is idempotent by contract, so it is retried like a
//! read, and NOT_FOUND counts as done.
//!
//! The plugin's `state` goes into a GeneratorState, which tenants can read and edit: it must be
//! a JSON object of at most [`MAX_STATE_BYTES`]. An answer that breaks a rule after the plugin
//! made its credential (a state too large or not JSON, no values, bad keys or TTL) is refused,
//! and Cleanup is called at once with the state as sent, so that nothing is left behind; an
//! answer refused before decoding (too many entries, too many bytes) has no state to clean up
//! with, and its credential is left to the plugin.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use csi_proto::latchkey_plugin::v1 as lk;
use tonic::{Code, Status};

use super::{Generated, Generator, GeneratorError, Lease};
use crate::api::generator::PluginGeneratorSpec;
use crate::json;
use crate::providers::grpc_answer;
use crate::providers::plugin::Plugin;
use crate::providers::plugin::socket::Protocol;
use crate::providers::plugin::status::{self, Failure};
use crate::providers::{BuildContext, ProviderError};
use crate::secret::SecretBytes;
use crate::telemetry::escape::printable;

/// Largest `state` a plugin may answer (and Cleanup may be sent): an id or two, not a value.
pub const MAX_STATE_BYTES: usize = 4 << 10;

/// Longest key of a generated value, as a Kubernetes Secret's.
const MAX_KEY_LEN: usize = 253;

/// Attempts after the first for Cleanup (transport failures and UNAVAILABLE only), as reads.
const CLEANUP_RETRIES: u32 = 2;

const GENERATE_RPC: &str = "latchkey.plugin.v1.SecretStorePlugin/Generate";
const CLEANUP_RPC: &str = "latchkey.plugin.v1.SecretStorePlugin/Cleanup";

/// Generate's answer is counted before it is decoded: its `values` map is at the top.
const GENERATE: grpc_answer::Method = grpc_answer::Method {
    path: "/latchkey.plugin.v1.SecretStorePlugin/Generate",
    service: "latchkey.plugin.v1.SecretStorePlugin",
    method: "Generate",
    nested: &[],
};
const CLEANUP: grpc_answer::Method = grpc_answer::Method {
    path: "/latchkey.plugin.v1.SecretStorePlugin/Cleanup",
    service: "latchkey.plugin.v1.SecretStorePlugin",
    method: "Cleanup",
    nested: &[],
};

/// A plugin generator for one identity (the pod's, or the one the controller acts as).
pub struct PluginGenerator {
    plugin: Plugin,
    metrics: std::sync::Arc<crate::telemetry::Metrics>,
}

impl std::fmt::Debug for PluginGenerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The endpoint only: the caller holds tokens.
        f.debug_struct("PluginGenerator")
            .field("endpoint", &self.plugin.at())
            .finish_non_exhaustive()
    }
}

/// What one call got past the transport: the answer, or the reason it cannot be had from this
/// plugin (it lacks the RPC), which no retry changes.
type Served<T> = Result<T, GeneratorError>;

impl PluginGenerator {
    /// Checks the endpoint, reads the TLS material, takes the shared channel and the caller's
    /// identity, exactly as the store provider does; nothing is sent yet.
    pub async fn new(
        spec: &PluginGeneratorSpec,
        ctx: &BuildContext<'_>,
    ) -> Result<Self, GeneratorError> {
        Ok(Self {
            plugin: Plugin::new(&spec.provider, ctx).await?,
            metrics: std::sync::Arc::clone(&ctx.env.metrics),
        })
    }

    /// Counts one call in the backend metrics, as the store providers' calls are.
    fn count<T>(&self, operation: &'static str, result: &Result<T, GeneratorError>) {
        let labels = crate::telemetry::metrics::BackendLabels {
            provider: "plugin",
            operation,
            result: result
                .as_ref()
                .err()
                .map_or("success", GeneratorError::kind),
        };
        self.metrics.backend_requests.get_or_create(&labels).inc();
    }

    /// The error for a plugin without `rpc` (`Generate` or `Cleanup`); `why` adds the reason
    /// when it is known.
    fn unimplemented(&self, rpc: &str, why: &str) -> GeneratorError {
        GeneratorError::Unimplemented(format!(
            "plugin at {} does not implement {rpc} (latchkey.plugin.v1){why}",
            self.plugin.at()
        ))
    }

    /// The handshake, for a call that needs latchkey.plugin.v1.
    async fn latchkey_protocol(&self, rpc: &str) -> Result<Served<()>, Failure> {
        Ok(match self.plugin.protocol().await? {
            Protocol::Latchkey => Ok(()),
            Protocol::Ess => Err(self.unimplemented(
                rpc,
                ": it serves only ess.proto.v1alpha1, which has no generators",
            )),
        })
    }

    /// Maps a failed call's status; UNIMPLEMENTED from the plugin itself (no source: not made
    /// by the client) is the plugin lacking `rpc`.
    fn failed<T>(&self, rpc: &str, full_rpc: &str, status: &Status) -> Result<Served<T>, Failure> {
        if status.code() == Code::Unimplemented && std::error::Error::source(status).is_none() {
            return Ok(Err(self.unimplemented(rpc, "")));
        }
        Err(status::failure(
            self.plugin.at(),
            full_rpc,
            self.plugin.timeout(),
            status,
        ))
    }

    /// One Generate call as the caller, bounded by the timeout; the answer with its hold on
    /// the node's parse budget.
    async fn generate_once(
        &self,
    ) -> Result<Served<(lk::GenerateResponse, json::Held<'static>)>, Failure> {
        if let Err(e) = self.latchkey_protocol("Generate").await? {
            return Ok(Err(e));
        }
        let timeout = self.plugin.timeout();
        let mut request = tonic::Request::new(lk::GenerateRequest {
            config: self.plugin.lk_config(),
            caller: Some(self.plugin.caller()),
        });
        request.set_timeout(timeout);
        let call = grpc_answer::unary::<_, lk::GenerateResponse>(
            self.plugin.channel(),
            &GENERATE,
            request,
        );
        match tokio::time::timeout(timeout, call).await {
            Err(_) => Err(status::timed_out(self.plugin.at(), GENERATE_RPC, timeout)),
            Ok(Err(s)) => self.failed("Generate", GENERATE_RPC, &s),
            Ok(Ok(answer)) => {
                let counted = answer.into_inner();
                Ok(Ok((counted.value, counted.held)))
            }
        }
    }

    /// One Cleanup call with `state` (JSON bytes); NOT_FOUND is success (already gone).
    async fn cleanup_once(&self, state: &[u8]) -> Result<Served<()>, Failure> {
        if let Err(e) = self.latchkey_protocol("Cleanup").await? {
            return Ok(Err(e));
        }
        let timeout = self.plugin.timeout();
        let mut request = tonic::Request::new(lk::CleanupRequest {
            config: self.plugin.lk_config(),
            caller: Some(self.plugin.caller()),
            state: state.to_vec(),
        });
        request.set_timeout(timeout);
        let call =
            grpc_answer::unary::<_, lk::CleanupResponse>(self.plugin.channel(), &CLEANUP, request);
        match tokio::time::timeout(timeout, call).await {
            Err(_) => Err(status::timed_out(self.plugin.at(), CLEANUP_RPC, timeout)),
            Ok(Err(s)) if s.code() == Code::NotFound && std::error::Error::source(&s).is_none() => {
                Ok(Ok(()))
            }
            Ok(Err(s)) => self.failed("Cleanup", CLEANUP_RPC, &s),
            Ok(Ok(_)) => Ok(Ok(())),
        }
    }

    /// Cleanup with `state` as bytes, retried like a read.
    async fn cleanup_bytes(&self, state: &[u8]) -> Result<(), GeneratorError> {
        self.plugin
            .with_retries_up_to(CLEANUP_RETRIES, || self.cleanup_once(state))
            .await?
    }

    /// Turns Generate's answer into a [`Generated`], or refuses it (see the module comment):
    /// the values move into [`SecretBytes`] first, so that they are wiped whatever happens.
    /// `held` (the answer's share of the parse budget) is let go once it is converted, before
    /// any Cleanup call.
    async fn accept(
        &self,
        answer: lk::GenerateResponse,
        held: json::Held<'static>,
    ) -> Result<Generated, GeneratorError> {
        let lk::GenerateResponse {
            values,
            state,
            ttl_seconds,
            renewable,
        } = answer;
        let values: BTreeMap<String, SecretBytes> = values
            .into_iter()
            .map(|(k, v)| (k, SecretBytes::new(v)))
            .collect();
        let checked = check_values(&values)
            .and_then(|()| parse_state(&state))
            .and_then(|parsed| Ok((parsed, lease(ttl_seconds, renewable)?)));
        drop(held);
        match checked {
            Ok((state, lease)) => {
                tracing::debug!(
                    plugin = %self.plugin.at(),
                    keys = values.len(),
                    ttl = ?lease.map(|l| l.ttl),
                    "plugin generated a value"
                );
                Ok(Generated {
                    values,
                    state,
                    lease,
                })
            }
            Err(why) => Err(self.refuse(&why, &state).await),
        }
    }

    /// The error for an answer refused for `why`, after cleaning up what it made (when it
    /// named a state to clean up with).
    async fn refuse(&self, why: &str, state: &[u8]) -> GeneratorError {
        let at = self.plugin.at();
        let outcome = if state.is_empty() {
            "it named no state, so the credential it made (if any) is left to the plugin".to_owned()
        } else {
            match self.cleanup_bytes(state).await {
                Ok(()) => "the credential it made was cleaned up (Cleanup with the state as sent)"
                    .to_owned(),
                Err(e) => {
                    tracing::warn!(plugin = %at, error = %e, "cleanup of a refused Generate answer failed");
                    format!("Cleanup of the credential it made failed too: {e}")
                }
            }
        };
        GeneratorError::Backend(ProviderError::Unavailable(format!(
            "plugin at {at}: Generate's answer refused: {why}; {outcome}"
        )))
    }
}

/// At least one value, each under a key a Kubernetes Secret accepts.
fn check_values(values: &BTreeMap<String, SecretBytes>) -> Result<(), String> {
    if values.is_empty() {
        return Err("it holds no values".into());
    }
    for key in values.keys() {
        let fits = !key.is_empty()
            && key.len() <= MAX_KEY_LEN
            && key != "."
            && key != ".."
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !fits {
            return Err(format!(
                "value key {:?} is not one a Kubernetes Secret accepts (letters, digits, '-', \
                 '_', '.'; at most {MAX_KEY_LEN})",
                printable(key, 64)
            ));
        }
    }
    Ok(())
}

/// The state to record: none when empty, else a JSON object of at most [`MAX_STATE_BYTES`].
/// Messages never quote it: a careless plugin may have put a secret there.
fn parse_state(state: &[u8]) -> Result<Option<serde_json::Value>, String> {
    if state.is_empty() {
        return Ok(None);
    }
    if state.len() > MAX_STATE_BYTES {
        return Err(format!(
            "its state is {} bytes, more than the {MAX_STATE_BYTES} allowed (a state names \
             what Cleanup needs, an id or two)",
            state.len()
        ));
    }
    json::check(state).map_err(|why| format!("its state {why}"))?;
    match serde_json::from_slice::<serde_json::Value>(state) {
        Ok(value @ serde_json::Value::Object(_)) => Ok(Some(value)),
        _ => Err(format!(
            "its state ({} bytes) is not a JSON object, which a GeneratorState requires",
            state.len()
        )),
    }
}

/// The lease `ttl_seconds` describes, if any.
fn lease(ttl_seconds: Option<i64>, renewable: bool) -> Result<Option<Lease>, String> {
    match ttl_seconds {
        None => Ok(None),
        Some(s) if s > 0 => Ok(Some(Lease {
            // Positive, so the conversion holds.
            ttl: Duration::from_secs(u64::try_from(s).unwrap_or(u64::MAX)),
            renewable,
        })),
        Some(s) => Err(format!("ttl_seconds is {s}, not a positive number")),
    }
}

#[async_trait]
impl Generator for PluginGenerator {
    async fn generate(&self) -> Result<Generated, GeneratorError> {
        // No retry (see the module comment); a transport failure still resets the handshake.
        let called = self
            .plugin
            .with_retries_up_to(0, || self.generate_once())
            .await;
        let served = match called {
            Ok(served) => served,
            Err(e) => Err(GeneratorError::from(e)),
        };
        self.count("generate", &served);
        let (answer, held) = served?;
        self.accept(answer, held).await
    }

    /// latchkey.plugin.v1 has no Renew: a new value is generated instead.
    async fn renew(&self, _state: &serde_json::Value) -> Result<Option<Lease>, GeneratorError> {
        Ok(None)
    }

    async fn cleanup(&self, state: &serde_json::Value) -> Result<(), GeneratorError> {
        // A GeneratorState is tenant-editable: bounded as an answer's state is.
        let bytes = serde_json::to_vec(state)
            .map_err(|_| GeneratorError::Invalid("the state is not serializable".into()))?;
        if bytes.len() > MAX_STATE_BYTES {
            return Err(GeneratorError::Invalid(format!(
                "the GeneratorState's state is {} bytes, more than the {MAX_STATE_BYTES} a \
                 plugin generator's state may have: not one Latchkey recorded",
                bytes.len()
            )));
        }
        let cleaned = self.cleanup_bytes(&bytes).await;
        self.count("cleanup", &cleaned);
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_checked_without_quoting_them() {
        let v = |keys: &[&str]| -> BTreeMap<String, SecretBytes> {
            keys.iter()
                .map(|k| (k.to_string(), SecretBytes::new(b"gen-secret-1".to_vec())))
                .collect()
        };
        assert!(check_values(&v(&["username", "password", "tls.crt", "a_b-c"])).is_ok());
        assert!(check_values(&v(&[])).unwrap_err().contains("no values"));
        for bad in ["", ".", "..", "a/b", "x\ny", &"k".repeat(254)] {
            assert!(check_values(&v(&[bad])).is_err(), "{bad:?}");
        }

        assert_eq!(parse_state(b"").unwrap(), None);
        assert_eq!(
            parse_state(br#"{"account":"acct-1"}"#).unwrap(),
            Some(serde_json::json!({"account": "acct-1"}))
        );
        let secret_state = br#"not json gen-secret-1"#;
        let err = parse_state(secret_state).unwrap_err();
        assert!(
            err.contains("not a JSON object") && !err.contains("gen-secret-1"),
            "{err}"
        );
        assert!(parse_state(br#"["acct-1"]"#).is_err());
        assert!(parse_state(b"\"acct-1\"").is_err());
        let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(MAX_STATE_BYTES));
        assert!(parse_state(big.as_bytes()).unwrap_err().contains("4096"));
        let deep = format!("{}{}", "[".repeat(40), "]".repeat(40));
        assert!(parse_state(deep.as_bytes()).unwrap_err().contains("deeper"));

        assert_eq!(lease(None, true), Ok(None));
        assert_eq!(
            lease(Some(90), true),
            Ok(Some(Lease {
                ttl: Duration::from_secs(90),
                renewable: true
            }))
        );
        assert!(lease(Some(0), false).is_err() && lease(Some(-5), false).is_err());
    }
}
