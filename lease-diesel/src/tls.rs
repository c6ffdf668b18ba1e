//! TLS with rustls (no OpenSSL, no libpq), configured from the connection string the way
//! libpq reads it.
//!
//! tokio-postgres knows `sslmode` `disable`, `prefer` and `require` and none of the other TLS
//! keys, so the TLS keys are taken out of the string here (by [`crate::conninfo::take_keys`],
//! which the engine's own keys share) and the rest is left to tokio-postgres:
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | - |
//! | `prefer` (the default) | if the server offers it | not checked |
//! | `require` | always | not checked; checked as for `verify-ca` when a root certificate is given (`sslrootcert`, or `~/.postgresql/root.crt` exists), as libpq does |
//! | `verify-ca` | always | signed by a CA of `sslrootcert` |
//! | `verify-full` | always | signed by a CA of `sslrootcert` and valid for the host name |
//!
//! `sslrootcert` is a PEM file, or `system` for the platform's trusted roots (which, as in
//! libpq 16, makes `verify-full` the default and refuses weaker modes). Without it,
//! `verify-ca` and `verify-full` read `~/.postgresql/root.crt`. `sslcert` and `sslkey` (PEM,
//! both or neither) give a client certificate for servers that ask for one. `sslmode=allow`
//! (plain first, TLS if refused) is not supported: it is refused with a message.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::PgSetupError;
use crate::conninfo;

/// The connection-string keys this module reads (and removes before tokio-postgres parses
/// the rest).
const KEYS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// The `sslmode`s, with libpq's meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// No TLS.
    Disable,
    /// TLS if the server offers it, its certificate unchecked.
    Prefer,
    /// TLS, the certificate unchecked (unless a root certificate is given).
    Require,
    /// TLS, the certificate signed by a trusted CA.
    VerifyCa,
    /// TLS, the certificate signed by a trusted CA and valid for the host name.
    VerifyFull,
}

impl TlsMode {
    fn parse(value: &str) -> Result<Self, PgSetupError> {
        Ok(match value {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            "allow" => {
                return Err(PgSetupError::InvalidUrl {
                    message: "sslmode=allow is not supported: use sslmode=prefer (TLS when \
                              the server offers it) or sslmode=disable"
                        .to_owned(),
                });
            }
            other => {
                return Err(PgSetupError::InvalidUrl {
                    message: format!(
                        "invalid sslmode {other:?}: use disable, prefer, require, verify-ca or \
                         verify-full"
                    ),
                });
            }
        })
    }

    /// The name the connection string uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

/// Where trusted CA certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Roots {
    /// A PEM file.
    File(PathBuf),
    /// The platform's trusted roots.
    System,
}

/// What a connection checks of the server's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verification {
    /// Nothing: TLS encrypts but does not authenticate the server (`prefer`, `require`).
    None,
    /// The certificate is signed by a trusted CA (`verify-ca`, or `require` with a root
    /// certificate).
    Chain,
    /// The certificate is signed by a trusted CA and names the host (`verify-full`).
    Full,
}

/// The TLS settings of a connection string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsParams {
    mode: Option<TlsMode>,
    roots: Option<Roots>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

/// How connections are made: the mode tokio-postgres is given, and the rustls connector if
/// TLS may be used.
#[derive(Clone)]
pub(crate) struct Tls {
    pub(crate) ssl_mode: SslMode,
    pub(crate) connector: Option<MakeRustlsConnect>,
    /// What the settings ask for, for messages and for `doctor`.
    pub(crate) summary: TlsSummary,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("summary", &self.summary)
            .finish()
    }
}

/// The TLS settings in effect, as a user would state them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSummary {
    /// The `sslmode` in effect (given, or the default).
    pub mode: TlsMode,
    /// What is checked of the server's certificate.
    pub verification: Verification,
    /// Where the trusted roots come from (a path, `system`), if certificates are checked.
    pub roots: Option<String>,
    /// Whether a client certificate is offered.
    pub client_certificate: bool,
}

