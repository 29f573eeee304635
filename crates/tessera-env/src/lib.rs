//! The environment a Tessera component runs in: every source of
//! nondeterminism behind a trait.
//!
//! Owns: the [`Clock`] and [`Rng`] traits (and, in `disk`, the `Disk` trait)
//! with their real backends and the controllable ones tests use.
//! Must not touch: domain logic. Core crates take these traits as parameters
//! instead of calling `Instant::now`, `rand::thread_rng` or `std::fs`
//! themselves, so that a seeded simulator can later run a whole cluster on one
//! thread and replay a failure from its seed.

pub mod background;
pub mod disk;
pub mod disk_fault;
pub mod disk_switch;
pub mod in_flight;
pub mod io_ring;
pub mod plug;
pub mod space;

pub use disk::{
    AlignedBuf, Disk, DiskError, FileDisk, FileDiskOptions, PreparedWrite, ReadFd, ReadVia,
    DISK_ALIGN,
};
pub use disk_fault::{FaultDisk, FaultOps};
pub use disk_switch::{FailSwitch, SwitchedDisk};
pub use in_flight::InFlight;
pub use io_ring::{IoRing, ReadDone, ReadPlace, WriteDone};
pub use plug::Plug;

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Time as a component sees it.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time since an arbitrary origin, for timeouts and rates.
    fn monotonic(&self) -> Duration;
    /// Wall-clock milliseconds since the Unix epoch, for records people read.
    fn wall_ms(&self) -> u64;
}

/// The machine's clocks.
#[derive(Debug, Clone)]
pub struct SystemClock {
    origin: Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn monotonic(&self) -> Duration {
        self.origin.elapsed()
    }
    fn wall_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock that moves only when a test advances it.
#[derive(Debug, Default, Clone)]
pub struct ManualClock {
    now_ns: Arc<AtomicU64>,
}

impl ManualClock {
    /// Moves time forward.
    pub fn advance(&self, by: Duration) {
        self.now_ns
            .fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn monotonic(&self) -> Duration {
        Duration::from_nanos(self.now_ns.load(Ordering::SeqCst))
    }
    fn wall_ms(&self) -> u64 {
        self.now_ns.load(Ordering::SeqCst) / 1_000_000
    }
}

/// Randomness as a component sees it.
pub trait Rng: Send + Sync + 'static {
    /// A uniformly random 64-bit value.
    fn next_u64(&self) -> u64;
}

/// A seeded generator: the same seed gives the same sequence, so a failing
/// test prints its seed and reproduces.
pub struct SeededRng {
    inner: Mutex<rand::rngs::StdRng>,
}

impl SeededRng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        use rand::SeedableRng;
        SeededRng {
            inner: Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)),
        }
    }

    /// A generator seeded from the operating system, for production use.
    pub fn from_entropy() -> Self {
        use rand::SeedableRng;
        SeededRng {
            inner: Mutex::new(rand::rngs::StdRng::from_entropy()),
        }
    }
}

impl Rng for SeededRng {
    fn next_u64(&self) -> u64 {
        use rand::RngCore;
        self.inner.lock().next_u64()
    }
}
