//! Snapshots and linked clones against an in-memory model, with power cuts
//! and process crashes at random points: random writes, unmaps, snapshots,
//! clones of snapshots and deletes of either, in any order. After every
//! restart and at the end, every component (live, snapshot or clone) must
//! hold exactly what the model says, snapshots must refuse changes, and once
//! every snapshot and clone is deleted and the store settled, the disk group
//! must hold exactly the live components' blocks and pages: nothing a
//! snapshot shared leaks, and nothing a live component still needs was
//! freed. After every operation, every block's reference count must match
//! what references it (`DiskGroup::audit_references`).
//!
//! Cases: `PROPTEST_CASES` (default 16 here, each up to 80 operations).

mod common;

use common::{bytes_of, payload, Rig};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use tessera_store::{DiskGroup, StoreError};
use tessera_types::{ComponentId, Epoch, Lba};

/// A thin component much larger than the devices, written sparsely (many
/// index pages, more than the 1 MiB index cache holds).
const BIG: u64 = 1;
const BIG_BLOCKS: u64 = 1 << 18;
/// A small, densely written component.
const SMALL: u64 = 2;
const SMALL_BLOCKS: u64 = 600;

#[derive(Debug, Clone)]
enum Op {
    /// Write to the `target`-th writable component.
    Write {
        target: usize,
        slot: u64,
        blocks: u64,
    },
    Unmap {
        target: usize,
        slot: u64,
        blocks: u64,
    },
    /// Snapshot the `source`-th writable component.
    Snapshot {
        source: usize,
    },
    /// Clone the `source`-th snapshot.
    Clone {
        source: usize,
    },
    /// Delete the `victim`-th snapshot or clone.
    Delete {
        victim: usize,
    },
    Settle,
    PowerCut(u64),
    ProcessCrash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (any::<usize>(), any::<u64>(), 1u64..6).prop_map(|(target, slot, blocks)| Op::Write { target, slot, blocks }),
        // Placed writes, stored straight on the capacity tier.
        2 => (any::<usize>(), any::<u64>(), 16u64..40).prop_map(|(target, slot, blocks)| Op::Write { target, slot, blocks }),
        3 => (any::<usize>(), any::<u64>(), 1u64..6).prop_map(|(target, slot, blocks)| Op::Unmap { target, slot, blocks }),
        3 => any::<usize>().prop_map(|source| Op::Snapshot { source }),
        2 => any::<usize>().prop_map(|source| Op::Clone { source }),
        2 => any::<usize>().prop_map(|victim| Op::Delete { victim }),
        1 => Just(Op::Settle),
        1 => any::<u64>().prop_map(Op::PowerCut),
        1 => Just(Op::ProcessCrash),
    ]
}

/// Which payload an LBA holds: the (component, LBA, version) it was
/// written as.
type Payload = (u64, u64, u64);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Live,
    Snapshot,
    Clone,
}

struct Model {
    /// Component id: (blocks, kind).
    comps: BTreeMap<u64, (u64, Kind)>,
    blocks: BTreeMap<(u64, u64), Payload>,
    next_id: u64,
}

impl Model {
    fn of(&self, pick: impl Fn(Kind) -> bool) -> Vec<u64> {
        self.comps
            .iter()
            .filter(|(_, (_, k))| pick(*k))
            .map(|(id, _)| *id)
            .collect()
    }

    fn copy(&mut self, src: u64, dst: u64, kind: Kind) {
        let size = self.comps[&src].0;
        self.comps.insert(dst, (size, kind));
        let copied: Vec<(u64, Payload)> = self
            .blocks
            .range((src, 0)..(src, u64::MAX))
            .map(|(k, p)| (k.1, *p))
            .collect();
        for (lba, p) in copied {
            self.blocks.insert((dst, lba), p);
        }
    }
}

fn lba_of(size: u64, slot: u64) -> u64 {
    if size == BIG_BLOCKS {
        // 400 spread-out places, so writes hit ~400 different index pages
        // and also overwrite each other.
        (slot % 400) * 653 % (BIG_BLOCKS - 64)
    } else {
        slot % (SMALL_BLOCKS - 64)
    }
}

fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

async fn verify(dg: &Arc<DiskGroup>, model: &Model) -> Result<(), TestCaseError> {
    for (&c, &(size, kind)) in &model.comps {
        let id = ComponentId(c);
        let want: Vec<u64> = model
            .blocks
            .range((c, 0)..(c, u64::MAX))
            .map(|(k, _)| k.1)
            .collect();
        let space = dg.component_space(id).map_err(fail)?;
        prop_assert_eq!(
            space.allocated_bytes,
            want.len() as u64 * 4096,
            "allocated bytes of {}",
            c
        );
        prop_assert_eq!(dg.is_snapshot(id).map_err(fail)?, kind == Kind::Snapshot);
        let runs = dg.allocated(id, Lba(0), size).await.map_err(fail)?;
        let got: Vec<u64> = runs.iter().flat_map(|(l, n)| l.0..l.0 + n).collect();
        prop_assert_eq!(&got, &want, "allocated runs of {}", c);
        for (&(_, lba), &(pc, pl, version)) in model.blocks.range((c, 0)..(c, u64::MAX)) {
            let b = dg.read(id, Lba(lba), 1).await.map_err(fail)?;
            prop_assert_eq!(
                &b[..],
                &payload(pc, pl, version)[..],
                "component {} LBA {}",
                c,
                lba
            );
        }
        if size == SMALL_BLOCKS {
            let all = dg
                .read(id, Lba(0), SMALL_BLOCKS as u32)
                .await
                .map_err(fail)?;
            for lba in 0..SMALL_BLOCKS {
                let b = &all[(lba * 4096) as usize..((lba + 1) * 4096) as usize];
                match model.blocks.get(&(c, lba)) {
                    Some(&(pc, pl, v)) => prop_assert_eq!(b, &payload(pc, pl, v)[..]),
                    None => prop_assert!(
                        b.iter().all(|&x| x == 0),
                        "{} LBA {} should read zeros",
                        c,
                        lba
                    ),
                }
            }
        }
    }
    // What `changed` names between any two components of one size covers
    // every block where they differ (what a rebuild copies between them).
    for (&a, &(size, _)) in &model.comps {
        for (&b, &(other_size, _)) in &model.comps {
            if a == b || size != other_size {
                continue;
            }
            let runs = dg
                .changed(ComponentId(a), ComponentId(b), Lba(0), size)
                .await
                .map_err(fail)?;
            let named: std::collections::BTreeSet<u64> =
                runs.iter().flat_map(|(l, n)| l.0..l.0 + n).collect();
            let lbas: std::collections::BTreeSet<u64> = [a, b]
                .iter()
                .flat_map(|&c| model.blocks.range((c, 0)..(c, u64::MAX)).map(|(k, _)| k.1))
                .collect();
            for lba in lbas {
                if model.blocks.get(&(a, lba)) != model.blocks.get(&(b, lba)) {
                    prop_assert!(
                        named.contains(&lba),
                        "LBA {} differs between {} and {} but is not named changed",
                        lba,
                        a,
                        b
                    );
                }
            }
        }
    }
    Ok(())
}

async fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut rig = Rig::new(2);
    let mut dg = rig.create().await;
    let mut model = Model {
        comps: BTreeMap::new(),
        blocks: BTreeMap::new(),
        next_id: 100,
    };
    for (c, size) in [(BIG, BIG_BLOCKS), (SMALL, SMALL_BLOCKS)] {
        dg.create_component(ComponentId(c), size * 4096, 0)
            .await
            .unwrap();
        model.comps.insert(c, (size, Kind::Live));
    }
    let epoch = Epoch(1);
    let mut version = 0u64;
    for op in ops {
        match op {
            Op::Write {
                target,
                slot,
                blocks,
            }
            | Op::Unmap {
                target,
                slot,
                blocks,
            } => {
                let writable = model.of(|k| k != Kind::Snapshot);
                let c = writable[target % writable.len()];
                let size = model.comps[&c].0;
                let lba = lba_of(size, slot);
                if let Op::Write { .. } = op {
                    version += 1;
                    let data: Vec<Vec<u8>> =
                        (0..blocks).map(|i| payload(c, lba + i, version)).collect();
                    dg.write(ComponentId(c), Lba(lba), bytes_of(&data), epoch)
                        .await
                        .map_err(fail)?;
                    for i in 0..blocks {
                        model.blocks.insert((c, lba + i), (c, lba + i, version));
                    }
                } else {
                    dg.unmap(ComponentId(c), Lba(lba), blocks, epoch)
                        .await
                        .map_err(fail)?;
                    for i in 0..blocks {
                        model.blocks.remove(&(c, lba + i));
                    }
                }
            }
            Op::Snapshot { source } => {
                let writable = model.of(|k| k != Kind::Snapshot);
                let src = writable[source % writable.len()];
                let dst = model.next_id;
                model.next_id += 1;
                dg.snapshot_component(ComponentId(src), ComponentId(dst), epoch)
                    .await
                    .map_err(fail)?;
                model.copy(src, dst, Kind::Snapshot);
                // A snapshot refuses every change.
                let refused = dg
                    .write(
                        ComponentId(dst),
                        Lba(0),
                        bytes_of(&[payload(dst, 0, 0)]),
                        epoch,
                    )
                    .await;
                prop_assert!(
                    matches!(refused, Err(StoreError::ReadOnly { .. })),
                    "{:?}",
                    refused
                );
                let refused = dg.unmap(ComponentId(dst), Lba(0), 1, epoch).await;
                prop_assert!(
                    matches!(refused, Err(StoreError::ReadOnly { .. })),
                    "{:?}",
                    refused
                );
            }
            Op::Clone { source } => {
                let snapshots = model.of(|k| k == Kind::Snapshot);
                if snapshots.is_empty() {
                    continue;
                }
                let src = snapshots[source % snapshots.len()];
                let dst = model.next_id;
                model.next_id += 1;
                dg.clone_component(ComponentId(src), ComponentId(dst), epoch)
                    .await
                    .map_err(fail)?;
                model.copy(src, dst, Kind::Clone);
            }
            Op::Delete { victim } => {
                let copies = model.of(|k| k != Kind::Live);
                if copies.is_empty() {
                    continue;
                }
                let c = copies[victim % copies.len()];
                dg.delete_component(ComponentId(c)).await.map_err(fail)?;
                model.comps.remove(&c);
                let gone: Vec<(u64, u64)> = model
                    .blocks
                    .range((c, 0)..(c, u64::MAX))
                    .map(|(k, _)| *k)
                    .collect();
                for k in gone {
                    model.blocks.remove(&k);
                }
            }
            Op::Settle => dg.settle().await.map_err(fail)?,
            Op::PowerCut(seed) => {
                let next = rig.power_cut(seed);
                drop(dg);
                rig = next;
                dg = rig.open().await;
                verify(&dg, &model).await?;
            }
            Op::ProcessCrash => {
                let next = rig.process_crash();
                drop(dg);
                rig = next;
                dg = rig.open().await;
            }
        }
        // Every block's reference count is what references it.
        dg.audit_references().await.map_err(fail)?;
    }
    verify(&dg, &model).await?;
    // The same after a clean restart.
    dg.settle().await.map_err(fail)?;
    let next = rig.process_crash();
    drop(dg);
    rig = next;
    dg = rig.open().await;
    verify(&dg, &model).await?;
    // Every snapshot and clone deleted: the disk group holds exactly the
    // live components' blocks and pages again.
    for c in model.of(|k| k != Kind::Live) {
        dg.delete_component(ComponentId(c)).await.map_err(fail)?;
        model.comps.remove(&c);
    }
    model.blocks.retain(|k, _| k.0 == BIG || k.0 == SMALL);
    dg.settle().await.map_err(fail)?;
    verify(&dg, &model).await?;
    let mut total_pages = 0u64;
    for c in [BIG, SMALL] {
        let mut pages: Vec<u64> = model
            .blocks
            .range((c, 0)..(c, u64::MAX))
            .map(|(k, _)| k.1 / 252)
            .collect();
        pages.dedup();
        total_pages += pages.len() as u64;
    }
    let blocks = model.blocks.len() as u64;
    prop_assert_eq!(
        dg.space().physical_bytes,
        (blocks + 2 * total_pages) * 4096,
        "physical bytes of the disk group once every snapshot is gone"
    );
    prop_assert_eq!(
        dg.space().used_bytes,
        (blocks + 2 * total_pages) * 4096,
        "used bytes"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(16),
        ..ProptestConfig::default()
    })]

    #[test]
    fn snapshots_and_clones_agree_with_the_model_across_crashes(ops in proptest::collection::vec(op(), 1..80)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(run(ops))?;
    }
}

