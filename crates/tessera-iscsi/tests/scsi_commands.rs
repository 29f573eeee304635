//! The SCSI command set through `ScsiTarget::execute` with raw CDBs over
//! in-memory volumes: status, sense key, ASC/ASCQ exactly, data, space and
//! the offload counters.

use bytes::Bytes;
use std::sync::Arc;
use std::time::Instant;
use tessera_blockdev::{BlockDevice, MemoryDevice, WriteFlags};
use tessera_iscsi::scsi::sense::{decode_information, decode_key_code};
use tessera_iscsi::scsi::{
    BlockTarget, Command, LogicalUnit, MemoryDatastore, MemoryEnvironment, Nexus, Offloads,
    Response, ScsiTarget, Status, TaskAttribute, UnitSettings,
};

const BLOCK: usize = 512;

struct Fixture {
    target: BlockTarget,
    datastore: Arc<MemoryDatastore>,
    devices: Vec<Arc<MemoryDevice>>,
    /// Each unit's environment, by LUN.
    environments: Vec<Arc<MemoryEnvironment>>,
}

fn fixture(sizes: &[u64]) -> Fixture {
    let datastore = MemoryDatastore::new();
    let target = BlockTarget::new();
    let mut devices = Vec::new();
    let mut environments = Vec::new();
    for (lun, &size) in sizes.iter().enumerate() {
        let device = Arc::new(MemoryDevice::new(format!("vol{lun}"), size));
        datastore.add(device.clone());
        let environment = Arc::new(MemoryEnvironment::new(datastore.clone()));
        let unit = LogicalUnit::new(device.clone(), environment.clone(), UnitSettings::default());
        target.insert_unit(lun as u64, Arc::new(unit));
        devices.push(device);
        environments.push(environment);
    }
    Fixture {
        target,
        datastore,
        devices,
        environments,
    }
}

fn nexus(name: &str) -> Nexus {
    Nexus {
        initiator_port: format!("iqn.2026-11.test:{name},i,0x400000000001"),
        relative_port: 1,
    }
}

impl Fixture {
    fn run(&self, who: &Nexus, lun: u64, cdb: &[u8], data_out: &[u8]) -> Response {
        futures::executor::block_on(self.target.execute(Command {
            nexus: who.clone(),
            lun,
            cdb: Bytes::copy_from_slice(cdb),
            data_out: Bytes::copy_from_slice(data_out),
            expected_data_in: 1 << 24,
            attribute: TaskAttribute::Simple,
            tag: 7,
        }))
    }

    /// A nexus past its power-on unit attention.
    fn login(&self, name: &str) -> Nexus {
        let n = nexus(name);
        for lun in self.target.luns() {
            let r = self.run(&n, lun, &[0; 6], &[]);
            assert_eq!(sense(&r), (6, 0x29, 0x00));
            assert_eq!(self.run(&n, lun, &[0; 6], &[]).status, Status::Good);
        }
        n
    }

    fn unit(&self, lun: u64) -> Arc<LogicalUnit> {
        self.target.unit(lun).unwrap()
    }
}

fn sense(r: &Response) -> (u8, u8, u8) {
    assert_eq!(r.status, Status::CheckCondition, "{r:?}");
    decode_key_code(r.sense.as_ref().unwrap()).unwrap()
}

fn good(r: &Response) -> &Bytes {
    assert_eq!(r.status, Status::Good, "{r:?}");
    &r.data_in
}

fn cdb16(op: u8, byte1: u8, lba: u64, count: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[1] = byte1;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&count.to_be_bytes());
    c
}

fn write16(lba: u64, blocks: u32) -> [u8; 16] {
    cdb16(0x8A, 0, lba, blocks)
}

fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    cdb16(0x88, 0, lba, blocks)
}

fn caw(lba: u64, blocks: u8) -> [u8; 16] {
    let mut c = cdb16(0x89, 0, lba, 0);
    c[10..14].fill(0);
    c[13] = blocks;
    c
}

