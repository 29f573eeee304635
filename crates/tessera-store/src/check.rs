//! Offline verification of a disk group's devices (`tessera store check`).
//!
//! Owns: a read-only walk over everything the store wrote: both superblock
//! copies, both checkpoint slots, every index page the checkpoint lists,
//! every data block those pages map (against its CRC32C, and against being
//! mapped twice) and the write log from the checkpoint's tail. Each problem
//! is listed with the device and byte offset where it is. It holds a shared
//! lock on every device while it runs, so it is refused while a host has the
//! disk group open (the store locks the devices exclusively from open to
//! drop) and no host can open them while it reads.

use crate::alloc::{Allocator, Reference, ReferenceCount};
use crate::at_rest::AtRestKeys;
use crate::recovery::{self, damage_was_synced, find_record, later_group_exists};
use crate::StoreError;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use tessera_env::{AlignedBuf, Disk, DiskError, FileDisk, FileDiskOptions};
use tessera_format::{block_crc, BlockLoc, EntryKind, IndexPage, Superblock, BLOCK};
use tessera_types::BLOCK_BYTES;

/// One problem found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckProblem {
    /// The device.
    pub device: String,
    /// Byte offset of the damaged structure or block.
    pub offset: u64,
    /// What is wrong.
    pub problem: String,
}

/// What `check_devices` found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckReport {
    /// Devices checked, in disk-group order.
    pub devices: Vec<String>,
    /// Components in the checkpoint.
    pub components: u64,
    /// Index pages checked.
    pub index_pages: u64,
    /// Data blocks checked.
    pub data_blocks: u64,
    /// Log records checked.
    pub log_records: u64,
    /// Problems found.
    pub problems: Vec<CheckProblem>,
    /// Facts worth knowing that are not damage (a torn, never acknowledged
    /// log tail; an older checkpoint slot left torn by a crash).
    pub notes: Vec<String>,
}

impl CheckReport {
    /// True when nothing is wrong.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "devices: {}", self.devices.join(", "))?;
        writeln!(
            f,
            "checked {} components, {} index pages, {} data blocks, {} log records",
            self.components, self.index_pages, self.data_blocks, self.log_records
        )?;
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        for p in &self.problems {
            writeln!(
                f,
                "PROBLEM {} at byte {}: {}",
                p.device, p.offset, p.problem
            )?;
        }
        write!(f, "{} problem(s)", self.problems.len())
    }
}

/// Checks the devices of one disk group (in any order), read-only.
///
/// Every device is opened, and so locked shared, before any is read, and
/// stays locked until the check ends: if one is in use by a running host (a
/// disk group open on it, in this process or another), the check is refused
/// with [`StoreError::DeviceInUse`] and reads nothing; meanwhile no host can
/// open them. A device that cannot be opened for another reason is a
/// problem in the report.
pub fn check_devices<P: AsRef<Path>>(paths: &[P]) -> Result<CheckReport, StoreError> {
    check_encrypted_devices(paths, None)
}

/// [`check_devices`] for a group that may be encrypted at rest: `keys` must
/// hold the key encryption key that seals its data key. A piece a deep
/// rekey left half rewritten is not put back (the check writes nothing); it
/// is a note, and its blocks may show as problems until a host opens the
/// group.
pub fn check_encrypted_devices<P: AsRef<Path>>(
    paths: &[P],
    keys: Option<&AtRestKeys>,
) -> Result<CheckReport, StoreError> {
    let mut opened: Vec<Opened> = Vec::new();
    for p in paths {
        let path = p.as_ref();
        let name = path.display().to_string();
        let options = FileDiskOptions {
            read_only: true,
            ..Default::default()
        };
        match FileDisk::open(path, options) {
            Ok(d) => opened.push((name, Ok(Arc::new(d)))),
            Err(e) if e.is_in_use() => return Err(StoreError::DeviceInUse { device: name }),
            Err(e) => opened.push((name, Err(e))),
        }
    }
    // `opened` holds the locks until the walk is done.
    Ok(check_opened(&opened, keys))
}

/// The report of a group whose devices cannot be read as one: `e` is its
/// only problem, on the cache device.
fn unreadable(mut report: CheckReport, devices: &[Arc<dyn Disk>], e: StoreError) -> CheckReport {
    report.problems.push(CheckProblem {
        device: devices[0].name(),
        offset: 0,
        problem: e.to_string(),
    });
    report
}

/// A device named as the caller wrote it, opened (and locked) or not.
type Opened = (String, Result<Arc<dyn Disk>, DiskError>);

