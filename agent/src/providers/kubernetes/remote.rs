//! `kubernetes.server`: another cluster's API server, called with the pod's own token for the
//! store's `audience` (never the API server's own audience, never the agent's identity) or a
//! stored token (`auth.token`, read with the rules of credential Secrets), over
//! TLS verified against `caBundle` or `caProvider` only. The server may be anyone's: its answers
//! are bounded in bytes and time, and its messages are scrubbed of the token before they reach
//! an error.

use std::time::Duration;

use base64::Engine as _;
use kube::Client;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::super::{BuildContext, MAX_RESPONSE_BYTES, ProviderError, ca_provider, credentials};
use crate::api::store::{KubernetesProvider, KubernetesServer};
use crate::secret::SecretString;
use crate::telemetry::escape::printable;

/// How long one call to a remote API server may take, answer included.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long connecting (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A client for another cluster's API server and what its errors need: the server's URL,
/// the token sent (scrubbed from the server's messages) and whose token it is.
pub(super) struct Remote {
    pub(super) client: Client,
    pub(super) url: String,
    pub(super) token: SecretString,
    /// `the pod's token for audience "x"` or `the token of credential Secret ns/name[key]`.
    pub(super) whose: String,
}

/// A client for `spec.server` that authenticates with the stored token of `spec.auth`, or else
/// with the pod's token for `spec.audience`.
pub(super) async fn client(
    server: &KubernetesServer,
    spec: &KubernetesProvider,
    ctx: &BuildContext<'_>,
) -> Result<Remote, ProviderError> {
    let uri = url(&server.url)?;
    let (token, whose) = match &spec.auth {
        Some(auth) => {
            let selector = &auth.token.bearer_token;
            let at = credentials::locate(ctx, selector)?;
            let token = credentials::read(ctx, selector).await?;
            let token = SecretString::new(token.expose().trim().to_string());
            (token, format!("the token of credential Secret {at}"))
        }
        None => pod_token(spec.audience.as_deref().unwrap_or(""), ctx)?,
    };
    let roots = roots(server, ctx).await?;
    let mut config = kube::Config::new(uri);
    config.default_namespace = ctx.pod.namespace.clone();
    config.root_cert = Some(roots);
    config.accept_invalid_certs = false;
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(REQUEST_TIMEOUT);
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.expose().to_string().into()),
        ..Default::default()
    };
    Ok(Remote {
        client: super::bounded_client(config)?,
        url: server.url.clone(),
        token,
        whose,
    })
}

/// The pod's token for `audience`, which must be one of the remote server's own.
fn pod_token(
    audience: &str,
    ctx: &BuildContext<'_>,
) -> Result<(SecretString, String), ProviderError> {
    // The schema requires it; a store that never passed an API server is checked here too.
    if audience.is_empty() {
        return Err(ProviderError::Config(
            "kubernetes.server needs an audience: the pod's token for this cluster's own API \
             server never leaves it"
                .into(),
        ));
    }
    let token = ctx.pod.tokens.for_audience(audience).ok_or_else(|| {
        ProviderError::Config(format!(
            "kubelet passed no service-account token for audience {audience:?}: add it to the \
             CSIDriver's tokenRequests"
        ))
    })?;
    Ok((
        SecretString::new(token.token.expose().to_string()),
        format!("the pod's token for audience {audience:?}"),
    ))
}

/// `server.url`, parsed: https, a host, no user information, query or fragment.
fn url(text: &str) -> Result<http::Uri, ProviderError> {
    let bad = || {
        ProviderError::Config(format!(
            "kubernetes.server.url {:?} is not an https:// URL with a host (and no user, query \
             or fragment)",
            printable(text, 200)
        ))
    };
    let uri: http::Uri = text.parse().map_err(|_| bad())?;
    let authority = uri.authority().ok_or_else(bad)?;
    if uri.scheme_str() != Some("https")
        || authority.host().is_empty()
        || authority.as_str().contains('@')
        || uri.query().is_some()
        || text.contains('#')
    {
        return Err(bad());
    }
    Ok(uri)
}

/// The CA certificates (DER) the server's certificate must chain to: the only roots trusted.
async fn roots(
    server: &KubernetesServer,
    ctx: &BuildContext<'_>,
) -> Result<Vec<Vec<u8>>, ProviderError> {
    let (field, pem) = match (&server.ca_bundle, &server.ca_provider) {
        (Some(text), None) => ("kubernetes.server.caBundle", bundle(text)?),
        (None, Some(ca)) => {
            const FIELD: &str = "kubernetes.server.caProvider";
            (FIELD, ca_provider::read(ctx, FIELD, ca).await?)
        }
        _ => {
            return Err(ProviderError::Config(
                "kubernetes.server must set exactly one of caBundle, caProvider".into(),
            ));
        }
    };
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem).collect();
    match certs {
        Ok(certs) if !certs.is_empty() => Ok(certs.into_iter().map(|c| c.to_vec()).collect()),
        _ => Err(ProviderError::Config(format!(
            "{field} holds no valid PEM certificate"
        ))),
    }
}

