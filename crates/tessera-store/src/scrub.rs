//! The scrubber: reads every allocated block of every component, checks it
//! against its CRC32C and reports each bad block with its component, LBA and
//! physical location, so the coordinator can rewrite it from another copy.
//!
//! Owns: scrub pacing, progress and position. It reads through the same
//! plan as a client read (so it checks exactly what a client would get) and
//! takes each component's read lock a chunk at a time, so client writes wait
//! at most one chunk. Throttled to a block rate given by the caller. A pass
//! walks components in id order and each one's blocks in LBA order, so its
//! position ([`ScrubCursor`]) says what is left, and a pass can start from
//! one (its caller keeps it across restarts).

use crate::group::DiskGroup;
use crate::state::Source;
use crate::StoreError;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tessera_env::AlignedBuf;
use tessera_format::{block_crc, BLOCK};
use tessera_types::{ComponentId, Lba, BLOCK_BYTES};

/// Blocks checked per step (one plan, one lock hold).
const SCRUB_CHUNK_BLOCKS: u64 = 64;

/// A block that failed its check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadBlock {
    /// The component.
    pub component: ComponentId,
    /// The LBA.
    pub lba: Lba,
    /// Where it is stored (device and block, or the write log).
    pub location: String,
    /// What is wrong.
    pub problem: String,
}

/// Where a scrub pass is: the next block it checks. Components are walked
/// in id order, each one's blocks in LBA order; the default is the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ScrubCursor {
    /// The component.
    pub component: ComponentId,
    /// The block of it.
    pub lba: Lba,
}

impl Default for ScrubCursor {
    fn default() -> ScrubCursor {
        ScrubCursor {
            component: ComponentId(0),
            lba: Lba(0),
        }
    }
}

/// Scrub progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScrubProgress {
    /// A scrub is running.
    pub running: bool,
    /// Blocks checked so far.
    pub blocks_done: u64,
    /// Blocks to check in this pass.
    pub blocks_total: u64,
    /// Bad blocks found so far.
    pub errors: u64,
    /// The next block the pass checks (where a stopped pass would go on).
    pub cursor: ScrubCursor,
}

/// Result of a scrub pass.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScrubReport {
    /// Blocks checked.
    pub blocks_checked: u64,
    /// Bad blocks found.
    pub bad: Vec<BadBlock>,
}

impl DiskGroup {
    /// Progress of the running (or last) scrub.
    pub fn scrub_progress(&self) -> ScrubProgress {
        let s = &self.shared().scrub;
        ScrubProgress {
            running: s.running.load(Ordering::Relaxed),
            blocks_done: s.done.load(Ordering::Relaxed),
            blocks_total: s.total.load(Ordering::Relaxed),
            errors: s.errors.load(Ordering::Relaxed),
            cursor: *s.cursor.lock(),
        }
    }

    /// Checks every allocated block at no more than `blocks_per_second`
    /// (0 = unthrottled) and reports the bad ones.
    pub async fn scrub(&self, blocks_per_second: u64) -> Result<ScrubReport, StoreError> {
        self.scrub_from(ScrubCursor::default(), blocks_per_second)
            .await
    }

    /// [`DiskGroup::scrub`] from `from` on: the blocks before it count as
    /// checked (an earlier run of the pass checked them) and are not read.
    pub async fn scrub_from(
        &self,
        from: ScrubCursor,
        blocks_per_second: u64,
    ) -> Result<ScrubReport, StoreError> {
        self.scrub_with(from, blocks_per_second, |_| async {}).await
    }

