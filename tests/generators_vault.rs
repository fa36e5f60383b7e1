//! The `VaultDynamicSecret` and `Password` generators against a real OpenBao dev server: ESO's
//! PKI example (`pki/issue/example-dot-com`, POST, `common_name: localhost`) with a role that
//! leases its certificates, logged in as a pod through jwt auth with the pod's own token and
//! the shared token cache, as the vault store does. Generate, renew and cleanup are checked
//! from Vault's side (`pki/certs/revoked`, `sys/leases/lookup`, token accessors).

mod support;

use std::sync::Arc;
use std::time::Duration;

use latchkey::api::StoreKind;
use latchkey::api::generator::{PasswordSpec, VaultDynamicSecretSpec, VaultResultType};
use latchkey::api::store::{VaultAuth, VaultProvider, VaultRoleAuth};
use latchkey::catalog::ManifestCatalog;
use latchkey::generators::{self, Generated, GeneratorError, GeneratorSpec, Lease};
use latchkey::identity::PodInfo;
use latchkey::identity::tokens::{PodTokens, ServiceAccountToken};
use latchkey::providers::{BuildContext, Env, ProviderError};
use latchkey::secret::SecretString;
use latchkey::telemetry::metrics::ProviderLabel;
use serde_json::{Value, json};
use support::openbao::{JwtIssuer, OpenBao};

const AUDIENCE: &str = "vault";
const ROLE: &str = "gen";
const PKI_PATH: &str = "pki/issue/example-dot-com";
/// What the pods' role may do: issue from one PKI role, make child tokens, and renew and
/// revoke what it made.
const POLICY: &str = r#"
path "pki/issue/example-dot-com" { capabilities = ["create", "update"] }
path "auth/token/create" { capabilities = ["create", "update"] }
path "auth/token/renew-accessor" { capabilities = ["update"] }
path "auth/token/revoke-accessor" { capabilities = ["update"] }
path "sys/leases/renew" { capabilities = ["update"] }
path "sys/leases/revoke" { capabilities = ["update"] }
"#;

/// A dev server with the PKI mount and role, the policy, and jwt auth for the pods.
async fn bao(issuer: &JwtIssuer) -> OpenBao {
    let bao = OpenBao::start().await;
    bao.pki("pki", "example-dot-com", "72h").await;
    // A second role the policy does not cover.
    bao.api(
        "POST",
        "pki/roles/other",
        Some(json!({"allow_localhost": true, "generate_lease": true, "key_type": "ec"})),
    )
    .await;
    bao.policy(ROLE, POLICY).await;
    bao.jwt(issuer, ROLE, AUDIENCE, &[ROLE]).await;
    bao
}

/// Pod `name` of `shop/web`, with its projected token for Vault.
fn pod(issuer: &JwtIssuer, name: &str) -> PodInfo {
    let token = ServiceAccountToken {
        token: SecretString::new(issuer.token("shop", "web", AUDIENCE)),
        expiration: None,
    };
    PodInfo {
        namespace: "shop".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        service_account: "web".into(),
        tokens: PodTokens::from_tokens([(AUDIENCE.to_string(), token)]),
    }
}

