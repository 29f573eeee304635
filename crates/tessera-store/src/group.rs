//! [`DiskGroup`]: the store's API for the replica service.
//!
//! Owns: the public operations and their argument checks, and the life of the
//! worker threads (log writer, log syncers, destager: started on open,
//! stopped and joined on drop). Every
//! operation is async and its future is `Send`; device work runs on the
//! worker threads (writes) or on the runtime's blocking pool (reads of
//! blocks and index pages), never on the caller's executor thread.
//! Must be called from within a tokio runtime. Invariant: devices opened by
//! path are locked from open to drop, so no second opener (another host,
//! `tessera store check`) can use them while the disk group is in service.
//!
//! Reads: a read is planned under the state lock (overlay, index, and the
//! content cache for capacity blocks, looked up in that same step); a read
//! whose missing blocks other reads are fetching waits for them; then only
//! the blocks still missing are read from the devices: inline, through the
//! group's io_uring (a guest's one-block read while others are in flight),
//! or on the reader threads, and each one that passes its CRC32C goes into
//! the cache and to the reads waiting for it. A scrub plans without the cache: it
//! checks the devices.

use crate::at_rest::{AtRestKeys, EncryptionStatus, GroupCipher, KekId};
use crate::content::{ContentCache, ContentCacheStats, Fill, Resolved};
use crate::device_threads::{DeviceThreads, Work, READER_THREADS, WRITER_THREADS};
use crate::engine::{self, op_entry, Geometry, ScrubCounters, Shared};
use crate::index::LBAS_PER_PAGE;
use crate::read_around::Around;
use crate::recovery;
use crate::shared_sync::SharedSync;
use crate::state::{Component, Request, Source, State};
use crate::{StoreError, PLACED_WRITE_BYTES_MIN, WRITE_BYTES_MAX};
use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tessera_env::{
    AlignedBuf, Disk, FileDisk, FileDiskOptions, ReadVia, Rng, SeededRng, DISK_ALIGN,
};
use tessera_format::{block_crc, BlockLoc, LogOp, BLOCK};
use tessera_types::{ComponentId, DiskGroupId, Epoch, Lba, BLOCK_BYTES};

/// A device of the disk group and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// File or block device.
    pub path: PathBuf,
    /// Bytes; a missing file is created with this size.
    pub size_bytes: u64,
}

/// How to build or open a disk group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskGroupConfig {
    /// The disk group's name.
    pub id: DiskGroupId,
    /// The cache device: write log and checkpoints.
    pub cache: DeviceSpec,
    /// The capacity devices (1 to 7).
    pub capacity: Vec<DeviceSpec>,
    /// Memory for cached index pages, in bytes (at least 1 MiB is used).
    pub index_cache_bytes: u64,
    /// Memory for the content-based read cache of verified capacity blocks,
    /// in bytes, per-block overhead included; 0 disables it. Default:
    /// [`crate::CONTENT_CACHE_BYTES_DEFAULT`].
    pub content_cache_bytes: u64,
    /// Which devices bypass the page cache.
    pub direct_io: DirectIo,
    /// Encryption at rest: a group created with keys is encrypted under a
    /// new data key sealed by `current`; an encrypted group opens only with
    /// the key that sealed its data key. `None` creates plaintext groups
    /// (and opens only those).
    pub encryption: Option<AtRestKeys>,
}

/// Which devices of a disk group are opened with `O_DIRECT` (bypassing the
/// page cache). Where a file system refuses `O_DIRECT` (tmpfs), the device
/// is opened through the page cache instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectIo {
    /// Every device through the page cache.
    Off,
    /// The cache device only. The write log is synced at every group
    /// commit: through the page cache a sync also waits for the write-back
    /// of other dirty pages, and the device's cache flush for the capacity
    /// devices' write-back; measured on a file-backed `tessera up`, QD 1
    /// mirrored writes 255 -> 202 us, 256 KiB sequential writes 183 -> 339
    /// MiB/s. The capacity devices keep the page cache, which serves reads
    /// (O_DIRECT reads of the same file took 154 us at QD 1 against 50).
    #[default]
    Log,
    /// Every device.
    All,
}

/// Already-open devices (tests pass fault-injecting ones).
pub struct GroupDevices {
    /// The cache device.
    pub cache: Arc<dyn Disk>,
    /// The capacity devices.
    pub capacity: Vec<Arc<dyn Disk>>,
    /// Keys to encrypt a new group with or to open an encrypted one (see
    /// [`DiskGroupConfig::encryption`]).
    pub keys: Option<AtRestKeys>,
}

/// Space of one component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ComponentSpace {
    /// The component's size.
    pub logical_bytes: u64,
    /// Bytes of LBAs that hold data (written and not unmapped or zeroed).
    pub allocated_bytes: u64,
    /// Bytes held on the capacity devices: data blocks already destaged and
    /// index pages (data still in the write log is not counted here).
    pub physical_bytes: u64,
    /// Bytes reserved up front.
    pub reserved_bytes: u64,
}

/// Space of the disk group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskGroupSpace {
    /// Bytes components can use (capacity devices minus a destaging reserve).
    pub capacity_bytes: u64,
    /// Bytes committed to written data, index pages and snapshots' root
    /// tables, data still in the write log included. A block shared by
    /// several LBAs (a copy by reference, a snapshot, a clone) counts once;
    /// the first overwrite of one takes a new block, and is refused when
    /// there is none.
    pub used_bytes: u64,
    /// Bytes reserved and not yet written.
    pub reserved_bytes: u64,
    /// Bytes left for new allocations and reservations.
    pub free_bytes: u64,
    /// Bytes of the capacity devices in use: data blocks (a shared block
    /// once), index page slots, and blocks a checkpoint has yet to free.
    pub physical_bytes: u64,
}

/// One component as listed by [`DiskGroup::components`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentSummary {
    /// The component.
    pub id: ComponentId,
    /// Its size.
    pub size_bytes: u64,
    /// Highest owner epoch persisted.
    pub highest_epoch: Epoch,
    /// Its space.
    pub space: ComponentSpace,
    /// Why it failed, if it did.
    pub failed: Option<String>,
}

/// Health of the disk group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskGroupHealth {
    /// Everything works.
    Healthy,
    /// Some capacity devices failed; their components failed with them.
    Degraded {
        /// Failed devices: (name, reason).
        failed_devices: Vec<(String, String)>,
        /// Components that failed.
        failed_components: Vec<ComponentId>,
    },
    /// The disk group failed as a whole (cache device error, damaged log or
    /// checkpoint): every component on it must be rebuilt elsewhere.
    Failed {
        /// Why.
        reason: String,
    },
}

/// Counters of the write log since the disk group opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogStats {
    /// Group commits written to the log.
    pub group_commits: u64,
    /// Group commits written while an earlier one was still waiting for its
    /// sync (commits in flight together).
    pub overlapped_commits: u64,
    /// `fdatasync` calls of the log; one covers every commit written before it.
    pub syncs: u64,
    /// Group commits written durable on their own (`O_DSYNC`), needing no
    /// sync: a commit made while nothing else was in flight, or (with the
    /// group's ring) the requests that queued behind such a commit,
    /// committed from its completion.
    pub durable_commits: u64,
    /// Writes stored straight on the capacity tier, bypassing the log (see
    /// [`crate::PLACED_WRITE_BYTES_MIN`]).
    pub placed_writes: u64,
    /// Blocks those writes held.
    pub placed_blocks: u64,
}

/// A disk group in service.
pub struct DiskGroup {
    id: DiskGroupId,
    shared: Arc<Shared>,
    /// The devices' encryption, when the group is encrypted.
    cipher: Option<Arc<GroupCipher>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// Attempts at loading index pages for one operation before giving up (the
/// cache is at least [`crate::index::CACHE_PAGES_MIN`] pages, so a second
/// attempt only happens under heavy concurrent eviction).
const LOAD_ATTEMPTS_MAX: usize = 8;

fn open_files(config: &DiskGroupConfig, create: bool) -> Result<GroupDevices, StoreError> {
    let open = |spec: &DeviceSpec, cache: bool| -> Result<Arc<dyn Disk>, StoreError> {
        if let Some(parent) = spec.path.parent() {
            if create && !parent.as_os_str().is_empty() && !parent.exists() {
                std::fs::create_dir_all(parent).map_err(|e| StoreError::BadDevice {
                    device: spec.path.display().to_string(),
                    problem: format!("cannot create its directory: {e}"),
                })?;
            }
        }
        // Locks the device exclusively until the disk group is dropped (see
        // `FileDisk`): a second host, or a check, cannot open it meanwhile.
        let disk = FileDisk::open(
            &spec.path,
            FileDiskOptions {
                create_bytes: create.then_some(spec.size_bytes),
                direct_io: match config.direct_io {
                    DirectIo::Off => false,
                    DirectIo::Log => cache,
                    DirectIo::All => true,
                },
                read_only: false,
            },
        )
        .map_err(|e| {
            if e.is_in_use() {
                StoreError::DeviceInUse {
                    device: spec.path.display().to_string(),
                }
            } else {
                StoreError::Device(e)
            }
        })?;
        Ok(Arc::new(disk))
    };
    Ok(GroupDevices {
        cache: open(&config.cache, true)?,
        capacity: config
            .capacity
            .iter()
            .map(|spec| open(spec, false))
            .collect::<Result<Vec<_>, _>>()?,
        keys: config.encryption.clone(),
    })
}

impl DiskGroup {
    /// Formats new devices (files are created with the configured sizes if
    /// missing) and opens the empty disk group. Refuses devices that already
    /// hold a disk group. Each device is locked exclusively until the disk
    /// group is dropped; one that another opener holds (a running host, a
    /// check) fails with [`StoreError::DeviceInUse`].
    pub async fn create(config: DiskGroupConfig) -> Result<Arc<DiskGroup>, StoreError> {
        let devices = open_files(&config, true)?;
        let dg =
            Self::create_on(config.id.clone(), devices, config.index_cache_bytes, true).await?;
        dg.set_content_cache_bytes(config.content_cache_bytes);
        Ok(dg)
    }

    /// Opens an existing disk group, recovering from its write log. Each
    /// device is locked exclusively until the disk group is dropped; one that
    /// another opener holds (a running host, a check) fails with
    /// [`StoreError::DeviceInUse`] and nothing is read or written.
    pub async fn open(config: DiskGroupConfig) -> Result<Arc<DiskGroup>, StoreError> {
        let devices = open_files(&config, false)?;
        let dg = Self::open_on(config.id.clone(), devices, config.index_cache_bytes).await?;
        dg.set_content_cache_bytes(config.content_cache_bytes);
        Ok(dg)
    }

