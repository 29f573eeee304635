//! Whether a guest's one-block read that goes to a device also asks the
//! host's page cache to read the blocks around it in.
//!
//! Owns: [`ReadAround`], one per disk group: the windows (runs of
//! [`ReadAround::WINDOW_BYTES`] on a device) read around lately, and how
//! many guest reads landed in one of them. Must not touch: the reads and
//! the page cache themselves; it only answers "read around this one?".
//!
//! Why: data written past the page cache (large writes, which go to the
//! device with `O_DIRECT`) is read from the device block by block, each
//! miss a device read and a wait, until every block has been read once.
//! Reading the window around a miss in (`Disk::read_around`) caches the
//! blocks a large write placed together, or the log destaged side by side,
//! so a volume the guest rereads is in memory after a few thousand misses,
//! as it would be had its writes gone through the page cache. But a window
//! costs the device several times what one block does (on this class of
//! virtual disk, 64 KiB reads run at a quarter of the rate of 4 KiB ones),
//! so where reads seldom come back to a window (random reads over a volume
//! far larger than memory) it would cut read rates several times over.
//! Hence the measure: of the last [`ReadAround::PERIOD`] reads, at least
//! one in [`ReadAround::PAYS_ONE_IN`] must have landed in a window read
//! around before, or windows are read around only for one read in
//! [`ReadAround::SAMPLE_EVERY`], enough to notice when rereads begin.
//!
//! Invariants: a window is read around at most once between two clearings
//! of the record (every [`ReadAround::CLEAR_EVERY_PERIODS`] periods, which
//! stand for the page cache forgetting), unless a read in it is seen to
//! miss the page cache ([`Around::Again`]); the record is a fixed-size bitmap,
//! so memory does not grow with the devices (windows that share a bit
//! count as one).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};

/// Bits in the record of windows read around (128 KiB of bitmap).
const RECORD_BITS: usize = 1 << 20;

/// What to do for one read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Around {
    /// Read in the window starting at this byte if the read goes to the
    /// device.
    Read(u64),
    /// The window starting at this byte was read around lately: again
    /// only if the page cache is seen to have dropped the block (a probe
    /// that missed).
    Again(u64),
    /// Not this read.
    No,
}

/// The windows one disk group read around lately, and whether doing so
/// pays.
pub(crate) struct ReadAround {
    /// One bit per window (hashed), set when it is read around.
    record: Box<[AtomicU64]>,
    /// Reads seen in this period.
    reads: AtomicU32,
    /// Of those, the ones that landed in a window already read around.
    reread: AtomicU32,
    /// Periods since the record was last cleared.
    periods: AtomicU32,
    /// Whether the last period showed rereads enough.
    pays: AtomicBool,
}

impl Default for ReadAround {
    fn default() -> Self {
        ReadAround {
            record: (0..RECORD_BITS / 64).map(|_| AtomicU64::new(0)).collect(),
            reads: AtomicU32::new(0),
            reread: AtomicU32::new(0),
            periods: AtomicU32::new(0),
            // A new group tries: the first period tells.
            pays: AtomicBool::new(true),
        }
    }
}

impl ReadAround {
    /// Bytes read around a miss, from a boundary of their size.
    pub(crate) const WINDOW_BYTES: u64 = 64 * 1024;
    /// Reads over which the share of rereads is measured.
    pub(crate) const PERIOD: u32 = 4096;
    /// Reading around pays while at least one read in this many lands in a
    /// window read around before.
    pub(crate) const PAYS_ONE_IN: u32 = 16;
    /// While it does not pay, one read in this many is still read around.
    pub(crate) const SAMPLE_EVERY: u32 = 64;
    /// The record is cleared after this many periods.
    pub(crate) const CLEAR_EVERY_PERIODS: u32 = 16;

    /// Hears of a guest's one-block read at byte `offset` of device
    /// `device` that the page cache may not hold, before it is served;
    /// says whether to read its window around it if it goes to the device.
    pub(crate) fn on_read(&self, device: u8, offset: u64) -> Around {
        let start = offset - offset % Self::WINDOW_BYTES;
        let (word, bit) = Self::slot(device, start / Self::WINDOW_BYTES);
        let seen = self.record[word].load(Relaxed) & bit != 0;
        if seen {
            self.reread.fetch_add(1, Relaxed);
        }
        let n = self.reads.fetch_add(1, Relaxed) + 1;
        if n >= Self::PERIOD {
            self.end_period();
        }
        if seen {
            return Around::Again(start);
        }
        if self.pays.load(Relaxed) || n.is_multiple_of(Self::SAMPLE_EVERY) {
            self.record[word].fetch_or(bit, Relaxed);
            Around::Read(start)
        } else {
            Around::No
        }
    }

