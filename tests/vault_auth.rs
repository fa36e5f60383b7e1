//! Vault's userpass and cert auth end to end: a real OpenBao dev server (with a TLS listener for
//! cert auth), the real `latchkey node` binary in standalone mode, real mounts. One login per
//! credential and service account, never shared between credentials; a wrong password or
//! certificate is PERMISSION_DENIED naming the store and the method; no password, key or token
//! in the agent's log or gRPC messages.

mod support;

use std::path::PathBuf;

use base64::Engine;
use latchkey::csi::client::{PodVolume, volume_id_for};
use serde_json::json;
use support::Agent;
use support::apiserver::{FakeApiServer, Identity};
use support::openbao::{OpenBao, random_hex};
use support::pki::Pki;
use tonic::Code;

const DB_PASSWORD: &str = "db-password-vault-auth-e2e-4410";

const POLICY: &str = r#"path "secret/data/app/*" { capabilities = ["read"] }"#;

/// `bao` with the test value and the `read` policy.
async fn seed(bao: &OpenBao) {
    bao.policy("read", POLICY).await;
    bao.put_v2("secret", "app/db", json!({"password": DB_PASSWORD}))
        .await;
}

/// A SecretStore `name` in `shop` on `server` with `auth` (flow YAML), plus `extra` provider
/// fields, and an ExternalSecret of the same name reading the test value through it.
fn store_and_secret(name: &str, server: &str, extra: &str, auth: &str) -> String {
    format!(
        "---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\n\
         metadata: {{name: {name}, namespace: shop}}\nspec:\n  provider:\n    vault:\n      \
         server: {server}\n{extra}      auth: {auth}\n\
         ---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\n\
         metadata: {{name: {name}, namespace: shop}}\nspec:\n  secretStoreRef: {{name: {name}}}\n  \
         data:\n  - {{secretKey: password, remoteRef: {{key: app/db, property: password}}}}\n"
    )
}

/// A Secret `name` in `shop` with `data` (key, value) as stringData.
fn secret(name: &str, data: &[(&str, &str)]) -> String {
    let mut out = format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: shop}}\nstringData:\n"
    );
    for (k, v) in data {
        out += &format!("  {k}: {v:?}\n");
    }
    out
}

/// Publishes ExternalSecret `es` for pod `pod` of service account `sa`.
async fn publish(agent: &Agent, pod: &str, sa: &str, es: &str) -> Result<PathBuf, tonic::Status> {
    let target = agent.target(pod);
    let mut volume = PodVolume::new("shop", pod, es);
    volume.service_account = sa.into();
    let req = volume.publish_request(&volume_id_for(&target), &target);
    agent.node().await.node_publish_volume(req).await?;
    Ok(target)
}

fn read(target: &std::path::Path) -> String {
    std::fs::read_to_string(target.join("password")).unwrap()
}

async fn logins(agent: &Agent) -> f64 {
    agent
        .metric("latchkey_backend_logins_total{provider=\"vault\"}")
        .await
}

