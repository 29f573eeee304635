//! SCSI behaviour libiscsi 1.19's suite does not check, through
//! `ScsiTarget::execute` with raw CDBs over in-memory volumes: the
//! MISCOMPARE information field of COMPARE AND WRITE at every byte
//! position, the VPD page list, REPORT TARGET PORT GROUPS in every access
//! state, SPACE ALLOCATION FAILED WRITE PROTECT when the datastore is full,
//! and the soft threshold attention once per crossing.

use bytes::Bytes;
use std::sync::Arc;
use tessera_blockdev::MemoryDevice;
use tessera_iscsi::scsi::sense::{decode_information, decode_key_code};
use tessera_iscsi::scsi::{
    AluaState, BlockTarget, Command, LogicalUnit, MemoryDatastore, MemoryEnvironment, Nexus,
    Response, ScsiTarget, Status, TargetPortGroup, TaskAttribute, UnitSettings,
};

const BLOCK: usize = 512;

struct Fixture {
    target: BlockTarget,
    datastore: Arc<MemoryDatastore>,
    environment: Arc<MemoryEnvironment>,
}

fn fixture(device: MemoryDevice) -> Fixture {
    let datastore = MemoryDatastore::new();
    let device = Arc::new(device);
    datastore.add(device.clone());
    let environment = Arc::new(MemoryEnvironment::new(datastore.clone()));
    let unit = LogicalUnit::new(device, environment.clone(), UnitSettings::default());
    let target = BlockTarget::new();
    target.insert_unit(0, Arc::new(unit));
    Fixture {
        target,
        datastore,
        environment,
    }
}

impl Fixture {
    fn run(&self, who: &Nexus, cdb: &[u8], data_out: &[u8]) -> Response {
        futures::executor::block_on(self.target.execute(Command {
            nexus: who.clone(),
            lun: 0,
            cdb: Bytes::copy_from_slice(cdb),
            data_out: Bytes::copy_from_slice(data_out),
            expected_data_in: 1 << 24,
            attribute: TaskAttribute::Simple,
            tag: 1,
        }))
    }

    /// A nexus on `port`, past its power-on unit attention.
    fn login(&self, name: &str, port: u16) -> Nexus {
        let n = Nexus {
            initiator_port: format!("iqn.2026-11.test:{name},i,0x400000000001"),
            relative_port: port,
        };
        assert_eq!(sense(&self.run(&n, &[0; 6], &[])), (6, 0x29, 0x00));
        good(&self.run(&n, &[0; 6], &[]));
        n
    }
}

fn sense(r: &Response) -> (u8, u8, u8) {
    assert_eq!(r.status, Status::CheckCondition, "{r:?}");
    decode_key_code(r.sense.as_ref().unwrap()).unwrap()
}

fn good(r: &Response) -> Bytes {
    assert_eq!(r.status, Status::Good, "{r:?}");
    r.data_in.clone()
}

fn cdb16(op: u8, lba: u64, count: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&count.to_be_bytes());
    c
}

fn write16(lba: u64, blocks: u32) -> [u8; 16] {
    cdb16(0x8A, lba, blocks)
}

fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    cdb16(0x88, lba, blocks)
}

fn unmap(lba: u64, blocks: u32) -> ([u8; 10], Vec<u8>) {
    let mut list = vec![0u8; 24];
    list[0..2].copy_from_slice(&22u16.to_be_bytes());
    list[2..4].copy_from_slice(&16u16.to_be_bytes());
    list[8..16].copy_from_slice(&lba.to_be_bytes());
    list[16..20].copy_from_slice(&blocks.to_be_bytes());
    let mut c = [0u8; 10];
    c[0] = 0x42;
    c[7..9].copy_from_slice(&24u16.to_be_bytes());
    (c, list)
}

