//! Generators end to end through the real `latchkey node` binary, real mounts and a real OpenBao
//! dev server: one credential per volume, never shared; kept while mounted; renewed or replaced
//! when its lease runs out (the old one kept for the grace period); cleaned up when the volume
//! goes, with no lease left behind; clear errors for a missing or foreign generator and a key the
//! result does not have; no generated value in the agent's log or gRPC messages.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use latchkey::csi::client::{PodVolume, unpublish_request, volume_id_for};
use serde_json::{Value, json};
use support::openbao::{JwtIssuer, OpenBao};
use support::{Agent, eventually};
use tonic::Code;

const STORE_VALUE: &str = "store-value-next-to-a-generated-one-5521";

/// Passwords in `shop` and `other`, and the ExternalSecrets of these tests.
const PASSWORDS: &str = r#"
apiVersion: generators.latchkey.dev/v1alpha1
kind: Password
metadata: {name: pw, namespace: shop}
spec: {length: 32, digits: 5, symbols: 0}
---
apiVersion: generators.latchkey.dev/v1alpha1
kind: Password
metadata: {name: theirs, namespace: other}
spec: {}
---
apiVersion: latchkey.dev/v1alpha1
kind: SecretStore
metadata: {name: fake, namespace: shop}
spec:
  provider:
    fake:
      data:
      - {key: app/user, value: store-value-next-to-a-generated-one-5521}
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: pw, namespace: shop}
spec:
  refreshInterval: 1s
  dataFrom:
  - sourceRef: {generatorRef: {apiVersion: generators.latchkey.dev/v1alpha1, kind: Password, name: pw}}
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: pick, namespace: shop}
spec:
  data:
  - secretKey: db-password
    remoteRef: {key: password}
    sourceRef: {generatorRef: {kind: Password, name: pw}}
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: wrong-key, namespace: shop}
spec:
  data:
  - secretKey: x
    remoteRef: {key: username}
    sourceRef: {generatorRef: {kind: Password, name: pw}}
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: mixed, namespace: shop}
spec:
  secretStoreRef: {name: fake}
  refreshInterval: 1s
  data:
  - {secretKey: user, remoteRef: {key: app/user}}
  - secretKey: password
    remoteRef: {key: password}
    sourceRef: {generatorRef: {kind: Password, name: pw}}
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: foreign, namespace: shop}
spec:
  dataFrom:
  - sourceRef: {generatorRef: {kind: Password, name: theirs}}
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: missing, namespace: shop}
spec:
  dataFrom:
  - sourceRef: {generatorRef: {kind: VaultDynamicSecret, name: nowhere}}
"#;

/// A ClusterGenerator that admits `shop` only, and ExternalSecrets naming it in `shop` and `other`.
const CLUSTER_GENERATOR: &str = r#"
apiVersion: generators.latchkey.dev/v1alpha1
kind: ClusterGenerator
metadata: {name: shared-pw}
spec:
  kind: Password
  generator: {passwordSpec: {length: 16, symbols: 0}}
  conditions: [{namespaces: [shop]}]
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: shared, namespace: shop}
spec:
  dataFrom:
  - sourceRef: {generatorRef: {kind: ClusterGenerator, name: shared-pw}}
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: shared, namespace: other}
spec:
  dataFrom:
  - sourceRef: {generatorRef: {kind: ClusterGenerator, name: shared-pw}}
"#;

/// Publishes `external_secret` for pod `pod` (service account `sa`), with `jwt` as its token for
/// the `vault` audience; the target is the pod's.
async fn publish(
    agent: &Agent,
    pod: &str,
    sa: &str,
    external_secret: &str,
    jwt: Option<&str>,
) -> Result<PathBuf, tonic::Status> {
    let target = agent.target(pod);
    let mut volume = PodVolume::new("shop", pod, external_secret);
    volume.service_account = sa.into();
    volume.tokens_json = jwt.map(|t| json!({"vault": {"token": t}}).to_string());
    let req = volume.publish_request(&volume_id_for(&target), &target);
    agent.node().await.node_publish_volume(req).await?;
    Ok(target)
}

async fn unpublish(agent: &Agent, target: &Path) {
    agent
        .node()
        .await
        .node_unpublish_volume(unpublish_request(&volume_id_for(target), target))
        .await
        .unwrap();
}

fn read(target: &Path, file: &str) -> String {
    std::fs::read_to_string(target.join(file))
        .unwrap_or_else(|e| panic!("{}/{file}: {e}", target.display()))
}