impl std::fmt::Display for TlsSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sslmode={}", self.mode.as_str())?;
        if let Some(roots) = &self.roots {
            write!(f, ", sslrootcert={roots}")?;
        }
        Ok(())
    }
}

/// Split `url` into the string tokio-postgres parses (the TLS keys removed) and the TLS
/// settings.
pub(crate) fn split(url: &str) -> Result<(String, TlsParams), PgSetupError> {
    let mut params = TlsParams {
        mode: None,
        roots: None,
        cert: None,
        key: None,
    };
    let rest = conninfo::take_keys(url, &KEYS, |key, value| {
        match key {
            "sslmode" => params.mode = Some(TlsMode::parse(&value)?),
            "sslrootcert" if value == "system" => params.roots = Some(Roots::System),
            "sslrootcert" => params.roots = Some(Roots::File(PathBuf::from(value))),
            "sslcert" => params.cert = Some(PathBuf::from(value)),
            "sslkey" => params.key = Some(PathBuf::from(value)),
            _ => unreachable!("only the TLS keys are taken"),
        }
        Ok(())
    })?;
    Ok((rest, params))
}

fn tls_error(message: String) -> PgSetupError {
    PgSetupError::Tls { message }
}

/// libpq's default root certificate file, `~/.postgresql/root.crt`.
fn default_roots() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|home| Path::new(&home).join(".postgresql/root.crt"))
}

impl TlsParams {
    /// The mode in effect, the roots to check against, and what is checked: libpq's
    /// defaults and refusals, before any file is read.
    fn resolve(&self) -> Result<(TlsMode, Option<Roots>, Verification), PgSetupError> {
        let mode = match (self.mode, &self.roots) {
            (Some(mode), Some(Roots::System))
                if !matches!(mode, TlsMode::VerifyFull | TlsMode::Disable) =>
            {
                return Err(tls_error(format!(
                    "sslmode={} may not be used with sslrootcert=system: the system's roots \
                     trust every public CA, so only verify-full (which checks the host name) \
                     authenticates the server",
                    mode.as_str()
                )));
            }
            (Some(mode), _) => mode,
            (None, Some(Roots::System)) => TlsMode::VerifyFull,
            (None, _) => TlsMode::Prefer,
        };
        if self.cert.is_some() != self.key.is_some() {
            return Err(tls_error(
                "sslcert and sslkey go together: give both files, or neither".to_owned(),
            ));
        }
        let roots = match &self.roots {
            Some(roots) => Some(roots.clone()),
            None => match mode {
                TlsMode::VerifyCa | TlsMode::VerifyFull => {
                    let default = default_roots().filter(|p| p.is_file()).ok_or_else(|| {
                        tls_error(format!(
                            "sslmode={} checks the server's certificate, but no CA is given: \
                             set sslrootcert to the CA's PEM file (or to `system` for the \
                             platform's trusted roots), or put it in ~/.postgresql/root.crt",
                            mode.as_str()
                        ))
                    })?;
                    Some(Roots::File(default))
                }
                // libpq checks the chain under `require` when the default root file exists.
                TlsMode::Require => default_roots().filter(|p| p.is_file()).map(Roots::File),
                TlsMode::Disable | TlsMode::Prefer => None,
            },
        };
        let verification = match (mode, &roots) {
            (TlsMode::VerifyFull, _) => Verification::Full,
            (TlsMode::VerifyCa, _) | (TlsMode::Require, Some(_)) => Verification::Chain,
            _ => Verification::None,
        };
        Ok((mode, roots, verification))
    }