#[test]
fn identity_capacity_and_missing_luns() {
    let f = fixture(&[8 << 20]);
    let n = f.login("a");
    let rc = good(&f.run(&n, 0, &cdb16(0x9E, 0x10, 0, 32), &[])).clone();
    assert_eq!(
        u64::from_be_bytes(rc[0..8].try_into().unwrap()),
        (8 << 20) / 512 - 1
    );
    assert_eq!(u32::from_be_bytes(rc[8..12].try_into().unwrap()), 512);
    assert_eq!(rc[13] & 0x0F, 3, "4 KiB physical blocks");
    assert_eq!(rc[14] & 0xC0, 0xC0, "LBPME and LBPRZ");
    let vpd83 = good(&f.run(&n, 0, &[0x12, 1, 0x83, 0, 255, 0], &[])).clone();
    assert_eq!(&vpd83[4..8], &[0x01, 0x03, 0x00, 16]);
    assert_eq!(&vpd83[8..24], &f.unit(0).designator());
    let lbp = good(&f.run(&n, 0, &[0x12, 1, 0xB2, 0, 255, 0], &[])).clone();
    assert_eq!(lbp[5] & 0xE0, 0xE0, "LBPU, LBPWS, LBPWS10");
    assert_eq!(lbp[6] & 0x07, 0x02, "thin");
    // A LUN with no unit.
    assert_eq!(sense(&f.run(&n, 3, &[0; 6], &[])), (5, 0x25, 0x00));
    let inq = good(&f.run(&n, 3, &[0x12, 0, 0, 0, 96, 0], &[])).clone();
    assert_eq!(inq[0], 0x7F);
    let luns = good(&f.run(&n, 3, &[0xA0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[])).clone();
    assert_eq!(&luns[..4], &8u32.to_be_bytes());
    // A bad page code and an unknown operation code.
    assert_eq!(
        sense(&f.run(&n, 0, &[0x12, 1, 0x81, 0, 255, 0], &[])),
        (5, 0x24, 0x00)
    );
    assert_eq!(
        sense(&f.run(&n, 0, &[0xC9, 0, 0, 0, 0, 0], &[])),
        (5, 0x20, 0x00)
    );
}

#[test]
fn reads_writes_and_range_errors() {
    let f = fixture(&[1 << 20]);
    let n = f.login("a");
    let blocks = (1 << 20) / BLOCK as u64;
    let data: Vec<u8> = (0..4 * BLOCK).map(|i| (i % 251) as u8).collect();
    good(&f.run(&n, 0, &write16(10, 4), &data));
    assert_eq!(&good(&f.run(&n, 0, &read16(10, 4), &[]))[..], &data[..]);
    assert_eq!(
        sense(&f.run(&n, 0, &read16(blocks - 1, 2), &[])),
        (5, 0x21, 0x00)
    );
    assert_eq!(
        sense(&f.run(&n, 0, &write16(blocks, 1), &data[..BLOCK])),
        (5, 0x21, 0x00)
    );
    assert_eq!(
        sense(&f.run(&n, 0, &read16(u64::MAX, 1), &[])),
        (5, 0x21, 0x00)
    );
    // VERIFY with BYTCHK=1 reports the first differing byte.
    let mut other = data.clone();
    other[700] ^= 1;
    let r = f.run(&n, 0, &cdb16(0x8F, 0x02, 10, 4), &other);
    assert_eq!(sense(&r), (0x0E, 0x1D, 0x00));
    assert_eq!(decode_information(r.sense.as_ref().unwrap()), Some(700));
    good(&f.run(&n, 0, &cdb16(0x8F, 0x02, 10, 4), &data));
}

#[test]
fn compare_and_write_miscompare_reports_offset_and_changes_nothing() {
    let f = fixture(&[1 << 20]);
    let n = f.login("a");
    good(&f.run(&n, 0, &write16(0, 2), &[b'A'; 2 * BLOCK]));
    let mut buf = vec![b'A'; 4 * BLOCK];
    buf[2 * BLOCK - 27] = b'C';
    buf[2 * BLOCK..].fill(b'B');
    let r = f.run(&n, 0, &caw(0, 2), &buf);
    assert_eq!(sense(&r), (0x0E, 0x1D, 0x00));
    assert_eq!(
        decode_information(r.sense.as_ref().unwrap()),
        Some(2 * BLOCK as u64 - 27)
    );
    assert!(good(&f.run(&n, 0, &read16(0, 2), &[]))
        .iter()
        .all(|&b| b == b'A'));
    buf[2 * BLOCK - 27] = b'A';
    good(&f.run(&n, 0, &caw(0, 2), &buf));
    assert!(good(&f.run(&n, 0, &read16(0, 2), &[]))
        .iter()
        .all(|&b| b == b'B'));
    // Data-out that does not match the CDB, and a length past the limit.
    assert_eq!(sense(&f.run(&n, 0, &caw(0, 1), &buf)).0, 5);
    assert_eq!(sense(&f.run(&n, 0, &caw(0, 0), &buf)).0, 5);
    let c = f.unit(0).counters();
    assert_eq!((c.ats, c.ats_miscompare), (2, 1));
}

#[test]
fn write_same_and_unmap_store_no_zeros() {
    let f = fixture(&[16 << 20]);
    let n = f.login("a");
    let device = &f.devices[0];
    good(&f.run(&n, 0, &write16(0, 8192), &vec![7u8; 8192 * BLOCK]));
    assert_eq!(device.space().allocated_bytes, 4 << 20);
    // WRITE SAME(16) of zeros over 2 MiB: the space goes, nothing is written.
    good(&f.run(&n, 0, &cdb16(0x93, 0, 0, 4096), &[0u8; BLOCK]));
    assert_eq!(device.space().allocated_bytes, 2 << 20);
    // UNMAP the rest.
    let mut list = vec![0u8; 24];
    list[1] = 22;
    list[3] = 16;
    list[8..16].copy_from_slice(&4096u64.to_be_bytes());
    list[16..20].copy_from_slice(&4096u32.to_be_bytes());
    good(&f.run(&n, 0, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &list));
    assert_eq!(device.space().allocated_bytes, 0);
    assert!(good(&f.run(&n, 0, &read16(0, 16), &[]))
        .iter()
        .all(|&b| b == 0));
    // GET LBA STATUS: deallocated from LBA 0.
    let status = good(&f.run(&n, 0, &cdb16(0x9E, 0x12, 0, 64), &[])).clone();
    assert_eq!(&status[8..16], &0u64.to_be_bytes());
    assert_eq!(status[20] & 0x0F, 1);
    // A pattern is written; an UNMAP past the end changes nothing.
    good(&f.run(&n, 0, &cdb16(0x93, 0, 100, 3), &[0x5A; BLOCK]));
    assert!(good(&f.run(&n, 0, &read16(100, 3), &[]))
        .iter()
        .all(|&b| b == 0x5A));
    list[8..16].copy_from_slice(&(32768u64 - 1).to_be_bytes());
    list[16..20].copy_from_slice(&2u32.to_be_bytes());
    assert_eq!(
        sense(&f.run(&n, 0, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &list)),
        (5, 0x21, 0x00)
    );
    assert_eq!(
        sense(&f.run(&n, 0, &[0x42, 0, 0, 0, 0, 0, 0, 0, 4, 0], &list)),
        (5, 0x1A, 0x00)
    );
    let c = f.unit(0).counters();
    assert_eq!((c.zero_blocks, c.delete_blocks), (4096, 4096));
}

fn xcopy_list(
    source: &[u8; 16],
    destination: &[u8; 16],
    blocks: u16,
    src: u64,
    dst: u64,
) -> Vec<u8> {
    let mut d = vec![0u8; 16];
    d[0] = 1;
    for designator in [source, destination] {
        let mut t = [0u8; 32];
        t[0] = 0xE4;
        t[4] = 0x01;
        t[5] = 0x03;
        t[7] = 16;
        t[8..24].copy_from_slice(designator);
        t[30] = 0x02;
        d.extend_from_slice(&t);
    }
    let mut s = [0u8; 28];
    s[0] = 0x02;
    s[3] = 0x18;
    s[6..8].copy_from_slice(&1u16.to_be_bytes());
    s[10..12].copy_from_slice(&blocks.to_be_bytes());
    s[12..20].copy_from_slice(&src.to_be_bytes());
    s[20..28].copy_from_slice(&dst.to_be_bytes());
    d.extend_from_slice(&s);
    d[2..4].copy_from_slice(&64u16.to_be_bytes());
    d[8..12].copy_from_slice(&28u32.to_be_bytes());
    d
}

fn xcopy_cdb(len: usize) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

#[test]
fn extended_copy_between_volumes_shares_blocks() {
    let size = 256u64 << 20;
    let f = fixture(&[size, size]);
    let n = f.login("a");
    let (a, b) = (&f.devices[0], &f.devices[1]);
    futures::executor::block_on(async {
        let mut at = 0;
        while at < size {
            let chunk: Vec<u8> = (0..(4 << 20))
                .map(|i| ((i + at as usize) % 253) as u8)
                .collect();
            a.write(at, Bytes::from(chunk), WriteFlags::default())
                .await
                .unwrap();
            at += 4 << 20;
        }
    });
    let physical_before = a.physical_bytes() + b.physical_bytes();
    let (src, dst) = (f.unit(0).designator(), f.unit(1).designator());
    // 16 MiB per command, as ESXi sends with DataMover.MaxHWTransferSize
    // at its recommended maximum.
    let started = Instant::now();
    let per_command = 32768u64;
    let mut lba = 0;
    let blocks = size / BLOCK as u64;
    while lba < blocks {
        let step = per_command.min(blocks - lba) as u16;
        let list = xcopy_list(&src, &dst, step, lba, lba);
        good(&f.run(&n, 1, &xcopy_cdb(list.len()), &list));
        lba += step as u64;
    }
    let elapsed = started.elapsed();
    eprintln!(
        "EXTENDED COPY of {} MiB between volumes: {:?}; physical bytes {} before, {} after",
        size >> 20,
        elapsed,
        physical_before,
        a.physical_bytes() + b.physical_bytes()
    );
    assert_eq!(a.physical_bytes() + b.physical_bytes(), physical_before);
    assert_eq!(
        good(&f.run(&n, 1, &read16(12345, 64), &[])),
        good(&f.run(&n, 0, &read16(12345, 64), &[]))
    );
    // Writing the clone leaves the source as it was.
    good(&f.run(&n, 1, &write16(0, 1), &[0xEE; BLOCK]));
    assert_ne!(good(&f.run(&n, 0, &read16(0, 1), &[]))[0], 0xEE);
    let c = f.unit(1).counters();
    assert_eq!(c.clone_write_blocks, blocks);
    // COPY STATUS of the last list, then a copy past the end.
    let mut rcr = [0u8; 16];
    rcr[0] = 0x84;
    rcr[2] = 1;
    rcr[13] = 64;
    let status = good(&f.run(&n, 1, &rcr, &[])).clone();
    assert_eq!(status[4], 0x01);
    let list = xcopy_list(&src, &dst, 8, 0, blocks - 4);
    assert_eq!(sense(&f.run(&n, 1, &xcopy_cdb(list.len()), &list)).0, 0x0A);
    let mut unknown = xcopy_list(&src, &dst, 8, 0, 0);
    unknown[16 + 32 + 8 + 15] ^= 0xFF; // a designator no unit has
    assert_eq!(
        sense(&f.run(&n, 1, &xcopy_cdb(unknown.len()), &unknown)),
        (0x0A, 0x08, 0x04)
    );
}

/// A unit over a read-only device (a snapshot) at LUN 0 holding 0x5A in
/// every block, and a writable one at LUN 1.
fn read_only_fixture() -> Fixture {
    let datastore = MemoryDatastore::new();
    let target = BlockTarget::new();
    let size = 1u64 << 20;
    let source = MemoryDevice::new("vol@snap", size);
    futures::executor::block_on(source.write(
        0,
        Bytes::from(vec![0x5Au8; size as usize]),
        WriteFlags::default(),
    ))
    .unwrap();
    let devices = vec![
        Arc::new(source.read_only()),
        Arc::new(MemoryDevice::new("vol", size)),
    ];
    let mut environments = Vec::new();
    for (lun, device) in devices.iter().enumerate() {
        datastore.add(device.clone());
        let environment = Arc::new(MemoryEnvironment::new(datastore.clone()));
        let unit = LogicalUnit::new(device.clone(), environment.clone(), UnitSettings::default());
        target.insert_unit(lun as u64, Arc::new(unit));
        environments.push(environment);
    }
    Fixture {
        target,
        datastore,
        devices,
        environments,
    }
}

#[test]
fn a_read_only_unit_reports_write_protect_and_refuses_every_change() {
    let f = read_only_fixture();
    let n = f.login("a");
    const PROTECTED: (u8, u8, u8) = (0x07, 0x27, 0x00);
    // MODE SENSE(6) and (10) set WP in the device-specific parameter; the
    // writable unit does not.
    let six = good(&f.run(&n, 0, &[0x1A, 0, 0x3F, 0, 255, 0], &[])).clone();
    assert_eq!(six[2] & 0x80, 0x80, "WP in MODE SENSE(6)");
    let ten = good(&f.run(&n, 0, &[0x5A, 0, 0x3F, 0, 0, 0, 0, 1, 0, 0], &[])).clone();
    assert_eq!(ten[3] & 0x80, 0x80, "WP in MODE SENSE(10)");
    let writable = good(&f.run(&n, 1, &[0x1A, 0, 0x3F, 0, 255, 0], &[])).clone();
    assert_eq!(writable[2] & 0x80, 0);

    let block = [0xEEu8; BLOCK];
    let mut unmap = vec![0u8; 24];
    unmap[1] = 22;
    unmap[3] = 16;
    unmap[16..20].copy_from_slice(&1u32.to_be_bytes());
    let write10 = [0x2A, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    let refused: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
        ("WRITE(10)", write10.to_vec(), block.to_vec()),
        ("WRITE(16)", write16(0, 1).to_vec(), block.to_vec()),
        ("WRITE(16) of no block", write16(0, 0).to_vec(), Vec::new()),
        (
            "WRITE AND VERIFY(16)",
            cdb16(0x8E, 0, 0, 1).to_vec(),
            block.to_vec(),
        ),
        (
            "WRITE SAME(10)",
            vec![0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0],
            block.to_vec(),
        ),
        (
            "WRITE SAME(16)",
            cdb16(0x93, 0, 0, 1).to_vec(),
            block.to_vec(),
        ),
        (
            "WRITE SAME(16) with UNMAP",
            cdb16(0x93, 0x08, 0, 1).to_vec(),
            [0u8; BLOCK].to_vec(),
        ),
        // As libiscsi's read-only suite sends it: write protect comes
        // before the missing data-out.
        (
            "WRITE SAME(10) with UNMAP and no data",
            vec![0x41, 0x08, 0, 0, 0, 0, 0, 0, 1, 0],
            Vec::new(),
        ),
        (
            "UNMAP",
            vec![0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0],
            unmap.clone(),
        ),
        ("COMPARE AND WRITE", caw(0, 1).to_vec(), {
            let mut d = vec![0x5Au8; BLOCK];
            d.extend_from_slice(&block);
            d
        }),
        ("ORWRITE(16)", cdb16(0x8B, 0, 0, 1).to_vec(), block.to_vec()),
        (
            "WRITE ATOMIC(16)",
            cdb16(0x9C, 0, 0, 1).to_vec(),
            block.to_vec(),
        ),
    ];
    for (name, cdb, data) in &refused {
        assert_eq!(sense(&f.run(&n, 0, cdb, data)), PROTECTED, "{name}");
    }
    // EXTENDED COPY into it is a write to it, sent to either unit.
    let (snapshot, volume) = (f.unit(0).designator(), f.unit(1).designator());
    let into = xcopy_list(&volume, &snapshot, 1, 0, 0);
    assert_eq!(
        sense(&f.run(&n, 0, &xcopy_cdb(into.len()), &into)),
        PROTECTED
    );
    assert_eq!(
        sense(&f.run(&n, 1, &xcopy_cdb(into.len()), &into)),
        (0x0A, 0x27, 0x00),
        "the copy manager of another unit aborts the segment"
    );
    // Nothing changed; reads, SYNCHRONIZE CACHE and a copy out of it work.
    assert!(good(&f.run(&n, 0, &read16(0, 2), &[]))
        .iter()
        .all(|&b| b == 0x5A));
    good(&f.run(&n, 0, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]));
    good(&f.run(&n, 0, &cdb16(0x91, 0, 0, 0), &[]));
    let out = xcopy_list(&snapshot, &volume, 4, 0, 8);
    good(&f.run(&n, 0, &xcopy_cdb(out.len()), &out));
    assert!(good(&f.run(&n, 1, &read16(8, 4), &[]))
        .iter()
        .all(|&b| b == 0x5A));
    assert_eq!(f.unit(0).counters().clone_write_blocks, 0);
}

