//! Plugin generators over real gRPC on a real unix socket: the `plugin-generator` example (a fake
//! account service) and the `plugin-file` example (a store plugin without Generate), driven
//! through `generators::build` exactly as a publish or the controller builds them. Generate and
//! Cleanup calls counted, the caller's identity with only the listed audience's token, Cleanup
//! idempotent and authorized by namespace, a clear error for a plugin without Generate, hostile
//! answers refused (and cleaned up when they can be), and no generated value in an error or
//! `Debug` output.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey::api::external_secret::StoreKind;
use latchkey::api::generator::PluginGeneratorSpec;
use latchkey::api::store::PluginProvider;
use latchkey::catalog::ManifestCatalog;
use latchkey::generators::plugin::PluginGenerator;
use latchkey::generators::{self, Generator, GeneratorError, GeneratorSpec};
use latchkey::identity::{PodInfo, PodTokens};
use latchkey::providers::plugin::Plugins;
use latchkey::providers::{BuildContext, Env, ProviderError};
use latchkey::telemetry::Metrics;

/// Every account's password (the example's `--password`): looked for where it must not be.
const PASSWORD: &str = "gen-password-e2e-4471-zq";
/// The pod's tokens: the generator's audience, and one it must never get.
const PLUGIN_TOKEN: &str = "eyJhbGciOiJub25lIn0.generator-audience-token-e2e-3391";
const OTHER_TOKEN: &str = "eyJhbGciOiJub25lIn0.other-audience-token-e2e-5802";
const AUDIENCE: &str = "plugin.example";
/// Stands for the plugin's data directory in [`Plugin::start`]'s arguments.
const DATA_DIR: &str = "<data>";

/// A running example plugin on a socket in its own allowed directory.
struct Plugin {
    child: Child,
    socket_dir: PathBuf,
    socket: PathBuf,
    calls: PathBuf,
    _dir: tempfile::TempDir,
}

impl Plugin {
    /// `plugin-generator` with `extra` flags.
    async fn generator(extra: &[&str]) -> Self {
        Self::start("plugin-generator", &["--password", PASSWORD], extra).await
    }

    /// `plugin-file` (a store plugin: no Generate, no Cleanup) serving an empty directory,
    /// with `extra` flags.
    async fn store(extra: &[&str]) -> Self {
        Self::start("plugin-file", &["--dir", DATA_DIR], extra).await
    }

    /// Starts `example`; a `DATA_DIR` argument becomes an empty directory of the plugin's own.
    async fn start(example: &str, base: &[&str], extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket_dir = dir.path().join("plugins");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&socket_dir).unwrap();
        std::fs::create_dir_all(&data).unwrap();
        let base: Vec<&std::ffi::OsStr> = base
            .iter()
            .map(|a| match *a {
                DATA_DIR => data.as_os_str(),
                a => a.as_ref(),
            })
            .collect();
        let socket = socket_dir.join("gen.sock");
        let calls = dir.path().join("calls.log");
        let child = Command::new(support::example_binary(example))
            .arg("--socket")
            .arg(&socket)
            .arg("--calls")
            .arg(&calls)
            .args(base)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {example}: {e}"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "{example} did not listen");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self {
            child,
            socket_dir,
            socket,
            calls,
            _dir: dir,
        }
    }

    fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The calls file's lines.
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(&self.calls)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// How many calls of `rpc` (`Generate`, `Cleanup`) the plugin served.
    fn count(&self, rpc: &str) -> usize {
        self.calls()
            .iter()
            .filter(|l| l.starts_with(&format!("{rpc} ")))
            .count()
    }

    /// Live accounts after the last call, as the plugin recorded.
    fn live(&self) -> usize {
        let calls = self.calls();
        let last = calls.iter().rev().find_map(|l| l.rsplit_once(" live="));
        last.map_or(0, |(_, n)| n.parse().unwrap())
    }

    /// The agent's side: plugins allowed only in this plugin's socket directory.
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
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A pod of `namespace` with tokens for the generator's audience and another one.
fn pod(namespace: &str, name: &str) -> PodInfo {
    PodInfo {
        namespace: namespace.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        service_account: "web".into(),
        tokens: PodTokens::parse(Some(&format!(
            r#"{{"{AUDIENCE}":{{"token":"{PLUGIN_TOKEN}","expirationTimestamp":"2030-01-01T00:00:00Z"}},"other":{{"token":"{OTHER_TOKEN}"}}}}"#
        )))
        .unwrap(),
    }
}

fn spec(endpoint: &str, audiences: &[&str]) -> PluginGeneratorSpec {
    PluginGeneratorSpec {
        provider: PluginProvider {
            endpoint: endpoint.into(),
            timeout: Some("3s".into()),
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        },
    }
}

