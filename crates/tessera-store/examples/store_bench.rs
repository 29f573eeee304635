//! Drives a disk group on real files with 4 KiB random writes or reads at a
//! fixed queue depth and prints IOPS, for `bench/store-bench.sh`.
//!
//! Usage:
//!   store_bench prepare DIR SIZE_GIB          create the group, fill SIZE_GIB
//!   store_bench write DIR SIZE_GIB QD SECONDS random writes, durable acks
//!   store_bench read DIR SIZE_GIB QD SECONDS  random reads
//!   store_bench seqwrite DIR SIZE_GIB QD SECONDS  256 KiB sequential writes,
//!                                             each task on its own stretch
//!   store_bench memory DIR GIB                write GIB sequentially, print RSS
//!
//! A key file `DIR/kek` (64 hexadecimal digits, mode 600) makes the group
//! encrypted at rest (`prepare` formats it so; later cases open it with it).
//!
//! Output: one line `iops=<n> mib_s=<n> ops=<n> seconds=<s> rss_kib=<n>` (writes and
//! read also print the write log's group commit counters). Each case ends by
//! settling the disk group (destage and checkpoint, not timed), so a case
//! never measures the destaging of the previous case's writes.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_store::{DeviceSpec, DiskGroup, DiskGroupConfig};
use tessera_types::{ComponentId, DiskGroupId, Epoch, Lba};

const C: ComponentId = ComponentId(1);
const GIB: u64 = 1 << 30;
/// Index cache of the benchmark's disk group: the memory the index may use.
const INDEX_CACHE_BYTES: u64 = 64 << 20;

fn config(dir: &Path, capacity_gib: u64) -> DiskGroupConfig {
    DiskGroupConfig {
        id: DiskGroupId::new("bench").expect("valid name"),
        cache: DeviceSpec {
            path: dir.join("store-cache.img"),
            size_bytes: 2 * GIB,
        },
        capacity: vec![DeviceSpec {
            path: dir.join("store-capacity.img"),
            size_bytes: capacity_gib * GIB,
        }],
        index_cache_bytes: INDEX_CACHE_BYTES,
        content_cache_bytes: tessera_store::CONTENT_CACHE_BYTES_DEFAULT,
        direct_io: tessera_store::DirectIo::All,
        // A key file `kek` in DIR makes the group encrypted at rest.
        encryption: tessera_store::KeyEncryptionKey::load(&dir.join("kek"))
            .ok()
            .map(tessera_store::AtRestKeys::new),
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

async fn fill(dg: &DiskGroup, blocks: u64) -> Result<()> {
    const CHUNK: u64 = 256;
    let data = Bytes::from(vec![0x5au8; (CHUNK * 4096) as usize]);
    let mut lba = 0;
    let mut inflight = Vec::new();
    let dg = Arc::new(dg);
    while lba < blocks {
        let n = CHUNK.min(blocks - lba);
        inflight.push(dg.write(C, Lba(lba), data.slice(..(n * 4096) as usize), Epoch(1)));
        if inflight.len() == 8 {
            for f in inflight.drain(..) {
                f.await?;
            }
        }
        lba += n;
    }
    for f in inflight {
        f.await?;
    }
    Ok(())
}

/// What each task of a case does.
#[derive(Clone, Copy, PartialEq)]
enum Pattern {
    RandomWrite,
    RandomRead,
    /// 256 KiB writes; task t writes its own 1/QD of the data set in order,
    /// wrapping around, so the stream looks like a file copy at depth QD.
    SequentialWrite,
}

/// Blocks per sequential write (256 KiB).
const SEQ_BLOCKS: u64 = 64;

async fn run(
    dg: Arc<DiskGroup>,
    blocks: u64,
    qd: u64,
    seconds: f64,
    pattern: Pattern,
) -> Result<u64> {
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..qd {
        let (dg, stop, ops) = (dg.clone(), stop.clone(), ops.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(t);
            let data = Bytes::from(vec![t as u8; 4096]);
            let big = Bytes::from(vec![t as u8; (SEQ_BLOCKS * 4096) as usize]);
            let stretch = (blocks / qd / SEQ_BLOCKS).max(1) * SEQ_BLOCKS;
            let mut next = 0;
            while !stop.load(Ordering::Relaxed) {
                match pattern {
                    Pattern::RandomWrite => {
                        let lba = Lba(rng.gen_range(0..blocks));
                        dg.write(C, lba, data.clone(), Epoch(1)).await?;
                    }
                    Pattern::RandomRead => {
                        dg.read(C, Lba(rng.gen_range(0..blocks)), 1).await?;
                    }
                    Pattern::SequentialWrite => {
                        let lba = Lba((t * stretch + next) % (blocks - SEQ_BLOCKS + 1));
                        dg.write(C, lba, big.clone(), Epoch(1)).await?;
                        next = (next + SEQ_BLOCKS) % stretch;
                    }
                }
                ops.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), tessera_store::StoreError>(())
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await??;
    }
    Ok(ops.load(Ordering::Relaxed))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        bail!("usage: store_bench prepare|write|read|memory DIR SIZE_GIB [QD SECONDS]");
    }
    let dir = Path::new(&args[2]);
    let gib: u64 = args[3].parse().context("size in GiB")?;
    let blocks = gib * GIB / 4096;
    match args[1].as_str() {
        "prepare" => {
            let dg = DiskGroup::create(config(dir, gib + gib / 4 + 1)).await?;
            dg.create_component(C, gib * GIB, 0).await?;
            fill(&dg, blocks).await?;
            dg.settle().await?;
            println!("prepared {gib} GiB");
        }
        "write" | "read" | "seqwrite" => {
            let pattern = match args[1].as_str() {
                "write" => Pattern::RandomWrite,
                "read" => Pattern::RandomRead,
                _ => Pattern::SequentialWrite,
            };
            let qd: u64 = args.get(4).context("queue depth")?.parse()?;
            let seconds: f64 = args.get(5).context("seconds")?.parse()?;
            let dg = DiskGroup::open(config(dir, gib + gib / 4 + 1)).await?;
            let started = Instant::now();
            let ops = run(dg.clone(), blocks, qd, seconds, pattern).await?;
            let elapsed = started.elapsed().as_secs_f64();
            let log = dg.log_stats();
            // Leave the log empty (not timed), so the next case measures the
            // store alone rather than the destaging of this one's writes.
            dg.settle().await?;
            let mib_s = match pattern {
                Pattern::SequentialWrite => {
                    ops as f64 * (SEQ_BLOCKS * 4096) as f64 / elapsed / (1 << 20) as f64
                }
                _ => ops as f64 * 4096.0 / elapsed / (1 << 20) as f64,
            };
            println!(
                "iops={:.0} mib_s={mib_s:.1} ops={ops} seconds={elapsed:.2} rss_kib={} group_commits={} overlapped={} syncs={}",
                ops as f64 / elapsed,
                rss_kib(),
                log.group_commits,
                log.overlapped_commits,
                log.syncs
            );
        }
        "memory" => {
            let dg = DiskGroup::create(config(dir, gib + gib / 4 + 1)).await?;
            dg.create_component(C, gib * GIB, 0).await?;
            let started = Instant::now();
            fill(&dg, blocks).await?;
            dg.settle().await?;
            println!(
                "wrote_gib={gib} seconds={:.1} rss_kib={} index_cache_kib={}",
                started.elapsed().as_secs_f64(),
                rss_kib(),
                INDEX_CACHE_BYTES / 1024
            );
        }
        other => bail!("unknown mode {other}"),
    }
    Ok(())
}
