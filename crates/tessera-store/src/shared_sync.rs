//! Syncs of one capacity device shared by the commits that wait for them.
//!
//! Owns: the count of callers that asked for a sync and of those a finished
//! sync covers. Must not touch: the state or the log (the commit of a
//! placed write's record calls it, beside the record's own write:
//! `engine::sync_placed`).
//!
//! Large writes placed straight on a capacity device are written without a
//! flush, and each commit that holds such writes needs their data durable
//! before it is acknowledged. Each used to run its own `fdatasync`: with
//! eight such writes in flight, eight cache flushes of the same device, one
//! after another, where one flush begun after all eight writes finished
//! makes every one of them durable. On a disk with a volatile cache a flush
//! costs about as much as a 256 KiB write (fio on a virtio disk: 753 MiB/s
//! of 256 KiB writes with a flush after each, 1,367 with one after every
//! fourth).
//!
//! Invariant: [`SharedSync::sync`] returns `Ok` only once a sync of the
//! device that *began after the call* has succeeded, so every write that
//! finished before the call is durable; a call that a failed sync was to
//! cover gets that sync's error. At most one sync of the device runs at a
//! time through it; a caller that finds one running waits for it to end
//! and then, if it is not covered, leads the next one for every caller
//! waiting by then.

use parking_lot::{Condvar, Mutex};
use tessera_env::disk::{Disk, DiskError};

/// The syncs of one device shared by concurrent writers.
#[derive(Default)]
pub(crate) struct SharedSync {
    state: Mutex<SyncState>,
    ended: Condvar,
}

#[derive(Default)]
struct SyncState {
    /// Calls so far; call number n waits for a sync that covers n.
    asked: u64,
    /// Every call up to this one is covered by a sync that succeeded.
    covered: u64,
    /// A sync is running.
    running: bool,
    /// The last sync that failed: the calls it was to cover (numbers
    /// above the first field, up to the second) and its error. Those calls
    /// fail even if a later sync succeeds: after a failed flush the kernel
    /// may have dropped what it could not write.
    failed: Option<(u64, u64, DiskError)>,
}

impl SharedSync {
    /// Makes every write to `disk` that finished before this call durable:
    /// runs a sync of `disk`, or waits for one that another caller began
    /// after this call. `disk` must be the same device on every call.
    pub(crate) fn sync(&self, disk: &dyn Disk) -> Result<(), DiskError> {
        let mut st = self.state.lock();
        st.asked += 1;
        let mine = st.asked;
        loop {
            if let Some((after, last, e)) = &st.failed {
                if *after < mine && mine <= *last {
                    return Err(e.clone());
                }
            }
            if st.covered >= mine {
                return Ok(());
            }
            if st.running {
                self.ended.wait(&mut st);
                continue;
            }
            // Lead a sync for every call made so far: each of them began
            // before this sync does.
            st.running = true;
            let (after, covers) = (st.covered, st.asked);
            drop(st);
            let result = disk.sync();
            st = self.state.lock();
            st.running = false;
            match result {
                Ok(()) => st.covered = st.covered.max(covers),
                Err(e) => st.failed = Some((after, covers, e)),
            }
            self.ended.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// A device whose syncs take a while and are numbered: `begun` counts
    /// syncs begun, `last_ended` is the number of the latest one that ended.
    #[derive(Default)]
    struct SlowSyncs {
        begun: AtomicU64,
        last_ended: AtomicU64,
        fail_from: Option<u64>,
    }

    impl Disk for SlowSyncs {
        fn read_at(&self, _buf: &mut [u8], _offset: u64) -> Result<(), DiskError> {
            Ok(())
        }
        fn write_at(&self, _buf: &[u8], _offset: u64) -> Result<(), DiskError> {
            Ok(())
        }
        fn sync(&self) -> Result<(), DiskError> {
            let n = self.begun.fetch_add(1, Ordering::SeqCst) + 1;
            std::thread::sleep(Duration::from_millis(2));
            self.last_ended.fetch_max(n, Ordering::SeqCst);
            match self.fail_from {
                Some(f) if n >= f => Err(DiskError::from_io(
                    "slow",
                    "sync",
                    0,
                    0,
                    &std::io::Error::other("injected"),
                )),
                _ => Ok(()),
            }
        }
        fn size(&self) -> u64 {
            1 << 20
        }
        fn name(&self) -> String {
            "slow".into()
        }
    }

    /// Calls `sync` from `threads` threads `each` times; every call checks
    /// that a sync begun after it had ended when it returned.
    fn run(disk: &Arc<SlowSyncs>, threads: usize, each: usize) -> Vec<Result<(), DiskError>> {
        let shared = Arc::new(SharedSync::default());
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (disk, shared) = (disk.clone(), shared.clone());
                std::thread::spawn(move || {
                    let mut results = Vec::new();
                    for _ in 0..each {
                        let before = disk.begun.load(Ordering::SeqCst);
                        let r = shared.sync(disk.as_ref());
                        if r.is_ok() {
                            assert!(
                                disk.last_ended.load(Ordering::SeqCst) > before,
                                "returned before a sync begun after the call ended"
                            );
                        }
                        results.push(r);
                    }
                    results
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    }

    #[test]
    fn a_lone_caller_runs_its_own_sync() {
        let disk = Arc::new(SlowSyncs::default());
        let results = run(&disk, 1, 5);
        assert!(results.iter().all(|r| r.is_ok()));
        assert_eq!(disk.begun.load(Ordering::SeqCst), 5);
    }

    #[test]
    fn concurrent_callers_share_syncs_and_each_is_covered() {
        let disk = Arc::new(SlowSyncs::default());
        let results = run(&disk, 8, 20);
        assert_eq!(results.len(), 160);
        assert!(results.iter().all(|r| r.is_ok()));
        let syncs = disk.begun.load(Ordering::SeqCst);
        assert!(syncs < 160, "160 calls ran {syncs} syncs: none shared");
    }

    #[test]
    fn a_failed_sync_fails_the_calls_it_covered_and_no_call_passes_unsynced() {
        let disk = Arc::new(SlowSyncs {
            fail_from: Some(3),
            ..Default::default()
        });
        let results = run(&disk, 4, 10);
        // The first two syncs succeeded, every later one failed: no call
        // that needed a later sync may return Ok (checked in `run`), and
        // some calls got the device's error.
        let failed = results.iter().filter(|r| r.is_err()).count();
        assert!(failed > 0);
        for e in results.iter().filter_map(|r| r.as_ref().err()) {
            assert!(e.to_string().contains("injected"), "{e}");
        }
    }
}