    /// Whether reading around pays now.
    #[cfg(test)]
    pub(crate) fn pays(&self) -> bool {
        self.pays.load(Relaxed)
    }

    fn end_period(&self) {
        // The thread that ends the period takes its counts; others that
        // pass the bound meanwhile find them taken.
        let reads = self.reads.swap(0, Relaxed);
        if reads < Self::PERIOD {
            self.reads.fetch_add(reads, Relaxed);
            return;
        }
        let reread = self.reread.swap(0, Relaxed);
        self.pays
            .store(reread.saturating_mul(Self::PAYS_ONE_IN) >= reads, Relaxed);
        if self.periods.fetch_add(1, Relaxed) + 1 >= Self::CLEAR_EVERY_PERIODS {
            self.periods.store(0, Relaxed);
            for word in self.record.iter() {
                word.store(0, Relaxed);
            }
        }
    }

    /// The record's word and bit for window `window` of `device`.
    fn slot(device: u8, window: u64) -> (usize, u64) {
        // Fibonacci hashing spreads neighbouring windows and devices.
        let key = (window ^ (u64::from(device) << 56)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let index = (key >> (64 - RECORD_BITS.trailing_zeros())) as usize;
        (index / 64, 1 << (index % 64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const W: u64 = ReadAround::WINDOW_BYTES;

    /// A small volume read at random again and again: every window is read
    /// around once, on its first miss, and reading around keeps paying.
    #[test]
    fn rereads_of_a_small_volume_read_each_window_around_once() {
        let around = ReadAround::default();
        let windows = 2048u64;
        let mut asked = std::collections::HashMap::new();
        let mut x = 7u64;
        for _ in 0..(ReadAround::PERIOD * 6) {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let offset = (x >> 20) % (windows * W);
            if let Around::Read(start) = around.on_read(0, offset) {
                assert_eq!(start % W, 0);
                assert!(start <= offset && offset < start + W);
                *asked.entry(start).or_insert(0) += 1;
            }
        }
        assert!(around.pays());
        assert!(
            asked.values().all(|&n| n == 1),
            "a window read around twice"
        );
        assert!(asked.len() as u64 > windows * 9 / 10);
    }

    /// Reads that never come back to a window (a volume far larger than
    /// memory): after the first period, one read in `SAMPLE_EVERY` at most
    /// is read around; once rereads begin, every miss is again.
    #[test]
    fn reads_that_never_come_back_stop_reading_around_until_rereads_begin() {
        let around = ReadAround::default();
        let period = u64::from(ReadAround::PERIOD);
        let mut asked_after_first = 0;
        for i in 0..period * 8 {
            let asked = matches!(around.on_read(1, i * W), Around::Read(_));
            if i >= period {
                asked_after_first += u64::from(asked);
            }
        }
        assert!(!around.pays());
        assert!(
            asked_after_first <= period * 7 / u64::from(ReadAround::SAMPLE_EVERY) + 1,
            "{asked_after_first} windows read around while it did not pay"
        );
        // The guest now rereads a small set: within a few periods every
        // miss is read around again.
        for round in 0..period * 4 {
            around.on_read(1, (round % 64) * W);
        }
        assert!(around.pays());
    }

    proptest! {
        /// Whatever the reads, a window is read around at most once until
        /// the record is cleared, only one read around before is named
        /// again, and the window named holds the read.
        #[test]
        fn a_window_is_read_around_at_most_once_between_clearings(
            reads in proptest::collection::vec((0u8..3, 0u64..(1 << 32)), 1..3000),
        ) {
            let around = ReadAround::default();
            let mut asked = std::collections::HashSet::new();
            for (device, offset) in reads {
                match around.on_read(device, offset) {
                    Around::Read(start) => {
                        prop_assert!(start <= offset && offset < start + W);
                        prop_assert!(asked.insert((device, start)), "window read around twice");
                    }
                    Around::Again(start) => {
                        prop_assert!(start <= offset && offset < start + W);
                        // Or one that shares its bit in the record.
                        let slot = ReadAround::slot(device, start / W);
                        prop_assert!(
                            asked.iter().any(|&(d, s)| ReadAround::slot(d, s / W) == slot),
                            "a window never read around"
                        );
                    }
                    Around::No => {}
                }
            }
        }
    }
}
