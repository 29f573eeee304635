//! Formatting new devices and bringing a disk group back after a crash.
//!
//! Owns: the device layout chosen at format time, and mount: superblocks
//! checked, the newest sound checkpoint chosen, the free-space map rebuilt
//! from the committed index, and the write log replayed from the checkpoint's
//! tail. Must not touch: the running store's threads (they start after).
//!
//! Log replay accepts the next record when its header is sound, its sequence
//! is the expected one and its data blocks match their CRCs. At the first
//! record that fails, it looks further: if a record of a later group commit
//! follows, the damaged record had been synced and acknowledged, so the
//! damage is real (its blocks are recorded as lost, or, if the header itself
//! is gone, the disk group fails); otherwise it is the torn tail of the last
//! group commit, which was never acknowledged, and replay ends there.

use crate::alloc::{Allocator, Reference, ReferenceCount};
use crate::at_rest::{AtRestKeys, DataKey, GroupCipher, REKEY_PIECE_BLOCKS};
use crate::content::ContentCache;
use crate::engine::{Geometry, Shared, COMMIT_BLOCKS_MAX, UNSYNCED_BLOCKS_MAX};
use crate::index::{IndexCache, RootEntry, LBAS_PER_PAGE};
use crate::state::{Component, LoggedRecord, SnapshotTable, State, HEADROOM_BLOCKS_MIN};
use crate::StoreError;
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use tessera_env::{AlignedBuf, Disk};
use tessera_format::{
    block_crc, BlockLoc, Checkpoint, DeviceRole, EntryKind, IndexPage, LogEntry, LogOp,
    LogRecordHeader, RootTableRef, Superblock, SuperblockEncryption, BLOCK, CIPHER_AES256_XTS,
    FEATURE_ENCRYPTED,
};
use tessera_types::{ComponentId, Epoch, Lba, BLOCK_BYTES};

/// Index pages the checkpoint area is sized for, per densely written page's
/// worth of capacity: sparse writes use more pages than dense ones.
const ROOT_SLACK: u64 = 4;

/// Components a disk group can hold (sizes the checkpoint area).
pub const COMPONENTS_MAX: u64 = 4096;

/// Smallest write log, in blocks: room for several full group commits.
pub(crate) const LOG_BLOCKS_MIN: u64 = 4 * COMMIT_BLOCKS_MAX;

/// Unmaps are applied this many index pages at a time, so a huge range
/// never needs more of the cache than this.
pub(crate) const UNMAP_CHUNK_PAGES: u64 = 64;

fn bad(disk: &Arc<dyn Disk>, problem: impl Into<String>) -> StoreError {
    StoreError::BadDevice {
        device: disk.name(),
        problem: problem.into(),
    }
}

fn read_block(disk: &Arc<dyn Disk>, block: u64, blocks: usize) -> Result<AlignedBuf, StoreError> {
    let mut buf = AlignedBuf::zeroed(blocks * BLOCK);
    disk.read_at(buf.as_mut_slice(), block * BLOCK as u64)?;
    Ok(buf)
}

fn write_blocks(disk: &Arc<dyn Disk>, block: u64, data: &[u8]) -> Result<(), StoreError> {
    let mut buf = AlignedBuf::zeroed(data.len().div_ceil(BLOCK) * BLOCK);
    buf.as_mut_slice()[..data.len()].copy_from_slice(data);
    disk.write_at(buf.as_slice(), block * BLOCK as u64)?;
    Ok(())
}

/// Reads the superblock of a device: of its two copies, the sound one with
/// the highest sequence (an encrypted group's superblocks are rewritten
/// one copy at a time; see `tessera_format::superblock`).
pub(crate) fn read_superblock(disk: &Arc<dyn Disk>) -> Result<Superblock, StoreError> {
    let buf = read_block(disk, 0, 2)?;
    let first = Superblock::decode(&buf.as_slice()[..BLOCK]);
    let second = Superblock::decode(&buf.as_slice()[BLOCK..]);
    match (first, second) {
        (Ok(a), Ok(b)) => Ok(if b.sequence > a.sequence { b } else { a }),
        (Ok(sb), Err(_)) | (Err(_), Ok(sb)) => Ok(sb),
        (Err(e), Err(_)) => Err(bad(disk, format!("no valid superblock: {e}"))),
    }
}

/// Opens the encryption of a group's devices, if its superblocks say it is
/// encrypted: `None` for a plaintext group. An encrypted group without
/// `keys`, or whose data key none of them sealed, is refused before any
/// block is read; a plaintext group opens whatever `keys` says.
pub(crate) fn unlock(
    devices: &[Arc<dyn Disk>],
    keys: Option<&AtRestKeys>,
) -> Result<Option<GroupCipher>, StoreError> {
    unlock_with(devices, keys, true).map(|(cipher, _)| cipher)
}

/// [`unlock`] for a read-only check: a piece a deep rekey left in its
/// journal is not put back, only named in the notes returned.
pub(crate) fn unlock_read_only(
    devices: &[Arc<dyn Disk>],
    keys: Option<&AtRestKeys>,
) -> Result<(Option<GroupCipher>, Vec<String>), StoreError> {
    unlock_with(devices, keys, false)
}

fn unlock_with(
    devices: &[Arc<dyn Disk>],
    keys: Option<&AtRestKeys>,
    restore: bool,
) -> Result<(Option<GroupCipher>, Vec<String>), StoreError> {
    let sbs = devices
        .iter()
        .map(read_superblock)
        .collect::<Result<Vec<_>, _>>()?;
    if sbs[0].encryption.is_none() {
        return Ok((None, Vec::new()));
    }
    let notes = devices
        .iter()
        .zip(&sbs)
        .filter_map(|(d, sb)| {
            let j = sb.encryption.as_ref()?.journal?;
            Some(format!(
                "{}: blocks {}..{} were being rekeyed when the host stopped; opening the group puts them back",
                d.name(),
                j.start,
                j.start + j.blocks
            ))
        })
        .collect();
    let Some(keys) = keys else {
        let kek = sbs[0]
            .encryption
            .as_ref()
            .map(|e| crate::at_rest::KekId(e.key.kek_id).to_string())
            .unwrap_or_default();
        return Err(StoreError::Encryption(format!(
            "disk group {} is encrypted (its data key is sealed by key encryption key {kek}); \
             give the host that key's file",
            sbs[0].group_name
        )));
    };
    let cipher = if restore {
        GroupCipher::open(devices, sbs, keys)?
    } else {
        GroupCipher::open_as_is(devices, sbs, keys)?
    };
    Ok((Some(cipher), notes))
}

