//! The cluster's TLS files in one directory, named as GnuTLS tools
//! (nbdkit, qemu, nbdinfo's `tls-certificates=DIR`) expect them:
//!
//! - `ca-cert.pem`, `ca-key.pem`: the cluster CA;
//! - `server-cert.pem`, `server-key.pem`: what the hosts prove: their API
//!   and NBD frontends, and both ends of host-to-host connections;
//! - `client/ca-cert.pem`, `client/client-cert.pem`,
//!   `client/client-key.pem`: a client certificate for local tools, a
//!   directory that can be handed to nbdinfo or qemu as it is;
//! - `secrets.key`: the key that seals secrets kept in the directory (CHAP
//!   secrets), hex.
//!
//! Keys are mode 0600, written to a temporary file and renamed, so a crash
//! leaves the old file or the new one, never half of one.

use crate::{
    certificate_name, read, CertificateAuthority, CertificateRequest, Identity, TlsError,
    TrustedRoots, Usage, RENEW_BEFORE,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The client directory under the cluster's TLS directory.
pub const CLIENT_DIR: &str = "client";

/// The cluster's TLS files in one directory.
#[derive(Clone, Debug)]
pub struct ClusterCredentials {
    dir: PathBuf,
}

impl ClusterCredentials {
    /// Makes what is missing in `dir`: the CA named `cluster` on first use,
    /// then a host certificate valid for `server_ips` and `localhost` (server and
    /// client: both ends of host-to-host connections), and
    /// a client certificate named `client_name`. Certificates close to
    /// expiry, or a server certificate that does not cover `server_ips`,
    /// are issued again; the CA and existing keys of the CA are kept.
    pub fn ensure(
        dir: &Path,
        cluster: &str,
        server_ips: &[IpAddr],
        client_name: &str,
    ) -> Result<Self, TlsError> {
        let creds = Self {
            dir: dir.to_owned(),
        };
        create_dir(dir)?;
        create_dir(&creds.client_dir())?;
        let ca = if creds.ca_cert().exists() || creds.ca_key().exists() {
            CertificateAuthority::from_pem(&read(&creds.ca_cert())?, &read(&creds.ca_key())?)?
        } else {
            let ca = CertificateAuthority::generate(&format!("{cluster} cluster CA"))?;
            write_private(&creds.ca_key(), ca.key_pem().as_bytes())?;
            write_public(&creds.ca_cert(), ca.cert_pem().as_bytes())?;
            ca
        };
        if !creds.secrets_key().exists() {
            let (_, bytes) = crate::SecretsKey::generate()?;
            write_private(
                &creds.secrets_key(),
                crate::sealed::encode_hex(&bytes).as_bytes(),
            )?;
        }
        let ca_pem = read(&creds.ca_cert())?;
        if read(&creds.client_ca_cert()).ok().as_deref() != Some(ca_pem.as_str()) {
            write_public(&creds.client_ca_cert(), ca_pem.as_bytes())?;
        }
        // The hosts' certificate is both ends of host-to-host connections.
        let server = CertificateRequest {
            name: format!("{cluster} hosts"),
            ips: server_ips.to_vec(),
            dns_names: vec!["localhost".into()],
            usage: Usage::ServerAndClient,
        };
        if !current(&creds.server_cert(), Some(server_ips)) {
            let issued = ca.issue(&server)?;
            write_private(&creds.server_key(), issued.key_pem.as_bytes())?;
            write_public(&creds.server_cert(), issued.cert_pem.as_bytes())?;
        }
        let client = CertificateRequest {
            name: client_name.to_owned(),
            ips: Vec::new(),
            dns_names: Vec::new(),
            usage: Usage::Client,
        };
        let client_current = current(&creds.client_cert(), None)
            && read(&creds.client_cert())
                .ok()
                .and_then(|pem| first_name(&pem))
                .as_deref()
                == Some(client_name);
        if !client_current {
            let issued = ca.issue(&client)?;
            write_private(&creds.client_key(), issued.key_pem.as_bytes())?;
            write_public(&creds.client_cert(), issued.cert_pem.as_bytes())?;
        }
        Ok(creds)
    }

    /// The credentials already in `dir` (see [`Self::ensure`] to make them).
    pub fn open(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA certificate: what clients trust.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca-cert.pem")
    }

    /// The CA key.
    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca-key.pem")
    }

    /// The key that seals secrets kept in the directory.
    pub fn secrets_key(&self) -> PathBuf {
        self.dir.join("secrets.key")
    }

    /// The hosts' server certificate.
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server-cert.pem")
    }

    /// The hosts' server key.
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server-key.pem")
    }

    /// The client directory (for `nbdinfo 'nbds://...?tls-certificates=DIR'`
    /// or qemu's `tls-creds-x509,dir=DIR`).
    pub fn client_dir(&self) -> PathBuf {
        self.dir.join(CLIENT_DIR)
    }

    /// The CA certificate beside the client's.
    pub fn client_ca_cert(&self) -> PathBuf {
        self.client_dir().join("ca-cert.pem")
    }

    /// The client certificate.
    pub fn client_cert(&self) -> PathBuf {
        self.client_dir().join("client-cert.pem")
    }

    /// The client key.
    pub fn client_key(&self) -> PathBuf {
        self.client_dir().join("client-key.pem")
    }

    /// The CA, as roots to trust.
    pub fn roots(&self) -> Result<TrustedRoots, TlsError> {
        TrustedRoots::load(&self.ca_cert())
    }

    /// What the hosts' servers prove.
    pub fn server_identity(&self) -> Result<Identity, TlsError> {
        Identity::load(&self.server_cert(), &self.server_key())
    }

    /// What the local client proves.
    pub fn client_identity(&self) -> Result<Identity, TlsError> {
        Identity::load(&self.client_cert(), &self.client_key())
    }
}

