//! The scrubber of one host: verifies every stored block of its disk
//! groups once per scrub period, and has each volume's owner rewrite the
//! blocks it finds bad from another copy.
//!
//! Owns: when passes run, how fast, and what users see of them
//! ([`ScrubView`], one per disk group); handing bad blocks to owners.
//! Must not touch: the blocks. The store checks them against their CRC32C,
//! each chunk after its turn in the host's I/O scheduler (behind guest I/O
//! when the host is busy); the owner rewrites them under its range lock, so
//! a repair never races a client's write to the same blocks.
//!
//! Invariants: a scheduled pass is paced to take about the period (the
//! disk group's allocated blocks over the period, at least
//! [`SCRUB_MIN_RATE`]); a pass asked for now runs at [`SCRUB_NOW_RATE`] and
//! replaces a scheduled pass under way; a bad block is repaired only
//! through its volume's owner, and one that could not be is counted and
//! found again by the next pass. A scheduled pass records its position in
//! the directory every [`POSITION_RECORD_EVERY`] and removes it when it
//! ends; a host that starts with a position recorded goes on from there at
//! once (a week-long pass is not started over by a restart). A pass asked
//! for now starts at the beginning.

use super::Host;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tessera_directory::keys;
use tessera_object::IoClient;
use tessera_store::{BadBlock, DiskGroup, DiskGroupHealth, ScrubCursor};
use tessera_types::{DiskGroupId, Lba, BLOCK_BYTES};
use tokio::sync::{watch, Notify};

/// Blocks per second of a pass asked for now (100 MiB/s).
pub const SCRUB_NOW_RATE: u64 = (100 << 20) / BLOCK_BYTES;

/// The slowest a scheduled pass goes, in blocks per second (1 MiB/s): a
/// period longer than the disk group needs at this rate ends early.
pub const SCRUB_MIN_RATE: u64 = (1 << 20) / BLOCK_BYTES;

/// How long after the host starts its first scheduled pass begins.
const FIRST_PASS_AFTER: Duration = Duration::from_secs(600);

/// How often the worker looks at the schedule while idle.
const SCHEDULE_POLL: Duration = Duration::from_secs(30);

/// How often a scheduled pass records its position.
pub const POSITION_RECORD_EVERY: Duration = Duration::from_secs(30);

/// One disk group's scrubbing, as users see it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ScrubView {
    /// The host.
    pub host: String,
    /// The disk group.
    pub disk_group: String,
    /// `running`, `idle`, or `off` (the scheduled scrub is turned off and
    /// no pass was asked for).
    pub state: String,
    /// Passes finished since the host started.
    pub passes: u64,
    /// Blocks verified in the running pass, or in the last one.
    pub checked_blocks: u64,
    /// Blocks that pass has to verify.
    pub total_blocks: u64,
    /// Bad blocks that pass found so far.
    pub bad_blocks: u64,
    /// Bad blocks rewritten from another copy since the host started.
    pub repaired_blocks: u64,
    /// Bad blocks no owner could rewrite (no other good copy, or the owner
    /// unreachable); the next pass finds them again.
    pub unrepaired_blocks: u64,
    /// Pace of the running pass, or of the last one, in blocks per second.
    pub rate_blocks_per_s: u64,
    /// Seconds until the next scheduled pass starts; null while one runs
    /// or when the scheduled scrub is off.
    pub next_pass_in_s: Option<u64>,
    /// Why the last pass stopped early, if it did.
    pub error: Option<String>,
}

/// A host's scrubbing: the schedule, requests for a pass now, and what
/// each disk group's passes did.
pub(super) struct Scrubber {
    /// `ClusterSettings::scrub_period_h`, as the directory last said.
    period_h: AtomicU32,
    /// A pass was asked for now.
    requested: AtomicBool,
    wake: Notify,
    /// When the next scheduled pass starts, in the host clock's monotonic
    /// time; None until the worker first looks.
    next_due: Mutex<Option<Duration>>,
    rows: Mutex<BTreeMap<DiskGroupId, ScrubView>>,
}

impl Scrubber {
    pub(super) fn new(period_h: u32) -> Scrubber {
        Scrubber {
            period_h: AtomicU32::new(period_h),
            requested: AtomicBool::new(false),
            wake: Notify::new(),
            next_due: Mutex::new(None),
            rows: Mutex::new(BTreeMap::new()),
        }
    }