/// The PEM of `caBundle`: PEM as it is, or base64 of PEM (as ESO writes it).
fn bundle(text: &str) -> Result<Vec<u8>, ProviderError> {
    let text = text.trim();
    if text.starts_with("-----BEGIN") {
        return Ok(text.as_bytes().to_vec());
    }
    // Line breaks are common in pasted base64.
    let compact: String = text.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|_| {
            ProviderError::Config(
                "kubernetes.server.caBundle is neither PEM nor base64 of PEM".into(),
            )
        })
}

/// A remote server's answer as a provider error, naming the server. Its own message is kept
/// (bounded, escaped) with the pod's token scrubbed out: a hostile server could echo it.
pub(super) fn api_error(e: kube::Error, remote: &Remote) -> ProviderError {
    let (url, token) = (remote.url.as_str(), &remote.token);
    let scrub = |message: &str| {
        let message = match token.expose() {
            "" => message.to_string(),
            t => message.replace(t, "[token]"),
        };
        printable(&message, 300)
    };
    match e {
        kube::Error::Api(s) => match s.code {
            404 => ProviderError::NotFound,
            401 => ProviderError::PermissionDenied(match &remote.whose {
                pod if pod.starts_with("the pod's") => format!(
                    "the API server {url} rejected {pod}: it must trust this cluster's \
                     service-account issuer for that audience"
                ),
                stored => format!("the API server {url} rejected {stored}"),
            }),
            403 => ProviderError::PermissionDenied(format!(
                "the API server {url}: {}",
                scrub(&s.message)
            )),
            429 => ProviderError::Throttled(format!("the API server {url}: {}", scrub(&s.message))),
            code => ProviderError::Unavailable(format!(
                "the API server {url} answered {code}: {}",
                scrub(&s.message)
            )),
        },
        other => transport_error(&other, url),
    }
}

/// Why a request to `url` got no answer: an untrusted certificate, an answer too large, or a
/// server out of reach. The words are rustls' or ours, never the server's.
fn transport_error(e: &kube::Error, url: &str) -> ProviderError {
    const VERDICT: &str = "invalid peer certificate";
    const TOO_LONG: &str = "length limit exceeded";
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = next {
        if error.is::<http_body_util::LengthLimitError>() {
            return too_large(url);
        }
        // The io::Error carrying rustls' verdict hides it from `source()`: read the text.
        let text = error.to_string();
        if let Some(at) = text.find(VERDICT) {
            return ProviderError::Unavailable(format!(
                "the API server {url}: its TLS certificate is not trusted ({}): \
                 kubernetes.server.caBundle or caProvider must hold the CA that signed it, for \
                 the URL's host name",
                printable(&text[at..], 120)
            ));
        }
        if text.contains(TOO_LONG) {
            return too_large(url);
        }
        next = error.source();
    }
    ProviderError::Unavailable(format!("the API server {url} could not be reached"))
}

fn too_large(url: &str) -> ProviderError {
    ProviderError::TooLarge(format!(
        "the API server {url} answered more than {} MiB",
        MAX_RESPONSE_BYTES >> 20
    ))
}

/// The error for a call to `url` (`""`: the agent's API server) that took longer than
/// [`REQUEST_TIMEOUT`].
pub(super) fn timed_out(url: &str) -> ProviderError {
    let server = match url {
        "" => "the API server".to_string(),
        url => format!("the API server {url}"),
    };
    ProviderError::Timeout(format!(
        "{server} did not answer within {}s",
        REQUEST_TIMEOUT.as_secs()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_urls_with_a_host_pass() {
        for good in [
            "https://k8s.example:6443",
            "https://10.0.0.1",
            "https://[fd00::1]:6443/k8s/clusters/c-1",
        ] {
            assert!(url(good).is_ok(), "{good}");
        }
        for bad in [
            "http://k8s.example",
            "https://user:pw@k8s.example",
            "https://k8s.example/?x=1",
            "https://k8s.example/#f",
            "k8s.example",
            "https:///path",
        ] {
            let err = url(bad).unwrap_err().to_string();
            assert!(err.contains("kubernetes.server.url"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_ca_bundle_is_pem_or_base64_of_pem() {
        let pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert_eq!(bundle(pem).unwrap(), pem.trim().as_bytes());
        let encoded = base64::engine::general_purpose::STANDARD.encode(pem);
        let wrapped = format!("{}\n{}", &encoded[..20], &encoded[20..]);
        assert_eq!(bundle(&wrapped).unwrap(), pem.as_bytes());
        assert!(bundle("not base64!").is_err());
    }

    #[tokio::test]
    async fn a_server_that_echoes_the_token_never_gets_it_into_an_error() {
        crate::tls::install_crypto_provider();
        let remote = Remote {
            client: super::super::bounded_client(kube::Config::new(
                "https://k8s.example".parse().unwrap(),
            ))
            .unwrap(),
            url: "https://k8s.example".into(),
            token: SecretString::new("eyJ.remote-pod-token.sig".into()),
            whose: "the pod's token for audience \"x\"".into(),
        };
        for code in [403, 429, 500] {
            let status = kube::core::Status::failure(
                "secrets is forbidden: token eyJ.remote-pod-token.sig may not",
                "Forbidden",
            )
            .with_code(code);
            let err = api_error(kube::Error::Api(Box::new(status)), &remote).to_string();
            assert!(!err.contains("remote-pod-token"), "{err}");
            assert!(err.contains("[token]"), "{err}");
        }
    }
}
