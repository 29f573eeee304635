//! The cluster's certificate authority and the TLS settings of every
//! Tessera endpoint.
//!
//! Owns: making the cluster CA and the certificates it signs (for hosts and
//! for clients), reading and writing them as PEM files, and the rustls
//! configurations the API, the NBD frontend and (later) the host transport
//! use; the name a peer's certificate proves; the key that seals the
//! secrets the cluster keeps in its directory ([`SecretsKey`]).
//! Must not touch: sockets or protocols; callers run the handshakes on their
//! own streams.
//! Invariants:
//! - TLS 1.3 only, through rustls with the ring provider: nothing here does
//!   cryptography by hand;
//! - a peer certificate is trusted only when the cluster CA (or the roots a
//!   caller names) signed it;
//! - private keys are written mode 0600, atomically, and never overwritten by
//!   a new key once they exist ([`ClusterCredentials::ensure`] keeps them).

mod files;
mod sealed;

pub use files::{write_private, ClusterCredentials, CLIENT_DIR};
pub use rustls;
pub use sealed::{SecretsKey, SEALED_PREFIX};
pub use tokio_rustls;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How long the cluster CA is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 86_400);
/// How long a host or client certificate is valid (the 825 days browsers
/// accept); [`ClusterCredentials::ensure`] issues a new one when less than
/// [`RENEW_BEFORE`] is left.
pub const CERTIFICATE_VALIDITY: Duration = Duration::from_secs(825 * 86_400);
/// Time left before expiry at which a certificate is issued again.
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 86_400);

/// What went wrong with certificates or TLS settings.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A PEM file holds no usable certificate or key.
    #[error("{what}: {reason}")]
    Pem {
        /// Which file or value.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Making or signing a certificate failed.
    #[error("making a certificate for {name}: {reason}")]
    Issue {
        /// Who it was for.
        name: String,
        /// Why it failed.
        reason: String,
    },
    /// The certificates and key do not form a usable configuration.
    #[error("TLS settings: {0}")]
    Config(String),
}

/// What a certificate may be used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// A server: the API, an NBD frontend.
    Server,
    /// A client: a CLI, an NBD client such as qemu or nbdinfo.
    Client,
    /// Both ends of host-to-host transport.
    ServerAndClient,
}

/// What a new certificate says about its holder.
#[derive(Clone, Debug)]
pub struct CertificateRequest {
    /// The name it proves (its common name): a host or client name.
    pub name: String,
    /// Addresses a server certificate is valid for.
    pub ips: Vec<IpAddr>,
    /// DNS names a server certificate is valid for.
    pub dns_names: Vec<String>,
    /// What it may be used for.
    pub usage: Usage,
}

/// A certificate and its private key, as PEM.
#[derive(Clone)]
pub struct IssuedCertificate {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

impl std::fmt::Debug for IssuedCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCertificate")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<hidden>")
            .finish()
    }
}

/// The cluster's certificate authority: signs the certificates of hosts and
/// clients.
pub struct CertificateAuthority {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl CertificateAuthority {
    /// A new CA named `name` with a new key.
    pub fn generate(name: &str) -> Result<Self, TlsError> {
        let issue = |e: rcgen::Error| TlsError::Issue {
            name: name.to_owned(),
            reason: e.to_string(),
        };
        let key = KeyPair::generate().map_err(issue)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(issue)?;
        params.distinguished_name = distinguished_name(name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, CA_VALIDITY);
        let cert = params.self_signed(&key).map_err(issue)?;
        Ok(Self { cert, key })
    }

    /// The CA kept in `cert_pem` with its key `key_pem`.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, TlsError> {
        let pem = |what: &str, e: rcgen::Error| TlsError::Pem {
            what: what.to_owned(),
            reason: e.to_string(),
        };
        let key = KeyPair::from_pem(key_pem).map_err(|e| pem("CA key", e))?;
        let params =
            CertificateParams::from_ca_cert_pem(cert_pem).map_err(|e| pem("CA certificate", e))?;
        // Signing needs the CA as an rcgen certificate: made again from its
        // own parameters and key, it has the same name and key identifier,
        // which is all a signature refers to.
        let cert = params
            .self_signed(&key)
            .map_err(|e| pem("CA certificate", e))?;
        let ca = Self { cert, key };
        if !ca.cert_pem_matches(cert_pem) {
            return Err(TlsError::Pem {
                what: "CA key".into(),
                reason: "does not belong to the CA certificate".into(),
            });
        }
        Ok(ca)
    }

    fn cert_pem_matches(&self, cert_pem: &str) -> bool {
        let Ok(stored) = CertificateDer::from_pem_slice(cert_pem.as_bytes()) else {
            return false;
        };
        let Ok((_, parsed)) = x509_parser::parse_x509_certificate(&stored) else {
            return false;
        };
        parsed.public_key().raw == self.key.public_key_der().as_slice()
    }

