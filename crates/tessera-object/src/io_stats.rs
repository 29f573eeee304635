//! What clients did to one volume on its owner: operations, bytes, errors
//! and latency per kind of operation, counted since the owner took the
//! volume.
//!
//! Owns: [`VolumeIoStats`] (lock-free counters the owner bumps once per
//! operation) and [`VolumeIoSnapshot`] (a copy read by the API, the metrics
//! endpoint and `tessera top`).
//! Must not touch: the clock (callers pass the elapsed time they measured
//! with the host's clock), the data path's decisions.
//! Invariants: counters only grow while one owner holds the volume (a new
//! owner starts from zero, which Prometheus reads as a counter reset); an
//! operation lands in exactly one latency bucket, so the buckets of a kind
//! add up to its operation count.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A kind of client operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IoKind {
    /// READ.
    Read,
    /// WRITE.
    Write,
    /// FLUSH (SYNCHRONIZE CACHE).
    Flush,
    /// UNMAP (TRIM).
    Unmap,
    /// WRITE ZEROES (WRITE SAME).
    WriteZeroes,
    /// COMPARE AND WRITE (ATS).
    CompareAndWrite,
}

impl IoKind {
    /// Every kind, in the order snapshots list them.
    pub const ALL: [IoKind; 6] = [
        IoKind::Read,
        IoKind::Write,
        IoKind::Flush,
        IoKind::Unmap,
        IoKind::WriteZeroes,
        IoKind::CompareAndWrite,
    ];

    /// Its name in metrics labels and JSON.
    pub fn name(self) -> &'static str {
        match self {
            IoKind::Read => "read",
            IoKind::Write => "write",
            IoKind::Flush => "flush",
            IoKind::Unmap => "unmap",
            IoKind::WriteZeroes => "write_zeroes",
            IoKind::CompareAndWrite => "compare_and_write",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Upper bounds of the latency buckets, in microseconds; a last bucket
/// takes everything slower. From a page-cache hit (tens of us) to an
/// owner move (seconds).
pub const LATENCY_BOUNDS_US: [u64; 15] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 5_000_000,
];

const BUCKETS: usize = LATENCY_BOUNDS_US.len() + 1;

#[derive(Default)]
struct KindCounters {
    operations: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    latency_ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

/// The counters of one volume on its owner.
#[derive(Default)]
pub struct VolumeIoStats {
    kinds: [KindCounters; IoKind::ALL.len()],
}

impl std::fmt::Debug for VolumeIoStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeIoStats").finish_non_exhaustive()
    }
}

impl VolumeIoStats {
    /// Counts one finished operation of `kind` that moved `bytes` and took
    /// `took`; a failed one counts as an operation and an error, its bytes
    /// are not counted.
    pub fn record(&self, kind: IoKind, bytes: u64, took: Duration, ok: bool) {
        let k = &self.kinds[kind.index()];
        k.operations.fetch_add(1, Ordering::Relaxed);
        if ok {
            k.bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            k.errors.fetch_add(1, Ordering::Relaxed);
        }
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        k.latency_ns.fetch_add(ns, Ordering::Relaxed);
        k.buckets[bucket_of(took)].fetch_add(1, Ordering::Relaxed);
    }

    /// A copy of every counter.
    pub fn snapshot(&self) -> Vec<IoKindSnapshot> {
        IoKind::ALL
            .iter()
            .map(|&kind| {
                let k = &self.kinds[kind.index()];
                IoKindSnapshot {
                    kind,
                    operations: k.operations.load(Ordering::Relaxed),
                    bytes: k.bytes.load(Ordering::Relaxed),
                    errors: k.errors.load(Ordering::Relaxed),
                    latency_ns: k.latency_ns.load(Ordering::Relaxed),
                    latency_buckets: k
                        .buckets
                        .iter()
                        .map(|b| b.load(Ordering::Relaxed))
                        .collect(),
                }
            })
            .collect()
    }
}

/// The bucket an operation that took `took` falls in.
fn bucket_of(took: Duration) -> usize {
    let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    LATENCY_BOUNDS_US
        .iter()
        .position(|&bound| us <= bound)
        .unwrap_or(LATENCY_BOUNDS_US.len())
}

/// The counters of one kind of operation of a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IoKindSnapshot {
    /// The kind.
    pub kind: IoKind,
    /// Operations finished, failed ones included.
    pub operations: u64,
    /// Bytes moved by the ones that succeeded (for UNMAP and WRITE ZEROES:
    /// bytes of address space they covered).
    pub bytes: u64,
    /// Operations that failed.
    pub errors: u64,
    /// Their latencies added up, in nanoseconds.
    pub latency_ns: u64,
    /// Operations per latency bucket (not cumulative): one per bound of
    /// [`LATENCY_BOUNDS_US`], then one for slower ones.
    pub latency_buckets: Vec<u64>,
}

/// Every kind's counters of one volume.
pub type VolumeIoSnapshot = Vec<IoKindSnapshot>;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bounds_rise() {
        assert!(LATENCY_BOUNDS_US.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_failed_write_counts_as_an_error_without_bytes() {
        let stats = VolumeIoStats::default();
        stats.record(IoKind::Write, 4096, Duration::from_micros(80), true);
        stats.record(IoKind::Write, 4096, Duration::from_millis(3), false);
        let write = &stats.snapshot()[1];
        assert_eq!(write.kind, IoKind::Write);
        assert_eq!((write.operations, write.bytes, write.errors), (2, 4096, 1));
        assert_eq!(write.latency_ns, 3_080_000);
        // 80 us falls under 100 us; 3 ms under 5 ms.
        assert_eq!(write.latency_buckets[1], 1);
        assert_eq!(write.latency_buckets[6], 1);
    }

    proptest! {
        #[test]
        fn buckets_add_up_to_the_operations_and_hold_each_latency(
            ops in proptest::collection::vec((0usize..6, 0u64..1 << 20, 0u64..10_000_000, any::<bool>()), 0..200)
        ) {
            let stats = VolumeIoStats::default();
            for &(kind, bytes, us, ok) in &ops {
                stats.record(IoKind::ALL[kind], bytes, Duration::from_micros(us), ok);
                let b = bucket_of(Duration::from_micros(us));
                // The bucket's bound holds the latency and the one below does not.
                prop_assert!(b == LATENCY_BOUNDS_US.len() || us <= LATENCY_BOUNDS_US[b]);
                prop_assert!(b == 0 || us > LATENCY_BOUNDS_US[b - 1]);
            }
            for s in stats.snapshot() {
                let mine: Vec<_> = ops.iter().filter(|o| IoKind::ALL[o.0] == s.kind).collect();
                prop_assert_eq!(s.operations, mine.len() as u64);
                prop_assert_eq!(s.latency_buckets.iter().sum::<u64>(), s.operations);
                prop_assert_eq!(s.errors, mine.iter().filter(|o| !o.3).count() as u64);
                prop_assert_eq!(s.bytes, mine.iter().filter(|o| o.3).map(|o| o.1).sum::<u64>());
            }
        }
    }
}