/// Geometry from a cache device size and capacity device sizes.
pub(crate) fn plan_geometry(
    cache_bytes: u64,
    capacity_bytes: &[u64],
) -> Result<Geometry, StoreError> {
    let areas: Vec<(u8, u64, u64)> = capacity_bytes
        .iter()
        .enumerate()
        .map(|(i, b)| ((i + 1) as u8, 2, (b / BLOCK_BYTES).saturating_sub(2)))
        .collect();
    if areas.is_empty() || areas.len() > 7 {
        return Err(StoreError::Config(format!(
            "a disk group has 1 to 7 capacity devices, not {}",
            areas.len()
        )));
    }
    let capacity_blocks: u64 = areas.iter().map(|a| a.2).sum();
    if capacity_blocks < 4 * HEADROOM_BLOCKS_MIN {
        return Err(StoreError::Config(format!(
            "capacity devices hold {capacity_blocks} blocks; at least {} are needed",
            4 * HEADROOM_BLOCKS_MIN
        )));
    }
    let roots = capacity_blocks / LBAS_PER_PAGE * ROOT_SLACK + 1024;
    let meta_bytes = 64 + COMPONENTS_MAX * 48 + roots * 16;
    let meta_slot_blocks = meta_bytes.div_ceil(BLOCK_BYTES);
    let log_start = 2 + 2 * meta_slot_blocks;
    let cache_blocks = cache_bytes / BLOCK_BYTES;
    if cache_blocks < log_start + LOG_BLOCKS_MIN {
        return Err(StoreError::Config(format!(
            "cache device of {cache_bytes} bytes is too small: it needs {} bytes for checkpoints and the smallest log",
            (log_start + LOG_BLOCKS_MIN) * BLOCK_BYTES
        )));
    }
    Ok(Geometry {
        meta_start: 2,
        meta_slot_blocks,
        log_start,
        log_blocks: cache_blocks - log_start,
        areas,
    })
}

/// Index pages the checkpoint slot can list, after component records.
pub(crate) fn roots_max(geo: &Geometry) -> u64 {
    (geo.meta_slot_blocks * BLOCK_BYTES).saturating_sub(64 + COMPONENTS_MAX * 48) / 16
}

/// Formats the devices as a new, empty disk group.
pub(crate) fn format(
    devices: &[Arc<dyn Disk>],
    group_name: &str,
    uuid: u128,
    zero_log: bool,
    keys: Option<&AtRestKeys>,
) -> Result<(), StoreError> {
    for d in devices {
        if read_superblock(d).is_ok() {
            return Err(bad(
                d,
                "already holds a disk group; open it instead of creating",
            ));
        }
    }
    // An encrypted device keeps its last blocks for the rekey journal.
    let journal_bytes = if keys.is_some() {
        REKEY_PIECE_BLOCKS * BLOCK_BYTES
    } else {
        0
    };
    let usable =
        |d: &Arc<dyn Disk>| (d.size() / BLOCK_BYTES * BLOCK_BYTES).saturating_sub(journal_bytes);
    let capacity: Vec<u64> = devices[1..].iter().map(usable).collect();
    let geo = plan_geometry(usable(&devices[0]), &capacity)?;
    let data_key = keys.map(|_| DataKey::generate()).transpose()?;
    let sealed = match (keys, &data_key) {
        (Some(k), Some(dk)) => Some(dk.wrap(&k.current, uuid, 1)?),
        _ => None,
    };
    let mut superblocks = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        let (role, data_start, data_blocks) = if i == 0 {
            (DeviceRole::Cache, 0, 0)
        } else {
            (DeviceRole::Capacity, geo.areas[i - 1].1, geo.areas[i - 1].2)
        };
        let sb = Superblock {
            group_uuid: uuid,
            group_name: group_name.to_string(),
            role,
            device_index: i as u8,
            device_count: devices.len() as u8,
            device_bytes: d.size(),
            meta_start: if i == 0 { geo.meta_start } else { 0 },
            meta_slot_blocks: if i == 0 { geo.meta_slot_blocks } else { 0 },
            log_start: if i == 0 { geo.log_start } else { 0 },
            log_blocks: if i == 0 { geo.log_blocks } else { 0 },
            data_start,
            data_blocks,
            features: if sealed.is_some() {
                FEATURE_ENCRYPTED
            } else {
                0
            },
            sequence: 0,
            encryption: sealed.as_ref().map(|key| SuperblockEncryption {
                cipher: CIPHER_AES256_XTS,
                generation: 1,
                key: key.clone(),
                next: None,
                rekey_cursor: 0,
                journal_start: d.size() / BLOCK_BYTES - REKEY_PIECE_BLOCKS,
                journal_blocks: REKEY_PIECE_BLOCKS,
                journal: None,
            }),
        };
        let mut two = sb.encode();
        two.extend_from_slice(&sb.encode());
        write_blocks(d, 0, &two)?;
        superblocks.push(sb);
    }
    // Everything past the superblocks goes through the group's cipher.
    let cipher = match keys {
        Some(k) => Some(GroupCipher::open(devices, superblocks, k)?),
        None => None,
    };
    let devices = match &cipher {
        Some(c) => c.disks(),
        None => devices.to_vec(),
    };
    let cache = &devices[0];
    // Slot 0 cleared, generation 1 in slot 1.
    write_blocks(cache, geo.meta_start, &vec![0u8; BLOCK])?;
    let ck = Checkpoint {
        generation: 1,
        log_tail_block: 0,
        log_tail_seq: 1,
        components: Vec::new(),
    };
    write_blocks(cache, geo.meta_start + geo.meta_slot_blocks, &ck.encode())?;
    // The first log block must not hold a record from an earlier life of the
    // device; writing the whole log once also makes later syncs cheaper on
    // files (no extent conversion on first write).
    const ZERO_CHUNK_BLOCKS: u64 = 256;
    let zero_blocks = if zero_log { geo.log_blocks } else { 1 };
    let mut at = 0;
    while at < zero_blocks {
        let n = ZERO_CHUNK_BLOCKS.min(zero_blocks - at);
        write_blocks(
            cache,
            geo.log_start + at,
            &vec![0u8; (n * BLOCK_BYTES) as usize],
        )?;
        at += n;
    }
    for d in &devices {
        d.sync()?;
    }
    Ok(())
}

