//! A host's configuration (`node.toml`).
//!
//! Owns: parsing and checking the file a `tessera node` is started with.
//! Invariant: a configuration that passed [`HostConfig::check`] names a
//! usable host id, at least one disk group with a cache device and one
//! capacity device, and a directory to join.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use tessera_types::{DiskGroupId, FaultDomainId, HostId};

/// Where the directory lives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum DirectoryConfig {
    /// A local file (single-process clusters).
    Embedded {
        /// Database file.
        path: PathBuf,
    },
    /// An etcd cluster.
    Etcd {
        /// Client URLs, e.g. `https://127.0.0.1:2379`.
        endpoints: Vec<String>,
        /// TLS with a client certificate: the CA etcd's certificate chains
        /// to and the certificate this host presents (for etcd started with
        /// `--client-cert-auth`).
        #[serde(default)]
        tls: Option<tessera_directory::EtcdTls>,
    },
}

/// One device: a file (created with `size` if missing) or a block device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceConfig {
    /// Path of the file or block device.
    pub path: PathBuf,
    /// Size in bytes for a file that does not exist yet.
    pub size_bytes: u64,
}

/// One disk group: a cache device and capacity devices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskGroupConfig {
    /// Disk group id, unique on the host.
    pub id: DiskGroupId,
    /// The write-log device.
    pub cache: DeviceConfig,
    /// Capacity devices (1..=7).
    pub capacity: Vec<DeviceConfig>,
}

fn default_cluster() -> String {
    "tessera".into()
}
fn default_lease_ttl_ms() -> u64 {
    4_000
}
fn default_repair_delay_s() -> u64 {
    3_600
}
fn default_index_cache_bytes() -> u64 {
    64 << 20
}

/// A host's TLS files: the cluster CA and the host's own certificate. With
/// them the host serves its API over HTTPS, offers TLS to NBD clients, and
/// talks to other hosts only over TLS with certificates of the cluster CA on
/// both ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The cluster CA's certificate (PEM): client certificates must be
    /// signed by it.
    pub ca_cert: PathBuf,
    /// The host's certificate (PEM), valid for the addresses it serves on
    /// and allowing both server and client authentication (it is both ends
    /// of host-to-host connections).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// NBD clients must upgrade to TLS before anything else. Off, plain
    /// clients are served as far as each volume's access record admits
    /// them (from loopback by default).
    #[serde(default)]
    pub nbd_required: bool,
    /// Hosts talk to each other over TLS, each end proving its certificate
    /// (on by default; every host of the cluster must agree).
    #[serde(default = "default_transport_tls")]
    pub transport: bool,
    /// The cluster's secrets key (the same file on every host): CHAP
    /// secrets are kept in the directory sealed with it. Without it they
    /// are kept as given.
    #[serde(default)]
    pub secrets_key: Option<PathBuf>,
}

impl TlsConfig {
    /// TLS settings of a server of this host: its certificate, asking
    /// clients for one from the cluster CA (which they may not have).
    pub fn server(&self) -> Result<std::sync::Arc<rustls::ServerConfig>, tessera_tls::TlsError> {
        let identity = tessera_tls::Identity::load(&self.cert, &self.key)?;
        let roots = tessera_tls::TrustedRoots::load(&self.ca_cert)?;
        tessera_tls::server_config(&identity, &tessera_tls::ClientCertificates::Optional(roots))
    }

    /// The key sealing the secrets kept in the directory, if configured.
    pub fn secrets(
        &self,
    ) -> Result<Option<std::sync::Arc<tessera_tls::SecretsKey>>, tessera_tls::TlsError> {
        self.secrets_key
            .as_deref()
            .map(|path| tessera_tls::SecretsKey::load(path).map(std::sync::Arc::new))
            .transpose()
    }

    /// TLS between hosts: this host's certificate on both ends of every
    /// connection (it must allow server and client authentication), and a
    /// certificate of the cluster CA required of every peer.
    pub fn transport(&self) -> Result<tessera_transport::TransportTls, tessera_tls::TlsError> {
        let identity = tessera_tls::Identity::load(&self.cert, &self.key)?;
        let roots = tessera_tls::TrustedRoots::load(&self.ca_cert)?;
        Ok(tessera_transport::TransportTls {
            server: tessera_tls::server_config(
                &identity,
                &tessera_tls::ClientCertificates::Required(roots.clone()),
            )?,
            client: tessera_tls::client_config(&roots, Some(&identity))?,
        })
    }