    /// The connector these settings ask for; reads the certificate files now, so a missing
    /// or unreadable file is reported when the store is built, not at every connection.
    pub(crate) fn build(&self) -> Result<Tls, PgSetupError> {
        let (mode, roots, verification) = self.resolve()?;
        let summary = TlsSummary {
            mode,
            verification,
            roots: match (&roots, verification) {
                (_, Verification::None) | (None, _) => None,
                (Some(Roots::System), _) => Some("system".to_owned()),
                (Some(Roots::File(p)), _) => Some(p.display().to_string()),
            },
            client_certificate: self.cert.is_some(),
        };
        if mode == TlsMode::Disable {
            return Ok(Tls {
                ssl_mode: SslMode::Disable,
                connector: None,
                summary,
            });
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier: Arc<dyn ServerCertVerifier> = match (verification, &roots) {
            (Verification::None, _) | (_, None) => Arc::new(Unchecked(provider.clone())),
            (checked, Some(roots)) => {
                let store = Arc::new(root_store(roots)?);
                let webpki = WebPkiServerVerifier::builder_with_provider(store, provider.clone())
                    .build()
                    .map_err(|e| tls_error(format!("the trusted roots are unusable: {e}")))?;
                if checked == Verification::Full {
                    webpki
                } else {
                    Arc::new(ChainOnly(webpki))
                }
            }
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error(format!("no TLS protocol version available: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let chain = read_certs(cert, "sslcert")?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    tls_error(format!(
                        "sslkey {}: no usable private key: {e}",
                        key.display()
                    ))
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| tls_error(format!("sslcert/sslkey: {e}")))?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Tls {
            ssl_mode: if mode == TlsMode::Prefer {
                SslMode::Prefer
            } else {
                SslMode::Require
            },
            connector: Some(MakeRustlsConnect::new(config)),
            summary,
        })
    }
}

fn read_certs(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, PgSetupError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| tls_error(format!("{key} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(tls_error(format!(
            "{key} {}: no PEM certificate in the file",
            path.display()
        )));
    }
    Ok(certs)
}

fn root_store(roots: &Roots) -> Result<RootCertStore, PgSetupError> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::File(path) => {
            for cert in read_certs(path, "sslrootcert")? {
                store
                    .add(cert)
                    .map_err(|e| tls_error(format!("sslrootcert {}: {e}", path.display())))?;
            }
        }
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
                return Err(tls_error(format!(
                    "sslrootcert=system: no trusted roots found on this host{}",
                    if errors.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", errors.join("; "))
                    }
                )));
            }
        }
    }
    Ok(store)
}

/// `prefer` and `require` without a root certificate: the server's certificate is not
/// checked (libpq's meaning), but the handshake's signatures still are, so the session is
/// bound to whoever holds the certificate's key.
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the host name is not compared.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // The webpki verifier checks the chain first and the name last: a name mismatch
        // means the chain was good.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// What a failed TLS handshake means, in words, if `e` is one.
