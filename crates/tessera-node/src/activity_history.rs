//! Rates of client I/O per volume and host, and the last hour of them.
//!
//! Owns: the rates of one interval between two samples of `GET
//! /v1/activity` ([`interval_rates`], pure: `tessera top` computes its rows
//! with it), and [`ActivityHistory`], the bounded ring of such intervals a
//! control plane keeps in memory for the hosts it runs (sampled every
//! [`SAMPLE_INTERVAL`], served by `GET /v1/activity/history`, drawn by the
//! dashboard's charts without a Prometheus). Must not touch: the hosts or
//! the directory; samples come in as values.
//!
//! Invariants: a rate is a difference of two counters over the measured
//! interval; a volume whose counters went back (another owner took it) or
//! that was not in the earlier sample is counted from zero, since its
//! counters started inside the interval; a host's row adds up its
//! volumes' operations, and its latency is their operations' mean. The
//! history holds at most [`HISTORY_INTERVALS`] intervals, oldest dropped
//! first, and keeps a volume's row only for an interval where something
//! moved (an idle volume costs nothing; a missing row reads as zero), so
//! its memory grows with activity, not with the number of volumes.

use crate::control::{IoKind, IoKindSnapshot, VolumeActivity};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::Duration;

/// What a row of rates is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RateSubject {
    /// One volume, counted by its owner.
    Volume,
    /// One host: the volumes it owns, added up.
    Host,
}

impl RateSubject {
    /// The word tables, CSV and JSON use.
    pub fn as_str(self) -> &'static str {
        match self {
            RateSubject::Volume => "volume",
            RateSubject::Host => "host",
        }
    }
}

/// The rates of one interval of a volume, or of a host (the volumes it
/// owns).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActivityRate {
    /// A volume's or a host's.
    pub kind: RateSubject,
    /// The volume's or the host's name.
    pub name: String,
    /// The host that counted (for a host row, itself).
    pub owner: String,
    /// Clients with the volume open (for a host: of its volumes).
    pub clients: u32,
    /// Reads per second.
    pub read_iops: f64,
    /// Writes per second.
    pub write_iops: f64,
    /// MiB read per second.
    pub read_mib_s: f64,
    /// MiB written per second.
    pub write_mib_s: f64,
    /// Mean read latency in the interval, microseconds.
    pub read_latency_us: f64,
    /// Mean write latency in the interval, microseconds.
    pub write_latency_us: f64,
    /// Operations under way on the owner on average (their latencies
    /// added up over the interval's length: Little's law).
    pub queue: f64,
    /// Errors per second.
    pub errors_s: f64,
    /// COMPARE AND WRITE (ATS) per second.
    pub ats_s: f64,
    /// ATS miscompares per second.
    pub ats_fail_s: f64,
    /// EXTENDED COPY commands per second.
    pub clone_s: f64,
    /// MiB per second EXTENDED COPY placed by sharing blocks.
    pub clone_mib_s: f64,
    /// Logical blocks zeroed by WRITE SAME per second.
    pub zero_blocks_s: f64,
    /// Logical blocks deallocated (UNMAP) per second.
    pub delete_blocks_s: f64,
}

/// What changed between two samples of one kind of operation.
#[derive(Clone, Copy, Default)]
struct KindDelta {
    operations: u64,
    bytes: u64,
    errors: u64,
    latency_ns: u64,
}

fn kind_of(io: &[IoKindSnapshot], kind: IoKind) -> Option<&IoKindSnapshot> {
    io.iter().find(|k| k.kind == kind)
}

/// Whether `now` continues `then` (same owner, no counter went back).
fn continues(then: &VolumeActivity, now: &VolumeActivity) -> bool {
    then.owner == now.owner
        && now.io.iter().all(|k| {
            kind_of(&then.io, k.kind).is_none_or(|t| {
                t.operations <= k.operations
                    && t.bytes <= k.bytes
                    && t.errors <= k.errors
                    && t.latency_ns <= k.latency_ns
            })
        })
        && then.offloads.ats <= now.offloads.ats
        && then.offloads.clone_commands <= now.offloads.clone_commands
}

/// Changes of the offload counters (or their sums over volumes).
#[derive(Clone, Copy, Default)]
struct OffloadDelta {
    ats: u64,
    ats_fail: u64,
    clones: u64,
    clone_bytes: u64,
    zero_blocks: u64,
    delete_blocks: u64,
}

