//! End to end: the real `latchkey controller` against the fake API server writes the
//! ExternalSecrets of a ClusterExternalSecret into the namespaces it selects (by name, by any
//! of its selectors), follows namespace labels and spec changes, never touches an
//! ExternalSecret that is not its own, reports all of it in its status, and the mirror then
//! writes the Secret of a created ExternalSecret as of any other.
//!
//! The fake API server has no background garbage collector: `collect_garbage` does at once what
//! the real one does when the ClusterExternalSecret is deleted (its ExternalSecrets are its
//! dependents); the controller itself does nothing then.

mod support;

use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};
use support::apiserver::{FakeApiServer, Identity};
use support::controller::ControllerProcess;

const CONTROLLER_TOKEN: &str = "controller-token-ces";
const PASSWORD: &str = "ces-e2e-hunter2";
const API: &str = "latchkey.dev/v1alpha1";

async fn cluster() -> FakeApiServer {
    let s = FakeApiServer::start().await;
    let who = Identity::service_account("latchkey", "latchkey-controller");
    s.add_identity(CONTROLLER_TOKEN, who.clone());
    // Exactly what the deploy files grant: a missing permission fails here.
    let granted = s.allow_roles_of(who, "daemonset/components/mirror/rbac.yaml");
    assert!(granted > 10);
    for (ns, team) in [
        ("latchkey", None),
        ("default", None),
        ("shop", Some("shop")),
        ("billing", Some("billing")),
        ("legacy", None),
        ("other", Some("other")),
    ] {
        namespace(&s, ns, team);
        s.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": ns}}));
    }
    s.apply(json!({"apiVersion": API, "kind": "SecretStore",
    "metadata": {"name": "vault-like", "namespace": "shop"},
    "spec": {"provider": {"fake": {"data": [
        {"key": "shared/db", "value": json!({"password": PASSWORD}).to_string()}
    ]}}}}));
    s
}