/// The generator `spec` makes for `pod`, as a publish builds it.
async fn build(
    env: &Env,
    pod: &PodInfo,
    spec: &PluginGeneratorSpec,
) -> Result<Arc<dyn Generator>, GeneratorError> {
    let ctx = BuildContext {
        env,
        pod,
        scope: StoreKind::SecretStore.into(),
        max_age: None,
    };
    generators::build(GeneratorSpec::Plugin(spec), &ctx).await
}

fn text(
    values: &std::collections::BTreeMap<String, latchkey::secret::SecretBytes>,
    key: &str,
) -> String {
    String::from_utf8(values[key].expose().to_vec()).unwrap()
}

/// `text` names none of the secrets of these tests.
fn assert_clean(text: &str) {
    for secret in [PASSWORD, PLUGIN_TOKEN, OTHER_TOKEN] {
        assert!(!text.contains(secret), "{secret:?} leaked in {text}");
    }
}

#[tokio::test]
async fn generate_and_cleanup_are_counted_and_cleanup_is_idempotent() {
    let plugin = Plugin::generator(&[]).await;
    let env = plugin.env();
    let spec = spec(&plugin.endpoint(), &[AUDIENCE]);
    let web0 = pod("shop", "web-0");
    let generator = build(&env, &web0, &spec).await.unwrap();

    let first = generator.generate().await.unwrap();
    assert_eq!(
        first.values.keys().collect::<Vec<_>>(),
        ["password", "username"]
    );
    assert_eq!(text(&first.values, "password"), PASSWORD);
    assert_eq!(text(&first.values, "username"), "web-acct-1");
    assert_eq!(first.state, Some(serde_json::json!({"account": "acct-1"})));
    assert_eq!(first.lease, None);
    let ctx = BuildContext {
        env: &env,
        pod: &web0,
        scope: StoreKind::SecretStore.into(),
        max_age: None,
    };
    let direct = PluginGenerator::new(&spec, &ctx).await.unwrap();
    assert_clean(&format!("{first:?} {first:#?} {direct:?}"));

    // Another pod of the same service account: its own account, never a shared one.
    let web1 = pod("shop", "web-1");
    let second = build(&env, &web1, &spec)
        .await
        .unwrap()
        .generate()
        .await
        .unwrap();
    assert_eq!(second.state, Some(serde_json::json!({"account": "acct-2"})));
    assert_eq!((plugin.count("Generate"), plugin.live()), (2, 2));

    let state = first.state.clone().unwrap();
    generator.cleanup(&state).await.unwrap();
    assert_eq!(plugin.live(), 1);
    // Again: the account is gone, which is success.
    generator.cleanup(&state).await.unwrap();
    let last = plugin.calls().pop().unwrap();
    assert!(last.contains("account=acct-1 deleted=false"), "{last}");
    generator.cleanup(&second.state.unwrap()).await.unwrap();
    assert_eq!((plugin.count("Cleanup"), plugin.live()), (3, 0));
    // Renewal is not in latchkey.plugin.v1: a new value is generated instead.
    assert_eq!(generator.renew(&state).await.unwrap(), None);
    assert_eq!(plugin.count("Generate"), 2);
}

#[tokio::test]
async fn cleanup_of_what_is_already_gone_is_done_even_when_the_plugin_says_not_found() {
    let plugin = Plugin::generator(&["--misbehave", "cleanup-not-found"]).await;
    let env = plugin.env();
    let generator = build(&env, &pod("shop", "web-0"), &spec(&plugin.endpoint(), &[]))
        .await
        .unwrap();
    let state = generator.generate().await.unwrap().state.unwrap();
    generator.cleanup(&state).await.unwrap();
    generator.cleanup(&state).await.unwrap();
    // NOT_FOUND is final: not retried.
    assert_eq!((plugin.count("Cleanup"), plugin.live()), (2, 0));
}