fn spec(
    bao: &OpenBao,
    path: &str,
    parameters: Value,
    result_type: VaultResultType,
) -> VaultDynamicSecretSpec {
    VaultDynamicSecretSpec {
        path: path.into(),
        method: Some("POST".into()),
        parameters: Some(serde_json::from_value(parameters).unwrap()),
        result_type: Some(result_type),
        allow_empty_response: false,
        provider: VaultProvider {
            server: bao.url.clone(),
            auth: VaultAuth {
                jwt: Some(VaultRoleAuth {
                    mount_path: None,
                    role: ROLE.into(),
                    audience: Some(AUDIENCE.into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        },
    }
}

fn pki_spec(bao: &OpenBao) -> VaultDynamicSecretSpec {
    spec(
        bao,
        PKI_PATH,
        json!({"common_name": "localhost"}),
        VaultResultType::Data,
    )
}

async fn build(
    env: &Env,
    pod: &PodInfo,
    spec: &VaultDynamicSecretSpec,
) -> Result<Arc<dyn generators::Generator>, GeneratorError> {
    let ctx = BuildContext {
        env,
        pod,
        scope: StoreKind::SecretStore.into(),
        max_age: None,
    };
    generators::build(GeneratorSpec::VaultDynamicSecret(spec), &ctx).await
}

/// Whether the token behind `accessor` is still valid.
async fn token_alive(bao: &OpenBao, accessor: &str) -> bool {
    let (code, _) = bao
        .request(
            "POST",
            "auth/token/lookup-accessor",
            Some(json!({ "accessor": accessor })),
        )
        .await;
    code == 200
}

fn text(generated: &Generated, key: &str) -> String {
    String::from_utf8(generated.values[key].expose().to_vec()).unwrap()
}

fn logins(env: &Env) -> u64 {
    env.metrics
        .logins
        .get_or_create(&ProviderLabel { provider: "vault" })
        .get()
}

/// Fails when any of `secrets` appears in any of `outputs`.
fn assert_no_leak(outputs: &[String], secrets: &[String]) {
    for output in outputs {
        for secret in secrets {
            assert!(
                !output.contains(secret.as_str()),
                "a secret value leaked into: {output}"
            );
        }
    }
}

#[tokio::test]
async fn each_generate_issues_its_own_certificate_and_cleanup_revokes_it() {
    let issuer = JwtIssuer::new();
    let bao = bao(&issuer).await;
    let env = support::vault_push::env();
    let generator = build(&env, &pod(&issuer, "web-0"), &pki_spec(&bao))
        .await
        .unwrap();
    let first = generator.generate().await.unwrap();
    let second = generator.generate().await.unwrap();
    for g in [&first, &second] {
        assert!(text(g, "certificate").starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(text(g, "private_key").contains("PRIVATE KEY"));
        assert!(
            g.values.contains_key("ca_chain"),
            "non-string data, JSON encoded"
        );
    }
    let state = |g: &Generated| g.state.clone().unwrap();
    let (s1, s2) = (state(&first), state(&second));
    assert_ne!(
        s1["serial"], s2["serial"],
        "two generates, two certificates"
    );
    assert_eq!(s1["serial"], json!(text(&first, "serial_number")));
    assert_eq!(s1["path"], json!(PKI_PATH));
    let lease_id = s1["leaseId"].as_str().unwrap().to_string();
    assert!(lease_id.starts_with(PKI_PATH), "{lease_id}");
    let lease = first.lease.unwrap();
    assert!(!lease.renewable);
    assert!(
        (3590..=3600).contains(&lease.ttl.as_secs()),
        "no ttl parameter: the short default (1h) is asked for, not the role's 72h: {lease:?}"
    );
    let state_keys: Vec<&String> = s1.as_object().unwrap().keys().collect();
    assert_eq!(state_keys, ["leaseId", "path", "serial", "ttl"], "{s1}");

    assert!(bao.lease_exists(&lease_id).await);
    generator.cleanup(&s1).await.unwrap();
    assert!(!bao.lease_exists(&lease_id).await, "the lease is gone");
    let serial = s1["serial"].as_str().unwrap().replace('-', ":");
    let revoked: Vec<String> = bao
        .revoked_serials("pki")
        .await
        .iter()
        .map(|s| s.replace('-', ":"))
        .collect();
    assert!(revoked.contains(&serial), "the certificate is revoked");
    generator
        .cleanup(&s1)
        .await
        .expect("cleaning up twice is fine");
    assert!(
        bao.lease_exists(s2["leaseId"].as_str().unwrap()).await,
        "the other certificate is untouched"
    );
    generator.cleanup(&s2).await.unwrap();
}

#[tokio::test]
async fn a_pki_lease_cannot_be_renewed_so_renew_asks_for_a_new_certificate() {
    let issuer = JwtIssuer::new();
    let bao = bao(&issuer).await;
    let env = support::vault_push::env();
    let generator = build(&env, &pod(&issuer, "web-0"), &pki_spec(&bao))
        .await
        .unwrap();
    let made = generator.generate().await.unwrap();
    let state = made.state.unwrap();
    assert_eq!(generator.renew(&state).await.unwrap(), None);
    generator.cleanup(&state).await.unwrap();
    assert_eq!(
        generator.renew(&state).await.unwrap(),
        None,
        "a revoked lease is not renewed either"
    );
}

#[tokio::test]
async fn a_3s_token_is_renewed_and_one_at_its_max_ttl_is_replaced() {
    let issuer = JwtIssuer::new();
    let bao = bao(&issuer).await;
    let env = support::vault_push::env();
    let pod = pod(&issuer, "web-0");
    let renewable = spec(
        &bao,
        "auth/token/create",
        json!({"ttl": "3s", "policies": ["default"]}),
        VaultResultType::Auth,
    );
    let generator = build(&env, &pod, &renewable).await.unwrap();
    let made = generator.generate().await.unwrap();
    let token = text(&made, "client_token");
    let state = made.state.clone().unwrap();
    assert_eq!(
        state,
        json!({"accessor": text(&made, "accessor"), "ttl": 3})
    );
    assert_eq!(
        made.lease,
        Some(Lease {
            ttl: Duration::from_secs(3),
            renewable: true
        })
    );
    let accessor = state["accessor"].as_str().unwrap().to_string();
    // Renewed every second, it outlives its 3 s TTL.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let lease = generator.renew(&state).await.unwrap();
        assert_eq!(
            lease,
            Some(Lease {
                ttl: Duration::from_secs(3),
                renewable: true
            })
        );
    }
    assert!(
        token_alive(&bao, &accessor).await,
        "renewed past its first TTL"
    );

    // Capped at 4 s in all: 2.5 s in, Vault grants less than the 3 s asked (it rounds what
    // is left to whole seconds, so 1.5 s in could still read as 3).
    let capped = spec(
        &bao,
        "auth/token/create",
        json!({"ttl": "3s", "explicit_max_ttl": "4s", "policies": ["default"]}),
        VaultResultType::Auth,
    );
    let capped = build(&env, &pod, &capped).await.unwrap();
    let short = capped.generate().await.unwrap();
    let short_state = short.state.clone().unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        capped.renew(&short_state).await.unwrap(),
        None,
        "at its max TTL: make a new one"
    );

    generator.cleanup(&state).await.unwrap();
    assert!(!token_alive(&bao, &accessor).await, "revoked by accessor");
    generator.cleanup(&state).await.expect("twice is fine");
    assert_eq!(generator.renew(&state).await.unwrap(), None);
    capped.cleanup(&short_state).await.unwrap();
    assert_no_leak(
        &[
            format!("{made:?}"),
            format!("{short:?}"),
            state.to_string(),
            short_state.to_string(),
        ],
        &[token, text(&short, "client_token")],
    );
}

#[tokio::test]
async fn ten_generates_of_one_identity_log_in_once() {
    let issuer = JwtIssuer::new();
    let bao = bao(&issuer).await;
    let env = support::vault_push::env();
    let before = bao.token_accessors().await.len();
    let spec = pki_spec(&bao);
    let mut states = Vec::new();
    // Ten pods of one service account, each its own generator and certificate, as ten mounts.
    for i in 0..10 {
        let generator = build(&env, &pod(&issuer, &format!("web-{i}")), &spec)
            .await
            .unwrap();
        states.push((generator.clone(), generator.generate().await.unwrap()));
    }
    assert_eq!(logins(&env), 1, "one login for the service account");
    assert_eq!(
        bao.token_accessors().await.len(),
        before + 1,
        "Vault issued one login token"
    );
    let mut serials: Vec<String> = states
        .iter()
        .map(|(_, g)| text(g, "serial_number"))
        .collect();
    serials.sort();
    serials.dedup();
    assert_eq!(serials.len(), 10, "ten different certificates");
    for (generator, made) in &states {
        generator
            .cleanup(made.state.as_ref().unwrap())
            .await
            .unwrap();
    }
    let (code, leases) = bao
        .request("LIST", &format!("sys/leases/lookup/{PKI_PATH}"), None)
        .await;
    assert!(
        code == 404 || leases["data"]["keys"].as_array().is_none_or(Vec::is_empty),
        "every lease revoked: {leases}"
    );
}

#[tokio::test]
async fn denied_paths_and_bad_answers_are_clear_errors_without_values() {
    let issuer = JwtIssuer::new();
    let bao = bao(&issuer).await;
    let env = support::vault_push::env();
    let pod = pod(&issuer, "web-0");
    let mut outputs = Vec::new();

    let denied = spec(
        &bao,
        "pki/issue/other",
        json!({"common_name": "localhost"}),
        VaultResultType::Data,
    );
    let err = build(&env, &pod, &denied)
        .await
        .unwrap()
        .generate()
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            GeneratorError::Backend(ProviderError::PermissionDenied(_))
        ),
        "{err:?}"
    );
    assert_eq!(err.kind(), "permission_denied");
    let message = err.to_string();
    assert!(message.contains("POST pki/issue/other"), "{message}");
    assert!(message.contains("permission denied"), "{message}");
    outputs.push(message);
    outputs.push(format!("{err:?}"));

    let missing = spec(&bao, "pki/issue/nope", json!({}), VaultResultType::Data);
    let err = build(&env, &pod, &missing)
        .await
        .unwrap()
        .generate()
        .await
        .unwrap_err();
    outputs.push(err.to_string());

    // A certificate asked for as `Auth`: Vault made (and leased) one, the answer has no auth
    // block. The error says so, and the lease Vault made is revoked at once.
    let wrong_part = spec(
        &bao,
        PKI_PATH,
        json!({"common_name": "localhost"}),
        VaultResultType::Auth,
    );
    let err = build(&env, &pod, &wrong_part)
        .await
        .unwrap()
        .generate()
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("without auth"), "{message}");
    assert!(message.contains(PKI_PATH), "{message}");
    outputs.push(message);
    outputs.push(format!("{err:?}"));
    let (code, leases) = bao
        .request("LIST", &format!("sys/leases/lookup/{PKI_PATH}"), None)
        .await;
    assert!(
        code == 404 || leases["data"]["keys"].as_array().is_none_or(Vec::is_empty),
        "the certificate of a failed generate is not left leased: {leases}"
    );

    // The raw answer, and a real certificate whose values must not appear anywhere above.
    let raw = spec(
        &bao,
        PKI_PATH,
        json!({"common_name": "localhost", "ttl": "10m"}),
        VaultResultType::Raw,
    );
    let generator = build(&env, &pod, &raw).await.unwrap();
    let made = generator.generate().await.unwrap();
    let response: Value = serde_json::from_str(&text(&made, "response")).unwrap();
    assert_eq!(made.values.len(), 1);
    let ttl = made.lease.unwrap().ttl.as_secs();
    assert!((590..=600).contains(&ttl), "its own ttl kept: {ttl}");
    let state = made.state.clone().unwrap();
    assert_eq!(state["leaseId"], response["lease_id"]);
    outputs.push(format!("{made:?}"));
    outputs.push(state.to_string());
    let secrets = vec![
        response["data"]["private_key"]
            .as_str()
            .unwrap()
            .to_string(),
        response["data"]["certificate"]
            .as_str()
            .unwrap()
            .to_string(),
        pod.tokens
            .for_audience(AUDIENCE)
            .unwrap()
            .token
            .expose()
            .to_string(),
    ];
    generator.cleanup(&state).await.unwrap();
    assert_no_leak(&outputs, &secrets);
}