fn run_async<F: std::future::Future<Output = ()>>(f: F) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Writes `lbas` of `c`, one block each, as `version`.
async fn write_each(dg: &DiskGroup, c: u64, lbas: impl Iterator<Item = u64>, version: u64) {
    for lba in lbas {
        dg.write(
            ComponentId(c),
            Lba(lba),
            bytes_of(&[payload(c, lba, version)]),
            Epoch(1),
        )
        .await
        .unwrap();
    }
}

#[test]
fn a_snapshot_costs_exactly_the_blocks_overwritten_since_it_was_taken() {
    run_async(async {
        let rig = Rig::new(1);
        let dg = rig.create().await;
        dg.create_component(ComponentId(1), 64 << 20, 0)
            .await
            .unwrap();
        dg.write(
            ComponentId(1),
            Lba(0),
            bytes_of(&(0..1000).map(|l| payload(1, l, 1)).collect::<Vec<_>>()),
            Epoch(1),
        )
        .await
        .unwrap();
        dg.snapshot_component(ComponentId(1), ComponentId(2), Epoch(1))
            .await
            .unwrap();
        dg.settle().await.unwrap();
        let before = dg.space().used_bytes;
        // Overwrite 450 of the 1000 blocks, spread over every page.
        let overwritten: Vec<u64> = (0..1000).filter(|l| l % 20 < 9).collect();
        assert_eq!(overwritten.len(), 450);
        write_each(&dg, 1, overwritten.iter().copied(), 2).await;
        dg.settle().await.unwrap();
        let pages: std::collections::BTreeSet<u64> = overwritten.iter().map(|l| l / 252).collect();
        let grown = dg.space().used_bytes - before;
        assert_eq!(
            grown,
            (overwritten.len() as u64 + 2 * pages.len() as u64) * 4096,
            "the snapshot holds the overwritten blocks, and the volume has pages of its own"
        );
        // It holds alone exactly what was overwritten, and shares the rest.
        let held = dg.held_space(ComponentId(2)).await.unwrap();
        assert_eq!(held.alone_bytes, 450 * 4096);
        assert_eq!(held.shared_bytes, 550 * 4096);
        let held = dg.held_space(ComponentId(1)).await.unwrap();
        assert_eq!(
            (held.alone_bytes, held.shared_bytes),
            (450 * 4096, 550 * 4096)
        );
        // Each reads its own version.
        let snap = dg.read(ComponentId(2), Lba(0), 1000).await.unwrap();
        let live = dg.read(ComponentId(1), Lba(0), 1000).await.unwrap();
        for l in 0..1000u64 {
            let at = (l * 4096) as usize..((l + 1) * 4096) as usize;
            assert_eq!(&snap[at.clone()], &payload(1, l, 1)[..]);
            let v = if l % 20 < 9 { 2 } else { 1 };
            assert_eq!(&live[at], &payload(1, l, v)[..]);
        }
        // Between the snapshot and the volume, exactly the overwritten
        // blocks changed, and unmapping adds what it unmapped.
        let changed = |runs: Vec<(Lba, u64)>| -> Vec<u64> {
            runs.iter().flat_map(|(l, n)| l.0..l.0 + n).collect()
        };
        let runs = dg
            .changed(ComponentId(2), ComponentId(1), Lba(0), 16384)
            .await
            .unwrap();
        assert_eq!(changed(runs), overwritten);
        dg.unmap(ComponentId(1), Lba(2000), 8, Epoch(1))
            .await
            .unwrap();
        dg.unmap(ComponentId(1), Lba(999), 1, Epoch(1))
            .await
            .unwrap();
        dg.settle().await.unwrap();
        let runs = dg
            .changed(ComponentId(1), ComponentId(2), Lba(0), 16384)
            .await
            .unwrap();
        let mut want = overwritten.clone();
        want.push(999);
        assert_eq!(
            changed(runs),
            want,
            "unmapping a mapped block changes it; a hole stays a hole"
        );
        write_each(&dg, 1, 999..1000, 1).await;
        // Deleting the snapshot gives back exactly what it held alone.
        dg.delete_component(ComponentId(2)).await.unwrap();
        dg.settle().await.unwrap();
        assert_eq!(
            dg.space().used_bytes,
            before - 4096,
            "the root table and the blocks only the snapshot held are free again"
        );
        dg.audit_references().await.unwrap();
    })
}

