//! Provider status (issue #41, ESO design 007's provider reconciler): the real `latchkey
//! controller` on the fake API server sets each provider object's `Ready` condition from the
//! agent's own validation, with `observedGeneration`, writes only on change, and never watches a
//! provider kind whose CRD is not installed.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::apiserver::{FakeApiServer, Identity};
use support::controller::ControllerProcess;

const CONTROLLER_TOKEN: &str = "controller-token-provider-status-e2e";
const NS: &str = "providers.latchkey.dev/v1alpha1";
const CLUSTER: &str = "cluster.providers.latchkey.dev/v1alpha1";

fn vault(api_version: &str, name: &str, version: &str) -> Value {
    let mut metadata = json!({"name": name});
    if api_version == NS {
        metadata["namespace"] = json!("shop");
    }
    json!({"apiVersion": api_version, "kind": "Vault", "metadata": metadata,
        "spec": {"server": "https://vault.example:8200", "path": "secret", "version": version,
            "auth": {"tokenSecretRef": {"name": "vault-token", "key": "token"}}}})
}

/// The `Ready` condition (status, reason, message) and `observedGeneration` of an object, once
/// its observed generation is its generation.
fn ready(api: &FakeApiServer, api_version: &str, name: &str) -> Option<(String, String, String)> {
    let namespace = (api_version == NS).then_some("shop");
    let object = api.get(api_version, "Vault", namespace, name)?;
    let generation = object.pointer("/metadata/generation")?.as_i64()?;
    if object.pointer("/status/observedGeneration")?.as_i64()? != generation {
        return None;
    }
    let conditions = object.pointer("/status/conditions")?.as_array()?;
    let c = conditions.iter().find(|c| c["type"] == "Ready")?;
    Some((
        c["status"].as_str()?.to_string(),
        c["reason"].as_str()?.to_string(),
        c["message"].as_str().unwrap_or_default().to_string(),
    ))
}

async fn eventually_ready(
    api: &FakeApiServer,
    c: &ControllerProcess,
    api_version: &str,
    name: &str,
    status: &str,
) -> (String, String, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(r) = ready(api, api_version, name).filter(|r| r.0 == status) {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "{api_version} {name} never Ready={status}: {:?}\n{}",
            api.get(
                api_version,
                "Vault",
                (api_version == NS).then_some("shop"),
                name
            ),
            c.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_sets_ready_on_provider_objects_and_follows_edits() {
    let api = FakeApiServer::start().await;
    let controller = Identity::service_account("latchkey", "latchkey-controller");
    api.add_identity(CONTROLLER_TOKEN, controller.clone());
    assert!(api.allow_roles_of(controller, "daemonset/components/mirror/rbac.yaml") > 10);
    for ns in ["shop", "latchkey"] {
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    // Only the Vault kinds are installed: the Fake kinds are never watched.
    api.install(NS, "Vault");
    api.install(CLUSTER, "Vault");
    api.apply(vault(CLUSTER, "good", "v2"));
    api.apply(vault(CLUSTER, "bad", "v3"));
    api.apply(vault(NS, "good", "v1"));
    let c = ControllerProcess::start(
        &api.kubeconfig_yaml(CONTROLLER_TOKEN),
        "provider-status",
        &[],
    )
    .await;

    let (_, reason, message) = eventually_ready(&api, &c, CLUSTER, "good", "True").await;
    assert_eq!(reason, "Valid");
    assert!(message.contains("the spec is valid"), "{message}");
    let (_, reason, message) = eventually_ready(&api, &c, CLUSTER, "bad", "False").await;
    assert_eq!(reason, "InvalidProviderConfig");
    assert!(message.starts_with("spec.version"), "{message}");
    eventually_ready(&api, &c, NS, "good", "True").await;

    // Written once: a while later, no second status write for an unchanged object.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes = |name: &str| {
        api.requests()
            .iter()
            .filter(|r| {
                r.method == "PATCH" && r.path == format!("/apis/{CLUSTER}/vaults/{name}/status")
            })
            .count()
    };
    assert_eq!(writes("good"), 1);

    // Edits flip it, both ways, and observedGeneration follows.
    api.apply(vault(CLUSTER, "good", "v9"));
    api.apply(vault(CLUSTER, "bad", "v2"));
    eventually_ready(&api, &c, CLUSTER, "good", "False").await;
    eventually_ready(&api, &c, CLUSTER, "bad", "True").await;
    assert_eq!(writes("good"), 2);

    let requests = api.requests();
    let fakes: Vec<&str> = requests
        .iter()
        .map(|r| r.path.as_str())
        .filter(|p| p.contains("/fakes"))
        .collect();
    assert!(
        fakes.is_empty(),
        "a kind not installed is watched: {fakes:?}"
    );
}