    /// Opens the disk group if its cache device holds one, else creates it.
    pub async fn open_or_create(config: DiskGroupConfig) -> Result<Arc<DiskGroup>, StoreError> {
        Self::open_or_create_wrapped(config, |device| device).await
    }

    /// Opens or creates the disk group as [`DiskGroup::open_or_create`]
    /// does, with each device opened passed through `wrap` first (cache
    /// device, then capacity devices in order): how a host puts its devices
    /// behind fault-injection switches.
    pub async fn open_or_create_wrapped(
        config: DiskGroupConfig,
        mut wrap: impl FnMut(Arc<dyn Disk>) -> Arc<dyn Disk>,
    ) -> Result<Arc<DiskGroup>, StoreError> {
        let formatted = config.cache.path.exists() && {
            let devices = open_files(&config, false)?;
            recovery::read_superblock(&devices.cache).is_ok()
        };
        let devices = open_files(&config, !formatted)?;
        let devices = GroupDevices {
            cache: wrap(devices.cache),
            capacity: devices.capacity.into_iter().map(&mut wrap).collect(),
            keys: devices.keys,
        };
        let dg = if formatted {
            Self::open_on(config.id.clone(), devices, config.index_cache_bytes).await?
        } else {
            Self::create_on(config.id.clone(), devices, config.index_cache_bytes, true).await?
        };
        dg.set_content_cache_bytes(config.content_cache_bytes);
        Ok(dg)
    }

    /// Formats `devices` and opens them, with a content cache of
    /// [`crate::CONTENT_CACHE_BYTES_DEFAULT`] (see
    /// [`DiskGroup::set_content_cache_bytes`]).
    pub async fn create_on(
        id: DiskGroupId,
        devices: GroupDevices,
        index_cache_bytes: u64,
        zero_log: bool,
    ) -> Result<Arc<DiskGroup>, StoreError> {
        let all = all_devices(&devices);
        let name = id.to_string();
        let rng = SeededRng::from_entropy();
        let uuid = ((rng.next_u64() as u128) << 64) | rng.next_u64() as u128;
        let keys = devices.keys.clone();
        tokio::task::spawn_blocking(move || {
            recovery::format(&all, &name, uuid, zero_log, keys.as_ref())
        })
        .await
        .map_err(|e| StoreError::Config(format!("format task failed: {e}")))??;
        Self::open_on(id, devices, index_cache_bytes).await
    }

