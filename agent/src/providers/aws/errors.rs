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
use futures::StreamExt;
use http_body_util::{BodyStream, StreamBody};

use super::super::{MAX_RESPONSE_BYTES, ProviderError};
use crate::json;
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
        SdkError::ResponseError(_) if refusal(&err).is_some() => {
            let why = refusal(&err).map(ToString::to_string).unwrap_or_default();
            ProviderError::TooLarge(format!("{op}: the answer {why}"))
        }
        // An error body the protocol parser cannot read (moto answers Parameter Store's JSON
        // protocol with XML errors, a proxy with HTML): the HTTP status still says what happened.
        SdkError::ResponseError(e) => match e.raw().status().as_u16() {
            status @ (401 | 403) => ProviderError::PermissionDenied(format!(
                "{op}: HTTP {status}, unreadable error response"
            )),
            429 => ProviderError::Throttled(format!("{op}: HTTP 429, unreadable error response")),
            _ => ProviderError::Unavailable(format!("{op}: unreadable response from AWS")),
        },
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

/// Why reading the body stopped at [`BodyLimit`]'s count of JSON keys or the parse budget.
fn refusal<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a json::Refused> {
    std::iter::successors(Some(e), |e| e.source()).find_map(|e| e.downcast_ref::<json::Refused>())
}

/// Caps every response body the SDK reads (Secrets Manager and STS) at
/// [`MAX_RESPONSE_BYTES`], checked as it arrives: `endpoint` may name a server a tenant runs.
/// Secrets Manager answers JSON, whose keys and elements are counted as well
/// ([`json::Counter`]: a `BatchGetSecretValue` of a million entries would be a million
/// structs) and whose bytes are held, twice, in the node's parse budget while they arrive.
#[derive(Debug)]
pub(super) struct BodyLimit {
    json: bool,
}

impl BodyLimit {
    /// For Secrets Manager (JSON answers).
    pub(super) const JSON: Self = Self { json: true };
    /// For STS (XML answers): the byte cap only.
    pub(super) const XML: Self = Self { json: false };
}

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
        let body = http_body_util::Limited::new(response.take_body(), MAX_RESPONSE_BYTES);
        *response.body_mut() = if self.json {
            let mut keys = json::Counter::default();
            let mut held = json::Budget::node().hold(0)?;
            let frames = BodyStream::new(body).map(move |frame| {
                let frame = frame?;
                if let Some(data) = frame.data_ref() {
                    keys.feed(data)?;
                    held.grow(2 * data.len())?;
                }
                Ok::<_, BoxError>(frame)
            });
            SdkBody::from_body_1_x(StreamBody::new(frames))
        } else {
            SdkBody::from_body_1_x(body)
        };
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
        "ResourceNotFoundException" | "ParameterNotFound" | "ParameterVersionNotFound" => {
            ProviderError::NotFound
        }
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

    /// A tenant's endpoint answering GetSecretValue with a million tiny JSON keys (14 MB) is
    /// refused while the answer arrives, as TooLarge, naming neither key nor value.
    #[tokio::test]
    async fn a_json_answer_of_a_million_keys_is_refused_as_it_arrives() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        crate::tls::install_crypto_provider();
        let members: Vec<String> = (0..1_000_000)
            .map(|i| format!("\"k{i:06}\":\"v\""))
            .collect();
        let body = format!("{{{}}}", members.join(","));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut request = [0u8; 64 << 10];
                    let _ = stream.read(&mut request).await;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.1\r\n\
                         content-length: {}\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(head.as_bytes()).await;
                    let _ = stream.write_all(body.as_bytes()).await;
                });
            }
        });
        let conf = aws_sdk_secretsmanager::Config::builder()
            .interceptor(BodyLimit::JSON)
            .behavior_version(aws_sdk_secretsmanager::config::BehaviorVersion::latest())
            .region(aws_sdk_secretsmanager::config::Region::new("us-east-1"))
            .credentials_provider(aws_credential_types::Credentials::new(
                "AKIDTEST", "secret", None, None, "test",
            ))
            .retry_config(aws_sdk_secretsmanager::config::retry::RetryConfig::disabled())
            .endpoint_url(url)
            .build();
        let client = aws_sdk_secretsmanager::Client::from_conf(conf);
        let err = client
            .get_secret_value()
            .secret_id("app/db")
            .send()
            .await
            .unwrap_err();
        let err = map_err("GetSecretValue", err);
        assert!(matches!(&err, ProviderError::TooLarge(_)), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("GetSecretValue: the answer holds more than 10000 JSON keys"),
            "{text}"
        );
        assert!(!text.contains("k000"), "{text}");
    }
}