    /// [`DiskGroup::scrub_from`], waiting for `turn(blocks)` before each
    /// chunk and holding what it gives while the chunk is checked: the
    /// caller's I/O scheduler lets the scrub take its turn behind other
    /// work.
    pub async fn scrub_with<T, F, P>(
        &self,
        from: ScrubCursor,
        blocks_per_second: u64,
        mut turn: T,
    ) -> Result<ScrubReport, StoreError>
    where
        T: FnMut(u64) -> F,
        F: std::future::Future<Output = P>,
    {
        let counters = &self.shared().scrub;
        let mut components: Vec<(ComponentId, u64, u64)> = self
            .components()
            .into_iter()
            .filter(|c| c.failed.is_none())
            .map(|c| {
                (
                    c.id,
                    c.size_bytes / BLOCK_BYTES,
                    c.space.allocated_bytes / BLOCK_BYTES,
                )
            })
            .collect();
        components.sort_unstable_by_key(|c| c.0);
        let total: u64 = components.iter().map(|c| c.2).sum();
        let mut before: u64 = components
            .iter()
            .filter(|c| c.0 < from.component)
            .map(|c| c.2)
            .sum();
        if from.lba.0 > 0 {
            if let Ok(runs) = self.allocated(from.component, Lba(0), from.lba.0).await {
                before += runs.iter().map(|(_, n)| n).sum::<u64>();
            }
        }
        counters.total.store(total, Ordering::Relaxed);
        counters.done.store(before.min(total), Ordering::Relaxed);
        counters.errors.store(0, Ordering::Relaxed);
        *counters.cursor.lock() = from;
        counters.running.store(true, Ordering::Relaxed);
        // A pass dropped half way (its caller stopped it) is not running.
        struct Ends<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Ends<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Relaxed);
            }
        }
        let _ends = Ends(&counters.running);
        let started = Instant::now();
        let mut report = ScrubReport::default();
        let result = async {
            for (id, blocks, _) in components {
                if id < from.component {
                    continue;
                }
                let first = if id == from.component { from.lba.0 } else { 0 };
                let runs = match self
                    .allocated(id, Lba(first), blocks.saturating_sub(first))
                    .await
                {
                    Ok(r) => r,
                    Err(StoreError::NoSuchComponent { .. }) => continue,
                    Err(e) => return Err(e),
                };
                for (start, n) in runs {
                    let mut at = start.0;
                    while at < start.0 + n {
                        let k = SCRUB_CHUNK_BLOCKS.min(start.0 + n - at);
                        let held = turn(k).await;
                        let checked = self.scrub_chunk(id, Lba(at), k).await;
                        drop(held);
                        match checked {
                            Ok(bad) => {
                                counters
                                    .errors
                                    .fetch_add(bad.len() as u64, Ordering::Relaxed);
                                report.bad.extend(bad);
                            }
                            Err(StoreError::NoSuchComponent { .. }) => break,
                            Err(e) => return Err(e),
                        }
                        report.blocks_checked += k;
                        counters.done.fetch_add(k, Ordering::Relaxed);
                        at += k;
                        *counters.cursor.lock() = ScrubCursor {
                            component: id,
                            lba: Lba(at),
                        };
                        if blocks_per_second > 0 {
                            let due = Duration::from_secs_f64(
                                report.blocks_checked as f64 / blocks_per_second as f64,
                            );
                            if let Some(wait) = due.checked_sub(started.elapsed()) {
                                tokio::time::sleep(wait).await;
                            }
                        }
                    }
                }
            }
            Ok(())
        }
        .await;
        result.map(|_| report)
    }

    /// Flips one bit of the stored copy of block `lba` of component `id`
    /// on its capacity device, past every checksum, as a latent media error
    /// would, and answers where it was. Fault injection only (hosts offer it
    /// when started to accept faults). The write log is settled first, so
    /// the block is on a capacity device; a block never written is refused.
    pub async fn damage_block(&self, id: ComponentId, lba: Lba) -> Result<String, StoreError> {
        self.settle().await?;
        let lock = {
            let st = self.shared().state.lock();
            st.component(id)?.lock.clone()
        };
        let _guard = lock.write().await;
        let plan = self.plan_for_scrub(id, lba, 1).await?;
        let Some(Source::Disk(loc, _)) = plan.into_iter().next() else {
            return Err(StoreError::NotStored { component: id, lba });
        };
        let shared = self.shared().clone();
        let location = loc.to_string();
        tokio::task::spawn_blocking(move || {
            let disk = shared
                .disk(loc.device)
                .ok_or_else(|| StoreError::DiskGroupFailed {
                    reason: format!("no capacity device {}", loc.device),
                })?;
            let mut buf = AlignedBuf::zeroed(BLOCK);
            let offset = loc.block * BLOCK_BYTES;
            disk.read_at(buf.as_mut_slice(), offset)?;
            buf.as_mut_slice()[BLOCK / 2] ^= 0x10;
            disk.write_at(buf.as_slice(), offset)?;
            disk.sync()?;
            // A verified copy in the content cache would hide the damage
            // from reads; the scrubber reads the device either way.
            shared.content.invalidate([loc]);
            Ok::<(), StoreError>(())
        })
        .await
        .map_err(|e| StoreError::DiskGroupFailed {
            reason: format!("damage task failed: {e}"),
        })??;
        tracing::warn!(component = %id, lba = lba.0, %location, "fault injected: one bit flipped in a stored block");
        Ok(location)
    }

    async fn scrub_chunk(
        &self,
        id: ComponentId,
        lba: Lba,
        n: u64,
    ) -> Result<Vec<BadBlock>, StoreError> {
        let lock = {
            let st = self.shared().state.lock();
            st.component(id)?.lock.clone()
        };
        let _guard = lock.read().await;
        let plan = self.plan_for_scrub(id, lba, n).await?;
        let shared = self.shared().clone();
        tokio::task::spawn_blocking(move || {
            let mut bad = Vec::new();
            for (i, src) in plan.into_iter().enumerate() {
                let l = Lba(lba.0 + i as u64);
                let mut report = |location: String, problem: &str| {
                    bad.push(BadBlock {
                        component: id,
                        lba: l,
                        location,
                        problem: problem.to_string(),
                    })
                };
                match src {
                    // A scrub plans without the content cache: it checks
                    // the devices.
                    Source::Zero | Source::Cached(_) => {}
                    Source::Lost => report("write log".into(), "data lost in a damaged log record"),
                    Source::Memory(b, crc) => {
                        if block_crc(&b) != crc {
                            report("write log (cached)".into(), "checksum mismatch");
                        }
                    }
                    Source::Disk(loc, crc) => {
                        let mut buf = AlignedBuf::zeroed(BLOCK);
                        match shared.disk(loc.device) {
                            Some(d) => match d.read_at(buf.as_mut_slice(), loc.block * BLOCK_BYTES)
                            {
                                Ok(()) => {
                                    if block_crc(buf.as_slice()) != crc {
                                        report(loc.to_string(), "checksum mismatch");
                                    }
                                }
                                Err(e) => report(loc.to_string(), &e.to_string()),
                            },
                            None => report(loc.to_string(), "unknown device"),
                        }
                    }
                }
            }
            bad
        })
        .await
        .map_err(|e| StoreError::DiskGroupFailed {
            reason: format!("scrub task failed: {e}"),
        })
    }
}