    /// Opens already-open `devices`, recovering from the write log, with a
    /// content cache of [`crate::CONTENT_CACHE_BYTES_DEFAULT`] (see
    /// [`DiskGroup::set_content_cache_bytes`]).
    pub async fn open_on(
        id: DiskGroupId,
        devices: GroupDevices,
        index_cache_bytes: u64,
    ) -> Result<Arc<DiskGroup>, StoreError> {
        let all = all_devices(&devices);
        let keys = devices.keys;
        let (shared, cipher) = tokio::task::spawn_blocking(move || {
            let cipher = recovery::unlock(&all, keys.as_ref())?;
            let all = match &cipher {
                Some(c) => c.disks(),
                None => all,
            };
            mount(all, index_cache_bytes).map(|shared| (shared, cipher.map(Arc::new)))
        })
        .await
        .map_err(|e| StoreError::Config(format!("mount task failed: {e}")))??;
        let mut threads = Vec::new();
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("store-log".into())
                .spawn(move || engine::run_log_writer(s))
                .map_err(|e| StoreError::Config(format!("cannot start the log writer: {e}")))?,
        );
        for _ in 0..engine::LOG_SYNCERS {
            let s = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("store-sync".into())
                    .spawn(move || engine::run_log_syncer(s))
                    .map_err(|e| StoreError::Config(format!("cannot start a log syncer: {e}")))?,
            );
        }
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("store-destage".into())
                .spawn(move || {
                    tessera_env::background::run_this_thread_as_background();
                    engine::run_destager(s)
                })
                .map_err(|e| StoreError::Config(format!("cannot start the destager: {e}")))?,
        );
        let dg = Arc::new(DiskGroup {
            id,
            shared,
            cipher,
            threads: Mutex::new(threads),
        });
        // A deep rekey the last run left half way goes on.
        if dg.cipher.as_ref().is_some_and(|c| c.rekey_pending()) {
            dg.spawn_rekey_worker()?;
        }
        Ok(dg)
    }

    /// The group's encryption at rest: `None` for a plaintext group.
    pub fn encryption(&self) -> Option<EncryptionStatus> {
        self.cipher.as_ref().map(|c| c.status())
    }

    fn cipher(&self) -> Result<&Arc<GroupCipher>, StoreError> {
        self.cipher.as_ref().ok_or_else(|| {
            StoreError::Encryption(format!(
                "disk group {} is not encrypted: it was formatted without a key",
                self.id
            ))
        })
    }

    /// Shallow rekey: seals the group's data key with `keys.current` in
    /// every superblock, online. Answers the key that now seals it.
    pub async fn rewrap_keys(&self, keys: &AtRestKeys) -> Result<KekId, StoreError> {
        let cipher = self.cipher()?.clone();
        let keys = keys.clone();
        tokio::task::spawn_blocking(move || cipher.rewrap(&keys))
            .await
            .map_err(|e| StoreError::Config(format!("rekey task failed: {e}")))?
    }

    /// Deep rekey: a new data key, sealed by `keys.current`; a worker
    /// rewrites every block of the group under it in the background, at the
    /// pace [`DiskGroup::set_rekey_rate`] sets, while the group serves
    /// reads and writes (progress in [`DiskGroup::encryption`]). A restart
    /// continues where it stopped. Refused while one is under way.
    pub async fn start_deep_rekey(&self, keys: &AtRestKeys) -> Result<(), StoreError> {
        let cipher = self.cipher()?.clone();
        let keys = keys.clone();
        tokio::task::spawn_blocking(move || cipher.begin_deep_rekey(&keys))
            .await
            .map_err(|e| StoreError::Config(format!("rekey task failed: {e}")))??;
        self.spawn_rekey_worker()
    }

    /// Pace of deep rekeys, in bytes per second (0: unlimited). Default:
    /// [`crate::REKEY_BYTES_PER_SECOND_DEFAULT`].
    pub fn set_rekey_rate(&self, bytes_per_second: u64) {
        if let Some(c) = &self.cipher {
            c.set_rekey_rate(bytes_per_second);
        }
    }

    fn spawn_rekey_worker(&self) -> Result<(), StoreError> {
        let cipher = self.cipher()?.clone();
        if !cipher.claim_rekey_worker() {
            return Ok(());
        }
        let shared = self.shared.clone();
        let handle = std::thread::Builder::new()
            .name("store-rekey".into())
            .spawn(move || {
                tessera_env::background::run_this_thread_as_background();
                cipher.run_deep_rekey(&shared.stop)
            })
            .map_err(|e| StoreError::Config(format!("cannot start the rekey worker: {e}")))?;
        self.threads.lock().push(handle);
        Ok(())
    }

    /// The disk group's name.
    pub fn id(&self) -> &DiskGroupId {
        &self.id
    }

    /// Test-only switch: acknowledge writes before they are written and
    /// synced. Exists so crash tests can show they detect lost writes; never
    /// set it on a disk group holding data anyone needs.
    pub fn set_ack_before_durable(&self, on: bool) {
        self.shared.ack_before_durable.store(on, Ordering::Relaxed);
    }

    pub(crate) fn component_lock(
        &self,
        id: ComponentId,
    ) -> Result<Arc<tokio::sync::RwLock<()>>, StoreError> {
        let st = self.shared.state.lock();
        Ok(st.component(id)?.lock.clone())
    }

    async fn load(&self, need: crate::state::Need) -> Result<(), StoreError> {
        let crate::state::Need(now, ahead) = need;
        if !ahead.is_empty() {
            // Read beside the pages waited for; nothing waits for these.
            let shared = self.shared.clone();
            tokio::task::spawn_blocking(move || shared.load_pages_blocking(&ahead, true));
        }
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || shared.load_pages_blocking(&now, false))
            .await
            .map_err(|e| StoreError::DiskGroupFailed {
                reason: format!("page load task failed: {e}"),
            })?
    }

    pub(crate) fn enqueue(st: &mut State, shared: &Shared, req: Request) {
        st.queue.push_back(req);
        // Whoever is writing the log wakes the log writer when done.
        if !st.log_writing {
            shared.log_work.notify_one();
        }
    }

    pub(crate) async fn wait(
        rx: tokio::sync::oneshot::Receiver<Result<(), StoreError>>,
    ) -> Result<(), StoreError> {
        rx.await.unwrap_or_else(|_| {
            Err(StoreError::DiskGroupFailed {
                reason: "the log writer stopped".into(),
            })
        })
    }

    /// Creates a component of `size_bytes` with `reserve_bytes` reserved up
    /// front. Creating it again with the same size succeeds and changes
    /// nothing.
    pub async fn create_component(
        &self,
        id: ComponentId,
        size_bytes: u64,
        reserve_bytes: u64,
    ) -> Result<(), StoreError> {
        if size_bytes == 0 || !size_bytes.is_multiple_of(BLOCK_BYTES) || reserve_bytes > size_bytes
        {
            return Err(StoreError::Misaligned {
                component: id,
                lba: Lba(0),
                problem: format!(
                    "size {size_bytes} must be a nonzero multiple of {BLOCK_BYTES} and reservation {reserve_bytes} at most the size"
                ),
            });
        }
        let reserve_bytes = reserve_bytes.div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        let rx = {
            let mut st = self.shared.state.lock();
            st.check_group()?;
            if let Some(c) = st.components.get(&id.0) {
                if c.size_bytes == size_bytes {
                    return Ok(());
                }
                return Err(StoreError::ComponentExists {
                    component: id,
                    size_bytes: c.size_bytes,
                });
            }
            if st.components.len() as u64 >= crate::COMPONENTS_MAX {
                return Err(StoreError::NoSpaceForReservation {
                    component: id,
                    requested: reserve_bytes,
                    free: 0,
                });
            }
            let free = st.usable_blocks.saturating_sub(st.committed_blocks());
            if reserve_bytes / BLOCK_BYTES > free {
                return Err(StoreError::NoSpaceForReservation {
                    component: id,
                    requested: reserve_bytes,
                    free: free * BLOCK_BYTES,
                });
            }
            st.components
                .insert(id.0, Component::new(id.0, size_bytes, reserve_bytes, 0));
            let (tx, rx) = tokio::sync::oneshot::channel();
            let req = Request {
                entries: vec![op_entry(
                    LogOp::Create,
                    id.0,
                    0,
                    0,
                    0,
                    size_bytes,
                    reserve_bytes,
                )],
                data: Vec::new(),
                writes: Vec::new(),
                token: None,
                done: Some(tx),
            };
            Self::enqueue(&mut st, &self.shared, req);
            rx
        };
        Self::wait(rx).await
    }

    /// Deletes a component and frees its space.
    pub async fn delete_component(&self, id: ComponentId) -> Result<(), StoreError> {
        let lock = {
            let st = self.shared.state.lock();
            st.check_group()?;
            match st.components.get(&id.0) {
                Some(c) => c.lock.clone(),
                None => return Err(StoreError::NoSuchComponent { component: id }),
            }
        };
        let _guard = lock.write().await;
        // A snapshot's roots are in its table (and stay as they are).
        let shared = self.shared.clone();
        let table_roots = tokio::task::spawn_blocking(move || shared.snapshot_roots(id.0))
            .await
            .map_err(|e| StoreError::DiskGroupFailed {
                reason: format!("root table task failed: {e}"),
            })??;
        let (rx, token, taken) = {
            let mut st = self.shared.state.lock();
            st.check_group()?;
            let Some(taken) = st.take_component(id.0, table_roots) else {
                return Err(StoreError::NoSuchComponent { component: id });
            };
            let token = st.next_token;
            st.next_token += 1;
            let (tx, rx) = tokio::sync::oneshot::channel();
            let req = Request {
                entries: vec![op_entry(LogOp::Delete, id.0, 0, 0, 0, 0, 0)],
                data: Vec::new(),
                writes: Vec::new(),
                token: Some(token),
                done: Some(tx),
            };
            Self::enqueue(&mut st, &self.shared, req);
            (rx, token, taken)
        };
        let logged = Self::wait(rx).await;
        let shared = self.shared.clone();
        let (comp, cached) = taken;
        let freed = tokio::task::spawn_blocking(move || {
            recovery::free_component_blocking(&shared, id.0, comp, cached);
        })
        .await;
        self.shared.state.lock().unapplied.remove(&token);
        logged?;
        freed.map_err(|e| StoreError::DiskGroupFailed {
            reason: format!("delete task failed: {e}"),
        })
    }

    /// Changes a component's size; shrinking unmaps the cut-off blocks.
    pub async fn resize_component(
        &self,
        id: ComponentId,
        size_bytes: u64,
    ) -> Result<(), StoreError> {
        if size_bytes == 0 || !size_bytes.is_multiple_of(BLOCK_BYTES) {
            return Err(StoreError::Misaligned {
                component: id,
                lba: Lba(0),
                problem: format!("size {size_bytes} must be a nonzero multiple of {BLOCK_BYTES}"),
            });
        }
        let lock = self.component_lock(id)?;
        let _guard = lock.write().await;
        let (rx, token, old) = {
            let mut st = self.shared.state.lock();
            st.check_writable(id)?;
            let old = st.component(id)?.size_bytes;
            if old == size_bytes {
                return Ok(());
            }
            let token = st.next_token;
            st.next_token += 1;
            if let Some(c) = st.components.get_mut(&id.0) {
                c.size_bytes = size_bytes;
                c.reserve_bytes = c.reserve_bytes.min(size_bytes);
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            let req = Request {
                entries: vec![op_entry(LogOp::Resize, id.0, 0, 0, 0, size_bytes, 0)],
                data: Vec::new(),
                writes: Vec::new(),
                token: Some(token),
                done: Some(tx),
            };
            Self::enqueue(&mut st, &self.shared, req);
            (rx, token, old)
        };
        let logged = Self::wait(rx).await;
        let applied = if logged.is_ok() && size_bytes < old {
            self.unmap_apply(id.0, size_bytes / BLOCK_BYTES, old / BLOCK_BYTES)
                .await
        } else {
            Ok(())
        };
        self.shared.state.lock().unapplied.remove(&token);
        logged?;
        applied
    }

    async fn unmap_apply(&self, c: u64, start: u64, end: u64) -> Result<(), StoreError> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || recovery::unmap_blocking(&shared, c, start, end))
            .await
            .map_err(|e| StoreError::DiskGroupFailed {
                reason: format!("unmap task failed: {e}"),
            })?
    }

    /// Writes whole 4 KiB blocks from `lba`. Durable when it returns Ok.
    /// The data is copied once: nothing of `data` is held after the call.
    pub async fn write(
        &self,
        id: ComponentId,
        lba: Lba,
        data: Bytes,
        epoch: Epoch,
    ) -> Result<(), StoreError> {
        let len = data.len() as u64;
        if len == 0 || !len.is_multiple_of(BLOCK_BYTES) || len > WRITE_BYTES_MAX {
            return Err(StoreError::Misaligned {
                component: id,
                lba,
                problem: format!(
                    "write of {len} bytes: must be whole {BLOCK_BYTES}-byte blocks, at most {WRITE_BYTES_MAX} bytes"
                ),
            });
        }
        let n = len / BLOCK_BYTES;
        let lock = self.component_lock(id)?;
        let _guard = lock.read().await;
        if len >= PLACED_WRITE_BYTES_MIN && self.write_placed(id, lba, &data, epoch).await? {
            return Ok(());
        }
        // The store keeps only the write's own bytes until they are
        // destaged: one copy in a buffer of exactly their length, whatever
        // buffer the caller's `Bytes` is a slice of (a 4 KiB write read into
        // a 128 KiB network buffer would keep all of it alive, outside the
        // overlay's budget). The CRCs are taken from this copy.
        let data = Bytes::copy_from_slice(&data);
        let blocks: Vec<(Bytes, u32, bool)> = (0..n as usize)
            .map(|i| {
                let b = data.slice(i * BLOCK..(i + 1) * BLOCK);
                let crc = block_crc(&b);
                (b, crc, false)
            })
            .collect();
        let (rx, inline) = self
            .with_write_pages(id, lba, n, epoch, |st| {
                let ops = st.stage_write(id, lba, &blocks, epoch, true)?;
                let (req, rx) = write_request(
                    id,
                    lba,
                    epoch,
                    &ops,
                    |i| (LogOp::Write { crc: blocks[i].1 }, 0),
                    blocks.iter().map(|b| b.0.clone()).collect(),
                );
                Ok((rx, self.commit_or_queue(st, req)))
            })
            .await?;
        if let Some(req) = inline {
            InlineCommit::new(&self.shared, req).run().await;
        }
        Self::wait(rx).await
    }

    /// Runs `f` under the state lock once the range and the epoch of a
    /// write are checked and the index pages of the range are cached,
    /// loading them as needed.
    async fn with_write_pages<T>(
        &self,
        id: ComponentId,
        lba: Lba,
        n: u64,
        epoch: Epoch,
        mut f: impl FnMut(&mut State) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        for _ in 0..LOAD_ATTEMPTS_MAX {
            let need = {
                let mut st = self.shared.state.lock();
                st.check_range(id, lba, n)?;
                st.check_writable(id)?;
                st.check_epoch(id, epoch)?;
                let need = st.missing_pages(id.0, lba.0, lba.0 + n);
                if need.0.is_empty() {
                    return f(&mut st);
                }
                need
            };
            self.load(need).await?;
        }
        Err(StoreError::DiskGroupFailed {
            reason: "index cache too small for one write".into(),
        })
    }

    /// A lone request is committed on the caller's thread (as a lone read
    /// is read on it: see [`InlineCommit`]), and is returned for that once
    /// the lock is released; otherwise it joins the log writer's queue.
    fn commit_or_queue(&self, st: &mut State, req: Request) -> Option<Request> {
        if engine::can_commit_inline(&self.shared, st) {
            st.log_writing = true;
            Some(req)
        } else {
            Self::enqueue(st, &self.shared, req);
            None
        }
    }

    /// Stores a large write straight on the capacity tier: newly allocated
    /// blocks (free in the committed state, so neither the index nor a
    /// replay of the log reaches them) are written and synced first, then
    /// one log entry per block names where it lies, and the write is
    /// acknowledged when that record is durable. The data reaches the
    /// devices once, and the destager only moves index entries. The caller
    /// holds the component's lock. Returns false, having changed nothing,
    /// when the write should take the log instead: too little free space
    /// beyond what the destager keeps for itself, free space too scattered
    /// ([`PLACED_RUNS_MAX`]), or a capacity device failed under it.
    async fn write_placed(
        &self,
        id: ComponentId,
        lba: Lba,
        data: &Bytes,
        epoch: Epoch,
    ) -> Result<bool, StoreError> {
        let n = data.len() as u64 / BLOCK_BYTES;
        let locs = self
            .with_write_pages(id, lba, n, epoch, |st| {
                st.check_write_space(id, lba, n)?;
                if st.alloc.free_blocks() < n + PLACED_RESERVE_BLOCKS {
                    return Ok(None);
                }
                let locs = st.alloc.allocate(n as usize);
                // Each run of adjacent blocks is one device write on one
                // thread: in free space full of holes (after random
                // overwrites) the log, written in one piece and destaged by
                // several writers at once, is faster.
                match locs {
                    Some(l) if placed_runs(&l).len() > PLACED_RUNS_MAX => {
                        st.alloc.free_all(&l);
                        Ok(None)
                    }
                    other => Ok(other),
                }
            })
            .await?;
        let Some(locs) = locs else {
            return Ok(false);
        };
        let _in_flight = InFlight::count(&self.shared.placed_in_flight);
        let (tx, rx) = tokio::sync::oneshot::channel();
        match &self.shared.ring {
            Some(ring) if can_place_through_ring(&self.shared, data, &locs) => {
                place_through_ring(&self.shared, ring, data, &locs, tx);
            }
            _ => {
                let (shared, job_data, job_locs) =
                    (self.shared.clone(), data.clone(), locs.clone());
                self.shared.readers.submit(Box::new(move || {
                    let _ = tx.send(store_placed(&shared, &job_data, &job_locs));
                }));
            }
        }
        let crcs = match rx.await {
            Ok(Ok(crcs)) => crcs,
            Ok(Err((device, reason))) => {
                let mut st = self.shared.state.lock();
                st.alloc.free_all(&locs);
                st.fail_capacity_device(device, &reason);
                return Ok(false);
            }
            Err(_) => {
                self.shared.state.lock().alloc.free_all(&locs);
                return Err(StoreError::DiskGroupFailed {
                    reason: "a device thread stopped".into(),
                });
            }
        };
        let blocks: Vec<(BlockLoc, u32)> = locs.iter().copied().zip(crcs).collect();
        let staged = self.stage_placed(id, lba, epoch, &blocks).await;
        if staged.is_err() {
            self.shared.state.lock().alloc.free_all(&locs);
        }
        let (rx, inline) = staged?;
        if let Some(req) = inline {
            InlineCommit::new(&self.shared, req).run().await;
        }
        Self::wait(rx).await.map(|()| true)
    }

    /// Puts a placed write's blocks into the overlay and its record in line
    /// for the log (in log order with every other write: the write takes
    /// effect here, not when its data reached the device). Changes nothing
    /// on error.
    async fn stage_placed(
        &self,
        id: ComponentId,
        lba: Lba,
        epoch: Epoch,
        blocks: &[(BlockLoc, u32)],
    ) -> Result<(Acknowledgement, Option<Request>), StoreError> {
        let n = blocks.len() as u64;
        self.with_write_pages(id, lba, n, epoch, |st| {
            let ops = st.stage_placed(id, lba, blocks, epoch, true)?;
            st.log_stats.placed_writes += 1;
            st.log_stats.placed_blocks += n;
            let (req, rx) = write_request(
                id,
                lba,
                epoch,
                &ops,
                |i| (LogOp::Place { crc: blocks[i].1 }, blocks[i].0.pack(0)),
                Vec::new(),
            );
            Ok((rx, self.commit_or_queue(st, req)))
        })
        .await
    }

    /// Plans a scrub of blocks (the caller holds the component's lock).
    pub(crate) async fn plan_for_scrub(
        &self,
        id: ComponentId,
        lba: Lba,
        n: u64,
    ) -> Result<Vec<Source>, StoreError> {
        Ok(self.plan(id, lba, n, false).await?.0)
    }

    /// Plans a read, loading index pages as needed. With `cached`, blocks
    /// the content cache holds are taken from it (in the same step that
    /// reads the index, under the state lock), and the plan comes with what
    /// the read does next in the cache: wait for blocks another read is
    /// fetching, insert the blocks it reads (see `crate::content`).
    async fn plan(
        &self,
        id: ComponentId,
        lba: Lba,
        n: u64,
        cached: bool,
    ) -> Result<(Vec<Source>, Option<Resolved>), StoreError> {
        for _ in 0..LOAD_ATTEMPTS_MAX {
            let need = {
                let mut st = self.shared.state.lock();
                st.check_range(id, lba, n)?;
                let need = st.missing_pages(id.0, lba.0, lba.0 + n);
                if need.0.is_empty() {
                    let mut plan = st.plan_read(id, lba, n)?;
                    if !cached {
                        return Ok((plan, None));
                    }
                    let resolved = self.shared.content.resolve(&mut plan);
                    return Ok((plan, Some(resolved)));
                }
                need
            };
            self.load(need).await?;
        }
        Err(StoreError::DiskGroupFailed {
            reason: "index cache too small for one read".into(),
        })
    }

    /// Reads blocks, each verified against its CRC32C. Unwritten blocks read
    /// as zeros. A block that fails its checksum fails the whole read with
    /// [`StoreError::Checksum`] naming it; no data is returned. At most
    /// 4 x [`WRITE_BYTES_MAX`] bytes per call.
    pub async fn read(&self, id: ComponentId, lba: Lba, blocks: u32) -> Result<Bytes, StoreError> {
        self.read_blocks(id, lba, blocks, ReadUse::Guest).await
    }

    /// Reads blocks to copy them to another component (resync, rebuild,
    /// evacuation), checked as [`DiskGroup::read`] checks them. They are
    /// read once: they skip the content cache (neither looked up nor kept,
    /// so a rebuild does not evict what guests share), and runs of blocks on
    /// a device are read past the host's page cache.
    pub async fn read_for_copy(
        &self,
        id: ComponentId,
        lba: Lba,
        blocks: u32,
    ) -> Result<Bytes, StoreError> {
        self.read_blocks(id, lba, blocks, ReadUse::Copy).await
    }

    async fn read_blocks(
        &self,
        id: ComponentId,
        lba: Lba,
        blocks: u32,
        read_use: ReadUse,
    ) -> Result<Bytes, StoreError> {
        let n = blocks as u64;
        if n == 0 {
            return Ok(Bytes::new());
        }
        if n * BLOCK_BYTES > WRITE_BYTES_MAX * 4 {
            return Err(StoreError::Misaligned {
                component: id,
                lba,
                problem: format!("read of {blocks} blocks is too large"),
            });
        }
        let lock = self.component_lock(id)?;
        let _guard = lock.read().await;
        // A block can move between planning and reading (destage, then a
        // checkpoint frees its old place): a mismatch is retried once with a
        // fresh plan before it counts.
        let mut last_bad = None;
        for _ in 0..2 {
            let (mut plan, resolved) = self.plan(id, lba, n, read_use == ReadUse::Guest).await?;
            let fill = match resolved {
                Some(r) => {
                    // Blocks another read is fetching: it hands them over
                    // (that read waits for nothing), or fails and they are
                    // read here.
                    let (mut joined, mut fetched) = (0, 0);
                    for (i, answer) in r.waits {
                        match answer.await {
                            Ok(Some(b)) => {
                                plan[i] = Source::Cached(b);
                                joined += 1;
                            }
                            _ => fetched += 1,
                        }
                    }
                    if joined + fetched > 0 {
                        self.shared.content.count_waited(joined, fetched);
                    }
                    r.fill
                }
                None => None,
            };
            match self.fetch(id, lba, plan, fill, read_use).await? {
                Ok(out) => return Ok(out),
                Err(bad) => last_bad = Some(bad),
            }
        }
        let bad = last_bad.unwrap_or(lba);
        Err(StoreError::Checksum {
            component: id,
            lba: bad,
        })
    }

    /// Reads the planned blocks; Ok(Err(lba)) names the first block that
    /// failed its checksum. Blocks read from a device go into the content
    /// cache through `fill`, if the read has one.
    async fn fetch(
        &self,
        id: ComponentId,
        lba: Lba,
        plan: Vec<Source>,
        mut fill: Option<Fill>,
        read_use: ReadUse,
    ) -> Result<Result<Bytes, Lba>, StoreError> {
        let shared = self.shared.clone();
        let disk_blocks = plan
            .iter()
            .filter(|s| matches!(s, Source::Disk(..)))
            .count();
        // Only blocks the content cache did not hold count: a read served
        // from memory never waits for a reader thread.
        // A guest's one-block read whose block the host's page cache holds
        // is served on the calling thread at once, busy or not: the kernel
        // copies it out or says it would have to read the device.
        // Otherwise a lone read runs on the calling thread: handing it to a
        // reader thread and back costs two cross-core wake-ups, more than
        // the read.
        // It decides at the end of its task's plugged poll (or, unplugged,
        // after yielding once), so the reads its task starts next (a
        // connection polls its requests one after another in one task) count
        // as in flight before it decides, instead of each finding itself
        // alone and blocking the task in turn. As soon as another read is in
        // flight (inline or on a reader thread), reads go to the reader
        // threads, so they reach the device together and no runtime thread
        // sits blocked in a device read while completions wait for it.
        let result = if disk_blocks == 0 {
            assemble(&shared, lba, plan, fill, read_use)
        } else if let Some(done) = read_block_if_cached(&shared, lba, &plan, &mut fill, read_use) {
            // The page cache had it: no hand-off, whatever else is in flight.
            done
        } else {
            let (_in_flight, before) = InFlight::count(&self.shared.reads_in_flight);
            let first = before == 0;
            let (tx, rx) = tokio::sync::oneshot::channel();
            let read = DeviceRead {
                shared: shared.clone(),
                lba,
                plan,
                fill,
                read_use,
                tx,
            };
            if first && disk_blocks == 1 && tessera_env::plug::is_open() {
                // Decided at the end of the task's plugged poll, once the
                // reads it starts next count: no trip through the scheduler.
                let decide = move || {
                    if read.shared.reads_in_flight.load(Ordering::Acquire) == 1 {
                        read.here();
                    } else {
                        read.hand_off();
                    }
                };
                if let Err(decide) = tessera_env::plug::defer(decide) {
                    decide();
                }
            } else {
                let alone = first && disk_blocks == 1 && {
                    tokio::task::yield_now().await;
                    self.shared.reads_in_flight.load(Ordering::Acquire) == 1
                };
                if alone {
                    read.here();
                } else {
                    read.hand_off();
                }
            }
            rx.await.map_err(|_| StoreError::DiskGroupFailed {
                reason: "a reader thread stopped".into(),
            })?
        };
        match result {
            Ok(v) => Ok(v),
            Err((device, e)) => {
                self.shared.state.lock().fail_capacity_device(device, &e);
                Err(StoreError::ComponentFailed {
                    component: id,
                    reason: format!("capacity device {device}: {e}"),
                })
            }
        }
    }

    async fn unmap_inner(
        &self,
        id: ComponentId,
        lba: Lba,
        blocks: u64,
        epoch: Epoch,
        op: LogOp,
    ) -> Result<(), StoreError> {
        if blocks == 0 {
            let st = self.shared.state.lock();
            st.check_range(id, lba, 0)?;
            st.check_writable(id)?;
            return st.check_epoch(id, epoch);
        }
        let lock = self.component_lock(id)?;
        let _guard = lock.write().await;
        let (rx, token) = {
            let mut st = self.shared.state.lock();
            st.check_range(id, lba, blocks)?;
            st.check_writable(id)?;
            st.check_epoch(id, epoch)?;
            if let Some(c) = st.components.get_mut(&id.0) {
                c.highest_epoch = c.highest_epoch.max(epoch.0);
            }
            let token = st.next_token;
            st.next_token += 1;
            let (tx, rx) = tokio::sync::oneshot::channel();
            let req = Request {
                entries: vec![op_entry(op, id.0, lba.0, blocks, epoch.0, 0, 0)],
                data: Vec::new(),
                writes: Vec::new(),
                token: Some(token),
                done: Some(tx),
            };
            Self::enqueue(&mut st, &self.shared, req);
            (rx, token)
        };
        let logged = Self::wait(rx).await;
        let applied = if logged.is_ok() {
            self.unmap_apply(id.0, lba.0, lba.0 + blocks).await
        } else {
            Ok(())
        };
        self.shared.state.lock().unapplied.remove(&token);
        logged?;
        applied
    }

    /// Unmaps blocks: they read as zeros and their space returns at once.
    /// Durable when it returns Ok.
    pub async fn unmap(
        &self,
        id: ComponentId,
        lba: Lba,
        blocks: u64,
        epoch: Epoch,
    ) -> Result<(), StoreError> {
        self.unmap_inner(id, lba, blocks, epoch, LogOp::Unmap).await
    }

    /// Zeroes blocks, stored as nothing (like unmap). Durable when Ok.
    pub async fn write_zeroes(
        &self,
        id: ComponentId,
        lba: Lba,
        blocks: u64,
        epoch: Epoch,
    ) -> Result<(), StoreError> {
        self.unmap_inner(id, lba, blocks, epoch, LogOp::WriteZeroes)
            .await
    }

    /// Makes LBAs `[dst_lba, dst_lba + blocks)` of `dst` hold what LBAs
    /// `[src_lba, src_lba + blocks)` of `src` hold, by sharing the stored
    /// blocks: no data moves and no capacity block is used, only log entries
    /// and index entries (holes stay holes). `src` may be `dst`, but the two
    /// ranges must not overlap. `epoch` is checked against `dst` like a
    /// write's. At most [`crate::CLONE_BLOCKS_MAX`] blocks per call. Durable
    /// when it returns Ok; on Err nothing changed.
    ///
    /// Both components are locked against every other operation while the
    /// copy runs. A source block not yet in a committed checkpoint (written
    /// moments ago) is first brought there: the call then waits for the
    /// destager and one checkpoint. The copied blocks count as allocated in
    /// `dst` (see [`DiskGroupSpace`]): overwriting a shared block needs a
    /// block of its own, and the space for it is held from the start.
    pub async fn clone_blocks(
        &self,
        src: ComponentId,
        src_lba: Lba,
        dst: ComponentId,
        dst_lba: Lba,
        blocks: u64,
        epoch: Epoch,
    ) -> Result<(), StoreError> {
        {
            let st = self.shared.state.lock();
            st.check_range(src, src_lba, blocks)?;
            st.check_range(dst, dst_lba, blocks)?;
            st.check_writable(dst)?;
            st.check_epoch(dst, epoch)?;
        }
        if blocks == 0 {
            return Ok(());
        }
        if blocks > crate::CLONE_BLOCKS_MAX {
            return Err(StoreError::Misaligned {
                component: dst,
                lba: dst_lba,
                problem: format!(
                    "a copy by reference of {blocks} blocks: at most {} per call",
                    crate::CLONE_BLOCKS_MAX
                ),
            });
        }
        if src == dst && src_lba.0 < dst_lba.0 + blocks && dst_lba.0 < src_lba.0 + blocks {
            return Err(StoreError::Misaligned {
                component: dst,
                lba: dst_lba,
                problem: format!(
                    "a copy by reference of {blocks} blocks from {src_lba} overlaps its own destination"
                ),
            });
        }
        // Exclusive locks, taken in component order so two copies in
        // opposite directions cannot deadlock: the source must not change
        // between planning and applying (its blocks are named in the log).
        let mut ids = vec![src, dst];
        ids.sort();
        ids.dedup();
        let locks = ids
            .iter()
            .map(|id| self.component_lock(*id))
            .collect::<Result<Vec<_>, _>>()?;
        let mut guards = Vec::with_capacity(locks.len());
        for lock in &locks {
            guards.push(lock.write().await);
        }
        const CHECKPOINT_POLL: Duration = Duration::from_millis(2);
        let (rx, token, entries) = loop {
            let step = {
                let mut st = self.shared.state.lock();
                st.check_range(src, src_lba, blocks)?;
                st.check_range(dst, dst_lba, blocks)?;
                st.check_writable(dst)?;
                st.check_epoch(dst, epoch)?;
                let mut need = st.missing_pages(src.0, src_lba.0, src_lba.0 + blocks);
                need.0
                    .extend(st.missing_pages(dst.0, dst_lba.0, dst_lba.0 + blocks).0);
                if !need.0.is_empty() {
                    Err(Some(need))
                } else if let Some(entries) =
                    st.plan_clone(src, src_lba, dst, dst_lba, blocks, epoch)?
                {
                    if let Some(c) = st.components.get_mut(&dst.0) {
                        c.highest_epoch = c.highest_epoch.max(epoch.0);
                    }
                    let token = st.next_token;
                    st.next_token += 1;
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let req = Request {
                        entries: entries.clone(),
                        data: Vec::new(),
                        writes: Vec::new(),
                        token: Some(token),
                        done: Some(tx),
                    };
                    Self::enqueue(&mut st, &self.shared, req);
                    Ok((rx, token, entries))
                } else {
                    // Bring the source's blocks into a committed checkpoint.
                    st.checkpoint_wanted = true;
                    self.shared.destage_work.notify_all();
                    Err(None)
                }
            };
            match step {
                Ok(planned) => break planned,
                Err(Some(need)) => self.load(need).await?,
                Err(None) => tokio::time::sleep(CHECKPOINT_POLL).await,
            }
        };
        let logged = Self::wait(rx).await;
        let applied = if logged.is_ok() {
            let shared = self.shared.clone();
            tokio::task::spawn_blocking(move || recovery::apply_clone_blocking(&shared, &entries))
                .await
                .map_err(|e| StoreError::DiskGroupFailed {
                    reason: format!("copy task failed: {e}"),
                })?
        } else {
            Ok(())
        };
        self.shared.state.lock().unapplied.remove(&token);
        drop(guards);
        logged?;
        applied
    }

    /// Every acknowledged operation is already durable; this returns once the
    /// disk group is known healthy, as a barrier for callers that expect one.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.shared.state.lock().check_group()
    }

    /// Moves everything in the write log to the capacity tier and writes a
    /// checkpoint (the log is then empty). Used before a clean shutdown, by
    /// tests and by benchmarks that measure the capacity tier.
    pub async fn settle(&self) -> Result<(), StoreError> {
        let target = {
            let st = self.shared.state.lock();
            st.check_group()?;
            st.head_seq
        };
        const SETTLE_POLL: Duration = Duration::from_millis(2);
        loop {
            {
                let mut st = self.shared.state.lock();
                st.check_group()?;
                if st.tail_seq >= target && st.cache.dirty_count() == 0 {
                    return Ok(());
                }
                let destaged = st.destage.front().is_none_or(|r| r.seq >= target)
                    && st.unapplied.values().all(|(s, _)| *s >= target);
                if destaged {
                    st.checkpoint_wanted = true;
                }
                self.shared.destage_work.notify_all();
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
    }

    /// Raises and persists the component's highest epoch (a new owner
    /// installs itself). A lower epoch fails with [`StoreError::StaleEpoch`].
    pub async fn fence(&self, id: ComponentId, epoch: Epoch) -> Result<(), StoreError> {
        let rx = {
            let mut st = self.shared.state.lock();
            st.check_epoch(id, epoch)?;
            if let Some(c) = st.components.get_mut(&id.0) {
                c.highest_epoch = c.highest_epoch.max(epoch.0);
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            let req = Request {
                entries: vec![op_entry(LogOp::Fence, id.0, 0, 0, epoch.0, 0, 0)],
                data: Vec::new(),
                writes: Vec::new(),
                token: None,
                done: Some(tx),
            };
            Self::enqueue(&mut st, &self.shared, req);
            rx
        };
        Self::wait(rx).await
    }

    /// The component's highest epoch (an error only if the component does
    /// not exist or has failed).
    pub fn epoch(&self, id: ComponentId) -> Result<Epoch, StoreError> {
        let st = self.shared.state.lock();
        Ok(Epoch(st.component(id)?.highest_epoch))
    }

    /// Runs of allocated blocks within `[from, from + blocks)`, in order, as
    /// (first LBA, block count).
    pub async fn allocated(
        &self,
        id: ComponentId,
        from: Lba,
        blocks: u64,
    ) -> Result<Vec<(Lba, u64)>, StoreError> {
        let lock = self.component_lock(id)?;
        let _guard = lock.read().await;
        let end = {
            let st = self.shared.state.lock();
            let c = st.component(id)?;
            from.0.saturating_add(blocks).min(c.blocks())
        };
        let mut runs: Vec<(Lba, u64)> = Vec::new();
        self.per_cached_chunk(
            from.0,
            end,
            "list allocation",
            |st, s, e| {
                st.component(id)?;
                Ok(st.missing_pages(id.0, s, e))
            },
            |st, s, e| st.allocated_runs(id.0, s, e, &mut runs),
        )
        .await?;
        Ok(runs)
    }

    /// Runs `run` on `[from, end)` a chunk of index pages at a time, each
    /// once the pages `need` names for it are cached (read as needed; they
    /// may be dropped again after the chunk, so memory stays within the
    /// cache's budget however long the range). `what` names the work in
    /// the error of a cache too small for one chunk.
    pub(crate) async fn per_cached_chunk(
        &self,
        from: u64,
        end: u64,
        what: &str,
        need: impl Fn(&State, u64, u64) -> Result<crate::state::Need, StoreError>,
        mut run: impl FnMut(&State, u64, u64),
    ) -> Result<(), StoreError> {
        let chunk = crate::recovery::UNMAP_CHUNK_PAGES * LBAS_PER_PAGE;
        let mut s = from;
        while s < end {
            let e = end.min((s / chunk + 1) * chunk);
            let mut done = false;
            for _ in 0..LOAD_ATTEMPTS_MAX {
                let missing = {
                    let st = self.shared.state.lock();
                    let missing = need(&st, s, e)?;
                    if missing.0.is_empty() {
                        run(&st, s, e);
                        done = true;
                        break;
                    }
                    missing
                };
                self.load(missing).await?;
            }
            if !done {
                return Err(StoreError::DiskGroupFailed {
                    reason: format!("index cache too small to {what}"),
                });
            }
            s = e;
        }
        Ok(())
    }

    /// Space of one component.
    pub fn component_space(&self, id: ComponentId) -> Result<ComponentSpace, StoreError> {
        let st = self.shared.state.lock();
        st.check_group()?;
        let c = st
            .components
            .get(&id.0)
            .ok_or(StoreError::NoSuchComponent { component: id })?;
        Ok(space_of(c))
    }

    /// Space of the disk group.
    pub fn space(&self) -> DiskGroupSpace {
        let st = self.shared.state.lock();
        let capacity = st.usable_blocks;
        let committed = st.committed_blocks();
        let used = st.written_blocks();
        DiskGroupSpace {
            capacity_bytes: capacity * BLOCK_BYTES,
            used_bytes: used * BLOCK_BYTES,
            reserved_bytes: (committed - used) * BLOCK_BYTES,
            free_bytes: capacity.saturating_sub(committed) * BLOCK_BYTES,
            physical_bytes: st.alloc.used_blocks() * BLOCK_BYTES,
        }
    }

    /// Every component.
    pub fn components(&self) -> Vec<ComponentSummary> {
        let st = self.shared.state.lock();
        st.components
            .iter()
            .map(|(id, c)| ComponentSummary {
                id: ComponentId(*id),
                size_bytes: c.size_bytes,
                highest_epoch: Epoch(c.highest_epoch),
                space: space_of(c),
                failed: c.failed.clone(),
            })
            .collect()
    }

    /// Reads the first block of each of its devices: a device that died
    /// while nothing used it fails now (the cache device takes the disk
    /// group with it, a capacity device its components), as it would at
    /// its next I/O, so an idle disk group's failure is found and its
    /// copies rebuilt without waiting for a client. Answers the health.
    pub async fn probe_devices(&self) -> DiskGroupHealth {
        let known: Vec<u8> = {
            let st = self.shared.state.lock();
            if st.failed.is_some() {
                return self.health_of(&st);
            }
            st.failed_devices.keys().copied().collect()
        };
        let shared = self.shared.clone();
        let probed = tokio::task::spawn_blocking(move || {
            let mut failed = Vec::new();
            for (d, disk) in shared.devices.iter().enumerate() {
                if known.contains(&(d as u8)) {
                    continue;
                }
                let mut buf = AlignedBuf::zeroed(BLOCK_BYTES as usize);
                if let Err(e) = disk.read_at(buf.as_mut_slice(), 0) {
                    failed.push((d as u8, e.to_string()));
                }
            }
            failed
        })
        .await
        .unwrap_or_default();
        if !probed.is_empty() {
            let mut st = self.shared.state.lock();
            for (d, reason) in probed {
                let reason = format!("device {d} does not answer: {reason}");
                if d == 0 {
                    st.fail_group(reason);
                } else {
                    st.fail_capacity_device(d, &reason);
                }
            }
        }
        self.health()
    }

    /// Health of the disk group.
    pub fn health(&self) -> DiskGroupHealth {
        let st = self.shared.state.lock();
        self.health_of(&st)
    }

    fn health_of(&self, st: &State) -> DiskGroupHealth {
        if let Some(reason) = &st.failed {
            return DiskGroupHealth::Failed {
                reason: reason.clone(),
            };
        }
        let failed_components: Vec<ComponentId> = st
            .components
            .iter()
            .filter(|(_, c)| c.failed.is_some())
            .map(|(id, _)| ComponentId(*id))
            .collect();
        if st.failed_devices.is_empty() && failed_components.is_empty() {
            return DiskGroupHealth::Healthy;
        }
        DiskGroupHealth::Degraded {
            failed_devices: st
                .failed_devices
                .iter()
                .map(|(d, r)| {
                    (
                        self.shared
                            .devices
                            .get(*d as usize)
                            .map(|x| x.name())
                            .unwrap_or_else(|| format!("device {d}")),
                        r.clone(),
                    )
                })
                .collect(),
            failed_components,
        }
    }

    /// Counters of the write log's group commits since the disk group opened.
    pub fn log_stats(&self) -> LogStats {
        self.shared.state.lock().log_stats
    }

    /// Counters of the content-based read cache since the disk group opened,
    /// with its size and budget now.
    pub fn content_cache_stats(&self) -> ContentCacheStats {
        self.shared.content.stats()
    }

    /// Counters of the index cache (the metadata cache: index pages) since
    /// the disk group opened, with its size and budget now.
    pub fn index_cache_stats(&self) -> crate::IndexCacheStats {
        self.shared.state.lock().cache.stats()
    }

    /// Memory the reference counts of shared blocks take (at most one byte
    /// per capacity block: see `crate::shares`).
    pub fn reference_count_bytes(&self) -> u64 {
        self.shared.state.lock().shares.memory_bytes()
    }

    /// Changes the index cache's budget and how many pages it reads ahead
    /// after a miss, live. Pages beyond a smaller budget are dropped at once
    /// (clean ones; changed ones wait for the next checkpoint).
    pub fn set_index_cache(&self, budget_bytes: u64, prefetch_pages: u64) {
        let mut st = self.shared.state.lock();
        st.cache.set_budget(budget_bytes);
        st.cache.prefetch_pages = prefetch_pages;
        if st.cache.dirty_count() * 2 > st.cache.capacity() {
            // Changed pages cannot be dropped: a checkpoint cleans them.
            st.checkpoint_wanted = true;
            self.shared.destage_work.notify_all();
        }
    }

    /// Changes the content cache's budget in bytes (per-block overhead
    /// included), dropping entries beyond it; 0 disables the cache and frees
    /// what it held.
    pub fn set_content_cache_bytes(&self, bytes: u64) {
        self.shared.content.set_budget(bytes);
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl Drop for DiskGroup {
    /// Stops and joins the workers. The devices, and with them their locks,
    /// close when the last reference to the shared state goes: here, unless a
    /// blocking task of an abandoned operation still runs, which holds them
    /// until it ends.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.log_work.notify_all();
        self.shared.sync_work.notify_all();
        self.shared.destage_work.notify_all();
        self.shared.log_space.notify_all();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        self.shared.readers.stop();
        self.shared.writers.stop();
    }
}

/// Free capacity blocks a placed write leaves to the destager: below this,
/// large writes take the log like small ones, and the destager, which
/// checkpoints to get replaced blocks back when it runs short, finds room.
const PLACED_RESERVE_BLOCKS: u64 = crate::state::HEADROOM_BLOCKS_MIN;

/// Most runs of adjacent blocks a placed write's blocks may fall in; with
/// more, the write takes the log (see `DiskGroup::write_placed`).
const PLACED_RUNS_MAX: usize = 4;

/// Where a write's acknowledgement arrives.
type Acknowledgement = tokio::sync::oneshot::Receiver<Result<(), StoreError>>;

/// The log request of a write staged as operations `ops` of blocks from
/// `lba`: `entry(i)` gives block i's operation and argument, `data` the
/// blocks that follow the record (those of `LogOp::Write` entries).
fn write_request(
    id: ComponentId,
    lba: Lba,
    epoch: Epoch,
    ops: &[u64],
    entry: impl Fn(usize) -> (LogOp, u64),
    data: Vec<Bytes>,
) -> (Request, Acknowledgement) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let req = Request {
        entries: (0..ops.len())
            .map(|i| {
                let (op, arg) = entry(i);
                op_entry(op, id.0, lba.0 + i as u64, 1, epoch.0, arg, 0)
            })
            .collect(),
        data,
        writes: ops
            .iter()
            .enumerate()
            .map(|(i, op)| (id.0, lba.0 + i as u64, *op))
            .collect(),
        token: None,
        done: Some(tx),
    };
    (req, rx)
}

/// One operation counted in an in-flight counter (`reads_in_flight`,
/// `placed_in_flight`) until it is dropped.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    /// Counts one more; returns the guard and the count before it.
    fn count(counter: &'a AtomicUsize) -> (Self, usize) {
        let before = counter.fetch_add(1, Ordering::AcqRel);
        (InFlight(counter), before)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A request its caller commits on its own thread (`engine::commit_inline`)
/// at the end of its task's plugged poll, or after yielding once. A
/// connection serving a queue of requests polls them one after another in
/// one task: committed at its first poll, each would find the log idle
/// again, be written and synced alone, and block the task (and every
/// request behind it) for a device round trip. Deferred, the requests the
/// task starts meanwhile are queued behind this one and go out in its group
/// commit; alone, it is committed with no hand-off to the log writer and a
/// syncer.
struct InlineCommit<'a> {
    shared: &'a Arc<Shared>,
    req: Option<Request>,
}

impl<'a> InlineCommit<'a> {
    fn new(shared: &'a Arc<Shared>, req: Request) -> Self {
        InlineCommit {
            shared,
            req: Some(req),
        }
    }

    async fn run(mut self) {
        // A plugged poll (a connection's requests, `tessera_env::plug`)
        // starts the others first and commits this at its end, with no
        // trip through the scheduler; otherwise the yield gives them the
        // same chance.
        if tessera_env::plug::is_open() {
            if let Some(req) = self.req.take() {
                let shared = Arc::clone(self.shared);
                let deferred =
                    tessera_env::plug::defer(move || engine::commit_inline(&shared, req));
                if let Err(commit) = deferred {
                    commit();
                }
            }
            return;
        }
        tokio::task::yield_now().await;
        if let Some(req) = self.req.take() {
            engine::commit_inline(self.shared, req);
        }
    }
}

impl Drop for InlineCommit<'_> {
    /// Dropped before it committed (its caller's future was dropped during
    /// the yield): the request is staged and holds `log_writing`, so it
    /// goes to the log writer, ahead of the requests queued behind it.
    fn drop(&mut self) {
        if let Some(req) = self.req.take() {
            let mut st = self.shared.state.lock();
            st.queue.push_front(req);
            st.log_writing = false;
            self.shared.log_work.notify_one();
        }
    }
}

/// The runs of adjacent locations in `locs`: `(index of the first, blocks)`
/// each, in order. Each run is one positional device write.
fn placed_runs(locs: &[BlockLoc]) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < locs.len() {
        let first = locs[i];
        let mut n = 1;
        while i + n < locs.len()
            && locs[i + n].device == first.device
            && locs[i + n].block == first.block + n as u64
        {
            n += 1;
        }
        runs.push((i, n));
        i += n;
    }
    runs
}

