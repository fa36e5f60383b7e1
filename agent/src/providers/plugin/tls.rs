//! `plugin.tls`: the CA bundle the plugin's certificate must chain to (the only roots trusted;
//! inline, or a Secret or ConfigMap key with `caProvider`) and, for mutual TLS, a client certificate and key from a `kubernetes.io/tls` Secret, read with
//! the rules of every credential Secret (see [`credentials`](super::super::credentials)): a
//! SecretStore's from its own namespace as the pod, a ClusterSecretStore's from the agent's
//! namespace as the agent.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use ring::digest;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::AsyncReadExt;
use tokio_rustls::TlsConnector;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use super::super::{BuildContext, ProviderError, credentials};
use super::CONNECT_TIMEOUT;
use crate::api::store::{PluginTls, SecretKeySelector};
use crate::secret::SecretString;

/// Keys of a `kubernetes.io/tls` Secret.
const CERT_KEY: &str = "tls.crt";
const KEY_KEY: &str = "tls.key";

/// What a TLS channel is made with; [`Material::fingerprint`] tells channels apart.
pub(crate) struct Material {
    ca_pem: Vec<u8>,
    /// Client certificate chain and private key (PEM), for mutual TLS.
    client: Option<(String, SecretString)>,
    fingerprint: String,
}

impl Material {
    /// Reads and checks the CA bundle and the client certificate Secret of `tls`; `at` names the
    /// plugin in messages. Messages name the Secret and key, never the value.
    pub(crate) async fn load(
        at: &str,
        tls: &PluginTls,
        ctx: &BuildContext<'_>,
    ) -> Result<Self, ProviderError> {
        let ca_pem = match (&tls.ca_bundle, &tls.ca_provider) {
            (Some(text), _) => ca_bundle(at, "plugin.tls.caBundle", text)?,
            (None, Some(ca)) => {
                const FIELD: &str = "plugin.tls.caProvider";
                let pem = super::super::ca_provider::read(ctx, FIELD, ca).await?;
                let text = String::from_utf8(pem).map_err(|_| {
                    ProviderError::Config(format!("plugin {at}: {FIELD} holds no PEM text"))
                })?;
                ca_bundle(at, FIELD, &text)?
            }
            (None, None) => {
                return Err(ProviderError::Config(format!(
                    "plugin {at}: plugin.tls needs caBundle or caProvider"
                )));
            }
        };
        let client = match &tls.client_cert_secret_ref {
            None => None,
            Some(r) => {
                let selector = |key: &str| SecretKeySelector {
                    name: r.name.clone(),
                    key: key.to_owned(),
                    namespace: r.namespace.clone(),
                };
                let cert = credentials::read(ctx, &selector(CERT_KEY)).await?;
                let key = credentials::read(ctx, &selector(KEY_KEY)).await?;
                let where_ = format!("credential Secret {}", r.name);
                check_client(at, &where_, cert.expose(), &key)?;
                Some((cert.expose().to_owned(), key))
            }
        };
        let mut hash = digest::Context::new(&digest::SHA256);
        hash.update(&ca_pem);
        if let Some((cert, key)) = &client {
            hash.update(b"\0");
            hash.update(cert.as_bytes());
            hash.update(b"\0");
            hash.update(key.expose().as_bytes());
        }
        // A digest of the material, never the material, keys the channel map.
        let fingerprint = hash.finish().as_ref()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(Self {
            ca_pem,
            client,
            fingerprint,
        })
    }

    /// Tells apart channels to one endpoint made with different roots or client certificates.
    pub(crate) fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// tonic's TLS settings for a plugin at `host`: only the bundle's roots, the client
    /// identity if any, and a bounded handshake.
    pub(crate) fn client_config(&self, host: &str) -> ClientTlsConfig {
        // A bracketed IPv6 address is the URI's form; the certificate names the address.
        let domain = host.trim_start_matches('[').trim_end_matches(']');
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .domain_name(domain)
            .timeout(CONNECT_TIMEOUT);
        if let Some((cert, key)) = &self.client {
            config = config.identity(Identity::from_pem(cert, key.expose()));
        }
        config
    }
}

