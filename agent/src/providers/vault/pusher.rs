//! The PushSecret writer of a Vault store: KV v2's ([`super::push`]) or KV v1's
//! ([`super::push_v1`]), as the store's `version` says.

use super::super::push::Pusher;
use super::super::{BuildContext, ProviderError};
use super::push::VaultPush;
use super::push_v1::VaultV1Push;
use super::{Kv, mount_and_kv};
use crate::api::store::VaultProvider;

/// Logs in as the store says, exactly as a store read does, for the store's KV version.
pub async fn pusher(
    spec: &VaultProvider,
    ctx: &BuildContext<'_>,
) -> Result<Box<dyn Pusher>, ProviderError> {
    Ok(match mount_and_kv(spec)?.1 {
        Kv::V1 => Box::new(VaultV1Push::new(spec, ctx).await?),
        Kv::V2 => Box::new(VaultPush::new(spec, ctx).await?),
    })
}