#[test]
fn compare_and_write_miscompare_names_the_first_differing_byte_at_every_position() {
    let f = fixture(MemoryDevice::new("caw", 1 << 20));
    let n = f.login("a", 1);
    let stored: Vec<u8> = (0..2 * BLOCK).map(|i| (i * 7 + 3) as u8).collect();
    good(&f.run(&n, &write16(100, 2), &stored));
    let mut caw = cdb16(0x89, 100, 0);
    caw[10..14].fill(0);
    caw[13] = 2;
    let replacement = vec![0xEEu8; 2 * BLOCK];
    for position in 0..2 * BLOCK {
        let mut compare = stored.clone();
        compare[position] ^= 0x5A;
        // A second difference further on must not move the reported offset.
        if position + 1 < 2 * BLOCK {
            compare[2 * BLOCK - 1] ^= 0x01;
        }
        let r = f.run(&n, &caw, &[compare, replacement.clone()].concat());
        assert_eq!(sense(&r), (0x0E, 0x1D, 0x00), "byte {position}");
        assert_eq!(
            decode_information(r.sense.as_ref().unwrap()),
            Some(position as u64),
            "byte {position}"
        );
    }
    assert_eq!(good(&f.run(&n, &read16(100, 2), &[])), stored);
    good(&f.run(&n, &caw, &[stored.clone(), replacement.clone()].concat()));
    assert_eq!(good(&f.run(&n, &read16(100, 2), &[])), replacement);
}

#[test]
fn vpd_page_list_is_ascending_and_every_listed_page_answers() {
    let f = fixture(MemoryDevice::new("vpd", 1 << 20));
    let n = f.login("a", 1);
    let list = good(&f.run(&n, &[0x12, 0x01, 0x00, 0x01, 0x00, 0], &[]));
    assert_eq!(list[1], 0x00);
    let length = u16::from_be_bytes([list[2], list[3]]) as usize;
    let pages = &list[4..4 + length];
    assert!(pages.len() >= 8, "{pages:?}");
    assert!(pages.windows(2).all(|w| w[0] < w[1]), "{pages:?}");
    for &page in pages {
        let data = good(&f.run(&n, &[0x12, 0x01, page, 0x10, 0x00, 0], &[]));
        assert_eq!(data[1], page);
        let declared = u16::from_be_bytes([data[2], data[3]]) as usize;
        assert_eq!(data.len(), 4 + declared, "page {page:#04x}");
    }
    // A page not in the list is refused at the page code byte.
    let unlisted = (0x01..=0xFFu8).find(|p| !pages.contains(p)).unwrap();
    assert_eq!(
        sense(&f.run(&n, &[0x12, 0x01, unlisted, 0x01, 0x00, 0], &[])),
        (5, 0x24, 0x00)
    );
}

#[test]
fn report_target_port_groups_reports_every_access_state_and_its_ports() {
    let f = fixture(MemoryDevice::new("alua", 1 << 20));
    let groups = [
        (1u16, AluaState::ActiveOptimized, vec![1u16]),
        (2, AluaState::ActiveNonOptimized, vec![2, 3]),
        (3, AluaState::Standby, vec![4]),
        (4, AluaState::Unavailable, vec![5]),
        (5, AluaState::Transitioning, vec![6]),
    ];
    f.environment.set_port_groups(
        groups
            .iter()
            .map(|(id, state, ports)| TargetPortGroup {
                id: *id,
                state: *state,
                ports: ports.clone(),
            })
            .collect(),
    );
    let n = f.login("a", 2);
    for extended in [false, true] {
        let mut c = [0u8; 12];
        c[0] = 0xA3;
        c[1] = 0x0A | if extended { 0x20 } else { 0 };
        c[6..10].copy_from_slice(&4096u32.to_be_bytes());
        let data = good(&f.run(&n, &c, &[]));
        let length = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
        assert_eq!(data.len(), 4 + length);
        let mut at = 4;
        if extended {
            assert_eq!(data[4] & 0x70, 0x10, "format type");
            at = 8;
        }
        for (id, state, ports) in &groups {
            let d = &data[at..];
            assert_eq!(d[0] & 0x0F, state.code(), "group {id}");
            assert_eq!(d[1] & 0x8F, 0x8F, "supported states of group {id}");
            assert_eq!(u16::from_be_bytes([d[2], d[3]]), *id);
            assert_eq!(d[7] as usize, ports.len());
            let listed: Vec<u16> = (0..ports.len())
                .map(|i| u16::from_be_bytes([d[8 + 4 * i + 2], d[8 + 4 * i + 3]]))
                .collect();
            assert_eq!(&listed, ports);
            at += 8 + 4 * ports.len();
        }
        assert_eq!(at, data.len());
    }
    // The device identification page names the nexus's own port and group.
    let page = good(&f.run(&n, &[0x12, 0x01, 0x83, 0x10, 0x00, 0], &[]));
    let mut at = 4;
    let (mut port, mut group) = (None, None);
    while at + 4 <= page.len() {
        let kind = page[at + 1] & 0x0F;
        let len = page[at + 3] as usize;
        let value = &page[at + 4..at + 4 + len];
        match kind {
            0x4 => port = Some(u16::from_be_bytes([value[2], value[3]])),
            0x5 => group = Some(u16::from_be_bytes([value[2], value[3]])),
            _ => {}
        }
        at += 4 + len;
    }
    assert_eq!((port, group), (Some(2), Some(2)));
}

