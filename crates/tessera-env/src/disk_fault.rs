//! A device in memory that fails the way real devices fail, for tests.
//!
//! Owns: the fault model of a single device. It keeps two images: what the
//! device would return now (`current`) and what would survive a power cut
//! (`durable`); writes land in `current` and in a list of unsynced writes;
//! [`Disk::sync`] moves them to `durable`. A write made with
//! [`Disk::write_durable_at`] is durable at once and survives every power
//! cut, over whatever older unsynced writes to its range do; writes after
//! it are unsynced as usual. Faults:
//! - I/O errors on byte ranges (reads, writes or both);
//! - a power cut ([`FaultDisk::power_cut`]): every unsynced write survives or
//!   not at random, and the last one is torn at a 512-byte sector boundary;
//!   the device is then dead and [`FaultDisk::restart`] gives the device as
//!   it comes back (a new handle, so threads of the old run cannot write to
//!   the new one);
//! - bit flips in both images ([`FaultDisk::flip_bit`]);
//! - misdirected writes: the next write meant for one offset lands at another;
//! - a full device: writes fail with ENOSPC;
//! - a slow device: every operation sleeps first;
//! - a page cache that holds some ranges ([`FaultDisk::hold_in_cache`]):
//!   [`Disk::read_at_if_cached`] serves those at once and no others, so a
//!   test decides what the kernel would hold instead of hoping it does.
//!
//! Invariant: with no fault armed it behaves exactly like a file that was
//! synced at every [`Disk::sync`].

use crate::disk::{Disk, DiskError};
use parking_lot::Mutex;
use rand::{Rng as _, SeedableRng};
use std::io::ErrorKind;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

/// Bytes the power cut tears at: the sector size of the devices we model.
pub const TEAR_SECTOR_BYTES: usize = 512;

/// Which operations an error range fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOps {
    /// Reads only (a latent sector error).
    Reads,
    /// Writes only.
    Writes,
    /// Both.
    All,
}

#[derive(Default)]
struct FaultState {
    current: Vec<u8>,
    durable: Vec<u8>,
    /// Writes since the last sync, in the order they completed: (offset,
    /// data, made durable on its own by [`Disk::write_durable_at`]).
    unsynced: Vec<(u64, Vec<u8>, bool)>,
    errors: Vec<(Range<u64>, FaultOps)>,
    misdirect: Option<(u64, u64)>,
    full: bool,
    delay: Duration,
    slow_writes: Option<(Range<u64>, Duration)>,
    dead: bool,
    /// Byte ranges [`Disk::read_at_if_cached`] serves.
    cached: Vec<Range<u64>>,
    writes: u64,
    syncs: u64,
}

/// The fault-injecting device.
pub struct FaultDisk {
    name: String,
    size: u64,
    state: Arc<Mutex<FaultState>>,
}

impl FaultDisk {
    /// A zeroed device of `size` bytes.
    pub fn new(name: &str, size: u64) -> FaultDisk {
        FaultDisk {
            name: name.to_string(),
            size,
            state: Arc::new(Mutex::new(FaultState {
                current: vec![0; size as usize],
                durable: vec![0; size as usize],
                ..Default::default()
            })),
        }
    }

    /// Fails `ops` that touch `range` with EIO until cleared.
    pub fn fail_range(&self, range: Range<u64>, ops: FaultOps) {
        self.state.lock().errors.push((range, ops));
    }

    /// Removes every error range.
    pub fn clear_errors(&self) {
        self.state.lock().errors.clear();
    }

    /// Makes every write fail with ENOSPC (or stop failing).
    pub fn set_full(&self, full: bool) {
        self.state.lock().full = full;
    }

    /// Delays every operation by `delay`.
    pub fn set_delay(&self, delay: Duration) {
        self.state.lock().delay = delay;
    }

    /// Delays writes that touch `range` by `delay` before they land (a slow
    /// region of the device, or a write stuck in a deep device queue);
    /// other operations, syncs included, go on meanwhile.
    pub fn slow_writes_in(&self, range: Range<u64>, delay: Duration) {
        self.state.lock().slow_writes = Some((range, delay));
    }

    /// Has [`Disk::read_at_if_cached`] serve reads inside `range` (a page
    /// cache holding it); [`FaultDisk::drop_cache`] forgets every range.
    pub fn hold_in_cache(&self, range: Range<u64>) {
        self.state.lock().cached.push(range);
    }

    /// Has [`Disk::read_at_if_cached`] serve nothing (the kernel dropped
    /// its clean pages).
    pub fn drop_cache(&self) {
        self.state.lock().cached.clear();
    }

    /// The next write aimed at byte `intended` lands at byte `actual`.
    pub fn misdirect_next_write(&self, intended: u64, actual: u64) {
        self.state.lock().misdirect = Some((intended, actual));
    }