#[test]
fn persistent_reservations_conflict_per_type() {
    let f = fixture(&[1 << 20]);
    let (a, b) = (f.login("a"), f.login("b"));
    let prout = |who: &Nexus, sa: u8, kind: u8, key: u64, sa_key: u64| {
        let mut p = [0u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&sa_key.to_be_bytes());
        f.run(who, 0, &[0x5F, sa, kind, 0, 0, 0, 0, 0, 24, 0], &p)
    };
    good(&prout(&a, 0, 0, 0, 0xA));
    good(&prout(&b, 0, 0, 0, 0xB));
    assert_eq!(prout(&b, 0, 0, 0, 0xC).status, Status::ReservationConflict);
    good(&prout(&a, 1, 0x01, 0xA, 0)); // WRITE EXCLUSIVE
    good(&f.run(&b, 0, &read16(0, 1), &[]));
    assert_eq!(
        f.run(&b, 0, &write16(0, 1), &[0; BLOCK]).status,
        Status::ReservationConflict
    );
    good(&f.run(&a, 0, &write16(0, 1), &[0; BLOCK]));
    // RELEASE with the wrong type.
    assert_eq!(sense(&prout(&a, 2, 0x03, 0xA, 0)), (5, 0x26, 0x04));
    // PREEMPT by b takes the reservation and removes a's key.
    good(&prout(&b, 4, 0x03, 0xB, 0xA));
    assert_eq!(sense(&f.run(&a, 0, &read16(0, 1), &[])), (6, 0x2A, 0x05));
    assert_eq!(
        f.run(&a, 0, &read16(0, 1), &[]).status,
        Status::ReservationConflict
    );
    let keys = good(&f.run(&a, 0, &[0x5E, 0, 0, 0, 0, 0, 0, 0, 64, 0], &[])).clone();
    assert_eq!(&keys[4..8], &8u32.to_be_bytes());
    assert_eq!(&keys[8..16], &0xBu64.to_be_bytes());
    good(&prout(&b, 3, 0, 0xB, 0)); // CLEAR
    good(&f.run(&a, 0, &write16(0, 1), &[0; BLOCK]));
}

