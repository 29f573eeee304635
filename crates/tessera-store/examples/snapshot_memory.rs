//! Resident memory of a disk group holding many snapshots of one volume,
//! for `bench/snapshot-memory.sh`: a volume written whole, then SNAPSHOTS
//! snapshots with WRITES random 4 KiB writes between each two (every
//! interval changes index pages, whose old copies the snapshot keeps),
//! then random reads spread over every snapshot so each one's index is
//! looked up. Prints the process's resident memory as snapshots are added
//! and after the reads, beside the configured budgets (index cache,
//! content cache), and the index cache's own count of what it holds. The
//! claim checked: memory grows with the budgets, not with the number of
//! snapshots.
//!
//! Usage: snapshot_memory DIR VOLUME_MIB SNAPSHOTS WRITES INDEX_CACHE_MIB
//! Output: `key=value` lines.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_store::{DeviceSpec, DiskGroup, DiskGroupConfig};
use tessera_types::{ComponentId, DiskGroupId, Epoch, Lba};

const VOLUME: ComponentId = ComponentId(1);
const FIRST_SNAPSHOT: u64 = 1000;
const MIB: u64 = 1 << 20;
/// The store's read cache of verified blocks, kept small so the index is
/// what the figure shows.
const CONTENT_CACHE_BYTES: u64 = 8 << 20;

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

fn report(dg: &DiskGroup, what: &str, snapshots: u64) {
    let index = dg.index_cache_stats();
    println!(
        "{what} snapshots={snapshots} rss_mib={:.1} index_resident_mib={:.1} index_budget_mib={:.1} reference_counts_mib={:.1} used_mib={}",
        rss_kib() as f64 / 1024.0,
        index.resident_bytes as f64 / MIB as f64,
        index.budget_bytes as f64 / MIB as f64,
        dg.reference_count_bytes() as f64 / MIB as f64,
        dg.space().used_bytes >> 20,
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 6 {
        bail!("usage: snapshot_memory DIR VOLUME_MIB SNAPSHOTS WRITES INDEX_CACHE_MIB");
    }
    let dir = Path::new(&args[1]);
    let volume_mib: u64 = args[2].parse().context("volume MiB")?;
    let snapshots: u64 = args[3].parse().context("snapshots")?;
    let writes: u64 = args[4].parse().context("writes per interval")?;
    let index_cache_mib: u64 = args[5].parse().context("index cache MiB")?;
    let blocks = volume_mib * MIB / 4096;
    // The volume, each interval's new data blocks and the two blocks of
    // every index page an interval changes (at most one page per write),
    // with room to spare. The file is sparse.
    let capacity = volume_mib * MIB * 2 + snapshots * writes * 3 * 4096 + (1 << 30);
    let dg = DiskGroup::create(DiskGroupConfig {
        id: DiskGroupId::new("snapmem").expect("valid name"),
        cache: DeviceSpec {
            path: dir.join("cache.img"),
            size_bytes: 1 << 30,
        },
        capacity: vec![DeviceSpec {
            path: dir.join("capacity.img"),
            size_bytes: capacity,
        }],
        index_cache_bytes: index_cache_mib * MIB,
        content_cache_bytes: CONTENT_CACHE_BYTES,
        direct_io: tessera_store::DirectIo::All,
        encryption: None,
    })
    .await?;
    dg.create_component(VOLUME, volume_mib * MIB, 0).await?;
    let chunk = Bytes::from(vec![0x5au8; MIB as usize]);
    for lba in (0..blocks).step_by(256) {
        let n = 256.min(blocks - lba);
        dg.write(
            VOLUME,
            Lba(lba),
            chunk.slice(..(n * 4096) as usize),
            Epoch(1),
        )
        .await?;
    }
    dg.settle().await?;
    println!(
        "volume_mib={volume_mib} snapshots={snapshots} writes_per_interval={writes} index_cache_mib={index_cache_mib} content_cache_mib={}",
        CONTENT_CACHE_BYTES >> 20
    );
    report(&dg, "filled", 0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let started = Instant::now();
    for s in 0..snapshots {
        dg.snapshot_component(VOLUME, ComponentId(FIRST_SNAPSHOT + s), Epoch(1))
            .await?;
        let data = Bytes::from(vec![(s % 251) as u8 | 1; 4096]);
        let mut pending = Vec::new();
        for _ in 0..writes {
            let (dg, data) = (dg.clone(), data.clone());
            let lba = rng.gen_range(0..blocks);
            pending.push(tokio::spawn(async move {
                dg.write(VOLUME, Lba(lba), data, Epoch(1)).await
            }));
            if pending.len() == 16 {
                for p in pending.drain(..) {
                    p.await??;
                }
            }
        }
        for p in pending {
            p.await??;
        }
        let n = s + 1;
        if n.is_power_of_two() || n == snapshots {
            dg.settle().await?;
            report(&dg, "taken", n);
        }
    }
    println!("create_seconds={:.1}", started.elapsed().as_secs_f64());
    // Reads spread over every snapshot: each one's index is looked up.
    read_every_snapshot(&dg, snapshots, blocks, Duration::from_secs(10)).await?;
    report(&dg, "read", snapshots);
    dg.audit_references().await.map_err(anyhow::Error::msg)?;
    println!("audit=ok");
    Ok(())
}

/// Random 4 KiB reads at queue depth 8, each of a random snapshot, for
/// `secs`.
async fn read_every_snapshot(
    dg: &Arc<DiskGroup>,
    snapshots: u64,
    blocks: u64,
    secs: Duration,
) -> Result<()> {
    let deadline = Instant::now() + secs;
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let dg = dg.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(t + 100);
            let mut reads = 0u64;
            while Instant::now() < deadline {
                let snap = ComponentId(FIRST_SNAPSHOT + rng.gen_range(0..snapshots.max(1)));
                dg.read(snap, Lba(rng.gen_range(0..blocks)), 1).await?;
                reads += 1;
            }
            Ok::<u64, tessera_store::StoreError>(reads)
        }));
    }
    let mut reads = 0;
    for t in tasks {
        reads += t.await??;
    }
    println!("snapshot_reads={reads}");
    Ok(())
}
