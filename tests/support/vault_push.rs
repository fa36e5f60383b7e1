//! A Vault pusher as `latchkey controller` makes one for a PushSecret's account (`shop/pusher`,
//! with a jwt for one audience), built directly, for the tests that push to OpenBao.

use std::sync::Arc;

use latchkey::api::StoreKind;
use latchkey::api::store::{VaultAuth, VaultProvider, VaultRoleAuth};
use latchkey::catalog::{Catalog, ManifestCatalog};
use latchkey::identity::PodInfo;
use latchkey::identity::tokens::{PodTokens, ServiceAccountToken};
use latchkey::providers::push::Pusher;
use latchkey::providers::{BuildContext, Env, ProviderError};
use latchkey::secret::SecretString;
use latchkey::telemetry::Metrics;

use super::openbao::JwtIssuer;

/// The providers' shared side without an API client: fresh caches, no catalog.
pub fn env() -> Env {
    let catalog: Arc<dyn Catalog> = Arc::new(ManifestCatalog::default());
    Env {
        metrics: Arc::new(Metrics::new()),
        kube: None,
        catalog,
        agent_namespace: "latchkey".into(),
        aws_sessions: Default::default(),
        vault_tokens: Default::default(),
        plugins: Default::default(),
        secrets_store: Default::default(),
    }
}

/// A pusher for `mount` (KV `version`) at `server`, logged in with jwt `role` and a token of
/// `issuer` for `audience`, as the PushSecret's account `shop/pusher`.
pub async fn vault_pusher(
    server: &str,
    issuer: &JwtIssuer,
    (audience, role): (&str, &str),
    mount: &str,
    version: &str,
) -> Result<Box<dyn Pusher>, ProviderError> {
    let spec = VaultProvider {
        server: server.to_string(),
        path: Some(mount.into()),
        version: Some(version.into()),
        auth: VaultAuth {
            jwt: Some(VaultRoleAuth {
                mount_path: None,
                role: role.into(),
                audience: Some(audience.into()),
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = ServiceAccountToken {
        token: SecretString::new(issuer.token("shop", "pusher", audience)),
        expiration: None,
    };
    let pod = PodInfo {
        namespace: "shop".into(),
        name: "push-db".into(),
        uid: String::new(),
        service_account: "pusher".into(),
        tokens: PodTokens::from_tokens([(audience.to_string(), token)]),
    };
    let env = env();
    let ctx = BuildContext {
        env: &env,
        pod: &pod,
        scope: StoreKind::SecretStore.into(),
        max_age: None,
    };
    latchkey::providers::vault::pusher::pusher(&spec, &ctx).await
}
