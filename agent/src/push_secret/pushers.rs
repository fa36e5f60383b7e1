//! Which [`Pusher`] writes a store, as the PushSecret's service account: the `fake` provider's
//! in-memory one, AWS Secrets Manager, Vault KV v2, the kubernetes provider and plugins with the
//! account's tokens under the mirror's consent and token rules (exactly as the mirror fetches as
//! `spec.serviceAccountName`), and for every other provider an answer of
//! [`PushError::Unimplemented`] naming it.

use std::sync::Arc;

use async_trait::async_trait;

use crate::api::validate::ProviderSpec;
use crate::api::{CredentialScope, StoreKind};
use crate::identity::PodInfo;
use crate::mirror::consent;
use crate::mirror::tokens::TokenMinter;
use crate::providers::aws::push::AwsPush;
use crate::providers::fake_push::FakePush;
use crate::providers::kubernetes::push::KubernetesPush;
use crate::providers::plugin::push::PluginPush;
use crate::providers::push::{PushError, Pusher, unimplemented};
use crate::providers::vault::pusher::pusher as vault_pusher;
use crate::providers::{BuildContext, Env, ProviderError};

/// The store a push goes to, as resolved for one PushSecret.
pub struct StoreTarget<'a> {
    /// The PushSecret's namespace.
    pub namespace: &'a str,
    /// The PushSecret's name.
    pub push_secret: &'a str,
    /// The account the store is written as.
    pub service_account: &'a str,
    /// Kind of the store.
    pub kind: StoreKind,
    /// Where its credential references may point (referent: as the PushSecret's account).
    pub scope: CredentialScope,
    /// Name of the store.
    pub store: &'a str,
    /// Its (validated) provider block.
    pub spec: ProviderSpec<'a>,
}

/// Makes the pusher of a store for one account.
#[async_trait]
pub trait Pushers: Send + Sync {
    /// The pusher of `target`, or why there is none (names the store, never a token).
    async fn pusher(&self, target: &StoreTarget<'_>) -> Result<Arc<dyn Pusher>, PushError>;
}

/// The pushers of `latchkey controller`.
pub struct StorePushers {
    /// The providers' shared side (sessions, metrics, the API client's settings).
    pub env: Env,
    /// The mirror's token minter (opt-in annotation enforced there).
    pub minter: Arc<TokenMinter>,
    /// `--allow-agent-identity`.
    pub allow_agent_identity: bool,
}

/// The fake provider's store id: unique per store object.
pub fn fake_store_id(kind: StoreKind, namespace: &str, store: &str) -> String {
    match kind {
        StoreKind::SecretStore => format!("{kind}/{namespace}/{store}"),
        StoreKind::ClusterSecretStore => format!("{kind}/{store}"),
    }
}

impl StorePushers {
    /// The PushSecret's service account as the identity a store is written with: its tokens
    /// for the audiences the store needs, minted under the mirror's consent rules (the
    /// account's opt-in annotation is checked by the minter).
    async fn account(&self, target: &StoreTarget<'_>) -> Result<PodInfo, PushError> {
        let audiences = consent::audiences(target.spec, target.scope, self.allow_agent_identity)
            .map_err(|e| ProviderError::Config(e.to_string()))?;
        let tokens = self
            .minter
            .tokens(target.namespace, target.service_account, &audiences)
            .await
            .map_err(|e| ProviderError::Config(e.to_string()))?;
        Ok(PodInfo {
            namespace: target.namespace.to_string(),
            name: target.push_secret.to_string(),
            uid: String::new(),
            service_account: target.service_account.to_string(),
            tokens,
        })
    }

    fn context<'a>(&'a self, target: &StoreTarget<'_>, pod: &'a PodInfo) -> BuildContext<'a> {
        BuildContext {
            env: &self.env,
            pod,
            scope: target.scope,
            max_age: None,
        }
    }
}

#[async_trait]
impl Pushers for StorePushers {
    async fn pusher(&self, target: &StoreTarget<'_>) -> Result<Arc<dyn Pusher>, PushError> {
        match target.spec {
            ProviderSpec::Fake(fake) => Ok(Arc::new(FakePush::new(
                fake_store_id(target.kind, target.namespace, target.store),
                fake,
            )?)),
            ProviderSpec::Aws(aws) => {
                let pod = self.account(target).await?;
                let ctx = self.context(target, &pod);
                Ok(Arc::new(AwsPush::new(aws, &ctx).await?))
            }
            ProviderSpec::Vault(vault) => {
                let pod = self.account(target).await?;
                let ctx = self.context(target, &pod);
                Ok(Arc::from(vault_pusher(vault, &ctx).await?))
            }
            ProviderSpec::Kubernetes(kubernetes) => {
                let pod = self.account(target).await?;
                let ctx = self.context(target, &pod);
                Ok(Arc::new(KubernetesPush::new(kubernetes, &ctx).await?))
            }
            ProviderSpec::Plugin(plugin) => {
                let pod = self.account(target).await?;
                let ctx = self.context(target, &pod);
                Ok(Arc::new(PluginPush::new(plugin, &ctx).await?))
            }
            ProviderSpec::SecretsStoreCsi(_) => Err(unimplemented("secretsStoreCSI")),
        }
    }
}
