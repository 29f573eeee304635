//! Whether a guest's one-block read asks the host's page cache first.
//!
//! Owns: [`PageProbe`], one per disk group, which counts the page cache
//! probes (`Disk::read_at_if_cached`) that missed in a row. Must not touch:
//! the reads themselves; it only answers "probe this one?" and hears how a
//! probe went.
//!
//! Why: a probe that finds the block serves the read on the calling
//! thread at once, the cheapest read there is; one that misses costs a
//! system call for nothing, since the read then goes through the disk
//! group's ring, which starts the device read itself. While a guest reads
//! blocks the page cache does not hold (a volume written in large writes,
//! which go past it, or larger than the host's memory), every read paid
//! that call. After [`PageProbe::REST_AFTER`] misses in a row, only one
//! read in [`PageProbe::REST_EVERY`] probes; the first hit brings every
//! read back to probing.
//!
//! Invariants: a probe is never skipped while the last one hit; while
//! resting, one read in `REST_EVERY` still probes, so a page cache that
//! fills again (the guest rereads what it just read) is found within that
//! many reads.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// The page cache probes of one disk group, as they went lately.
#[derive(Default)]
pub(crate) struct PageProbe {
    /// Probes that missed since the last hit (saturating).
    missed_in_a_row: AtomicU32,
    /// Reads while resting, to pick the one in `REST_EVERY` that probes.
    resting_reads: AtomicU32,
}

impl PageProbe {
    /// Misses in a row after which probes rest.
    pub(crate) const REST_AFTER: u32 = 16;
    /// While resting, one read in this many probes.
    pub(crate) const REST_EVERY: u32 = 16;

    /// Whether this read should ask the page cache first.
    pub(crate) fn should_probe(&self) -> bool {
        self.missed_in_a_row.load(Relaxed) < Self::REST_AFTER
            || self
                .resting_reads
                .fetch_add(1, Relaxed)
                .is_multiple_of(Self::REST_EVERY)
    }

    /// How a probe went.
    pub(crate) fn probed(&self, hit: bool) {
        if hit {
            if self.missed_in_a_row.load(Relaxed) != 0 {
                self.missed_in_a_row.store(0, Relaxed);
            }
        } else {
            let _ = self
                .missed_in_a_row
                .fetch_update(Relaxed, Relaxed, |n| n.checked_add(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn probes_rest_after_misses_in_a_row_and_one_hit_wakes_them() {
        let probe = PageProbe::default();
        for _ in 0..PageProbe::REST_AFTER {
            assert!(probe.should_probe());
            probe.probed(false);
        }
        let probing = (0..PageProbe::REST_EVERY * 4)
            .filter(|_| probe.should_probe())
            .count();
        assert_eq!(probing, 4, "one read in REST_EVERY probes while resting");
        probe.probed(true);
        assert!((0..100).all(|_| probe.should_probe()));
    }

    proptest! {
        /// Whatever the history, a probe that hit is followed by reads that
        /// all probe, and among any REST_EVERY reads at least one probes.
        #[test]
        fn a_hit_is_never_followed_by_a_skipped_probe(history in proptest::collection::vec(any::<bool>(), 0..200)) {
            let probe = PageProbe::default();
            let mut last_hit = true;
            let mut skipped_in_a_row = 0;
            for hit in history {
                if probe.should_probe() {
                    probe.probed(hit);
                    last_hit = hit;
                    skipped_in_a_row = 0;
                } else {
                    prop_assert!(!last_hit, "skipped right after a hit");
                    skipped_in_a_row += 1;
                    prop_assert!(skipped_in_a_row < PageProbe::REST_EVERY);
                }
            }
        }
    }
}