fn check_opened(opened: &[Opened], keys: Option<&AtRestKeys>) -> CheckReport {
    let mut report = CheckReport::default();
    let mut found: Vec<(u8, Arc<dyn Disk>)> = Vec::new();
    for (name, disk) in opened {
        let name = name.clone();
        let disk: Arc<dyn Disk> = match disk {
            Ok(d) => d.clone(),
            Err(e) => {
                report.problems.push(CheckProblem {
                    device: name,
                    offset: 0,
                    problem: format!("cannot open: {e}"),
                });
                continue;
            }
        };
        let mut both = AlignedBuf::zeroed(2 * BLOCK);
        if let Err(e) = disk.read_at(both.as_mut_slice(), 0) {
            report.problems.push(CheckProblem {
                device: name,
                offset: 0,
                problem: format!("cannot read the superblock: {e}"),
            });
            continue;
        }
        let copies = [
            Superblock::decode(&both.as_slice()[..BLOCK]),
            Superblock::decode(&both.as_slice()[BLOCK..]),
        ];
        for (i, c) in copies.iter().enumerate() {
            if let Err(e) = c {
                report.problems.push(CheckProblem {
                    device: name.clone(),
                    offset: (i * BLOCK) as u64,
                    problem: format!("superblock copy {i}: {e}"),
                });
            }
        }
        match copies.into_iter().flatten().next() {
            Some(sb) => found.push((sb.device_index, disk)),
            None => continue,
        }
    }
    found.sort_by_key(|(i, _)| *i);
    let devices: Vec<Arc<dyn Disk>> = found.into_iter().map(|(_, d)| d).collect();
    report.devices = devices.iter().map(|d| d.name()).collect();
    if devices.is_empty() {
        return report;
    }
    let devices = match recovery::unlock_read_only(&devices, keys) {
        Ok((Some(cipher), notes)) => {
            report.notes.extend(notes);
            cipher.disks()
        }
        Ok((None, _)) => devices,
        Err(e) => return unreadable(report, &devices, e),
    };
    let (geo, _, _) = match recovery::read_geometry(&devices) {
        Ok(g) => g,
        Err(e) => return unreadable(report, &devices, e),
    };
    let cache = &devices[0];
    let ck = match recovery::read_checkpoint(cache, &geo) {
        Ok(ck) => ck,
        Err(e) => {
            report.problems.push(CheckProblem {
                device: cache.name(),
                offset: geo.meta_start * BLOCK_BYTES,
                problem: e.to_string(),
            });
            return report;
        }
    };
    report.components = ck.components.len() as u64;
    let mut alloc = Allocator::new(&geo.areas);
    let mut refs = ReferenceCount::default();
    let name_of = |loc: BlockLoc| {
        devices
            .get(loc.device as usize)
            .map(|d| d.name())
            .unwrap_or_else(|| format!("device {}", loc.device))
    };
    // Pairs shared by snapshots and clones are checked once.
    let mut pairs: std::collections::HashMap<u64, u8> = std::collections::HashMap::new();
    for comp in &ck.components {
        let mut pages = comp.pages.clone();
        if let Some(table) = comp.root_table {
            match crate::snapshot::read_root_table(&devices, table, comp.id) {
                Ok(t) => {
                    for b in &t.blocks {
                        if !refs.page_slot(&mut alloc, *b) {
                            report.problems.push(CheckProblem {
                                device: name_of(*b),
                                offset: b.block * BLOCK_BYTES,
                                problem: format!(
                                    "component {}: root table block overlaps other data",
                                    comp.id
                                ),
                            });
                        }
                    }
                    pages = t.roots;
                }
                Err(problem) => {
                    report.problems.push(CheckProblem {
                        device: name_of(table.first),
                        offset: table.first.block * BLOCK_BYTES,
                        problem: format!("snapshot {}: {problem}", comp.id),
                    });
                    continue;
                }
            }
        }
        for root in &pages {
            if let Some(&slot) = pairs.get(&root.loc.pack(0)) {
                if slot != root.slot {
                    report.problems.push(CheckProblem {
                        device: name_of(root.loc),
                        offset: root.loc.block * BLOCK_BYTES,
                        problem: format!(
                            "component {} index page {}: a shared page listed with another slot",
                            comp.id, root.page_no
                        ),
                    });
                }
                continue;
            }
            pairs.insert(root.loc.pack(0), root.slot);
            let current = BlockLoc {
                device: root.loc.device,
                block: root.loc.block + root.slot as u64,
            };
            let problem = |what: String| CheckProblem {
                device: name_of(current),
                offset: current.block * BLOCK_BYTES,
                problem: format!("component {} index page {}: {what}", comp.id, root.page_no),
            };
            let second = BlockLoc {
                device: root.loc.device,
                block: root.loc.block + 1,
            };
            if !refs.page_slot(&mut alloc, root.loc) || !refs.page_slot(&mut alloc, second) {
                report.problems.push(problem(
                    "slots overlap other data or lie outside the data area".into(),
                ));
            }
            let Some(disk) = devices
                .get(current.device as usize)
                .filter(|_| current.device > 0)
            else {
                report.problems.push(problem("on an unknown device".into()));
                continue;
            };
            let mut buf = AlignedBuf::zeroed(BLOCK);
            if let Err(e) = disk.read_at(buf.as_mut_slice(), current.block * BLOCK_BYTES) {
                report.problems.push(problem(e.to_string()));
                continue;
            }
            report.index_pages += 1;
            let page = match IndexPage::decode(buf.as_slice()) {
                Ok(p) if p.component == comp.family && p.page_no == root.page_no => p,
                Ok(p) => {
                    report.problems.push(problem(format!(
                        "holds component {} page {} instead",
                        p.component, p.page_no
                    )));
                    continue;
                }
                Err(e) => {
                    report.problems.push(problem(e.to_string()));
                    continue;
                }
            };
            for (slot, e) in page.entries.iter().enumerate() {
                let lba = root.page_no * crate::index::LBAS_PER_PAGE + slot as u64;
                match e.kind {
                    EntryKind::Unmapped => {}
                    EntryKind::Lost => report.problems.push(CheckProblem {
                        device: name_of(current),
                        offset: current.block * BLOCK_BYTES,
                        problem: format!("component {} LBA {lba}: data recorded as lost", comp.id),
                    }),
                    EntryKind::Plain | EntryKind::Shared => {
                        let reference = refs.data(&mut alloc, e.loc, e.kind == EntryKind::Shared);
                        if reference == Reference::First {
                            report.data_blocks += 1;
                        }
                        let at = CheckProblem {
                            device: name_of(e.loc),
                            offset: e.loc.block * BLOCK_BYTES,
                            problem: String::new(),
                        };
                        if reference == Reference::Bad {
                            report.problems.push(CheckProblem {
                                problem: format!(
                                    "component {} LBA {lba}: block mapped twice or outside the data area",
                                    comp.id
                                ),
                                ..at.clone()
                            });
                            continue;
                        }
                        let Some(d) = devices.get(e.loc.device as usize) else {
                            continue;
                        };
                        let mut data = AlignedBuf::zeroed(BLOCK);
                        let problem =
                            match d.read_at(data.as_mut_slice(), e.loc.block * BLOCK_BYTES) {
                                Err(err) => Some(err.to_string()),
                                Ok(()) if block_crc(data.as_slice()) != e.crc => {
                                    Some("checksum mismatch".to_string())
                                }
                                Ok(()) => None,
                            };
                        if let Some(p) = problem {
                            report.problems.push(CheckProblem {
                                problem: format!("component {} LBA {lba}: {p}", comp.id),
                                ..at
                            });
                        }
                    }
                }
            }
        }
    }
    // The write log from the tail.
    let (mut v, mut seq) = (ck.log_tail_block, ck.log_tail_seq);
    loop {
        let Some((at, rec)) = find_record(cache, &geo, v, seq) else {
            if later_group_exists(cache, &geo, v, seq) {
                report.problems.push(CheckProblem {
                    device: cache.name(),
                    offset: (geo.log_start + v % geo.log_blocks) * BLOCK_BYTES,
                    problem: format!("write log record {seq} is damaged and later records exist"),
                });
            }
            break;
        };
        report.log_records += 1;
        if rec.sound.iter().any(|s| !s) {
            if damage_was_synced(cache, &geo, at, &rec) {
                let mut k = 0;
                for e in &rec.header.entries {
                    if let tessera_format::LogOp::Write { .. } = e.op {
                        if !rec.sound[k] {
                            report.problems.push(CheckProblem {
                                device: cache.name(),
                                offset: (geo.log_start + at % geo.log_blocks + 1 + k as u64)
                                    * BLOCK_BYTES,
                                problem: format!(
                                    "write log record {seq}: component {} LBA {} checksum mismatch",
                                    e.component, e.lba
                                ),
                            });
                        }
                        k += 1;
                    }
                }
            } else {
                report.notes.push(format!(
                    "write log ends with torn record {seq} (never acknowledged)"
                ));
                break;
            }
        }
        v = at + rec.header.record_blocks() as u64;
        seq += 1;
        if report.log_records > geo.log_blocks {
            break;
        }
    }
    report
}
