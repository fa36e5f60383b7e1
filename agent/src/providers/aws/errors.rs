//! How AWS failures become [`ProviderError`]s, and the cap on every response body the SDK
//! reads. Both exist because a store's `endpoint` may name a server a tenant runs: its error
//! codes and messages are escaped and bounded before they reach a message, and an endless or
//! huge answer fails the request instead of exhausting the agent's memory.
//!
//! Not for deciding whether to retry (the SDK's retry configuration does that) and never given
//! values, keys or tokens: only the operation name, the AWS error code, its message and the HTTP
//! status.

use aws_sdk_secretsmanager::config::http::HttpResponse;
use aws_sdk_secretsmanager::config::interceptors::BeforeDeserializationInterceptorContextMut;
use aws_sdk_secretsmanager::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_secretsmanager::error::{BoxError, ProvideErrorMetadata, SdkError};
use aws_smithy_types::body::SdkBody;

use super::super::{MAX_RESPONSE_BYTES, ProviderError};
use crate::telemetry::escape::printable;

/// An SDK failure as a provider error: the AWS error code and message (never values or keys).
pub(super) fn map_err<E>(op: &str, err: SdkError<E, HttpResponse>) -> ProviderError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match err {
        SdkError::ServiceError(e) => {
            let status = e.raw().status().as_u16();
            let inner = e.into_err();
            code_error(op, inner.code().unwrap_or(""), inner.message(), status)
        }
        SdkError::TimeoutError(_) => ProviderError::Timeout(format!("{op}: no answer in time")),
        SdkError::DispatchFailure(e) => ProviderError::Unavailable(format!(
            "{op}: cannot reach AWS ({})",
            if e.is_timeout() {
                "timeout"
            } else if e.is_io() {
                "connection failed"
            } else {
                "request not sent"
            }
        )),
        SdkError::ResponseError(_) if body_too_large(&err) => ProviderError::Unavailable(format!(
            "{op}: the answer is larger than {MAX_RESPONSE_BYTES} bytes"
        )),
        SdkError::ResponseError(_) => {
            ProviderError::Unavailable(format!("{op}: unreadable response from AWS"))
        }
        SdkError::ConstructionFailure(_) => {
            ProviderError::Config(format!("{op}: cannot build the request"))
        }
        _ => ProviderError::Unavailable(format!("{op}: request failed")),
    }
}

/// True when reading the body stopped at [`BodyLimit`]'s cap.
fn body_too_large(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |e| e.source())
        .any(|e| e.is::<http_body_util::LengthLimitError>())
}

/// Caps every response body the SDK reads (Secrets Manager and STS) at
/// [`MAX_RESPONSE_BYTES`], checked as it arrives: `endpoint` may name a server a tenant runs.
#[derive(Debug)]
pub(super) struct BodyLimit;

impl Intercept for BodyLimit {
    fn name(&self) -> &'static str {
        "LatchkeyBodyLimit"
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let response = context.response_mut();
        let body = response.take_body();
        *response.body_mut() =
            SdkBody::from_body_1_x(http_body_util::Limited::new(body, MAX_RESPONSE_BYTES));
        Ok(())
    }
}

/// An AWS error code as a provider error kind; the HTTP status decides when the code is unknown.
pub(super) fn code_error(
    op: &str,
    code: &str,
    message: Option<&str>,
    status: u16,
) -> ProviderError {
    // Both come from the endpoint, which a ClusterSecretStore may point anywhere: escaped.
    let message = printable(message.unwrap_or(""), 300);
    let code = &printable(code, 100);
    let detail = format!("{op}: {code}: {message}");
    match code.as_str() {
        "ResourceNotFoundException" => ProviderError::NotFound,
        "AccessDeniedException"
        | "AccessDenied"
        | "UnrecognizedClientException"
        | "InvalidClientTokenId"
        | "InvalidSignatureException"
        | "SignatureDoesNotMatch"
        | "ExpiredTokenException"
        | "ExpiredToken"
        | "InvalidIdentityToken"
        | "IDPRejectedClaim"
        | "DecryptionFailure" => ProviderError::PermissionDenied(detail),
        "ThrottlingException"
        | "Throttling"
        | "TooManyRequestsException"
        | "RequestLimitExceeded" => ProviderError::Throttled(detail),
        // Codes the protocol parser could not read: the HTTP status still says what happened.
        _ if status == 401 || status == 403 => ProviderError::PermissionDenied(format!(
            "{op}: HTTP {status} {code}{}",
            if message.is_empty() {
                String::new()
            } else {
                format!(": {message}")
            }
        )),
        _ if status == 429 => ProviderError::Throttled(detail),
        _ if status >= 500 || code.starts_with("InternalService") => {
            ProviderError::Unavailable(detail)
        }
        "InvalidParameterException" | "InvalidRequestException" | "ValidationException" => {
            ProviderError::Config(detail)
        }
        _ => ProviderError::Unavailable(detail),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_map_to_kinds_without_values() {
        assert!(matches!(
            code_error("Get", "ResourceNotFoundException", None, 400),
            ProviderError::NotFound
        ));
        assert!(matches!(
            code_error("Get", "AccessDeniedException", Some("no"), 400),
            ProviderError::PermissionDenied(_)
        ));
        assert!(matches!(
            code_error("Get", "ThrottlingException", None, 400),
            ProviderError::Throttled(_)
        ));
        assert!(matches!(
            code_error("Get", "Whatever", None, 503),
            ProviderError::Unavailable(_)
        ));
    }
}
