//! Tenancy and denial-of-service regressions, end to end: the real `latchkey node` binary over
//! its real socket, real tmpfs mounts, a real OpenBao dev server, and hostile backends (small
//! local HTTP servers standing in for a Vault or an AWS endpoint a tenant runs). Each test here
//! failed on the agent before the fixes it names, and passes after them.

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use latchkey::csi::client::{PodVolume, volume_id_for};
use serde_json::json;
use support::hostile::{Answer, Hostile};
use support::openbao::OpenBao;
use support::{Agent, mounts_at};
use tonic::Code;

/// Publishes ExternalSecret `es` for pod `pod` (service account `sa`) of `namespace`.
async fn publish(
    agent: &Agent,
    namespace: &str,
    pod: &str,
    sa: &str,
    es: &str,
) -> Result<PathBuf, tonic::Status> {
    let target = agent.target(&format!("{namespace}-{pod}"));
    let mut volume = PodVolume::new(namespace, pod, es);
    volume.service_account = sa.into();
    let req = volume.publish_request(&volume_id_for(&target), &target);
    agent.node().await.node_publish_volume(req).await?;
    Ok(target)
}

/// Asserts a refused first publish left nothing at its target.
fn assert_nothing_left(agent: &Agent, namespace: &str, pod: &str) {
    let target = agent.target(&format!("{namespace}-{pod}"));
    assert_eq!(
        mounts_at(&target),
        0,
        "a mount was left at {}",
        target.display()
    );
    assert!(
        std::fs::read_dir(&target).map_or(true, |mut d| d.next().is_none()),
        "files were left at {}",
        target.display()
    );
}

fn es_yaml(namespace: &str, name: &str, store: &str, kind: &str, body: &str) -> String {
    format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\n\
         metadata: {{name: {name}, namespace: {namespace}}}\n\
         spec:\n  secretStoreRef: {{name: {store:?}, kind: {kind}}}\n{body}"
    )
}

// ---- 1. The Vault AppRole login cache --------------------------------------------------------

const TEAM_A_VALUE: &str = "team-a-database-password-e2e-8812";

/// A ClusterSecretStore admitting only `team-a` logs in with an AppRole whose secret id lives
/// in the agent's namespace. A tenant in `evil` copies the (non-secret) roleId into its own
/// SecretStore and points `secretRef.namespace` at the agent's namespace. Before the fix, once
/// any team-a pod had mounted, the cached login was found under the same key and the namespace
/// check (inside the login closure) never ran: evil's pod received team-a's secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approle_login_of_a_cluster_store_never_serves_another_namespace() {
    let bao = OpenBao::start().await;
    bao.policy(
        "team-a",
        r#"path "secret/data/team-a/*" { capabilities = ["read"] }"#,
    )
    .await;
    bao.put_v2("secret", "team-a/db", json!({"password": TEAM_A_VALUE}))
        .await;
    let (role_id, secret_id) = bao.approle("team-a", &["team-a"]).await;
    let server = &bao.url;
    let approle = |extra: &str| {
        format!(
            "{{appRole: {{roleId: {role_id}, secretRef: {{name: vault-approle, key: secret-id{extra}}}}}}}"
        )
    };
    let mut m = format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: vault-approle, namespace: latchkey}}\n\
         stringData: {{secret-id: {secret_id}}}\n\
         ---\napiVersion: latchkey.dev/v1alpha1\nkind: ClusterSecretStore\nmetadata: {{name: team-a-vault}}\n\
         spec:\n  conditions: [{{namespaces: [team-a]}}]\n  provider:\n    vault:\n      \
         server: {server}\n      auth: {}\n",
        approle("")
    );
    m += &format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {{name: stolen, namespace: evil}}\n\
         spec:\n  provider:\n    vault:\n      server: {server}\n      auth: {}\n",
        approle(", namespace: latchkey")
    );
    let data =
        "  data:\n  - {secretKey: password, remoteRef: {key: team-a/db, property: password}}\n";
    m += &es_yaml("team-a", "db", "team-a-vault", "ClusterSecretStore", data);
    m += &es_yaml("evil", "steal", "stolen", "SecretStore", data);
    m += &es_yaml(
        "evil",
        "steal-cluster",
        "team-a-vault",
        "ClusterSecretStore",
        data,
    );
    let agent = Agent::start(&[("tenants.yaml", &m)], &[]).await;

    // Cold cache: refused.
    let err = publish(&agent, "evil", "cold", "default", "steal")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message()
            .contains("latchkey/vault-approle is outside a SecretStore's own namespace"),
        "{}",
        err.message()
    );

    // team-a mounts: one login, cached.
    let t = publish(&agent, "team-a", "app", "default", "db")
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(t.join("password")).unwrap(),
        TEAM_A_VALUE
    );

    // Warm cache: still refused, with nothing mounted, by either route.
    for (pod, sa) in [("warm", "default"), ("warm-other-sa", "builder")] {
        let err = publish(&agent, "evil", pod, sa, "steal").await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{pod}: {err:?}");
        assert_nothing_left(&agent, "evil", pod);
    }
    let err = publish(&agent, "evil", "via-cluster", "default", "steal-cluster")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("does not admit"),
        "{}",
        err.message()
    );
    assert_nothing_left(&agent, "evil", "via-cluster");
    let log = agent.log_text();
    for secret in [TEAM_A_VALUE, secret_id.as_str(), bao.root_token.as_str()] {
        assert!(!log.contains(secret), "the agent log holds a secret");
    }
}

