//! Which identities the controller may act as for a store, decided before any token is minted
//! or backend called. Pure: no API calls.
//!
//! The controller has no pod: a token it mints for a tenant's store goes wherever that store
//! points. So it mints only the audiences the store's auth needs, and never the API server's
//! own audience for a backend: that token would let the backend act on this cluster as the
//! service account. The API-server token is minted only where it goes to this cluster's API
//! server and nowhere else: the `kubernetes` provider, and a SecretStore's (or a referent
//! store's) credential Secret, which is read from the API server as the service account (as the `kubernetes` provider
//! would read it, so it grants nothing more). A ClusterSecretStore that uses the process's own
//! identity (`agentIdentity`) would read with the controller's identity: refused unless the
//! controller was started with `--allow-agent-identity`.

use crate::api::CredentialScope;
use crate::api::validate::ProviderSpec;
use crate::providers::audiences::token_audiences;

/// Why the controller will not act for a store. Names the store's setting and what to do.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConsentError {
    /// The store's auth would send a token for the API server's own audience to its backend.
    #[error(
        "the {provider} store's auth asks for a token with the API server's own audience (no \
         audience set), which the controller never mints for a backend: set the audience of \
         its auth to one its backend checks (for example `audience: vault`)"
    )]
    ApiServerAudience {
        /// The store's provider.
        provider: &'static str,
    },
    /// A ClusterSecretStore that reads with the process's own identity.
    #[error(
        "the ClusterSecretStore uses auth.agentIdentity, which in the mirror controller would \
         read with the controller's own identity; the controller refuses it unless started with \
         --allow-agent-identity (see docs/security.md)"
    )]
    AgentIdentity,
}

/// The audiences to mint for `spec` (`""`: the API server's), or why none may be minted.
pub fn audiences(
    spec: ProviderSpec<'_>,
    scope: impl Into<CredentialScope>,
    allow_agent_identity: bool,
) -> Result<Vec<String>, ConsentError> {
    if let ProviderSpec::Aws(aws) = spec
        && aws
            .auth
            .as_ref()
            .is_some_and(|a| a.agent_identity.is_some())
        && !allow_agent_identity
    {
        return Err(ConsentError::AgentIdentity);
    }
    // A ClusterSecretStore reads its credential Secrets with the controller's identity, so its
    // audiences are exactly those the backend itself is sent.
    let for_backend = token_audiences(spec, CredentialScope::Cluster);
    // With `server`, the kubernetes provider sends its token to another cluster: a backend.
    let reads_this_cluster = matches!(spec, ProviderSpec::Kubernetes(k) if k.server.is_none());
    if !reads_this_cluster && for_backend.iter().any(String::is_empty) {
        return Err(ConsentError::ApiServerAudience {
            provider: spec.name(),
        });
    }
    Ok(token_audiences(spec, scope))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::StoreKind;
    use crate::api::store::*;

    fn vault_kubernetes(audience: Option<&str>) -> VaultProvider {
        serde_json::from_value(serde_json::json!({
            "server": "https://vault.example", "path": "secret",
            "auth": {"kubernetes": {"role": "shop", "audience": audience}}
        }))
        .unwrap()
    }

    #[test]
    fn the_api_server_audience_goes_to_this_cluster_only() {
        let unset = vault_kubernetes(None);
        assert_eq!(
            audiences(ProviderSpec::Vault(&unset), StoreKind::SecretStore, false),
            Err(ConsentError::ApiServerAudience { provider: "vault" })
        );
        let vault = vault_kubernetes(Some("vault"));
        assert_eq!(
            audiences(ProviderSpec::Vault(&vault), StoreKind::SecretStore, false).unwrap(),
            ["vault"]
        );
        let k8s = KubernetesProvider::default();
        assert_eq!(
            audiences(
                ProviderSpec::Kubernetes(&k8s),
                StoreKind::SecretStore,
                false
            )
            .unwrap(),
            [""]
        );
        // Another cluster's API server is a backend: never this cluster's audience, and its CA
        // ConfigMap of a SecretStore is read here, with this cluster's.
        let mut remote = KubernetesProvider {
            server: Some(KubernetesServer {
                url: "https://other.example".into(),
                ca_provider: Some(CaProvider::default()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            audiences(
                ProviderSpec::Kubernetes(&remote),
                StoreKind::SecretStore,
                false
            ),
            Err(ConsentError::ApiServerAudience {
                provider: "kubernetes"
            })
        );
        remote.audience = Some("other-cluster".into());
        assert_eq!(
            audiences(
                ProviderSpec::Kubernetes(&remote),
                StoreKind::SecretStore,
                false
            )
            .unwrap(),
            ["", "other-cluster"]
        );
        assert_eq!(
            audiences(
                ProviderSpec::Kubernetes(&remote),
                StoreKind::ClusterSecretStore,
                false
            )
            .unwrap(),
            ["other-cluster"]
        );
        // A stored token replaces the caller's: only a SecretStore's credential read remains.
        remote.audience = None;
        remote.auth = Some(KubernetesAuth::default());
        assert_eq!(
            audiences(
                ProviderSpec::Kubernetes(&remote),
                StoreKind::SecretStore,
                false
            )
            .unwrap(),
            [""]
        );
        assert!(
            audiences(
                ProviderSpec::Kubernetes(&remote),
                StoreKind::ClusterSecretStore,
                false
            )
            .unwrap()
            .is_empty()
        );
        let plugin = PluginProvider {
            endpoint: "plugin:4000".into(),
            audiences: vec![String::new()],
            ..Default::default()
        };
        assert!(matches!(
            audiences(ProviderSpec::Plugin(&plugin), StoreKind::SecretStore, false),
            Err(ConsentError::ApiServerAudience { .. })
        ));
        // A SecretStore's credential Secret is read from the API server as the caller.
        let keys = AwsProvider {
            service: "SecretsManager".into(),
            region: "eu-west-1".into(),
            endpoint: None,
            role: None,
            auth: Some(AwsAuth {
                secret_ref: Some(AwsSecretRef {
                    access_key_id_secret_ref: SecretKeySelector::default(),
                    secret_access_key_secret_ref: SecretKeySelector::default(),
                    session_token_secret_ref: None,
                }),
                ..Default::default()
            }),
        };
        assert_eq!(
            audiences(ProviderSpec::Aws(&keys), StoreKind::SecretStore, false).unwrap(),
            [""]
        );
    }

    #[test]
    fn the_controller_s_own_identity_needs_its_flag() {
        let own = AwsProvider {
            service: "SecretsManager".into(),
            region: "eu-west-1".into(),
            endpoint: None,
            role: None,
            auth: Some(AwsAuth {
                agent_identity: Some(Default::default()),
                ..Default::default()
            }),
        };
        let refused = audiences(
            ProviderSpec::Aws(&own),
            StoreKind::ClusterSecretStore,
            false,
        );
        assert_eq!(refused, Err(ConsentError::AgentIdentity));
        assert!(
            refused
                .unwrap_err()
                .to_string()
                .contains("--allow-agent-identity")
        );
        assert!(
            audiences(ProviderSpec::Aws(&own), StoreKind::ClusterSecretStore, true)
                .unwrap()
                .is_empty()
        );
    }
}