fn first_name(pem: &str) -> Option<String> {
    let cert = CertificateDer::from_pem_slice(pem.as_bytes()).ok()?;
    certificate_name(&cert)
}

/// Whether the certificate in `path` exists, is valid for longer than
/// [`RENEW_BEFORE`], and (for a server) covers every address of `ips`.
fn current(path: &Path, ips: Option<&[IpAddr]>) -> bool {
    let Ok(pem) = std::fs::read_to_string(path) else {
        return false;
    };
    let Ok(der) = CertificateDer::from_pem_slice(pem.as_bytes()) else {
        return false;
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(&der) else {
        return false;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    if cert.validity().not_after.timestamp() - now < RENEW_BEFORE.as_secs() as i64 {
        return false;
    }
    let Some(ips) = ips else {
        return true;
    };
    // A host certificate made before hosts spoke TLS to each other allows
    // server authentication only.
    let both_ends = cert
        .extended_key_usage()
        .ok()
        .flatten()
        .is_some_and(|eku| eku.value.server_auth && eku.value.client_auth);
    if !both_ends {
        return false;
    }
    let covered: Vec<IpAddr> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    x509_parser::extensions::GeneralName::IPAddress(bytes) => match bytes.len() {
                        4 => <[u8; 4]>::try_from(*bytes).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(*bytes).ok().map(IpAddr::from),
                        _ => None,
                    },
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    ips.iter().all(|ip| covered.contains(ip))
}

fn create_dir(dir: &Path) -> Result<(), TlsError> {
    std::fs::create_dir_all(dir).map_err(|source| TlsError::File {
        path: dir.to_owned(),
        source,
    })?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|source| {
        TlsError::File {
            path: dir.to_owned(),
            source,
        }
    })
}

/// Writes `contents` to `path` with mode 0600: into a new temporary file
/// beside it, synced, then renamed over it.
pub fn write_private(path: &Path, contents: &[u8]) -> Result<(), TlsError> {
    write_atomically(path, contents, 0o600)
}

fn write_public(path: &Path, contents: &[u8]) -> Result<(), TlsError> {
    write_atomically(path, contents, 0o644)
}

fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> Result<(), TlsError> {
    let failed = |source| TlsError::File {
        path: path.to_owned(),
        source,
    };
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".new");
    let temporary = path.with_file_name(name);
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temporary)
        .map_err(failed)?;
    file.write_all(contents).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    drop(file);
    std::fs::rename(&temporary, path).map_err(failed)
}