/// The answer of a placed write's device writes: its blocks' CRC32Cs, or
/// the device that failed and why.
type PlacedAnswer = Result<Vec<u32>, (u8, String)>;

/// Whether every run of a placed write can go through the group's ring:
/// each device takes writes past the page cache without blocking, of the
/// bytes where they lie when they start on a [`DISK_ALIGN`] boundary (as
/// the NBD server and the transport read large payloads), of a copy
/// otherwise, and always of a copy on an encrypted device, which encrypts
/// into it.
fn can_place_through_ring(shared: &Shared, data: &Bytes, locs: &[BlockLoc]) -> bool {
    let aligned = (data.as_ptr() as usize).is_multiple_of(DISK_ALIGN);
    placed_runs(locs).iter().all(|&(i, n)| {
        shared.disk(locs[i].device).is_some_and(|d| {
            let (len, offset) = (n * BLOCK, locs[i].block * BLOCK_BYTES);
            (aligned && d.uncached_write_fd(len, offset).is_some())
                || d.can_prepare_uncached_write(len, offset)
        })
    })
}

/// Writes a placed write's blocks to `locs` through the group's ring: each
/// run submitted at once from the caller's thread (where its bytes lie, or
/// as a copy: encrypted on an encrypted device), past the page cache and
/// not flushed (the commit of the write's record syncs the device, beside
/// the record's own write), so no device thread is woken and none wakes
/// the caller back (two thread hand-offs per write, each costing about as
/// much CPU as the write's own system calls on a virtual machine). `tx`
/// gets the blocks' CRC32Cs (taken here, before the writes start) once
/// every run has ended, or the first device that failed. A run the ring
/// refuses (too many writes in flight, a device tripped meanwhile) is
/// written on a device thread instead.
fn place_through_ring(
    shared: &Arc<Shared>,
    ring: &tessera_env::IoRing,
    data: &Bytes,
    locs: &[BlockLoc],
    tx: tokio::sync::oneshot::Sender<PlacedAnswer>,
) {
    let runs = placed_runs(locs);
    let gather = Arc::new(PlacedRuns(Mutex::new(PlacedLeft {
        runs: runs.len(),
        failed: None,
        crcs: data.chunks(BLOCK).map(block_crc).collect(),
        tx: Some(tx),
    })));
    for (i, n) in runs {
        let device = locs[i].device;
        let offset = locs[i].block * BLOCK_BYTES;
        let Some(disk) = shared.disk(device) else {
            gather.ended(device, Err("no such capacity device".into()));
            continue;
        };
        let run = data.slice(i * BLOCK..(i + n) * BLOCK);
        let ended = Arc::clone(&gather);
        // Said as the blocking path says it: which device, where, what.
        let named = Arc::clone(disk);
        let on_done: tessera_env::WriteDone = Box::new(move |r| {
            let len = n * BLOCK;
            let r =
                r.map_err(|e| format!("{}: write of {len} bytes at {offset}: {e}", named.name()));
            ended.ended(device, r);
        });
        // Where they lie if the device takes them so, else a copy; not
        // flushed (the record's commit syncs the device).
        let submitted =
            ring.write_uncached(disk, run, offset, on_done)
                .or_else(|(run, on_done)| {
                    ring.write_uncached_copy(disk, &run, offset, on_done)
                        .map_err(|on_done| (run, on_done))
                });
        if let Err((run, refused)) = submitted {
            drop(refused);
            let ended = Arc::clone(&gather);
            let disk = Arc::clone(disk);
            shared.readers.submit(Box::new(move || {
                let written = disk.write_uncached_at(&run, offset);
                // The device's own error names it and the range.
                ended.ended(device, written.map_err(|e| e.to_string()));
            }));
        }
    }
}

