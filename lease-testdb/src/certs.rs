//! Certificates made by the tests: a CA of their own, server certificates for the names a
//! test connects to, client certificates, and a second CA for the negative cases.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate authority made for one test run.
#[derive(Debug)]
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

impl TestCa {
    /// A new CA named `name`.
    ///
    /// # Panics
    ///
    /// If the key cannot be generated or the certificate signed.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("a CA key");
        Self {
            issuer: CertifiedIssuer::self_signed(params, key).expect("a self-signed CA"),
        }
    }

    /// The CA's certificate, PEM: what a client trusts (`sslrootcert`).
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `names` (host names or IP addresses, e.g. `localhost`,
    /// `127.0.0.1`).
    ///
    /// # Panics
    ///
    /// If a name is not a valid DNS name or IP address, or signing fails.
    pub fn server(&self, names: &[&str]) -> Issued {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("server certificate names");
        params
            .distinguished_name
            .push(DnType::CommonName, "lease test server");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(&params)
    }

    /// A client certificate for role `user` (its common name, which `clientcert=verify-full`
    /// compares with the role).
    ///
    /// # Panics
    ///
    /// If signing fails.
    pub fn client(&self, user: &str) -> Issued {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client parameters");
        params.distinguished_name.push(DnType::CommonName, user);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(&params)
    }

    fn sign(&self, params: &CertificateParams) -> Issued {
        let key = KeyPair::generate().expect("a key");
        let cert = params.signed_by(&key, &self.issuer).expect("signing");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// Write `pem` to `dir/name` with mode 0600 (a private key must not be readable by others,
/// or the server and libpq refuse it) and return the path.
///
/// # Panics
///
/// If the file cannot be written.
pub fn write_private(dir: &Path, name: &str, pem: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, pem).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
    path
}