#[tokio::test]
async fn a_password_from_build_has_esos_shape() {
    let env = support::vault_push::env();
    let issuer = JwtIssuer::new();
    let pod = pod(&issuer, "web-0");
    let ctx = BuildContext {
        env: &env,
        pod: &pod,
        scope: StoreKind::SecretStore.into(),
        max_age: None,
    };
    let spec = PasswordSpec {
        length: 32,
        no_upper: true,
        ..Default::default()
    };
    let generator = generators::build(GeneratorSpec::Password(&spec), &ctx)
        .await
        .unwrap();
    let made = generator.generate().await.unwrap();
    let password = text(&made, "password");
    assert_eq!(password.len(), 32);
    assert_eq!(password.chars().filter(char::is_ascii_digit).count(), 8);
    assert!(!password.chars().any(|c| c.is_ascii_uppercase()));
    assert!(made.state.is_none() && made.lease.is_none());
    assert!(!format!("{made:?}").contains(&password));
}

#[tokio::test]
async fn an_endless_answer_from_a_tenants_vault_fails_the_generate_bounded() {
    let hostile = support::hostile::Hostile::start(support::hostile::Answer::Endless).await;
    let mut catalog = ManifestCatalog::default();
    catalog
        .add_documents(
            std::path::Path::new("token.yaml"),
            "apiVersion: v1\nkind: Secret\nmetadata: {name: vault-token, namespace: shop}\n\
             stringData: {token: not-a-real-token}\n",
        )
        .unwrap();
    let env = Env {
        catalog: Arc::new(catalog),
        ..support::vault_push::env()
    };
    let issuer = JwtIssuer::new();
    let pod = pod(&issuer, "web-0");
    let spec = VaultDynamicSecretSpec {
        path: PKI_PATH.into(),
        method: Some("POST".into()),
        provider: VaultProvider {
            server: hostile.url.clone(),
            auth: VaultAuth {
                token_secret_ref: Some(
                    serde_json::from_value(json!({"name": "vault-token", "key": "token"})).unwrap(),
                ),
                ..Default::default()
            },
            ..Default::default()
        },
        ..Default::default()
    };
    let err = build(&env, &pod, &spec)
        .await
        .unwrap()
        .generate()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("larger than"), "{err}");
    assert!(err.contains(PKI_PATH), "{err}");
    assert!(!err.contains("not-a-real-token"), "{err}");
    assert!(
        hostile.sent() < 64 << 20,
        "stopped reading soon after the limit: {} bytes sent",
        hostile.sent()
    );
}

