//! Range locks: writes to overlapping blocks of one volume go one at a time.
//!
//! Owns: the set of block ranges currently being changed on a volume.
//! Why: a coordinator sends every write to all copies in parallel; if two
//! overlapping writes were in flight at once, the copies could apply them in
//! different orders and diverge. Serialising overlapping ranges (and only
//! those) keeps copies identical, makes read-modify-write of partial blocks
//! safe, and makes COMPARE AND WRITE atomic against every other write.
//! Invariant: no two guards alive at once cover a common block.

use parking_lot::Mutex;
use std::sync::Arc;
use tokio::sync::Notify;

/// Held ranges of one volume.
#[derive(Default)]
pub struct RangeLock {
    held: Mutex<Vec<(u64, u64, u64)>>,
    released: Notify,
    next_ticket: Mutex<u64>,
}

/// Holds `[start, end)` until dropped.
pub struct RangeGuard {
    lock: Arc<RangeLock>,
    ticket: u64,
}

impl RangeLock {
    /// Waits until no held range overlaps `[start, end)` (in blocks), then holds it.
    pub async fn lock(self: &Arc<Self>, start: u64, end: u64) -> RangeGuard {
        let ticket = {
            let mut next = self.next_ticket.lock();
            *next += 1;
            *next
        };
        loop {
            let notified = self.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut held = self.held.lock();
                if !held.iter().any(|&(s, e, _)| s < end && start < e) {
                    held.push((start, end, ticket));
                    return RangeGuard {
                        lock: Arc::clone(self),
                        ticket,
                    };
                }
            }
            notified.await;
        }
    }

    /// Holds `[start, end)` if no held range overlaps it now, without waiting.
    pub fn try_lock(self: &Arc<Self>, start: u64, end: u64) -> Option<RangeGuard> {
        let ticket = {
            let mut next = self.next_ticket.lock();
            *next += 1;
            *next
        };
        let mut held = self.held.lock();
        if held.iter().any(|&(s, e, _)| s < end && start < e) {
            return None;
        }
        held.push((start, end, ticket));
        Some(RangeGuard {
            lock: Arc::clone(self),
            ticket,
        })
    }

    /// Number of ranges held now.
    pub fn held(&self) -> usize {
        self.held.lock().len()
    }
}

impl Drop for RangeGuard {
    fn drop(&mut self) {
        self.lock.held.lock().retain(|&(_, _, t)| t != self.ticket);
        self.lock.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn overlapping_ranges_wait_disjoint_ones_do_not() {
        let lock = Arc::new(RangeLock::default());
        let first = lock.lock(0, 10).await;
        // Disjoint: granted at once.
        let other = tokio::time::timeout(Duration::from_millis(100), lock.lock(10, 20))
            .await
            .expect("disjoint range must not wait");
        // Overlapping: waits until the first is dropped.
        let lock2 = Arc::clone(&lock);
        let waiter = tokio::spawn(async move { lock2.lock(5, 6).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        drop(first);
        let third = tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("released range must be granted")
            .unwrap();
        assert_eq!(lock.held(), 2);
        drop(third);
        drop(other);
        assert_eq!(lock.held(), 0);
    }
}