impl OffloadDelta {
    fn add(&mut self, d: &OffloadDelta) {
        self.ats += d.ats;
        self.ats_fail += d.ats_fail;
        self.clones += d.clones;
        self.clone_bytes += d.clone_bytes;
        self.zero_blocks += d.zero_blocks;
        self.delete_blocks += d.delete_blocks;
    }
}

/// Per-kind changes of one volume and its offloads' changes.
struct VolumeDelta {
    kinds: Vec<(IoKind, KindDelta)>,
    offloads: OffloadDelta,
}

fn delta(then: Option<&VolumeActivity>, now: &VolumeActivity) -> VolumeDelta {
    let then = then.filter(|t| continues(t, now));
    let kinds = now
        .io
        .iter()
        .map(|k| {
            let t = then.and_then(|t| kind_of(&t.io, k.kind));
            let base = |f: fn(&IoKindSnapshot) -> u64| t.map_or(0, f);
            (
                k.kind,
                KindDelta {
                    operations: k.operations - base(|t| t.operations),
                    bytes: k.bytes - base(|t| t.bytes),
                    errors: k.errors - base(|t| t.errors),
                    latency_ns: k.latency_ns - base(|t| t.latency_ns),
                },
            )
        })
        .collect();
    let (o, t) = (&now.offloads, then.map(|t| t.offloads).unwrap_or_default());
    VolumeDelta {
        kinds,
        offloads: OffloadDelta {
            ats: o.ats.saturating_sub(t.ats),
            ats_fail: o.ats_miscompare.saturating_sub(t.ats_miscompare),
            clones: o.clone_commands.saturating_sub(t.clone_commands),
            clone_bytes: o.clone_shared_bytes.saturating_sub(t.clone_shared_bytes),
            zero_blocks: o.zero_blocks.saturating_sub(t.zero_blocks),
            delete_blocks: o.delete_blocks.saturating_sub(t.delete_blocks),
        },
    }
}

/// Adds `d` into the running totals of a row.
#[derive(Default)]
struct Totals {
    clients: u32,
    read: KindDelta,
    write: KindDelta,
    all_latency_ns: u64,
    errors: u64,
    offloads: OffloadDelta,
}

impl Totals {
    fn add(&mut self, clients: u32, d: &VolumeDelta) {
        self.clients += clients;
        for (kind, k) in &d.kinds {
            let into = match kind {
                IoKind::Read => Some(&mut self.read),
                IoKind::Write => Some(&mut self.write),
                _ => None,
            };
            if let Some(into) = into {
                into.operations += k.operations;
                into.bytes += k.bytes;
                into.latency_ns += k.latency_ns;
            }
            self.all_latency_ns += k.latency_ns;
            self.errors += k.errors;
        }
        self.offloads.add(&d.offloads);
    }

    fn row(&self, kind: RateSubject, name: String, owner: String, seconds: f64) -> ActivityRate {
        let per_s = |n: u64| n as f64 / seconds;
        let mib_s = |n: u64| n as f64 / (1u64 << 20) as f64 / seconds;
        let mean_us = |k: &KindDelta| {
            if k.operations == 0 {
                0.0
            } else {
                k.latency_ns as f64 / k.operations as f64 / 1000.0
            }
        };
        ActivityRate {
            kind,
            name,
            owner,
            clients: self.clients,
            read_iops: per_s(self.read.operations),
            write_iops: per_s(self.write.operations),
            read_mib_s: mib_s(self.read.bytes),
            write_mib_s: mib_s(self.write.bytes),
            read_latency_us: mean_us(&self.read),
            write_latency_us: mean_us(&self.write),
            queue: self.all_latency_ns as f64 / 1e9 / seconds,
            errors_s: per_s(self.errors),
            ats_s: per_s(self.offloads.ats),
            ats_fail_s: per_s(self.offloads.ats_fail),
            clone_s: per_s(self.offloads.clones),
            clone_mib_s: mib_s(self.offloads.clone_bytes),
            zero_blocks_s: per_s(self.offloads.zero_blocks),
            delete_blocks_s: per_s(self.offloads.delete_blocks),
        }
    }
}

/// The rows of the interval of `seconds` between samples `then` and `now`:
/// each volume of `now` by name, then each host that owns any.
pub fn interval_rates(
    then: &[VolumeActivity],
    now: &[VolumeActivity],
    seconds: f64,
) -> Vec<ActivityRate> {
    let seconds = seconds.max(1e-3);
    let mut rows = Vec::new();
    let mut hosts: std::collections::BTreeMap<String, Totals> = Default::default();
    for v in now {
        let d = delta(then.iter().find(|t| t.volume == v.volume), v);
        let mut one = Totals::default();
        one.add(v.clients, &d);
        rows.push(one.row(
            RateSubject::Volume,
            v.volume.clone(),
            v.owner.clone(),
            seconds,
        ));
        hosts.entry(v.owner.clone()).or_default().add(v.clients, &d);
    }
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    for (host, totals) in hosts {
        rows.push(totals.row(RateSubject::Host, host.clone(), host, seconds));
    }
    rows
}