/// Reads the newest sound checkpoint.
pub(crate) fn read_checkpoint(
    cache: &Arc<dyn Disk>,
    geo: &Geometry,
) -> Result<Checkpoint, StoreError> {
    let mut best: Option<Checkpoint> = None;
    let mut problems = Vec::new();
    for slot in 0..2u64 {
        let start = geo.meta_start + slot * geo.meta_slot_blocks;
        let first = read_block(cache, start, 1)?;
        let length = match Checkpoint::length_from_first_block(first.as_slice()) {
            Ok(l) => l,
            Err(e) => {
                problems.push(format!("slot {slot}: {e}"));
                continue;
            }
        };
        let blocks = length.div_ceil(BLOCK).max(1);
        if blocks as u64 > geo.meta_slot_blocks {
            problems.push(format!("slot {slot}: length {length} exceeds the slot"));
            continue;
        }
        let buf = read_block(cache, start, blocks)?;
        match Checkpoint::decode(buf.as_slice()) {
            Ok(ck) => {
                if best.as_ref().is_none_or(|b| ck.generation > b.generation) {
                    best = Some(ck);
                }
            }
            Err(e) => problems.push(format!("slot {slot}: {e}")),
        }
    }
    best.ok_or_else(|| {
        bad(
            cache,
            format!("no sound checkpoint: {}", problems.join("; ")),
        )
    })
}

/// Checks the superblocks of a disk group's devices and returns its geometry
/// and identity.
pub(crate) fn read_geometry(
    devices: &[Arc<dyn Disk>],
) -> Result<(Geometry, u128, String), StoreError> {
    let cache_sb = read_superblock(&devices[0])?;
    if cache_sb.role != DeviceRole::Cache || cache_sb.device_index != 0 {
        return Err(bad(
            &devices[0],
            "is not the cache device of its disk group",
        ));
    }
    if cache_sb.device_count as usize != devices.len() {
        return Err(bad(
            &devices[0],
            format!(
                "its disk group has {} devices, {} were given",
                cache_sb.device_count,
                devices.len()
            ),
        ));
    }
    let mut areas = Vec::new();
    for (i, d) in devices.iter().enumerate().skip(1) {
        let sb = read_superblock(d)?;
        if sb.group_uuid != cache_sb.group_uuid {
            return Err(bad(d, "belongs to another disk group"));
        }
        if sb.role != DeviceRole::Capacity || sb.device_index as usize != i {
            return Err(bad(
                d,
                format!("is device {} of its group, expected {i}", sb.device_index),
            ));
        }
        if (sb.data_start + sb.data_blocks) * BLOCK_BYTES > d.size() {
            return Err(bad(d, "is smaller than when it was formatted"));
        }
        areas.push((i as u8, sb.data_start, sb.data_blocks));
    }
    if (cache_sb.log_start + cache_sb.log_blocks) * BLOCK_BYTES > devices[0].size() {
        return Err(bad(&devices[0], "is smaller than when it was formatted"));
    }
    Ok((
        Geometry {
            meta_start: cache_sb.meta_start,
            meta_slot_blocks: cache_sb.meta_slot_blocks,
            log_start: cache_sb.log_start,
            log_blocks: cache_sb.log_blocks,
            areas,
        },
        cache_sb.group_uuid,
        cache_sb.group_name,
    ))
}

