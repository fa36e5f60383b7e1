//! PushSecrets whose source is a generator (`spec.selector.generatorRef`), end to end: the real
//! PushSecret controller in this process (so that the `fake` provider's in-memory store can be
//! read back) against the in-process fake API server with the deploy files' controller RBAC,
//! and a real `Password` generator. The first push writes a password and records one
//! GeneratorState; a quiet reconcile and a controller restart push nothing new; after
//! `refreshInterval` a new password goes out and the earlier state gets its GC deadline; a
//! store that fails is retried with the SAME value; an account that did not opt in is refused;
//! and no generated value reaches a log, an Event, a status or a GeneratorState. And a Vault
//! dynamic secret (a PKI certificate from real OpenBao) pushed the same way, the one no store
//! took revoked at once. And the real `latchkey controller` binary wiring it all: states with
//! the cleanup finalizer, retired ones collected by its GeneratorState loop.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::FutureExt;
use latchkey::api::StoreKind;
use latchkey::catalog::{Catalog, KubernetesCatalog};
use latchkey::events::KubeEvents;
use latchkey::generators::states::KubeStates;
use latchkey::mirror::generated::MirrorGenerators;
use latchkey::mirror::tokens::TokenMinter;
use latchkey::providers::{self, fake_push::FakePush};
use latchkey::push_secret::controller::{Parts, PushController};
use latchkey::push_secret::generated::PushGenerators;
use latchkey::push_secret::pushers::{StorePushers, fake_store_id};
use latchkey::push_secret::source::{ApiTokens, SourceReader};
use latchkey::telemetry::Metrics;
use serde_json::{Value, json};
use support::apiserver::{FakeApiServer, Identity};
use support::controller::ControllerProcess;
use support::openbao::OpenBao;

const API: &str = "latchkey.dev/v1alpha1";
const GENERATORS: &str = "generators.latchkey.dev/v1alpha1";
const TOKEN: &str = "push-generated-controller-token";
const PUSHED: &str = "generators.latchkey.dev/pushed";
const LABEL: &str = "generators.latchkey.dev/push-secret";

/// Everything the controller logs, at debug level.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// The log of this test process (both tests write to it).
fn log() -> Log {
    static LOG: std::sync::OnceLock<Log> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let log = Log::default();
        let writer = log.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        log
    })
    .clone()
}

/// A running controller: stopped (as by SIGTERM) with [`Running::stop`].
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("the controller stops")
            .unwrap();
    }
}

/// The PushSecret controller as `latchkey controller` builds it, acting through the fake API
/// server with the controller's token: what a fresh process would hold (no memory of before).
async fn start(s: &FakeApiServer) -> Running {
    let client = s.client(TOKEN).await;
    let config = kube::Config::new(s.url().parse().unwrap());
    let metrics = Arc::new(Metrics::new());
    let catalog: Arc<dyn Catalog> = Arc::new(KubernetesCatalog::start_without_external_secrets(
        client.clone(),
        &metrics,
    ));
    let env = providers::Env {
        metrics,
        kube: Some(config.clone()),
        catalog: Arc::clone(&catalog),
        agent_namespace: "latchkey".into(),
        aws_sessions: Default::default(),
        vault_tokens: Default::default(),
        plugins: Arc::new(providers::plugin::Plugins::new("/nonexistent".into())),
        secrets_store: Default::default(),
    };
    let minter = Arc::new(TokenMinter::new(client.clone()));
    let controller = Arc::new(PushController::new(Parts {
        client: client.clone(),
        catalog,
        namespaces: Vec::new(),
        leading: Arc::new(|| true),
        events: Some(Arc::new(KubeEvents::new(client.clone(), "push-generated"))),
        dry_run: false,
        reader: SourceReader::new(config, Arc::clone(&minter) as Arc<dyn ApiTokens>),
        pushers: Arc::new(StorePushers {
            env: env.clone(),
            minter: Arc::clone(&minter),
            allow_agent_identity: false,
        }),
        cleanup_timeout: Duration::from_secs(30),
        compute: Arc::new(latchkey::compute::Pool::new(1, Duration::from_secs(5)).unwrap()),
        generators: PushGenerators {
            env,
            minter,
            allow_agent_identity: false,
            states: MirrorGenerators {
                states: Arc::new(KubeStates::new(client)),
                grace: Duration::from_secs(120),
                // No GeneratorState loop runs here to release a finalizer.
                finalizer: false,
            },
        },
    }));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(controller.run(stopped.map(|_| ())));
    Running { stop, task }
}