/// Fails when any of `secrets` appears in the agent's log or in `messages`.
fn assert_no_leak(agent: &Agent, messages: &[String], secrets: &[String]) {
    let log = agent.log_text();
    for s in secrets {
        let head = &s[..s.len().min(12)];
        assert!(
            !log.contains(s.as_str()),
            "the agent log contains a generated value ({head}...)"
        );
        for m in messages {
            assert!(
                !m.contains(s.as_str()),
                "a gRPC message contains a generated value: {m}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_volume_gets_its_own_password_and_keeps_it_while_mounted() {
    let agent = Agent::start(&[("gen.yaml", PASSWORDS)], &[]).await;
    let a = publish(&agent, "a", "default", "pw", None).await.unwrap();
    let b = publish(&agent, "b", "default", "pw", None).await.unwrap();
    let (pa, pb) = (read(&a, "password"), read(&b, "password"));
    assert_eq!(pa.len(), 32);
    assert_eq!(pa.chars().filter(char::is_ascii_digit).count(), 5);
    assert_ne!(
        pa, pb,
        "two pods of one service account never share a generated value"
    );
    // A republish past the refresh interval keeps the volume's credential.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    publish(&agent, "a", "default", "pw", None).await.unwrap();
    assert_eq!(
        read(&a, "password"),
        pa,
        "a republish keeps the generated value"
    );
    // One entry of the result, next to a store's value.
    let m = publish(&agent, "m", "default", "mixed", None)
        .await
        .unwrap();
    assert_eq!(read(&m, "user"), STORE_VALUE);
    let pm = read(&m, "password");
    assert!(pm.len() == 32 && pm != pa && pm != pb);
    let p = publish(&agent, "p", "default", "pick", None).await.unwrap();
    let pp = read(&p, "db-password");
    assert_eq!(pp.len(), 32);
    for t in [&a, &b, &m, &p] {
        unpublish(&agent, t).await;
        assert!(!t.exists());
    }
    assert_no_leak(&agent, &[], &[pa, pb, pm, pp]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_foreign_generator_and_a_missing_key_are_clear_errors() {
    let agent = Agent::start(&[("gen.yaml", PASSWORDS)], &[]).await;
    let e = publish(&agent, "f", "default", "foreign", None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("namespace \"shop\", ExternalSecret \"foreign\": generator Password \"theirs\" not found"),
        "{}",
        e.message()
    );
    let e = publish(&agent, "n", "default", "missing", None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message()
            .contains("VaultDynamicSecret \"nowhere\" not found"),
        "{}",
        e.message()
    );
    let e = publish(&agent, "w", "default", "wrong-key", None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains(
            "Password \"pw\": the generated result has no key \"username\" (it has: password)"
        ),
        "{}",
        e.message()
    );
    for pod in ["f", "n", "w"] {
        assert!(
            !agent.target(pod).exists(),
            "a failed publish leaves nothing behind"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_generator_serves_only_the_namespaces_its_conditions_admit() {
    let agent = Agent::start(&[("cluster.yaml", CLUSTER_GENERATOR)], &[]).await;
    let t = publish(&agent, "a", "default", "shared", None)
        .await
        .unwrap();
    assert_eq!(read(&t, "password").len(), 16);
    let target = agent.target("b");
    let volume = PodVolume::new("other", "b", "shared");
    let e = agent
        .node()
        .await
        .node_publish_volume(volume.publish_request(&volume_id_for(&target), &target))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(
        e.message().contains(
            "namespace \"other\", ExternalSecret \"shared\": ClusterGenerator \"shared-pw\" \
             does not admit this namespace"
        ),
        "{}",
        e.message()
    );
    assert!(!target.exists(), "a refused publish leaves nothing behind");
}

// ---- Vault / OpenBao ---------------------------------------------------------------------------

const PKI_ROLE: &str = "example-dot-com";

/// A dev server with a PKI engine whose role issues leased certificates for `localhost` (ESO's
/// own example), jwt auth for pods, and a policy to issue, renew and revoke.
async fn pki() -> (OpenBao, JwtIssuer) {
    let bao = OpenBao::start().await;
    bao.pki("pki", PKI_ROLE, "1h").await;
    bao.policy(
        "issue",
        &format!(
            "path \"pki/issue/{PKI_ROLE}\" {{ capabilities = [\"create\", \"update\"] }}\n\
             path \"sys/leases/renew\" {{ capabilities = [\"update\"] }}\n\
             path \"sys/leases/revoke\" {{ capabilities = [\"update\"] }}\n\
             path \"auth/token/create\" {{ capabilities = [\"create\", \"update\"] }}\n\
             path \"auth/token/renew-accessor\" {{ capabilities = [\"update\"] }}\n\
             path \"auth/token/revoke-accessor\" {{ capabilities = [\"update\"] }}\n"
        ),
    )
    .await;
    let issuer = JwtIssuer::new();
    bao.jwt(&issuer, "app", "vault", &["issue"]).await;
    (bao, issuer)
}

fn vault_manifests(bao: &OpenBao, generator: &str, cert_ttl: &str) -> String {
    format!(
        r#"
apiVersion: generators.latchkey.dev/v1alpha1
kind: VaultDynamicSecret
metadata: {{name: cert, namespace: shop}}
spec:
  path: pki/issue/{PKI_ROLE}
  method: POST
  parameters: {{common_name: localhost, ttl: {cert_ttl}}}
  provider:
    server: {url}
    auth: {{jwt: {{role: app, audience: vault}}}}
---
apiVersion: generators.latchkey.dev/v1alpha1
kind: VaultDynamicSecret
metadata: {{name: token, namespace: shop}}
spec:
  path: auth/token/create
  method: POST
  parameters: {{policies: [default], ttl: 3s, explicit_max_ttl: 9s}}
  resultType: Auth
  provider:
    server: {url}
    auth: {{jwt: {{role: app, audience: vault}}}}
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {{name: bad-key, namespace: shop}}
spec:
  data:
  - secretKey: x
    remoteRef: {{key: no-such-key}}
    sourceRef: {{generatorRef: {{kind: VaultDynamicSecret, name: cert}}}}
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {{name: tls, namespace: shop}}
spec:
  dataFrom:
  - sourceRef: {{generatorRef: {{kind: VaultDynamicSecret, name: {generator}}}}}
"#,
        url = bao.url,
    )
}

/// Leases below `prefix` that are still alive.
async fn live_leases(bao: &OpenBao, prefix: &str) -> Vec<String> {
    let (code, listed) = bao
        .request("LIST", &format!("sys/leases/lookup/{prefix}"), None)
        .await;
    // 404: no lease left under the prefix.
    assert!(
        code == 200 || code == 404,
        "listing leases: {code} {listed}"
    );
    listed["data"]["keys"]
        .as_array()
        .map(|keys| {
            keys.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether OpenBao lists `serial` as revoked.
async fn is_revoked(bao: &OpenBao, serial: &str) -> bool {
    let revoked = bao.revoked_serials("pki").await;
    revoked.iter().any(|s| s.eq_ignore_ascii_case(serial))
}

/// Waits until no certificate lease is left and the agent's gauge says so too (it drops just
/// after the revoke, once the state is removed).
async fn no_lease_left(bao: &OpenBao, agent: &Agent, what: &str) {
    eventually(Duration::from_secs(30), what, || async {
        live_leases(bao, &format!("pki/issue/{PKI_ROLE}/"))
            .await
            .is_empty()
            && agent
                .metric("latchkey_generator_leases{kind=\"VaultDynamicSecret\"}")
                .await
                == 0.0
    })
    .await;
}

fn serial_of(target: &Path) -> String {
    read(target, "serial_number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pod_gets_its_own_certificate_and_unpublish_revokes_it() {
    let (bao, issuer) = pki().await;
    let m = vault_manifests(&bao, "cert", "10m");
    let agent = Agent::start(&[("gen.yaml", &m)], &[]).await;
    let jwt = issuer.token("shop", "app", "vault");
    let a = publish(&agent, "a", "app", "tls", Some(&jwt))
        .await
        .unwrap();
    let b = publish(&agent, "b", "app", "tls", Some(&jwt))
        .await
        .unwrap();
    let (sa, sb) = (serial_of(&a), serial_of(&b));
    assert_ne!(sa, sb, "each pod has its own certificate");
    assert!(read(&a, "certificate").starts_with("-----BEGIN CERTIFICATE-----"));
    let key = read(&a, "private_key");
    assert_eq!(
        live_leases(&bao, &format!("pki/issue/{PKI_ROLE}/"))
            .await
            .len(),
        2
    );
    assert_eq!(
        agent
            .metric("latchkey_generator_leases{kind=\"VaultDynamicSecret\"}")
            .await,
        2.0
    );
    unpublish(&agent, &a).await;
    eventually(
        Duration::from_secs(20),
        "the first certificate's lease is revoked",
        || async {
            live_leases(&bao, &format!("pki/issue/{PKI_ROLE}/"))
                .await
                .len()
                == 1
        },
    )
    .await;
    assert!(is_revoked(&bao, &sa).await, "{sa} is revoked");
    assert!(!is_revoked(&bao, &sb).await, "only the unpublished one");
    unpublish(&agent, &b).await;
    no_lease_left(&bao, &agent, "no lease is left").await;
    assert_no_leak(&agent, &[], &[key, jwt]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_failing_after_generate_revokes_what_it_made() {
    let (bao, issuer) = pki().await;
    let m = vault_manifests(&bao, "cert", "10m");
    let agent = Agent::start(&[("gen.yaml", &m)], &[]).await;
    let jwt = issuer.token("shop", "app", "vault");
    let e = publish(&agent, "a", "app", "bad-key", Some(&jwt))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("no key \"no-such-key\""),
        "{}",
        e.message()
    );
    assert!(!agent.target("a").exists(), "nothing is left mounted");
    no_lease_left(&bao, &agent, "the certificate is revoked").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_looping_pods_leave_no_lease() {
    let (bao, issuer) = pki().await;
    let m = vault_manifests(&bao, "cert", "10m");
    let agent = Agent::start(&[("gen.yaml", &m)], &[]).await;
    let jwt = issuer.token("shop", "app", "vault");
    for i in 0..15 {
        let t = publish(&agent, &format!("loop-{i}"), "app", "tls", Some(&jwt))
            .await
            .unwrap();
        unpublish(&agent, &t).await;
    }
    no_lease_left(&bao, &agent, "every lease is revoked").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_certificate_is_replaced_while_mounted_and_the_old_one_revoked_after_the_grace_period()
 {
    // PKI leases cannot be renewed: before 2/3 of the 20 s TTL a new certificate is issued and
    // written, and the old one stays valid for the 1 s grace period, then is revoked (well
    // before it expires: OpenBao does not revoke a certificate at the end of its life).
    let (bao, issuer) = pki().await;
    let m = vault_manifests(&bao, "cert", "20s");
    let agent = Agent::start(&[("gen.yaml", &m)], &["--generator-grace-period", "1s"]).await;
    let jwt = issuer.token("shop", "app", "vault");
    let a = publish(&agent, "a", "app", "tls", Some(&jwt))
        .await
        .unwrap();
    let first = serial_of(&a);
    eventually(
        Duration::from_secs(25),
        "a new certificate is written",
        || async { serial_of(&a) != first },
    )
    .await;
    assert!(
        !is_revoked(&bao, &first).await,
        "the old certificate is kept for the grace period"
    );
    eventually(
        Duration::from_secs(15),
        "the old certificate is revoked",
        || async { is_revoked(&bao, &first).await },
    )
    .await;
    unpublish(&agent, &a).await;
    no_lease_left(&bao, &agent, "no lease is left").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewable_lease_is_renewed_while_mounted_and_replaced_past_its_max_ttl() {
    // A token with a 3 s TTL and a 9 s max TTL: renewed before 2/3 of its TTL, the same token stays
    // in the volume until renewal is capped, then a new one replaces it.
    let (bao, issuer) = pki().await;
    let m = vault_manifests(&bao, "token", "10m");
    let agent = Agent::start(&[("gen.yaml", &m)], &["--generator-grace-period", "1s"]).await;
    let jwt = issuer.token("shop", "app", "vault");
    let a = publish(&agent, "a", "app", "tls", Some(&jwt))
        .await
        .unwrap();
    let first = read(&a, "client_token");
    let accessor = read(&a, "accessor");
    // Past its first TTL, the token is still the one in the volume and still valid: renewed.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        read(&a, "client_token"),
        first,
        "renewed, not replaced, before its max TTL"
    );
    let looked = bao
        .api(
            "POST",
            "auth/token/lookup-accessor",
            Some(json!({"accessor": accessor})),
        )
        .await;
    assert!(
        looked["data"]["ttl"].as_u64().is_some_and(|ttl| ttl > 0),
        "{looked}"
    );
    eventually(
        Duration::from_secs(20),
        "a new token replaces the capped one",
        || async { read(&a, "client_token") != first },
    )
    .await;
    unpublish(&agent, &a).await;
    assert_no_leak(&agent, &[], &[first, jwt]);
}
