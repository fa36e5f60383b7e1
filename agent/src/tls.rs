//! The process-wide TLS crypto provider. The Kubernetes client and the AWS SDK both use rustls
//! but enable different backends (ring, aws-lc-rs); with both compiled in, rustls cannot pick a
//! default and panics at the first TLS client. Latchkey chooses ring, once, at start.

/// Installs ring as rustls' default provider; harmless when one is already installed.
pub fn install_crypto_provider() {
    // Err means a provider is already installed (a second call, or a test harness): keep it.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    #[test]
    fn installing_twice_is_harmless() {
        super::install_crypto_provider();
        super::install_crypto_provider();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    }
}
