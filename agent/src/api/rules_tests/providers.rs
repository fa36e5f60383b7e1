//! Providers as objects (issue #41): `spec.providerRef` of stores, and every inline provider
//! sample checked again as a provider object of its kind, namespaced and cluster-scoped, where
//! the same rules sit at `spec` instead of `spec.provider.<block>`.

use std::collections::{BTreeSet, HashMap};

use serde::Deserialize;
use serde_json::{Value, json};

use super::{Expect, agree, merge, provider_samples, rejected, store_base};
use crate::api::StoreKind;
use crate::api::crd::render_providers;
use crate::api::provider_kinds::{
    AsProvider, AwsProviderObject, CLUSTER_PROVIDER_API_VERSION, ClusterAwsProviderObject,
    ClusterFakeProviderObject, ClusterKubernetesProviderObject, ClusterPluginProviderObject,
    ClusterSecretsStoreCsiProviderObject, ClusterVaultProviderObject, FakeProviderObject,
    KubernetesProviderObject, PROVIDER_API_VERSION, PluginProviderObject, ProviderKind,
    SecretsStoreCsiProviderObject, VaultProviderObject,
};
use crate::api::rules;
use crate::api::store::{ClusterSecretStore, ProviderRef, SecretStore, StoreProvider};
use crate::api::validate::{self, Invalid};

/// What `bind` checks of a store's spec: one of `provider` and `providerRef`, and the inline
/// block when there is one.
pub(super) fn store(
    provider: &StoreProvider,
    provider_ref: Option<&ProviderRef>,
    kind: StoreKind,
) -> Result<(), Invalid> {
    if validate::provider_or_ref(provider, provider_ref, kind)?.is_none() {
        validate::provider(provider, kind)?;
    }
    Ok(())
}

/// The `openAPIV3Schema` of every provider kind, keyed `<apiVersion>/<kind>`.
fn schemas() -> HashMap<String, Value> {
    let text = render_providers(&ProviderKind::ALL).unwrap();
    let mut out = HashMap::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let crd = Value::deserialize(doc).unwrap();
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap();
        let group = crd["spec"]["group"].as_str().unwrap();
        let version = &crd["spec"]["versions"][0];
        let key = format!("{group}/{}/{kind}", version["name"].as_str().unwrap());
        out.insert(key, version["schema"]["openAPIV3Schema"].clone());
    }
    out
}

fn reference(api_version: &str, kind: &str, name: &str) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "name": name})
}

/// (name, store kind, `spec` merge patch over the fake store, expected verdict).
fn ref_samples() -> Vec<(&'static str, &'static str, Value, Expect)> {
    let by_ref = |r: Value| json!({"provider": null, "providerRef": r});
    let one = rejected(format!("spec: {}", rules::PROVIDER_OR_REF.message));
    vec![
        (
            "a namespaced provider by reference",
            "SecretStore",
            by_ref(reference(PROVIDER_API_VERSION, "Vault", "vault")),
            Expect::Valid,
        ),
        (
            "a cluster-scoped provider by reference",
            "ClusterSecretStore",
            by_ref(reference(CLUSTER_PROVIDER_API_VERSION, "AWS", "aws")),
            Expect::Valid,
        ),
        (
            "inline and by reference",
            "SecretStore",
            json!({"providerRef": reference(PROVIDER_API_VERSION, "Fake", "fake")}),
            one.clone(),
        ),
        (
            "inline and by reference",
            "ClusterSecretStore",
            json!({"providerRef": reference(CLUSTER_PROVIDER_API_VERSION, "Fake", "f")}),
            one.clone(),
        ),
        ("neither", "SecretStore", json!({"provider": null}), one),
        (
            "a SecretStore naming a cluster-scoped provider",
            "SecretStore",
            by_ref(reference(CLUSTER_PROVIDER_API_VERSION, "Vault", "vault")),
            rejected(format!("spec: {}", rules::PROVIDER_REF_NAMESPACED.message)),
        ),
        (
            "a ClusterSecretStore naming a namespaced provider",
            "ClusterSecretStore",
            by_ref(reference(PROVIDER_API_VERSION, "Vault", "vault")),
            rejected(format!("spec: {}", rules::PROVIDER_REF_CLUSTER.message)),
        ),
        (
            "a provider name that is a path",
            "SecretStore",
            by_ref(reference(PROVIDER_API_VERSION, "Vault", "../vault")),
            Expect::RejectedAs {
                agent: "spec.providerRef.name: \"../vault\" is not a valid Kubernetes name".into(),
                crd: format!("spec.providerRef.name: {}", rules::DNS_SUBDOMAIN.message),
            },
        ),
    ]
}