/// Namespace `shop` with a Password generator, a `fake` SecretStore, the opted-in account
/// `pusher` and the account `shy` that did not opt in; the controller has exactly the deploy
/// files' rights.
fn cluster(s: &FakeApiServer) {
    let who = Identity::service_account("latchkey", "latchkey-controller");
    s.add_identity(TOKEN, who.clone());
    assert!(s.allow_roles_of(who, "daemonset/components/mirror/rbac.yaml") > 10);
    for ns in ["latchkey", "shop"] {
        s.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    s.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "pusher", "namespace": "shop",
                     "annotations": {"latchkey.dev/allow-controller": "true"}}}));
    s.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "shy", "namespace": "shop"}}));
    s.apply(json!({"apiVersion": GENERATORS, "kind": "Password",
        "metadata": {"name": "pw", "namespace": "shop"},
        "spec": {"length": 32}}));
    s.apply(json!({"apiVersion": API, "kind": "SecretStore",
        "metadata": {"name": "fake", "namespace": "shop"},
        "spec": {"provider": {"fake": {"data": []}}}}));
}

fn push_secret(name: &str, account: &str, stores: &[&str], deletion: &str) -> Value {
    push_secret_every(name, account, stores, deletion, "20s")
}

fn push_secret_every(
    name: &str,
    account: &str,
    stores: &[&str],
    deletion: &str,
    every: &str,
) -> Value {
    let stores: Vec<Value> = stores
        .iter()
        .map(|s| json!({"name": s, "kind": "SecretStore"}))
        .collect();
    json!({"apiVersion": API, "kind": "PushSecret",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {
            "serviceAccountName": account,
            "refreshInterval": every,
            "deletionPolicy": deletion,
            "secretStoreRefs": stores,
            "selector": {"generatorRef": {"apiVersion": GENERATORS, "kind": "Password",
                                          "name": "pw"}},
            "data": [{"match": {"secretKey": "password",
                                "remoteRef": {"remoteKey": format!("prod/{name}")}}}]}})
}

/// The value and version of `prod/<name>` in the fake store `store` of `shop`.
fn remote(store: &str, name: &str) -> Option<(String, u64)> {
    let id = fake_store_id(StoreKind::SecretStore, "shop", store);
    let (value, marked, version) = FakePush::remote(&id, &format!("prod/{name}"))?;
    assert!(marked, "pushed without the mark");
    Some((String::from_utf8(value.expose().to_vec()).unwrap(), version))
}

/// The GeneratorStates of PushSecret `name`.
fn states(s: &FakeApiServer, name: &str) -> Vec<Value> {
    s.objects(GENERATORS, "GeneratorState")
        .into_iter()
        .filter(|st| st["metadata"]["labels"][LABEL] == name)
        .collect()
}

fn ready(s: &FakeApiServer, name: &str) -> Option<Value> {
    let ps = s.get(API, "PushSecret", Some("shop"), name)?;
    let conditions = ps["status"]["conditions"].as_array()?.clone();
    conditions.into_iter().find(|c| c["type"] == "Ready")
}