/// How often a control plane samples its hosts' activity.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// Intervals the history keeps: one hour at [`SAMPLE_INTERVAL`].
pub const HISTORY_INTERVALS: usize = 720;

/// The rates of one interval, as `GET /v1/activity/history` answers them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActivityInterval {
    /// When it ended (ms since the Unix epoch).
    pub end_ms: u64,
    /// How long it was.
    pub seconds: f64,
    /// Each volume that did something in it, by name, then each host that
    /// owns a volume.
    pub rates: Vec<ActivityRate>,
}

/// What `GET /v1/activity/history` answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActivityHistoryView {
    /// Seconds between samples.
    pub sample_interval_s: u64,
    /// Intervals kept at most (the oldest go first).
    pub capacity: usize,
    /// The intervals asked for, oldest first.
    pub intervals: Vec<ActivityInterval>,
}

/// The last [`HISTORY_INTERVALS`] intervals of activity, from samples.
#[derive(Debug, Default)]
pub struct ActivityHistory {
    last: Option<(u64, Vec<VolumeActivity>)>,
    intervals: VecDeque<ActivityInterval>,
}

impl ActivityHistory {
    /// Adds the sample taken at `at_ms`: the interval since the previous
    /// sample (none for the first, or when the clock went back).
    pub fn record(&mut self, at_ms: u64, sample: Vec<VolumeActivity>) {
        if let Some((then_ms, then)) = &self.last {
            if at_ms > *then_ms {
                let seconds = (at_ms - then_ms) as f64 / 1000.0;
                let rates = interval_rates(then, &sample, seconds)
                    .into_iter()
                    .filter(|r| r.kind == RateSubject::Host || r.moved())
                    .collect();
                self.intervals.push_back(ActivityInterval {
                    end_ms: at_ms,
                    seconds,
                    rates,
                });
                while self.intervals.len() > HISTORY_INTERVALS {
                    self.intervals.pop_front();
                }
            }
        }
        self.last = Some((at_ms, sample));
    }

    /// The intervals that ended after `after_ms` (all with None), oldest
    /// first.
    pub fn view(&self, after_ms: Option<u64>) -> ActivityHistoryView {
        let after = after_ms.unwrap_or(0);
        ActivityHistoryView {
            sample_interval_s: SAMPLE_INTERVAL.as_secs(),
            capacity: HISTORY_INTERVALS,
            intervals: self
                .intervals
                .iter()
                .filter(|i| i.end_ms > after)
                .cloned()
                .collect(),
        }
    }
}