    /// Flips one bit at byte `offset`, in what is read now and in what
    /// survives a power cut.
    pub fn flip_bit(&self, offset: u64, bit: u8) {
        let mut s = self.state.lock();
        let i = offset as usize;
        if i < s.current.len() {
            s.current[i] ^= 1 << (bit % 8);
            s.durable[i] ^= 1 << (bit % 8);
        }
    }

    /// Reads the current image directly (test inspection).
    pub fn peek(&self, offset: u64, len: usize) -> Vec<u8> {
        let s = self.state.lock();
        let start = (offset as usize).min(s.current.len());
        let end = (start + len).min(s.current.len());
        s.current[start..end].to_vec()
    }

    /// Writes completed and syncs made so far.
    pub fn counters(&self) -> (u64, u64) {
        let s = self.state.lock();
        (s.writes, s.syncs)
    }

    /// Cuts the power: each unsynced write survives with probability 1/2,
    /// the last one is torn (a random prefix of its sectors survives), and the
    /// device stops answering. Returns how many unsynced writes there were.
    pub fn power_cut(&self, seed: u64) -> usize {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut s = self.state.lock();
        let unsynced = std::mem::take(&mut s.unsynced);
        let n = unsynced.len();
        for (i, (offset, data, durable)) in unsynced.into_iter().enumerate() {
            let start = offset as usize;
            // A durable write is on the media; replaying it here keeps it
            // over older unsynced writes to its range that survived.
            let keep = if durable {
                data.len()
            } else if i + 1 == n {
                let sectors = data.len().div_ceil(TEAR_SECTOR_BYTES);
                rng.gen_range(0..=sectors) * TEAR_SECTOR_BYTES
            } else if rng.gen_bool(0.5) {
                data.len()
            } else {
                0
            };
            let keep = keep.min(data.len());
            s.durable[start..start + keep].copy_from_slice(&data[..keep]);
        }
        s.dead = true;
        n
    }

    /// Simulates `kill -9` of the process: the page cache survives, so every
    /// completed write is kept; the device stops answering this handle.
    pub fn process_crash(&self) {
        let mut s = self.state.lock();
        s.unsynced.clear();
        s.durable = s.current.clone();
        s.dead = true;
    }

    /// The device after the machine comes back: a new handle over what was
    /// durable. Faults armed on the old handle are not carried over.
    pub fn restart(&self) -> FaultDisk {
        let s = self.state.lock();
        FaultDisk {
            name: self.name.clone(),
            size: self.size,
            state: Arc::new(Mutex::new(FaultState {
                current: s.durable.clone(),
                durable: s.durable.clone(),
                ..Default::default()
            })),
        }
    }

    fn check(
        &self,
        s: &FaultState,
        op: &'static str,
        offset: u64,
        len: u64,
    ) -> Result<(), DiskError> {
        let fail = |kind: ErrorKind, message: &str| DiskError {
            device: self.name.clone(),
            op,
            offset,
            len,
            kind,
            message: message.to_string(),
        };
        if s.dead {
            return Err(fail(ErrorKind::Other, "device is powered off"));
        }
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(fail(
                ErrorKind::UnexpectedEof,
                "beyond the end of the device",
            ));
        }
        let is_write = op == "write";
        for (range, ops) in &s.errors {
            let applies = match ops {
                FaultOps::Reads => !is_write,
                FaultOps::Writes => is_write,
                FaultOps::All => true,
            };
            if applies && range.start < offset + len.max(1) && offset < range.end {
                return Err(fail(ErrorKind::Other, "injected I/O error"));
            }
        }
        if is_write && s.full {
            return Err(fail(ErrorKind::StorageFull, "no space left on device"));
        }
        Ok(())
    }

    /// A write as it lands: where a misdirection sends it, in `current` and
    /// the unsynced list, and in `durable` too when `durable`.
    fn land_write(&self, buf: &[u8], offset: u64, durable: bool) -> Result<(), DiskError> {
        self.delay(Some((offset, buf.len() as u64)));
        let mut s = self.state.lock();
        self.check(&s, "write", offset, buf.len() as u64)?;
        let mut target = offset;
        if let Some((intended, actual)) = s.misdirect {
            if intended == offset && actual + buf.len() as u64 <= self.size {
                target = actual;
                s.misdirect = None;
            }
        }
        let start = target as usize;
        s.current[start..start + buf.len()].copy_from_slice(buf);
        if durable {
            s.durable[start..start + buf.len()].copy_from_slice(buf);
        }
        s.unsynced.push((target, buf.to_vec(), durable));
        s.writes += 1;
        Ok(())
    }

    /// Sleeps for the device's delay, plus the slow-write delay when `write`
    /// (offset, length) touches the slow range.
    fn delay(&self, write: Option<(u64, u64)>) {
        let d = {
            let s = self.state.lock();
            let slow = match (&s.slow_writes, write) {
                (Some((range, slow)), Some((offset, len)))
                    if range.start < offset + len && offset < range.end =>
                {
                    *slow
                }
                _ => Duration::ZERO,
            };
            s.delay + slow
        };
        if !d.is_zero() {
            std::thread::sleep(d);
        }
    }
}