async fn wait<T>(
    log: &Log,
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; log:\n{}",
            log.text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_password_is_pushed_once_per_interval_and_survives_a_restart() {
    let log = log();
    let s = FakeApiServer::start().await;
    cluster(&s);
    // `gen`: one store. `two`: a second store that does not exist yet. `owned`: deleted with
    // its values, so it owns its states. `shy`: an account that did not opt in. `nowhere`: no
    // store at all, so no store takes the value.
    s.apply(push_secret("gen", "pusher", &["fake"], "None"));
    s.apply(push_secret_every(
        "two",
        "pusher",
        &["fake", "later"],
        "None",
        "1h",
    ));
    s.apply(push_secret("owned", "pusher", &["fake"], "Delete"));
    s.apply(push_secret("shy", "shy", &["fake"], "None"));
    s.apply(push_secret("nowhere", "pusher", &["missing"], "None"));
    let first = start(&s).await;
    let within = Duration::from_secs(20);

    // The first push: a password, one state, marked as pushed, not owned (deletionPolicy None).
    let (v1, version) = wait(&log, within, "the first push", || remote("fake", "gen")).await;
    assert_eq!(version, 1);
    assert_eq!(v1.len(), 32);
    let pushed_at = Instant::now();
    let state = wait(&log, within, "the state marked pushed", || {
        let all = states(&s, "gen");
        (all.len() == 1 && all[0]["metadata"]["annotations"][PUSHED].is_string())
            .then(|| all[0].clone())
    })
    .await;
    assert_eq!(
        state["metadata"]["labels"]["generators.latchkey.dev/service-account"],
        "pusher"
    );
    assert!(state["metadata"]["ownerReferences"].is_null(), "{state}");
    assert!(
        state["spec"]["garbageCollectionDeadline"].is_null(),
        "{state}"
    );
    let condition = wait(&log, within, "Ready", || ready(&s, "gen")).await;
    assert_eq!(condition["status"], "True", "{condition}");

    // With deletionPolicy Delete the PushSecret owns its state.
    wait(&log, within, "the owned push", || remote("fake", "owned")).await;
    let owned = wait(&log, within, "the owned state", || {
        states(&s, "owned").pop()
    })
    .await;
    assert_eq!(
        owned["metadata"]["ownerReferences"][0]["kind"], "PushSecret",
        "{owned}"
    );
    assert_eq!(owned["metadata"]["ownerReferences"][0]["name"], "owned");

    // `two`: the first store has a value, the missing one fails the push.
    let (w1, _) = wait(&log, within, "two's first store", || remote("fake", "two")).await;
    let condition = wait(&log, within, "two failing", || {
        ready(&s, "two").filter(|c| c["status"] == "False")
    })
    .await;
    assert_eq!(condition["reason"], "StoreNotFound", "{condition}");
    assert_eq!(states(&s, "two").len(), 1);

    // A quiet reconcile (the PushSecret's metadata changes): nothing new.
    let mut touched = s.get(API, "PushSecret", Some("shop"), "gen").unwrap();
    touched["metadata"]["labels"] = json!({"touched": "yes"});
    s.apply(touched);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        remote("fake", "gen") == Some((v1.clone(), 1)),
        "gen pushed again"
    );
    assert_eq!(states(&s, "gen").len(), 1);

    // A restart: `gen` pushes nothing new (its state says when, and that every store has it);
    // `two` lost its value with the process, so a new one goes to every store.
    first.stop().await;
    let second = start(&s).await;
    let (w2, version) = wait(&log, within, "two's new value after the restart", || {
        remote("fake", "two").filter(|(_, v)| *v == 2)
    })
    .await;
    assert!(w1 != w2, "the same value after the restart");
    assert_eq!(version, 2);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        pushed_at.elapsed() < Duration::from_secs(18),
        "too slow to tell a restart from a refresh"
    );
    assert!(
        remote("fake", "gen") == Some((v1.clone(), 1)),
        "gen pushed again"
    );
    assert_eq!(states(&s, "gen").len(), 1);

    // The missing store appears: at the retry (here made at once by a change of the
    // PushSecret's labels) it gets the SAME value, and the first store is not written again;
    // then two's earlier state retires.
    s.apply(json!({"apiVersion": API, "kind": "SecretStore",
        "metadata": {"name": "later", "namespace": "shop"},
        "spec": {"provider": {"fake": {"data": []}}}}));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut touched = s.get(API, "PushSecret", Some("shop"), "two").unwrap();
    touched["metadata"]["labels"] = json!({"touched": "yes"});
    s.apply(touched);
    let (later, _) = wait(&log, Duration::from_secs(40), "the retry", || {
        remote("later", "two")
    })
    .await;
    assert!(
        later == w2,
        "the retry pushed another value (the one before the restart: {}); log:\n{}",
        later == w1,
        log.text()
    );
    assert!(
        remote("fake", "two") == Some((w2.clone(), 2)),
        "two's first store written again"
    );
    wait(&log, within, "two's first state retired", || {
        let all = states(&s, "two");
        let retired = all
            .iter()
            .filter(|st| st["spec"]["garbageCollectionDeadline"].is_string())
            .count();
        (all.len() == 2 && retired == 1).then_some(())
    })
    .await;

    // After refreshInterval: a new password, and the earlier state gets its deadline.
    let (v2, _) = wait(&log, Duration::from_secs(40), "the refresh", || {
        remote("fake", "gen").filter(|(_, v)| *v == 2)
    })
    .await;
    assert!(v1 != v2, "the same value after refreshInterval");
    let all = wait(&log, within, "the earlier state retired", || {
        let all = states(&s, "gen");
        (all.len() == 2
            && all
                .iter()
                .any(|st| st["spec"]["garbageCollectionDeadline"].is_string()))
        .then_some(all)
    })
    .await;
    let current: Vec<&Value> = all
        .iter()
        .filter(|st| st["spec"]["garbageCollectionDeadline"].is_null())
        .collect();
    assert_eq!(current.len(), 1, "{all:?}");
    assert_ne!(current[0]["metadata"]["name"], state["metadata"]["name"]);

    // An account that did not opt in: refused before anything is generated.
    let condition = wait(&log, within, "the refusal", || {
        ready(&s, "shy").filter(|c| c["status"] == "False")
    })
    .await;
    assert_eq!(condition["reason"], "SourceUnavailable", "{condition}");
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.contains("latchkey.dev/allow-controller"),
        "{message}"
    );
    assert!(message.contains("PushSecret shop/shy"), "{message}");
    assert!(states(&s, "shy").is_empty());
    assert!(remote("fake", "shy").is_none());

    // No store took `nowhere`'s value: its credential was cleaned up at once.
    let condition = wait(&log, within, "nowhere failing", || {
        ready(&s, "nowhere").filter(|c| c["status"] == "False")
    })
    .await;
    assert_eq!(condition["reason"], "StoreNotFound", "{condition}");
    wait(&log, within, "nowhere's state removed", || {
        states(&s, "nowhere").is_empty().then_some(())
    })
    .await;
    second.stop().await;

    // No generated value anywhere the controller reports or records.
    let mut shown = log.text();
    for name in ["gen", "two", "owned", "shy", "nowhere"] {
        shown.push_str(
            &s.get(API, "PushSecret", Some("shop"), name)
                .unwrap()
                .to_string(),
        );
    }
    for st in s.objects(GENERATORS, "GeneratorState") {
        shown.push_str(&st.to_string());
    }
    for event in s.events() {
        shown.push_str(&event.to_string());
    }
    let (owned_value, _) = remote("fake", "owned").unwrap();
    for value in [&v1, &v2, &w1, &w2, &owned_value] {
        assert!(
            !shown.contains(value.as_str()),
            "a generated value is shown"
        );
        let encoded = base64::engine::general_purpose::STANDARD.encode(value);
        assert!(
            !shown.contains(&encoded),
            "a generated value is shown in base64"
        );
    }
    assert!(
        shown.contains("generated a new value to push"),
        "no debug log captured"
    );
}