#[test]
fn reserve6_ends_with_its_nexus() {
    let f = fixture(&[1 << 20]);
    let (a, b) = (f.login("a"), f.login("b"));
    good(&f.run(&a, 0, &[0x16, 0, 0, 0, 0, 0], &[]));
    assert_eq!(
        f.run(&b, 0, &[0x16, 0, 0, 0, 0, 0], &[]).status,
        Status::ReservationConflict
    );
    assert_eq!(
        f.run(&b, 0, &[0x1A, 0, 0x3F, 0, 255, 0], &[]).status,
        Status::ReservationConflict
    );
    good(&f.run(&b, 0, &[0x12, 0, 0, 0, 96, 0], &[]));
    futures::executor::block_on(f.target.nexus_ended(&a));
    good(&f.run(&b, 0, &[0x16, 0, 0, 0, 0, 0], &[]));
}

#[test]
fn mode_select_write_protect_and_attention_for_others() {
    let f = fixture(&[1 << 20]);
    let (a, b) = (f.login("a"), f.login("b"));
    let all = good(&f.run(&a, 0, &[0x1A, 0x08, 0x0A, 0, 255, 0], &[])).clone();
    let mut list = all.to_vec();
    list[0] = 0;
    list[4 + 4] |= 0x08; // SWP
    good(&f.run(&a, 0, &[0x15, 0x10, 0, 0, list.len() as u8, 0], &list));
    assert_eq!(
        sense(&f.run(&a, 0, &write16(0, 1), &[1; BLOCK])),
        (7, 0x27, 0x02)
    );
    assert_eq!(sense(&f.run(&b, 0, &[0; 6], &[])), (6, 0x2A, 0x01));
    list[4 + 3] = 0; // queue algorithm modifier is not changeable
    assert_eq!(
        sense(&f.run(&a, 0, &[0x15, 0x10, 0, 0, list.len() as u8, 0], &list)),
        (5, 0x26, 0x00)
    );
}

