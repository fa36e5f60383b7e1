//! A TLS front for a plain-HTTP test server (the fake API server has no TLS): terminates TLS
//! with a certificate from [`super::pki::Pki`] and relays the bytes to the backend on loopback,
//! so a client sees a real https server whose certificate it must verify.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

/// An https listener on 127.0.0.1; stops accepting when dropped.
pub struct TlsFront {
    /// Where clients connect.
    pub addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl TlsFront {
    /// Serves `cert_pem` (its chain, leaf first) with `key_pem` and relays to `backend`.
    pub async fn start(backend: SocketAddr, cert_pem: &str, key_pem: &str) -> Self {
        latchkey::tls::install_crypto_provider();
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .unwrap();
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A client that refuses the certificate ends the handshake: nothing to relay.
                    let Ok(mut tls) = acceptor.accept(client).await else {
                        return;
                    };
                    if let Ok(mut server) = TcpStream::connect(backend).await {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
                    }
                });
            }
        });
        Self { addr, accept }
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