    /// Follows the cluster setting; a shorter period takes effect at the
    /// next look at the schedule.
    pub(super) fn set_period_h(&self, hours: u32) {
        if self.period_h.swap(hours, Ordering::Relaxed) != hours {
            tracing::info!(scrub_period_h = hours, "scrub period changed");
            self.wake.notify_one();
        }
    }

    /// Asks for a pass of every disk group now.
    pub(super) fn request_now(&self) {
        self.requested.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    fn period(&self) -> Option<Duration> {
        match self.period_h.load(Ordering::Relaxed) {
            0 => None,
            h => Some(Duration::from_secs(u64::from(h) * 3600)),
        }
    }

    /// Every disk group's row, with the progress of a pass under way.
    pub(super) fn views(&self, host: &Host, now: Duration) -> Vec<ScrubView> {
        let next_in = {
            let due = *self.next_due.lock();
            match (self.period(), due) {
                (Some(_), Some(due)) => Some(due.saturating_sub(now).as_secs()),
                (Some(_), None) => Some(FIRST_PASS_AFTER.as_secs()),
                (None, _) => None,
            }
        };
        let rows = self.rows.lock();
        host.replica
            .disk_groups()
            .iter()
            .map(|group| {
                let mut view = rows.get(group.id()).cloned().unwrap_or_default();
                view.host = host.id.to_string();
                view.disk_group = group.id().to_string();
                let progress = group.scrub_progress();
                if progress.running {
                    view.state = "running".into();
                    view.checked_blocks = progress.blocks_done;
                    view.total_blocks = progress.blocks_total;
                    view.bad_blocks = progress.errors;
                    view.next_pass_in_s = None;
                } else {
                    view.state = if next_in.is_some() { "idle" } else { "off" }.into();
                    view.next_pass_in_s = next_in;
                }
                view
            })
            .collect()
    }
}

/// The host's scrub worker: waits for the schedule or a request, then runs
/// a pass of every disk group.
pub(super) async fn run(weak: Weak<Host>, mut stop: watch::Receiver<bool>) {
    // A pass a restart cut off goes on at once.
    if let Some(host) = weak.upgrade() {
        let prefix = host.keys.scrub_positions_of(&host.id);
        let cut_off = keys::list(host.directory.as_ref(), &prefix)
            .await
            .is_ok_and(|l| !l.records.is_empty());
        if cut_off && host.scrubber.period().is_some() {
            tracing::info!(host = %host.id, "a scrub pass was under way when the host stopped: it goes on now");
            *host.scrubber.next_due.lock() = Some(host.clock.monotonic());
        }
    }
    loop {
        let Some(host) = weak.upgrade() else { return };
        let scrubber = &host.scrubber;
        let now = host.clock.monotonic();
        let asked = scrubber.requested.swap(false, Ordering::SeqCst);
        let due = {
            let mut next = scrubber.next_due.lock();
            let at = *next.get_or_insert(now + FIRST_PASS_AFTER);
            scrubber.period().is_some() && now >= at
        };
        if asked || due {
            if let Some(period) = scrubber.period() {
                // The next pass starts a period after this one started.
                *scrubber.next_due.lock() = Some(now + period);
            }
            let pass = pass(&host, if asked { None } else { scrubber.period() });
            tokio::select! {
                _ = pass => {}
                _ = scrubber.wake.notified() => {
                    tracing::info!(host = %host.id, "scrub pass stopped for a newer request or setting");
                }
                _ = stop.wait_for(|s| *s) => return,
            }
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(SCHEDULE_POLL) => {}
            _ = scrubber.wake.notified() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// One pass of every disk group: paced over `period`, or at
/// [`SCRUB_NOW_RATE`] when asked for now.
async fn pass(host: &Arc<Host>, period: Option<Duration>) {
    for group in host.replica.disk_groups() {
        if matches!(group.health(), DiskGroupHealth::Failed { .. }) {
            continue;
        }
        let rate = match period {
            None => SCRUB_NOW_RATE,
            Some(p) => {
                let blocks: u64 = group
                    .components()
                    .iter()
                    .map(|c| c.space.allocated_bytes / BLOCK_BYTES)
                    .sum();
                (blocks / p.as_secs().max(1)).max(SCRUB_MIN_RATE)
            }
        };
        host.scrubber
            .rows
            .lock()
            .entry(group.id().clone())
            .or_default()
            .rate_blocks_per_s = rate;
        let key = host.keys.scrub_position(&host.id, group.id());
        // A scheduled pass goes on from where a restart cut it off.
        let from = match period {
            None => ScrubCursor::default(),
            Some(_) => keys::get(host.directory.as_ref(), &key)
                .await
                .ok()
                .flatten()
                .map_or_else(ScrubCursor::default, |r| ScrubCursor {
                    component: r.value.component,
                    lba: Lba(r.value.lba),
                }),
        };
        tracing::info!(host = %host.id, disk_group = %group.id(), rate_blocks_per_s = rate, from = ?from, "scrub pass starts");
        let scheduler = Arc::clone(&host.scheduler);
        let scrubbing = group.scrub_with(from, rate, move |blocks| {
            let scheduler = Arc::clone(&scheduler);
            async move {
                scheduler
                    .admit(&IoClient::Scrub, blocks * BLOCK_BYTES)
                    .await
            }
        });
        tokio::pin!(scrubbing);
        let outcome = loop {
            tokio::select! {
                outcome = &mut scrubbing => break outcome,
                _ = tokio::time::sleep(POSITION_RECORD_EVERY), if period.is_some() => {
                    let at = group.scrub_progress().cursor;
                    let position = keys::ScrubPosition {
                        host: host.id.clone(),
                        disk_group: group.id().clone(),
                        component: at.component,
                        lba: at.lba.0,
                    };
                    if let Err(e) = keys::put(host.directory.as_ref(), &key, &position, None).await {
                        tracing::debug!(host = %host.id, disk_group = %group.id(), error = %e, "scrub position not recorded");
                    }
                }
            }
        };
        if outcome.is_ok() {
            if let Err(e) = host.directory.delete(key.as_str()).await {
                tracing::debug!(host = %host.id, disk_group = %group.id(), error = %e, "scrub position not removed");
            }
        }
        let (checked, bad, error) = match outcome {
            Ok(report) => (group.scrub_progress().blocks_done, report.bad, None),
            Err(e) => {
                tracing::warn!(host = %host.id, disk_group = %group.id(), error = %e, "scrub pass stopped");
                let p = group.scrub_progress();
                (p.blocks_done, Vec::new(), Some(e.to_string()))
            }
        };
        let (repaired, unrepaired) = repair(host, group, &bad).await;
        let mut rows = host.scrubber.rows.lock();
        let row = rows.entry(group.id().clone()).or_default();
        row.passes += 1;
        row.checked_blocks = checked;
        row.total_blocks = checked;
        row.bad_blocks = bad.len() as u64;
        row.repaired_blocks += repaired;
        row.unrepaired_blocks += unrepaired;
        row.error = error;
        tracing::info!(host = %host.id, disk_group = %group.id(), checked, bad = bad.len(), repaired, unrepaired, "scrub pass ended");
    }
}

/// Has the owner of each bad block's volume rewrite it from another copy.
/// Answers the blocks repaired and those that could not be.
async fn repair(host: &Arc<Host>, group: &DiskGroup, bad: &[BadBlock]) -> (u64, u64) {
    let (mut repaired, mut unrepaired) = (0, 0);
    for block in bad {
        let volume = host
            .view
            .layouts
            .read()
            .iter()
            .find(|(_, l)| l.components().any(|c| c.id == block.component))
            .map(|(v, _)| v.clone());
        let handle = volume
            .as_ref()
            .and_then(|v| host.catalog.open_handle(v.as_str(), false));
        let Some(handle) = handle else {
            tracing::warn!(host = %host.id, disk_group = %group.id(), component = %block.component, lba = block.lba.0, "bad block of a component no volume names; left for an operator");
            unrepaired += 1;
            continue;
        };
        match handle.repair_copy(block.component, block.lba, 1).await {
            Ok(()) => repaired += 1,
            Err(e) => {
                tracing::warn!(host = %host.id, volume = ?volume, component = %block.component, lba = block.lba.0, location = %block.location, error = %e, "bad block not repaired");
                unrepaired += 1;
            }
        }
    }
    (repaired, unrepaired)
}