#[test]
fn soft_threshold_attention_is_raised_once_per_crossing() {
    let f = fixture(&[8 << 20]);
    f.datastore.set_capacity(4 << 20);
    let n = f.login("a");
    good(&f.run(&n, 0, &write16(0, 2048), &vec![1u8; 2048 * BLOCK]));
    good(&f.run(&n, 0, &write16(2048, 5120), &vec![1u8; 5120 * BLOCK]));
    assert_eq!(sense(&f.run(&n, 0, &[0; 6], &[])), (6, 0x38, 0x07));
    good(&f.run(&n, 0, &write16(7168, 8), &[1u8; 8 * BLOCK]));
    good(&f.run(&n, 0, &[0; 6], &[]));
}

#[test]
fn the_datastore_s_soft_threshold_wins_over_the_unit_s_and_may_change() {
    let f = fixture(&[8 << 20]);
    f.datastore.set_capacity(8 << 20);
    let n = f.login("a");
    // 50% in use: under the unit's 80%, over a datastore threshold of 40%.
    good(&f.run(&n, 0, &write16(0, 8192), &vec![1u8; 8192 * BLOCK]));
    good(&f.run(&n, 0, &[0; 6], &[]));
    f.datastore.set_soft_threshold(Some(40));
    good(&f.run(&n, 0, &write16(0, 8), &[2u8; 8 * BLOCK]));
    assert_eq!(sense(&f.run(&n, 0, &[0; 6], &[])), (6, 0x38, 0x07));
    // Raised back to 90%: under it, nothing more is raised.
    f.datastore.set_soft_threshold(Some(90));
    good(&f.run(&n, 0, &write16(8192, 2048), &vec![3u8; 2048 * BLOCK]));
    good(&f.run(&n, 0, &[0; 6], &[]));
}

