//! Test certificates: a CA made with rcgen and the leaf certificates it signs (TLS servers,
//! client certificates).

/// A CA and the certificates it signs, in PEM.
pub struct Pki {
    /// The CA certificate.
    pub ca: String,
    ca_key: rcgen::KeyPair,
    ca_params: rcgen::CertificateParams,
}

impl Pki {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca_cert = params.self_signed(&ca_key).unwrap();
        Self {
            ca: ca_cert.pem(),
            ca_key,
            ca_params: params,
        }
    }

    /// A certificate for `names` and its key (PEM).
    pub fn issue(&self, names: &[&str]) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let params = rcgen::CertificateParams::new(names).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let issuer = rcgen::Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}