/// The runs of one placed write still being written through the ring.
struct PlacedRuns(Mutex<PlacedLeft>);

struct PlacedLeft {
    runs: usize,
    failed: Option<(u8, String)>,
    crcs: Vec<u32>,
    tx: Option<tokio::sync::oneshot::Sender<PlacedAnswer>>,
}

impl PlacedRuns {
    /// One run ended; the last one answers the write.
    fn ended(&self, device: u8, result: Result<(), String>) {
        let mut left = self.0.lock();
        if let Err(reason) = result {
            left.failed.get_or_insert((device, reason));
        }
        left.runs = left.runs.saturating_sub(1);
        if left.runs == 0 {
            let answer = match left.failed.take() {
                Some(failed) => Err(failed),
                None => Ok(std::mem::take(&mut left.crcs)),
            };
            if let Some(tx) = left.tx.take() {
                let _ = tx.send(answer);
            }
        }
    }
}

/// Writes a placed write's blocks to `locs` (block i to `locs[i]`, each
/// run of adjacent locations with one positional write), on a device
/// thread, without a sync: the commit of the write's record syncs the
/// devices (`engine::sync_placed`). Returns the blocks' CRC32Cs, or the
/// device that failed.
fn store_placed(shared: &Shared, data: &[u8], locs: &[BlockLoc]) -> PlacedAnswer {
    let crcs = data.chunks(BLOCK).map(block_crc).collect();
    for (i, n) in placed_runs(locs) {
        let first = locs[i];
        let disk = shared
            .disk(first.device)
            .ok_or_else(|| (first.device, "no such capacity device".to_string()))?;
        let bytes = &data[i * BLOCK..(i + n) * BLOCK];
        // Past the page cache: copying large writes into it cost more CPU
        // than the rest of their way through the store, and the sync below
        // would then write back every dirty page of the device. Direct I/O
        // needs an aligned buffer; a network buffer rarely is one.
        let result = if (bytes.as_ptr() as usize).is_multiple_of(DISK_ALIGN) {
            disk.write_uncached_at(bytes, first.block * BLOCK_BYTES)
        } else {
            let buf = AlignedBuf::copy_of(bytes);
            disk.write_uncached_at(buf.as_slice(), first.block * BLOCK_BYTES)
        };
        result.map_err(|e| (first.device, e.to_string()))?;
    }
    Ok(crcs)
}

