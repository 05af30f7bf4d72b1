//! Throwaway certificates for the TLS tests (`tests/tls.rs`, `tests/mtls.rs`): a CA, and
//! certificates it signs.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

/// A fresh CA.
pub fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A PEM certificate for `names` signed by `ca`, and its PEM key.
pub fn cert(ca: &CertifiedIssuer<'static, KeyPair>, names: &[&str]) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let cert = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, ca)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}