impl Material {
    /// rustls' client settings equal to those tonic builds from [`Self::client_config`], for
    /// [`Self::probe`]; `None` when the material does not make one (checked at load already).
    fn rustls_config(&self) -> Option<Arc<rustls::ClientConfig>> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&self.ca_pem) {
            roots.add(cert.ok()?).ok()?;
        }
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .ok()?
            .with_root_certificates(roots);
        let mut config = match &self.client {
            Some((cert, key)) => {
                let chain: Vec<_> = CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<_, _>>()
                    .ok()?;
                let key = PrivateKeyDer::from_pem_slice(key.expose().as_bytes()).ok()?;
                builder.with_client_auth_cert(chain, key).ok()?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Some(Arc::new(config))
    }

    /// After a failed call: one TLS connection to `host:port` to tell why, as rustls words it
    /// (`invalid peer certificate: ...`, `received fatal alert: ...`); `None` when the handshake
    /// and the server's first bytes are fine, or the endpoint cannot be reached at all. In TLS
    /// 1.3 the server judges the client certificate after the client has finished, so its
    /// refusal is the first thing it sends: read for it briefly.
    pub(crate) async fn probe(&self, host: &str, port: u16) -> Option<String> {
        let config = self.rustls_config()?;
        let domain = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(domain.to_owned()).ok()?;
        let tcp = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect((domain, port)),
        )
        .await
        .ok()?
        .ok()?;
        let connect = TlsConnector::from(config).connect(name, tcp);
        let mut stream = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Err(_) => return None,
            Ok(Err(e)) => return Some(e.to_string()),
            Ok(Ok(stream)) => stream,
        };
        let mut first = [0u8; 64];
        match tokio::time::timeout(PROBE_READ, stream.read(&mut first)).await {
            Ok(Err(e)) => Some(e.to_string()),
            _ => None,
        }
    }
}

/// How long [`Material::probe`] waits for the server's verdict on the client certificate.
const PROBE_READ: Duration = Duration::from_secs(1);

/// The PEM of `text` (from `field`): PEM as it is, or base64 of PEM (as `vault.caBundle`),
/// holding at least one certificate and nothing unparsable.
fn ca_bundle(at: &str, field: &str, text: &str) -> Result<Vec<u8>, ProviderError> {
    let text = text.trim();
    let pem = if text.starts_with("-----BEGIN") {
        text.as_bytes().to_vec()
    } else {
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|_| {
                ProviderError::Config(format!(
                    "plugin {at}: {field} is neither PEM nor base64 of PEM"
                ))
            })?
    };
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem).collect();
    match certs {
        Ok(certs) if !certs.is_empty() => Ok(pem),
        _ => Err(ProviderError::Config(format!(
            "plugin {at}: {field} holds no valid PEM certificate"
        ))),
    }
}

/// Checks that `cert` holds a PEM certificate chain and `key` a PEM private key; the messages
/// never quote either.
fn check_client(
    at: &str,
    secret: &str,
    cert: &str,
    key: &SecretString,
) -> Result<(), ProviderError> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(cert.as_bytes()).collect();
    if !certs.is_ok_and(|c| !c.is_empty()) {
        return Err(ProviderError::Config(format!(
            "plugin {at}: {secret}[{CERT_KEY}] holds no valid PEM certificate"
        )));
    }
    if PrivateKeyDer::from_pem_slice(key.expose().as_bytes()).is_err() {
        return Err(ProviderError::Config(format!(
            "plugin {at}: {secret}[{KEY_KEY}] holds no valid PEM private key"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_bundles_must_hold_certificates() {
        for bad in ["not pem", "-----BEGIN CERTIFICATE-----\nAAAA\n", "aGVsbG8="] {
            let err = ca_bundle("h:1", "plugin.tls.caBundle", bad)
                .unwrap_err()
                .to_string();
            assert!(err.contains("plugin.tls.caBundle"), "{err}");
        }
        let key = SecretString::new("-----BEGIN PRIVATE KEY-----\nsecret-key-bytes\n".into());
        let err = check_client("h:1", "credential Secret c", "x", &key)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("[tls.crt]") && !err.contains("secret-key-bytes"),
            "{err}"
        );
    }
}