// ---- 2. The agent's own AWS identity --------------------------------------------------------

/// `agentIdentity` on a SecretStore let a tenant act as the node's AWS role (and send requests
/// signed with its keys to an endpoint of the tenant's choosing). It is refused at bind time,
/// before any request: the tenant's endpoint hears nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_store_cannot_use_the_agents_aws_identity() {
    let endpoint = Hostile::start(Answer::Fixed(200, "{}".into())).await;
    let mut m = format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {{name: node-role, namespace: shop}}\n\
         spec:\n  provider:\n    aws:\n      region: us-east-1\n      endpoint: {}\n      \
         role: arn:aws:iam::123456789012:role/anything-trusting-the-node\n      auth: {{agentIdentity: {{}}}}\n",
        endpoint.url
    );
    m += &es_yaml(
        "shop",
        "node",
        "node-role",
        "SecretStore",
        "  data:\n  - {secretKey: k, remoteRef: {key: prod/db}}\n",
    );
    let agent = Agent::start(&[("shop.yaml", &m)], &[]).await;
    let err = publish(&agent, "shop", "p", "default", "node")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains(
            "provider.aws.auth.agentIdentity (the node agent's own AWS identity) is only allowed \
             on a ClusterSecretStore"
        ) && err.message().contains("SecretStore \"node-role\""),
        "{}",
        err.message()
    );
    assert_eq!(
        endpoint.requests(),
        0,
        "no request reached the tenant's endpoint"
    );
    assert_nothing_left(&agent, "shop", "p");
}

// ---- 3. Hostile backends: memory, and forged log lines ---------------------------------------