impl Disk for FaultDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        self.delay(None);
        let s = self.state.lock();
        self.check(&s, "read", offset, buf.len() as u64)?;
        let start = offset as usize;
        buf.copy_from_slice(&s.current[start..start + buf.len()]);
        Ok(())
    }

    fn read_at_if_cached(&self, buf: &mut [u8], offset: u64) -> Result<bool, DiskError> {
        // Served from memory: no device delay.
        let end = offset + buf.len() as u64;
        let s = self.state.lock();
        if buf.is_empty() || !s.cached.iter().any(|r| r.start <= offset && end <= r.end) {
            return Ok(false);
        }
        self.check(&s, "read", offset, buf.len() as u64)?;
        buf.copy_from_slice(&s.current[offset as usize..end as usize]);
        Ok(true)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.land_write(buf, offset, false)
    }

    fn write_durable_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.land_write(buf, offset, true)
    }

    fn sync(&self) -> Result<(), DiskError> {
        self.delay(None);
        let mut s = self.state.lock();
        self.check(&s, "sync", 0, 0)?;
        let unsynced = std::mem::take(&mut s.unsynced);
        for (offset, data, _) in unsynced {
            let start = offset as usize;
            s.durable[start..start + data.len()].copy_from_slice(&data);
        }
        s.syncs += 1;
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synced_writes_survive_a_power_cut_and_unsynced_may_not() {
        let d = FaultDisk::new("t", 1 << 16);
        d.write_at(&[1u8; 4096], 0).unwrap();
        d.sync().unwrap();
        d.write_at(&[2u8; 4096], 4096).unwrap();
        assert_eq!(d.power_cut(7), 1);
        assert!(d.read_at(&mut [0u8; 16], 0).is_err(), "dead after the cut");
        let back = d.restart();
        let mut buf = vec![0u8; 8192];
        back.read_at(&mut buf, 0).unwrap();
        assert!(buf[..4096].iter().all(|&b| b == 1));
        // The unsynced block is torn at a sector boundary: a prefix of 2s.
        let twos = buf[4096..].iter().take_while(|&&b| b == 2).count();
        assert_eq!(twos % TEAR_SECTOR_BYTES, 0);
        assert!(buf[4096 + twos..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_durable_write_survives_every_power_cut_over_older_unsynced_writes() {
        for seed in 0..64 {
            let d = FaultDisk::new("t", 1 << 16);
            // Older, unsynced, same range: whether or not it survives, the
            // durable write after it must be what comes back.
            d.write_at(&[1u8; 8192], 0).unwrap();
            d.write_durable_at(&[2u8; 4096], 0).unwrap();
            // After it, unsynced as usual: survives whole, torn or not at all.
            d.write_at(&[3u8; 4096], 8192).unwrap();
            assert_eq!(d.counters(), (3, 0), "a durable write is no sync");
            d.power_cut(seed);
            let back = d.restart();
            let mut buf = vec![0u8; 3 * 4096];
            back.read_at(&mut buf, 0).unwrap();
            assert!(buf[..4096].iter().all(|&b| b == 2), "seed {seed}");
            assert!(
                buf[4096..8192].iter().all(|&b| b == 0 || b == 1),
                "seed {seed}"
            );
            let threes = buf[8192..].iter().take_while(|&&b| b == 3).count();
            assert_eq!(threes % TEAR_SECTOR_BYTES, 0, "seed {seed}");
            assert!(buf[8192 + threes..].iter().all(|&b| b == 0), "seed {seed}");
        }
    }

    #[test]
    fn armed_faults_fire() {
        let d = FaultDisk::new("t", 1 << 16);
        d.fail_range(8192..12288, FaultOps::Reads);
        assert!(d.read_at(&mut [0u8; 4096], 8192).is_err());
        assert!(d.write_at(&[0u8; 4096], 8192).is_ok());
        d.set_full(true);
        assert!(d.write_at(&[0u8; 4096], 0).unwrap_err().is_no_space());
        d.set_full(false);
        d.misdirect_next_write(0, 4096);
        d.write_at(&[9u8; 4096], 0).unwrap();
        assert_eq!(d.peek(4096, 1), vec![9]);
        assert_eq!(d.peek(0, 1), vec![0]);
        d.flip_bit(4096, 0);
        assert_eq!(d.peek(4096, 1), vec![8]);
    }
}