/// Builds the in-memory state from the checkpoint and the committed index.
pub(crate) fn load_state(
    devices: &[Arc<dyn Disk>],
    geo: &Geometry,
    ck: &Checkpoint,
    index_cache_bytes: u64,
    content: Arc<ContentCache>,
) -> State {
    let alloc = Allocator::new(&geo.areas);
    let capacity_blocks = alloc.total_blocks();
    let headroom = HEADROOM_BLOCKS_MIN.max(capacity_blocks / 64);
    let mut components = BTreeMap::new();
    for rec in &ck.components {
        let mut comp = Component::new(rec.id, rec.size_bytes, rec.reserve_bytes, rec.highest_epoch);
        comp.family = rec.family;
        match rec.root_table {
            // A snapshot's pages are in its root table, read below when its
            // references are counted; it keeps none in memory.
            Some(table) => comp.snapshot = Some(SnapshotTable::unreadable(table)),
            None => {
                for p in &rec.pages {
                    comp.roots.insert(p.page_no, RootEntry::listed(p));
                }
            }
        }
        components.insert(rec.id, comp);
    }
    let mut st = State {
        components,
        overlay: BTreeMap::new(),
        cache: IndexCache::new(index_cache_bytes),
        alloc,
        pending_free: Vec::new(),
        shares: Default::default(),
        page_shares: Default::default(),
        overlay_new: 0,
        new_roots: 0,
        destage_inflight: 0,
        freeing: 0,
        placed: Default::default(),
        replay_holds: std::collections::HashMap::new(),
        log_writing: false,
        queue: VecDeque::new(),
        destage: VecDeque::new(),
        destage_blocks: 0,
        destage_since: None,
        overlay_cap_blocks: (crate::engine::OVERLAY_BYTES_MAX / BLOCK_BYTES)
            .min(geo.log_blocks / 4),
        unapplied: BTreeMap::new(),
        vhead: ck.log_tail_block,
        head_seq: ck.log_tail_seq,
        written_vhead: ck.log_tail_block,
        written_seq: ck.log_tail_seq,
        unsynced: VecDeque::new(),
        unsynced_blocks: 0,
        syncs_running: 0,
        sync_uncovered_seq: 0,
        log_stats: crate::LogStats::default(),
        vtail: ck.log_tail_block,
        tail_seq: ck.log_tail_seq,
        checkpoint_gen: ck.generation,
        checkpoints_done: 0,
        checkpoint_wanted: false,
        failed: None,
        failed_devices: BTreeMap::new(),
        next_op: 1,
        durable_op: 0,
        next_token: 1,
        usable_blocks: capacity_blocks.saturating_sub(headroom),
        roots_max: roots_max(geo),
        replay_writes: Vec::new(),
    };
    // Rebuild the free-space map and accounting from the committed pages.
    // A block may be referenced by several shared entries and at most one
    // plain one; every other double reference is damage.
    // Snapshots and clones share slot pairs: each pair's page is read and
    // its blocks counted once, and every further component that lists it
    // holds a share of it.
    let ids: Vec<u64> = st.components.keys().copied().collect();
    let mut refs = ReferenceCount::default();
    let mut pairs: HashMap<u64, (u8, u64)> = HashMap::new();
    for c in ids {
        let mut roots: Vec<(u64, RootEntry)> = st.components[&c]
            .roots
            .iter()
            .map(|(p, r)| (*p, *r))
            .collect();
        let family = st.components[&c].family;
        let mut failure: Option<String> = st.components[&c].failed.clone();
        let (mut allocated, mut held): (u64, Vec<(BlockLoc, u64)>) = (0, Vec::new());
        let mut table_blocks: Vec<BlockLoc> = Vec::new();
        let table = st.components[&c].snapshot.as_ref().map(|t| t.table);
        if let Some(table) = table {
            let snapshot = match crate::snapshot::read_root_table(devices, table, c) {
                Ok(t) => {
                    roots = t
                        .roots
                        .iter()
                        .map(|r| (r.page_no, RootEntry::listed(r)))
                        .collect();
                    table_blocks = t.blocks.clone();
                    SnapshotTable::new(table, t.blocks, &t.roots)
                }
                Err(reason) => {
                    failure.get_or_insert(reason);
                    SnapshotTable::unreadable(table)
                }
            };
            if let Some(comp) = st.components.get_mut(&c) {
                comp.snapshot = Some(snapshot);
            }
        }
        for loc in table_blocks {
            if !refs.page_slot(&mut st.alloc, loc) {
                failure.get_or_insert(format!("root table block {loc} overlaps other data"));
            }
            held.push((loc, 1));
        }
        for (page_no, root) in roots {
            let Some(loc) = root.loc else { continue };
            held.push((loc, 2));
            if let Some(&(slot, mapped)) = pairs.get(&loc.pack(0)) {
                if slot != root.slot {
                    failure.get_or_insert(format!(
                        "index page {page_no} at {loc} is listed with slot {} and slot {slot}",
                        root.slot
                    ));
                }
                *st.page_shares.entry(loc.pack(0)).or_insert(0) += 1;
                allocated += mapped;
                continue;
            }
            let second = BlockLoc {
                device: loc.device,
                block: loc.block + 1,
            };
            if !refs.page_slot(&mut st.alloc, loc) || !refs.page_slot(&mut st.alloc, second) {
                failure.get_or_insert(format!(
                    "index page {page_no} slots at {loc} overlap other data"
                ));
            }
            let current = root.current().unwrap_or(loc);
            let Some(disk) = devices
                .get(current.device as usize)
                .filter(|_| current.device > 0)
            else {
                failure.get_or_insert(format!(
                    "index page {page_no} is on unknown device {}",
                    current.device
                ));
                continue;
            };
            let mut buf = AlignedBuf::zeroed(BLOCK);
            if let Err(e) = disk.read_at(buf.as_mut_slice(), current.block * BLOCK_BYTES) {
                st.failed_devices
                    .entry(current.device)
                    .or_insert(e.to_string());
                failure.get_or_insert(format!("index page {page_no}: {e}"));
                continue;
            }
            let page = match IndexPage::decode(buf.as_slice()) {
                Ok(p) if p.component == family && p.page_no == page_no => p,
                Ok(p) => {
                    failure.get_or_insert(format!(
                        "index page {page_no} at {current} holds component {} page {}",
                        p.component, p.page_no
                    ));
                    continue;
                }
                Err(e) => {
                    failure.get_or_insert(format!("index page {page_no} at {current}: {e}"));
                    continue;
                }
            };
            let before = allocated;
            for (slot, e) in page.entries.iter().enumerate() {
                match e.kind {
                    EntryKind::Unmapped => {}
                    EntryKind::Lost => allocated += 1,
                    EntryKind::Plain | EntryKind::Shared => {
                        allocated += 1;
                        let reference =
                            refs.data(&mut st.alloc, e.loc, e.kind == EntryKind::Shared);
                        if reference == Reference::Extra {
                            st.shares.add(e.loc);
                        }
                        if reference == Reference::Bad {
                            failure.get_or_insert(format!(
                                "LBA {} points to {} which is used twice or outside the data area",
                                page_no * LBAS_PER_PAGE + slot as u64,
                                e.loc
                            ));
                        }
                        held.push((e.loc, 1));
                    }
                }
            }
            pairs.insert(loc.pack(0), (root.slot, allocated - before));
        }
        if let Some(comp) = st.components.get_mut(&c) {
            comp.allocated = allocated;
            for (loc, n) in held {
                comp.hold(loc, n);
            }
            comp.failed = failure;
        }
    }
    let failed: Vec<(u8, String)> = st
        .failed_devices
        .iter()
        .map(|(d, r)| (*d, r.clone()))
        .collect();
    // From here on every block handed out or freed loses its cache entry.
    st.alloc.attach_content_cache(content);
    for (d, r) in failed {
        st.fail_capacity_device(d, &r);
    }
    st
}

/// A record read back from the log.
pub(crate) struct ReadRecord {
    pub(crate) header: LogRecordHeader,
    pub(crate) data: Vec<Bytes>,
    pub(crate) sound: Vec<bool>,
}