/// What the pusher's Vault role may do with the PKI engine: issue, and revoke what it made.
const PKI_POLICY: &str = r#"
path "pki/issue/example-dot-com" { capabilities = ["create", "update"] }
path "sys/leases/revoke" { capabilities = ["update"] }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vault_dynamic_secret_is_pushed_as_the_account_and_one_no_store_took_is_revoked() {
    let log = log();
    let s = FakeApiServer::start().await;
    cluster(&s);
    // OpenBao with a PKI role and kubernetes auth (role `shop`, bound to `shop/pusher`,
    // audience `vault`), checking tokens with the fake API server's TokenReview.
    let bao = OpenBao::start().await;
    bao.pki("pki", "example-dot-com", "72h").await;
    bao.policy("gen", PKI_POLICY).await;
    let reviewer = s.token_reviewer();
    bao.kubernetes(
        &s.url(),
        &reviewer,
        "shop",
        ("shop", "pusher"),
        "vault",
        &["gen"],
    )
    .await;
    s.apply(
        json!({"apiVersion": GENERATORS, "kind": "VaultDynamicSecret",
        "metadata": {"name": "cert", "namespace": "shop"},
        "spec": {"path": "pki/issue/example-dot-com", "method": "POST",
            "parameters": {"common_name": "localhost", "ttl": "30m"},
            "provider": {"server": bao.url,
                "auth": {"kubernetes": {"mountPath": "kubernetes", "role": "shop",
                                         "audience": "vault"}}}}}),
    );
    let cert = |name: &str, store: &str| {
        json!({"apiVersion": API, "kind": "PushSecret",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {
                "serviceAccountName": "pusher",
                "refreshInterval": "1h",
                "secretStoreRefs": [{"name": store}],
                "selector": {"generatorRef": {"apiVersion": GENERATORS,
                                              "kind": "VaultDynamicSecret", "name": "cert"}},
                "data": [
                    {"match": {"secretKey": "certificate",
                               "remoteRef": {"remoteKey": format!("prod/{name}")}}},
                    {"match": {"secretKey": "serial_number",
                               "remoteRef": {"remoteKey": format!("prod/{name}-serial")}}}]}})
    };
    s.apply(cert("tls", "fake"));
    s.apply(cert("tls-nowhere", "missing"));
    let running = start(&s).await;
    let within = Duration::from_secs(30);

    let (pem, _) = wait(&log, within, "the certificate pushed", || {
        remote("fake", "tls")
    })
    .await;
    assert!(
        pem.starts_with("-----BEGIN CERTIFICATE-----"),
        "not a certificate"
    );
    let (serial, _) = remote("fake", "tls-serial").unwrap();
    let state = wait(&log, within, "its state marked pushed", || {
        states(&s, "tls")
            .pop()
            .filter(|st| st["metadata"]["annotations"][PUSHED].is_string())
    })
    .await;
    // What cleanup needs (the lease), never the certificate or its key.
    assert!(state["spec"]["state"].is_object(), "{state}");
    assert!(!state.to_string().contains("PRIVATE KEY"), "{state}");

    // `tls-nowhere`: issued, no store took it, revoked at once, and its state removed.
    let condition = wait(&log, within, "tls-nowhere failing", || {
        ready(&s, "tls-nowhere").filter(|c| c["status"] == "False")
    })
    .await;
    assert_eq!(condition["reason"], "StoreNotFound", "{condition}");
    let deadline = Instant::now() + within;
    let revoked = loop {
        let revoked = bao.revoked_serials("pki").await;
        if !revoked.is_empty() {
            break revoked;
        }
        assert!(
            Instant::now() < deadline,
            "nothing revoked; log:\n{}",
            log.text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        !revoked.iter().any(|r| r.eq_ignore_ascii_case(&serial)),
        "the pushed certificate was revoked"
    );
    wait(&log, within, "tls-nowhere's state removed", || {
        states(&s, "tls-nowhere").is_empty().then_some(())
    })
    .await;
    running.stop().await;
    let shown = log.text();
    assert!(!shown.contains("PRIVATE KEY"), "a private key is logged");
    assert!(!shown.contains(pem.trim()), "the certificate is logged");
}

/// `latchkey controller` as deployed: PushSecrets with a generator, their states carrying the
/// cleanup finalizer, and each retired state collected by the controller's own GeneratorState
/// loop once its deadline (`--generator-grace-period`) passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latchkey_controller_rotates_and_collects_the_states_of_a_pushed_password() {
    let s = FakeApiServer::start().await;
    cluster(&s);
    s.apply(push_secret_every("bin", "pusher", &["fake"], "None", "5s"));
    let c = ControllerProcess::start(
        &s.kubeconfig_yaml(TOKEN),
        "push-generated",
        &["--generator-grace-period", "1s"],
    )
    .await;
    let version = |s: &FakeApiServer| {
        let ps = s.get(API, "PushSecret", Some("shop"), "bin")?;
        ps["status"]["syncedPushSecrets"]["SecretStore/fake"]["prod/bin"]["version"]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok())
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        let all = states(&s, "bin");
        if version(&s) == Some(1)
            && all.len() == 1
            && all[0]["metadata"]["annotations"][PUSHED].is_string()
        {
            break all[0].clone();
        }
        assert!(
            Instant::now() < deadline,
            "no first push:\n{}",
            c.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        first["metadata"]["finalizers"],
        json!(["generators.latchkey.dev/cleanup"]),
        "{first}"
    );
    let name = first["metadata"]["name"].as_str().unwrap().to_string();
    // A new password after 5 s; then the first state passes its deadline and is collected.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let gone = !states(&s, "bin")
            .iter()
            .any(|st| st["metadata"]["name"] == name);
        if version(&s).is_some_and(|v| v >= 2) && gone {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not rotated and collected:\n{}",
            c.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let current = states(&s, "bin");
    assert!(!current.is_empty());
    assert!(
        current
            .iter()
            .any(|st| st["spec"]["garbageCollectionDeadline"].is_null()),
        "{current:?}"
    );
}
