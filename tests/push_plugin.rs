//! Pushes to `plugin` stores, with the `plugin-file` example as a real gRPC peer on a unix
//! socket: latchkey.plugin.v1 PushSecret / DeleteSecret as the PushSecret's service account
//! (with only the store's audience's token), a new version per change, someone else's secret
//! left alone unless adopted, only what was pushed deleted, a read-only plugin reported as such,
//! an ESS-only plugin written through GetSecret + ApplySecret / DeleteKeys with the mark in its
//! metadata, and the real controller doing it end to end. No value or token in any error, log,
//! Event or status.

mod support;

// Provider settings (`spec.data[].metadata`), in a file of their own.
#[path = "push_plugin/metadata.rs"]
mod metadata;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey::api::StoreKind;
use latchkey::api::store::PluginProvider;
use latchkey::catalog::ManifestCatalog;
use latchkey::identity::{PodInfo, PodTokens};
use latchkey::providers::plugin::Plugins;
use latchkey::providers::plugin::push::PluginPush;
use latchkey::providers::push::{PushError, PushPolicy, PushValue, Pushed, Pusher};
use latchkey::providers::{BuildContext, Env};
use latchkey::telemetry::Metrics;
use serde_json::{Value, json};
use support::apiserver::FakeApiServer;
use support::push::{REPLACE, props};

const PASSWORD: &str = "plugin-push-password-5521";
const NEW_PASSWORD: &str = "plugin-push-password-rotated-8830";
const THEIRS: &str = "plugin-someone-elses-value-2267";
const WHOLE: &str = "plugin-push-whole-value-4419";
const AUDIENCE: &str = "plugin.example";
const PLUGIN_TOKEN: &str = "eyJhbGciOiJub25lIn0.plugin-push-token-7781";
const OTHER_TOKEN: &str = "eyJhbGciOiJub25lIn0.other-push-token-9902";

/// A running `plugin-file`: its socket in its own allowed directory, its data directory (with
/// someone else's secret `theirs`) and its calls file.
struct Plugin {
    child: Child,
    socket_dir: PathBuf,
    data: PathBuf,
    calls: PathBuf,
    _dir: tempfile::TempDir,
}

