//! Store status: every SecretStore's and ClusterSecretStore's `status.provider` and `Ready`
//! condition, so `kubectl get lkss,lkcss` shows the provider and whether the spec is usable, as
//! ESO's stores do. Written by the mirror controller's leader only; node agents write nothing.
//!
//! `Ready` says that the spec is one the agent accepts (one provider block, its rules, what only
//! a ClusterSecretStore may use): the same check a mount makes. Unlike ESO it does not log in to
//! the backend: a store authenticates with the identity of the pod that mounts (or of the
//! ExternalSecret's service account), and the controller has neither. The message says so.
//!
//! Not for objects the controller cannot read at all (they fail to deserialize): their status is
//! unknown, so any write could only repeat itself on every watch event. The catalog logs and
//! counts those (`latchkey_catalog_unusable_objects`).

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::{Future, FutureExt, StreamExt, future};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::{debug, warn};

use super::leader::Leadership;
use crate::api::store::{ClusterSecretStore, ProviderRef, SecretStore, StoreProvider, StoreStatus};
use crate::api::{StoreKind, validate};
use crate::catalog::Lenient;

/// `Ready` reason of a store whose spec the agent accepts (ESO's name).
pub const REASON_VALID: &str = "Valid";
/// `Ready` reason of a store whose provider block the agent refuses (ESO's name).
pub const REASON_INVALID: &str = "InvalidProviderConfig";
/// What `Ready: True` means here, since it is less than ESO's (no backend login).
const VALID_MESSAGE: &str = "the spec is valid; credentials are checked at each mount, with the \
                             identity of the pod (or of the mirrored ExternalSecret)";
/// Pause before retrying a status write the API server did not take.
const RETRY: Duration = Duration::from_secs(30);

/// What the status writer needs of a store kind.
pub trait StoreObject:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
    /// The kind, for the ClusterSecretStore-only rules.
    const KIND: StoreKind;
    /// `spec.provider`.
    fn provider(&self) -> &StoreProvider;
    /// `spec.providerRef`.
    fn provider_ref(&self) -> Option<&ProviderRef>;
    /// `status`, if any.
    fn status(&self) -> Option<&StoreStatus>;
    /// The API of this object (its namespace's, for a namespaced kind).
    fn api(&self, client: Client) -> Api<Self>;
}

impl StoreObject for SecretStore {
    const KIND: StoreKind = StoreKind::SecretStore;
    fn provider(&self) -> &StoreProvider {
        &self.spec.provider
    }
    fn provider_ref(&self) -> Option<&ProviderRef> {
        self.spec.provider_ref.as_ref()
    }
    fn status(&self) -> Option<&StoreStatus> {
        self.status.as_ref()
    }
    fn api(&self, client: Client) -> Api<Self> {
        Api::namespaced(client, &self.namespace().unwrap_or_default())
    }
}

impl StoreObject for ClusterSecretStore {
    const KIND: StoreKind = StoreKind::ClusterSecretStore;
    fn provider(&self) -> &StoreProvider {
        &self.spec.provider
    }
    fn provider_ref(&self) -> Option<&ProviderRef> {
        self.spec.provider_ref.as_ref()
    }
    fn status(&self) -> Option<&StoreStatus> {
        self.status.as_ref()
    }
    fn api(&self, client: Client) -> Api<Self> {
        Api::all(client)
    }
}

/// The status a store's spec calls for, or `None` when `current` already says it (every write
/// is a watch event for every node agent's catalog).
pub fn next(
    current: Option<&StoreStatus>,
    provider: &StoreProvider,
    kind: StoreKind,
) -> Option<StoreStatus> {
    next_for(current, provider, None, kind)
}