fn namespace(s: &FakeApiServer, name: &str, team: Option<&str>) {
    let labels = team.map_or(json!({}), |t| json!({ "team": t }));
    s.apply(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": labels}}));
}

fn cluster_external_secret(refresh_interval: &str) -> Value {
    json!({"apiVersion": API, "kind": "ClusterExternalSecret",
    "metadata": {"name": "shared-db"},
    "spec": {
        "externalSecretName": "db",
        "externalSecretMetadata": {"labels": {"app": "web"}},
        "namespaces": ["legacy"],
        "namespaceSelectors": [{"matchLabels": {"team": "shop"}},
                               {"matchExpressions": [{"key": "team", "operator": "In",
                                                      "values": ["billing"]}]}],
        "refreshTime": "1m",
        "externalSecretSpec": {
            "secretStoreRef": {"name": "vault-like"},
            "refreshInterval": refresh_interval,
            "data": [{"secretKey": "password",
                      "remoteRef": {"key": "shared/db", "property": "password"}}],
            "target": {"creationPolicy": "Owner"},
        },
    }})
}

fn external(s: &FakeApiServer, namespace: &str) -> Option<Value> {
    s.get(API, "ExternalSecret", Some(namespace), "db")
}

fn ces(s: &FakeApiServer, name: &str) -> Value {
    s.get(API, "ClusterExternalSecret", None, name)
        .expect("the ClusterExternalSecret")
}

/// Where the controller logs; a timeout shows it.
static LOG: std::sync::Mutex<Option<std::path::PathBuf>> = std::sync::Mutex::new(None);

/// Polls `check` every 50 ms for up to `within`.
async fn eventually<T>(within: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        if Instant::now() >= deadline {
            let log = LOG.lock().unwrap().clone();
            let text = log.map(|p| std::fs::read_to_string(p).unwrap_or_default());
            panic!(
                "timed out waiting for {what}; controller log:\n{}",
                text.unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the status of ClusterExternalSecret `name` lists `provisioned` and `failed`
/// namespaces.
async fn status_of(s: &FakeApiServer, name: &str, provisioned: &[&str], failed: &[&str]) -> Value {
    eventually(
        Duration::from_secs(15),
        &format!("status provisioned {provisioned:?}, failed {failed:?}"),
        || {
            let status = ces(s, name)["status"].clone();
            let names = |key: &str, field: Option<&str>| -> Vec<String> {
                status[key]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| field.map_or(v, |f| &v[f]).as_str())
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default()
            };
            (names("provisionedNamespaces", None) == provisioned
                && names("failedNamespaces", Some("namespace")) == failed)
                .then_some(status)
        },
    )
    .await
}

/// [`status_of`] `shared-db`.
async fn status_is(s: &FakeApiServer, provisioned: &[&str], failed: &[&str]) -> Value {
    status_of(s, "shared-db", provisioned, failed).await
}

#[tokio::test(flavor = "multi_thread")]
async fn external_secrets_follow_the_namespaces_a_cluster_external_secret_selects() {
    let s = cluster().await;
    // Someone's own ExternalSecret of that name in a matching namespace: never taken over.
    let foreign = s.apply(json!({"apiVersion": API, "kind": "ExternalSecret",
        "metadata": {"name": "db", "namespace": "billing"},
        "spec": {"secretStoreRef": {"name": "billing-store"}, "refreshInterval": "5m",
                 "data": [{"secretKey": "k", "remoteRef": {"key": "billing/db"}}]}}));
    let created = s.apply(cluster_external_secret("1s"));
    let uid = created["metadata"]["uid"].clone();
    // Invalid for the agent (the fake API server does not validate): reported, nothing written.
    s.apply(json!({"apiVersion": API, "kind": "ClusterExternalSecret",
        "metadata": {"name": "broken"},
        "spec": {"externalSecretName": "broken", "namespaces": ["Not_A_Namespace", "other"],
                 "externalSecretSpec": {"secretStoreRef": {"name": "x"},
                     "data": [{"secretKey": "k", "remoteRef": {"key": "k"}}]}}}));
    let c = ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "replica-a", &[]).await;
    *LOG.lock().unwrap() = Some(c.log.clone());

    // By name (legacy) and by either selector (shop); `other` matches nothing.
    for ns in ["shop", "legacy"] {
        let es = eventually(Duration::from_secs(15), &format!("db in {ns}"), || {
            external(&s, ns)
        })
        .await;
        let owner = &es["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "ClusterExternalSecret");
        assert_eq!(owner["uid"], uid);
        assert_eq!(owner["controller"], true);
        assert_eq!(es["metadata"]["labels"]["app"], "web");
        assert_eq!(es["spec"]["refreshInterval"], "1s");
        assert_eq!(es["spec"]["target"]["creationPolicy"], "Owner");
    }
    assert!(external(&s, "other").is_none());
    let status = status_is(&s, &["legacy", "shop"], &["billing"]).await;
    assert_eq!(status["externalSecretName"], "db");
    let reason = status["failedNamespaces"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("left untouched"), "{reason}");
    let ready = &status["conditions"][0];
    assert_eq!(
        (&ready["type"], &ready["status"], &ready["reason"]),
        (
            &json!("Ready"),
            &json!("False"),
            &json!("PartiallyProvisioned")
        )
    );
    // The foreign one is exactly as it was.
    let billing = external(&s, "billing").unwrap();
    assert_eq!(
        billing["metadata"]["resourceVersion"],
        foreign["metadata"]["resourceVersion"]
    );
    assert!(billing["metadata"]["ownerReferences"].is_null());
    // A Warning on the ClusterExternalSecret, in `default` as for any cluster-scoped object.
    eventually(Duration::from_secs(10), "ProvisionFailed event", || {
        s.events().into_iter().find(|e| {
            e["reason"] == "ProvisionFailed"
                && e["involvedObject"]["kind"] == "ClusterExternalSecret"
                && e["metadata"]["namespace"] == "default"
                && e["involvedObject"]["namespace"].is_null()
        })
    })
    .await;
    // The invalid one: reported, nothing written for it.
    let broken = eventually(Duration::from_secs(10), "broken reported", || {
        let c = s.get(API, "ClusterExternalSecret", None, "broken")?;
        (c["status"]["conditions"][0]["reason"] == "Invalid").then_some(c)
    })
    .await;
    let message = broken["status"]["conditions"][0]["message"]
        .as_str()
        .unwrap();
    assert!(message.contains("spec.namespaces[0]"), "{message}");
    assert!(
        s.get(API, "ExternalSecret", Some("other"), "broken")
            .is_none()
    );

    // The mirror serves the created ExternalSecret as any other: the Secret in `shop`.
    let secret = eventually(Duration::from_secs(20), "Secret db in shop", || {
        s.get("v1", "Secret", Some("shop"), "db")
            .filter(|x| x["data"]["password"].is_string())
    })
    .await;
    let value = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["password"].as_str().unwrap())
        .unwrap();
    assert_eq!(value, PASSWORD.as_bytes());

    // A new matching namespace gets one; relabelled away, it loses it.
    namespace(&s, "shop-2", Some("shop"));
    eventually(Duration::from_secs(15), "db in shop-2", || {
        external(&s, "shop-2")
    })
    .await;
    status_is(&s, &["legacy", "shop", "shop-2"], &["billing"]).await;
    namespace(&s, "shop-2", Some("elsewhere"));
    eventually(Duration::from_secs(15), "db gone from shop-2", || {
        external(&s, "shop-2").is_none().then_some(())
    })
    .await;
    status_is(&s, &["legacy", "shop"], &["billing"]).await;

    // A spec change reaches every ExternalSecret.
    s.apply(cluster_external_secret("2m"));
    for ns in ["shop", "legacy"] {
        eventually(Duration::from_secs(15), &format!("2m in {ns}"), || {
            external(&s, ns).filter(|es| es["spec"]["refreshInterval"] == "2m")
        })
        .await;
    }
    // An owned ExternalSecret edited by hand is written back.
    let mut edited = external(&s, "legacy").unwrap();
    edited["spec"]["refreshInterval"] = json!("9h");
    s.apply(edited);
    eventually(Duration::from_secs(15), "legacy written back", || {
        external(&s, "legacy").filter(|es| es["spec"]["refreshInterval"] == "2m")
    })
    .await;

    // The foreign one removed by its owner: the ClusterExternalSecret writes its own there.
    s.delete(API, "ExternalSecret", Some("billing"), "db");
    eventually(Duration::from_secs(15), "db in billing", || {
        external(&s, "billing").filter(|es| es["metadata"]["ownerReferences"][0]["uid"] == uid)
    })
    .await;
    let status = status_is(&s, &["billing", "legacy", "shop"], &[]).await;
    assert_eq!(status["conditions"][0]["status"], "True");
    assert_eq!(status["conditions"][0]["reason"], "Provisioned");

    // Deleted: Kubernetes' garbage collector removes its ExternalSecrets, and nothing writes
    // them again. The real collector runs all the time, so an apply that was already in flight
    // when the delete landed is collected too; the fake's collects once per call, hence the loop.
    s.delete(API, "ClusterExternalSecret", None, "shared-db");
    eventually(Duration::from_secs(15), "ExternalSecrets collected", || {
        s.collect_garbage();
        ["shop", "legacy", "billing"]
            .iter()
            .all(|ns| external(&s, ns).is_none())
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for ns in ["shop", "legacy", "billing"] {
        assert!(external(&s, ns).is_none(), "db left in {ns}");
    }

    // No value anywhere the controller reports.
    let log = c.log_text();
    let events = serde_json::to_string(&s.events()).unwrap();
    let statuses = serde_json::to_string(&s.objects(API, "ClusterExternalSecret")).unwrap();
    for text in [&log, &events, &statuses] {
        assert!(!text.contains(PASSWORD));
        assert!(!text.contains(CONTROLLER_TOKEN));
    }
}

/// With `--namespace`, only those namespaces are written; a namespace being deleted gets
/// nothing; with `--cluster-external-secrets=false`, nothing is written at all.
#[tokio::test(flavor = "multi_thread")]
async fn only_served_live_namespaces_are_written() {
    let s = cluster().await;
    namespace(&s, "dying", Some("shop"));
    // A finalizer keeps the namespace Terminating, as a real cluster often does for a while.
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "held", "namespace": "dying", "finalizers": ["example.com/hold"]}}));
    s.delete("v1", "Namespace", None, "dying");
    let dying = s
        .get("v1", "Namespace", None, "dying")
        .expect("held by the finalizer");
    assert!(dying["metadata"]["deletionTimestamp"].is_string());
    namespace(&s, "shop-2", Some("shop"));
    s.apply(json!({"apiVersion": API, "kind": "ClusterExternalSecret",
        "metadata": {"name": "everywhere"},
        "spec": {"namespaceSelectors": [{}],
                 "externalSecretSpec": {"secretStoreRef": {"name": "vault-like"},
                     "data": [{"secretKey": "k", "remoteRef": {"key": "shared/db"}}]}}}));
    let kubeconfig = s.kubeconfig_yaml(CONTROLLER_TOKEN);
    let mut off = ControllerProcess::start(
        &kubeconfig,
        "replica-off",
        &["--cluster-external-secrets=false"],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(s.objects(API, "ExternalSecret").is_empty());
    off.stop();

    let args = [
        "--namespace",
        "shop",
        "--namespace",
        "dying",
        "--namespace",
        "legacy",
    ];
    let c = ControllerProcess::start(&kubeconfig, "replica-a", &args).await;
    *LOG.lock().unwrap() = Some(c.log.clone());
    for ns in ["shop", "legacy"] {
        eventually(
            Duration::from_secs(15),
            &format!("everywhere in {ns}"),
            || s.get(API, "ExternalSecret", Some(ns), "everywhere"),
        )
        .await;
    }
    status_of(&s, "everywhere", &["legacy", "shop"], &[]).await;
    for ns in ["dying", "shop-2", "billing", "other"] {
        assert!(
            s.get(API, "ExternalSecret", Some(ns), "everywhere")
                .is_none(),
            "written in {ns}"
        );
    }
}
