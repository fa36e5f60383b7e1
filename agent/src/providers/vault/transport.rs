//! Vault's HTTP transport: vaultrs' request definitions (paths, query, bodies) and response
//! types, sent through a reqwest client of our own that reads every response body in chunks
//! and stops at [`MAX_RESPONSE_BYTES`]. A store may point at any Vault URL, including one a
//! tenant runs: an endless or huge answer must fail the request, not exhaust the agent's
//! memory (vaultrs' own client buffers whole bodies). As the chunks arrive, their JSON keys are
//! counted ([`json::Counter`]) and their bytes held in the node's budget of answers being
//! parsed ([`json::Budget`]), twice: the text, and the tree vaultrs builds from it. The hold
//! travels with the parsed answer ([`Answer`]) until the caller has converted it.
//!
//! `anyhow` appears here only because rustify's error type carries it.

use async_trait::async_trait;
use rustify::Endpoint;
use rustify::errors::ClientError as RestError;
use vaultrs::api::{AuthInfo, EndpointError, EndpointMiddleware, EndpointResult};
use vaultrs::error::ClientError;

use super::super::MAX_RESPONSE_BYTES;
use crate::json;

/// The answer was larger than [`MAX_RESPONSE_BYTES`].
#[derive(Debug, thiserror::Error)]
#[error("Vault's answer is larger than {MAX_RESPONSE_BYTES} bytes")]
pub struct BodyTooLarge;

/// True when `e` is a response cut off at [`MAX_RESPONSE_BYTES`].
pub fn is_too_large(e: &ClientError) -> bool {
    matches!(e, ClientError::RestClientError {
        source: RestError::ResponseError { source }
    } if source.downcast_ref::<BodyTooLarge>().is_some())
}

/// Why `e` is a response refused while it arrived (too many keys, too deep, no budget).
pub fn refusal(e: &ClientError) -> Option<&json::Refused> {
    match e {
        ClientError::RestClientError {
            source: RestError::ResponseError { source },
        } => source.downcast_ref::<json::Refused>(),
        _ => None,
    }
}

/// A parsed answer and the node budget its bytes hold: drop it once converted.
pub struct Answer<T> {
    /// What Vault answered.
    pub value: T,
    /// The answer's share of [`json::Budget::node`].
    pub held: Option<Held>,
}

/// An answer's hold on the node's budget, carried from the transport to the caller in the
/// response's extensions (which want `Clone`).
#[derive(Clone)]
pub struct Held(std::sync::Arc<json::Held<'static>>);

impl Held {
    /// Bytes of the answer's text (half what it holds).
    pub fn answer_len(&self) -> usize {
        self.0.bytes() / 2
    }
}

/// A bounded HTTP client for one Vault server, with the token and namespace headers. Cheap to
/// clone (the connection pool is shared).
#[derive(Clone)]
pub struct Transport {
    http: Bounded,
    middle: EndpointMiddleware,
}

impl Transport {
    /// A transport for `base` (the server URL) with vaultrs' middleware (API version, token,
    /// namespace header).
    pub fn new(http: reqwest::Client, base: &str, middle: EndpointMiddleware) -> Self {
        Self {
            http: Bounded {
                http,
                base: base.to_string(),
            },
            middle,
        }
    }

    /// Sends requests with this token from now on.
    pub fn set_token(&mut self, token: &str) {
        self.middle.token = token.to_string();
    }

    /// Runs `endpoint` and returns its `data` (Vault's envelope stripped).
    pub async fn data<E: Endpoint>(&self, endpoint: E) -> Result<Answer<E::Response>, ClientError> {
        let answer = self.envelope(endpoint).await?;
        Ok(Answer {
            value: answer
                .value
                .data
                .ok_or(ClientError::ResponseDataEmptyError)?,
            held: answer.held,
        })
    }

    /// Runs `endpoint`, whose response type is the whole answer (KV v1).
    pub async fn raw<E: Endpoint>(&self, endpoint: E) -> Result<Answer<E::Response>, ClientError> {
        let mut response = endpoint
            .with_middleware(&self.middle)
            .exec(&self.http)
            .await
            .map_err(api_error)?;
        let held = response.response.extensions_mut().remove::<Held>();
        let value = response.parse().map_err(ClientError::from)?;
        Ok(Answer { value, held })
    }

    /// Runs a login `endpoint` and returns the token it issued.
    pub async fn login<E: Endpoint<Response = ()>>(
        &self,
        endpoint: E,
    ) -> Result<AuthInfo, ClientError> {
        self.envelope(endpoint)
            .await?
            .value
            .auth
            .ok_or(ClientError::ResponseEmptyError)
    }

    /// Runs `endpoint` and parses Vault's envelope (`data`, `auth`, ...).
    async fn envelope<E: Endpoint>(
        &self,
        endpoint: E,
    ) -> Result<Answer<EndpointResult<E::Response>>, ClientError> {
        let mut response = endpoint
            .with_middleware(&self.middle)
            .exec(&self.http)
            .await
            .map_err(api_error)?;
        let held = response.response.extensions_mut().remove::<Held>();
        let value = response
            .wrap::<EndpointResult<_>>()
            .map_err(ClientError::from)?;
        Ok(Answer { value, held })
    }
}

/// Any Vault API call: a method, a path below `/v1/`, an optional query string and JSON body.
/// For requests vaultrs has no definition of (a generator's path, lease renewal, revocation).
pub struct Call {
    /// HTTP method (`LIST` included).
    pub method: rustify::enums::RequestMethod,
    /// Path below `/v1/`; each segment is percent-encoded by rustify.
    pub path: String,
    /// Query string, already encoded.
    pub query: Option<String>,
    /// JSON body.
    pub body: Option<Vec<u8>>,
}

impl Endpoint for Call {
    type Response = serde_json::Value;
    const REQUEST_BODY_TYPE: rustify::enums::RequestType = rustify::enums::RequestType::JSON;
    const RESPONSE_BODY_TYPE: rustify::enums::ResponseType = rustify::enums::ResponseType::JSON;

    fn path(&self) -> String {
        self.path.clone()
    }

    fn method(&self) -> rustify::enums::RequestMethod {
        self.method.clone()
    }

    fn query(&self) -> Result<Option<String>, RestError> {
        Ok(self.query.clone())
    }

    fn body(&self) -> Result<Option<Vec<u8>>, RestError> {
        Ok(self.body.clone())
    }
}

impl Transport {
    /// Runs `call` and returns Vault's whole answer, `None` when it has no body (204). The
    /// body is parsed here, not by rustify, whose parse errors would carry the answer's text
    /// (it may hold a private key).
    pub async fn json(&self, call: Call) -> Result<Answer<Option<serde_json::Value>>, ClientError> {
        let mut response = call
            .with_middleware(&self.middle)
            .exec(&self.http)
            .await
            .map_err(api_error)?;
        let held = response.response.extensions_mut().remove::<Held>();
        let body = response.response.body();
        let value = if body.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            Some(
                serde_json::from_slice(body)
                    .map_err(|source| ClientError::JsonParseError { source })?,
            )
        };
        Ok(Answer { value, held })
    }
}

