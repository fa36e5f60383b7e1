//! The `aws` provider's Parameter Store service end to end: a real `moto_server`, the real
//! `latchkey node` binary, real tmpfs mounts. Parameters are created with the AWS SDK; volumes
//! are published over CSI.

mod support;

use std::path::Path;

use aws_sdk_ssm::types::{ParameterType, Tag};
use latchkey::csi::client::{PodVolume, volume_id_for};
use support::Agent;
use support::moto::Moto;
use support::store_forms::Form;
use support::tee_proxy::TeeProxy;
use tonic::Code;

const KEY_ID: &str = "AKIDLATCHKEYSSM00001";
const SECRET_KEY: &str = "latchkey-ssm-secret-access-key-0123456789";
const POD_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.ssm-pod-token-e2e.c2lnbmF0dXJl";
const ROLE: &str = "arn:aws:iam::123456789012:role/latchkey-ssm";
const API_KEY: &str = "ssm-api-key-e2e-4242";
const DB_PASSWORD: &str = "ssm-db-password-e2e-77";
const OLD_VALUE: &str = "ssm-previous-value-e2e";
const NEW_VALUE: &str = "ssm-current-value-e2e";
const HOSTS: &str = "ssm-host-a,ssm-host-b,ssm-host-c";
const TEAM_VALUE: &str = "ssm-team-value-e2e";
/// `GetParameters` calls that succeeded, as the provider counts them.
const GET_PARAMETERS: &str = "latchkey_backend_requests_total{provider=\"aws\",operation=\"get_parameters\",result=\"success\"}";

fn store(name: &str, service: &str, endpoint: &str) -> String {
    format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {{name: {name}, namespace: shop}}\n\
         spec:\n  provider:\n    aws:\n      service: {service}\n      region: us-east-1\n      \
         endpoint: {endpoint}\n      auth:\n        secretRef:\n          \
         accessKeyIDSecretRef: {{name: aws-creds, key: id}}\n          \
         secretAccessKeySecretRef: {{name: aws-creds, key: secret}}\n"
    )
}

fn creds_secret() -> String {
    format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: aws-creds, namespace: shop}}\n\
         stringData: {{id: {KEY_ID}, secret: {SECRET_KEY}}}\n"
    )
}

/// An ExternalSecret `name` in `shop` on `store` with `data` entries (YAML flow items).
fn external_secret(name: &str, store: &str, data: &[String]) -> String {
    let mut out = format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {{name: {name}, namespace: shop}}\n\
         spec:\n  secretStoreRef: {{name: {store}}}\n  data:\n"
    );
    for d in data {
        out += &format!("  - {d}\n");
    }
    out
}

/// An ExternalSecret `name` on `store` with one `dataFrom` entry (a YAML flow mapping).
fn finder(name: &str, store: &str, data_from: &str) -> String {
    format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {{name: {name}, namespace: shop}}\n\
         spec:\n  secretStoreRef: {{name: {store}}}\n  dataFrom:\n  - {data_from}\n"
    )
}

fn entry(secret_key: &str, key: &str, extra: &str) -> String {
    format!("{{secretKey: {secret_key:?}, remoteRef: {{key: {key:?}{extra}}}}}")
}

fn pod(
    agent: &Agent,
    name: &str,
    es: &str,
    token: bool,
) -> csi_proto::v1::NodePublishVolumeRequest {
    let target = agent.target(name);
    let mut pod = PodVolume::new("shop", name, es);
    pod.service_account = "web".into();
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

/// The entries of a mounted volume, sorted (nested files as `dir/file`).
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if name.starts_with("..") {
            continue;
        }
        if e.path().is_dir() {
            out.extend(files(&e.path()).into_iter().map(|n| format!("{name}/{n}")));
        } else {
            out.push(name);
        }
    }
    out.sort();
    out
}

