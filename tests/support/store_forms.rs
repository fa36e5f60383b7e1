//! The two forms of a store (issue #41): the provider block inline in `spec.provider`, or in a
//! provider object of its own that the store names by `spec.providerRef`. A test written with
//! inline stores runs over both by passing its manifests or objects through a [`Form`].

use latchkey::api::provider_kinds::ProviderKind;
use latchkey::api::provider_kinds::{CLUSTER_PROVIDER_API_VERSION, PROVIDER_API_VERSION};
use serde::Deserialize as _;
use serde_json::{Value, json};

/// How a test's stores are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// As the test wrote them.
    Inline,
    /// Each store's block moved into a provider object of the same name (and namespace, for a
    /// SecretStore; cluster-scoped for a ClusterSecretStore) that the store names.
    ByReference,
}

impl Form {
    /// `objects` with each store in this form: a store by reference comes after its provider
    /// object, so an agent never sees it naming one that does not exist yet.
    pub fn objects(self, objects: impl IntoIterator<Item = Value>) -> Vec<Value> {
        let mut out = Vec::new();
        let mut moved = 0;
        for object in objects {
            if self == Form::ByReference
                && let Some(provider) = take_provider(&mut object.clone())
            {
                let mut store = object;
                let (api_version, kind, name) = (
                    provider["apiVersion"].clone(),
                    provider["kind"].clone(),
                    provider["metadata"]["name"].clone(),
                );
                let spec = store["spec"].as_object_mut().unwrap();
                spec.remove("provider");
                spec.insert(
                    "providerRef".into(),
                    json!({"apiVersion": api_version, "kind": kind, "name": name}),
                );
                out.push(provider);
                out.push(store);
                moved += 1;
            } else {
                out.push(object);
            }
        }
        // A twin that moved nothing would pass as a copy of the inline test.
        assert!(
            self == Form::Inline || moved > 0,
            "no store with an inline provider block to move"
        );
        out
    }

    /// When stores name provider objects: installs every provider kind's CRDs in `api` (the
    /// fake API server installs none by default, as a cluster installs only those it uses) and
    /// lets the agent read them, as daemonset/base/rbac.yaml does.
    pub fn prepare(self, api: &super::apiserver::FakeApiServer) {
        if self == Form::Inline {
            return;
        }
        for kind in ProviderKind::ALL {
            api.install(PROVIDER_API_VERSION, kind.name());
            api.install(CLUSTER_PROVIDER_API_VERSION, kind.name());
        }
        api.allow_agent_provider_reads();
    }

    /// Waits until the agent has watched every provider kind [`Self::prepare`] installed: its
    /// readiness does not wait for them (a kind it may not list must not hold it), and a test
    /// that counts the agent's API calls per mount must start from the watch caches.
    pub async fn watched(self, api: &super::apiserver::FakeApiServer) {
        use latchkey::api::provider_kinds::{CLUSTER_PROVIDER_GROUP, PROVIDER_GROUP};
        if self == Form::Inline {
            return;
        }
        let watches = || {
            let requests = api.requests();
            ProviderKind::ALL.iter().all(|kind| {
                [PROVIDER_GROUP, CLUSTER_PROVIDER_GROUP]
                    .iter()
                    .all(|group| {
                        let path = format!("/apis/{group}/v1alpha1/{}", kind.plural());
                        requests.iter().any(|r| r.path == path && r.is_watch())
                    })
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !watches() {
            assert!(
                std::time::Instant::now() < deadline,
                "provider kinds never watched"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// A multi-document YAML text of manifests, in this form.
    pub fn manifests(self, text: &str) -> String {
        if self == Form::Inline {
            return text.to_string();
        }
        let objects: Vec<Value> = serde_norway::Deserializer::from_str(text)
            .map(|d| serde_json::to_value(serde_norway::Value::deserialize(d).unwrap()).unwrap())
            .filter(|v: &Value| !v.is_null())
            .collect();
        self.objects(objects)
            .iter()
            .map(|o| format!("---\n{}", serde_norway::to_string(o).unwrap()))
            .collect()
    }
}

/// The provider object a store's inline block becomes, if `object` is a store with one block.
fn take_provider(object: &mut Value) -> Option<Value> {
    let cluster = match object["kind"].as_str()? {
        "SecretStore" => false,
        "ClusterSecretStore" => true,
        _ => return None,
    };
    let provider = object["spec"]["provider"].as_object()?;
    let [(block, spec)] = provider.iter().collect::<Vec<_>>()[..] else {
        return None;
    };
    let kind = ProviderKind::ALL
        .into_iter()
        .find(|k| k.block_name() == block)?;
    let mut metadata = json!({"name": object["metadata"]["name"]});
    if !cluster {
        metadata["namespace"] = object["metadata"]["namespace"].clone();
    }
    let api_version = if cluster {
        CLUSTER_PROVIDER_API_VERSION
    } else {
        PROVIDER_API_VERSION
    };
    Some(
        json!({"apiVersion": api_version, "kind": kind.name(), "metadata": metadata,
                "spec": spec}),
    )
}