    /// The NBD frontend's TLS.
    pub fn nbd(&self) -> Result<tessera_nbd::NbdTls, tessera_tls::TlsError> {
        Ok(tessera_nbd::NbdTls {
            config: self.server()?,
            required: self.nbd_required,
        })
    }
}

fn default_transport_tls() -> bool {
    true
}

/// Encryption at rest of a host's disk groups: new disk groups are
/// formatted encrypted (AES-256-XTS under a data key of their own, sealed
/// by the key encryption key in `kek_file`); encrypted ones open only with
/// the key that sealed their data key. Disk groups formatted before stay
/// plaintext (`host show` says which are encrypted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncryptionConfig {
    /// The key encryption key: 64 hexadecimal digits (or 32 raw bytes),
    /// readable by its owner only. Keep it off the devices it protects.
    pub kek_file: PathBuf,
    /// Earlier key encryption keys, still accepted to open data keys they
    /// sealed until a shallow rekey seals those with `kek_file`'s key.
    #[serde(default)]
    pub retired_kek_files: Vec<PathBuf>,
}

impl EncryptionConfig {
    /// Reads the key files (again at every call, so a key file replaced in
    /// place is what the next rekey uses).
    pub fn keys(&self) -> Result<tessera_store::AtRestKeys, String> {
        let load =
            |p: &PathBuf| tessera_store::KeyEncryptionKey::load(p).map_err(|e| e.to_string());
        Ok(tessera_store::AtRestKeys {
            current: load(&self.kek_file)?,
            retired: self
                .retired_kek_files
                .iter()
                .map(load)
                .collect::<Result<_, _>>()?,
        })
    }
}

/// The iSCSI well-known port (RFC 7143).
pub const ISCSI_PORT: u16 = 3260;

/// A host's configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostConfig {
    /// Cluster name (directory key prefix).
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// Host id.
    pub id: HostId,
    /// Fault domain; the host is its own when absent.
    #[serde(default)]
    pub fault_domain: Option<FaultDomainId>,
    /// Host-to-host transport listen address.
    pub transport_addr: SocketAddr,
    /// NBD listen address.
    pub nbd_addr: SocketAddr,
    /// iSCSI portal address; port 3260 on the NBD address's IP when absent.
    #[serde(default)]
    pub iscsi_addr: Option<SocketAddr>,
    /// REST API listen address, if this host serves the API.
    #[serde(default)]
    pub api_addr: Option<SocketAddr>,
    /// TLS: with it the API is served over HTTPS and NBD clients may (or
    /// must) upgrade to TLS; without it both are plain.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Encryption at rest of the host's disk groups.
    #[serde(default)]
    pub encryption: Option<EncryptionConfig>,
    /// The directory.
    pub directory: DirectoryConfig,
    /// Disk groups.
    pub disk_groups: Vec<DiskGroupConfig>,
    /// Liveness lease TTL: how long a silent host keeps its volumes.
    #[serde(default = "default_lease_ttl_ms")]
    pub lease_ttl_ms: u64,
    /// How long a component may stay absent before it is rebuilt elsewhere
    /// (vSAN's 60 minutes by default).
    #[serde(default = "default_repair_delay_s")]
    pub repair_delay_s: u64,
    /// Memory for the index caches of the host's disk groups (shared out
    /// evenly among them), unless the cluster setting `index_cache_bytes`
    /// says otherwise.
    #[serde(default = "default_index_cache_bytes")]
    pub index_cache_bytes: u64,
    /// Open every device with O_DIRECT. Off (the default), only the write
    /// log bypasses the page cache and the capacity devices use it.
    #[serde(default)]
    pub direct_io: bool,
    /// Accept fault injection (devices made to fail on request), for test
    /// clusters only. Off by default: a request to inject a fault is then
    /// refused.
    #[serde(default)]
    pub fault_injection: bool,
}

impl HostConfig {
    /// The key sealing the secrets kept in the directory, if configured.
    pub fn secrets(&self) -> Result<Option<std::sync::Arc<tessera_tls::SecretsKey>>, String> {
        match &self.tls {
            Some(tls) => tls
                .secrets()
                .map_err(|e| format!("host {}: secrets key: {e}", self.id)),
            None => Ok(None),
        }
    }

    /// The iSCSI portal this host listens on.
    pub fn iscsi_portal(&self) -> SocketAddr {
        self.iscsi_addr
            .unwrap_or_else(|| SocketAddr::new(self.nbd_addr.ip(), ISCSI_PORT))
    }

