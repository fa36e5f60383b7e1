//! A plugin's gRPC status as a [`ProviderError`], with the same codes as built-in providers.
//! Every message names the plugin endpoint (the publish error adds the store); the plugin's own
//! text is escaped and bounded, since a tenant may run the plugin.

use std::error::Error;
use std::time::Duration;

use tonic::{Code, Status};

use super::super::{MAX_RESPONSE_BYTES, ProviderError};
use crate::grpc_code::name;
use crate::telemetry::escape::printable;

/// Longest part of a plugin's message that reaches an error.
const MAX_MESSAGE_CHARS: usize = 200;

/// Who was called, for messages: a plugin, or a Secrets Store CSI Driver provider.
pub(crate) struct Callee<'a> {
    /// Names it, e.g. `plugin unix:///run/p/x.sock`.
    pub what: &'a str,
    /// The RPC called, for an UNIMPLEMENTED answer.
    pub rpc: &'a str,
    /// The store field that sets the timeout, e.g. `plugin.timeout`.
    pub timeout_field: &'a str,
}

/// How a failed call is reported, and whether another attempt may help.
pub(crate) struct Failure {
    /// The error, if this was the last attempt.
    pub error: ProviderError,
    /// True for transport failures (connection refused, reset, plugin gone mid-call) and
    /// `UNAVAILABLE`: the only ones retried.
    pub retry: bool,
}

/// The store's `timeout` ran out during a call to the plugin at `at`.
pub(crate) fn timed_out(at: &str, rpc: &str, timeout: Duration) -> Failure {
    let what = format!("plugin {at}");
    timed_out_of(
        &Callee {
            what: &what,
            rpc,
            timeout_field: "plugin.timeout",
        },
        timeout,
    )
}

/// Maps the status of a failed call of `rpc` to the plugin at `at` (the endpoint as written),
/// made with the store's `timeout`.
pub(crate) fn failure(at: &str, rpc: &str, timeout: Duration, status: &Status) -> Failure {
    let what = format!("plugin {at}");
    failure_of(
        &Callee {
            what: &what,
            rpc,
            timeout_field: "plugin.timeout",
        },
        timeout,
        status,
    )
}

/// The store's `timeout` ran out during a call to `callee`.
pub(crate) fn timed_out_of(callee: &Callee<'_>, timeout: Duration) -> Failure {
    Failure {
        error: ProviderError::Timeout(format!(
            "{} did not answer within {} (the store's {})",
            callee.what,
            humantime::format_duration(timeout),
            callee.timeout_field
        )),
        retry: false,
    }
}

/// Maps the status of a failed call to `callee`, made with the store's `timeout`.
pub(crate) fn failure_of(callee: &Callee<'_>, timeout: Duration, status: &Status) -> Failure {
    let at = callee.what;
    // Refused by the agent before decoding (too many entries, no parse budget): no retry, the
    // same answer would come back.
    if let Some(error) = super::super::grpc_answer::refusal(status, at) {
        return Failure {
            error,
            retry: false,
        };
    }
    let message = printable(status.message(), MAX_MESSAGE_CHARS);
    // A status with a source was made by the client: the call's own deadline (the
    // `grpc-timeout` it sends, enforced by the channel too), or a transport error. One the
    // plugin sent has none.
    if let Some(source) = status.source() {
        if caused_by_timeout(source) {
            return timed_out_of(callee, timeout);
        }
        if let Some(error) = tls_failure(at, source) {
            // Certificates do not change between attempts: no retry.
            return Failure {
                error,
                retry: false,
            };
        }
        return Failure {
            error: ProviderError::Unavailable(format!(
                "{at} unreachable or it failed mid-call: {}",
                chain(source)
            )),
            retry: true,
        };
    }
    let code = status.code();
    // A tonic server answers its deadline (our `grpc-timeout`) with CANCELLED "Timeout
    // expired", and that answer can beat the client's own timer: the same timeout.
    if code == Code::Cancelled && status.message() == "Timeout expired" {
        return timed_out_of(callee, timeout);
    }
    let error = match code {
        Code::NotFound => ProviderError::NotFound,
        Code::PermissionDenied | Code::Unauthenticated => {
            ProviderError::PermissionDenied(format!("{at} answered {}: {message}", name(code)))
        }
        Code::DeadlineExceeded => {
            ProviderError::Timeout(format!("{at} answered DEADLINE_EXCEEDED: {message}"))
        }
        // tonic's own check of the response size (`max_decoding_message_size`).
        Code::OutOfRange
            if status
                .message()
                .contains("decoded message length too large") =>
        {
            ProviderError::Unavailable(format!(
                "{at} sent a response larger than the {} MiB limit",
                MAX_RESPONSE_BYTES >> 20
            ))
        }
        Code::ResourceExhausted => {
            ProviderError::Throttled(format!("{at} answered RESOURCE_EXHAUSTED: {message}"))
        }
        Code::Unimplemented => ProviderError::Config(format!(
            "{at} does not serve {} (UNIMPLEMENTED: {message})",
            callee.rpc
        )),
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            ProviderError::Config(format!(
                "{at} refused the request: {}: {message}",
                name(code)
            ))
        }
        Code::Unavailable => {
            ProviderError::Unavailable(format!("{at} answered UNAVAILABLE: {message}"))
        }
        _ => ProviderError::Unavailable(format!("{at} failed: {}: {message}", name(code))),
    };
    Failure {
        retry: code == Code::Unavailable,
        error,
    }
}