/// [`next`] for a store that may name its provider by `spec.providerRef`: the column shows the
/// referenced kind as the inline block would be named (`vault`), and `Ready` says whether the
/// store's own spec is valid (the provider object is checked at each mount).
pub fn next_for(
    current: Option<&StoreStatus>,
    provider: &StoreProvider,
    provider_ref: Option<&ProviderRef>,
    kind: StoreKind,
) -> Option<StoreStatus> {
    let mut names: Vec<&str> = validate::provider_blocks(provider)
        .map(|block| block.name())
        .collect();
    if let Some(r) = provider_ref {
        names.push(r.kind.block_name());
    }
    let provider_name = (!names.is_empty()).then(|| names.join(","));
    let checked =
        validate::provider_or_ref(provider, provider_ref, kind).and_then(|by_ref| match by_ref {
            Some(_) => Ok(()),
            None => validate::provider(provider, kind).map(|_| ()),
        });
    let (status, reason, message) = match checked {
        Ok(()) => ("True", REASON_VALID, VALID_MESSAGE.to_string()),
        Err(invalid) => ("False", REASON_INVALID, invalid.to_string()),
    };
    let (conditions, same) = super::status::with_ready(
        current.map_or(&[][..], |s| &s.conditions[..]),
        status,
        reason,
        &message,
    );
    if same && current.is_some_and(|s| s.provider == provider_name) {
        return None;
    }
    Some(StoreStatus {
        provider: provider_name,
        conditions,
    })
}

/// Writes store status; shared by the controllers of both kinds.
pub struct StatusWriter {
    client: Client,
    leadership: Leadership,
    dry_run: bool,
}

impl StatusWriter {
    /// A writer that writes only while `leadership` holds, and never in a dry run.
    pub fn new(client: Client, leadership: Leadership, dry_run: bool) -> Self {
        Self {
            client,
            leadership,
            dry_run,
        }
    }
}

/// Why a store's status was not written.
#[derive(Debug, thiserror::Error)]
#[error("{kind} {name}: writing the status: {source}")]
pub struct StatusError {
    kind: StoreKind,
    name: String,
    #[source]
    source: kube::Error,
}

async fn reconcile<K: StoreObject>(
    store: Arc<Lenient<K>>,
    writer: Arc<StatusWriter>,
) -> Result<Action, StatusError> {
    let Lenient::Usable(store) = &*store else {
        return Ok(Action::await_change());
    };
    let Some(status) = next_for(
        store.status(),
        store.provider(),
        store.provider_ref(),
        K::KIND,
    ) else {
        return Ok(Action::await_change());
    };
    let name = store.name_any();
    if writer.dry_run || !writer.leadership.is_leader() {
        debug!(kind = %K::KIND, %name, "store status not written (dry run or not leader)");
        return Ok(Action::await_change());
    }
    let api = store.api(writer.client.clone());
    let patch = serde_json::json!({ "status": status });
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(Action::await_change()),
        // Deleted meanwhile: nothing to report on.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Action::await_change()),
        Err(source) => Err(StatusError {
            kind: K::KIND,
            name,
            source,
        }),
    }
}

fn error_policy<K>(_: Arc<Lenient<K>>, error: &StatusError, _: Arc<StatusWriter>) -> Action {
    warn!(%error, "store status not written; retrying");
    Action::requeue(RETRY)
}

/// Runs the store-status controllers until `ended` completes: SecretStores of `namespaces`
/// (all when empty) and every ClusterSecretStore.
pub fn run(
    client: &Client,
    namespaces: &[String],
    writer: Arc<StatusWriter>,
    ended: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) -> impl Future<Output = ()> {
    let namespaced: Vec<Api<Lenient<SecretStore>>> = if namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect()
    };
    let mut runs: Vec<future::BoxFuture<'static, ()>> = namespaced
        .into_iter()
        .map(|api| drive(api, Arc::clone(&writer), ended.clone()))
        .collect();
    let cluster: Api<Lenient<ClusterSecretStore>> = Api::all(client.clone());
    runs.push(drive(cluster, writer, ended));
    async move {
        future::join_all(runs).await;
    }
}