/// Operation codes REPORT SUPPORTED OPERATION CODES lists (option 0).
fn listed_opcodes(f: &Fixture, n: &Nexus) -> Vec<u8> {
    let all = good(&f.run(n, 0, &[0xA3, 0x0C, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0], &[])).clone();
    all[4..].chunks(8).map(|d| d[0]).collect()
}

#[test]
fn an_offload_turned_off_is_refused_unlisted_and_announced() {
    let f = fixture(&[16 << 20, 16 << 20]);
    let n = f.login("a");
    good(&f.run(&n, 0, &write16(0, 64), &[9u8; 64 * BLOCK]));
    let on = listed_opcodes(&f, &n);
    for op in [0x89u8, 0x83, 0x84, 0x41, 0x93, 0x42] {
        assert!(on.contains(&op), "{op:#x} listed while offered");
    }
    let none = Offloads {
        compare_and_write: false,
        extended_copy: false,
        write_same: false,
        unmap: false,
    };
    f.environments[0].set_offloads(none);
    // The next command hears that the INQUIRY data changed, once.
    assert_eq!(sense(&f.run(&n, 0, &[0; 6], &[])), (6, 0x3F, 0x03));
    good(&f.run(&n, 0, &[0; 6], &[]));
    let before = f.devices[0].space().allocated_bytes;
    let mut caw_data = vec![9u8; BLOCK];
    caw_data.extend_from_slice(&[1u8; BLOCK]);
    let mut unmap_list = vec![0u8; 24];
    unmap_list[1] = 22;
    unmap_list[3] = 16;
    unmap_list[16..20].copy_from_slice(&64u32.to_be_bytes());
    let d0 = f.unit(0).designator();
    let d1 = f.unit(1).designator();
    let copy = xcopy_list(&d0, &d1, 8, 0, 0);
    let refused: [(&[u8], &[u8]); 6] = [
        (&caw(0, 1), &caw_data),
        (&cdb16(0x93, 0, 0, 64), &[0u8; BLOCK]),
        (&[0x41, 0, 0, 0, 0, 0, 0, 0, 8, 0], &[0u8; BLOCK]),
        (&[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &unmap_list),
        (&xcopy_cdb(copy.len()), &copy),
        (&[0x84, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]),
    ];
    for (cdb, data) in refused {
        assert_eq!(
            sense(&f.run(&n, 0, cdb, data)),
            (5, 0x20, 0x00),
            "{:#x} refused as an unsupported operation code",
            cdb[0]
        );
    }
    // Nothing changed, nothing was counted.
    assert_eq!(f.devices[0].space().allocated_bytes, before);
    assert!(good(&f.run(&n, 0, &read16(0, 64), &[]))
        .iter()
        .all(|&b| b == 9));
    assert_eq!(f.devices[1].space().allocated_bytes, 0);
    let c = f.unit(0).counters();
    assert_eq!(
        (c.ats, c.clone_commands, c.zero_blocks, c.delete_blocks),
        (0, 0, 0, 0)
    );
    let off = listed_opcodes(&f, &n);
    for op in [0x89u8, 0x83, 0x84, 0x41, 0x93, 0x42] {
        assert!(!off.contains(&op), "{op:#x} not listed while refused");
    }
    let offloads = [0x89u8, 0x83, 0x84, 0x41, 0x93, 0x42];
    let rest: Vec<u8> = on.into_iter().filter(|op| !offloads.contains(op)).collect();
    assert_eq!(off, rest, "every other command still listed");
    // One command asked about: SUPPORT 001b, not supported.
    let one = good(&f.run(
        &n,
        0,
        &[0xA3, 0x0C, 0x01, 0x42, 0, 0, 0, 0, 1, 0, 0, 0],
        &[],
    ))
    .clone();
    assert_eq!(one[1] & 0x07, 0x01);
    // INQUIRY: no 3PC, no third-party copy page.
    assert_eq!(
        good(&f.run(&n, 0, &[0x12, 0, 0, 0, 96, 0], &[]))[5] & 0x08,
        0
    );
    assert_eq!(
        sense(&f.run(&n, 0, &[0x12, 1, 0x8F, 0, 255, 0], &[])),
        (5, 0x24, 0x00)
    );
    // The other unit, whose environment offers everything, is untouched.
    good(&f.run(&n, 1, &cdb16(0x93, 0, 0, 8), &[0u8; BLOCK]));
    // Back on: announced again, and UNMAP works.
    f.environments[0].set_offloads(Offloads {
        unmap: true,
        ..none
    });
    assert_eq!(sense(&f.run(&n, 0, &[0; 6], &[])), (6, 0x3F, 0x03));
    good(&f.run(&n, 0, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &unmap_list));
    assert_eq!(f.devices[0].space().allocated_bytes, 0);
    assert_eq!(f.unit(0).counters().delete_blocks, 64);
}

#[test]
fn supported_opcodes_report_usage_and_timeouts() {
    let f = fixture(&[1 << 20]);
    let n = f.login("a");
    let one = good(&f.run(
        &n,
        0,
        &[0xA3, 0x0C, 0x81, 0x89, 0, 0, 0, 0, 1, 0, 0, 0],
        &[],
    ))
    .clone();
    assert_eq!(one[1], 0x83);
    assert_eq!(u16::from_be_bytes([one[2], one[3]]), 16);
    assert_eq!(one[4], 0x89);
    assert_eq!(one[5] & 0x18, 0x18, "DPO and FUA");
    assert_eq!(&one[20..22], &0x0Au16.to_be_bytes());
    // Reporting option 1 for an operation code with service actions.
    assert_eq!(
        sense(&f.run(
            &n,
            0,
            &[0xA3, 0x0C, 0x01, 0x9E, 0, 0, 0, 0, 1, 0, 0, 0],
            &[]
        )),
        (5, 0x24, 0x00)
    );
}
