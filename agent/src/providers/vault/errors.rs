//! Vault's answers as provider errors; tokens, secret ids and values never reach a message.

use vaultrs::error::ClientError;

use super::super::ProviderError;
use super::transport;

/// A failed login: refused credentials are PermissionDenied, the rest as for reads.
pub(super) fn login_error(
    e: ClientError,
    method: &str,
    mount: &str,
    role: Option<&str>,
) -> ProviderError {
    match e {
        ClientError::APIError { code, errors } if (400..500).contains(&code) && code != 429 => {
            let role = role.map(|r| format!(" for role {r:?}")).unwrap_or_default();
            ProviderError::PermissionDenied(format!(
                "Vault refused the {method} login at auth/{mount}{role}{}",
                reason(&errors)
            ))
        }
        other => match server_error(other) {
            ProviderError::NotFound => ProviderError::Config(format!(
                "no {method} auth method is mounted at auth/{mount}"
            )),
            e => e,
        },
    }
}

/// Vault's answer as a provider error. Vault's own messages carry neither tokens nor values.
pub(crate) fn server_error(e: ClientError) -> ProviderError {
    match e {
        ClientError::APIError { code, errors } => {
            let why = reason(&errors);
            match code {
                404 => ProviderError::NotFound,
                401 | 403 => ProviderError::PermissionDenied(format!("Vault denied access{why}")),
                429 => ProviderError::Throttled(format!("Vault answered 429{why}")),
                503 if errors.iter().any(|e| e.contains("sealed")) => {
                    ProviderError::Unavailable("Vault is sealed".into())
                }
                503 if errors.iter().any(|e| e.contains("standby")) => {
                    ProviderError::Unavailable("Vault is in standby".into())
                }
                500.. => ProviderError::Unavailable(format!("Vault answered {code}{why}")),
                _ => ProviderError::Config(format!("Vault rejected the request ({code}){why}")),
            }
        }
        e @ ClientError::RestClientError { .. } if transport::is_too_large(&e) => {
            ProviderError::Unavailable(transport::BodyTooLarge.to_string())
        }
        e @ ClientError::RestClientError { .. } if transport::refusal(&e).is_some() => {
            let why = transport::refusal(&e).map(ToString::to_string);
            ProviderError::TooLarge(format!("Vault's answer {}", why.unwrap_or_default()))
        }
        e @ ClientError::RestClientError { .. } => match untrusted(&e) {
            Some(why) => ProviderError::Unavailable(format!(
                "Vault's TLS certificate is not trusted ({why}): vault.caBundle or \
                 vault.caProvider must hold the CA that signed it, for the server's host name"
            )),
            None => ProviderError::Unavailable("Vault could not be reached".into()),
        },
        ClientError::ResponseEmptyError | ClientError::ResponseDataEmptyError => {
            ProviderError::NotFound
        }
        ClientError::JsonParseError { .. } => {
            ProviderError::Unavailable("Vault's answer is not a KV secret".into())
        }
        _ => ProviderError::Unavailable("the Vault request failed".into()),
    }
}

/// rustls' verdict on the server's certificate, when that is why the request failed. Found in
/// the error chain's text (the io::Error carrying it hides it from `source()`); the words are
/// rustls', never the server's.
fn untrusted(e: &ClientError) -> Option<String> {
    const VERDICT: &str = "invalid peer certificate";
    let mut next: Option<&dyn std::error::Error> = Some(e);
    while let Some(error) = next {
        let text = error.to_string();
        if let Some(at) = text.find(VERDICT) {
            return Some(crate::telemetry::escape::printable(&text[at..], 120));
        }
        next = error.source();
    }
    None
}

/// Vault's error strings, bounded and escaped (the server may be a tenant's), for a message.
pub(crate) fn reason(errors: &[String]) -> String {
    let text = errors
        .iter()
        .map(|e| e.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|e| !e.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    if text.is_empty() {
        String::new()
    } else {
        format!(": {}", crate::telemetry::escape::printable(&text, 200))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_provider_errors() {
        let api = |code, msg: &str| ClientError::APIError {
            code,
            errors: vec![msg.into()],
        };
        assert!(matches!(
            server_error(api(404, "")),
            ProviderError::NotFound
        ));
        assert!(matches!(
            server_error(api(403, "permission denied")),
            ProviderError::PermissionDenied(_)
        ));
        match server_error(api(503, "Vault is sealed")) {
            ProviderError::Unavailable(m) => assert!(m.contains("sealed")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            server_error(api(500, "boom")),
            ProviderError::Unavailable(_)
        ));
    }
}
