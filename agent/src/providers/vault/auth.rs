//! Logging in to Vault for one store and one pod: the store's token as is, or a kubernetes, jwt,
//! AppRole, userpass, cert or AWS IAM ([`super::iam`]) login through the shared
//! [`super::tokens::TokenCache`].

use vaultrs::api::auth::approle::requests::LoginWithApproleRequest;
use vaultrs::api::auth::kubernetes::requests::LoginWithKubernetesRequest;
use vaultrs::api::auth::oidc::requests::JWTLoginRequest;
use vaultrs::api::auth::userpass::requests::LoginRequest as UserpassLoginRequest;

use super::super::{BuildContext, ProviderError, credentials};
use super::bad_request;
use super::errors::{login_error, server_error};
use super::secret_auth::{self, CertLogin};
use super::tokens::TokenKey;
use super::transport::{self, Transport};
use crate::api::store::VaultProvider;
use crate::secret::SecretString;
use crate::telemetry::metrics::{BackendLabels, ProviderLabel};

/// The token the store's auth method yields: the Secret's token as is, or a (cached) login.
pub(super) async fn authenticate(
    spec: &VaultProvider,
    ctx: &BuildContext<'_>,
    client: &Transport,
    ca_pem: Option<&[u8]>,
) -> Result<SecretString, ProviderError> {
    let auth = &spec.auth;
    if let Some(selector) = &auth.token_secret_ref {
        return credentials::read(ctx, selector).await;
    }
    // A token is reused only with the roots it was obtained under: after a CA change (an
    // edited caProvider ConfigMap) the next publish logs in anew over the new trust.
    let trust = match ca_pem {
        Some(pem) => format!("#ca={}", secret_auth::digest(&[pem])?),
        None => String::new(),
    };
    let key = |method: &str, mount: &str, role: &str, identity: String| TokenKey {
        server: format!("{}{trust}", spec.server),
        namespace: spec.namespace.clone().unwrap_or_default(),
        mount: format!("{method}:{mount}"),
        role: role.to_string(),
        identity,
    };
    let cache = &ctx.env.vault_tokens;
    let pod_identity = format!("{}/{}", ctx.pod.namespace, ctx.pod.service_account);
    // Who a login from credential Secrets is for: the caller who read them (a SecretStore's,
    // a referent store's), or the agent (an inline ClusterSecretStore's, in its namespace).
    let scoped = |location: &credentials::Location| credentials::reader(ctx, location);
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
        let key = key("approle", mount, &app_role.role_id, scoped(&location));
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
    if let Some(user_pass) = &auth.user_pass {
        let mount = user_pass
            .path
            .as_deref()
            .unwrap_or("userpass")
            .trim_matches('/');
        // Read BEFORE the cache lookup (as the pod, for a SecretStore): only who may read the
        // password reuses the login, and a changed password is a new key, so a new login.
        let location = credentials::locate(ctx, &user_pass.secret_ref)?;
        let password = credentials::read(ctx, &user_pass.secret_ref).await?;
        let digest = secret_auth::digest(&[password.expose().as_bytes()])?;
        let identity = format!("{}#{digest}", scoped(&location));
        let key = key("userpass", mount, &user_pass.username, identity);
        return cache
            .get(&key, renew, || async {
                count_login();
                let request = UserpassLoginRequest::builder()
                    .mount(mount)
                    .username(user_pass.username.as_str())
                    .password(password.expose())
                    .build()
                    .map_err(|_| bad_request())?;
                client
                    .login(request)
                    .await
                    .map_err(|e| login_error(e, "userpass", mount, None))
            })
            .await
            .map(|(token, _)| token);
    }
    if let Some(cert) = &auth.cert {
        let mount = cert.path.as_deref().unwrap_or("cert").trim_matches('/');
        if !spec.server.starts_with("https://") {
            return Err(ProviderError::Config(
                "vault.auth.cert needs an https:// vault.server: the certificate is the TLS \
                 client's"
                    .into(),
            ));
        }
        // As for userPass: read first, the contents' digest in the key.
        let (chain_at, key_at) = (
            credentials::locate(ctx, &cert.client_cert)?,
            credentials::locate(ctx, &cert.secret_ref)?,
        );
        let chain = credentials::read(ctx, &cert.client_cert).await?;
        let private = credentials::read(ctx, &cert.secret_ref).await?;
        let digest =
            secret_auth::digest(&[chain.expose().as_bytes(), private.expose().as_bytes()])?;
        let identity = format!("{}+{key_at}#{digest}", scoped(&chain_at));
        let key = key("cert", mount, "", identity);
        return cache
            .get(&key, renew, || async {
                let tls = secret_auth::identity(&chain, &chain_at, &private, &key_at)?;
                // Only the login carries the certificate; the token does the rest.
                let with_cert = super::new_client(spec, ca_pem, Some(tls))?;
                count_login();
                with_cert
                    .login(CertLogin {
                        mount: mount.to_string(),
                    })
                    .await
                    .map_err(|e| login_error(e, "cert", mount, None))
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
        "vault.auth needs one of tokenSecretRef, kubernetes, jwt, appRole, userPass, cert, iam"
            .into(),
    ))
}
