//! Snapshot depth benchmark for `bench/snapshot-bench.sh`: 4 KiB random read
//! IOPS of a volume at snapshot depths 0, 1, 8, 32, 256 and 1024 against a
//! reference volume of the same size and data in the same disk group that
//! has no snapshots, measured in turn (reference, volume, reference, ...)
//! at each depth (the ratio of all rounds' operations together); random 4 KiB writes to 45% of the volume's blocks between
//! snapshots up to depth 32 (the seed's DVD Store pattern) and to 1% after
//! (so 1024 snapshots fit the run); snapshot create and delete latency and
//! the longest write a client waited while they ran (a writer at queue depth
//! 1 on the volume meanwhile); the resident memory with every snapshot
//! present; and what the snapshots hold: the disk group's used bytes
//! against the blocks the volume overwrote since each snapshot.
//!
//! Usage: snapshot_bench DIR VOLUME_MIB SECONDS QD ROUNDS
//! Output: `key=value` lines.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_store::{DeviceSpec, DiskGroup, DiskGroupConfig};
use tessera_types::{ComponentId, DiskGroupId, Epoch, Lba};

const VOLUME: ComponentId = ComponentId(1);
const REFERENCE: ComponentId = ComponentId(2);
const FIRST_SNAPSHOT: u64 = 1000;
const MIB: u64 = 1 << 20;
/// The index cache budget: what the index may use, whatever the number of
/// snapshots.
const INDEX_CACHE_BYTES: u64 = 64 << 20;
const DEPTHS: [u64; 6] = [0, 1, 8, 32, 256, 1024];
/// Up to this depth, 45% of the blocks are written between snapshots.
const HEAVY_UNTIL: u64 = 32;

fn config(dir: &Path, capacity_bytes: u64) -> DiskGroupConfig {
    DiskGroupConfig {
        id: DiskGroupId::new("snapbench").expect("valid name"),
        cache: DeviceSpec {
            path: dir.join("cache.img"),
            size_bytes: 1 << 30,
        },
        capacity: vec![DeviceSpec {
            path: dir.join("capacity.img"),
            size_bytes: capacity_bytes,
        }],
        index_cache_bytes: INDEX_CACHE_BYTES,
        content_cache_bytes: std::env::var("CONTENT_CACHE_MIB")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(tessera_store::CONTENT_CACHE_BYTES_DEFAULT, |m| m << 20),
        direct_io: tessera_store::DirectIo::All,
        encryption: None,
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

async fn fill(dg: &DiskGroup, c: ComponentId, blocks: u64) -> Result<()> {
    const CHUNK: u64 = 256;
    let data = Bytes::from(vec![0x5au8; (CHUNK * 4096) as usize]);
    let mut lba = 0;
    while lba < blocks {
        let n = CHUNK.min(blocks - lba);
        dg.write(c, Lba(lba), data.slice(..(n * 4096) as usize), Epoch(1))
            .await?;
        lba += n;
    }
    Ok(())
}

/// `count` random 4 KiB writes to the volume at queue depth 16; returns the
/// distinct LBAs written.
async fn random_writes(
    dg: &Arc<DiskGroup>,
    blocks: u64,
    count: u64,
    seed: u64,
) -> Result<HashSet<u64>> {
    let mut tasks = Vec::new();
    let per = count.div_ceil(16);
    for t in 0..16u64 {
        let dg = dg.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 64 + t);
            let data = Bytes::from(vec![(seed % 251) as u8 | 1; 4096]);
            let mut lbas = Vec::with_capacity(per as usize);
            for _ in 0..per {
                // The last block is the pause-measuring client's.
                let lba = rng.gen_range(0..blocks - 1);
                dg.write(VOLUME, Lba(lba), data.clone(), Epoch(1)).await?;
                lbas.push(lba);
            }
            Ok::<Vec<u64>, tessera_store::StoreError>(lbas)
        }));
    }
    let mut distinct = HashSet::new();
    for t in tasks {
        distinct.extend(t.await??);
    }
    Ok(distinct)
}

