//! Fixtures shared by the store's integration tests: disk groups on
//! fault-injecting devices, and self-describing block payloads.
#![allow(dead_code)]

use bytes::Bytes;
use std::sync::Arc;
use tessera_env::{Disk, FaultDisk};
use tessera_store::{AtRestKeys, DeviceSpec, DiskGroup, DiskGroupConfig, GroupDevices};
use tessera_types::DiskGroupId;

/// Cache device size used by tests.
pub const CACHE_BYTES: u64 = 24 << 20;
/// Capacity device size used by tests.
pub const CAPACITY_BYTES: u64 = 32 << 20;

/// A disk group `name` on files in `dir`: a test-size cache file and one
/// capacity file, for tests that read the files themselves.
pub fn file_config(dir: &std::path::Path, name: &str) -> DiskGroupConfig {
    DiskGroupConfig {
        id: DiskGroupId::new(name).unwrap(),
        cache: DeviceSpec {
            path: dir.join("cache"),
            size_bytes: CACHE_BYTES,
        },
        capacity: vec![DeviceSpec {
            path: dir.join("cap0"),
            size_bytes: CAPACITY_BYTES,
        }],
        index_cache_bytes: 1 << 20,
        content_cache_bytes: tessera_store::CONTENT_CACHE_BYTES_DEFAULT,
        direct_io: tessera_store::DirectIo::Off,
        encryption: None,
    }
}

/// The devices of one test disk group, and its keys if it is encrypted.
pub struct Rig {
    pub cache: Arc<FaultDisk>,
    pub capacity: Vec<Arc<FaultDisk>>,
    pub keys: Option<AtRestKeys>,
}

impl Rig {
    pub fn new(capacity_devices: usize) -> Rig {
        Rig {
            cache: Arc::new(FaultDisk::new("cache", CACHE_BYTES)),
            capacity: (0..capacity_devices)
                .map(|i| Arc::new(FaultDisk::new(&format!("capacity{i}"), CAPACITY_BYTES)))
                .collect(),
            keys: None,
        }
    }

    /// A rig whose group is encrypted at rest under a new key.
    pub fn encrypted(capacity_devices: usize) -> Rig {
        let kek = tessera_store::KeyEncryptionKey::generate().expect("key");
        Rig {
            keys: Some(AtRestKeys::new(kek)),
            ..Rig::new(capacity_devices)
        }
    }

    /// Every device's bytes as stored.
    pub fn raw_images(&self) -> Vec<Vec<u8>> {
        std::iter::once(&self.cache)
            .chain(&self.capacity)
            .map(|d| d.peek(0, d.size() as usize))
            .collect()
    }

    pub fn devices(&self) -> GroupDevices {
        GroupDevices {
            cache: self.cache.clone() as Arc<dyn Disk>,
            capacity: self
                .capacity
                .iter()
                .map(|d| d.clone() as Arc<dyn Disk>)
                .collect(),
            keys: self.keys.clone(),
        }
    }

    /// Power cut on every device: unsynced writes dropped at random, the last
    /// one torn. Returns the devices as they come back.
    pub fn power_cut(&self, seed: u64) -> Rig {
        self.cache.power_cut(seed);
        for (i, d) in self.capacity.iter().enumerate() {
            d.power_cut(seed.wrapping_add(i as u64 + 1));
        }
        self.restart()
    }

    /// kill -9: what reached the devices stays.
    pub fn process_crash(&self) -> Rig {
        self.cache.process_crash();
        for d in &self.capacity {
            d.process_crash();
        }
        self.restart()
    }

    fn restart(&self) -> Rig {
        Rig {
            cache: Arc::new(self.cache.restart()),
            capacity: self
                .capacity
                .iter()
                .map(|d| Arc::new(d.restart()))
                .collect(),
            keys: self.keys.clone(),
        }
    }

    pub async fn create(&self) -> Arc<DiskGroup> {
        DiskGroup::create_on(
            DiskGroupId::new("dg-test").unwrap(),
            self.devices(),
            1 << 20,
            false,
        )
        .await
        .expect("create disk group")
    }

    pub async fn open(&self) -> Arc<DiskGroup> {
        DiskGroup::open_on(
            DiskGroupId::new("dg-test").unwrap(),
            self.devices(),
            1 << 20,
        )
        .await
        .expect("open disk group")
    }
}

/// A block that says what it is: component, LBA and version in its first 24
/// bytes, then a pattern from them, so a torn or misplaced block is visible.
pub fn payload(component: u64, lba: u64, version: u64) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    b[..8].copy_from_slice(&component.to_le_bytes());
    b[8..16].copy_from_slice(&lba.to_le_bytes());
    b[16..24].copy_from_slice(&version.to_le_bytes());
    let mut x = component ^ lba.rotate_left(17) ^ version.rotate_left(41) ^ 0x9e37_79b9_7f4a_7c15;
    for chunk in b[24..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    b
}

/// Decodes a payload block: Some((component, lba, version)) if the block is
/// a whole, untorn payload; None for zeros; Err for anything else.
pub fn decode(b: &[u8]) -> Result<Option<(u64, u64, u64)>, String> {
    if b.iter().all(|&x| x == 0) {
        return Ok(None);
    }
    let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
    let (c, l, v) = (word(0), word(1), word(2));
    if payload(c, l, v) == b {
        Ok(Some((c, l, v)))
    } else {
        Err(format!(
            "torn or foreign block (header says c{c} lba {l} v{v})"
        ))
    }
}

pub fn bytes_of(blocks: &[Vec<u8>]) -> Bytes {
    Bytes::from(blocks.concat())
}
