//! Vault's HTTP transport: vaultrs' request definitions (paths, query, bodies) and response
//! types, sent through a reqwest client of our own that reads every response body in chunks
//! and stops at [`MAX_RESPONSE_BYTES`]. A store may point at any Vault URL, including one a
//! tenant runs: an endless or huge answer must fail the request, not exhaust the agent's
//! memory (vaultrs' own client buffers whole bodies).
//!
//! `anyhow` appears here only because rustify's error type carries it.

use async_trait::async_trait;
use rustify::Endpoint;
use rustify::errors::ClientError as RestError;
use vaultrs::api::{AuthInfo, EndpointError, EndpointMiddleware, EndpointResult};
use vaultrs::error::ClientError;

use super::super::MAX_RESPONSE_BYTES;

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
    pub async fn data<E: Endpoint>(&self, endpoint: E) -> Result<E::Response, ClientError> {
        self.envelope(endpoint)
            .await?
            .data
            .ok_or(ClientError::ResponseDataEmptyError)
    }

    /// Runs `endpoint`, whose response type is the whole answer (KV v1).
    pub async fn raw<E: Endpoint>(&self, endpoint: E) -> Result<E::Response, ClientError> {
        endpoint
            .with_middleware(&self.middle)
            .exec(&self.http)
            .await
            .map_err(api_error)?
            .parse()
            .map_err(ClientError::from)
    }

    /// Runs a login `endpoint` and returns the token it issued.
    pub async fn login<E: Endpoint<Response = ()>>(
        &self,
        endpoint: E,
    ) -> Result<AuthInfo, ClientError> {
        self.envelope(endpoint)
            .await?
            .auth
            .ok_or(ClientError::ResponseEmptyError)
    }

    /// Runs `endpoint` and parses Vault's envelope (`data`, `auth`, ...).
    async fn envelope<E: Endpoint>(
        &self,
        endpoint: E,
    ) -> Result<EndpointResult<E::Response>, ClientError> {
        endpoint
            .with_middleware(&self.middle)
            .exec(&self.http)
            .await
            .map_err(api_error)?
            .wrap::<EndpointResult<_>>()
            .map_err(ClientError::from)
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
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| RestError::ResponseError { source: e.into() })?
        {
            if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        out.body(body)
            .map_err(|e| RestError::ResponseError { source: e.into() })
    }
}
