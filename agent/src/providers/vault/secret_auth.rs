//! What the `userPass` and `cert` logins share: the keyed digest that tells credential contents
//! apart in the token cache, the client identity of a `cert` login, and its request.

use std::sync::OnceLock;

use ring::hmac;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use zeroize::Zeroizing;

use super::super::ProviderError;
use super::super::credentials::Location;
use crate::secret::SecretString;

/// A per-process key for [`digest`]: a token cache key then never carries a plain hash of a
/// password, which could be guessed offline were the key ever printed.
fn process_key() -> Option<&'static hmac::Key> {
    static KEY: OnceLock<Option<hmac::Key>> = OnceLock::new();
    KEY.get_or_init(|| {
        hmac::Key::generate(hmac::HMAC_SHA256, &ring::rand::SystemRandom::new()).ok()
    })
    .as_ref()
}

/// A keyed digest of credential contents (each part framed by its length), for a cache key: a
/// rotated password or certificate yields another key and so a new login.
pub(super) fn digest(parts: &[&[u8]]) -> Result<String, ProviderError> {
    let key = process_key()
        .ok_or_else(|| ProviderError::Unavailable("no randomness for the login cache".into()))?;
    let mut context = hmac::Context::with_key(key);
    for part in parts {
        context.update(&(part.len() as u64).to_be_bytes());
        context.update(part);
    }
    Ok(context.sign().as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The TLS client identity of a `cert` login: the certificate chain (leaf first) and its key,
/// both PEM. Messages name the Secrets, never their contents.
pub(super) fn identity(
    chain: &SecretString,
    chain_at: &Location,
    key: &SecretString,
    key_at: &Location,
) -> Result<reqwest::Identity, ProviderError> {
    let certs: Result<Vec<_>, _> =
        CertificateDer::pem_slice_iter(chain.expose().as_bytes()).collect();
    if !certs.is_ok_and(|c| !c.is_empty()) {
        return Err(ProviderError::Config(format!(
            "vault.auth.cert.clientCert: credential {chain_at} holds no valid PEM certificate"
        )));
    }
    if PrivateKeyDer::from_pem_slice(key.expose().as_bytes()).is_err() {
        return Err(ProviderError::Config(format!(
            "vault.auth.cert.secretRef: credential {key_at} holds no valid PEM private key"
        )));
    }
    // reqwest reads both from one buffer; wiped once parsed.
    let mut pem = Zeroizing::new(Vec::with_capacity(
        chain.expose().len() + key.expose().len() + 1,
    ));
    pem.extend_from_slice(chain.expose().as_bytes());
    pem.push(b'\n');
    pem.extend_from_slice(key.expose().as_bytes());
    reqwest::Identity::from_pem(&pem).map_err(|_| {
        ProviderError::Config(format!(
            "vault.auth.cert: {chain_at} and {key_at} do not make a client identity"
        ))
    })
}

/// `POST auth/<mount>/login` of the cert method; the TLS client certificate is the credential
/// (no body: Vault picks the certificate role that matches).
pub(super) struct CertLogin {
    /// Auth mount path.
    pub(super) mount: String,
}

impl rustify::Endpoint for CertLogin {
    type Response = ();
    const REQUEST_BODY_TYPE: rustify::enums::RequestType = rustify::enums::RequestType::JSON;
    const RESPONSE_BODY_TYPE: rustify::enums::ResponseType = rustify::enums::ResponseType::JSON;

    fn path(&self) -> String {
        format!("auth/{}/login", self.mount)
    }

    fn method(&self) -> rustify::enums::RequestMethod {
        rustify::enums::RequestMethod::POST
    }

    fn body(&self) -> Result<Option<Vec<u8>>, rustify::errors::ClientError> {
        Ok(Some(b"{}".to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_tell_contents_apart_and_hide_them() {
        let a = digest(&[b"password-one"]).unwrap();
        assert_eq!(
            a,
            digest(&[b"password-one"]).unwrap(),
            "stable in a process"
        );
        assert_ne!(a, digest(&[b"password-two"]).unwrap());
        // Framed: moving a byte between parts changes the digest.
        assert_ne!(
            digest(&[b"ab", b"c"]).unwrap(),
            digest(&[b"a", b"bc"]).unwrap()
        );
        assert!(!a.contains("password"));
    }

    #[test]
    fn a_bad_identity_names_the_secret_never_the_key() {
        let at = |name: &str| Location {
            namespace: "shop".into(),
            name: name.into(),
            key: "k".into(),
            as_caller: true,
        };
        let key = SecretString::new("-----BEGIN PRIVATE KEY-----\nsecret-key-bytes\n".into());
        let err = identity(
            &SecretString::new("nope".into()),
            &at("crt"),
            &key,
            &at("key"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("shop/crt[k]") && !err.contains("secret-key-bytes"),
            "{err}"
        );
    }
}