async fn read_iops(
    dg: &Arc<DiskGroup>,
    c: ComponentId,
    blocks: u64,
    qd: u64,
    secs: f64,
) -> Result<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..qd {
        let (dg, stop, ops) = (dg.clone(), stop.clone(), ops.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(t + 7);
            while !stop.load(Ordering::Relaxed) {
                dg.read(c, Lba(rng.gen_range(0..blocks)), 1).await?;
                ops.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), tessera_store::StoreError>(())
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await??;
    }
    Ok(ops.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// A client writing the volume's last block at queue depth 1 while `f`
/// runs: the longest one of its writes took, in milliseconds. (One block,
/// so what snapshots hold of its writes is at most one block each.)
async fn longest_write_during<T>(
    dg: &Arc<DiskGroup>,
    blocks: u64,
    f: impl std::future::Future<Output = T>,
) -> Result<(T, f64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (dg, stop) = (dg.clone(), stop.clone());
        tokio::spawn(async move {
            let data = Bytes::from(vec![0x77u8; 4096]);
            let mut longest = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let at = Instant::now();
                dg.write(VOLUME, Lba(blocks - 1), data.clone(), Epoch(1))
                    .await?;
                longest = longest.max(at.elapsed());
            }
            Ok::<Duration, tessera_store::StoreError>(longest)
        })
    };
    // Let the writer start before the operation does.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let out = f.await;
    stop.store(true, Ordering::Relaxed);
    let longest = writer.await??;
    Ok((out, longest.as_secs_f64() * 1000.0))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 6 {
        bail!("usage: snapshot_bench DIR VOLUME_MIB SECONDS QD ROUNDS");
    }
    let dir = Path::new(&args[1]);
    let volume_mib: u64 = args[2].parse().context("volume MiB")?;
    let secs: f64 = args[3].parse().context("seconds")?;
    let qd: u64 = args[4].parse().context("queue depth")?;
    let rounds: usize = args[5].parse().context("rounds")?;
    let blocks = volume_mib * MIB / 4096;
    // Two volumes, 32 heavy intervals of (at most) 45%, 992 light ones of
    // 1% (each of which changes most index pages, whose copies the
    // snapshot then holds), and room to spare. The file is sparse.
    let capacity = volume_mib * MIB * 40;
    let dg = DiskGroup::create(config(dir, capacity)).await?;
    for c in [VOLUME, REFERENCE] {
        dg.create_component(c, volume_mib * MIB, 0).await?;
        fill(&dg, c, blocks).await?;
    }
    dg.settle().await?;
    println!("volume_mib={volume_mib} blocks={blocks} qd={qd} seconds={secs} rounds={rounds} index_cache_mib={}", INDEX_CACHE_BYTES >> 20);

    let mut creates = Vec::new();
    let mut create_pauses = Vec::new();
    // Per interval: (bytes the newest snapshot holds alone by the store's
    // count, bytes it should: its blocks the interval overwrote that no
    // older snapshot holds, i.e. written in the interval before it).
    let mut held = Vec::new();
    // The interval each LBA's block was written in (0: the fill).
    let mut born = vec![0u64; blocks as usize];
    let mut depth = 0u64;
    for &target in &DEPTHS {
        while depth < target {
            let snap = ComponentId(FIRST_SNAPSHOT + depth);
            let started = Instant::now();
            let (made, pause) =
                longest_write_during(&dg, blocks, dg.snapshot_component(VOLUME, snap, Epoch(1)))
                    .await?;
            made?;
            creates.push(started.elapsed().as_secs_f64() * 1000.0);
            create_pauses.push(pause);
            depth += 1;
            let fraction = if depth <= HEAVY_UNTIL { 0.45 } else { 0.01 };
            let count = (blocks as f64 * fraction) as u64;
            let written = random_writes(&dg, blocks, count, depth).await?;
            dg.settle().await?;
            let expected = written
                .iter()
                .filter(|&&l| born[l as usize] == depth - 1)
                .count() as u64
                * 4096;
            for &l in &written {
                born[l as usize] = depth;
            }
            let alone = dg.held_space(snap).await?.alone_bytes;
            held.push((alone, expected));
        }
        dg.settle().await?;
        let mut ratios = Vec::new();
        let (mut live, mut reference) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let r = read_iops(&dg, REFERENCE, blocks, qd, secs).await?;
            let v = read_iops(&dg, VOLUME, blocks, qd, secs).await?;
            ratios.push(v / r);
            live.push(v);
            reference.push(r);
        }
        let oldest = if depth > 0 {
            read_iops(&dg, ComponentId(FIRST_SNAPSHOT), blocks, qd, secs).await?
        } else {
            0.0
        };
        // Over all rounds together: each round's noise (the machine is
        // shared) weighs on both volumes alike.
        let pooled = live.iter().sum::<f64>() / reference.iter().sum::<f64>();
        println!(
            "depth={depth} volume_iops={:.0} reference_iops={:.0} ratio={pooled:.3} median_round_ratio={:.3} oldest_snapshot_iops={oldest:.0} rss_kib={}",
            median(&mut live),
            median(&mut reference),
            median(&mut ratios),
            rss_kib()
        );
    }
    let space = dg.space();
    println!(
        "snapshots={depth} rss_kib={} used_mib={} physical_mib={}",
        rss_kib(),
        space.used_bytes >> 20,
        space.physical_bytes >> 20
    );
    println!(
        "create_ms median={:.1} p99={:.1} max={:.1} longest_write_ms median={:.1} p99={:.1} max={:.1}",
        median(&mut creates.clone()),
        percentile(&mut creates.clone(), 0.99),
        percentile(&mut creates, 1.0),
        median(&mut create_pauses.clone()),
        percentile(&mut create_pauses.clone(), 0.99),
        percentile(&mut create_pauses, 1.0)
    );
    // What each snapshot holds alone, by the store's count, against the
    // blocks overwritten since it was taken that no older snapshot holds
    // (the pause-measuring client's one block aside: at most one block
    // each).
    let (alone, expected): (u64, u64) = held.iter().fold((0, 0), |a, (h, e)| (a.0 + h, a.1 + e));
    let worst_blocks = held
        .iter()
        .map(|(h, e)| h.abs_diff(*e) / 4096)
        .max()
        .unwrap_or(0);
    println!(
        "held_alone snapshots={} held_mib={:.1} overwritten_mib={:.1} ratio={:.4} worst_snapshot_error_blocks={worst_blocks}",
        held.len(),
        alone as f64 / (1 << 20) as f64,
        expected as f64 / (1 << 20) as f64,
        alone as f64 / expected.max(1) as f64,
    );
    // Delete every snapshot in a random order while a client writes.
    let mut order: Vec<u64> = (0..depth).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for i in (1..order.len()).rev() {
        order.swap(i, rng.gen_range(0..=i));
    }
    let mut deletes = Vec::new();
    let mut delete_pauses = Vec::new();
    for k in order {
        let started = Instant::now();
        let (done, pause) = longest_write_during(
            &dg,
            blocks,
            dg.delete_component(ComponentId(FIRST_SNAPSHOT + k)),
        )
        .await?;
        done?;
        deletes.push(started.elapsed().as_secs_f64() * 1000.0);
        delete_pauses.push(pause);
    }
    dg.settle().await?;
    println!(
        "delete_ms median={:.1} p99={:.1} max={:.1} longest_write_ms median={:.1} p99={:.1} max={:.1}",
        median(&mut deletes.clone()),
        percentile(&mut deletes.clone(), 0.99),
        percentile(&mut deletes, 1.0),
        median(&mut delete_pauses.clone()),
        percentile(&mut delete_pauses.clone(), 0.99),
        percentile(&mut delete_pauses, 1.0)
    );
    let space = dg.space();
    println!(
        "after_deletes used_mib={} physical_mib={} (two volumes of {volume_mib} MiB)",
        space.used_bytes >> 20,
        space.physical_bytes >> 20
    );
    dg.audit_references().await.map_err(anyhow::Error::msg)?;
    println!("audit=ok");
    Ok(())
}
