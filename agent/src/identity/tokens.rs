//! Service-account tokens kubelet hands over for the pod (`csi.storage.k8s.io/serviceAccount.tokens`,
//! one per audience the CSIDriver's `tokenRequests` asks for), kept in types that never print them.
//! Providers use them to act as the pod: STS web identity, Vault login, the API server.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use crate::secret::SecretString;

/// The `volume_context` / `secrets` key kubelet puts the tokens under.
pub const TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// One projected token.
#[derive(Clone, PartialEq, Eq)]
pub struct ServiceAccountToken {
    /// The JWT.
    pub token: SecretString,
    /// When it expires (RFC 3339), as kubelet reports it.
    pub expiration: Option<String>,
}

impl fmt::Debug for ServiceAccountToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceAccountToken")
            .field("token", &"<redacted>")
            .field("expiration", &self.expiration)
            .finish()
    }
}

/// The pod's tokens by audience.
#[derive(Clone, Default, PartialEq, Eq, Debug)]
pub struct PodTokens {
    by_audience: BTreeMap<String, ServiceAccountToken>,
}

/// The tokens value is not what kubelet sends. The message never quotes the value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "{TOKENS_KEY} is not a JSON object of the form {{\"<audience>\": {{\"token\": \"...\", \
     \"expirationTimestamp\": \"...\"}}}}"
)]
pub struct MalformedTokens;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    token: String,
    #[serde(default)]
    expiration_timestamp: Option<String>,
}

impl PodTokens {
    /// Parses kubelet's JSON; an absent value means no tokens were requested.
    pub fn parse(json: Option<&str>) -> Result<Self, MalformedTokens> {
        let Some(json) = json.filter(|j| !j.is_empty()) else {
            return Ok(Self::default());
        };
        // serde's messages can quote the input; only the fact of failure is reported.
        let wire: BTreeMap<String, Wire> =
            serde_json::from_str(json).map_err(|_| MalformedTokens)?;
        let by_audience = wire
            .into_iter()
            .map(|(aud, w)| {
                let token = ServiceAccountToken {
                    token: SecretString::new(w.token),
                    expiration: w.expiration_timestamp,
                };
                (aud, token)
            })
            .collect();
        Ok(Self { by_audience })
    }

    /// Tokens obtained some other way than from kubelet (the mirror controller mints them).
    pub fn from_tokens(tokens: impl IntoIterator<Item = (String, ServiceAccountToken)>) -> Self {
        Self {
            by_audience: tokens.into_iter().collect(),
        }
    }

    /// The token for `audience`, if kubelet provided one.
    pub fn for_audience(&self, audience: &str) -> Option<&ServiceAccountToken> {
        self.by_audience.get(audience)
    }

    /// The audiences tokens were provided for.
    pub fn audiences(&self) -> impl Iterator<Item = &str> {
        self.by_audience.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: &str = r#"{"sts.amazonaws.com":{"token":"eyJ.aws-token.sig","expirationTimestamp":"2026-11-21T14:00:00Z"},"vault":{"token":"eyJ.vault-token.sig"}}"#;

    #[test]
    fn parses_every_audience() {
        let t = PodTokens::parse(Some(JSON)).unwrap();
        assert_eq!(
            t.audiences().collect::<Vec<_>>(),
            ["sts.amazonaws.com", "vault"]
        );
        let aws = t.for_audience("sts.amazonaws.com").unwrap();
        assert_eq!(aws.token.expose(), "eyJ.aws-token.sig");
        assert_eq!(aws.expiration.as_deref(), Some("2026-11-21T14:00:00Z"));
        assert!(t.for_audience("other").is_none());
        assert_eq!(PodTokens::parse(None).unwrap(), PodTokens::default());
        assert_eq!(PodTokens::parse(Some("")).unwrap(), PodTokens::default());
    }

    #[test]
    fn debug_and_errors_never_show_a_token() {
        let t = PodTokens::parse(Some(JSON)).unwrap();
        let printed = format!("{t:?} {t:#?}");
        assert!(!printed.contains("token.sig"), "{printed}");
        assert!(printed.contains("sts.amazonaws.com"), "{printed}");
        for bad in [
            r#"{"a":"eyJ.bare-token.sig"}"#,
            r#"["eyJ.bare-token.sig"]"#,
            "eyJ.bare-token.sig",
        ] {
            let err = PodTokens::parse(Some(bad)).unwrap_err().to_string();
            assert!(!err.contains("bare-token"), "{err}");
        }
    }
}
