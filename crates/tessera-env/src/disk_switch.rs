//! A device that can be made to fail while it is in use: a real device
//! (a file, a block device) behind a switch that fault injection trips.
//!
//! Owns: [`FailSwitch`] and [`SwitchedDisk`]. Once the switch is tripped
//! every read, write and sync of the device fails with an I/O error, as a
//! device that died does; until then every call goes straight through.
//! Must not touch: the device's contents: a tripped device loses nothing
//! that was already durable, it only stops answering.
//! Invariant: a call that starts after [`FailSwitch::trip`] returned fails.

use crate::disk::{AlignedBuf, Disk, DiskError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Trips a [`SwitchedDisk`]; cloned handles trip the same device.
#[derive(Clone, Debug, Default)]
pub struct FailSwitch(Arc<AtomicBool>);

impl FailSwitch {
    /// Makes the device fail every call from now on.
    pub fn trip(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether the switch was tripped.
    pub fn is_tripped(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A device behind a [`FailSwitch`].
pub struct SwitchedDisk {
    inner: Arc<dyn Disk>,
    switch: FailSwitch,
}

impl SwitchedDisk {
    /// `inner` behind `switch`.
    pub fn new(inner: Arc<dyn Disk>, switch: FailSwitch) -> SwitchedDisk {
        SwitchedDisk { inner, switch }
    }

    fn check(&self, op: &'static str, offset: u64, len: u64) -> Result<(), DiskError> {
        if self.switch.is_tripped() {
            let e = std::io::Error::other("device failed (fault injected)");
            return Err(DiskError::from_io(&self.inner.name(), op, offset, len, &e));
        }
        Ok(())
    }
}

impl Disk for SwitchedDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        self.check("read", offset, buf.len() as u64)?;
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.check("write", offset, buf.len() as u64)?;
        self.inner.write_at(buf, offset)
    }

    fn sync(&self) -> Result<(), DiskError> {
        self.check("sync", 0, 0)?;
        self.inner.sync()
    }

    fn write_durable_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.check("write", offset, buf.len() as u64)?;
        self.inner.write_durable_at(buf, offset)
    }

    fn write_uncached_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.check("write", offset, buf.len() as u64)?;
        self.inner.write_uncached_at(buf, offset)
    }

    fn read_uncached_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        self.check("read", offset, buf.len() as u64)?;
        self.inner.read_uncached_at(buf, offset)
    }

    fn read_appending(
        &self,
        buf: &mut crate::AlignedBuf,
        len: usize,
        offset: u64,
        via: crate::ReadVia,
    ) -> Result<(), DiskError> {
        self.check("read", offset, len as u64)?;
        self.inner.read_appending(buf, len, offset, via)
    }

    fn read_at_if_cached(&self, buf: &mut [u8], offset: u64) -> Result<bool, DiskError> {
        self.check("read", offset, buf.len() as u64)?;
        self.inner.read_at_if_cached(buf, offset)
    }

    fn read_around(&self, offset: u64, len: u64) {
        if self.check("read", offset, len).is_ok() {
            self.inner.read_around(offset, len);
        }
    }

    fn durable_write_fd(&self, len: usize, offset: u64) -> Option<std::os::fd::RawFd> {
        // A tripped device takes no write, by this way either.
        if self.switch.is_tripped() {
            return None;
        }
        self.inner.durable_write_fd(len, offset)
    }

    fn read_fd(&self, len: usize, offset: u64) -> Option<crate::ReadFd> {
        if self.switch.is_tripped() {
            return None;
        }
        self.inner.read_fd(len, offset)
    }

    fn uncached_write_fd(&self, len: usize, offset: u64) -> Option<std::os::fd::RawFd> {
        if self.switch.is_tripped() {
            return None;
        }
        self.inner.uncached_write_fd(len, offset)
    }

    fn prepare_durable_write(
        &self,
        buf: AlignedBuf,
        offset: u64,
    ) -> Result<crate::PreparedWrite, AlignedBuf> {
        if self.switch.is_tripped() {
            return Err(buf);
        }
        self.inner.prepare_durable_write(buf, offset)
    }

    fn prepare_uncached_write(&self, data: &[u8], offset: u64) -> Option<crate::PreparedWrite> {
        if self.switch.is_tripped() {
            return None;
        }
        self.inner.prepare_uncached_write(data, offset)
    }

    fn can_prepare_uncached_write(&self, len: usize, offset: u64) -> bool {
        !self.switch.is_tripped() && self.inner.can_prepare_uncached_write(len, offset)
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn name(&self) -> String {
        self.inner.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::AlignedBuf;
    use crate::FaultDisk;

    #[test]
    fn a_tripped_device_fails_every_call_and_keeps_what_it_held() {
        let inner = Arc::new(FaultDisk::new("d", 1 << 20));
        let switch = FailSwitch::default();
        let disk = SwitchedDisk::new(inner.clone(), switch.clone());
        let block = AlignedBuf::copy_of(&[7u8; 4096]);
        disk.write_at(block.as_slice(), 4096).unwrap();
        disk.sync().unwrap();
        // Before: an appending read of the fault model (the trait's own
        // way, zeroed then read) sees the block.
        let mut appended = AlignedBuf::with_capacity(0);
        disk.read_appending(&mut appended, 4096, 4096, crate::ReadVia::Uncached)
            .unwrap();
        assert_eq!(appended.as_slice(), block.as_slice());
        switch.trip();
        let mut buf = AlignedBuf::zeroed(4096);
        let err = disk.read_at(buf.as_mut_slice(), 4096).unwrap_err();
        assert!(err.to_string().contains("fault injected"), "{err}");
        let err = disk
            .read_appending(&mut appended, 4096, 4096, crate::ReadVia::PageCache)
            .unwrap_err();
        assert!(err.to_string().contains("fault injected"), "{err}");
        assert_eq!(appended.len(), 4096);
        assert!(disk.read_at_if_cached(buf.as_mut_slice(), 4096).is_err());
        assert!(disk.write_at(block.as_slice(), 0).is_err());
        assert!(disk.write_uncached_at(block.as_slice(), 0).is_err());
        assert!(disk.sync().is_err());
        assert_eq!(inner.peek(4096, 4096), vec![7u8; 4096]);
        assert_eq!(inner.peek(0, 4096), vec![0u8; 4096]);
    }
}