impl ActivityRate {
    /// Whether anything was asked of it in the interval.
    fn moved(&self) -> bool {
        [
            self.read_iops,
            self.write_iops,
            self.queue,
            self.errors_s,
            self.ats_s,
            self.clone_s,
            self.zero_blocks_s,
            self.delete_blocks_s,
        ]
        .iter()
        .any(|r| *r > 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{OffloadView, VolumeIoStats};
    use std::time::Duration;

    fn sample(volume: &str, owner: &str, stats: &VolumeIoStats, ats: u64) -> VolumeActivity {
        VolumeActivity {
            volume: volume.into(),
            owner: owner.into(),
            clients: 1,
            io: stats.snapshot(),
            read_cache_hits: 0,
            read_cache_misses: 0,
            checksum_repairs: 0,
            resynced_bytes: 0,
            degraded_write_bytes: 0,
            offloads: OffloadView {
                ats,
                ..OffloadView::default()
            },
        }
    }

    #[test]
    fn rates_are_the_counters_differences_over_the_interval() {
        let (a, b) = (VolumeIoStats::default(), VolumeIoStats::default());
        a.record(IoKind::Write, 4096, Duration::from_micros(100), true);
        let then = vec![sample("a", "host-1", &a, 0), sample("b", "host-1", &b, 0)];
        for _ in 0..200 {
            a.record(IoKind::Write, 4096, Duration::from_micros(300), true);
        }
        for _ in 0..100 {
            b.record(IoKind::Read, 8192, Duration::from_micros(50), true);
        }
        let now = vec![sample("a", "host-1", &a, 10), sample("b", "host-1", &b, 0)];
        let rows = interval_rates(&then, &now, 2.0);
        assert_eq!(rows.len(), 3, "{rows:?}");
        let (ra, rb, host) = (&rows[0], &rows[1], &rows[2]);
        assert_eq!(
            (ra.name.as_str(), ra.write_iops, ra.read_iops),
            ("a", 100.0, 0.0)
        );
        assert_eq!(ra.write_mib_s, 200.0 * 4096.0 / 1048576.0 / 2.0);
        assert!((ra.write_latency_us - 300.0).abs() < 1e-9);
        assert_eq!(ra.ats_s, 5.0);
        assert_eq!((rb.read_iops, rb.read_latency_us), (50.0, 50.0));
        // Host: both volumes; queue = (200 x 300 us + 100 x 50 us) / 2 s.
        assert_eq!(
            (host.kind, host.name.as_str()),
            (RateSubject::Host, "host-1")
        );
        assert_eq!(
            (host.read_iops, host.write_iops, host.clients),
            (50.0, 100.0, 2)
        );
        assert!((host.queue - 0.0325).abs() < 1e-9, "{}", host.queue);
    }

    #[test]
    fn a_new_owner_or_a_new_volume_counts_from_zero() {
        let old = VolumeIoStats::default();
        for _ in 0..1000 {
            old.record(IoKind::Write, 4096, Duration::from_micros(100), true);
        }
        let then = vec![sample("a", "host-1", &old, 0)];
        let fresh = VolumeIoStats::default();
        for _ in 0..10 {
            fresh.record(IoKind::Write, 4096, Duration::from_micros(100), true);
        }
        let moved = vec![
            sample("a", "host-2", &fresh, 0),
            sample("c", "host-2", &fresh, 0),
        ];
        let rows = interval_rates(&then, &moved, 1.0);
        assert_eq!(rows[0].write_iops, 10.0);
        assert_eq!(rows[1].write_iops, 10.0);
    }

    #[test]
    fn the_history_keeps_moving_volumes_and_every_owner_for_an_hour() {
        let (busy, idle) = (VolumeIoStats::default(), VolumeIoStats::default());
        let mut history = ActivityHistory::default();
        history.record(1_000, vec![sample("busy", "host-1", &busy, 0)]);
        assert!(
            history.view(None).intervals.is_empty(),
            "one sample is no interval"
        );
        for i in 1..=(HISTORY_INTERVALS as u64 + 10) {
            for _ in 0..i {
                busy.record(IoKind::Write, 4096, Duration::from_micros(100), true);
            }
            history.record(
                1_000 + i * 5_000,
                vec![
                    sample("busy", "host-1", &busy, 0),
                    sample("idle", "host-2", &idle, 0),
                ],
            );
        }
        let view = history.view(None);
        assert_eq!(view.intervals.len(), HISTORY_INTERVALS);
        assert_eq!(view.sample_interval_s, 5);
        let last = view.intervals.last().unwrap();
        assert_eq!(last.end_ms, 1_000 + (HISTORY_INTERVALS as u64 + 10) * 5_000);
        assert_eq!(last.seconds, 5.0);
        // The idle volume has no row; its owner has one, at zero.
        let names: Vec<_> = last
            .rates
            .iter()
            .map(|r| (r.kind, r.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                (RateSubject::Volume, "busy"),
                (RateSubject::Host, "host-1"),
                (RateSubject::Host, "host-2")
            ]
        );
        assert_eq!(
            last.rates[0].write_iops,
            (HISTORY_INTERVALS as f64 + 10.0) / 5.0
        );
        assert_eq!(last.rates[2].write_iops, 0.0);
        // Asking after an interval's end answers only the newer ones.
        let after = view.intervals[HISTORY_INTERVALS - 3].end_ms;
        assert_eq!(history.view(Some(after)).intervals.len(), 2);
    }

    #[test]
    fn a_clock_that_goes_back_makes_no_interval() {
        let stats = VolumeIoStats::default();
        let mut history = ActivityHistory::default();
        history.record(10_000, vec![sample("a", "host-1", &stats, 0)]);
        history.record(9_000, vec![sample("a", "host-1", &stats, 0)]);
        assert!(history.view(None).intervals.is_empty());
        history.record(14_000, vec![sample("a", "host-1", &stats, 0)]);
        assert_eq!(history.view(None).intervals[0].seconds, 5.0);
    }
}
