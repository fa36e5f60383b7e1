//! Vault's AWS IAM auth (`vault.auth.iam`) end to end: the real agent assumes a role with the
//! pod's token at a real `moto_server`, signs `sts:GetCallerIdentity`, and logs in at
//! `auth/aws/login`; the KV value comes from a real OpenBao dev server.
//!
//! OpenBao 2.x no longer ships the `aws` auth method (it is an external plugin binary, not on
//! PyPI), so `auth/aws/login` is answered by a stand-in in front of OpenBao that does what the
//! method does with a login: decodes the `iam_request_*` fields, replays the signed request to
//! its STS endpoint (moto), and admits the caller only when the assumed role is the one bound
//! to the Vault role, with a token OpenBao itself issues. Every other request goes to OpenBao.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use latchkey::csi::client::{PodVolume, volume_id_for};
use serde_json::{Value, json};
use support::Agent;
use support::moto::Moto;
use support::openbao::OpenBao;
use support::tee_proxy::TeeProxy;
use tonic::Code;

const POD_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.vault-iam-pod-token.c2lnbmF0dXJl";
const BOUND_ROLE: &str = "arn:aws:iam::123456789012:role/latchkey-vault-iam";
const OTHER_ROLE: &str = "arn:aws:iam::123456789012:role/not-bound";
const VALUE: &str = "vault-iam-kv-value-e2e-4417";

/// What the stand-in's `auth/aws/login` needs: where STS and OpenBao are, and what it saw.
struct AwsAuth {
    sts: String,
    bao: String,
    root: String,
    logins: AtomicUsize,
    http: reqwest::Client,
}

async fn login(state: &AwsAuth, body: &[u8]) -> (StatusCode, Value) {
    let refuse = |why: String| (StatusCode::BAD_REQUEST, json!({"errors": [why]}));
    let req: Value = serde_json::from_slice(body).unwrap();
    let field = |name: &str| STANDARD.decode(req[name].as_str().unwrap_or("")).unwrap();
    let url = String::from_utf8(field("iam_request_url")).unwrap();
    let headers: std::collections::BTreeMap<String, Vec<String>> =
        serde_json::from_slice(&field("iam_request_headers")).unwrap();
    assert_eq!(req["iam_http_request_method"], "POST");
    assert_eq!(req["role"], "shop");
    assert!(
        headers["Authorization"][0].starts_with("AWS4-HMAC-SHA256 "),
        "{headers:?}"
    );
    // As Vault: the configured STS endpoint, the path of the client's URL, its signed headers.
    let path = url.splitn(4, '/').nth(3).unwrap_or("");
    let mut replay = state
        .http
        .post(format!("{}/{path}", state.sts))
        .body(field("iam_request_body"));
    for (name, values) in &headers {
        if name != "Host" {
            for v in values {
                replay = replay.header(name.as_str(), v.as_str());
            }
        }
    }
    let answer = replay.send().await.unwrap().text().await.unwrap();
    let Some(arn) = answer
        .split_once("<Arn>")
        .and_then(|(_, rest)| rest.split_once("</Arn>"))
        .map(|(arn, _)| arn.to_string())
    else {
        return refuse(format!("STS refused the request: {answer}"));
    };
    // arn:aws:sts::ACCOUNT:assumed-role/NAME/SESSION -> arn:aws:iam::ACCOUNT:role/NAME
    let canonical = arn
        .replace(":sts::", ":iam::")
        .replace(":assumed-role/", ":role/")
        .rsplit_once('/')
        .map(|(r, _)| r.to_string())
        .unwrap_or_default();
    if canonical != BOUND_ROLE {
        return refuse(format!(
            "IAM Principal \"{arn}\" does not belong to the role \"shop\""
        ));
    }
    state.logins.fetch_add(1, Ordering::SeqCst);
    let created: Value = state
        .http
        .post(format!("{}/v1/auth/token/create", state.bao))
        .header("X-Vault-Token", &state.root)
        .body(json!({"policies": ["read"], "ttl": "1h", "renewable": true}).to_string())
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap();
    (StatusCode::OK, created)
}

async fn handle(
    State(state): State<Arc<AwsAuth>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, [(String, String); 1], Vec<u8>) {
    let json_type = ("content-type".to_string(), "application/json".to_string());
    if method == Method::POST && uri.path() == "/v1/auth/aws/login" {
        let (code, v) = login(&state, &body).await;
        return (code, [json_type], v.to_string().into_bytes());
    }
    let mut forward = state.http.request(
        method,
        format!("{}{}", state.bao, uri.path_and_query().unwrap()),
    );
    for (name, value) in &headers {
        if name != "host" {
            forward = forward.header(name, value);
        }
    }
    let answer = forward.body(body).send().await.unwrap();
    let code = StatusCode::from_u16(answer.status().as_u16()).unwrap();
    (code, [json_type], answer.bytes().await.unwrap().to_vec())
}

