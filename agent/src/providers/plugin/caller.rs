//! The caller's identity sent with every `latchkey.plugin.v1` call: the pod's namespace, name,
//! uid and service account, and its service-account tokens for the audiences the store lists in
//! `plugin.audiences`, never any other (kubelet may have passed the pod tokens for Vault, AWS or
//! the API server that this plugin must not get).

use csi_proto::latchkey_plugin::v1 as lk;

use super::super::ProviderError;
use crate::identity::PodInfo;
use crate::identity::tokens::ServiceAccountToken;

/// The identity of one pod for one store, tokens kept in types that never print them.
pub(super) struct Caller {
    namespace: String,
    pod_name: String,
    pod_uid: String,
    service_account: String,
    /// `(audience, token)`, exactly the store's audiences, in the store's order.
    tokens: Vec<(String, ServiceAccountToken)>,
}

impl Caller {
    /// `pod` with its tokens for `audiences`. A listed audience kubelet passed no token for
    /// fails: the plugin would otherwise act with less than the store asked for.
    pub(super) fn new(
        at: &str,
        pod: &PodInfo,
        audiences: &[String],
    ) -> Result<Self, ProviderError> {
        let mut tokens = Vec::with_capacity(audiences.len());
        for audience in audiences {
            if tokens.iter().any(|(a, _)| a == audience) {
                continue;
            }
            let token = pod.tokens.for_audience(audience).ok_or_else(|| {
                ProviderError::Config(format!(
                    "plugin {at}: kubelet passed no service-account token for audience \
                     {audience:?} (plugin.audiences): add it to the CSIDriver's tokenRequests"
                ))
            })?;
            tokens.push((audience.clone(), token.clone()));
        }
        Ok(Self {
            namespace: pod.namespace.clone(),
            pod_name: pod.name.clone(),
            pod_uid: pod.uid.clone(),
            service_account: pod.service_account.clone(),
            tokens,
        })
    }

    /// Whether the store asked for any token (a plugin without latchkey.plugin.v1 cannot get
    /// them).
    pub(super) fn has_tokens(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// The message sent; its `Debug` hides the tokens (csi-proto's `redact`).
    pub(super) fn message(&self) -> lk::Caller {
        lk::Caller {
            namespace: self.namespace.clone(),
            pod_name: self.pod_name.clone(),
            service_account: self.service_account.clone(),
            tokens: self
                .tokens
                .iter()
                .map(|(audience, t)| lk::Token {
                    audience: audience.clone(),
                    token: t.token.expose().to_owned(),
                    expiration_timestamp: t.expiration.clone().unwrap_or_default(),
                })
                .collect(),
            pod_uid: self.pod_uid.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodInfo {
        crate::identity::test_pod()
    }

    #[test]
    fn only_the_listed_audiences_tokens_are_sent() {
        let caller = Caller::new("p:1", &pod(), &["vault".into(), "vault".into()]).unwrap();
        let m = caller.message();
        assert_eq!(
            (
                m.namespace.as_str(),
                m.pod_name.as_str(),
                m.service_account.as_str()
            ),
            ("shop", "web-0", "web")
        );
        assert_eq!(m.pod_uid, "uid-1");
        assert_eq!(m.tokens.len(), 1);
        assert_eq!(m.tokens[0].audience, "vault");
        assert_eq!(m.tokens[0].token, "eyJ.vault.sig");
        assert_eq!(m.tokens[0].expiration_timestamp, "2030-01-01T00:00:00Z");
        assert!(!format!("{m:?}").contains("eyJ"), "{m:?}");

        let none = Caller::new("p:1", &pod(), &[]).unwrap();
        assert!(!none.has_tokens() && none.message().tokens.is_empty());

        let err = Caller::new("p:1", &pod(), &["absent".into()])
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("\"absent\"") && err.contains("tokenRequests"),
            "{err}"
        );
    }
}