    /// The CA's certificate as PEM (what peers trust).
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// The CA's private key as PEM.
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// A new key and a certificate for it, signed by this CA.
    pub fn issue(&self, request: &CertificateRequest) -> Result<IssuedCertificate, TlsError> {
        let issue = |e: rcgen::Error| TlsError::Issue {
            name: request.name.clone(),
            reason: e.to_string(),
        };
        let key = KeyPair::generate().map_err(issue)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(issue)?;
        params.distinguished_name = distinguished_name(&request.name);
        for dns in &request.dns_names {
            params
                .subject_alt_names
                .push(SanType::DnsName(dns.clone().try_into().map_err(issue)?));
        }
        for ip in &request.ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = match request.usage {
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::ServerAndClient => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, CERTIFICATE_VALIDITY);
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .map_err(issue)?;
        Ok(IssuedCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn distinguished_name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "Tessera");
    name.push(DnType::CommonName, common_name);
    name
}

/// Valid from an hour ago (clocks of hosts differ a little) for `validity`.
fn set_validity(params: &mut CertificateParams, validity: Duration) {
    let now = SystemTime::now();
    let since = now - Duration::from_secs(3600);
    params.not_before = since.into();
    params.not_after = (now + validity).into();
}

/// The certificate chain and private key an endpoint proves itself with.
pub struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// The identity in `cert_pem` (leaf first) with the key `key_pem`.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, TlsError> {
        let chain = certificates(cert_pem.as_bytes(), "certificate")?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| TlsError::Pem {
            what: "private key".into(),
            reason: e.to_string(),
        })?;
        Ok(Self { chain, key })
    }

    /// The identity kept in the files `cert` and `key`.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let cert_pem = read(cert)?;
        let key_pem = read(key)?;
        Self::from_pem(&cert_pem, &key_pem).map_err(|e| in_file(e, cert, key))
    }

    /// The name its certificate proves.
    pub fn name(&self) -> Option<String> {
        self.chain.first().and_then(certificate_name)
    }
}

fn in_file(e: TlsError, cert: &Path, key: &Path) -> TlsError {
    match e {
        TlsError::Pem { what, reason } => {
            let path = if what == "private key" { key } else { cert };
            TlsError::Pem {
                what: format!("{} ({what})", path.display()),
                reason,
            }
        }
        other => other,
    }
}

/// The certificate authorities whose certificates an endpoint trusts.
#[derive(Clone, Debug)]
pub struct TrustedRoots {
    store: Arc<RootCertStore>,
}

impl TrustedRoots {
    /// The CAs in `pem`.
    pub fn from_pem(pem: &str) -> Result<Self, TlsError> {
        let mut store = RootCertStore::empty();
        for cert in certificates(pem.as_bytes(), "CA certificate")? {
            store.add(cert).map_err(|e| TlsError::Pem {
                what: "CA certificate".into(),
                reason: e.to_string(),
            })?;
        }
        Ok(Self {
            store: Arc::new(store),
        })
    }

    /// The CAs in the file `path`.
    pub fn load(path: &Path) -> Result<Self, TlsError> {
        Self::from_pem(&read(path)?).map_err(|e| match e {
            TlsError::Pem { what, reason } => TlsError::Pem {
                what: format!("{} ({what})", path.display()),
                reason,
            },
            other => other,
        })
    }
}

/// Whether a server asks its clients for a certificate.
#[derive(Clone, Debug)]
pub enum ClientCertificates {
    /// It does not ask.
    NotAsked,
    /// It asks; a client may present none, but one it presents must be
    /// signed by these roots.
    Optional(TrustedRoots),
    /// A client must present one signed by these roots.
    Required(TrustedRoots),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server's TLS settings: TLS 1.3, proving `identity`, asking clients for
/// certificates as `clients` says.
pub fn server_config(
    identity: &Identity,
    clients: &ClientCertificates,
) -> Result<Arc<ServerConfig>, TlsError> {
    let config = |e: rustls::Error| TlsError::Config(e.to_string());
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config)?;
    let verifier = |roots: &TrustedRoots, optional: bool| {
        let builder = WebPkiClientVerifier::builder_with_provider(roots.store.clone(), provider());
        let builder = if optional {
            builder.allow_unauthenticated()
        } else {
            builder
        };
        builder.build().map_err(|e| TlsError::Config(e.to_string()))
    };
    let builder = match clients {
        ClientCertificates::NotAsked => builder.with_no_client_auth(),
        ClientCertificates::Optional(roots) => {
            builder.with_client_cert_verifier(verifier(roots, true)?)
        }
        ClientCertificates::Required(roots) => {
            builder.with_client_cert_verifier(verifier(roots, false)?)
        }
    };
    let config = builder
        .with_single_cert(identity.chain.clone(), identity.key.clone_key())
        .map_err(config)?;
    Ok(Arc::new(config))
}

/// A client's TLS settings: TLS 1.3, trusting `roots`, proving `identity`
/// when it has one.
pub fn client_config(
    roots: &TrustedRoots,
    identity: Option<&Identity>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let config = |e: rustls::Error| TlsError::Config(e.to_string());
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config)?
        .with_root_certificates(roots.store.clone());
    let config = match identity {
        Some(identity) => builder
            .with_client_auth_cert(identity.chain.clone(), identity.key.clone_key())
            .map_err(config)?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The name (common name) a certificate proves.
pub fn certificate_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).ok()?;
    let name = parsed
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_owned();
    Some(name)
}

/// The name the peer's certificate proves, once the handshake is done and
/// the peer presented one (verified against the configured roots).
pub fn peer_name(connection: &rustls::CommonState) -> Option<String> {
    connection
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(certificate_name)
}

fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what: what.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what: what.to_owned(),
            reason: "no certificate in it".into(),
        });
    }
    Ok(certs)
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::File {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests;