pub(crate) fn read_record(
    disk: &Arc<dyn Disk>,
    geo: &Geometry,
    v: u64,
    seq: u64,
) -> Option<ReadRecord> {
    let l = geo.log_blocks;
    let pos = v % l;
    let head = read_block(disk, geo.log_start + pos, 1).ok()?;
    let header = LogRecordHeader::decode(head.as_slice()).ok()?;
    if header.seq != seq {
        return None;
    }
    let n = header.data_blocks();
    if pos + 1 + n as u64 > l {
        return None;
    }
    let body = read_block(disk, geo.log_start + pos + 1, n).ok()?;
    let bytes = body.into_bytes();
    let mut data = Vec::with_capacity(n);
    let mut sound = Vec::with_capacity(n);
    let mut i = 0;
    for e in &header.entries {
        if let LogOp::Write { crc } = e.op {
            let b = bytes.slice(i * BLOCK..(i + 1) * BLOCK);
            sound.push(block_crc(&b) == crc);
            data.push(b);
            i += 1;
        }
    }
    Some(ReadRecord {
        header,
        data,
        sound,
    })
}

/// The position of the record with sequence `seq` at or after `v`, reading it
/// (a record that would not fit before the log's end starts at block 0).
pub(crate) fn find_record(
    disk: &Arc<dyn Disk>,
    geo: &Geometry,
    v: u64,
    seq: u64,
) -> Option<(u64, ReadRecord)> {
    let l = geo.log_blocks;
    if let Some(r) = read_record(disk, geo, v, seq) {
        return Some((v, r));
    }
    if !v.is_multiple_of(l) {
        let w = v + l - v % l;
        if let Some(r) = read_record(disk, geo, w, seq) {
            return Some((w, r));
        }
    }
    None
}

/// How far past the durable head records of commits in flight can lie: the
/// blocks written and not yet synced, one more commit, and the gap a record
/// leaves when it starts over at block 0.
pub(crate) const IN_FLIGHT_REACH_BLOCKS: u64 = UNSYNCED_BLOCKS_MAX + 2 * COMMIT_BLOCKS_MAX + 2;

/// True when a record written after `seq` was durable is found within reach
/// of `v` (its "first sequence not yet durable" is above `seq`): then the
/// record `seq` had been synced before it. The first such record lies at
/// most [`IN_FLIGHT_REACH_BLOCKS`] past `seq`'s end, since the log writer
/// keeps no more than that written and unsynced.
pub(crate) fn later_group_exists(disk: &Arc<dyn Disk>, geo: &Geometry, v: u64, seq: u64) -> bool {
    let l = geo.log_blocks;
    let reach = IN_FLIGHT_REACH_BLOCKS.min(l);
    let vouches = |block: &[u8]| {
        LogRecordHeader::decode(block)
            .is_ok_and(|h| h.seq > seq && h.batch_first_seq > seq && h.seq < seq + reach)
    };
    // A record that did not fit before the log's end starts at block 0.
    if read_block(disk, geo.log_start, 1).is_ok_and(|b| vouches(b.as_slice())) {
        return true;
    }
    const CHUNK_BLOCKS: u64 = 256;
    let mut k = 0u64;
    while k < reach {
        let pos = (v + k) % l;
        let n = (reach - k).min(l - pos).min(CHUNK_BLOCKS);
        if let Ok(buf) = read_block(disk, geo.log_start + pos, n as usize) {
            if buf.as_slice().chunks(BLOCK).any(vouches) {
                return true;
            }
        }
        k += n;
    }
    false
}

/// Follows the chain of records after a record with damaged data: a sound
/// record of a later group commit means the damaged one had been synced.
pub(crate) fn damage_was_synced(
    disk: &Arc<dyn Disk>,
    geo: &Geometry,
    v: u64,
    rec: &ReadRecord,
) -> bool {
    synced_before(disk, geo, v, rec).is_some()
}

/// Follows the chain of records after `rec` (at `v`) to the first one
/// written once `rec` was durable, and returns the sequence below which
/// that record says every record was durable (above `rec`'s own); `None`
/// when the chain ends first: `rec` may be of a commit never acknowledged.
fn synced_before(disk: &Arc<dyn Disk>, geo: &Geometry, v: u64, rec: &ReadRecord) -> Option<u64> {
    let mut v = v + rec.header.record_blocks() as u64;
    let this = rec.header.seq;
    for seq in (this + 1..).take(IN_FLIGHT_REACH_BLOCKS as usize) {
        let (at, r) = find_record(disk, geo, v, seq)?;
        if r.header.batch_first_seq > this {
            return Some(r.header.batch_first_seq);
        }
        v = at + r.header.record_blocks() as u64;
    }
    None
}

/// True when every block `rec`'s placed-write entries name holds the data
/// the entry's CRC32C describes. A placed write's data is synced beside its
/// record's write, not before it (`engine::sync_placed`), so a power cut
/// can leave the record durable and the data not; such a commit was never
/// acknowledged.
fn placed_data_sound(shared: &Shared, rec: &ReadRecord) -> bool {
    let mut block = AlignedBuf::zeroed(BLOCK);
    rec.header.entries.iter().all(|e| {
        let LogOp::Place { crc } = e.op else {
            return true;
        };
        let (loc, _) = BlockLoc::unpack(e.arg);
        shared.disk(loc.device).is_some_and(|disk| {
            disk.read_at(block.as_mut_slice(), loc.block * BLOCK_BYTES)
                .is_ok()
                && block_crc(block.as_slice()) == crc
        })
    })
}

/// Holds every block that placed-write entries from `(v, seq)` on name
/// (see [`crate::state::ReplayHold`]), following the records' headers the
/// way replay will.
fn hold_placed_blocks(shared: &Shared, mut v: u64, mut seq: u64) {
    let (disk, geo) = (shared.cache_disk(), &shared.geo);
    let l = geo.log_blocks;
    let header_at = |v: u64, seq: u64| {
        read_block(disk, geo.log_start + v % l, 1)
            .ok()
            .and_then(|b| LogRecordHeader::decode(b.as_slice()).ok())
            .filter(|h| h.seq == seq)
    };
    let mut named: HashMap<u64, u32> = HashMap::new();
    for _ in 0..l {
        let found = header_at(v, seq).map(|h| (v, h)).or_else(|| {
            let w = v + l - v % l;
            (!v.is_multiple_of(l)).then(|| header_at(w, seq).map(|h| (w, h)))?
        });
        let Some((at, header)) = found else { break };
        for e in &header.entries {
            match e.op {
                LogOp::Place { .. } => {
                    *named.entry(BlockLoc::unpack(e.arg).0.pack(0)).or_insert(0) += 1;
                }
                LogOp::Snapshot => {
                    // A snapshot's root table is read back when its record
                    // replays: nothing replay does before may take its
                    // blocks. A table that does not read back whole is of
                    // a snapshot deleted later (its blocks reused).
                    let table = RootTableRef {
                        first: BlockLoc::unpack(e.arg).0,
                        blocks: e.count,
                    };
                    if let Ok(t) =
                        crate::snapshot::read_root_table(&shared.devices, table, e.component)
                    {
                        for b in t.blocks {
                            *named.entry(b.pack(0)).or_insert(0) += 1;
                        }
                    }
                }
                _ => {}
            }
        }
        v = at + header.record_blocks() as u64;
        seq += 1;
    }
    let mut st = shared.state.lock();
    for (key, remaining) in named {
        let loc = BlockLoc::unpack(key).0;
        let owned = st.alloc.contains(loc) && st.alloc.mark_used(loc);
        st.replay_holds
            .insert(key, crate::state::ReplayHold { remaining, owned });
    }
}