#[tokio::test]
async fn the_providers_namespace_is_where_the_secret_is_made_and_revoked() {
    let issuer = JwtIssuer::new();
    let bao = bao(&issuer).await;
    bao.api("POST", "sys/namespaces/team", None).await;
    bao.pki_in(Some("team"), "pki", "team-only", "72h").await;
    let mut catalog = ManifestCatalog::default();
    catalog
        .add_documents(
            std::path::Path::new("token.yaml"),
            &format!(
                "apiVersion: v1\nkind: Secret\nmetadata: {{name: vault-token, namespace: shop}}\n\
                 stringData: {{token: {}}}\n",
                bao.root_token
            ),
        )
        .unwrap();
    let env = Env {
        catalog: Arc::new(catalog),
        ..support::vault_push::env()
    };
    let pod = pod(&issuer, "web-0");
    let mut spec = spec(
        &bao,
        "pki/issue/team-only",
        json!({"common_name": "localhost"}),
        VaultResultType::Data,
    );
    spec.provider.auth = VaultAuth {
        token_secret_ref: Some(
            serde_json::from_value(json!({"name": "vault-token", "key": "token"})).unwrap(),
        ),
        ..Default::default()
    };
    let root_namespace = build(&env, &pod, &spec).await.unwrap();
    let err = root_namespace.generate().await.unwrap_err().to_string();
    assert!(
        err.contains("pki/issue/team-only"),
        "no such role outside team: {err}"
    );

    spec.provider.namespace = Some("team".into());
    let generator = build(&env, &pod, &spec).await.unwrap();
    let made = generator.generate().await.unwrap();
    let state = made.state.unwrap();
    let lease_id = state["leaseId"].as_str().unwrap();
    let lookup = |ns| {
        bao.request_in(
            ns,
            "PUT",
            "sys/leases/lookup",
            Some(json!({ "lease_id": lease_id })),
        )
    };
    assert_eq!(lookup(Some("team")).await.0, 200, "leased in team");
    generator.cleanup(&state).await.unwrap();
    assert_eq!(lookup(Some("team")).await.0, 400, "revoked in team");
}