/// The stand-in, on a loopback port; returns its URL and state.
async fn aws_auth_in_front_of(bao: &OpenBao, sts: &str) -> (String, Arc<AwsAuth>) {
    let state = Arc::new(AwsAuth {
        sts: sts.to_string(),
        bao: bao.url.clone(),
        root: bao.root_token.clone(),
        logins: AtomicUsize::new(0),
        http: reqwest::Client::new(),
    });
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(Arc::clone(&state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, state)
}

fn store(name: &str, server: &str, sts: &str, role: &str) -> String {
    format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {{name: {name}, namespace: shop}}\n\
         spec:\n  provider:\n    vault:\n      server: {server}\n      path: secret\n      auth:\n        \
         iam: {{vaultRole: shop, role: {role:?}, region: us-east-1, endpoint: {sts:?}, jwt: {{}}}}\n\
         ---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {{name: {name}, namespace: shop}}\n\
         spec:\n  secretStoreRef: {{name: {name}}}\n  data:\n  \
         - {{secretKey: password, remoteRef: {{key: app/db, property: password}}}}\n"
    )
}

async fn publish(agent: &Agent, pod: &str, sa: &str, es: &str) -> Result<String, tonic::Status> {
    let target = agent.target(pod);
    let mut volume = PodVolume::new("shop", pod, es);
    volume.service_account = sa.into();
    volume.tokens_json = Some(
        json!({"sts.amazonaws.com": {"token": POD_TOKEN, "expirationTimestamp": "2099-01-01T00:00:00Z"}})
            .to_string(),
    );
    let req = volume.publish_request(&volume_id_for(&target), &target);
    agent.node().await.node_publish_volume(req).await?;
    Ok(std::fs::read_to_string(target.join("password")).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iam_login_signs_get_caller_identity_as_the_pods_role_once_per_service_account() {
    let moto = Moto::start().await;
    let bao = OpenBao::start().await;
    bao.policy(
        "read",
        r#"path "secret/data/app/*" { capabilities = ["read"] }"#,
    )
    .await;
    bao.put_v2("secret", "app/db", json!({"password": VALUE}))
        .await;
    // STS traffic of the agent goes through a recording proxy: the pod's token must be there.
    let wire = TeeProxy::start(moto.endpoint.trim_start_matches("http://").parse().unwrap()).await;
    let sts = format!("http://{}", wire.addr);
    let (server, auth) = aws_auth_in_front_of(&bao, &moto.endpoint).await;
    let m = store("bound", &server, &sts, BOUND_ROLE) + &store("other", &server, &sts, OTHER_ROLE);
    let agent = Agent::start(&[("shop.yaml", &m)], &[]).await;

    for i in 0..3 {
        assert_eq!(
            publish(&agent, &format!("web-{i}"), "web", "bound")
                .await
                .unwrap(),
            VALUE
        );
    }
    assert_eq!(
        auth.logins.load(Ordering::SeqCst),
        1,
        "one login per service account"
    );
    let sent = wire.sent_text();
    assert_eq!(sent.matches("Action=AssumeRoleWithWebIdentity").count(), 1);
    assert!(
        sent.contains(POD_TOKEN),
        "STS did not receive the pod's token"
    );
    assert!(
        !sent.contains("GetCallerIdentity"),
        "the agent signs GetCallerIdentity for Vault, it does not call it"
    );

    // Another service account is another login (its own cache key).
    assert_eq!(
        publish(&agent, "worker-0", "worker", "bound")
            .await
            .unwrap(),
        VALUE
    );
    assert_eq!(auth.logins.load(Ordering::SeqCst), 2);

    // A role the Vault role is not bound to is refused.
    let err = publish(&agent, "other-0", "web", "other")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message()
            .contains("Vault refused the aws login at auth/aws for role \"shop\""),
        "{:?}",
        err.message()
    );
    assert!(
        err.message().contains("does not belong to the role"),
        "{:?}",
        err.message()
    );
    for text in [err.message().to_string(), agent.log_text()] {
        assert!(!text.contains(POD_TOKEN) && !text.contains(VALUE), "{text}");
        assert!(!text.contains("AWS4-HMAC-SHA256"), "{text}");
    }
}