#[test]
fn a_full_datastore_refuses_only_writes_that_need_space() {
    // Room for 16 KiB of the 1 MiB volume: four 4 KiB allocation blocks.
    let f = fixture(MemoryDevice::new("thin", 1 << 20).with_allocation_limit(16 << 10));
    let n = f.login("a", 1);
    let first = vec![0x11u8; 32 * BLOCK];
    good(&f.run(&n, &write16(0, 32), &first));
    // Unallocated blocks: DATA PROTECT, SPACE ALLOCATION FAILED WRITE
    // PROTECT, for a plain write, a pattern WRITE SAME and a COMPARE AND
    // WRITE alike, and nothing stored is harmed.
    assert_eq!(
        sense(&f.run(&n, &write16(64, 8), &[0x22u8; 8 * BLOCK])),
        (7, 0x27, 0x07)
    );
    let mut same = cdb16(0x93, 64, 8);
    same[1] = 0;
    assert_eq!(sense(&f.run(&n, &same, &[0x33u8; BLOCK])), (7, 0x27, 0x07));
    assert_eq!(good(&f.run(&n, &read16(0, 32), &[])), first);
    assert!(good(&f.run(&n, &read16(64, 8), &[]))
        .iter()
        .all(|&b| b == 0));
    // Allocated blocks stay writable.
    let second = vec![0x44u8; 8 * BLOCK];
    good(&f.run(&n, &write16(8, 8), &second));
    assert_eq!(good(&f.run(&n, &read16(8, 8), &[])), second);
    // UNMAP gives space back at once; the refused write then succeeds.
    let (c, list) = unmap(0, 8);
    good(&f.run(&n, &c, &list));
    good(&f.run(&n, &write16(64, 8), &[0x22u8; 8 * BLOCK]));
    let unit = f.target.unit(0).unwrap();
    assert_eq!(unit.counters().out_of_space, 2);
    assert_eq!(unit.device().space().allocated_bytes, 16 << 10);
}

#[test]
fn soft_threshold_attention_is_raised_once_per_crossing_on_every_nexus() {
    let f = fixture(MemoryDevice::new("soft", 8 << 20));
    // The default threshold is 80 % of 4 MiB: 3.2 MiB.
    f.datastore.set_capacity(4 << 20);
    let a = f.login("a", 1);
    let b = f.login("b", 2);
    let fill = |lba: u64, blocks: u32| {
        good(&f.run(
            &a,
            &write16(lba, blocks),
            &vec![1u8; blocks as usize * BLOCK],
        ));
    };
    fill(0, 4096); // 2 MiB: below
    good(&f.run(&a, &[0; 6], &[]));
    good(&f.run(&b, &[0; 6], &[]));
    for crossing in 0..2 {
        fill(4096, 3072); // 3.5 MiB: above
        for n in [&a, &b] {
            assert_eq!(
                sense(&f.run(n, &[0; 6], &[])),
                (6, 0x38, 0x07),
                "crossing {crossing}"
            );
            good(&f.run(n, &[0; 6], &[]));
        }
        // Staying above raises nothing more.
        fill(7168, 64);
        good(&f.run(&a, &[0; 6], &[]));
        good(&f.run(&b, &[0; 6], &[]));
        // Dropping below and writing below raises nothing either.
        let (c, list) = unmap(4096, 4096);
        good(&f.run(&a, &c, &list));
        fill(0, 8);
        good(&f.run(&a, &[0; 6], &[]));
        good(&f.run(&b, &[0; 6], &[]));
    }
}
