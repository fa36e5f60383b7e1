//! `caProvider`: a PEM CA bundle kept in one key of a Secret or ConfigMap (as ESO), read with
//! the rules of credential Secrets (see [`credentials`](super::credentials)): a SecretStore's
//! from its own namespace, as the pod in a cluster; a ClusterSecretStore's from the agent's
//! namespace only, as the agent. Read at every login or connection, so an edited bundle is used
//! from the next one on; bounded to [`MAX_CA_BUNDLE_LEN`] bytes.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

use super::{BuildContext, ProviderError, credentials};
use crate::api::rules::MAX_CA_BUNDLE_LEN;
use crate::api::store::{CaProvider, CaProviderKind, SecretKeySelector};

/// The PEM text `ca` names; `field` (e.g. `vault.caProvider`) names it in messages.
pub async fn read(
    ctx: &BuildContext<'_>,
    field: &str,
    ca: &CaProvider,
) -> Result<Vec<u8>, ProviderError> {
    let selector = SecretKeySelector {
        name: ca.name.clone(),
        key: ca.key.clone(),
        namespace: ca.namespace.clone(),
    };
    let pem = match ca.kind {
        CaProviderKind::Secret => credentials::read(ctx, &selector)
            .await?
            .expose()
            .as_bytes()
            .to_vec(),
        CaProviderKind::ConfigMap => config_map(ctx, &selector).await?,
    };
    if pem.len() > MAX_CA_BUNDLE_LEN {
        return Err(ProviderError::Config(format!(
            "{field}: the CA bundle is larger than {} KiB",
            MAX_CA_BUNDLE_LEN >> 10
        )));
    }
    Ok(pem)
}

/// A ConfigMap key, where and as whom a credential Secret of the same store would be read.
async fn config_map(
    ctx: &BuildContext<'_>,
    selector: &SecretKeySelector,
) -> Result<Vec<u8>, ProviderError> {
    let location = credentials::locate(ctx, selector)?;
    let (namespace, name, key) = (&location.namespace, &location.name, &location.key);
    let missing = || ProviderError::Config(format!("ConfigMap {namespace}/{name} not found"));
    let map = match (location.as_caller, &ctx.env.kube) {
        (true, Some(kube)) => {
            let as_pod = super::kubernetes::pod_client(Some(kube), ctx.pod, "")?;
            Api::<ConfigMap>::namespaced(as_pod, namespace)
                .get_opt(name)
                .await
                .map_err(super::kubernetes::api_error)?
                .ok_or_else(missing)?
        }
        _ => ctx
            .env
            .catalog
            .config_map(namespace, name)
            .await
            .map_err(|e| ProviderError::Unavailable(e.to_string()))?
            .ok_or_else(missing)?
            .as_ref()
            .clone(),
    };
    let text = map.data.and_then(|mut d| d.remove(key));
    let binary = || map.binary_data.as_ref()?.get(key).map(|b| b.0.clone());
    text.map(String::into_bytes).or_else(binary).ok_or_else(|| {
        ProviderError::Config(format!("ConfigMap {namespace}/{name} has no key {key:?}"))
    })
}