pub(crate) fn explain(e: &tokio_postgres::Error, summary: Option<&TlsSummary>) -> Option<String> {
    let settings = summary.map_or_else(String::new, |s| format!(" ({s})"));
    let chain = std::iter::successors(Some(e as &(dyn std::error::Error + 'static)), |e| {
        e.source()
    });
    for err in chain {
        let rustls_error = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .or_else(|| err.downcast_ref::<rustls::Error>());
        if let Some(tls) = rustls_error {
            return Some(describe(tls, &settings));
        }
        if err.to_string().contains("server does not support TLS") {
            return Some(format!(
                "TLS is required{settings} but the server does not accept TLS connections \
                 (its `ssl` setting is off): turn TLS on at the server, or use sslmode=prefer \
                 or disable"
            ));
        }
    }
    None
}

fn describe(e: &rustls::Error, settings: &str) -> String {
    use rustls::AlertDescription as Alert;
    match e {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => format!(
            "the server's TLS certificate is not signed by a trusted CA{settings}: \
             sslrootcert must hold the CA that signed the server's certificate ({e})"
        ),
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "the server's TLS certificate is not valid for the host name connected to{settings}: \
             connect by a name the certificate lists, or reissue it ({e})"
        ),
        rustls::Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => format!("the server's TLS certificate has expired{settings} ({e})"),
        rustls::Error::InvalidCertificate(other) => {
            format!("the server's TLS certificate was refused{settings}: {other:?} ({e})")
        }
        rustls::Error::AlertReceived(Alert::CertificateRequired) => format!(
            "the server requires a client certificate{settings} ({e}): give one with sslcert \
             and sslkey"
        ),
        rustls::Error::AlertReceived(Alert::UnknownCA | Alert::BadCertificate) => format!(
            "the server refused the client certificate{settings} ({e}): it must be signed by a \
             CA in the server's ssl_ca_file"
        ),
        other => format!("the TLS handshake failed{settings}: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(url: &str) -> (String, TlsParams) {
        split(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    #[test]
    fn tls_keys_leave_the_url_and_the_rest_stays() {
        let (rest, p) = params(
            "postgres://u:p@h:5432/db?sslmode=verify-full&application_name=x&sslrootcert=%2Ftmp%2Fca.pem",
        );
        assert_eq!(rest, "postgres://u:p@h:5432/db?application_name=x");
        assert_eq!(p.mode, Some(TlsMode::VerifyFull));
        assert_eq!(p.roots, Some(Roots::File(PathBuf::from("/tmp/ca.pem"))));
        let (rest, p) = params("postgres://h/db?sslmode=require");
        assert_eq!(rest, "postgres://h/db");
        assert_eq!(p.mode, Some(TlsMode::Require));
        let (rest, p) = params(
            "host=h sslmode = 'verify-ca' user=u sslrootcert='/a b/c\\'s.pem' sslcert=/c sslkey=/k",
        );
        assert_eq!(
            rest.split_whitespace().collect::<Vec<_>>(),
            ["host=h", "user=u"]
        );
        assert_eq!(p.mode, Some(TlsMode::VerifyCa));
        assert_eq!(p.roots, Some(Roots::File(PathBuf::from("/a b/c's.pem"))));
        assert_eq!(p.cert, Some(PathBuf::from("/c")));
        assert_eq!(p.key, Some(PathBuf::from("/k")));
        let (rest, p) = params("host=/tmp dbname=x");
        assert_eq!(rest, "host=/tmp dbname=x");
        assert_eq!(p.mode, None);
    }

    #[test]
    fn bad_tls_settings_are_refused_with_their_reason() {
        let refused = |url: &str| -> String {
            match split(url).and_then(|(_, p)| p.build()) {
                Ok(_) => panic!("{url} was accepted"),
                Err(e) => e.to_string(),
            }
        };
        assert!(refused("postgres://h/db?sslmode=allow").contains("not supported"));
        assert!(refused("postgres://h/db?sslmode=strict").contains("invalid sslmode"));
        assert!(
            refused("postgres://h/db?sslmode=require&sslrootcert=system")
                .contains("may not be used with sslrootcert=system")
        );
        assert!(refused("postgres://h/db?sslcert=/c").contains("go together"));
        assert!(
            refused("postgres://h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem")
                .contains("/nonexistent/ca.pem")
        );
        assert!(refused("host=h sslmode='require").contains("no closing quote"));
    }

    #[test]
    fn modes_map_to_what_is_checked() {
        let built = |url: &str| split(url).and_then(|(_, p)| p.build()).expect(url);
        let tls = built("postgres://h/db");
        assert_eq!(tls.summary.mode, TlsMode::Prefer);
        assert_eq!(tls.ssl_mode, SslMode::Prefer);
        assert_eq!(tls.summary.verification, Verification::None);
        let tls = built("postgres://h/db?sslmode=disable");
        assert!(tls.connector.is_none());
        assert_eq!(tls.ssl_mode, SslMode::Disable);
        // Resolved only: whether this host has trusted roots is not the test's business.
        let (_, system) = params("postgres://h/db?sslrootcert=system");
        let (mode, roots, verification) = system.resolve().expect("system roots");
        assert_eq!(mode, TlsMode::VerifyFull);
        assert_eq!(roots, Some(Roots::System));
        assert_eq!(verification, Verification::Full);
        let (_, ca) = params("postgres://h/db?sslmode=require&sslrootcert=/ca.pem");
        assert_eq!(ca.resolve().expect("a CA file").2, Verification::Chain);
    }
}