    /// Reads and checks a TOML file.
    pub fn from_file(path: &std::path::Path) -> Result<HostConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let config: HostConfig =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        config
            .check()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(config)
    }

    /// Checks what serde cannot.
    pub fn check(&self) -> Result<(), String> {
        HostId::new(self.id.as_str()).map_err(|e| e.to_string())?;
        if self.disk_groups.is_empty() {
            return Err(format!(
                "host {}: at least one disk group is needed",
                self.id
            ));
        }
        for dg in &self.disk_groups {
            if dg.capacity.is_empty() || dg.capacity.len() > 7 {
                return Err(format!(
                    "host {} disk group {}: 1 to 7 capacity devices are needed, not {}",
                    self.id,
                    dg.id,
                    dg.capacity.len()
                ));
            }
        }
        if self.lease_ttl_ms < 500 {
            return Err(format!(
                "host {}: lease_ttl_ms must be at least 500, not {}",
                self.id, self.lease_ttl_ms
            ));
        }
        Ok(())
    }

    /// The fault domain (the host itself when none is configured).
    pub fn fault_domain(&self) -> FaultDomainId {
        self.fault_domain
            .clone()
            .unwrap_or_else(|| FaultDomainId(self.id.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    const GOOD: &str = r#"
id = "host-1"
transport_addr = "127.0.0.1:9500"
nbd_addr = "127.0.0.1:10809"
directory = { kind = "embedded", path = "/tmp/d.redb" }
[[disk_groups]]
id = "dg0"
cache = { path = "/tmp/c.img", size_bytes = 268435456 }
capacity = [{ path = "/tmp/k.img", size_bytes = 1073741824 }]
"#;

    #[test]
    fn a_good_file_reads_with_defaults() {
        let (_d, path) = write(GOOD);
        let config = HostConfig::from_file(&path).unwrap();
        assert_eq!(config.cluster, "tessera");
        assert_eq!(config.repair_delay_s, 3600);
        assert_eq!(config.fault_domain().as_str(), "host-1");
    }

    #[test]
    fn malformed_files_are_refused_with_the_path_and_the_reason() {
        let cases = [
            ("id = ", "node.toml"),
            (&GOOD.replace("host-1", "host/1"), "may contain only"),
            (
                &GOOD.replace("127.0.0.1:9500", "not an address"),
                "invalid socket address",
            ),
            (
                &GOOD.replace(
                    "capacity = [{ path = \"/tmp/k.img\", size_bytes = 1073741824 }]",
                    "capacity = []",
                ),
                "1 to 7 capacity devices",
            ),
            (
                &GOOD.replace("nbd_addr = \"127.0.0.1:10809\"\n", ""),
                "nbd_addr",
            ),
            (
                &format!("lease_ttl_ms = 10\n{GOOD}"),
                "lease_ttl_ms must be at least 500",
            ),
        ];
        for (text, expected) in cases {
            let (_d, path) = write(text);
            let err = HostConfig::from_file(&path).unwrap_err();
            assert!(err.contains("node.toml"), "{err}");
            assert!(err.contains(expected), "expected {expected:?} in {err}");
        }
        let err =
            HostConfig::from_file(std::path::Path::new("/nonexistent/node.toml")).unwrap_err();
        assert!(err.contains("cannot read"), "{err}");
    }

    #[test]
    fn an_encryption_section_names_key_files_read_when_the_keys_are_needed() {
        let (dir, path) = write(&format!(
            "{GOOD}\n[encryption]\nkek_file = \"/nonexistent/kek\"\n"
        ));
        let config = HostConfig::from_file(&path).unwrap();
        let encryption = config.encryption.clone().unwrap();
        assert!(encryption.retired_kek_files.is_empty());
        let err = encryption.keys().unwrap_err();
        assert!(err.contains("/nonexistent/kek"), "{err}");
        let kek = dir.path().join("kek");
        tessera_store::KeyEncryptionKey::generate()
            .unwrap()
            .save_new(&kek)
            .unwrap();
        let keys = EncryptionConfig {
            kek_file: kek.clone(),
            retired_kek_files: vec![kek],
        }
        .keys()
        .unwrap();
        assert_eq!(keys.retired.len(), 1);
        assert_eq!(keys.retired[0].id(), keys.current.id());
        let (_d, path) = write(&format!(
            "{GOOD}\n[encryption]\nkek_file = \"/k\"\nkek = \"/x\"\n"
        ));
        let err = HostConfig::from_file(&path).unwrap_err();
        assert!(err.contains("unknown field"), "{err}");
    }
}
