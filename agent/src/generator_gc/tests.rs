use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::cleanup::{self, CleanupError};
use super::*;
use crate::api::generator::GeneratorObject;
use crate::api::generator::GeneratorStateSpec;
use crate::generators::{GeneratorError, GeneratorSpec};
use crate::identity::{PodInfo, PodTokens, ServiceAccountToken};
use crate::providers::ProviderError;
use crate::secret::SecretString;

const TOKEN: &str = "eyJ-minted-token-never-shown";

fn state(resource: Value, recorded: Option<Value>) -> GeneratorState {
    let mut s = GeneratorState::new(
        "pw-1",
        GeneratorStateSpec {
            resource,
            state: recorded,
            garbage_collection_deadline: None,
        },
    );
    s.metadata.namespace = Some("shop".into());
    s.metadata.labels = Some(
        [
            ("generators.latchkey.dev/service-account", "web"),
            ("generators.latchkey.dev/pod", "web-0"),
            ("generators.latchkey.dev/pod-uid", "uid-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    s
}

/// A generator as `GeneratorObject::to_resource` records it.
fn resource(kind: &str, spec: Value) -> Value {
    json!({"apiVersion": "generators.latchkey.dev/v1alpha1", "kind": kind,
        "metadata": {"name": "gen", "namespace": "shop"}, "spec": spec})
}

fn password() -> Value {
    resource("Password", json!({}))
}

fn vault() -> Value {
    resource(
        "VaultDynamicSecret",
        json!({"path": "pki/issue/example-dot-com", "method": "POST",
            "provider": {"server": "http://127.0.0.1:1",
                         "auth": {"kubernetes": {"role": "shop", "audience": "vault"}}}}),
    )
}

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

#[test]
fn a_state_being_deleted_with_our_finalizer_is_cleaned_up() {
    let mut s = state(password(), None);
    s.metadata.deletion_timestamp = Some(Time(at("2026-11-29T01:00:00Z")));
    assert_eq!(step(&s, at("2026-11-29T01:00:30Z")), Step::Nothing(None));
    s.metadata.finalizers = Some(vec![CLEANUP_FINALIZER.into()]);
    assert_eq!(
        step(&s, at("2026-11-29T01:00:30Z")),
        Step::Cleanup {
            elapsed: Duration::from_secs(30)
        }
    );
    // A controller clock behind the API server's does not make a negative age.
    assert_eq!(
        step(&s, at("2026-11-29T00:59:00Z")),
        Step::Cleanup {
            elapsed: Duration::ZERO
        }
    );
}

#[test]
fn a_deadline_is_waited_for_then_collected_and_a_bad_one_ignored() {
    let mut s = state(password(), None);
    let now = at("2026-11-29T01:00:00Z");
    assert_eq!(step(&s, now), Step::Nothing(None));
    s.spec.garbage_collection_deadline = Some("2026-11-29T01:02:00Z".into());
    assert_eq!(step(&s, now), Step::WaitFor(Duration::from_secs(120)));
    s.spec.garbage_collection_deadline = Some("2026-11-29T01:00:00+00:00".into());
    assert_eq!(step(&s, now), Step::Collect);
    for bad in ["tomorrow".to_string(), "9".repeat(10_000)] {
        s.spec.garbage_collection_deadline = Some(bad);
        let Step::Nothing(Some(why)) = step(&s, now) else {
            panic!("an unreadable deadline is not acted on");
        };
        assert!(why.len() < 200, "{why}");
    }
}

#[test]
fn retries_thin_out_and_never_pass_the_timeout() {
    let timeout = Duration::from_secs(300);
    let mut elapsed = Duration::ZERO;
    let mut attempts = 0;
    while elapsed < timeout {
        let wait = retry_after(elapsed, timeout);
        assert!(wait <= Duration::from_secs(30));
        elapsed += wait;
        attempts += 1;
    }
    assert_eq!(elapsed, timeout, "the last attempt is at the timeout");
    assert!((10..40).contains(&attempts), "{attempts} attempts");
}

#[test]
fn the_resource_is_read_as_a_generator_or_refused() {
    assert!(matches!(
        cleanup::decode(&resource("Password", json!({"length": 12}))),
        Ok(GeneratorObject::Password(p)) if p.spec.length == 12
    ));
    assert!(matches!(
        cleanup::decode(&vault()),
        Ok(GeneratorObject::VaultDynamicSecret(_))
    ));
    let cluster = json!({"apiVersion": "generators.latchkey.dev/v1alpha1",
        "kind": "ClusterGenerator", "metadata": {"name": "gen"},
        "spec": {"kind": "Password", "generator": {"passwordSpec": {"length": 9}}}});
    assert!(matches!(
        cleanup::decode(&cluster),
        Ok(GeneratorObject::Cluster(_))
    ));
    let mut hollow = cluster.clone();
    hollow["spec"]["generator"] = json!({});
    for bad in [
        resource("Secret", json!({})),
        json!({"spec": {}}),
        resource("VaultDynamicSecret", json!({"path": 3})),
        resource("Password", json!({"length": 0})),
        resource("Password", json!({"pad": "x".repeat(100_000)})),
        hollow,
    ] {
        let e = cleanup::decode(&bad).unwrap_err();
        assert!(e.is_permanent(), "{e}");
        assert!(e.to_string().len() < 600, "{e}");
    }
    assert_eq!(kind_label(&state(vault(), None)), "VaultDynamicSecret");
    assert_eq!(kind_label(&state(cluster, None)), "Password");
    assert_eq!(
        kind_label(&state(json!({"kind": "x".repeat(1000)}), None)),
        "unknown"
    );
}

/// Records who cleanup was asked of; refuses service accounts that did not opt in.
#[derive(Default)]
struct Recorder {
    opted_in: bool,
    backend_fails: bool,
    minted_for: Mutex<Vec<(String, String)>>,
    cleaned_as: Mutex<Vec<(PodInfo, Value)>>,
}

#[async_trait]
impl Identities for Recorder {
    async fn tokens(
        &self,
        namespace: &str,
        service_account: &str,
        _generator: GeneratorSpec<'_>,
    ) -> Result<PodTokens, IdentityError> {
        self.minted_for
            .lock()
            .unwrap()
            .push((namespace.into(), service_account.into()));
        if !self.opted_in {
            return Err(IdentityError {
                message: format!("service account {namespace}/{service_account} did not opt in"),
                permanent: false,
            });
        }
        let token = ServiceAccountToken {
            token: SecretString::new(TOKEN.to_string()),
            expiration: None,
        };
        Ok(PodTokens::from_tokens([("vault".to_string(), token)]))
    }
}

#[async_trait]
impl Cleaner for Recorder {
    async fn cleanup(
        &self,
        _generator: GeneratorSpec<'_>,
        identity: &PodInfo,
        state: &Value,
    ) -> Result<(), GeneratorError> {
        self.cleaned_as
            .lock()
            .unwrap()
            .push((identity.clone(), state.clone()));
        if self.backend_fails {
            return Err(ProviderError::PermissionDenied("permission denied".into()).into());
        }
        Ok(())
    }
}

#[tokio::test]
async fn cleanup_acts_as_the_state_s_own_service_account() {
    let recorder = Recorder {
        opted_in: true,
        ..Default::default()
    };
    let s = state(vault(), Some(json!({"leaseId": "pki/issue/x/abc"})));
    cleanup::clean(
        &s,
        &json!({"leaseId": "pki/issue/x/abc"}),
        &recorder,
        &recorder,
    )
    .await
    .unwrap();
    let cleaned = recorder.cleaned_as.lock().unwrap();
    let (identity, recorded) = &cleaned[0];
    assert_eq!(
        (
            identity.namespace.as_str(),
            identity.service_account.as_str()
        ),
        ("shop", "web")
    );
    assert_eq!(
        (identity.name.as_str(), identity.uid.as_str()),
        ("web-0", "uid-1")
    );
    assert_eq!(recorded["leaseId"], "pki/issue/x/abc");
}

#[tokio::test]
async fn a_service_account_without_opt_in_is_never_cleaned_up_as_anyone() {
    let recorder = Recorder::default();
    let s = state(vault(), Some(json!({"leaseId": "l"})));
    let e = cleanup::clean(&s, &json!({"leaseId": "l"}), &recorder, &recorder)
        .await
        .unwrap_err();
    assert!(matches!(e, CleanupError::Identity(_)), "{e}");
    assert!(
        !e.is_permanent(),
        "retried until the timeout, then released"
    );
    assert!(
        recorder.cleaned_as.lock().unwrap().is_empty(),
        "no cleanup ran without the service account's token"
    );
    // No identity at all, or a forged one: refused before anything is minted.
    for labels in [None, Some("../controller"), Some("")] {
        let mut s = state(vault(), Some(json!({"leaseId": "l"})));
        let map = s.metadata.labels.as_mut().unwrap();
        map.remove("generators.latchkey.dev/service-account");
        if let Some(sa) = labels {
            map.insert("generators.latchkey.dev/service-account".into(), sa.into());
        }
        let e = cleanup::clean(&s, &json!({}), &recorder, &recorder)
            .await
            .unwrap_err();
        assert!(e.is_permanent(), "{e}");
    }
    assert_eq!(recorder.minted_for.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_failed_cleanup_names_the_kind_and_never_the_token() {
    let recorder = Recorder {
        opted_in: true,
        backend_fails: true,
        ..Default::default()
    };
    let s = state(vault(), Some(json!({"leaseId": "l"})));
    let e = cleanup::clean(&s, &json!({"leaseId": "l"}), &recorder, &recorder)
        .await
        .unwrap_err();
    assert!(!e.is_permanent());
    let shown = format!("{e} {e:?}");
    assert!(shown.contains("VaultDynamicSecret"), "{shown}");
    assert!(!shown.contains(TOKEN), "{shown}");
    let cleaned = recorder.cleaned_as.lock().unwrap();
    assert!(!format!("{:?}", cleaned[0].0).contains(TOKEN));
}