/// Replays the log into the state. Returns the number of records replayed.
pub(crate) fn replay(shared: &Shared) -> Result<u64, StoreError> {
    let (mut v, mut seq) = {
        let st = shared.state.lock();
        (st.vtail, st.tail_seq)
    };
    hold_placed_blocks(shared, v, seq);
    let mut replayed = 0u64;
    let mut synced_below = 0u64;
    let l = shared.geo.log_blocks;
    let (disk, geo) = (shared.cache_disk(), &shared.geo);
    loop {
        let Some((at, rec)) = find_record(disk, geo, v, seq) else {
            if later_group_exists(disk, geo, v, seq) {
                return Err(StoreError::DiskGroupFailed {
                    reason: format!(
                        "write log record {seq} near log block {} is damaged after it was acknowledged",
                        v % l
                    ),
                });
            }
            break;
        };
        // A damaged record ends the log unless a later commit vouches
        // for it (then its damage was done after it was synced), and so
        // does one whose placed data did not all reach its devices: its
        // data was synced beside it, not before it, and it was never
        // acknowledged. Records below `synced_below` were all durable.
        let all_sound = rec.sound.iter().all(|s| *s);
        let places = rec
            .header
            .entries
            .iter()
            .any(|e| matches!(e.op, LogOp::Place { .. }));
        if !all_sound || (places && rec.header.seq >= synced_below) {
            match synced_before(disk, geo, at, &rec) {
                Some(below) => synced_below = synced_below.max(below),
                None if !all_sound || !placed_data_sound(shared, &rec) => break,
                None => {}
            }
        }
        apply_record(shared, &rec)?;
        synced_below = synced_below.max(rec.header.batch_first_seq);
        {
            let mut st = shared.state.lock();
            let writes = std::mem::take(&mut st.replay_writes);
            // What replay reads back from the log is durable.
            st.durable_op = st.next_op.saturating_sub(1);
            st.destage_blocks += writes.len() as u64;
            st.destage.push_back(LoggedRecord {
                seq: rec.header.seq,
                vstart: at,
                writes,
            });
        }
        v = at + rec.header.record_blocks() as u64;
        seq += 1;
        replayed += 1;
        // Replayed blocks are held in memory until destaged: destage as
        // replay goes, so recovery keeps the same memory bound as service.
        let over = {
            let mut st = shared.state.lock();
            st.vhead = v;
            st.head_seq = seq;
            st.destage_blocks > st.overlay_cap_blocks
        };
        if over {
            // Each pass moves up to a batch; a pass that cannot move a block
            // leaves it for the running destager, so the loop is bounded.
            const PASSES_MAX: usize = 1 << 12;
            for _ in 0..PASSES_MAX {
                let (blocks, cap) = {
                    let st = shared.state.lock();
                    (st.destage_blocks, st.overlay_cap_blocks)
                };
                if blocks <= cap / 2 {
                    break;
                }
                crate::engine::destage_pass(shared)
                    .map_err(|reason| StoreError::DiskGroupFailed { reason })?;
                if shared.state.lock().destage_blocks == blocks {
                    break;
                }
            }
        }
        if replayed > l {
            break;
        }
    }
    let mut st = shared.state.lock();
    st.vhead = v;
    st.head_seq = seq;
    st.written_vhead = v;
    st.written_seq = seq;
    // Blocks held for entries that did not replay (past the torn tail, or
    // of a component deleted later) were never referenced.
    let unused: Vec<BlockLoc> = st
        .replay_holds
        .drain()
        .filter(|(_, hold)| hold.owned)
        .map(|(key, _)| BlockLoc::unpack(key).0)
        .collect();
    st.alloc.free_all(&unused);
    Ok(replayed)
}

/// After replay, zeroes the header of every record that lies past the
/// durable head: group commits the log writer had written while an earlier
/// one was being synced, and that were never acknowledged. Left in place, one
/// could sit exactly at the position and sequence a later record expects
/// (new records reuse the sequences from the head on) and be replayed after
/// newer data at the next recovery. Commits in flight never reach further
/// than [`UNSYNCED_BLOCKS_MAX`] blocks plus one commit (and the gap a record
/// leaves when it starts over at block 0) past the durable head, and only
/// into free log space. Returns how many headers were cleared.
pub(crate) fn clear_unsynced_records(shared: &Shared) -> Result<u64, StoreError> {
    let (v, seq, vtail) = {
        let st = shared.state.lock();
        (st.vhead, st.head_seq, st.vtail)
    };
    let (disk, geo) = (shared.cache_disk(), &shared.geo);
    let l = geo.log_blocks;
    let free = (vtail + l).saturating_sub(v);
    let reach = IN_FLIGHT_REACH_BLOCKS.min(free);
    const CHUNK_BLOCKS: u64 = 256;
    let zeros = AlignedBuf::zeroed(BLOCK);
    let mut cleared = 0u64;
    let mut k = 0u64;
    while k < reach {
        let pos = (v + k) % l;
        let n = (reach - k).min(l - pos).min(CHUNK_BLOCKS);
        let buf = read_block(disk, geo.log_start + pos, n as usize)?;
        for i in 0..n as usize {
            let Ok(h) = LogRecordHeader::decode(&buf.as_slice()[i * BLOCK..(i + 1) * BLOCK]) else {
                continue;
            };
            if h.seq >= seq {
                disk.write_at(
                    zeros.as_slice(),
                    (geo.log_start + pos + i as u64) * BLOCK as u64,
                )?;
                cleared += 1;
            }
        }
        k += n;
    }
    if cleared > 0 {
        disk.sync()?;
    }
    Ok(cleared)
}

