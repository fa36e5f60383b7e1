//! The `secretsStoreCSI` provider: a provider pod of the Kubernetes Secrets Store CSI Driver
//! (`v1alpha1.CSIDriverProvider`), on its socket `<--secrets-store-provider-dir>/<name>.sock`.
//!
//! One Mount call returns everything the store's parameters name, as files; each file is an
//! entry named by its path (see [`response`]). `remoteRef.key` picks a file by path, and
//! `dataFrom.find` lists the files, so `find: {name: {regexp: ".*"}}` mounts them all. The
//! provider never writes to disk: the request's `target_path` is a path that does not exist
//! (see [`request::TARGET_PATH`]), and providers that still write their files themselves are
//! refused. The provider is called as the pod: the attributes carry the pod's name, namespace,
//! uid, service account and its tokens for the store's `audiences` (and no others).
//!
//! All reads of one fetch share one Mount call. Fetches of one store as one identity share it
//! too, gets and `dataFrom.find` alike: while it runs, and after it succeeded for as long as
//! the fetch's refresh interval accepts (at most [`registry::MAX_MOUNT_REUSE`]), so a storm of
//! pods of one service account makes one call even where the shared value cache does not apply
//! (finds). The object versions a Mount returns are sent back on the next one for the same store
//! and identity.

mod registry;
mod request;
mod response;

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use csi_proto::secrets_store::v1alpha1::{MountRequest, MountResponse};
use tokio::sync::OnceCell;
use tonic::transport::Channel;

pub use registry::{DEFAULT_PROVIDER_DIR, SecretsStoreProviders};
pub use request::TARGET_PATH;

use super::plugin::status::{self, Callee};
use super::{BuildContext, FindQuery, Provider, ProviderError, RemoteKey, grpc_answer};
use crate::api::store::SecretsStoreCsiProvider;
use crate::api::validate::plugin as validate;
use crate::secret::{SecretBytes, SecretString};

/// The RPC called, for an UNIMPLEMENTED answer.
const MOUNT_RPC: &str = "v1alpha1.CSIDriverProvider/Mount";
/// The Mount call, for [`grpc_answer::unary`].
const MOUNT: grpc_answer::Method = grpc_answer::Method {
    path: "/v1alpha1.CSIDriverProvider/Mount",
    service: "v1alpha1.CSIDriverProvider",
    method: "Mount",
    nested: &[],
};

/// One store's provider, for one fetch as one pod.
pub struct SecretsStoreCsi {
    /// `secretsStoreCSI provider <name>`, for messages.
    what: String,
    channel: Channel,
    /// The request's attributes JSON; holds the pod's tokens.
    attributes: SecretString,
    /// The request's secrets JSON (the store's `nodePublishSecretRef`, else `{}`).
    secrets: SecretString,
    timeout: Duration,
    /// Names the store and identity whose Mount is shared and whose object versions are kept.
    key: String,
    /// How old a shared Mount this fetch accepts.
    max_age: Option<Duration>,
    shared: Arc<SecretsStoreProviders>,
    /// The one Mount of this fetch, its failure included (so N reads never make N calls).
    mounted: OnceCell<Result<Arc<response::Mounted>, ProviderError>>,
}

impl SecretsStoreCsi {
    /// Checks the spec, opens the provider's socket (no symbolic link), builds the attributes
    /// for `ctx.pod` and reads the `nodePublishSecretRef` Secret; nothing is sent yet.
    pub async fn new(
        spec: &SecretsStoreCsiProvider,
        ctx: &BuildContext<'_>,
    ) -> Result<Self, ProviderError> {
        let timeout =
            validate::secrets_store_csi(spec).map_err(|e| ProviderError::Config(e.to_string()))?;
        let what = format!("secretsStoreCSI provider {}", spec.provider);
        let shared = Arc::clone(&ctx.env.secrets_store);
        let channel = shared.channel(&what, &spec.provider)?;
        let attributes = request::attributes(spec, ctx.pod)?;
        let secrets = match &spec.node_publish_secret_ref {
            None => SecretString::new(request::NO_SECRETS.to_owned()),
            Some(r) => {
                let data = super::credentials::read_all(ctx, &r.name)
                    .await
                    .map_err(|e| node_publish_error(&what, e))?;
                request::secrets(&data)?
            }
        };
        Ok(Self {
            what,
            channel,
            attributes,
            secrets,
            timeout,
            key: shared_key(spec, ctx),
            max_age: ctx.max_age,
            shared,
            mounted: OnceCell::new(),
        })
    }

