//! The pod a volume is for, as kubelet describes it in `volume_context` (`podInfoOnMount: true`),
//! with its service-account tokens (`tokenRequests`). This module never logs what it reads.

pub mod tokens;

use std::collections::BTreeMap;

pub use tokens::{PodTokens, ServiceAccountToken};

/// Key prefix kubelet uses for pod information in `volume_context`.
pub const POD_INFO_PREFIX: &str = "csi.storage.k8s.io/";
const POD_NAME: &str = "csi.storage.k8s.io/pod.name";
const POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";
const POD_UID: &str = "csi.storage.k8s.io/pod.uid";
const SERVICE_ACCOUNT: &str = "csi.storage.k8s.io/serviceAccount.name";
const EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";

/// Who the volume is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// Pod namespace: the only namespace the volume may read from.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// The pod's service account.
    pub service_account: String,
    /// The pod's projected service-account tokens, by audience.
    pub tokens: PodTokens,
}

/// The volume context does not describe an ephemeral inline volume of a pod.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    /// A pod field is missing.
    #[error(
        "volume_context lacks {0}: the CSIDriver object must set podInfoOnMount: true (see daemonset/)"
    )]
    Missing(&'static str),
    /// A pod field is not a valid Kubernetes name.
    #[error("volume_context {key} is not a valid Kubernetes name")]
    BadName {
        /// Which key.
        key: &'static str,
    },
    /// The tokens value is malformed.
    #[error(transparent)]
    MalformedTokens(#[from] tokens::MalformedTokens),
    /// The volume is not a CSI ephemeral inline volume.
    #[error(
        "Latchkey serves only CSI ephemeral inline volumes (pod.spec.volumes[].csi); \
         csi.storage.k8s.io/ephemeral is {0:?}"
    )]
    NotEphemeral(String),
}

impl PodInfo {
    /// Reads the pod fields kubelet puts into `volume_context`, and the tokens from `secrets`
    /// (kubelets with `serviceAccountTokenInSecrets`) or else from `volume_context`.
    pub fn from_request(
        ctx: &BTreeMap<String, String>,
        secrets: &BTreeMap<String, String>,
    ) -> Result<Self, IdentityError> {
        let get = |key: &'static str| {
            ctx.get(key)
                .filter(|v| !v.is_empty())
                .cloned()
                .ok_or(IdentityError::Missing(key))
        };
        let ephemeral = get(EPHEMERAL)?;
        if ephemeral != "true" {
            return Err(IdentityError::NotEphemeral(ephemeral));
        }
        let namespace = get(POD_NAMESPACE)?;
        if !is_dns_label(&namespace) {
            return Err(IdentityError::BadName { key: POD_NAMESPACE });
        }
        let service_account = get(SERVICE_ACCOUNT)?;
        if !is_dns_subdomain(&service_account) {
            return Err(IdentityError::BadName {
                key: SERVICE_ACCOUNT,
            });
        }
        let tokens_json = secrets
            .get(tokens::TOKENS_KEY)
            .or_else(|| ctx.get(tokens::TOKENS_KEY));
        Ok(Self {
            namespace,
            name: get(POD_NAME)?,
            uid: get(POD_UID)?,
            service_account,
            tokens: PodTokens::parse(tokens_json.map(String::as_str))?,
        })
    }
}

/// RFC 1123 label: what Kubernetes accepts as a namespace name.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain: what Kubernetes accepts as most object names.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// A pod of service account `shop/web` holding tokens for the audiences `vault` and `other`
/// (unit tests of code that passes a pod's identity on).
#[cfg(test)]
pub(crate) fn test_pod() -> PodInfo {
    PodInfo {
        namespace: "shop".into(),
        name: "web-0".into(),
        uid: "uid-1".into(),
        service_account: "web".into(),
        tokens: PodTokens::parse(Some(
            r#"{"vault":{"token":"eyJ.vault.sig","expirationTimestamp":"2030-01-01T00:00:00Z"},"other":{"token":"eyJ.other.sig"}}"#,
        ))
        .expect("a valid tokens attribute"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn full() -> Vec<(&'static str, &'static str)> {
        vec![
            (POD_NAME, "web-0"),
            (POD_NAMESPACE, "shop"),
            (POD_UID, "1234"),
            (SERVICE_ACCOUNT, "web"),
            (EPHEMERAL, "true"),
        ]
    }

    #[test]
    fn parses_kubelet_pod_info() {
        let p = PodInfo::from_request(&ctx(&full()), &BTreeMap::new()).unwrap();
        assert_eq!(p.namespace, "shop");
        assert_eq!(p.service_account, "web");
        assert_eq!(p.tokens.audiences().count(), 0);
    }

    #[test]
    fn tokens_come_from_secrets_before_volume_context() {
        let json = |t: &str| format!(r#"{{"vault":{{"token":"{t}"}}}}"#);
        let mut c = ctx(&full());
        c.insert(tokens::TOKENS_KEY.into(), json("from-context"));
        let p = PodInfo::from_request(&c, &BTreeMap::new()).unwrap();
        assert_eq!(
            p.tokens.for_audience("vault").unwrap().token.expose(),
            "from-context"
        );
        let secrets = BTreeMap::from([(tokens::TOKENS_KEY.to_string(), json("from-secrets"))]);
        let p = PodInfo::from_request(&c, &secrets).unwrap();
        assert_eq!(
            p.tokens.for_audience("vault").unwrap().token.expose(),
            "from-secrets"
        );
        assert!(
            !format!("{p:?}").contains("from-"),
            "PodInfo Debug shows a token"
        );
        c.insert(tokens::TOKENS_KEY.into(), "not json from-context".into());
        let err = PodInfo::from_request(&c, &BTreeMap::new()).unwrap_err();
        assert!(matches!(err, IdentityError::MalformedTokens(_)));
        assert!(!err.to_string().contains("from-context"));
    }

    #[test]
    fn refuses_missing_bad_or_persistent() {
        let mut c = ctx(&full());
        c.remove(POD_NAMESPACE);
        assert_eq!(
            PodInfo::from_request(&c, &BTreeMap::new()),
            Err(IdentityError::Missing(POD_NAMESPACE))
        );
        let mut c = ctx(&full());
        c.insert(POD_NAMESPACE.into(), "../etc".into());
        assert!(matches!(
            PodInfo::from_request(&c, &BTreeMap::new()),
            Err(IdentityError::BadName { .. })
        ));
        let mut c = ctx(&full());
        c.insert(EPHEMERAL.into(), "false".into());
        assert!(matches!(
            PodInfo::from_request(&c, &BTreeMap::new()),
            Err(IdentityError::NotEphemeral(_))
        ));
    }

    #[test]
    fn names() {
        assert!(is_dns_label("prod-1"));
        assert!(!is_dns_label("Prod"));
        assert!(!is_dns_label("-a"));
        assert!(is_dns_subdomain("a.b-c"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_dns_subdomain("a/b"));
    }
}
