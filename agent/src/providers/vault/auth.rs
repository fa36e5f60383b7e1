//! Logging in to Vault for one store and one pod: the store's token as is, or a kubernetes, jwt,
//! AppRole or AWS IAM ([`super::iam`]) login through the shared [`super::tokens::TokenCache`].

use vaultrs::api::auth::approle::requests::LoginWithApproleRequest;
use vaultrs::api::auth::kubernetes::requests::LoginWithKubernetesRequest;
use vaultrs::api::auth::oidc::requests::JWTLoginRequest;

use super::super::{BuildContext, ProviderError, credentials};
use super::bad_request;
use super::errors::{login_error, server_error};
use super::tokens::TokenKey;
use super::transport::{self, Transport};
use crate::api::StoreKind;
use crate::api::store::VaultProvider;
use crate::secret::SecretString;
use crate::telemetry::metrics::{BackendLabels, ProviderLabel};

/// The token the store's auth method yields: the Secret's token as is, or a (cached) login.
pub(super) async fn authenticate(
    spec: &VaultProvider,
    ctx: &BuildContext<'_>,
    client: &Transport,
) -> Result<SecretString, ProviderError> {
    let auth = &spec.auth;
    if let Some(selector) = &auth.token_secret_ref {
        return credentials::read(ctx, selector).await;
    }
    let key = |method: &str, mount: &str, role: &str, identity: String| TokenKey {
        server: spec.server.clone(),
        namespace: spec.namespace.clone().unwrap_or_default(),
        mount: format!("{method}:{mount}"),
        role: role.to_string(),
        identity,
    };
    let cache = &ctx.env.vault_tokens;
    let pod_identity = format!("{}/{}", ctx.pod.namespace, ctx.pod.service_account);
    let count_login = || {
        ctx.env
            .metrics
            .logins
            .get_or_create(&ProviderLabel { provider: "vault" })
            .inc();
    };
    let renew = |token: SecretString| async move {
        let mut renewing = client.clone();
        renewing.set_token(token.expose());
        let renewed = renewing
            .login(transport::RenewSelf)
            .await
            .map_err(server_error);
        ctx.env
            .metrics
            .backend_requests
            .get_or_create(&BackendLabels {
                provider: "vault",
                operation: "renew",
                result: renewed
                    .as_ref()
                    .err()
                    .map_or("success", ProviderError::kind),
            })
            .inc();
        renewed
    };
    if let Some(role_auth) = auth.kubernetes.as_ref().or(auth.jwt.as_ref()) {
        let kubernetes = auth.kubernetes.is_some();
        let (method, default_mount) = if kubernetes {
            ("kubernetes", "kubernetes")
        } else {
            ("jwt", "jwt")
        };
        let mount = role_auth
            .mount_path
            .as_deref()
            .unwrap_or(default_mount)
            .trim_matches('/');
        let audience = role_auth.audience.as_deref().unwrap_or("");
        let role = role_auth.role.as_str();
        let key = key(method, mount, role, pod_identity);
        return cache
            .get(&key, renew, || async {
                let token = ctx.pod.tokens.for_audience(audience).ok_or_else(|| {
                    ProviderError::Config(format!(
                        "kubelet passed no service-account token for audience {audience:?}: add \
                         it to the CSIDriver's tokenRequests"
                    ))
                })?;
                count_login();
                let jwt = token.token.expose();
                let result = if kubernetes {
                    let request = LoginWithKubernetesRequest::builder()
                        .mount(mount)
                        .role(role)
                        .jwt(jwt)
                        .build()
                        .map_err(|_| bad_request())?;
                    client.login(request).await
                } else {
                    let request = JWTLoginRequest::builder()
                        .mount(mount)
                        .role(role.to_string())
                        .jwt(jwt)
                        .build()
                        .map_err(|_| bad_request())?;
                    client.login(request).await
                };
                result.map_err(|e| login_error(e, method, mount, Some(role)))
            })
            .await
            .map(|(token, _)| token);
    }
    if let Some(app_role) = &auth.app_role {
        let mount = app_role
            .path
            .as_deref()
            .unwrap_or("approle")
            .trim_matches('/');
        // Checked BEFORE the cache lookup: a cached login must never let a store use a
        // credential it may not read (fail closed).
        let location = credentials::locate(ctx, &app_role.secret_ref)?;
        let identity = match ctx.store_kind {
            // Only admitted namespaces reach a ClusterSecretStore; its credential is the agent's.
            StoreKind::ClusterSecretStore => format!("cluster:{location}"),
            // A SecretStore's credential is read as the pod: a service account that may not read
            // it must not reuse a token another service account of the namespace obtained.
            StoreKind::SecretStore => format!("{pod_identity}:{location}"),
        };
        let key = key("approle", mount, &app_role.role_id, identity);
        return cache
            .get(&key, renew, || async {
                let secret_id = credentials::read(ctx, &app_role.secret_ref).await?;
                count_login();
                let request = LoginWithApproleRequest::builder()
                    .mount(mount)
                    .role_id(app_role.role_id.as_str())
                    .secret_id(secret_id.expose())
                    .build()
                    .map_err(|_| bad_request())?;
                client
                    .login(request)
                    .await
                    .map_err(|e| login_error(e, "approle", mount, None))
            })
            .await
            .map(|(token, _)| token);
    }
    if let Some(iam) = &auth.iam {
        let mount = iam
            .path
            .as_deref()
            .unwrap_or(super::iam::DEFAULT_MOUNT)
            .trim_matches('/');
        let identity = format!("{pod_identity}\n{}", super::iam::identity(iam));
        let key = key("iam", mount, &iam.vault_role, identity);
        return cache
            .get(&key, renew, || async {
                count_login();
                // Boxed: the AWS session behind it would nest the publish future past the
                // compiler's layout depth.
                Box::pin(super::iam::login(iam, mount, ctx, client)).await
            })
            .await
            .map(|(token, _)| token);
    }
    Err(ProviderError::Config(
        "vault.auth needs one of tokenSecretRef, kubernetes, jwt, appRole, iam".into(),
    ))
}