fn space_of(c: &Component) -> ComponentSpace {
    ComponentSpace {
        logical_bytes: c.size_bytes,
        allocated_bytes: c.allocated * BLOCK_BYTES,
        physical_bytes: c.physical * BLOCK_BYTES,
        reserved_bytes: c.reserve_bytes,
    }
}

fn all_devices(devices: &GroupDevices) -> Vec<Arc<dyn Disk>> {
    let mut all = vec![devices.cache.clone()];
    all.extend(devices.capacity.iter().cloned());
    all
}

/// What [`assemble`] answers: the blocks, or the first that failed its
/// check, or a device error.
type Assembled = Result<Result<Bytes, Lba>, (u8, String)>;

/// A read that has to reach a device, with where its answer goes.
struct DeviceRead {
    shared: Arc<Shared>,
    lba: Lba,
    plan: Vec<Source>,
    fill: Option<Fill>,
    read_use: ReadUse,
    tx: tokio::sync::oneshot::Sender<Assembled>,
}

impl DeviceRead {
    /// Reads on the calling thread.
    fn here(self) {
        let answer = assemble(&self.shared, self.lba, self.plan, self.fill, self.read_use);
        let _ = self.tx.send(answer);
    }

    /// Reads without the calling thread waiting: a guest's read of one
    /// block through the group's ring (the kernel completes it when the
    /// page is in, and the answer is checked on the ring's reaper, with no
    /// thread woken for it), anything else on a reader thread.
    fn hand_off(self) {
        let DeviceRead {
            shared,
            lba,
            plan,
            fill,
            read_use,
            tx,
        } = self;
        if let (Some(ring), ReadUse::Guest, [Source::Disk(loc, crc)]) =
            (&shared.ring, read_use, &plan[..])
        {
            let (loc, crc) = (*loc, *crc);
            let place = shared.disk(loc.device).and_then(|disk| {
                let place = ring.reserve_read(disk, BLOCK, loc.block * BLOCK_BYTES)?;
                Some((place, Arc::clone(disk)))
            });
            if let Some((place, disk)) = place {
                // Read into a buffer the block keeps: the caller and the
                // content cache get it as the kernel filled it.
                let into = fill
                    .as_ref()
                    .and_then(Fill::spare_block)
                    .unwrap_or_else(|| Vec::with_capacity(BLOCK));
                place.submit(
                    into,
                    Box::new(move |read| {
                        let answer = match read {
                            Ok(block) => Ok(checked_block(block, loc, crc, lba, fill)),
                            // Said as the blocking read says it (the device's
                            // name taken only then).
                            Err(e) => Err((
                                loc.device,
                                format!(
                                    "read on {} at byte {} (+{BLOCK}) failed: {e}",
                                    disk.name(),
                                    loc.block * BLOCK_BYTES
                                ),
                            )),
                        };
                        let _ = tx.send(answer);
                    }),
                );
                return;
            }
        }
        let readers = Arc::clone(&shared);
        readers.readers.submit(Box::new(move || {
            let _ = tx.send(assemble(&shared, lba, plan, fill, read_use));
        }));
    }
}