/// The value of one metric series (0 before the agent creates it).
async fn metric(agent: &Agent, series: &str) -> f64 {
    let (_, body) = agent.http_get("/metrics").await;
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

fn assert_no_leak(text: &str, what: &str) {
    for s in [
        KEY_ID,
        SECRET_KEY,
        POD_TOKEN,
        API_KEY,
        DB_PASSWORD,
        OLD_VALUE,
        NEW_VALUE,
        HOSTS,
        TEAM_VALUE,
    ] {
        assert!(!text.contains(s), "{what} contains {s:?}:\n{text}");
    }
}

async fn put(
    ssm: &aws_sdk_ssm::Client,
    name: &str,
    ty: ParameterType,
    value: &str,
    tags: &[(&str, &str)],
) {
    let mut req = ssm.put_parameter().name(name).value(value).r#type(ty);
    for (k, v) in tags {
        req = req.tags(Tag::builder().key(*k).value(*v).build().unwrap());
    }
    req.send().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameter_store_reads_types_versions_labels_properties_batches_and_finds() {
    parameter_store_reads_types_versions_labels_properties_batches_and_finds_as(Form::Inline).await;
}

/// The same with the store naming a provider object (issue #41).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameter_store_reads_types_versions_labels_properties_batches_and_finds_by_provider_ref()
{
    parameter_store_reads_types_versions_labels_properties_batches_and_finds_as(Form::ByReference)
        .await;
}

async fn parameter_store_reads_types_versions_labels_properties_batches_and_finds_as(form: Form) {
    let moto = Moto::start().await;
    let ssm = moto.ssm_client();
    put(&ssm, "/app/api", ParameterType::String, API_KEY, &[]).await;
    put(&ssm, "/app/hosts", ParameterType::StringList, HOSTS, &[]).await;
    let db =
        format!(r#"{{"username":"shop","password":"{DB_PASSWORD}","nested":{{"port":5432}}}}"#);
    put(&ssm, "/app/db", ParameterType::SecureString, &db, &[]).await;
    put(
        &ssm,
        "/app/rotated",
        ParameterType::SecureString,
        OLD_VALUE,
        &[],
    )
    .await;
    ssm.put_parameter()
        .name("/app/rotated")
        .value(NEW_VALUE)
        .r#type(ParameterType::SecureString)
        .overwrite(true)
        .send()
        .await
        .unwrap();
    ssm.label_parameter_version()
        .name("/app/rotated")
        .parameter_version(1)
        .labels("stable")
        .send()
        .await
        .unwrap();
    for i in 0..15 {
        put(
            &ssm,
            &format!("/batch/p{i:02}"),
            ParameterType::String,
            &format!("batch-value-{i}"),
            &[],
        )
        .await;
    }
    put(&ssm, "/mix/a", ParameterType::String, "mix-a", &[]).await;
    put(&ssm, "/mix/b", ParameterType::String, "mix-b", &[]).await;
    put(
        &ssm,
        "/team/a/one",
        ParameterType::String,
        "team-a-one",
        &[],
    )
    .await;
    put(
        &ssm,
        "/team/a/sub/two",
        ParameterType::SecureString,
        "team-a-two",
        &[],
    )
    .await;
    put(
        &ssm,
        "/team/b/one",
        ParameterType::String,
        "team-b-one",
        &[],
    )
    .await;
    put(
        &ssm,
        "/tagged/x",
        ParameterType::SecureString,
        TEAM_VALUE,
        &[("team", "shop")],
    )
    .await;
    put(
        &ssm,
        "/tagged/y",
        ParameterType::String,
        "tagged-y",
        &[("team", "other")],
    )
    .await;
    put(
        &ssm,
        "/elsewhere/z",
        ParameterType::String,
        "elsewhere-z",
        &[("team", "shop")],
    )
    .await;

    let mut m = creds_secret() + &store("ssm", "ParameterStore", &moto.endpoint);
    m += &external_secret(
        "app",
        "ssm",
        &[
            entry("api-key", "/app/api", ""),
            entry("hosts", "/app/hosts", ""),
            entry("db-password", "/app/db", ", property: password"),
            entry("db-port", "/app/db", ", property: nested.port"),
            entry("current", "/app/rotated", ""),
            entry("first", "/app/rotated", ", version: \"1\""),
            entry("stable", "/app/rotated", ", version: stable"),
        ],
    );
    let batch: Vec<String> = (0..15)
        .map(|i| entry(&format!("b{i:02}"), &format!("/batch/p{i:02}"), ""))
        .collect();
    m += &external_secret("batch", "ssm", &batch);
    let slash = "rewrite: [{regexp: {source: \"^/\", target: \"\"}}]";
    m += &finder(
        "by-path",
        "ssm",
        &format!("{{find: {{path: /team/a}}, {slash}}}"),
    );
    m += &finder(
        "by-tags",
        "ssm",
        &format!("{{find: {{tags: {{team: shop}}}}, {slash}}}"),
    );
    m += &finder(
        "by-tags-below",
        "ssm",
        &format!("{{find: {{path: /tagged, tags: {{team: shop}}}}, {slash}}}"),
    );
    m += &finder(
        "by-name",
        "ssm",
        &format!("{{find: {{name: {{regexp: \"^/team/.*/one$\"}}}}, {slash}}}"),
    );
    m += "---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {name: fake, namespace: shop}\n\
          spec: {provider: {fake: {data: [{key: x, value: fake-value}]}}}\n";
    m += &finder("fake-tags", "fake", "{find: {tags: {team: shop}}}");
    m += &external_secret("missing", "ssm", &[entry("x", "/app/nope", "")]);
    m += &external_secret(
        "mixed",
        "ssm",
        &[
            entry("a", "/mix/a", ""),
            entry("gone", "/mix/gone", ""),
            entry("b", "/mix/b", ""),
        ],
    );
    m += &external_secret(
        "no-version",
        "ssm",
        &[entry("x", "/app/rotated", ", version: \"9\"")],
    );
    let agent = Agent::start(&[("shop.yaml", &form.manifests(&m))], &[]).await;
    let mut node = agent.node().await;

    node.node_publish_volume(pod(&agent, "app-0", "app", false))
        .await
        .unwrap();
    // /app/api, /app/hosts, /app/db and /app/rotated in one GetParameters; the versions alone.
    assert_eq!(metric(&agent, GET_PARAMETERS).await, 1.0);
    let t = agent.target("app-0");
    assert_eq!(read(&t.join("api-key")), API_KEY);
    assert_eq!(
        read(&t.join("hosts")),
        HOSTS,
        "a StringList is its comma-separated text"
    );
    assert_eq!(
        read(&t.join("db-password")),
        DB_PASSWORD,
        "SecureString decrypted"
    );
    assert_eq!(read(&t.join("db-port")), "5432");
    assert_eq!(read(&t.join("current")), NEW_VALUE);
    assert_eq!(read(&t.join("first")), OLD_VALUE, "version 1");
    assert_eq!(read(&t.join("stable")), OLD_VALUE, "label stable");

    node.node_publish_volume(pod(&agent, "batch-0", "batch", false))
        .await
        .unwrap();
    assert_eq!(
        metric(&agent, GET_PARAMETERS).await,
        3.0,
        "15 names take two GetParameters calls (10 + 5)"
    );
    let t = agent.target("batch-0");
    for i in 0..15 {
        assert_eq!(
            read(&t.join(format!("b{i:02}"))),
            format!("batch-value-{i}")
        );
    }

    node.node_publish_volume(pod(&agent, "path-0", "by-path", false))
        .await
        .unwrap();
    let t = agent.target("path-0");
    assert_eq!(
        files(&t),
        ["team/a/one", "team/a/sub/two"],
        "recursive, below /team/a only"
    );
    assert_eq!(read(&t.join("team/a/sub/two")), "team-a-two");

    node.node_publish_volume(pod(&agent, "tags-0", "by-tags", false))
        .await
        .unwrap();
    let t = agent.target("tags-0");
    assert_eq!(files(&t), ["elsewhere/z", "tagged/x"]);
    assert_eq!(read(&t.join("tagged/x")), TEAM_VALUE);

    node.node_publish_volume(pod(&agent, "tags-below-0", "by-tags-below", false))
        .await
        .unwrap();
    assert_eq!(files(&agent.target("tags-below-0")), ["tagged/x"]);

    node.node_publish_volume(pod(&agent, "name-0", "by-name", false))
        .await
        .unwrap();
    assert_eq!(files(&agent.target("name-0")), ["team/a/one", "team/b/one"]);

    // A provider that cannot filter by tags refuses them instead of selecting everything.
    let err = node
        .node_publish_volume(pod(&agent, "fake-tags-0", "fake-tags", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("find.tags"), "{:?}", err.message());
    assert!(
        err.message().contains("provider.aws"),
        "{:?}",
        err.message()
    );

    let err = node
        .node_publish_volume(pod(&agent, "missing-0", "missing", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    for part in ["shop", "missing", "ssm", "/app/nope", "not found"] {
        assert!(err.message().contains(part), "{part}: {:?}", err.message());
    }
    assert_no_leak(err.message(), "the not-found message");

    // One missing name in a batch fails that key only, in one call.
    let before = metric(&agent, GET_PARAMETERS).await;
    let err = node
        .node_publish_volume(pod(&agent, "mixed-0", "mixed", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("/mix/gone"), "{:?}", err.message());
    assert!(!err.message().contains("/mix/b"), "{:?}", err.message());
    assert_eq!(metric(&agent, GET_PARAMETERS).await, before + 1.0);

    let err = node
        .node_publish_volume(pod(&agent, "no-version-0", "no-version", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("version \"9\""),
        "{:?}",
        err.message()
    );

    assert_no_leak(&agent.log_text(), "the agent log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameter_store_signs_with_the_pod_web_identity_and_logs_in_once() {
    let moto = Moto::start().await;
    let ssm = moto.ssm_client();
    for i in 0..3 {
        put(
            &ssm,
            &format!("/web/p{i}"),
            ParameterType::SecureString,
            &format!("web-value-{i}"),
            &[],
        )
        .await;
    }
    // moto does not say which token it was given: the agent talks to it through a proxy that
    // records the requests, so the test sees the web identity token on the wire.
    let wire = TeeProxy::start(moto.endpoint.trim_start_matches("http://").parse().unwrap()).await;
    let mut m = format!(
        "apiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {{name: web-id, namespace: shop}}\n\
         spec:\n  provider:\n    aws:\n      service: ParameterStore\n      region: us-east-1\n      \
         endpoint: http://{}\n      role: {ROLE}\n      auth: {{jwt: {{}}}}\n",
        wire.addr
    );
    for i in 0..3 {
        m += &external_secret(
            &format!("es{i}"),
            "web-id",
            &[entry("value", &format!("/web/p{i}"), "")],
        );
    }
    let agent = Agent::start(&[("shop.yaml", &m)], &[]).await;
    let publishes = (0..3).map(|i| {
        let req = pod(&agent, &format!("web-{i}"), &format!("es{i}"), true);
        let agent = &agent;
        async move { agent.node().await.node_publish_volume(req).await }
    });
    for r in futures::future::join_all(publishes).await {
        r.unwrap();
    }
    for i in 0..3 {
        assert_eq!(
            read(&agent.target(&format!("web-{i}")).join("value")),
            format!("web-value-{i}")
        );
    }
    let sent = wire.sent_text();
    assert_eq!(
        sent.matches("Action=AssumeRoleWithWebIdentity").count(),
        1,
        "one login"
    );
    assert!(
        sent.contains(POD_TOKEN),
        "STS did not receive the pod's token"
    );
    assert!(
        sent.contains("AmazonSSM.GetParameter"),
        "read from Parameter Store"
    );
    assert_no_leak(&agent.log_text(), "the agent log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameter_store_denials_are_permission_denied() {
    // With IAM checks on, moto knows no access key at all: every request is refused.
    let moto = Moto::start_with_env(&[("INITIAL_NO_AUTH_ACTION_COUNT", "0")]).await;
    let m = creds_secret()
        + &store("ssm", "ParameterStore", &moto.endpoint)
        + &external_secret(
            "app",
            "ssm",
            &[entry("a", "/app/a", ""), entry("b", "/app/b", "")],
        );
    let agent = Agent::start(&[("shop.yaml", &m)], &[]).await;
    let err = agent
        .node()
        .await
        .node_publish_volume(pod(&agent, "denied-0", "app", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("/app/"), "{:?}", err.message());
    assert_no_leak(err.message(), "the denial");
    assert_no_leak(&agent.log_text(), "the agent log");
}