/// Checks every sample: stores by reference, and every inline provider sample as an object.
pub(super) fn check_every_sample(
    store_schemas: &HashMap<String, Value>,
    broken: &mut BTreeSet<(String, String)>,
) {
    for (name, kind, patch, expect) in ref_samples() {
        let mut object = store_base(kind);
        merge(&mut object["spec"], &patch);
        let check = |kind| move |s: &StoreProvider, r: Option<&ProviderRef>| store(s, r, kind);
        if kind == "SecretStore" {
            let check = check(StoreKind::SecretStore);
            agree::<SecretStore>(
                store_schemas,
                kind,
                name,
                object,
                |s| check(&s.spec.provider, s.spec.provider_ref.as_ref()),
                &expect,
                broken,
            );
        } else {
            let check = check(StoreKind::ClusterSecretStore);
            agree::<ClusterSecretStore>(
                store_schemas,
                kind,
                name,
                object,
                |s| check(&s.spec.provider, s.spec.provider_ref.as_ref()),
                &expect,
                broken,
            );
        }
    }
    let schemas = schemas();
    let mut checked = 0;
    for (name, patch, expect) in provider_samples() {
        let mut provider = json!({"fake": {"data": [{"key": "k", "value": "v"}]}});
        merge(&mut provider, &patch);
        let blocks: Vec<(&String, &Value)> = provider
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, v)| !v.is_null())
            .collect();
        let [(block, spec)] = blocks.as_slice() else {
            continue; // not one block: a sample of the inline form's own rule
        };
        let kind = match block.as_str() {
            "aws" => ProviderKind::Aws,
            "vault" => ProviderKind::Vault,
            "kubernetes" => ProviderKind::Kubernetes,
            "fake" => ProviderKind::Fake,
            "plugin" => ProviderKind::Plugin,
            "secretsStoreCSI" => ProviderKind::SecretsStoreCsiProvider,
            other => panic!("{name}: unknown block {other}"),
        };
        let at = |text: &str| match text.strip_prefix(&format!("spec.provider.{block}")) {
            Some(rest) => format!("spec{rest}"),
            None => text.to_string(),
        };
        for cluster in [false, true] {
            let expect = match (&expect, name, cluster) {
                (_, "aws agent identity", false) => rejected(format!(
                    "spec: {}",
                    rules::AGENT_IDENTITY_CLUSTER_PROVIDER_ONLY.message
                )),
                (Expect::Valid, ..) => Expect::Valid,
                (Expect::Rejected(t), ..) => rejected(at(t)),
                (Expect::AgentOnly(t), ..) => Expect::AgentOnly(at(t)),
                (Expect::RejectedAs { agent, crd }, ..) => Expect::RejectedAs {
                    agent: at(agent),
                    crd: at(crd),
                },
            };
            let api_version = if cluster {
                CLUSTER_PROVIDER_API_VERSION
            } else {
                PROVIDER_API_VERSION
            };
            let mut metadata = json!({"name": "p"});
            if !cluster {
                metadata["namespace"] = json!("shop");
            }
            let object = json!({"apiVersion": api_version, "kind": kind.name(),
                                "metadata": metadata, "spec": spec});
            let key = format!("{api_version}/{}", kind.name());
            check_object(&schemas, &key, kind, cluster, name, object, &expect, broken);
            checked += 1;
        }
    }
    assert!(checked > 40, "only {checked} provider-object samples");
}

/// One provider object sample, as the typed object of its kind.
#[allow(clippy::too_many_arguments)]
fn check_object(
    schemas: &HashMap<String, Value>,
    key: &str,
    kind: ProviderKind,
    cluster: bool,
    name: &str,
    object: Value,
    expect: &Expect,
    broken: &mut BTreeSet<(String, String)>,
) {
    fn run<T: AsProvider + serde::de::DeserializeOwned + serde::Serialize>(
        schemas: &HashMap<String, Value>,
        key: &str,
        name: &str,
        object: Value,
        expect: &Expect,
        broken: &mut BTreeSet<(String, String)>,
    ) {
        agree::<T>(
            schemas,
            key,
            name,
            object,
            |o| validate::provider_object(&o.provider_object()).map(|_| ()),
            expect,
            broken,
        );
    }
    let a = (schemas, key, name, object, expect, broken);
    match (kind, cluster) {
        (ProviderKind::Aws, false) => run::<AwsProviderObject>(a.0, a.1, a.2, a.3, a.4, a.5),
        (ProviderKind::Aws, true) => run::<ClusterAwsProviderObject>(a.0, a.1, a.2, a.3, a.4, a.5),
        (ProviderKind::Vault, false) => run::<VaultProviderObject>(a.0, a.1, a.2, a.3, a.4, a.5),
        (ProviderKind::Vault, true) => {
            run::<ClusterVaultProviderObject>(a.0, a.1, a.2, a.3, a.4, a.5)
        }
        (ProviderKind::Kubernetes, false) => {
            run::<KubernetesProviderObject>(a.0, a.1, a.2, a.3, a.4, a.5)
        }
        (ProviderKind::Kubernetes, true) => {
            run::<ClusterKubernetesProviderObject>(a.0, a.1, a.2, a.3, a.4, a.5)
        }
        (ProviderKind::Fake, false) => run::<FakeProviderObject>(a.0, a.1, a.2, a.3, a.4, a.5),
        (ProviderKind::Fake, true) => {
            run::<ClusterFakeProviderObject>(a.0, a.1, a.2, a.3, a.4, a.5)
        }
        (ProviderKind::Plugin, false) => run::<PluginProviderObject>(a.0, a.1, a.2, a.3, a.4, a.5),
        (ProviderKind::Plugin, true) => {
            run::<ClusterPluginProviderObject>(a.0, a.1, a.2, a.3, a.4, a.5)
        }
        (ProviderKind::SecretsStoreCsiProvider, false) => {
            run::<SecretsStoreCsiProviderObject>(a.0, a.1, a.2, a.3, a.4, a.5)
        }
        (ProviderKind::SecretsStoreCsiProvider, true) => {
            run::<ClusterSecretsStoreCsiProviderObject>(a.0, a.1, a.2, a.3, a.4, a.5)
        }
    }
}