/// A Vault server or AWS endpoint that a store names may answer with an endless body. Before
/// the fix the agent buffered it whole and aborted at about 1 GiB; now every body is cut at
/// 16 MiB as it arrives, the publish fails UNAVAILABLE naming the limit, and the agent's peak
/// memory stays small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_backends_with_endless_answers_cannot_exhaust_memory() {
    let endless = Hostile::start(Answer::Endless).await;
    let huge = Hostile::start(Answer::HugeLength).await;
    let mut m = String::from(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {name: creds, namespace: shop}\n\
         stringData: {token: s.tenant-token, id: AKIDTENANT00000000001, secret: tenant-secret-key}\n",
    );
    for (name, url) in [("endless", &endless.url), ("huge", &huge.url)] {
        m += &format!(
            "---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {{name: vault-{name}, namespace: shop}}\n\
             spec:\n  provider:\n    vault:\n      server: {url}\n      \
             auth: {{tokenSecretRef: {{name: creds, key: token}}}}\n\
             ---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {{name: aws-{name}, namespace: shop}}\n\
             spec:\n  provider:\n    aws:\n      region: us-east-1\n      endpoint: {url}\n      auth:\n        \
             secretRef:\n          accessKeyIDSecretRef: {{name: creds, key: id}}\n          \
             secretAccessKeySecretRef: {{name: creds, key: secret}}\n"
        );
        for provider in ["vault", "aws"] {
            m += &es_yaml(
                "shop",
                &format!("{provider}-{name}"),
                &format!("{provider}-{name}"),
                "SecretStore",
                "  data:\n  - {secretKey: k, remoteRef: {key: app/db}}\n",
            );
        }
    }
    let agent = Agent::start(&[("shop.yaml", &m)], &[]).await;
    let baseline = agent.peak_rss_mib();
    for es in ["vault-endless", "vault-huge", "aws-endless", "aws-huge"] {
        let started = Instant::now();
        let err = publish(&agent, "shop", es, "default", es)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{es}: {err:?}");
        assert!(
            err.message().contains("larger than 16777216 bytes"),
            "{es}: {}",
            err.message()
        );
        assert!(started.elapsed() < Duration::from_secs(30), "{es}");
        assert_nothing_left(&agent, "shop", es);
    }
    assert!(endless.requests() > 0 && huge.requests() > 0);
    let peak = agent.peak_rss_mib();
    // Each answer is cut at 16 MiB (a few SDK retries included); 3 GiB were on offer.
    assert!(
        peak < baseline + 160,
        "peak RSS {peak} MiB (baseline {baseline} MiB) after endless answers"
    );
    // Still serving.
    assert_eq!(agent.http_get("/healthz").await.0, 200);
}

/// A tenant-run Vault answering with control characters in its error message: before the fix
/// they reached the text log raw (a forged `INFO ... published` line, terminal escapes). Now
/// they are escaped everywhere: the gRPC message, the Event text and the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_messages_cannot_forge_log_lines() {
    const FORGED: &str = "2026-11-23T09:00:00.000000Z  INFO latchkey::csi: volume published";
    let message = format!("permission denied\n{FORGED}\u{1b}[2J\r\u{202e}");
    let vault = Hostile::start(Answer::Fixed(
        403,
        json!({ "errors": [message] }).to_string(),
    ))
    .await;
    let mut m = format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: creds, namespace: shop}}\n\
         stringData: {{token: s.tenant-token}}\n\
         ---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {{name: forger, namespace: shop}}\n\
         spec:\n  provider:\n    vault:\n      server: {}\n      \
         auth: {{tokenSecretRef: {{name: creds, key: token}}}}\n",
        vault.url
    );
    m += &es_yaml(
        "shop",
        "forged",
        "forger",
        "SecretStore",
        "  data:\n  - {secretKey: k, remoteRef: {key: app/db}}\n",
    );
    let agent = Agent::start(&[("shop.yaml", &m)], &["--log-format", "text"]).await;
    let err = publish(&agent, "shop", "p", "default", "forged")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let text = err.message();
    assert!(
        text.contains("2026-11-23T09:00:00") && text.contains("\\u{1b}[2J"),
        "{text}"
    );
    assert!(!text.chars().any(char::is_control), "{text:?}");
    let log = agent.log_text();
    let raw: Vec<&str> = log
        .lines()
        .filter(|l| l.contains('\u{1b}') || l.contains('\u{202e}'))
        .collect();
    assert!(raw.is_empty(), "raw escapes in the log: {raw:?}");
    assert!(
        !log.lines().any(|l| l.starts_with(FORGED)),
        "a forged line in the log:\n{log}"
    );
}

// ---- 4. Hostile manifests -------------------------------------------------------------------