/// Reads the planned blocks and checks them. `Err((device, message))` is a
/// device error; `Ok(Err(lba))` a checksum mismatch. With a `fill`, every
/// block read from a device that passes its check goes into the content
/// cache as a buffer of its own (never a slice of the read's buffer) and to
/// the reads waiting for it; the fill is dropped when the read ends, which
/// ends the waits it did not answer.
fn assemble(
    shared: &Shared,
    lba: Lba,
    plan: Vec<Source>,
    fill: Option<Fill>,
    read_use: ReadUse,
) -> Assembled {
    let n = plan.len();
    // Fast path: one block.
    if n == 1 {
        return Ok(match plan.into_iter().next() {
            Some(Source::Zero) | None => Ok(Bytes::from(vec![0u8; BLOCK])),
            Some(Source::Memory(b, crc)) => {
                if block_crc(&b) == crc {
                    Ok(b)
                } else {
                    Err(lba)
                }
            }
            Some(Source::Cached(b)) => Ok(b),
            Some(Source::Lost) => Err(lba),
            Some(Source::Disk(loc, crc)) => BLOCK_SCRATCH.with_borrow_mut(|scratch| {
                // Read into this thread's aligned block and copied once into
                // a buffer of its own: no aligned buffer is allocated and
                // zeroed per read.
                let buf = scratch.as_mut_slice();
                read_loc(shared, loc, buf, read_use)?;
                Ok(checked_block(own_copy(buf, &fill), loc, crc, lba, fill))
            })?,
        });
    }
    // Aligned, so runs of blocks on a device are read straight into it;
    // built in order by appending, so nothing is zeroed that a device read
    // fills next.
    let mut out = AlignedBuf::with_capacity(n * BLOCK);
    let mut fills = Vec::new();
    let mut i = 0;
    while i < n {
        match &plan[i] {
            Source::Zero => out.extend_zeroed(BLOCK),
            Source::Lost => return Ok(Err(Lba(lba.0 + i as u64))),
            Source::Memory(b, crc) => {
                if block_crc(b) != *crc {
                    return Ok(Err(Lba(lba.0 + i as u64)));
                }
                out.extend_from_slice(b);
            }
            Source::Cached(b) => out.extend_from_slice(b),
            Source::Disk(first, _) => {
                // Coalesce physically adjacent blocks into one read.
                let mut run = 1;
                while i + run < n {
                    match &plan[i + run] {
                        Source::Disk(l, _)
                            if l.device == first.device && l.block == first.block + run as u64 =>
                        {
                            run += 1
                        }
                        _ => break,
                    }
                }
                read_loc_appending(shared, *first, run, &mut out, read_use)?;
                let run_bytes = &out.as_slice()[i * BLOCK..(i + run) * BLOCK];
                for k in 0..run {
                    let crc = match &plan[i + k] {
                        Source::Disk(_, c) => *c,
                        _ => 0,
                    };
                    let b = &run_bytes[k * BLOCK..(k + 1) * BLOCK];
                    if block_crc(b) != crc {
                        return Ok(Err(Lba(lba.0 + (i + k) as u64)));
                    }
                    if let Some(fill) = &fill {
                        let loc = BlockLoc {
                            device: first.device,
                            block: first.block + k as u64,
                        };
                        fills.push((loc, crc, fill.own_block(b)));
                    }
                }
                i += run;
                continue;
            }
        }
        i += 1;
    }
    if let Some(mut fill) = fill {
        fill.fill(fills);
    }
    Ok(Ok(out.into_bytes()))
}