/// Loads pages until `f` stops asking for them.
pub(crate) fn with_pages<T>(
    shared: &Shared,
    mut f: impl FnMut(&mut State) -> Result<T, crate::state::Need>,
) -> Result<T, StoreError> {
    const ATTEMPTS_MAX: usize = 8;
    for _ in 0..ATTEMPTS_MAX {
        let need = {
            let mut st = shared.state.lock();
            match f(&mut st) {
                Ok(v) => return Ok(v),
                Err(need) => need,
            }
        };
        shared.load_pages_blocking(&need.0, false)?;
    }
    Err(StoreError::DiskGroupFailed {
        reason: "index cache too small to hold the pages of one operation".into(),
    })
}

/// Unmaps `[start, end)` of `c` a chunk of pages at a time.
pub(crate) fn unmap_blocking(
    shared: &Shared,
    c: u64,
    start: u64,
    end: u64,
) -> Result<(), StoreError> {
    let chunk = UNMAP_CHUNK_PAGES * LBAS_PER_PAGE;
    let mut s = start;
    while s < end {
        let e = end.min((s / chunk + 1) * chunk);
        match with_pages(shared, |st| st.unmap_range(c, s, e)) {
            Ok(()) => {}
            Err(StoreError::ComponentFailed { .. }) => return Ok(()),
            Err(other) => return Err(other),
        }
        s = e;
    }
    Ok(())
}

/// Applies the entries of a copy by reference once they are logged: shares
/// and unmapped runs, in order, through the same rules replay uses.
pub(crate) fn apply_clone_blocking(
    shared: &Shared,
    entries: &[LogEntry],
) -> Result<(), StoreError> {
    for e in entries {
        match e.op {
            LogOp::Share { crc } => {
                let (loc, _) = BlockLoc::unpack(e.arg);
                match with_pages(shared, |st| {
                    st.apply_share(e.component, e.lba, loc, crc, e.epoch)
                }) {
                    Ok(()) | Err(StoreError::ComponentFailed { .. }) => {}
                    Err(other) => return Err(other),
                }
            }
            _ => unmap_blocking(shared, e.component, e.lba, e.lba + e.count)?,
        }
    }
    Ok(())
}

/// Frees every block of a deleted component (after the next checkpoint).
pub(crate) fn free_component_blocking(
    shared: &Shared,
    c: u64,
    comp: Component,
    cached: Vec<IndexPage>,
) {
    let mut freed = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for page in cached {
        seen.insert(page.page_no);
        freed.extend(page.entries.iter().filter_map(|e| e.block()));
    }
    for (page_no, root) in &comp.roots {
        let Some(loc) = root.loc else { continue };
        freed.push(loc);
        freed.push(BlockLoc {
            device: loc.device,
            block: loc.block + 1,
        });
        if seen.contains(page_no) {
            continue;
        }
        if let Some(current) = root.current() {
            match shared.read_page((c, *page_no), current, comp.family) {
                Ok(page) => freed.extend(page.entries.iter().filter_map(|e| e.block())),
                Err(_) => tracing::warn!(
                    component = %ComponentId(c),
                    page_no,
                    "index page of a deleted component unreadable; its blocks stay in use until the next mount"
                ),
            }
        }
    }
    // A snapshot's root table goes with it.
    if let Some(table) = &comp.snapshot {
        freed.extend(table.blocks.iter().copied());
    }
    let mut st = shared.state.lock();
    for loc in freed {
        st.drop_ref(loc);
    }
}

