use super::*;
use crate::api::provider_kinds::{ProviderKind, ProviderObject};
use crate::api::store::{AwsAuth, AwsProvider, StoreProvider, VaultProvider};

fn vault(version: &str) -> ProviderObject {
    let vault: VaultProvider = serde_json::from_value(serde_json::json!({
        "server": "https://vault.example", "path": "secret", "version": version,
        "auth": {"tokenSecretRef": {"name": "t", "key": "k"}}
    }))
    .unwrap();
    ProviderObject {
        kind: ProviderKind::Vault,
        cluster: true,
        name: "vault".into(),
        provider: StoreProvider {
            vault: Some(vault),
            ..StoreProvider::default()
        },
    }
}

#[test]
fn a_valid_object_is_ready_once_per_generation() {
    let first = next(None, &vault("v2"), Some(1)).unwrap();
    assert_eq!(first.observed_generation, Some(1));
    let ready = &first.conditions[0];
    assert_eq!(
        (ready.type_.as_str(), ready.status.as_str()),
        ("Ready", "True")
    );
    assert_eq!(ready.reason.as_deref(), Some(REASON_VALID));
    // Nothing to write again for the same generation; a new one is recorded.
    assert_eq!(next(Some(&first), &vault("v2"), Some(1)), None);
    let second = next(Some(&first), &vault("v2"), Some(2)).unwrap();
    assert_eq!(second.observed_generation, Some(2));
    assert_eq!(
        second.conditions[0].last_transition_time,
        ready.last_transition_time
    );
}

#[test]
fn an_invalid_object_says_why_at_its_own_paths() {
    let invalid = next(None, &vault("v3"), Some(3)).unwrap();
    let ready = &invalid.conditions[0];
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason.as_deref(), Some(REASON_INVALID));
    let message = ready.message.as_deref().unwrap();
    assert!(message.starts_with("spec.version"), "{message}");
}

#[test]
fn agent_identity_is_refused_on_a_namespaced_object_only() {
    let mut object = ProviderObject {
        kind: ProviderKind::Aws,
        cluster: false,
        name: "shop/aws".into(),
        provider: StoreProvider {
            aws: Some(AwsProvider {
                service: "SecretsManager".into(),
                region: "eu-west-1".into(),
                auth: Some(AwsAuth {
                    agent_identity: Some(Default::default()),
                    ..AwsAuth::default()
                }),
                ..AwsProvider::default()
            }),
            ..StoreProvider::default()
        },
    };
    assert_eq!(
        next(None, &object, None).unwrap().conditions[0].status,
        "False"
    );
    object.cluster = true;
    assert_eq!(
        next(None, &object, None).unwrap().conditions[0].status,
        "True"
    );
}

#[test]
fn the_status_never_holds_a_value_of_the_spec() {
    let value = "fake-value-never-in-status-7f3a";
    let fake: crate::api::store::FakeProvider = serde_json::from_value(serde_json::json!({
        "data": [{"key": "k", "value": value}]
    }))
    .unwrap();
    let object = ProviderObject {
        kind: ProviderKind::Fake,
        cluster: true,
        name: "values".into(),
        provider: StoreProvider {
            fake: Some(fake),
            ..StoreProvider::default()
        },
    };
    let status = next(None, &object, Some(1)).unwrap();
    assert_eq!(status.conditions[0].status, "True");
    let written = serde_json::to_string(&status).unwrap();
    assert!(!written.contains(value), "{written}");
    assert!(!format!("{status:?}").contains(value));
}