/// A TLS handshake failure in `error`'s chain, told apart by rustls' messages: our side refusing
/// the plugin's certificate (`plugin.tls.caBundle`), or the plugin refusing ours (an alert).
fn tls_failure(at: &str, error: &(dyn Error + 'static)) -> Option<ProviderError> {
    tls_failure_in(at, &chain(error))
}

/// [`tls_failure`] of a text (a transport error's, or a TLS probe's), escaped and bounded here.
pub(super) fn tls_failure_in(at: &str, text: &str) -> Option<ProviderError> {
    let text = printable(text, MAX_MESSAGE_CHARS);
    if text.contains("invalid peer certificate") {
        return Some(ProviderError::Unavailable(format!(
            "{at}: TLS handshake failed, the plugin's certificate is not trusted ({text}); \
             plugin.tls.caBundle must hold the CA that signed it, for the endpoint's host name"
        )));
    }
    if text.contains("received fatal alert") {
        return Some(ProviderError::PermissionDenied(format!(
            "{at}: TLS handshake failed, the plugin refused the connection ({text}); check the \
             client certificate of plugin.tls.clientCertSecretRef"
        )));
    }
    None
}

/// Whether `error` or one of its causes is tonic's client-side deadline.
fn caused_by_timeout(error: &(dyn Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<tonic::TimeoutExpired>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// A transport error and its causes, escaped and bounded.
fn chain(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        text.push_str(": ");
        text.push_str(&e.to_string());
        next = e.source();
    }
    printable(&text, MAX_MESSAGE_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_like_built_in_providers() {
        let at = "unix:///run/p/x.sock";
        let f = |s: Status| failure(at, "x/GetSecret", Duration::from_secs(1), &s);
        assert!(matches!(
            f(Status::not_found("x")).error,
            ProviderError::NotFound
        ));
        assert!(matches!(
            f(Status::permission_denied("no")).error,
            ProviderError::PermissionDenied(_)
        ));
        assert!(matches!(
            f(Status::unauthenticated("no")).error,
            ProviderError::PermissionDenied(_)
        ));
        assert!(matches!(
            f(Status::deadline_exceeded("slow")).error,
            ProviderError::Timeout(_)
        ));
        // A tonic plugin's answer to our grpc-timeout is the timeout too.
        let expired = f(Status::cancelled("Timeout expired"));
        assert!(matches!(expired.error, ProviderError::Timeout(ref m) if m.contains("within 1s")));
        assert!(!expired.retry);
        let unavailable = f(Status::unavailable("down"));
        assert!(unavailable.retry);
        assert!(matches!(unavailable.error, ProviderError::Unavailable(_)));
        assert!(!f(Status::not_found("x")).retry);
        assert!(!f(Status::permission_denied("x")).retry);
        let huge = f(Status::out_of_range(
            "Error, decoded message length too large: found 17000000 bytes, the limit is: 16777216 bytes",
        ));
        assert!(
            matches!(huge.error, ProviderError::Unavailable(ref m) if m.contains("16 MiB limit"))
        );
        let other = f(Status::data_loss("bad\n\x1b[31mforged log line"));
        let text = other.error.to_string();
        assert!(text.contains("DATA_LOSS") && text.contains(at), "{text}");
        assert!(!text.chars().any(char::is_control), "{text:?}");
    }
}