    /// The files, from the one Mount of this fetch (shared with other fetches, see the module).
    async fn mounted(&self) -> Result<Arc<response::Mounted>, ProviderError> {
        self.mounted
            .get_or_init(|| async {
                let shared = self.shared.mount(&self.key, self.max_age);
                let (_, result) = shared
                    .get_or_init(|| async {
                        // The start, not the end: the files are at least this fresh.
                        let started = Instant::now();
                        (started, self.mount().await.map(Arc::new))
                    })
                    .await;
                result.clone()
            })
            .await
            .clone()
    }

    /// One Mount call, bounded by the store's timeout.
    async fn mount(&self) -> Result<response::Mounted, ProviderError> {
        let callee = Callee {
            what: &self.what,
            rpc: MOUNT_RPC,
            timeout_field: "secretsStoreCSI.timeout",
        };
        let mut request = tonic::Request::new(MountRequest {
            attributes: self.attributes.expose().to_owned(),
            secrets: self.secrets.expose().to_owned(),
            target_path: request::TARGET_PATH.to_owned(),
            permission: request::PERMISSION.to_owned(),
            current_object_version: self.shared.versions(&self.key),
        });
        request.set_timeout(self.timeout);
        // Its files and versions are counted before they are decoded (see `grpc_answer`).
        let call = grpc_answer::unary::<_, MountResponse>(self.channel.clone(), &MOUNT, request);
        let (answer, _held) = match tokio::time::timeout(self.timeout, call).await {
            Err(_) => return Err(status::timed_out_of(&callee, self.timeout).error),
            Ok(Err(s)) => return Err(status::failure_of(&callee, self.timeout, &s).error),
            Ok(Ok(answer)) => {
                let counted = answer.into_inner();
                (counted.value, counted.held)
            }
        };
        let mounted = response::mounted(&self.what, answer)?;
        self.shared
            .set_versions(self.key.clone(), mounted.versions.clone());
        Ok(mounted)
    }
}

/// A failure to read the `nodePublishSecretRef` Secret, saying which store field it is.
fn node_publish_error(what: &str, e: ProviderError) -> ProviderError {
    let at = |m: String| format!("{what}: nodePublishSecretRef: {m}");
    match e {
        ProviderError::PermissionDenied(m) => ProviderError::PermissionDenied(at(m)),
        ProviderError::Unavailable(m) => ProviderError::Unavailable(at(m)),
        ProviderError::Throttled(m) => ProviderError::Throttled(at(m)),
        ProviderError::Timeout(m) => ProviderError::Timeout(at(m)),
        ProviderError::Config(m) => ProviderError::Config(at(m)),
        ProviderError::TooLarge(m) => ProviderError::TooLarge(at(m)),
        ProviderError::NotFound => ProviderError::Config(at("the Secret was not found".into())),
        other => other,
    }
}

/// Names a store (its provider block) and the identity it is read as, without holding either.
fn shared_key(spec: &SecretsStoreCsiProvider, ctx: &BuildContext<'_>) -> String {
    let mut hasher = DefaultHasher::new();
    spec.provider.hash(&mut hasher);
    spec.parameters.hash(&mut hasher);
    spec.audiences.hash(&mut hasher);
    // Another credential Secret, another Mount: what a provider returns may depend on it.
    spec.node_publish_secret_ref
        .as_ref()
        .map(|r| &r.name)
        .hash(&mut hasher);
    format!(
        "{}/{}/{:016x}",
        ctx.pod.namespace,
        ctx.pod.service_account,
        hasher.finish()
    )
}

#[async_trait]
impl Provider for SecretsStoreCsi {
    async fn get(&self, key: &RemoteKey) -> Result<SecretBytes, ProviderError> {
        if key.version.is_some() {
            return Err(ProviderError::Config(format!(
                "{}: remoteRef.version is not available; the provider picks versions from its \
                 parameters",
                self.what
            )));
        }
        let mounted = self.mounted().await?;
        mounted
            .files
            .get(&key.key)
            .cloned()
            .ok_or(ProviderError::NotFound)
    }

    async fn find(&self, query: &FindQuery) -> Result<Vec<(String, SecretBytes)>, ProviderError> {
        let mounted = self.mounted().await?;
        let matched = mounted
            .files
            .iter()
            .filter(|(name, _)| query.matches(name))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        super::found(matched)
    }
}