#[tokio::test]
async fn the_callers_identity_reaches_the_plugin_with_only_the_listed_token() {
    let plugin = Plugin::generator(&["--misbehave", "echo-caller", "--ttl", "90s"]).await;
    let env = plugin.env();
    let web0 = pod("shop", "web-0");
    let generated = build(&env, &web0, &spec(&plugin.endpoint(), &[AUDIENCE]))
        .await
        .unwrap()
        .generate()
        .await
        .unwrap();
    let v = &generated.values;
    assert_eq!(text(v, "caller.namespace"), "shop");
    assert_eq!(text(v, "caller.service_account"), "web");
    assert_eq!(text(v, "caller.pod"), "web-0");
    assert_eq!(text(v, "caller.pod_uid"), "uid-web-0");
    assert_eq!(text(v, &format!("token.{AUDIENCE}")), PLUGIN_TOKEN);
    assert!(!v.contains_key("token.other"), "{generated:?}");
    let lease = generated.lease.unwrap();
    assert_eq!(
        (lease.ttl, lease.renewable),
        (Duration::from_secs(90), false)
    );
    let calls = plugin.calls().join("\n");
    assert!(
        calls.contains("caller=shop/web pod=web-0 uid=uid-web-0 audiences=[plugin.example]"),
        "{calls}"
    );
    assert_clean(&format!("{generated:?}"));

    // Without audiences the plugin gets the identity and no token at all.
    let bare = build(&env, &web0, &spec(&plugin.endpoint(), &[]))
        .await
        .unwrap()
        .generate()
        .await
        .unwrap();
    assert!(
        !bare.values.keys().any(|k| k.starts_with("token.")),
        "{bare:?}"
    );

    // An audience kubelet passed no token for fails before any call.
    let err = build(&env, &web0, &spec(&plugin.endpoint(), &["absent"]))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("\"absent\"") && err.contains("tokenRequests"),
        "{err}"
    );
    assert_eq!(plugin.count("Generate"), 2);
}

#[tokio::test]
async fn cleanup_runs_only_as_the_namespace_the_credential_was_made_for() {
    let plugin = Plugin::generator(&[]).await;
    let env = plugin.env();
    let spec = spec(&plugin.endpoint(), &[]);
    let made = build(&env, &pod("shop", "web-0"), &spec)
        .await
        .unwrap()
        .generate()
        .await
        .unwrap();
    let state = made.state.unwrap();
    // A tenant who copies the state into its own GeneratorState cleans up as itself: refused.
    let other = build(&env, &pod("billing", "api-0"), &spec).await.unwrap();
    let err = other.cleanup(&state).await.unwrap_err();
    assert!(
        matches!(err, GeneratorError::Backend(ProviderError::PermissionDenied(ref m))
            if m.contains("PERMISSION_DENIED") && m.contains(&plugin.endpoint())),
        "{err}"
    );
    assert_eq!(plugin.live(), 1);
    // An edited state the plugin cannot use is refused by the plugin, not retried.
    let err = other
        .cleanup(&serde_json::json!({"nonsense": true}))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("INVALID_ARGUMENT"), "{err}");
    // A state too large to be one Latchkey recorded never reaches the plugin.
    let cleanups = plugin.count("Cleanup");
    let huge = serde_json::json!({"account": "acct-1", "pad": "x".repeat(5000)});
    let err = other.cleanup(&huge).await.unwrap_err();
    assert!(
        matches!(err, GeneratorError::Invalid(ref m) if m.contains("4096")),
        "{err}"
    );
    assert_eq!(plugin.count("Cleanup"), cleanups);
    build(&env, &pod("shop", "web-1"), &spec)
        .await
        .unwrap()
        .cleanup(&state)
        .await
        .unwrap();
    assert_eq!(plugin.live(), 0);
}

#[tokio::test]
async fn a_plugin_without_generate_gives_a_clear_error() {
    let web0 = pod("shop", "web-0");
    let state = serde_json::json!({"account": "acct-1"});
    for (flags, also) in [
        (&[][..], None),
        (&["--ess-only"][..], Some("ess.proto.v1alpha1")),
    ] {
        let plugin = Plugin::store(flags).await;
        let env = plugin.env();
        let generator = build(&env, &web0, &spec(&plugin.endpoint(), &[]))
            .await
            .unwrap();
        for (rpc, err) in [
            ("Generate", generator.generate().await.unwrap_err()),
            ("Cleanup", generator.cleanup(&state).await.unwrap_err()),
        ] {
            let text = err.to_string();
            let expected = format!(
                "plugin at {} does not implement {rpc} (latchkey.plugin.v1)",
                plugin.endpoint()
            );
            assert!(matches!(err, GeneratorError::Unimplemented(_)), "{err:?}");
            assert!(text.starts_with(&expected), "{text}");
            if let Some(also) = also {
                assert!(text.contains(also), "{text}");
            }
            assert_eq!(err.kind(), "unimplemented");
        }
    }

    // Same socket rule as stores: only directly in --plugin-socket-dir.
    let plugin = Plugin::generator(&[]).await;
    let env = plugin.env();
    let err = build(
        &env,
        &web0,
        &spec("unix:///run/containerd/containerd.sock", &[]),
    )
    .await
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("--plugin-socket-dir"), "{err}");
    assert_eq!(plugin.count("Generate"), 0);
}

