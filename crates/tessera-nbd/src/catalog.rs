//! Where exports come from.
//!
//! Owns: the [`ExportCatalog`] trait through which a host plugs volumes in
//! and out of the NBD server at run time, and [`StaticCatalog`], a name to
//! device map for tests, benchmarks and single-device servers.
//! Must not touch: volumes, components or the cluster; a catalog hands out
//! `BlockDevice`s and nothing else.
//! Invariants: an empty export name means the default export, which exists
//! only when the catalog holds exactly one export; a client the catalog does
//! not admit to an export never sees it listed nor opens it.

use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use tessera_blockdev::BlockDevice;

/// Who is asking for an export: what a catalog decides admission by.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NbdClient {
    /// The address the client connects from.
    pub address: Option<IpAddr>,
    /// Whether the connection was upgraded to TLS (`NBD_OPT_STARTTLS`).
    pub tls: bool,
    /// The name the client's TLS certificate proves (verified against the
    /// server's trusted CA during the handshake); None without one.
    pub certificate: Option<String>,
}

impl NbdClient {
    /// Whether the client connects from this machine (127.0.0.0/8 or ::1).
    pub fn is_loopback(&self) -> bool {
        self.address.is_some_and(|a| match a {
            IpAddr::V4(v4) => v4.is_loopback(),
            IpAddr::V6(v6) => {
                v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
        })
    }
}

/// The set of exports a server offers. Asked on every option that names an
/// export, so a change is visible to the next client.
pub trait ExportCatalog: Send + Sync + 'static {
    /// Names of the exports, in the order `NBD_OPT_LIST` shows them.
    fn list(&self) -> Vec<String>;
    /// The device behind `name`, if it is exported.
    fn open(&self, name: &str) -> Option<Arc<dyn BlockDevice>>;
    /// A human-readable description of `name`.
    fn description(&self, _name: &str) -> Option<String> {
        None
    }
    /// Why `name`, an export the catalog knows but cannot open now, is
    /// refused (sent to the client in the error reply instead of "no
    /// export named ..."); None for a name it does not know.
    fn refusal(&self, _name: &str) -> Option<String> {
        None
    }
    /// Whether `client` may see and open `name`; the reason it may not
    /// (sent with `NBD_REP_ERR_POLICY`). Every client is admitted unless
    /// the catalog says otherwise.
    fn admits(&self, _name: &str, _client: &NbdClient) -> Result<(), String> {
        Ok(())
    }
}

/// Resolves a client's export name to the canonical name and its device; the
/// empty name opens the only export when there is exactly one.
pub fn resolve(catalog: &dyn ExportCatalog, name: &str) -> Option<(String, Arc<dyn BlockDevice>)> {
    if name.is_empty() {
        if let Some(device) = catalog.open("") {
            return Some((String::new(), device));
        }
        let names = catalog.list();
        if let [only] = names.as_slice() {
            return catalog.open(only).map(|d| (only.clone(), d));
        }
        return None;
    }
    catalog.open(name).map(|d| (name.to_owned(), d))
}

struct Export {
    device: Arc<dyn BlockDevice>,
    description: Option<String>,
}

/// A catalog held in memory; exports can be added and removed while the
/// server runs.
#[derive(Default)]
pub struct StaticCatalog {
    exports: RwLock<BTreeMap<String, Export>>,
}

impl StaticCatalog {
    /// An empty catalog.
    pub fn new() -> Self {
        Self::default()
    }

    /// A catalog with one export.
    pub fn single(name: impl Into<String>, device: Arc<dyn BlockDevice>) -> Self {
        let catalog = Self::new();
        catalog.insert(name, device, None);
        catalog
    }

    /// Adds (or replaces) an export.
    pub fn insert(
        &self,
        name: impl Into<String>,
        device: Arc<dyn BlockDevice>,
        description: Option<String>,
    ) {
        self.exports.write().insert(
            name.into(),
            Export {
                device,
                description,
            },
        );
    }

    /// Removes an export; connections already using it keep their device.
    pub fn remove(&self, name: &str) -> Option<Arc<dyn BlockDevice>> {
        self.exports.write().remove(name).map(|e| e.device)
    }
}

impl ExportCatalog for StaticCatalog {
    fn list(&self) -> Vec<String> {
        self.exports.read().keys().cloned().collect()
    }

    fn open(&self, name: &str) -> Option<Arc<dyn BlockDevice>> {
        self.exports.read().get(name).map(|e| e.device.clone())
    }

    fn description(&self, name: &str) -> Option<String> {
        self.exports
            .read()
            .get(name)
            .and_then(|e| e.description.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_blockdev::MemoryDevice;

    #[test]
    fn empty_name_opens_the_only_export_and_nothing_when_there_are_two() {
        let catalog = StaticCatalog::new();
        catalog.insert("a", Arc::new(MemoryDevice::new("a", 4096)), None);
        assert_eq!(resolve(&catalog, "").map(|(n, _)| n), Some("a".into()));
        catalog.insert("b", Arc::new(MemoryDevice::new("b", 4096)), None);
        assert!(resolve(&catalog, "").is_none());
        assert!(resolve(&catalog, "b").is_some());
        assert!(resolve(&catalog, "c").is_none());
        catalog.remove("a");
        assert_eq!(resolve(&catalog, "").map(|(n, _)| n), Some("b".into()));
    }
}