/// `POST auth/token/renew-self`: extends the calling token's lease. Defined here because
/// vaultrs' own request has a tab in its path.
pub struct RenewSelf;

impl Endpoint for RenewSelf {
    type Response = ();
    const REQUEST_BODY_TYPE: rustify::enums::RequestType = rustify::enums::RequestType::JSON;
    const RESPONSE_BODY_TYPE: rustify::enums::ResponseType = rustify::enums::ResponseType::JSON;

    fn path(&self) -> String {
        "auth/token/renew-self".into()
    }

    fn method(&self) -> rustify::enums::RequestMethod {
        rustify::enums::RequestMethod::POST
    }

    fn body(&self) -> Result<Option<Vec<u8>>, RestError> {
        Ok(Some(b"{}".to_vec()))
    }
}

/// Vault's `{"errors": [...]}` answer as vaultrs' API error, as vaultrs itself does.
fn api_error(e: RestError) -> ClientError {
    if let RestError::ServerResponseError {
        code,
        content: Some(content),
    } = &e
        && let Ok(parsed) = serde_json::from_str::<EndpointError>(content)
    {
        return ClientError::APIError {
            code: *code,
            errors: parsed.errors,
        };
    }
    ClientError::from(e)
}

/// reqwest with a bounded body read.
#[derive(Clone)]
struct Bounded {
    http: reqwest::Client,
    base: String,
}

#[async_trait]
impl rustify::client::Client for Bounded {
    fn base(&self) -> &str {
        &self.base
    }

    async fn send(
        &self,
        req: http::Request<Vec<u8>>,
    ) -> Result<http::Response<Vec<u8>>, RestError> {
        let too_large = || RestError::ResponseError {
            source: anyhow::Error::new(BodyTooLarge),
        };
        let refused = |why: json::Refused| RestError::ResponseError {
            source: anyhow::Error::new(why),
        };
        let request = reqwest::Request::try_from(req)
            .map_err(|source| RestError::ReqwestBuildError { source })?;
        let (url, method) = (request.url().to_string(), request.method().to_string());
        let mut response =
            self.http
                .execute(request)
                .await
                .map_err(|e| RestError::RequestError {
                    source: e.into(),
                    url,
                    method,
                })?;
        let limit = MAX_RESPONSE_BYTES as u64;
        if response.content_length().is_some_and(|n| n > limit) {
            return Err(too_large());
        }
        let mut out = http::Response::builder().status(response.status().as_u16());
        for (name, value) in response.headers() {
            out = out.header(name, value);
        }
        // Sized from the announced length (already checked) so the buffer does not double.
        let announced = response.content_length().unwrap_or(0) as usize;
        let mut body = Vec::with_capacity(announced);
        let mut keys = json::Counter::default();
        let mut held = json::Budget::node().hold(0).map_err(refused)?;
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| RestError::ResponseError { source: e.into() })?
        {
            if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(too_large());
            }
            keys.feed(&chunk).map_err(refused)?;
            held.grow(2 * chunk.len()).map_err(refused)?;
            body.extend_from_slice(&chunk);
        }
        let mut out = out
            .body(body)
            .map_err(|e| RestError::ResponseError { source: e.into() })?;
        out.extensions_mut().insert(Held(std::sync::Arc::new(held)));
        Ok(out)
    }
}