/// Applies one replayed record.
fn apply_record(shared: &Shared, rec: &ReadRecord) -> Result<(), StoreError> {
    let mut data = rec.data.iter().zip(rec.sound.iter());
    for e in &rec.header.entries {
        let c = e.component;
        let exists = shared.state.lock().components.contains_key(&c);
        match e.op {
            LogOp::Write { crc } => {
                let Some((block, sound)) = data.next() else {
                    break;
                };
                let in_range = {
                    let st = shared.state.lock();
                    st.components
                        .get(&c)
                        .is_some_and(|comp| comp.failed.is_none() && e.lba < comp.blocks())
                };
                if !in_range {
                    continue;
                }
                // A block of its own, not a slice that keeps the whole
                // record read back from the log alive until it is destaged.
                let blocks = [(Bytes::copy_from_slice(block), crc, !*sound)];
                let ops = with_pages(shared, |st| {
                    let need = st.missing_pages(c, e.lba, e.lba + 1);
                    if !need.0.is_empty() {
                        return Err(need);
                    }
                    Ok(st.stage_write(ComponentId(c), Lba(e.lba), &blocks, Epoch(e.epoch), false))
                });
                match ops {
                    Ok(Ok(ops)) => {
                        let mut st = shared.state.lock();
                        for op in ops {
                            st.replay_writes.push((c, e.lba, op));
                        }
                    }
                    Ok(Err(_)) | Err(StoreError::ComponentFailed { .. }) => {}
                    Err(other) => return Err(other),
                }
            }
            LogOp::Place { crc } => {
                // The block was synced before this record was written. Its
                // reference is taken first (the block may also be one the
                // committed index still points to: this record's effect,
                // already checkpointed, or a block a later record let go and
                // the store reused; later records balance the count).
                let (loc, _) = BlockLoc::unpack(e.arg);
                let ops = with_pages(shared, |st| {
                    let usable = st.components.get(&c).is_some_and(|comp| {
                        comp.failed.is_none() && e.lba < comp.blocks() && st.alloc.contains(loc)
                    });
                    if !usable {
                        return Ok(None);
                    }
                    let need = st.missing_pages(c, e.lba, e.lba + 1);
                    if !need.0.is_empty() {
                        return Err(need);
                    }
                    let staged = st.stage_placed(
                        ComponentId(c),
                        Lba(e.lba),
                        &[(loc, crc)],
                        Epoch(e.epoch),
                        false,
                    );
                    if staged.is_ok() {
                        st.take_replayed_ref(loc);
                    }
                    Ok(Some(staged))
                });
                match ops {
                    Ok(Some(Ok(ops))) => {
                        let mut st = shared.state.lock();
                        for op in ops {
                            st.replay_writes.push((c, e.lba, op));
                        }
                    }
                    Ok(None) | Ok(Some(Err(_))) | Err(StoreError::ComponentFailed { .. }) => {}
                    Err(other) => return Err(other),
                }
            }
            LogOp::Unmap | LogOp::WriteZeroes => {
                if exists {
                    raise_epoch(shared, c, e.epoch);
                    unmap_blocking(shared, c, e.lba, e.lba.saturating_add(e.count))?;
                }
            }
            LogOp::Fence => raise_epoch(shared, c, e.epoch),
            LogOp::Share { crc } => {
                let (loc, _) = BlockLoc::unpack(e.arg);
                let in_range = {
                    let st = shared.state.lock();
                    st.components.get(&c).is_some_and(|comp| {
                        comp.failed.is_none() && e.lba < comp.blocks() && st.alloc.contains(loc)
                    })
                };
                if in_range {
                    match with_pages(shared, |st| st.apply_share(c, e.lba, loc, crc, e.epoch)) {
                        Ok(()) | Err(StoreError::ComponentFailed { .. }) => {}
                        Err(other) => return Err(other),
                    }
                }
            }
            LogOp::Create => {
                if !exists {
                    shared
                        .state
                        .lock()
                        .components
                        .insert(c, Component::new(c, e.arg, e.arg2, e.epoch));
                }
            }
            LogOp::Snapshot if !exists => replay_snapshot(shared, e),
            LogOp::Clone if !exists => {
                let read = shared.snapshot_roots(e.arg2);
                let mut st = shared.state.lock();
                match st.components.get(&e.arg2).filter(|s| s.snapshot.is_some()) {
                    Some(snapshot) => {
                        let (family, size, allocated, epoch) = (
                            snapshot.family,
                            snapshot.size_bytes,
                            snapshot.allocated,
                            e.epoch,
                        );
                        let roots = read.as_ref().cloned().unwrap_or_default();
                        st.add_copy(c, family, size, allocated, &roots, None, epoch);
                        if let (Err(err), Some(clone)) = (read, st.components.get_mut(&c)) {
                            // Its pages are unknown: shown as failed, for
                            // its copies elsewhere to replace.
                            clone.failed = Some(format!("snapshot root table unreadable: {err}"));
                        }
                    }
                    None => tracing::warn!(
                        component = %ComponentId(c),
                        snapshot = %ComponentId(e.arg2),
                        "replay: a clone's snapshot is gone; the clone was deleted later"
                    ),
                }
            }
            LogOp::Snapshot | LogOp::Clone => {}
            LogOp::Delete => {
                // Unreadable, its pages stay in use until the next mount
                // counts them again.
                let roots = shared.snapshot_roots(c).unwrap_or_else(|err| {
                    tracing::warn!(component = %ComponentId(c), %err, "replay: deleted snapshot's root table unreadable");
                    Vec::new()
                });
                let taken = shared.state.lock().take_component(c, roots);
                if let Some((comp, cached)) = taken {
                    free_component_blocking(shared, c, comp, cached);
                }
            }
            LogOp::Resize => {
                let old = {
                    let mut st = shared.state.lock();
                    match st.components.get_mut(&c) {
                        Some(comp) => {
                            let old = comp.size_bytes;
                            comp.size_bytes = e.arg;
                            Some(old)
                        }
                        None => None,
                    }
                };
                if let Some(old) = old {
                    if e.arg < old {
                        unmap_blocking(shared, c, e.arg / BLOCK_BYTES, old / BLOCK_BYTES)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Replays the creation of a snapshot from its root table. The table
/// names pages a checkpoint had committed before the snapshot was taken;
/// replay may since have changed the source's copy of such a page in
/// memory (re-applying writes the page already held), and that copy must
/// not be written into the pair the snapshot now shares, so the source
/// takes a pair of its own for it.
fn replay_snapshot(shared: &Shared, e: &LogEntry) {
    let c = e.component;
    let table = RootTableRef {
        first: BlockLoc::unpack(e.arg).0,
        blocks: e.count,
    };
    let read = crate::snapshot::read_root_table(&shared.devices, table, c);
    let mut st = shared.state.lock();
    match read {
        Ok(t) => {
            for b in &t.blocks {
                st.take_replayed_ref(*b);
            }
            let epoch = e.epoch;
            let snapshot = SnapshotTable::new(table, t.blocks.clone(), &t.roots);
            st.add_copy(
                c,
                t.family,
                t.size_bytes,
                t.allocated,
                &t.roots,
                Some(snapshot),
                epoch,
            );
            let src = e.arg2;
            let changed: Vec<u64> = t
                .roots
                .iter()
                .filter(|r| {
                    st.components
                        .get(&src)
                        .and_then(|s| s.roots.get(&r.page_no))
                        .is_some_and(|sr| sr.loc == Some(r.loc))
                        && st
                            .cache
                            .peek(&(src, r.page_no))
                            .is_some_and(|p| p.is_dirty())
                })
                .map(|r| r.page_no)
                .collect();
            for page_no in changed {
                st.own_page((src, page_no));
            }
        }
        Err(reason) => {
            // Unreadable: a snapshot deleted later whose table blocks were
            // reused is deleted again by a later record; any other is
            // damage, shown as a failed component.
            tracing::warn!(component = %ComponentId(c), %reason, "replay: snapshot root table unreadable");
            let mut comp = Component::new(c, 0, 0, e.epoch);
            comp.snapshot = Some(SnapshotTable::unreadable(table));
            comp.failed = Some(format!("snapshot root table unreadable: {reason}"));
            st.components.insert(c, comp);
        }
    }
}

fn raise_epoch(shared: &Shared, c: u64, epoch: u64) {
    if let Some(comp) = shared.state.lock().components.get_mut(&c) {
        comp.highest_epoch = comp.highest_epoch.max(epoch);
    }
}