thread_local! {
    /// One aligned block per reading thread, for single-block reads.
    static BLOCK_SCRATCH: std::cell::RefCell<AlignedBuf> =
        std::cell::RefCell::new(AlignedBuf::zeroed(BLOCK));
    /// One block per thread that asks the page cache for a block
    /// ([`read_block_if_cached`]); a buffer of its own, exactly one block
    /// long, which becomes the block read when the page cache has it.
    static PROBE_BLOCK: std::cell::RefCell<Vec<u8>> =
        std::cell::RefCell::new(vec![0; BLOCK]);
}

fn read_loc(
    shared: &Shared,
    loc: BlockLoc,
    buf: &mut [u8],
    read_use: ReadUse,
) -> Result<(), (u8, String)> {
    device_of(shared, loc)?
        .read_via(buf, loc.block * BLOCK_BYTES, read_use.via())
        .map_err(|e| (loc.device, e.to_string()))
}

/// The device `loc` is on.
fn device_of(shared: &Shared, loc: BlockLoc) -> Result<&Arc<dyn Disk>, (u8, String)> {
    shared
        .disk(loc.device)
        .ok_or_else(|| (loc.device, format!("no device {}", loc.device)))
}

/// A block read from a device, in a buffer of its own of exactly 4 KiB,
/// checked against its CRC; one that passes the content cache shares
/// through `fill`, with the caller.
fn checked_block(
    block: Bytes,
    loc: BlockLoc,
    crc: u32,
    lba: Lba,
    fill: Option<Fill>,
) -> Result<Bytes, Lba> {
    if block_crc(&block) != crc {
        return Err(lba);
    }
    if let Some(mut fill) = fill {
        fill.fill(vec![(loc, crc, block.clone())]);
    }
    Ok(block)
}

/// A copy of a block read into a thread's scratch buffer, in a buffer of
/// its own (a spare of the content cache's where there is a cache).
fn own_copy(buf: &[u8], fill: &Option<Fill>) -> Bytes {
    match fill {
        Some(fill) => fill.own_block(buf),
        None => Bytes::copy_from_slice(buf),
    }
}

/// Asks the page cache to read in the window around `loc` that starts at
/// byte `start`.
fn read_around(shared: &Shared, loc: BlockLoc, start: u64) {
    if let Ok(disk) = device_of(shared, loc) {
        disk.read_around(start, crate::read_around::ReadAround::WINDOW_BYTES);
    }
}

/// A guest's read of one block on a device, served on the calling thread
/// if the host's page cache holds the block (`Disk::read_at_if_cached`):
/// `None`, with nothing done but asking the page cache to read the blocks
/// around it in, when the device would have to be read, or when the page
/// cache is not asked (`page_probe`: its probes missed many times in a
/// row).
fn read_block_if_cached(
    shared: &Shared,
    lba: Lba,
    plan: &[Source],
    fill: &mut Option<Fill>,
    read_use: ReadUse,
) -> Option<Result<Result<Bytes, Lba>, (u8, String)>> {
    let ([Source::Disk(loc, crc)], ReadUse::Guest) = (plan, read_use) else {
        return None;
    };
    let window = shared
        .read_around
        .on_read(loc.device, loc.block * BLOCK_BYTES);
    if !shared.page_probe.should_probe() {
        if let Around::Read(start) = window {
            read_around(shared, *loc, start);
        }
        return None;
    }
    PROBE_BLOCK.with_borrow_mut(|probe| {
        let cached = device_of(shared, *loc).and_then(|disk| {
            disk.read_at_if_cached(probe, loc.block * BLOCK_BYTES)
                .map_err(|e| (loc.device, e.to_string()))
        });
        if let Ok(hit) = cached {
            shared.page_probe.probed(hit);
        }
        match cached {
            Ok(false) => {
                // A window read around lately whose block is not in: the
                // page cache dropped it, or is still reading it in (then
                // asking again costs no device read).
                if let Around::Read(start) | Around::Again(start) = window {
                    read_around(shared, *loc, start);
                }
                None
            }
            Ok(true) => {
                // The probe's buffer becomes the block as it is, and the
                // thread's next probe gets another: a spare of the content
                // cache's where it keeps one (its old bytes are overwritten
                // by the probe, so it is never cleared).
                let next = fill
                    .as_ref()
                    .and_then(Fill::spare_block)
                    .unwrap_or_else(|| vec![0; BLOCK]);
                debug_assert_eq!(next.len(), BLOCK);
                let block = Bytes::from(std::mem::replace(probe, next));
                Some(Ok(checked_block(block, *loc, *crc, lba, fill.take())))
            }
            Err(e) => Some(Err(e)),
        }
    })
}

/// Appends `blocks` blocks read from `loc` on to `out`.
fn read_loc_appending(
    shared: &Shared,
    loc: BlockLoc,
    blocks: usize,
    out: &mut AlignedBuf,
    read_use: ReadUse,
) -> Result<(), (u8, String)> {
    device_of(shared, loc)?
        .read_appending(out, blocks * BLOCK, loc.block * BLOCK_BYTES, read_use.via())
        .map_err(|e| (loc.device, e.to_string()))
}

/// Who a read is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ReadUse {
    /// A guest (or anything that may read the blocks again): through the
    /// content cache and the page cache.
    Guest,
    /// A copy to another component: each block read once.
    Copy,
}

impl ReadUse {
    /// Which way its device reads go: a copy's past the page cache.
    fn via(self) -> ReadVia {
        match self {
            ReadUse::Guest => ReadVia::PageCache,
            ReadUse::Copy => ReadVia::Uncached,
        }
    }
}

/// The ring lone commits are written through, if the cache device can
/// take writes that way (a file or block device, encrypted or not: not one
/// in memory) and this kernel and runtime offer one (see
/// `tessera_env::IoRing`). The device is asked to ready a block, which is
/// then dropped unwritten.
fn open_ring(cache: &Arc<dyn Disk>) -> Option<tessera_env::IoRing> {
    cache
        .prepare_durable_write(AlignedBuf::zeroed(BLOCK), 0)
        .ok()?;
    match tessera_env::IoRing::new() {
        Ok(ring) => Some(ring),
        Err(e) => {
            tracing::info!(error = %e, "no io_uring: lone commits are written on their caller's thread");
            None
        }
    }
}

/// Mounts: superblocks, checkpoint, committed index, log replay.
fn mount(devices: Vec<Arc<dyn Disk>>, index_cache_bytes: u64) -> Result<Arc<Shared>, StoreError> {
    let (geo, _uuid, _name): (Geometry, u128, String) = recovery::read_geometry(&devices)?;
    let ck = recovery::read_checkpoint(&devices[0], &geo)?;
    let content = Arc::new(ContentCache::new(crate::CONTENT_CACHE_BYTES_DEFAULT));
    let state = recovery::load_state(&devices, &geo, &ck, index_cache_bytes, content.clone());
    let placed_syncs = devices.iter().map(|_| SharedSync::default()).collect();
    let ring = open_ring(&devices[0]);
    let shared = Arc::new(Shared {
        devices,
        geo,
        state: Mutex::new(state),
        log_work: Condvar::new(),
        sync_work: Condvar::new(),
        destage_work: Condvar::new(),
        log_space: Condvar::new(),
        stop: AtomicBool::new(false),
        ack_before_durable: AtomicBool::new(false),
        reads_in_flight: std::sync::atomic::AtomicUsize::new(0),
        page_probe: Default::default(),
        read_around: Default::default(),
        placed_in_flight: std::sync::atomic::AtomicUsize::new(0),
        readers: DeviceThreads::start("store-read", READER_THREADS, Work::Serving)
            .map_err(|e| StoreError::Config(format!("cannot start the reader threads: {e}")))?,
        writers: DeviceThreads::start("store-write", WRITER_THREADS, Work::Background)
            .map_err(|e| StoreError::Config(format!("cannot start the writer threads: {e}")))?,
        placed_syncs,
        scrub: ScrubCounters::default(),
        content,
        ring,
    });
    let replayed = recovery::replay(&shared)?;
    let cleared = recovery::clear_unsynced_records(&shared)?;
    tracing::info!(replayed, cleared, "disk group mounted");
    Ok(shared)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_adjacent_blocks_on_one_device() {
        let at = |device: u8, block: u64| BlockLoc { device, block };
        assert_eq!(placed_runs(&[]), vec![]);
        assert_eq!(placed_runs(&[at(1, 5)]), vec![(0, 1)]);
        assert_eq!(placed_runs(&[at(1, 5), at(1, 6), at(1, 7)]), vec![(0, 3)]);
        assert_eq!(placed_runs(&[at(1, 5), at(1, 7)]), vec![(0, 1), (1, 1)]);
        assert_eq!(placed_runs(&[at(1, 5), at(2, 6)]), vec![(0, 1), (1, 1)]);
        assert_eq!(placed_runs(&[at(1, 6), at(1, 5)]), vec![(0, 1), (1, 1)]);
        assert_eq!(
            placed_runs(&[at(1, 5), at(1, 6), at(2, 7), at(2, 8), at(1, 7)]),
            vec![(0, 2), (2, 2), (4, 1)]
        );
    }
}
