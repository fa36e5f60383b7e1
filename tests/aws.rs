//! The `aws` provider end to end: a real `moto_server`, the real `latchkey node` binary, real
//! tmpfs mounts. Secrets are created with the AWS SDK; volumes are published over CSI.

mod support;

use std::path::Path;

use aws_sdk_secretsmanager::primitives::Blob;
use latchkey::csi::client::{PodVolume, volume_id_for};
use support::Agent;
use support::moto::Moto;
use support::store_forms::Form;
use support::tee_proxy::TeeProxy;
use tonic::Code;

/// The static keys the agent reads from the `aws-creds` Secret.
const KEY_ID: &str = "AKIDLATCHKEYE2E00001";
const SECRET_KEY: &str = "latchkey-e2e-secret-access-key-0123456789";
const POD_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.aws-pod-token-e2e.c2lnbmF0dXJl";
const ROLE: &str = "arn:aws:iam::123456789012:role/latchkey-e2e";
const DB_PASSWORD: &str = "aws-db-password-e2e-77";
const API_KEY: &str = "aws-api-key-e2e-4242";
const OLD_VALUE: &str = "aws-previous-value-e2e";
const NEW_VALUE: &str = "aws-current-value-e2e";
const BINARY: &[u8] = &[0, 159, 146, 150, 255, b'b', b'i', b'n'];

fn secret_ref_store(name: &str, endpoint: &str) -> String {
    format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {{name: {name}, namespace: shop}}\n\
         spec:\n  provider:\n    aws:\n      region: us-east-1\n      endpoint: {endpoint}\n      auth:\n        \
         secretRef:\n          accessKeyIDSecretRef: {{name: aws-creds, key: id}}\n          \
         secretAccessKeySecretRef: {{name: aws-creds, key: secret}}\n"
    )
}

fn creds_secret(namespace: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: aws-creds, namespace: {namespace}}}\n\
         stringData: {{id: {KEY_ID}, secret: {SECRET_KEY}}}\n"
    )
}

/// An ExternalSecret `name` in `shop` on `store` with `data` entries (YAML flow items).
fn external_secret(name: &str, store: &str, kind: &str, data: &[String]) -> String {
    let mut out = format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {{name: {name}, namespace: shop}}\n\
         spec:\n  secretStoreRef: {{name: {store}, kind: {kind}}}\n  data:\n"
    );
    for d in data {
        out += &format!("  - {d}\n");
    }
    out
}

fn entry(secret_key: &str, key: &str, extra: &str) -> String {
    format!("{{secretKey: {secret_key:?}, remoteRef: {{key: {key:?}{extra}}}}}")
}

fn pod(
    agent: &Agent,
    name: &str,
    es: &str,
    sa: &str,
    token: bool,
) -> csi_proto::v1::NodePublishVolumeRequest {
    let target = agent.target(name);
    let mut pod = PodVolume::new("shop", name, es);
    pod.service_account = sa.into();
    if token {
        pod.tokens_json = Some(format!(
            r#"{{"sts.amazonaws.com":{{"token":"{POD_TOKEN}","expirationTimestamp":"2099-01-01T00:00:00Z"}}}}"#
        ));
    }
    pod.publish_request(&volume_id_for(&target), &target)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

fn logins(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("latchkey_backend_logins_total{provider=\"aws\"} "))
        .unwrap_or_else(|| panic!("no aws login series in:\n{metrics}"))
        .trim()
        .parse()
        .unwrap()
}

/// `BatchGetSecretValue` calls that succeeded (as the provider counts them; 0 before the first).
fn batch_gets(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "latchkey_backend_requests_total{provider=\"aws\",operation=\"batch_get\",result=\"success\"} ",
            )
        })
        .map_or(0, |n| n.trim().parse().unwrap())
}

async fn batch_gets_now(agent: &Agent) -> u64 {
    batch_gets(&agent.http_get("/metrics").await.1)
}

fn assert_no_leak(text: &str, what: &str) {
    for s in [
        KEY_ID,
        SECRET_KEY,
        POD_TOKEN,
        DB_PASSWORD,
        API_KEY,
        OLD_VALUE,
        NEW_VALUE,
    ] {
        assert!(!text.contains(s), "{what} contains {s:?}:\n{text}");
    }
}

