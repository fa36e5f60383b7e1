//! The Mount request, built as the Secrets Store CSI Driver builds it (`nodeserver.go`):
//! `attributes` is a JSON object of strings, the store's parameters plus the pod's attributes
//! and, as a JSON string, its service-account tokens for the audiences the store lists.
//! It carries tokens: it lives in a [`SecretString`] and is never logged.

use std::collections::BTreeMap;

use serde::Serialize;

use super::super::ProviderError;
use crate::api::store::SecretsStoreCsiProvider;
use crate::identity::PodInfo;
use crate::identity::tokens::TOKENS_KEY;
use crate::secret::SecretString;

/// The driver's keys for the pod's attributes (also what kubelet puts in `volume_context`).
const POD_NAME: &str = "csi.storage.k8s.io/pod.name";
const POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";
const POD_UID: &str = "csi.storage.k8s.io/pod.uid";
const SERVICE_ACCOUNT: &str = "csi.storage.k8s.io/serviceAccount.name";

/// The `target_path` sent: the protocol requires one, and old providers write there. It is
/// under a directory that does not exist (and that the agent never creates), so a provider that
/// tries to write fails instead of writing anywhere; Latchkey takes the files from the response.
pub const TARGET_PATH: &str = "/nonexistent/latchkey/provider-must-return-files";

/// The `permission` sent: 0644 in decimal, as the driver sends it by default.
pub const PERMISSION: &str = "420";

/// The `secrets` sent without a `nodePublishSecretRef`: no credentials.
pub const NO_SECRETS: &str = "{}";

/// The `secrets` JSON for the keys of a `nodePublishSecretRef` Secret: an object of strings, as
/// the driver sends the Secret kubelet passed it. Never logged.
pub fn secrets(data: &BTreeMap<String, SecretString>) -> Result<SecretString, ProviderError> {
    let map: BTreeMap<&str, &str> = data.iter().map(|(k, v)| (k.as_str(), v.expose())).collect();
    Ok(SecretString::new(to_json(&map)?))
}

/// One token as the driver passes it.
#[derive(Serialize)]
struct Token<'a> {
    token: &'a str,
    #[serde(
        rename = "expirationTimestamp",
        skip_serializing_if = "Option::is_none"
    )]
    expiration: Option<&'a str>,
}

/// The `attributes` JSON for `pod` and store `spec`. A listed audience kubelet passed no token
/// for fails: the provider would otherwise act with less than the store asked for.
pub fn attributes(
    spec: &SecretsStoreCsiProvider,
    pod: &PodInfo,
) -> Result<SecretString, ProviderError> {
    let mut tokens = BTreeMap::new();
    for audience in &spec.audiences {
        let token = pod.tokens.for_audience(audience).ok_or_else(|| {
            ProviderError::Config(format!(
                "secretsStoreCSI provider {}: kubelet passed no service-account token for \
                 audience {audience:?}: add it to the CSIDriver's tokenRequests",
                spec.provider
            ))
        })?;
        tokens.insert(
            audience.as_str(),
            Token {
                token: token.token.expose(),
                expiration: token.expiration.as_deref(),
            },
        );
    }
    let mut out: BTreeMap<&str, String> = spec
        .parameters
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    // After the parameters: the pod's attributes always win (validation refuses such keys too).
    out.insert(POD_NAME, pod.name.clone());
    out.insert(POD_NAMESPACE, pod.namespace.clone());
    out.insert(POD_UID, pod.uid.clone());
    out.insert(SERVICE_ACCOUNT, pod.service_account.clone());
    if !tokens.is_empty() {
        out.insert(TOKENS_KEY, to_json(&tokens)?);
    }
    Ok(SecretString::new(to_json(&out)?))
}

/// Serializes; serde_json fails only for maps with non-string keys, which these are not. The
/// error is not quoted: it could carry part of a token.
fn to_json(value: &impl Serialize) -> Result<String, ProviderError> {
    serde_json::to_string(value)
        .map_err(|_| ProviderError::Config("cannot encode the Mount attributes".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodInfo {
        crate::identity::test_pod()
    }

    #[test]
    fn node_publish_secrets_are_a_json_object_of_strings_never_debugged() {
        let data: BTreeMap<String, SecretString> = [
            ("clientid".to_string(), SecretString::new("id".into())),
            (
                "clientsecret".to_string(),
                SecretString::new("hunter2\"\n".into()),
            ),
        ]
        .into();
        let json = secrets(&data).unwrap();
        let map: BTreeMap<String, String> = serde_json::from_str(json.expose()).unwrap();
        assert_eq!(map["clientid"], "id");
        assert_eq!(map["clientsecret"], "hunter2\"\n");
        assert!(!format!("{json:?} {data:?}").contains("hunter2"));
        assert_eq!(secrets(&BTreeMap::new()).unwrap().expose(), NO_SECRETS);
    }

    #[test]
    fn parameters_pod_attributes_and_only_the_listed_tokens() {
        let spec = SecretsStoreCsiProvider {
            provider: "vault".into(),
            parameters: [("roleName".to_string(), "web".to_string())].into(),
            audiences: vec!["vault".into()],
            ..Default::default()
        };
        let json = attributes(&spec, &pod()).unwrap();
        let map: BTreeMap<String, String> = serde_json::from_str(json.expose()).unwrap();
        assert_eq!(map["roleName"], "web");
        assert_eq!(map[POD_NAME], "web-0");
        assert_eq!(map[POD_NAMESPACE], "shop");
        assert_eq!(map[POD_UID], "uid-1");
        assert_eq!(map[SERVICE_ACCOUNT], "web");
        let tokens: serde_json::Value = serde_json::from_str(&map[TOKENS_KEY]).unwrap();
        assert_eq!(tokens["vault"]["token"], "eyJ.vault.sig");
        assert_eq!(
            tokens["vault"]["expirationTimestamp"],
            "2030-01-01T00:00:00Z"
        );
        assert!(tokens.get("other").is_none(), "{tokens}");
        assert!(!format!("{json:?}").contains("eyJ"));

        let none = SecretsStoreCsiProvider {
            provider: "vault".into(),
            ..Default::default()
        };
        let json = attributes(&none, &pod()).unwrap();
        assert!(
            !json.expose().contains(TOKENS_KEY),
            "no audience, no tokens key"
        );

        let missing = SecretsStoreCsiProvider {
            provider: "vault".into(),
            audiences: vec!["absent".into()],
            ..Default::default()
        };
        let err = attributes(&missing, &pod()).unwrap_err().to_string();
        assert!(
            err.contains("\"absent\"") && err.contains("tokenRequests"),
            "{err}"
        );
    }
}