fn fake_store(namespace: &str, entries: &[(String, String)]) -> String {
    let mut out = format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {{name: fake, namespace: {namespace}}}\n\
         spec:\n  provider:\n    fake:\n      data:\n"
    );
    for (k, v) in entries {
        out += &format!("      - {{key: {k:?}, value: {v:?}}}\n");
    }
    out
}

/// Each tenant-controlled count and size is bounded, in the agent (and in the CRD): rewrite
/// steps that double a name, 1,000 `find` entries, huge `refreshInterval`s, names with `..`,
/// and selectors that would admit everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_manifests_are_refused_or_bounded() {
    // 100 values of 14 KiB under `big/`: 1.4 MB, as in the report.
    let mut entries: Vec<(String, String)> = (0..100)
        .map(|i| (format!("big/{i:03}"), "x".repeat(14 << 10)))
        .collect();
    entries.push(("obj".into(), r#"{"a":"1"}"#.into()));
    let mut m = fake_store("shop", &entries);
    let rewrite = |n: usize| {
        let steps = vec![r#"{regexp: {source: "^(.*)$", target: "$1$1"}}"#; n].join(", ");
        format!("  dataFrom:\n  - extract: {{key: obj}}\n    rewrite: [{steps}]\n")
    };
    let finds = |n: usize| {
        let mut body = String::from("  dataFrom:\n");
        for _ in 0..n {
            body += "  - find: {path: big/}\n";
        }
        body
    };
    let data = "  data:\n  - {secretKey: a, remoteRef: {key: obj}}\n";
    m += &es_yaml("shop", "doubling-16", "fake", "SecretStore", &rewrite(16));
    m += &es_yaml("shop", "doubling-40", "fake", "SecretStore", &rewrite(40));
    m += &es_yaml("shop", "finds-1000", "fake", "SecretStore", &finds(1000));
    m += &es_yaml("shop", "finds-50", "fake", "SecretStore", &finds(50));
    m += &es_yaml(
        "shop",
        "forever",
        "fake",
        "SecretStore",
        &format!("  refreshInterval: 300000000000h\n{data}"),
    );
    m += &es_yaml("shop", "dotdot", "../../secrets/x", "SecretStore", data);
    m += "---\napiVersion: latchkey.dev/v1alpha1\nkind: ClusterSecretStore\nmetadata: {name: not-in-nothing}\n\
          spec:\n  conditions: [{namespaceSelector: {matchExpressions: [{key: env, operator: NotIn, values: []}]}}]\n  \
          provider: {fake: {data: [{key: obj, value: x}]}}\n";
    m += &es_yaml(
        "shop",
        "everyone",
        "not-in-nothing",
        "ClusterSecretStore",
        data,
    );
    let agent = Agent::start(&[("shop.yaml", &m)], &[]).await;

    let cases = [
        (
            "doubling-16",
            Code::ResourceExhausted,
            "a rewritten name grows beyond 1024 bytes",
        ),
        (
            "doubling-40",
            Code::FailedPrecondition,
            "spec.dataFrom[0].rewrite: must have at most 16 items",
        ),
        (
            "finds-1000",
            Code::FailedPrecondition,
            "spec.dataFrom: must have at most 50 items",
        ),
        (
            "forever",
            Code::FailedPrecondition,
            "spec.refreshInterval: must be at most 8760h",
        ),
        (
            "dotdot",
            Code::FailedPrecondition,
            "is not a valid Kubernetes name",
        ),
        (
            "everyone",
            Code::PermissionDenied,
            "invalid requirement on \"env\": NotIn needs values",
        ),
    ];
    for (es, code, text) in cases {
        let started = Instant::now();
        let err = publish(&agent, "shop", es, "default", es)
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "{es}: {err:?}");
        assert!(err.message().contains(text), "{es}: {}", err.message());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{es} took {:?}",
            started.elapsed()
        );
        assert_nothing_left(&agent, "shop", es);
    }
    // 50 identical searches over 1.4 MB: one search, one budget, a bounded footprint (the report
    // measured 1.44 GB with 1,000 of them).
    let t = publish(&agent, "shop", "finds-50", "default", "finds-50")
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(t.join("big/042")).unwrap().len(),
        14 << 10
    );
    let peak = agent.peak_rss_mib();
    assert!(peak < 200, "peak RSS {peak} MiB");
    assert_eq!(agent.http_get("/healthz").await.0, 200);
}