impl Plugin {
    async fn start(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket_dir = dir.path().join("plugins");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&socket_dir).unwrap();
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("theirs"), format!(r#"{{"password":"{THEIRS}"}}"#)).unwrap();
        let socket = socket_dir.join("files.sock");
        let calls = dir.path().join("calls.log");
        let child = Command::new(support::example_binary("plugin-file"))
            .arg("--socket")
            .arg(&socket)
            .arg("--dir")
            .arg(&data)
            .arg("--calls")
            .arg(&calls)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start plugin-file");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "plugin-file did not listen");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self {
            child,
            socket_dir,
            data,
            calls,
            _dir: dir,
        }
    }

    fn endpoint(&self) -> String {
        format!("unix://{}", self.socket_dir.join("files.sock").display())
    }

    fn env(&self) -> Env {
        Env {
            metrics: Arc::new(Metrics::new()),
            kube: None,
            catalog: Arc::new(ManifestCatalog::default()),
            agent_namespace: "latchkey".into(),
            aws_sessions: Default::default(),
            vault_tokens: Default::default(),
            plugins: Arc::new(Plugins::new(self.socket_dir.clone())),
            secrets_store: Default::default(),
        }
    }

    /// The pusher of a store on this plugin with `audiences`, as the PushSecret's account.
    async fn pusher(
        &self,
        audiences: &[&str],
    ) -> Result<PluginPush, latchkey::providers::ProviderError> {
        let spec = PluginProvider {
            endpoint: self.endpoint(),
            timeout: Some("3s".into()),
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        };
        let env = self.env();
        let account = account();
        let ctx = BuildContext {
            env: &env,
            pod: &account,
            scope: StoreKind::SecretStore.into(),
            max_age: None,
        };
        PluginPush::new(&spec, &ctx).await
    }

    /// The file of `name`.
    fn file(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.data.join(name)).ok()
    }

    /// The entries of `name`, as the plugin stores them (a JSON object).
    fn entries(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.file(name).map(|f| serde_json::from_str(&f).unwrap())
    }

    /// The metadata of `name` (the mark).
    fn metadata(&self, name: &str) -> Option<Value> {
        let text = std::fs::read_to_string(self.data.join(format!("{name}@meta"))).ok()?;
        Some(serde_json::from_str(&text).unwrap())
    }

    fn calls(&self) -> String {
        std::fs::read_to_string(&self.calls).unwrap_or_default()
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The PushSecret's service account as pushers.rs makes it: the PushSecret's name, no uid, its
/// tokens (one for the plugin's audience, one it must never get).
fn account() -> PodInfo {
    PodInfo {
        namespace: "shop".into(),
        name: "to-files".into(),
        uid: String::new(),
        service_account: "writer".into(),
        tokens: PodTokens::parse(Some(&format!(
            r#"{{"{AUDIENCE}":{{"token":"{PLUGIN_TOKEN}"}},"other":{{"token":"{OTHER_TOKEN}"}}}}"#
        )))
        .unwrap(),
    }
}

fn assert_clean(text: &str) {
    for secret in [
        PASSWORD,
        NEW_PASSWORD,
        THEIRS,
        WHOLE,
        PLUGIN_TOKEN,
        OTHER_TOKEN,
    ] {
        assert!(!text.contains(secret), "a value or token leaked: {text}");
    }
}

fn shown(err: &PushError) -> String {
    let text = format!("{err} {err:?}");
    assert_clean(&text);
    text
}

fn version(pushed: Pushed) -> String {
    match pushed {
        Pushed::Written { version } => version,
        Pushed::Kept => panic!("kept, not written"),
        Pushed::Unchanged { .. } => panic!("unchanged, not written"),
    }
}

#[tokio::test]
async fn a_latchkey_plugin_writes_as_the_account_and_deletes_only_what_was_pushed() {
    let plugin = Plugin::start(&["--writable"]).await;
    let push = plugin.pusher(&[AUDIENCE]).await.unwrap();

    let first = version(
        push.push("db", &props(&[("password", PASSWORD)]), REPLACE)
            .await
            .unwrap(),
    );
    assert!(first.starts_with("mtime-"), "{first}");
    assert_eq!(plugin.entries("db").unwrap()["password"], PASSWORD);
    assert_eq!(plugin.metadata("db").unwrap()["managed-by"], "latchkey");
    // The caller is the PushSecret's account, with only the store's audience's token.
    let calls = plugin.calls();
    assert!(
        calls.contains("PushSecret db caller=shop/writer pod=to-files audiences=[plugin.example]"),
        "{calls}"
    );

    // A change: merged with what is there, a new version.
    let second = version(
        push.push(
            "db",
            &props(&[("password", NEW_PASSWORD), ("user", "shop")]),
            REPLACE,
        )
        .await
        .unwrap(),
    );
    assert_ne!(first, second);
    let entries = plugin.entries("db").unwrap();
    assert_eq!(
        (entries["password"].as_str(), entries["user"].as_str()),
        (NEW_PASSWORD, "shop")
    );
    let kept = PushPolicy {
        if_not_exists: true,
        adopt: false,
    };
    assert_eq!(
        push.push("db", &props(&[("password", "x")]), kept)
            .await
            .unwrap(),
        Pushed::Kept
    );
    assert_eq!(plugin.entries("db").unwrap()["password"], NEW_PASSWORD);

    // A whole value replaces the secret.
    push.push("whole", &PushValue::Whole(WHOLE.into()), REPLACE)
        .await
        .unwrap();
    assert_eq!(plugin.file("whole").unwrap(), WHOLE);

    // Someone else's secret: a conflict, untouched; adopted when the store allows it.
    let err = push
        .push("theirs", &props(&[("password", PASSWORD)]), REPLACE)
        .await
        .unwrap_err();
    assert!(matches!(err, PushError::Conflict { .. }), "{}", shown(&err));
    assert_eq!(err.reason(), "Conflict");
    assert_eq!(plugin.entries("theirs").unwrap()["password"], THEIRS);
    for keys in [vec![], vec!["password".to_string()]] {
        let err = push.delete("theirs", &keys).await.unwrap_err();
        assert!(matches!(err, PushError::Conflict { .. }), "{}", shown(&err));
    }
    assert_eq!(plugin.entries("theirs").unwrap()["password"], THEIRS);
    assert!(plugin.file("theirs").is_some());
    let adopt = PushPolicy {
        if_not_exists: false,
        adopt: true,
    };
    push.push("theirs", &props(&[("extra", PASSWORD)]), adopt)
        .await
        .unwrap();
    let entries = plugin.entries("theirs").unwrap();
    assert_eq!(
        (entries["password"].as_str(), entries["extra"].as_str()),
        (THEIRS, PASSWORD)
    );
    assert_eq!(plugin.metadata("theirs").unwrap()["managed-by"], "latchkey");

    // Delete: only the pushed property, then the secret once empty; a missing one is done.
    push.delete("db", &["password".into()]).await.unwrap();
    let entries = plugin.entries("db").unwrap();
    assert_eq!(entries.keys().collect::<Vec<_>>(), ["user"]);
    push.delete("db", &["user".into()]).await.unwrap();
    assert!(plugin.file("db").is_none() && plugin.metadata("db").is_none());
    push.delete("db", &[]).await.unwrap();
    push.delete("whole", &[]).await.unwrap();
    assert!(plugin.file("whole").is_none());

    let calls = plugin.calls();
    assert_clean(&calls);
    assert!(
        !calls.contains("audiences=[plugin.example,other]"),
        "{calls}"
    );
}

#[tokio::test]
async fn a_read_only_plugin_is_named_with_the_rpc_it_lacks() {
    let plugin = Plugin::start(&[]).await;
    let push = plugin.pusher(&[]).await.unwrap();
    let err = push
        .push("db", &props(&[("password", PASSWORD)]), REPLACE)
        .await
        .unwrap_err();
    let text = shown(&err);
    assert!(matches!(err, PushError::ReadOnly { .. }), "{text}");
    assert_eq!(err.reason(), "Unimplemented");
    for part in [
        plugin.endpoint().as_str(),
        "latchkey.plugin.v1.SecretStorePlugin/PushSecret",
        "UNIMPLEMENTED",
        "read-only",
        "\"db\"",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
    let err = push.delete("db", &[]).await.unwrap_err();
    assert!(
        err.to_string().contains("SecretStorePlugin/DeleteSecret"),
        "{err}"
    );
    assert!(plugin.file("db").is_none());
    // A write is made once: no retry of a refused one.
    assert_eq!(plugin.calls().matches("PushSecret").count(), 1);

    // An ESS-only read-only plugin: its ApplySecret is what it lacks.
    let ess = Plugin::start(&["--ess-only"]).await;
    let push = ess.pusher(&[]).await.unwrap();
    let err = push
        .push("db", &props(&[("password", PASSWORD)]), REPLACE)
        .await
        .unwrap_err();
    let text = shown(&err);
    assert!(
        matches!(err, PushError::ReadOnly { .. }) && text.contains("/ApplySecret"),
        "{text}"
    );
}

#[tokio::test]
async fn an_ess_plugin_is_written_through_apply_secret_with_the_mark_in_its_metadata() {
    let plugin = Plugin::start(&["--ess-only", "--writable"]).await;
    let push = plugin.pusher(&[]).await.unwrap();

    push.push("db", &props(&[("password", PASSWORD)]), REPLACE)
        .await
        .unwrap();
    push.push("db", &props(&[("user", "shop")]), REPLACE)
        .await
        .unwrap();
    let entries = plugin.entries("db").unwrap();
    assert_eq!(
        (entries["password"].as_str(), entries["user"].as_str()),
        (PASSWORD, "shop")
    );
    assert_eq!(plugin.metadata("db").unwrap()["managed-by"], "latchkey");
    let calls = plugin.calls();
    assert!(
        calls.contains("GetSecret db\n") && calls.contains("ApplySecret db\n"),
        "{calls}"
    );

    // The mark is checked by Latchkey (ESS plugins do not know it).
    let err = push
        .push("theirs", &props(&[("password", PASSWORD)]), REPLACE)
        .await
        .unwrap_err();
    assert!(matches!(err, PushError::Conflict { .. }), "{}", shown(&err));
    assert_eq!(plugin.entries("theirs").unwrap()["password"], THEIRS);
    assert!(!plugin.calls().contains("ApplySecret theirs"));
    for keys in [vec![], vec!["password".to_string()]] {
        let err = push.delete("theirs", &keys).await.unwrap_err();
        assert!(matches!(err, PushError::Conflict { .. }), "{}", shown(&err));
    }
    assert_eq!(plugin.entries("theirs").unwrap()["password"], THEIRS);

    push.delete("db", &["password".into()]).await.unwrap();
    assert_eq!(
        plugin.entries("db").unwrap().keys().collect::<Vec<_>>(),
        ["user"]
    );
    push.delete("db", &[]).await.unwrap();
    assert!(plugin.file("db").is_none());
    push.delete("db", &["user".into()]).await.unwrap();

    // A store that lists audiences expects the plugin to act as the account: ESS cannot.
    let with_identity = plugin.pusher(&[AUDIENCE]).await.unwrap();
    let err = with_identity
        .push("db", &props(&[("password", PASSWORD)]), REPLACE)
        .await
        .unwrap_err();
    let text = shown(&err);
    assert!(
        text.contains("plugin.audiences") && text.contains("ess.proto.v1alpha1"),
        "{text}"
    );
    assert!(plugin.file("db").is_none());
    assert_clean(&plugin.calls());
}

const CONTROLLER_TOKEN: &str = "plugin-push-controller-token";

/// The real controller pushes through the plugin as the PushSecret's service account: a
/// conflict and a read-only plugin named in the conditions, a change pushed, what it pushed
/// deleted with the PushSecret, and no value in the log, statuses or Events.
#[tokio::test(flavor = "multi_thread")]
async fn the_controller_pushes_through_a_plugin_as_the_service_account() {
    let plugin = Plugin::start(&["--writable"]).await;
    // A read-only plugin in the same socket directory.
    let read_only = Command::new(support::example_binary("plugin-file"))
        .arg("--socket")
        .arg(plugin.socket_dir.join("ro.sock"))
        .arg("--dir")
        .arg(&plugin.data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _read_only = KillOnDrop(read_only);

    let s = plugin_cluster(&plugin).await;
    s.apply(plugin_store(&plugin, "read-only", "ro.sock"));
    let push_secret = |name: &str, store: &str, remote: &str| {
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "PushSecret",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"serviceAccountName": "writer", "deletionPolicy": "Delete",
                     "secretStoreRefs": [{"name": store}],
                     "selector": {"secret": {"name": "db"}},
                     "data": [{"match": {"secretKey": "password",
                               "remoteRef": {"remoteKey": remote, "property": "password"}}}]}})
    };
    s.apply(push_secret("to-published", "files", "published"));
    s.apply(push_secret("to-theirs", "files", "theirs"));
    s.apply(push_secret("to-read-only", "read-only", "nowhere"));
    let socket_dir = plugin.socket_dir.display().to_string();
    let c = support::controller::ControllerProcess::start(
        &s.kubeconfig_yaml(CONTROLLER_TOKEN),
        "plugin-push",
        &["--plugin-socket-dir", &socket_dir],
    )
    .await;
    let within = Duration::from_secs(15);
    let ready = |name: &str| {
        let ps = s.get("latchkey.dev/v1alpha1", "PushSecret", Some("shop"), name)?;
        let conditions = ps["status"]["conditions"].as_array()?.clone();
        conditions.into_iter().find(|c| c["type"] == "Ready")
    };
    support::eventually(within, "pushed", || async {
        plugin
            .entries("published")
            .is_some_and(|e| e.get("password").map(String::as_str) == Some(PASSWORD))
    })
    .await;
    assert_eq!(
        plugin.metadata("published").unwrap()["managed-by"],
        "latchkey"
    );
    let calls = plugin.calls();
    assert!(
        calls.contains(
            "PushSecret published caller=shop/writer pod=to-published audiences=[plugin.example]"
        ),
        "{calls}"
    );
    assert!(
        s.token_requests()
            .iter()
            .any(|t| t.service_account == "writer" && t.audiences == [AUDIENCE])
    );

    support::eventually(within, "the conflict", || async {
        ready("to-theirs").is_some_and(|c| c["reason"] == "Conflict")
    })
    .await;
    let message = ready("to-theirs").unwrap()["message"].to_string();
    for part in ["PushSecret shop/to-theirs", "SecretStore/files", "theirs"] {
        assert!(message.contains(part), "{message}");
    }
    assert_eq!(plugin.entries("theirs").unwrap()["password"], THEIRS);

    support::eventually(within, "the read-only plugin", || async {
        ready("to-read-only").is_some_and(|c| c["reason"] == "Unimplemented")
    })
    .await;
    let message = ready("to-read-only").unwrap()["message"].to_string();
    for part in [
        "PushSecret shop/to-read-only",
        "SecretStore/read-only",
        "nowhere",
        "UNIMPLEMENTED",
        "read-only",
        "PushSecret",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }

    // A change is pushed.
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "shop"},
        "data": {"password": b64(NEW_PASSWORD)}}));
    support::eventually(within, "the change pushed", || async {
        plugin
            .entries("published")
            .is_some_and(|e| e["password"] == NEW_PASSWORD)
    })
    .await;

    // Deleted with deletionPolicy Delete: what it pushed goes, theirs stays.
    for name in ["to-published", "to-theirs", "to-read-only"] {
        s.delete("latchkey.dev/v1alpha1", "PushSecret", Some("shop"), name);
    }
    support::eventually(within, "the pushed secret deleted", || async {
        plugin.file("published").is_none()
    })
    .await;
    assert_eq!(plugin.entries("theirs").unwrap()["password"], THEIRS);

    let log = c.log_text();
    let statuses =
        serde_json::to_string(&s.objects("latchkey.dev/v1alpha1", "PushSecret")).unwrap();
    let events = serde_json::to_string(&s.events()).unwrap();
    for text in [&log, &statuses, &events, &plugin.calls()] {
        assert_clean(text);
        for value in [b64(PASSWORD), b64(NEW_PASSWORD), CONTROLLER_TOKEN.into()] {
            assert!(!text.contains(&value), "a value leaked");
        }
    }
}

/// A fake API server for the controller: its RBAC, the account `shop/writer` (opted in, allowed
/// to get Secrets of `shop`), the Secret `shop/db` and the SecretStore `files` on `plugin`.
async fn plugin_cluster(plugin: &Plugin) -> FakeApiServer {
    // The account reads the source Secret with its own rights (and the plugin writes as it).
    let s = support::push::controller_cluster(CONTROLLER_TOKEN, &["writer"]).await;
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "shop"},
        "data": {"password": b64(PASSWORD)}}));
    s.apply(plugin_store(plugin, "files", "files.sock"));
    s
}

/// The SecretStore `name` of `shop` on the plugin listening at `socket` in `plugin`'s directory.
fn plugin_store(plugin: &Plugin, name: &str, socket: &str) -> Value {
    json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "SecretStore",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"provider": {"plugin": {
            "endpoint": format!("unix://{}", plugin.socket_dir.join(socket).display()),
            "audiences": [AUDIENCE], "timeout": "3s"}}}})
}

fn b64(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// Kills a child process when dropped.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