/// The agent log at `RUST_LOG=debug`: the AWS SDK logs the access key id at debug, so the agent
/// caps backend libraries at `info` whatever `RUST_LOG` says; nothing may appear, anywhere.
fn assert_log_has_no_leak(agent: &Agent) {
    assert_no_leak(&agent.log_text(), "the agent log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_ref_reads_strings_binary_properties_versions_batches_and_finds() {
    secret_ref_reads_strings_binary_properties_versions_batches_and_finds_as(Form::Inline).await;
}

/// The same with the store naming a provider object (issue #41).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_ref_reads_strings_binary_properties_versions_batches_and_finds_by_provider_ref() {
    secret_ref_reads_strings_binary_properties_versions_batches_and_finds_as(Form::ByReference)
        .await;
}

async fn secret_ref_reads_strings_binary_properties_versions_batches_and_finds_as(form: Form) {
    let moto = Moto::start().await;
    let sm = moto.client();
    let create =
        |name: &str, value: &str| sm.create_secret().name(name).secret_string(value).send();
    create("prod/api", API_KEY).await.unwrap();
    create(
        "prod/db",
        &format!(r#"{{"username":"shop","password":"{DB_PASSWORD}","nested":{{"host":{{"port":5432}}}}}}"#),
    )
    .await
    .unwrap();
    sm.create_secret()
        .name("prod/blob")
        .secret_binary(Blob::new(BINARY))
        .send()
        .await
        .unwrap();
    let v1 = create("prod/rotated", OLD_VALUE).await.unwrap();
    let old_id = v1.version_id().unwrap().to_string();
    sm.put_secret_value()
        .secret_id("prod/rotated")
        .secret_string(NEW_VALUE)
        .send()
        .await
        .unwrap();
    for i in 0..25 {
        create(&format!("batch-{i:02}"), &format!("batch-value-{i}"))
            .await
            .unwrap();
    }
    for name in ["team-a-one", "team-a-two", "team-b-one"] {
        create(name, &format!("value-of-{name}")).await.unwrap();
    }
    for i in 0..4 {
        create(&format!("mix-{i}"), &format!("mix-value-{i}"))
            .await
            .unwrap();
    }

    let mut m = creds_secret("shop") + &secret_ref_store("aws", &moto.endpoint);
    m += &external_secret(
        "app",
        "aws",
        "SecretStore",
        &[
            entry("api-key", "prod/api", ""),
            entry("db-password", "prod/db", ", property: password"),
            entry("db-port", "prod/db", ", property: nested.host.port"),
            entry("blob", "prod/blob", ""),
            entry("current", "prod/rotated", ""),
            entry("previous", "prod/rotated", ", version: AWSPREVIOUS"),
            entry(
                "by-id",
                "prod/rotated",
                &format!(", version: uuid/{old_id}"),
            ),
        ],
    );
    let batch: Vec<String> = (0..25)
        .map(|i| entry(&format!("b{i:02}"), &format!("batch-{i:02}"), ""))
        .collect();
    m += &external_secret("batch", "aws", "SecretStore", &batch);
    m += "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {name: found, namespace: shop}\n\
          spec:\n  secretStoreRef: {name: aws}\n  dataFrom:\n  - find: {name: {regexp: \"^team-a-\"}}\n";
    m += &external_secret(
        "missing",
        "aws",
        "SecretStore",
        &[entry("x", "prod/nope", "")],
    );
    // Four keys that exist and one that does not, read in one batch.
    let mut mixed: Vec<String> = (0..4)
        .map(|i| entry(&format!("m{i}"), &format!("mix-{i}"), ""))
        .collect();
    mixed.insert(2, entry("gone", "mix-missing", ""));
    m += &external_secret("mixed", "aws", "SecretStore", &mixed);
    let mixed_ok: Vec<String> = (0..4)
        .map(|i| entry(&format!("m{i}"), &format!("mix-{i}"), ""))
        .collect();
    m += &external_secret("mixed-ok", "aws", "SecretStore", &mixed_ok);
    let agent = Agent::start(&[("shop.yaml", &form.manifests(&m))], &[]).await;
    let mut node = agent.node().await;
    assert_eq!(batch_gets_now(&agent).await, 0);

    node.node_publish_volume(pod(&agent, "app-0", "app", "web", false))
        .await
        .unwrap();
    // prod/api, prod/db, prod/blob and prod/rotated (current) in one batch; the other versions
    // of prod/rotated one by one.
    assert_eq!(batch_gets_now(&agent).await, 1);
    let t = agent.target("app-0");
    assert_eq!(read(&t.join("api-key")), API_KEY);
    assert_eq!(read(&t.join("db-password")), DB_PASSWORD);
    assert_eq!(read(&t.join("db-port")), "5432");
    assert_eq!(std::fs::read(t.join("blob")).unwrap(), BINARY);
    assert_eq!(read(&t.join("current")), NEW_VALUE);
    assert_eq!(read(&t.join("previous")), OLD_VALUE);
    assert_eq!(read(&t.join("by-id")), OLD_VALUE);

    node.node_publish_volume(pod(&agent, "batch-0", "batch", "web", false))
        .await
        .unwrap();
    assert_eq!(
        batch_gets_now(&agent).await,
        3,
        "25 keys take two BatchGetSecretValue calls (20 + 5)"
    );
    let t = agent.target("batch-0");
    for i in 0..25 {
        assert_eq!(
            read(&t.join(format!("b{i:02}"))),
            format!("batch-value-{i}")
        );
    }

    node.node_publish_volume(pod(&agent, "found-0", "found", "web", false))
        .await
        .unwrap();
    let t = agent.target("found-0");
    let mut names: Vec<_> = std::fs::read_dir(&t)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with(".."))
        .collect();
    names.sort();
    assert_eq!(names, ["team-a-one", "team-a-two"]);
    assert_eq!(read(&t.join("team-a-two")), "value-of-team-a-two");

    let err = node
        .node_publish_volume(pod(&agent, "missing-0", "missing", "web", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("prod/nope"), "{:?}", err.message());
    assert_no_leak(err.message(), "the not-found message");
    let before = batch_gets_now(&agent).await;

    // One missing key in a batch fails that key only, and the publish names it alone.
    let err = node
        .node_publish_volume(pod(&agent, "mixed-0", "mixed", "web", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("mix-missing"), "{:?}", err.message());
    for i in 0..4 {
        assert!(
            !err.message().contains(&format!("\"mix-{i}\"")),
            "{:?}",
            err.message()
        );
    }
    assert_eq!(batch_gets_now(&agent).await, before + 1, "one batch");
    node.node_publish_volume(pod(&agent, "mixed-ok-0", "mixed-ok", "web", false))
        .await
        .unwrap();
    let t = agent.target("mixed-ok-0");
    for i in 0..4 {
        assert_eq!(read(&t.join(format!("m{i}"))), format!("mix-value-{i}"));
    }
    // The failed publish dropped the others' fetches with it (nothing of it is cached), so the
    // four are read again, in one batch.
    assert_eq!(batch_gets_now(&agent).await, before + 2);

    let (_, metrics) = agent.http_get("/metrics").await;
    assert_eq!(logins(&metrics), 0, "static keys need no STS login");
    assert_log_has_no_leak(&agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_identity_uses_the_pod_token_and_logs_in_once_per_service_account() {
    web_identity_uses_the_pod_token_and_logs_in_once_per_service_account_as(Form::Inline).await;
}

/// The same with the store naming a provider object (issue #41).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_identity_uses_the_pod_token_and_logs_in_once_per_service_account_by_provider_ref() {
    web_identity_uses_the_pod_token_and_logs_in_once_per_service_account_as(Form::ByReference)
        .await;
}

async fn web_identity_uses_the_pod_token_and_logs_in_once_per_service_account_as(form: Form) {
    let moto = Moto::start().await;
    let sm = moto.client();
    for i in 0..10 {
        sm.create_secret()
            .name(format!("jwt-{i}"))
            .secret_string(format!("jwt-value-{i}"))
            .send()
            .await
            .unwrap();
    }
    // moto does not say which token it was given: the agent talks to it through a proxy that
    // records the requests, so the test can see the web identity token on the wire.
    let moto_addr = moto.endpoint.trim_start_matches("http://").parse().unwrap();
    let wire = TeeProxy::start(moto_addr).await;
    let mut m = format!(
        "apiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {{name: web-id, namespace: shop}}\n\
         spec:\n  provider:\n    aws:\n      region: us-east-1\n      endpoint: http://{}\n      role: {ROLE}\n      \
         auth: {{jwt: {{}}}}\n",
        wire.addr
    );
    for i in 0..10 {
        m += &external_secret(
            &format!("es{i}"),
            "web-id",
            "SecretStore",
            &[entry("value", &format!("jwt-{i}"), "")],
        );
    }
    let agent = Agent::start(&[("shop.yaml", &form.manifests(&m))], &[]).await;

    // Ten pods of one service account, each reading its own key, at once: one login.
    let publishes = (0..10).map(|i| {
        let req = pod(&agent, &format!("web-{i}"), &format!("es{i}"), "web", true);
        let agent = &agent;
        async move { agent.node().await.node_publish_volume(req).await }
    });
    for r in futures::future::join_all(publishes).await {
        r.unwrap();
    }
    for i in 0..10 {
        assert_eq!(
            read(&agent.target(&format!("web-{i}")).join("value")),
            format!("jwt-value-{i}")
        );
    }
    let (_, metrics) = agent.http_get("/metrics").await;
    assert_eq!(logins(&metrics), 1, "{metrics}");
    let sent = wire.sent_text();
    assert!(
        sent.contains("Action=AssumeRoleWithWebIdentity") && sent.contains(POD_TOKEN),
        "STS did not receive the pod's token"
    );
    assert_eq!(sent.matches("Action=AssumeRoleWithWebIdentity").count(), 1);

    // Another service account is another identity: its own login, even for a cached key.
    let mut node = agent.node().await;
    node.node_publish_volume(pod(&agent, "worker-0", "es0", "worker", true))
        .await
        .unwrap();
    let (_, metrics) = agent.http_get("/metrics").await;
    assert_eq!(logins(&metrics), 2, "{metrics}");

    // No token for the audience: a clear error naming tokenRequests.
    let err = node
        .node_publish_volume(pod(&agent, "notoken-0", "es1", "batch", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("tokenRequests"),
        "{:?}",
        err.message()
    );
    assert!(
        err.message().contains("sts.amazonaws.com"),
        "{:?}",
        err.message()
    );
    assert_log_has_no_leak(&agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_without_auth_or_with_foreign_credentials_are_refused() {
    let moto = Moto::start().await;
    moto.client()
        .create_secret()
        .name("prod/api")
        .secret_string(API_KEY)
        .send()
        .await
        .unwrap();
    let endpoint = &moto.endpoint;
    let mut m = creds_secret("shop") + &creds_secret("latchkey");
    m += &format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {{name: no-auth, namespace: shop}}\n\
         spec: {{provider: {{aws: {{region: us-east-1, endpoint: {endpoint}}}}}}}\n"
    );
    // A ClusterSecretStore may only use credentials of the agent's namespace (`latchkey`).
    m += &format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: ClusterSecretStore\nmetadata: {{name: foreign}}\n\
         spec:\n  provider:\n    aws:\n      region: us-east-1\n      endpoint: {endpoint}\n      auth:\n        \
         secretRef:\n          accessKeyIDSecretRef: {{name: aws-creds, key: id, namespace: shop}}\n          \
         secretAccessKeySecretRef: {{name: aws-creds, key: secret, namespace: shop}}\n"
    );
    m += &format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: ClusterSecretStore\nmetadata: {{name: own}}\n\
         spec:\n  provider:\n    aws:\n      region: us-east-1\n      endpoint: {endpoint}\n      auth:\n        \
         secretRef:\n          accessKeyIDSecretRef: {{name: aws-creds, key: id, namespace: latchkey}}\n          \
         secretAccessKeySecretRef: {{name: aws-creds, key: secret, namespace: latchkey}}\n"
    );
    let one = [entry("api-key", "prod/api", "")];
    m += &external_secret("no-auth", "no-auth", "SecretStore", &one);
    m += &external_secret("foreign", "foreign", "ClusterSecretStore", &one);
    m += &external_secret("own", "own", "ClusterSecretStore", &one);
    let agent = Agent::start(&[("shop.yaml", &m)], &[]).await;
    let mut node = agent.node().await;

    let err = node
        .node_publish_volume(pod(&agent, "no-auth-0", "no-auth", "web", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("agentIdentity"),
        "{:?}",
        err.message()
    );

    let err = node
        .node_publish_volume(pod(&agent, "foreign-0", "foreign", "web", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("shop/aws-creds"),
        "{:?}",
        err.message()
    );

    node.node_publish_volume(pod(&agent, "own-0", "own", "web", false))
        .await
        .unwrap();
    assert_eq!(read(&agent.target("own-0").join("api-key")), API_KEY);
    assert_log_has_no_leak(&agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_the_backend_rejects_are_permission_denied() {
    // With IAM checks on, moto knows no access key at all: every request is refused.
    let moto = Moto::start_with_env(&[("INITIAL_NO_AUTH_ACTION_COUNT", "0")]).await;
    let m = creds_secret("shop")
        + &secret_ref_store("aws", &moto.endpoint)
        + &external_secret(
            "app",
            "aws",
            "SecretStore",
            &[entry("api-key", "prod/api", "")],
        );
    let agent = Agent::start(&[("shop.yaml", &m)], &[]).await;
    let err = agent
        .node()
        .await
        .node_publish_volume(pod(&agent, "denied-0", "app", "web", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("prod/api"), "{:?}", err.message());
    assert_no_leak(err.message(), "the denial");
    assert_log_has_no_leak(&agent);
}

/// The value of one metric series (0 before the agent creates it).
async fn metric(agent: &Agent, series: &str) -> f64 {
    let (_, body) = agent.http_get("/metrics").await;
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_waits_for_the_refresh_interval_and_swaps_related_files_together() {
    const GETS: &str =
        "latchkey_backend_requests_total{provider=\"aws\",operation=\"get\",result=\"success\"}";
    let moto = Moto::start().await;
    let sm = moto.client();
    let value = |g: usize| format!(r#"{{"user":"user-{g}","pass":"pass-{g}"}}"#);
    sm.create_secret()
        .name("app/rotating")
        .secret_string(value(0))
        .send()
        .await
        .unwrap();
    let rotate = |g: usize| {
        sm.put_secret_value()
            .secret_id("app/rotating")
            .secret_string(value(g))
            .send()
    };
    let m = creds_secret("shop")
        + &secret_ref_store("aws", &moto.endpoint)
        + "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\n\
           metadata: {name: rotating, namespace: shop}\nspec:\n  secretStoreRef: {name: aws}\n  \
           refreshInterval: 1s\n  data:\n  \
           - {secretKey: user, remoteRef: {key: app/rotating, property: user}}\n  \
           - {secretKey: pass, remoteRef: {key: app/rotating, property: pass}}\n";
    let agent = Agent::start(&[("aws.yaml", &m)], &[]).await;
    let target = agent.target("rot");
    let republish = || async {
        agent
            .node()
            .await
            .node_publish_volume(pod(&agent, "rot", "rotating", "default", false))
            .await
            .unwrap()
    };
    republish().await;
    assert_eq!(read(&target.join("user")), "user-0");
    let gets = metric(&agent, GETS).await;
    assert!(gets >= 1.0, "the mount read the backend");

    // Changed in the backend, republished before due: same content, no backend call.
    rotate(1).await.unwrap();
    republish().await;
    assert_eq!(read(&target.join("user")), "user-0");
    assert_eq!(read(&target.join("pass")), "pass-0");
    assert_eq!(
        metric(&agent, GETS).await,
        gets,
        "no backend call before due"
    );

    // Due: new content, the two files always of one generation for a concurrent reader.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (stop, target) = (std::sync::Arc::clone(&stop), target.clone());
        std::thread::spawn(move || support::read_pairs_until_stopped(target, &stop))
    };
    for generation in 1..=3 {
        if generation > 1 {
            rotate(generation).await.unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(1050)).await;
        republish().await;
        assert_eq!(read(&target.join("user")), format!("user-{generation}"));
        assert_eq!(read(&target.join("pass")), format!("pass-{generation}"));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let pairs = reader.join().expect("the reader saw a mixed snapshot");
    assert!(pairs > 0, "the reader read the volume");
    assert_eq!(metric(&agent, GETS).await, gets + 3.0);
    assert_log_has_no_leak(&agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_by_tags_keeps_the_secrets_carrying_every_tag_exactly() {
    use aws_sdk_secretsmanager::types::Tag;
    let moto = Moto::start().await;
    let sm = moto.client();
    let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
    for (name, tags) in [
        ("tagged-a", vec![tag("team", "shop"), tag("env", "prod")]),
        ("tagged-b", vec![tag("team", "shop"), tag("env", "dev")]),
        // Prefix matches of the key or the value, and the value under another key: not kept.
        (
            "tagged-c",
            vec![tag("team", "shopfloor"), tag("env", "prod")],
        ),
        ("tagged-d", vec![tag("teams", "shop"), tag("env", "prod")]),
        ("tagged-e", vec![tag("owner", "shop"), tag("team", "prod")]),
    ] {
        sm.create_secret()
            .name(name)
            .secret_string(format!("value-of-{name}"))
            .set_tags(Some(tags))
            .send()
            .await
            .unwrap();
    }
    let mut m = creds_secret("shop") + &secret_ref_store("aws", &moto.endpoint);
    m += "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {name: tagged, namespace: shop}\n\
          spec:\n  secretStoreRef: {name: aws}\n  dataFrom:\n  - find: {tags: {team: shop, env: prod}}\n";
    let agent = Agent::start(&[("shop.yaml", &m)], &[]).await;
    agent
        .node()
        .await
        .node_publish_volume(pod(&agent, "tagged-0", "tagged", "web", false))
        .await
        .unwrap();
    let t = agent.target("tagged-0");
    let mut names: Vec<_> = std::fs::read_dir(&t)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with(".."))
        .collect();
    names.sort();
    assert_eq!(names, ["tagged-a"]);
    assert_eq!(read(&t.join("tagged-a")), "value-of-tagged-a");
}