// ---- 5. Hostile templates: CPU ---------------------------------------------------------------

/// Templates of one namespace that burn CPU up to their bounds, published four at a time in a
/// loop: before the fix they ran on the async workers and held other tenants' publishes and
/// `/healthz` for 41-55 s. Now they run on the compute pool, one namespace never holds every
/// thread, and each publish stops at its deadline: another tenant's templated publish and the
/// health endpoint answer within a second throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_templates_do_not_stall_other_tenants_or_health() {
    let big = "y".repeat(20_000);
    let mut m = fake_store("evil", &[("big".into(), big)]);
    let keys: String = (0..40)
        .map(|i| format!("        k{i}: \"secret.big.split('').map(c, c + c).size()\"\n"))
        .collect();
    m += &es_yaml(
        "evil",
        "hog",
        "fake",
        "SecretStore",
        &format!(
            "  data:\n  - {{secretKey: big, remoteRef: {{key: big}}}}\n  target:\n    template:\n      data:\n{keys}"
        ),
    );
    m += &fake_store("shop", &[("user".into(), "alice".into())]);
    m += &es_yaml(
        "shop",
        "good",
        "fake",
        "SecretStore",
        "  data:\n  - {secretKey: user, remoteRef: {key: user}}\n  target:\n    template:\n      data:\n        \
         greeting: \"'hello %s'.format([secret.user])\"\n",
    );
    let agent = std::sync::Arc::new(Agent::start(&[("t.yaml", &m)], &[]).await);

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hostile: Vec<_> = (0..4)
        .map(|worker| {
            let (agent, stop) = (std::sync::Arc::clone(&agent), std::sync::Arc::clone(&stop));
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let pod = format!("hog-{worker}-{i}");
                    let started = Instant::now();
                    let r = publish(&agent, "evil", &pod, "default", "hog").await;
                    outcomes.push((r.map(|_| ()).map_err(|e| e.code()), started.elapsed()));
                    i += 1;
                }
                outcomes
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut worst_publish = Duration::ZERO;
    let mut worst_health = Duration::ZERO;
    for i in 0..15 {
        let started = Instant::now();
        assert_eq!(agent.http_get("/healthz").await.0, 200);
        worst_health = worst_health.max(started.elapsed());
        let started = Instant::now();
        let t = publish(&agent, "shop", &format!("good-{i}"), "default", "good")
            .await
            .unwrap();
        worst_publish = worst_publish.max(started.elapsed());
        assert_eq!(
            std::fs::read_to_string(t.join("greeting")).unwrap(),
            "hello alice"
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut hostile_runs = 0;
    for h in hostile {
        for (outcome, took) in h.await.unwrap() {
            hostile_runs += 1;
            // Bounded: the cost budget or the 2 s deadline stops each one.
            assert!(
                took < Duration::from_secs(5),
                "a hostile publish took {took:?}"
            );
            if let Err(code) = outcome {
                assert!(
                    matches!(code, Code::InvalidArgument | Code::DeadlineExceeded),
                    "{code:?}"
                );
            }
        }
    }
    eprintln!(
        "{hostile_runs} hostile publishes; worst /healthz {worst_health:?}, worst other-tenant \
         publish {worst_publish:?}"
    );
    assert!(
        hostile_runs >= 4,
        "the hostile templates ran ({hostile_runs})"
    );
    assert!(
        worst_health < Duration::from_secs(1),
        "/healthz took {worst_health:?}"
    );
    assert!(
        worst_publish < Duration::from_secs(1),
        "another tenant's publish took {worst_publish:?}"
    );
    let peak = agent.peak_rss_mib();
    assert!(peak < 400, "peak RSS {peak} MiB");
}