#[tokio::test]
async fn hostile_answers_are_refused_and_cleaned_up_without_quoting_them() {
    let web0 = pod("shop", "web-0");

    // 10,001 values: counted on the wire, refused before decoding; no state to clean up with.
    let plugin = Plugin::generator(&["--misbehave", "too-many-values"]).await;
    let env = plugin.env();
    let err = build(&env, &web0, &spec(&plugin.endpoint(), &[]))
        .await
        .unwrap()
        .generate()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, GeneratorError::Backend(ProviderError::TooLarge(_)))
            && text.contains("more than 10000"),
        "{text}"
    );
    assert_clean(&format!("{text} {err:?}"));
    // Not retried: one Generate.
    assert_eq!(plugin.count("Generate"), 1);

    // A state over 4 KiB (padded with the password): refused, and the account cleaned up.
    let plugin = Plugin::generator(&["--misbehave", "huge-state"]).await;
    let env = plugin.env();
    let err = build(&env, &web0, &spec(&plugin.endpoint(), &[]))
        .await
        .unwrap()
        .generate()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("more than the 4096 allowed") && text.contains("was cleaned up"),
        "{text}"
    );
    assert_clean(&format!("{text} {err:?}"));
    assert_eq!(
        (
            plugin.count("Generate"),
            plugin.count("Cleanup"),
            plugin.live()
        ),
        (1, 1, 0)
    );

    // A state that is not JSON (holding the password): refused; the plugin's own Cleanup
    // cannot use it either, which the error says.
    let plugin = Plugin::generator(&["--misbehave", "text-state"]).await;
    let env = plugin.env();
    let err = build(&env, &web0, &spec(&plugin.endpoint(), &[]))
        .await
        .unwrap()
        .generate()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("is not a JSON object")
            && text.contains("Cleanup of the credential it made failed too")
            && text.contains("INVALID_ARGUMENT"),
        "{text}"
    );
    assert_clean(&format!("{text} {err:?}"));
    assert_eq!(plugin.count("Cleanup"), 1);
}

/// Through the real agent: a pod mounting an ExternalSecret that names a PluginGenerator gets its
/// own account, with the pod's token for the listed audience; the unmount deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mounted_volume_gets_its_own_account_and_the_unmount_deletes_it() {
    use latchkey::csi::client::{PodVolume, unpublish_request, volume_id_for};

    support::require_root();
    let plugin = Plugin::generator(&[]).await;
    let manifests = format!(
        r#"
apiVersion: generators.latchkey.dev/v1alpha1
kind: PluginGenerator
metadata: {{name: accounts, namespace: shop}}
spec:
  provider: {{endpoint: "{endpoint}", audiences: ["{AUDIENCE}"]}}
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {{name: account, namespace: shop}}
spec:
  dataFrom:
  - sourceRef: {{generatorRef: {{kind: PluginGenerator, name: accounts}}}}
"#,
        endpoint = plugin.endpoint()
    );
    let dir = plugin.socket_dir.display().to_string();
    let agent =
        support::Agent::start(&[("gen.yaml", &manifests)], &["--plugin-socket-dir", &dir]).await;
    let mut targets = Vec::new();
    for pod in ["web-0", "web-1"] {
        let target = agent.target(pod);
        let mut volume = PodVolume::new("shop", pod, "account");
        volume.service_account = "web".into();
        volume.tokens_json = Some(
            serde_json::json!({AUDIENCE: {"token": PLUGIN_TOKEN}, "other": {"token": OTHER_TOKEN}})
                .to_string(),
        );
        let req = volume.publish_request(&volume_id_for(&target), &target);
        agent
            .node()
            .await
            .node_publish_volume(req)
            .await
            .unwrap_or_else(|e| panic!("{e:?}\n{}", agent.log_text()));
        targets.push(target);
    }
    let user = |t: &PathBuf| std::fs::read_to_string(t.join("username")).unwrap();
    assert_ne!(
        user(&targets[0]),
        user(&targets[1]),
        "each pod has its own account"
    );
    assert_eq!(
        std::fs::read_to_string(targets[0].join("password")).unwrap(),
        PASSWORD
    );
    assert_eq!((plugin.count("Generate"), plugin.live()), (2, 2));
    for t in &targets {
        agent
            .node()
            .await
            .node_unpublish_volume(unpublish_request(&volume_id_for(t), t))
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while plugin.live() != 0 {
        assert!(
            Instant::now() < deadline,
            "accounts left: {:?}",
            plugin.calls()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(plugin.count("Cleanup"), 2);
    for operation in ["generate", "cleanup"] {
        let series = format!(
            "latchkey_backend_requests_total{{provider=\"plugin\",operation=\"{operation}\",\
             result=\"success\"}}"
        );
        assert_eq!(agent.metric(&series).await, 2.0, "{series}");
    }
    assert_clean(&agent.log_text());
}
