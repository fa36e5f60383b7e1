//! Which service-account token audiences a store's provider asks the caller's identity for. The
//! node agent gets these tokens from kubelet (the CSIDriver's `tokenRequests`); the mirror
//! controller, which has no pod, mints exactly these through the TokenRequest API and no others.

use crate::api::CredentialScope;
use crate::api::validate::ProviderSpec;

/// The audiences of the tokens `spec` will look up in [`crate::identity::PodTokens`] (`""` is
/// the API server's own audience), in a stable order without duplicates.
pub fn token_audiences(spec: ProviderSpec<'_>, scope: impl Into<CredentialScope>) -> Vec<String> {
    // A SecretStore's credential Secrets are read as the caller, with an API-server token
    // (see `credentials::read`); so are a referent store's that name no namespace. A referent
    // store asks for it whether or not its references name one: the token goes only to this
    // cluster's API server, and walking every reference for a namespace is not worth the risk
    // of missing one.
    let credentials_as_caller = scope.into() != CredentialScope::Cluster;
    let api_server = || String::new();
    let mut out = Vec::new();
    match spec {
        ProviderSpec::Aws(aws) => {
            let auth = aws.auth.as_ref();
            if let Some(jwt) = auth.and_then(|a| a.jwt.as_ref()) {
                out.push(
                    jwt.audience
                        .clone()
                        .unwrap_or_else(|| super::aws::DEFAULT_AUDIENCE.to_string()),
                );
            }
            if auth.is_some_and(|a| a.secret_ref.is_some()) && credentials_as_caller {
                out.push(api_server());
            }
        }
        ProviderSpec::Vault(vault) => {
            let auth = &vault.auth;
            for role in [&auth.kubernetes, &auth.jwt].into_iter().flatten() {
                out.push(role.audience.clone().unwrap_or_default());
            }
            if let Some(iam) = &auth.iam {
                out.push(super::vault::iam::audience(iam).to_string());
            }
            // Credentials, and a CA bundle from a Secret or ConfigMap, are read as the caller.
            let secret_ref = auth.token_secret_ref.is_some()
                || auth.app_role.is_some()
                || auth.user_pass.is_some()
                || auth.cert.is_some()
                || vault.ca_provider.is_some();
            if secret_ref && credentials_as_caller {
                out.push(api_server());
            }
        }
        ProviderSpec::Kubernetes(k) => {
            // A stored token (remote servers only) replaces the caller's.
            if k.auth.is_none() {
                out.push(k.audience.clone().unwrap_or_default());
            }
            // A remote server's CA bundle or token from a Secret or ConfigMap is read as the
            // caller.
            let ca_provider = k.server.as_ref().is_some_and(|s| s.ca_provider.is_some());
            if (ca_provider || k.auth.is_some()) && credentials_as_caller {
                out.push(api_server());
            }
        }
        ProviderSpec::Fake(_) => {}
        // Exactly the audiences the store lists (latchkey.plugin.v1 passes only these), plus the
        // API server's for a client certificate Secret read as the caller.
        ProviderSpec::Plugin(p) => {
            out.extend(p.audiences.iter().cloned());
            let client_cert = p
                .tls
                .as_ref()
                .is_some_and(|t| t.client_cert_secret_ref.is_some() || t.ca_provider.is_some());
            if client_cert && credentials_as_caller {
                out.push(api_server());
            }
        }
        // Exactly the audiences the store lists, as the driver's CSIDriver `tokenRequests`.
        // nodePublishSecretRef: a SecretStore's is read as the caller.
        ProviderSpec::SecretsStoreCsi(p) => {
            out.extend(p.audiences.iter().cloned());
            if p.node_publish_secret_ref.is_some() && credentials_as_caller {
                out.push(api_server());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::StoreKind;
    use crate::api::store::*;

    fn aws(auth: AwsAuth) -> AwsProvider {
        AwsProvider {
            service: "SecretsManager".into(),
            region: "eu-west-1".into(),
            endpoint: None,
            role: None,
            auth: Some(auth),
        }
    }

    #[test]
    fn each_auth_method_asks_for_its_own_audience_only() {
        let jwt = aws(AwsAuth {
            jwt: Some(AwsJwtAuth { audience: None }),
            ..Default::default()
        });
        assert_eq!(
            token_audiences(ProviderSpec::Aws(&jwt), StoreKind::SecretStore),
            ["sts.amazonaws.com"]
        );
        let keys = aws(AwsAuth {
            secret_ref: Some(AwsSecretRef {
                access_key_id_secret_ref: SecretKeySelector::default(),
                secret_access_key_secret_ref: SecretKeySelector::default(),
                session_token_secret_ref: None,
            }),
            ..Default::default()
        });
        assert_eq!(
            token_audiences(ProviderSpec::Aws(&keys), StoreKind::SecretStore),
            [""]
        );
        // A ClusterSecretStore's credentials are the agent's to read: no token of the caller.
        assert!(
            token_audiences(ProviderSpec::Aws(&keys), StoreKind::ClusterSecretStore).is_empty()
        );
        let k8s = KubernetesProvider {
            audience: Some("api".into()),
            ..Default::default()
        };
        assert_eq!(
            token_audiences(
                ProviderSpec::Kubernetes(&k8s),
                StoreKind::ClusterSecretStore
            ),
            ["api"]
        );
        let iam = VaultProvider {
            auth: VaultAuth {
                iam: Some(VaultIamAuth::default()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            token_audiences(ProviderSpec::Vault(&iam), StoreKind::SecretStore),
            ["sts.amazonaws.com"]
        );
        let fake = FakeProvider::default();
        assert!(token_audiences(ProviderSpec::Fake(&fake), StoreKind::SecretStore).is_empty());
        let plugin = PluginProvider::default();
        assert!(token_audiences(ProviderSpec::Plugin(&plugin), StoreKind::SecretStore).is_empty());
        let plugin = PluginProvider {
            endpoint: "plugin:4000".into(),
            audiences: vec!["vault".into()],
            tls: Some(PluginTls {
                ca_bundle: Some("-----BEGIN CERTIFICATE-----".into()),
                client_cert_secret_ref: Some(TlsSecretRef {
                    name: "plugin-client".into(),
                    namespace: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            token_audiences(ProviderSpec::Plugin(&plugin), StoreKind::SecretStore),
            ["", "vault"]
        );
        assert_eq!(
            token_audiences(ProviderSpec::Plugin(&plugin), StoreKind::ClusterSecretStore),
            ["vault"]
        );
        let sscsi = SecretsStoreCsiProvider {
            provider: "azure".into(),
            audiences: vec![
                "vault".into(),
                "api://AzureADTokenExchange".into(),
                "vault".into(),
            ],
            ..Default::default()
        };
        assert_eq!(
            token_audiences(
                ProviderSpec::SecretsStoreCsi(&sscsi),
                StoreKind::SecretStore
            ),
            ["api://AzureADTokenExchange", "vault"]
        );
        // Its nodePublishSecretRef Secret is read as the caller in a SecretStore only.
        let with_secret = SecretsStoreCsiProvider {
            node_publish_secret_ref: Some(SecretNameRef {
                name: "creds".into(),
            }),
            ..sscsi
        };
        let spec = ProviderSpec::SecretsStoreCsi(&with_secret);
        assert_eq!(
            token_audiences(spec, StoreKind::SecretStore),
            ["", "api://AzureADTokenExchange", "vault"]
        );
        assert_eq!(
            token_audiences(spec, StoreKind::ClusterSecretStore),
            ["api://AzureADTokenExchange", "vault"]
        );
    }
}