/// Fails when any of `secrets` appears in the agent's log or in `messages`.
fn assert_no_leak(agent: &Agent, messages: &[&str], secrets: &[&str]) {
    let log = agent.log_text();
    for s in secrets {
        assert!(
            !log.contains(s),
            "the agent log contains a secret ({})",
            &s[..8]
        );
        for m in messages {
            assert!(!m.contains(s), "a gRPC message contains a secret: {m}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn userpass_logs_in_once_per_credential_and_a_wrong_password_is_denied_by_name() {
    let bao = OpenBao::start().await;
    seed(&bao).await;
    bao.api(
        "POST",
        "sys/auth/userpass",
        Some(json!({"type": "userpass"})),
    )
    .await;
    let (shop_pw, other_pw, wrong_pw) = (random_hex(16), random_hex(16), random_hex(16));
    for (user, pw) in [("shop", &shop_pw), ("other", &other_pw)] {
        bao.api(
            "POST",
            &format!("auth/userpass/users/{user}"),
            Some(json!({"password": pw, "token_policies": ["read"]})),
        )
        .await;
    }
    let auth = |user: &str, secret: &str| {
        format!("{{userPass: {{username: {user}, secretRef: {{name: {secret}, key: password}}}}}}")
    };
    let m = [
        store_and_secret("up", &bao.url, "", &auth("shop", "shop-pw")),
        store_and_secret("up-other", &bao.url, "", &auth("other", "other-pw")),
        store_and_secret("up-wrong", &bao.url, "", &auth("shop", "wrong-pw")),
        secret("shop-pw", &[("password", &shop_pw)]),
        secret("other-pw", &[("password", &other_pw)]),
        secret("wrong-pw", &[("password", &wrong_pw)]),
    ]
    .concat();
    let agent = Agent::start(&[("vault.yaml", &m)], &[]).await;

    for pod in ["a", "b"] {
        let t = publish(&agent, pod, "default", "up").await.unwrap();
        assert_eq!(read(&t), DB_PASSWORD);
    }
    assert_eq!(logins(&agent).await, 1.0, "one login per credential");
    // Another user's store logs in on its own: two credentials never share a token.
    let t = publish(&agent, "c", "default", "up-other").await.unwrap();
    assert_eq!(read(&t), DB_PASSWORD);
    assert_eq!(logins(&agent).await, 2.0);

    let wrong = publish(&agent, "d", "default", "up-wrong")
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::PermissionDenied, "{}", wrong.message());
    let message = wrong.message();
    assert!(
        message.contains("up-wrong") && message.contains("userpass login at auth/userpass"),
        "names the store and the method: {message}"
    );
    assert_no_leak(
        &agent,
        &[message],
        &[&shop_pw, &other_pw, &wrong_pw, &bao.root_token, DB_PASSWORD],
    );
}

/// `provider.vault.caBundle` for `pem`.
fn ca_bundle(pem: &str) -> String {
    format!(
        "      caBundle: {}\n",
        base64::engine::general_purpose::STANDARD.encode(pem)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cert_auth_logs_in_over_tls_and_a_wrong_certificate_is_refused() {
    latchkey::tls::install_crypto_provider();
    let server_pki = Pki::new("bao server CA");
    let (server_cert, server_key) = server_pki.issue(&["127.0.0.1"]);
    let client_pki = Pki::new("bao client CA");
    let (client_cert, client_key) = client_pki.issue(&["shop-app"]);
    let (rogue_cert, rogue_key) = Pki::new("rogue CA").issue(&["shop-app"]);
    let bao = OpenBao::start_tls(&server_cert, &server_key).await;
    seed(&bao).await;
    bao.api("POST", "sys/auth/cert", Some(json!({"type": "cert"})))
        .await;
    bao.api(
        "POST",
        "auth/cert/certs/shop",
        Some(json!({"certificate": client_pki.ca, "token_policies": ["read"]})),
    )
    .await;
    let tls_url = bao.tls_url.clone().unwrap();
    let auth = |secret: &str| {
        format!(
            "{{cert: {{clientCert: {{name: {secret}, key: tls.crt}}, \
             secretRef: {{name: {secret}, key: tls.key}}}}}}"
        )
    };
    let ca = ca_bundle(&server_pki.ca);
    let m = [
        store_and_secret("cert", &tls_url, &ca, &auth("client")),
        store_and_secret("cert-rogue", &tls_url, &ca, &auth("rogue")),
        store_and_secret("cert-plain", &bao.url, "", &auth("client")),
        secret(
            "client",
            &[("tls.crt", &client_cert), ("tls.key", &client_key)],
        ),
        secret(
            "rogue",
            &[("tls.crt", &rogue_cert), ("tls.key", &rogue_key)],
        ),
    ]
    .concat();
    let agent = Agent::start(&[("vault.yaml", &m)], &[]).await;

    for pod in ["a", "b"] {
        let t = publish(&agent, pod, "default", "cert").await.unwrap();
        assert_eq!(read(&t), DB_PASSWORD);
    }
    assert_eq!(logins(&agent).await, 1.0, "one login per certificate");

    let rogue = publish(&agent, "c", "default", "cert-rogue")
        .await
        .unwrap_err();
    assert_eq!(rogue.code(), Code::PermissionDenied, "{}", rogue.message());
    assert!(
        rogue.message().contains("cert-rogue")
            && rogue.message().contains("cert login at auth/cert"),
        "names the store and the method: {}",
        rogue.message()
    );
    let plain = publish(&agent, "d", "default", "cert-plain")
        .await
        .unwrap_err();
    assert!(
        plain.message().contains("https://"),
        "cert auth needs TLS: {}",
        plain.message()
    );
    let client_key_body = client_key.lines().nth(1).unwrap().to_string();
    let rogue_key_body = rogue_key.lines().nth(1).unwrap().to_string();
    assert_no_leak(
        &agent,
        &[rogue.message(), plain.message()],
        &[
            &client_key_body,
            &rogue_key_body,
            &bao.root_token,
            DB_PASSWORD,
        ],
    );
}

/// A ConfigMap `name` in `shop` with `key` holding `value`.
fn config_map(name: &str, key: &str, value: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: shop}}\n\
         data:\n  {key}: {value:?}\n"
    )
}

/// `provider.vault.caProvider` naming `kind` `name` (key `ca.crt`), with `namespace` if any.
fn ca_provider(kind: &str, name: &str, namespace: Option<&str>) -> String {
    let namespace = namespace
        .map(|n| format!(", namespace: {n}"))
        .unwrap_or_default();
    format!("      caProvider: {{type: {kind}, name: {name}, key: ca.crt{namespace}}}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_provider_from_a_config_map_or_a_secret_verifies_vault_and_a_wrong_ca_is_refused() {
    latchkey::tls::install_crypto_provider();
    let pki = Pki::new("bao server CA");
    let rogue = Pki::new("rogue CA");
    let (server_cert, server_key) = pki.issue(&["127.0.0.1"]);
    let bao = OpenBao::start_tls(&server_cert, &server_key).await;
    seed(&bao).await;
    let token = bao.token(&["read"], "1h").await;
    let tls_url = bao.tls_url.clone().unwrap();
    let auth = "{tokenSecretRef: {name: vault-token, key: token}}";
    let m = [
        store_and_secret(
            "ca-map",
            &tls_url,
            &ca_provider("ConfigMap", "vault-ca", None),
            auth,
        ),
        store_and_secret(
            "ca-secret",
            &tls_url,
            &ca_provider("Secret", "vault-ca", Some("shop")),
            auth,
        ),
        // caBundle and caProvider together: both are trusted (as ESO's Vault provider).
        store_and_secret(
            "ca-both",
            &tls_url,
            &(ca_bundle(&rogue.ca) + &ca_provider("ConfigMap", "vault-ca", None)),
            auth,
        ),
        store_and_secret(
            "ca-wrong",
            &tls_url,
            &ca_provider("ConfigMap", "rogue-ca", None),
            auth,
        ),
        store_and_secret(
            "ca-elsewhere",
            &tls_url,
            &ca_provider("ConfigMap", "vault-ca", Some("kube-system")),
            auth,
        ),
        store_and_secret(
            "ca-missing",
            &tls_url,
            &ca_provider("ConfigMap", "no-such-ca", None),
            auth,
        ),
        config_map("vault-ca", "ca.crt", &pki.ca),
        config_map("rogue-ca", "ca.crt", &rogue.ca),
        secret("vault-ca", &[("ca.crt", &pki.ca)]),
        secret("vault-token", &[("token", &token)]),
    ]
    .concat();
    let agent = Agent::start(&[("vault.yaml", &m)], &[]).await;

    for store in ["ca-map", "ca-secret", "ca-both"] {
        let t = publish(&agent, store, "default", store)
            .await
            .unwrap_or_else(|e| panic!("{store}: {e:?}"));
        assert_eq!(read(&t), DB_PASSWORD, "{store}");
    }
    let mut messages = Vec::new();
    for (store, code, wants) in [
        (
            "ca-wrong",
            Code::Unavailable,
            "TLS certificate is not trusted",
        ),
        (
            "ca-elsewhere",
            Code::PermissionDenied,
            "outside a SecretStore's own namespace",
        ),
        (
            "ca-missing",
            Code::FailedPrecondition,
            "ConfigMap shop/no-such-ca not found",
        ),
    ] {
        let err = publish(&agent, store, "default", store).await.unwrap_err();
        assert_eq!(err.code(), code, "{store}: {}", err.message());
        assert!(
            err.message().contains(wants) && err.message().contains(store),
            "{store}: {:?} lacks {wants:?}",
            err.message()
        );
        messages.push(err.message().to_string());
    }
    let messages: Vec<&str> = messages.iter().map(String::as_str).collect();
    assert_no_leak(&agent, &messages, &[&token, &bao.root_token, DB_PASSWORD]);
}

const AGENT_TOKEN: &str = "agent-token-vault-auth-e2e";
const WEB_TOKEN: &str = "eyJ.web-pod-token-vault-auth.sig";
const INTRUDER_TOKEN: &str = "eyJ.intruder-pod-token-vault-auth.sig";

/// Publishes `es` of `shop` for pod `pod` of service account `sa`, with `token` as its token
/// for the API server's audience.
async fn publish_as(
    agent: &Agent,
    pod: &str,
    sa: &str,
    token: &str,
    es: &str,
) -> Result<PathBuf, tonic::Status> {
    let target = agent.target(pod);
    let mut volume = PodVolume::new("shop", pod, es);
    volume.service_account = sa.into();
    volume.tokens_json = Some(json!({"": {"token": token}}).to_string());
    let req = volume.publish_request(&volume_id_for(&target), &target);
    agent.node().await.node_publish_volume(req).await?;
    Ok(target)
}

/// In a cluster: a SecretStore's password and CA ConfigMap are read as the pod (a service
/// account without `get` on ConfigMaps is refused), a ClusterSecretStore's CA ConfigMap as the
/// agent, from its own namespace (the Role of daemonset/base/rbac.yaml).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_credentials_and_ca_bundles_are_read_as_the_pod_or_the_agent() {
    latchkey::tls::install_crypto_provider();
    let pki = Pki::new("bao server CA");
    let (server_cert, server_key) = pki.issue(&["127.0.0.1"]);
    let bao = OpenBao::start_tls(&server_cert, &server_key).await;
    seed(&bao).await;
    bao.api(
        "POST",
        "sys/auth/userpass",
        Some(json!({"type": "userpass"})),
    )
    .await;
    let password = random_hex(16);
    bao.api(
        "POST",
        "auth/userpass/users/shop",
        Some(json!({"password": password, "token_policies": ["read"]})),
    )
    .await;
    let tls_url = bao.tls_url.clone().unwrap();

    let api = FakeApiServer::start().await;
    api.add_identity(AGENT_TOKEN, Identity::Agent);
    api.allow_defaults();
    let (web, intruder) = (
        Identity::service_account("shop", "web"),
        Identity::service_account("shop", "intruder"),
    );
    api.add_identity(WEB_TOKEN, web.clone());
    api.add_identity(INTRUDER_TOKEN, intruder);
    api.allow(web, "get", "", "configmaps", Some("shop"));
    for ns in ["shop", "latchkey"] {
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
        api.apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "vault-ca", "namespace": ns}, "data": {"ca.crt": pki.ca}}));
        api.apply(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "vault-userpass", "namespace": ns},
            "stringData": {"password": password}}));
    }
    let vault = json!({
        "server": tls_url,
        "caProvider": {"type": "ConfigMap", "name": "vault-ca", "key": "ca.crt"},
        "auth": {"userPass": {"username": "shop",
            "secretRef": {"name": "vault-userpass", "key": "password"}}},
    });
    api.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "SecretStore",
        "metadata": {"name": "vault", "namespace": "shop"},
        "spec": {"provider": {"vault": vault}}}),
    );
    api.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ClusterSecretStore",
        "metadata": {"name": "vault-cluster"},
        "spec": {"provider": {"vault": vault}}}),
    );
    // Each ExternalSecret reads its own key: the shared value cache would answer a repeated one.
    for key in ["rotated", "ca-edited"] {
        bao.put_v2(
            "secret",
            &format!("app/{key}"),
            json!({"password": DB_PASSWORD}),
        )
        .await;
    }
    for (name, kind, store, key) in [
        ("ns", "SecretStore", "vault", "app/db"),
        ("cluster", "ClusterSecretStore", "vault-cluster", "app/db"),
        ("rotated", "SecretStore", "vault", "app/rotated"),
        ("ca-edited", "SecretStore", "vault", "app/ca-edited"),
    ] {
        api.apply(
            json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"secretStoreRef": {"name": store, "kind": kind},
                "data": [{"secretKey": "password",
                    "remoteRef": {"key": key, "property": "password"}}]}}),
        );
    }
    let agent = Agent::start_in_cluster(&api.kubeconfig_yaml(AGENT_TOKEN), &[]).await;
    support::eventually(
        std::time::Duration::from_secs(20),
        "catalog synced",
        || async { agent.http_get("/readyz").await.0 == 200 },
    )
    .await;

    for (pod, es) in [("web-0", "ns"), ("web-1", "cluster")] {
        let t = publish_as(&agent, pod, "web", WEB_TOKEN, es)
            .await
            .unwrap_or_else(|e| panic!("{es}: {e:?}"));
        assert_eq!(read(&t), DB_PASSWORD, "{es}");
    }
    let reads = |path: &str| -> Vec<Option<Identity>> {
        api.requests()
            .into_iter()
            .filter(|r| r.path == path)
            .map(|r| r.identity)
            .collect()
    };
    for path in [
        "/api/v1/namespaces/shop/configmaps/vault-ca",
        "/api/v1/namespaces/shop/secrets/vault-userpass",
    ] {
        let by = reads(path);
        assert!(!by.is_empty(), "{path} was never read");
        assert!(
            by.iter()
                .all(|i| *i == Some(Identity::service_account("shop", "web"))),
            "{path} read by {by:?}"
        );
    }
    let by = reads("/api/v1/namespaces/latchkey/configmaps/vault-ca");
    assert!(
        !by.is_empty() && by.iter().all(|i| *i == Some(Identity::Agent)),
        "the cluster store's CA is the agent's read: {by:?}"
    );

    // A service account that may read the password but not the CA ConfigMap.
    let denied = publish_as(&agent, "intruder-0", "intruder", INTRUDER_TOKEN, "ns")
        .await
        .unwrap_err();
    assert_eq!(
        denied.code(),
        Code::PermissionDenied,
        "{}",
        denied.message()
    );

    // A rotated password logs in anew at the next publish (the old token would still work).
    let before = logins(&agent).await;
    let rotated = random_hex(16);
    bao.api(
        "POST",
        "auth/userpass/users/shop/password",
        Some(json!({"password": rotated})),
    )
    .await;
    api.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "vault-userpass", "namespace": "shop"},
        "stringData": {"password": rotated}}));
    let t = publish_as(&agent, "web-2", "web", WEB_TOKEN, "rotated")
        .await
        .unwrap();
    assert_eq!(read(&t), DB_PASSWORD);
    assert_eq!(
        logins(&agent).await,
        before + 1.0,
        "a new login for the new password"
    );

    // An edited CA ConfigMap counts at the next publish, cached login or not.
    let rogue = Pki::new("rogue CA");
    api.apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "vault-ca", "namespace": "shop"}, "data": {"ca.crt": rogue.ca}}));
    let untrusted = publish_as(&agent, "web-3", "web", WEB_TOKEN, "ca-edited")
        .await
        .unwrap_err();
    assert!(
        untrusted
            .message()
            .contains("TLS certificate is not trusted"),
        "{}",
        untrusted.message()
    );
    assert_no_leak(
        &agent,
        &[denied.message(), untrusted.message()],
        &[&password, &rotated, &bao.root_token, DB_PASSWORD],
    );
}