fn drive<K: StoreObject>(
    api: Api<Lenient<K>>,
    writer: Arc<StatusWriter>,
    ended: impl Future<Output = ()> + Send + Sync + 'static,
) -> future::BoxFuture<'static, ()> {
    Controller::new(api, watcher::Config::default())
        .graceful_shutdown_on(ended)
        .run(reconcile::<K>, error_policy, writer)
        .for_each(|_| future::ready(()))
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::store::{AwsAuth, AwsProvider, FakeProvider, KubernetesProvider};

    fn fake() -> StoreProvider {
        StoreProvider {
            fake: Some(FakeProvider::default()),
            ..StoreProvider::default()
        }
    }

    #[test]
    fn a_store_by_reference_names_the_kind_and_is_ready_when_its_own_spec_is_valid() {
        use crate::api::provider_kind::{CLUSTER_PROVIDER_API_VERSION, ProviderKind};
        let reference = |api_version: &str| ProviderRef {
            api_version: api_version.into(),
            kind: ProviderKind::Vault,
            name: "vault".into(),
        };
        let good = reference(CLUSTER_PROVIDER_API_VERSION);
        let empty = StoreProvider::default();
        let ready = next_for(None, &empty, Some(&good), StoreKind::ClusterSecretStore).unwrap();
        assert_eq!(ready.provider.as_deref(), Some("vault"));
        assert_eq!(ready.conditions[0].status, "True");
        let wrong = next_for(None, &empty, Some(&good), StoreKind::SecretStore).unwrap();
        assert_eq!(wrong.conditions[0].status, "False");
        assert!(
            wrong.conditions[0]
                .message
                .as_deref()
                .unwrap()
                .contains("providerRef.apiVersion must be providers.latchkey.dev/v1alpha1"),
            "{wrong:?}"
        );
        let both = next_for(None, &fake(), Some(&good), StoreKind::ClusterSecretStore).unwrap();
        assert_eq!(both.provider.as_deref(), Some("fake,vault"));
        assert_eq!(both.conditions[0].status, "False");
    }

    #[test]
    fn a_valid_store_is_ready_and_names_its_provider_once() {
        let first = next(None, &fake(), StoreKind::SecretStore).unwrap();
        assert_eq!(first.provider.as_deref(), Some("fake"));
        let ready = &first.conditions[0];
        assert_eq!(
            (ready.type_.as_str(), ready.status.as_str()),
            ("Ready", "True")
        );
        assert_eq!(ready.reason.as_deref(), Some(REASON_VALID));
        assert_eq!(next(Some(&first), &fake(), StoreKind::SecretStore), None);
    }

    #[test]
    fn an_invalid_store_says_why_and_a_fix_moves_the_transition_time() {
        let two = StoreProvider {
            kubernetes: Some(KubernetesProvider::default()),
            ..fake()
        };
        let invalid = next(None, &two, StoreKind::SecretStore).unwrap();
        assert_eq!(invalid.provider.as_deref(), Some("kubernetes,fake"));
        let ready = &invalid.conditions[0];
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some(REASON_INVALID));
        assert!(
            ready.message.as_deref().unwrap().contains("spec.provider"),
            "{ready:?}"
        );
        let mut stale = invalid.clone();
        stale.conditions[0].last_transition_time = Some("2020-01-01T00:00:00Z".into());
        let fixed = next(Some(&stale), &fake(), StoreKind::SecretStore).unwrap();
        assert_eq!(fixed.conditions[0].status, "True");
        assert_ne!(
            fixed.conditions[0].last_transition_time.as_deref(),
            Some("2020-01-01T00:00:00Z")
        );
    }

    #[test]
    fn agent_identity_is_ready_only_on_a_cluster_store() {
        let aws = StoreProvider {
            aws: Some(AwsProvider {
                auth: Some(AwsAuth {
                    agent_identity: Some(Default::default()),
                    ..AwsAuth::default()
                }),
                service: "SecretsManager".into(),
                region: "eu-west-1".into(),
                ..AwsProvider::default()
            }),
            ..StoreProvider::default()
        };
        let namespaced = next(None, &aws, StoreKind::SecretStore).unwrap();
        assert_eq!(namespaced.conditions[0].status, "False");
        let cluster = next(None, &aws, StoreKind::ClusterSecretStore).unwrap();
        assert_eq!(cluster.conditions[0].status, "True", "{cluster:?}");
    }
}
