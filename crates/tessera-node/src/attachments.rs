//! Which volumes this host's clients have open: one count per volume of NBD
//! connections and iSCSI sessions, so that deleting or renaming a volume in
//! use can be refused instead of leaving its clients hanging.
//!
//! Owns: the counts and the guards that keep them. Must not touch: the
//! directory (the host publishes [`Attachments::snapshot`] under its lease).
//! Invariant: a count is raised when a client opens a volume and lowered
//! when the guard it holds is dropped (connection closed, session ended),
//! so it never outlives the client.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tessera_types::VolumeId;

/// Open volumes of one host.
#[derive(Default)]
pub struct Attachments {
    open: Mutex<BTreeMap<VolumeId, u32>>,
    changes: AtomicU64,
}

impl Attachments {
    /// Counts one more client of `volume` until the guard is dropped.
    pub fn attach(self: &Arc<Self>, volume: &VolumeId) -> AttachGuard {
        *self.open.lock().entry(volume.clone()).or_default() += 1;
        self.changes.fetch_add(1, Ordering::Relaxed);
        AttachGuard {
            attachments: Arc::clone(self),
            volume: volume.clone(),
        }
    }

    /// Clients that have `volume` open on this host.
    pub fn count(&self, volume: &VolumeId) -> u32 {
        self.open.lock().get(volume).copied().unwrap_or(0)
    }

    /// Every open volume with its count.
    pub fn snapshot(&self) -> BTreeMap<VolumeId, u32> {
        self.open.lock().clone()
    }

    /// Raised at every attach and detach: a publisher compares it with the
    /// value it last published.
    pub fn generation(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }
}

/// One client's hold on a volume.
pub struct AttachGuard {
    attachments: Arc<Attachments>,
    volume: VolumeId,
}

impl Drop for AttachGuard {
    fn drop(&mut self) {
        let mut open = self.attachments.open.lock();
        if let Some(n) = open.get_mut(&self.volume) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.volume);
            }
        }
        self.attachments.changes.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_lasts_as_long_as_its_guard() {
        let a = Arc::new(Attachments::default());
        let vm1 = VolumeId::new("vm1").expect("name");
        let first = a.attach(&vm1);
        let second = a.attach(&vm1);
        assert_eq!(a.count(&vm1), 2);
        drop(first);
        assert_eq!(a.count(&vm1), 1);
        let before = a.generation();
        drop(second);
        assert_eq!(a.count(&vm1), 0);
        assert!(a.snapshot().is_empty());
        assert!(a.generation() > before);
    }
}
