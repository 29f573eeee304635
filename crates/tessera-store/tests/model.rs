//! Random operation sequences against an in-memory model, with power cuts
//! and process crashes at random points: after every operation and every
//! restart the store must agree with the model on data, on which blocks are
//! allocated and on allocated space. Copies by reference (`clone_blocks`,
//! within a component and between the two) share blocks: once settled, the
//! disk group must hold exactly one block per distinct piece of data.
//!
//! Writes come in both sizes: logged (a few blocks) and placed (large
//! enough to bypass the log).
//!
//! Cases: `PROPTEST_CASES` (default 16 here, each up to 80 operations).

mod common;

use common::{bytes_of, payload, Rig};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use tessera_store::DiskGroup;
use tessera_types::{ComponentId, Epoch, Lba};

/// A thin component much larger than the devices, written sparsely so many
/// index pages exist (more than the 1 MiB index cache holds).
const BIG: ComponentId = ComponentId(1);
const BIG_BLOCKS: u64 = 1 << 18;
/// A small, densely written component.
const SMALL: ComponentId = ComponentId(2);
const SMALL_BLOCKS: u64 = 600;

#[derive(Debug, Clone)]
enum Op {
    Write {
        big: bool,
        slot: u64,
        blocks: u64,
    },
    Unmap {
        big: bool,
        slot: u64,
        blocks: u64,
        zero: bool,
    },
    Clone {
        from_big: bool,
        from_slot: u64,
        to_big: bool,
        to_slot: u64,
        blocks: u64,
    },
    Fence,
    Settle,
    PowerCut(u64),
    ProcessCrash,
}

fn lba_of(big: bool, slot: u64) -> u64 {
    if big {
        // 400 spread-out places, so writes hit ~400 different index pages
        // and also overwrite each other.
        (slot % 400) * 653 % (BIG_BLOCKS - 8)
    } else {
        slot % (SMALL_BLOCKS - 8)
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (any::<bool>(), any::<u64>(), 1u64..6).prop_map(|(big, slot, blocks)| Op::Write { big, slot, blocks }),
        // Placed writes (at least `PLACED_WRITE_BYTES_MIN`): stored straight
        // on the capacity tier, overwriting and overwritten by logged ones.
        3 => (any::<bool>(), any::<u64>(), 16u64..40).prop_map(|(big, slot, blocks)| Op::Write { big, slot, blocks }),
        3 => (any::<bool>(), any::<u64>(), 1u64..6, any::<bool>())
            .prop_map(|(big, slot, blocks, zero)| Op::Unmap { big, slot, blocks, zero }),
        3 => (any::<bool>(), any::<u64>(), any::<bool>(), any::<u64>(), 1u64..6)
            .prop_map(|(from_big, from_slot, to_big, to_slot, blocks)| Op::Clone { from_big, from_slot, to_big, to_slot, blocks }),
        1 => Just(Op::Fence),
        1 => Just(Op::Settle),
        1 => any::<u64>().prop_map(Op::PowerCut),
        1 => Just(Op::ProcessCrash),
    ]
}

/// Which payload an LBA holds: the (component, LBA, version) it was written
/// as (a copy by reference keeps the original's).
type Payload = (u64, u64, u64);

struct Model {
    blocks: BTreeMap<(u64, u64), Payload>,
    epoch: u64,
}

async fn verify(dg: &Arc<DiskGroup>, model: &Model) -> Result<(), TestCaseError> {
    for (c, size) in [(BIG, BIG_BLOCKS), (SMALL, SMALL_BLOCKS)] {
        let want: Vec<u64> = model
            .blocks
            .keys()
            .filter(|k| k.0 == c.0)
            .map(|k| k.1)
            .collect();
        let space = dg
            .component_space(c)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(
            space.allocated_bytes,
            want.len() as u64 * 4096,
            "allocated bytes of {}",
            c
        );
        let runs = dg
            .allocated(c, Lba(0), size)
            .await
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let got: Vec<u64> = runs.iter().flat_map(|(l, n)| l.0..l.0 + n).collect();
        prop_assert_eq!(&got, &want, "allocated runs of {}", c);
        for (&(_, lba), &(pc, pl, version)) in model.blocks.range((c.0, 0)..(c.0, u64::MAX)) {
            let b = dg
                .read(c, Lba(lba), 1)
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&b[..], &payload(pc, pl, version)[..], "{} {}", c, lba);
        }
    }
    let small = dg
        .read(SMALL, Lba(0), SMALL_BLOCKS as u32)
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    for lba in 0..SMALL_BLOCKS {
        let b = &small[(lba * 4096) as usize..((lba + 1) * 4096) as usize];
        match model.blocks.get(&(SMALL.0, lba)) {
            Some(&(pc, pl, v)) => prop_assert_eq!(b, &payload(pc, pl, v)[..]),
            None => prop_assert!(b.iter().all(|&x| x == 0), "LBA {} should read zeros", lba),
        }
    }
    prop_assert_eq!(dg.epoch(BIG).unwrap(), Epoch(model.epoch));
    Ok(())
}

async fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut rig = Rig::new(2);
    let mut dg = rig.create().await;
    dg.create_component(BIG, BIG_BLOCKS * 4096, 0)
        .await
        .unwrap();
    dg.create_component(SMALL, SMALL_BLOCKS * 4096, 0)
        .await
        .unwrap();
    let mut model = Model {
        blocks: BTreeMap::new(),
        epoch: 0,
    };
    let mut version = 0u64;
    for op in ops {
        let shown = format!("{op:?}");
        match op {
            Op::Write { big, slot, blocks } => {
                let c = if big { BIG } else { SMALL };
                let size = if big { BIG_BLOCKS } else { SMALL_BLOCKS };
                let lba = lba_of(big, slot).min(size - blocks);
                version += 1;
                let data: Vec<Vec<u8>> = (0..blocks)
                    .map(|i| payload(c.0, lba + i, version))
                    .collect();
                dg.write(c, Lba(lba), bytes_of(&data), Epoch(model.epoch))
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                for i in 0..blocks {
                    model.blocks.insert((c.0, lba + i), (c.0, lba + i, version));
                }
            }
            Op::Unmap {
                big,
                slot,
                blocks,
                zero,
            } => {
                let c = if big { BIG } else { SMALL };
                let lba = lba_of(big, slot);
                let r = if zero {
                    dg.write_zeroes(c, Lba(lba), blocks, Epoch(model.epoch))
                        .await
                } else {
                    dg.unmap(c, Lba(lba), blocks, Epoch(model.epoch)).await
                };
                r.map_err(|e| TestCaseError::fail(e.to_string()))?;
                for i in 0..blocks {
                    model.blocks.remove(&(c.0, lba + i));
                }
            }
            Op::Clone {
                from_big,
                from_slot,
                to_big,
                to_slot,
                blocks,
            } => {
                let (src, dst) = (
                    if from_big { BIG } else { SMALL },
                    if to_big { BIG } else { SMALL },
                );
                // Copy from where data is (most of the address space is
                // holes), so blocks are shared and then overwritten, unmapped
                // and shared again.
                let written: Vec<u64> = model
                    .blocks
                    .range((src.0, 0)..(src.0, u64::MAX))
                    .map(|(k, _)| k.1)
                    .collect();
                let from = match written.len() {
                    0 => lba_of(from_big, from_slot),
                    n => {
                        let size = if from_big { BIG_BLOCKS } else { SMALL_BLOCKS };
                        written[(from_slot % n as u64) as usize].min(size - blocks)
                    }
                };
                let to = lba_of(to_big, to_slot);
                let r = dg
                    .clone_blocks(src, Lba(from), dst, Lba(to), blocks, Epoch(model.epoch))
                    .await;
                if src == dst && from < to + blocks && to < from + blocks {
                    prop_assert!(r.is_err(), "an overlapping copy must be refused");
                    continue;
                }
                r.map_err(|e| TestCaseError::fail(e.to_string()))?;
                for i in 0..blocks {
                    match model.blocks.get(&(src.0, from + i)).copied() {
                        Some(p) => model.blocks.insert((dst.0, to + i), p),
                        None => model.blocks.remove(&(dst.0, to + i)),
                    };
                }
            }
            Op::Fence => {
                model.epoch += 1;
                dg.fence(BIG, Epoch(model.epoch))
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                dg.fence(SMALL, Epoch(model.epoch))
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            Op::Settle => dg
                .settle()
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?,
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
        dg.audit_references()
            .await
            .map_err(|e| TestCaseError::fail(format!("after {shown}: {e}")))?;
    }
    verify(&dg, &model).await?;
    // A settled store holds data blocks plus two blocks per index page that
    // maps something: physical space follows the model exactly.
    dg.settle()
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut total_pages = 0u64;
    for c in [BIG, SMALL] {
        let mapped: Vec<u64> = model
            .blocks
            .keys()
            .filter(|k| k.0 == c.0)
            .map(|k| k.1)
            .collect();
        let mut pages: Vec<u64> = mapped.iter().map(|l| l / 252).collect();
        pages.dedup();
        total_pages += pages.len() as u64;
        let space = dg.component_space(c).unwrap();
        prop_assert_eq!(
            space.physical_bytes,
            (mapped.len() as u64 + 2 * pages.len() as u64) * 4096,
            "physical bytes of {}",
            c
        );
    }
    // Shared blocks are stored once, and every block a settled store no
    // longer references is free again.
    let distinct: std::collections::BTreeSet<Payload> = model.blocks.values().copied().collect();
    prop_assert_eq!(
        dg.space().physical_bytes,
        (distinct.len() as u64 + 2 * total_pages) * 4096,
        "physical bytes of the disk group"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(16),
        ..ProptestConfig::default()
    })]

    #[test]
    fn store_agrees_with_the_model_across_crashes(ops in proptest::collection::vec(op(), 1..80)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(run(ops))?;
    }
}