#[test]
fn a_full_disk_group_refuses_the_first_overwrite_a_snapshot_needs_and_keeps_the_snapshot_whole() {
    run_async(async {
        let rig = Rig::new(1);
        let dg = rig.create().await;
        let cap = dg.space().capacity_bytes;
        dg.create_component(ComponentId(1), 4 * cap, 0)
            .await
            .unwrap();
        // Fill to within 64 blocks of full.
        let mut lba = 0u64;
        while dg.space().free_bytes > 64 * 4096 + 8 * 4096 * 64 {
            let blocks: Vec<Vec<u8>> = (0..64).map(|i| payload(1, lba + i, 1)).collect();
            dg.write(ComponentId(1), Lba(lba), bytes_of(&blocks), Epoch(1))
                .await
                .unwrap();
            lba += 64;
        }
        dg.snapshot_component(ComponentId(1), ComponentId(2), Epoch(1))
            .await
            .unwrap();
        // Overwriting what the snapshot shares takes new blocks until there
        // are none; then the write is refused and changes nothing.
        let mut overwritten = 0u64;
        let refused_at = loop {
            let at = overwritten * 64;
            assert!(at < lba, "the disk group never filled");
            let blocks: Vec<Vec<u8>> = (0..64).map(|i| payload(1, at + i, 2)).collect();
            match dg
                .write(ComponentId(1), Lba(at), bytes_of(&blocks), Epoch(1))
                .await
            {
                Ok(()) => overwritten += 1,
                Err(StoreError::NoSpace { lba: first, .. }) => break first,
                Err(e) => panic!("unexpected {e}"),
            }
        };
        assert_eq!(refused_at, Lba(overwritten * 64));
        dg.settle().await.unwrap();
        let snap = dg.read(ComponentId(2), Lba(0), 64).await.unwrap();
        for l in 0..64u64 {
            assert_eq!(
                &snap[(l * 4096) as usize..((l + 1) * 4096) as usize],
                &payload(1, l, 1)[..]
            );
        }
        let at = overwritten * 64;
        let live = dg.read(ComponentId(1), Lba(at), 1).await.unwrap();
        assert_eq!(
            &live[..],
            &payload(1, at, 1)[..],
            "the refused write changed nothing"
        );
        // Deleting the snapshot frees what it held: the write goes in.
        dg.delete_component(ComponentId(2)).await.unwrap();
        dg.settle().await.unwrap();
        let blocks: Vec<Vec<u8>> = (0..64).map(|i| payload(1, at + i, 2)).collect();
        dg.write(ComponentId(1), Lba(at), bytes_of(&blocks), Epoch(1))
            .await
            .unwrap();
        dg.audit_references().await.unwrap();
    })
}
