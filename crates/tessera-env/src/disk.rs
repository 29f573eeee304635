//! Devices as the store sees them: the [`Disk`] trait, aligned buffers, and
//! the real backend over a file or block device ([`FileDisk`]).
//!
//! Owns: positional block I/O and durability (`fdatasync`). Must not touch:
//! what the bytes mean. Invariants: every offset and length the store passes
//! is a multiple of [`DISK_ALIGN`], so the same calls work with `O_DIRECT`;
//! an I/O error is returned as a [`DiskError`] naming the device, operation
//! and range, never as a panic.
//!
//! The trait is blocking on purpose: a positional read or write on a file is
//! one system call, and the caller decides which thread pays for it (the
//! store runs its writes on its own log thread and its reads through the
//! runtime's blocking pool), so no extra thread handoff is hidden here.

use bytes::Bytes;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Alignment of every offset, length and buffer address (the logical block
/// size `O_DIRECT` needs on the devices we run on).
pub const DISK_ALIGN: usize = 4096;

/// A failed device operation, with where it happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op} on {device} at byte {offset} (+{len}) failed: {message}")]
pub struct DiskError {
    /// The device (path or test name).
    pub device: String,
    /// `read`, `write`, `sync`, `open`.
    pub op: &'static str,
    /// Byte offset.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// The OS error kind.
    pub kind: std::io::ErrorKind,
    /// The OS message.
    pub message: String,
}

impl DiskError {
    /// Builds an error from an OS error.
    pub fn from_io(
        device: &str,
        op: &'static str,
        offset: u64,
        len: u64,
        e: &std::io::Error,
    ) -> Self {
        DiskError {
            device: device.to_string(),
            op,
            offset,
            len,
            kind: e.kind(),
            message: e.to_string(),
        }
    }

    /// True when the device ran out of space (ENOSPC).
    pub fn is_no_space(&self) -> bool {
        self.kind == std::io::ErrorKind::StorageFull
    }
}

/// A block device or a file used as one.
pub trait Disk: Send + Sync + 'static {
    /// Reads `buf.len()` bytes at `offset`. Short reads past the end are
    /// errors.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError>;
    /// Writes `buf` at `offset`. Not durable until [`Disk::sync`] returns.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError>;
    /// Makes every completed write durable (`fdatasync`).
    fn sync(&self) -> Result<(), DiskError>;
    /// Bytes on the device.
    fn size(&self) -> u64;
    /// A name for messages (the path).
    fn name(&self) -> String;
}

/// A heap buffer whose start is aligned to [`DISK_ALIGN`], as `O_DIRECT`
/// needs, built without unsafe code by over-allocating and slicing.
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + DISK_ALIGN];
        let start = raw.as_ptr().align_offset(DISK_ALIGN).min(DISK_ALIGN);
        AlignedBuf { raw, start, len }
    }

    /// Bytes in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The contents.
    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    /// The contents, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }

    /// Turns the buffer into `Bytes` without copying.
    pub fn into_bytes(self) -> Bytes {
        let (start, len) = (self.start, self.len);
        Bytes::from(self.raw).slice(start..start + len)
    }
}

/// How to open a [`FileDisk`].
#[derive(Debug, Clone, Copy, Default)]
pub struct FileDiskOptions {
    /// Create the file with this many bytes if it does not exist (a block
    /// device must exist).
    pub create_bytes: Option<u64>,
    /// Open with `O_DIRECT`: bypass the page cache.
    pub direct_io: bool,
    /// Open read-only (offline checks).
    pub read_only: bool,
}

/// A file or block device.
pub struct FileDisk {
    file: File,
    path: PathBuf,
    size: u64,
}

impl FileDisk {
    /// Opens (and, if asked, creates) `path`.
    pub fn open(path: &Path, options: FileDiskOptions) -> Result<FileDisk, DiskError> {
        let name = path.display().to_string();
        let err = |e: std::io::Error| DiskError::from_io(&name, "open", 0, 0, &e);
        let mut created = false;
        if let Some(bytes) = options.create_bytes {
            if !path.exists() {
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(path)
                    .map_err(err)?;
                f.set_len(bytes).map_err(err)?;
                f.sync_all().map_err(err)?;
                created = true;
            }
        }
        let mut oo = OpenOptions::new();
        oo.read(true).write(!options.read_only);
        if options.direct_io {
            oo.custom_flags(libc::O_DIRECT);
        }
        let mut file = oo.open(path).map_err(err)?;
        let size = file.seek(SeekFrom::End(0)).map_err(err)?;
        let _ = created;
        Ok(FileDisk {
            file,
            path: path.to_path_buf(),
            size,
        })
    }
}

impl Disk for FileDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| DiskError::from_io(&self.name(), "read", offset, buf.len() as u64, &e))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| DiskError::from_io(&self.name(), "write", offset, buf.len() as u64, &e))
    }

    fn sync(&self) -> Result<(), DiskError> {
        self.file
            .sync_data()
            .map_err(|e| DiskError::from_io(&self.name(), "sync", 0, 0, &e))
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned() {
        for len in [0usize, 1, 4096, 12288] {
            let b = AlignedBuf::zeroed(len);
            assert_eq!(b.as_slice().as_ptr() as usize % DISK_ALIGN, 0);
            assert_eq!(b.len(), len);
            assert_eq!(b.into_bytes().len(), len);
        }
    }

    #[test]
    fn file_round_trip_and_errors_name_the_device() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev0");
        let disk = FileDisk::open(
            &path,
            FileDiskOptions {
                create_bytes: Some(1 << 20),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(disk.size(), 1 << 20);
        let mut data = AlignedBuf::zeroed(8192);
        data.as_mut_slice().fill(0xab);
        disk.write_at(data.as_slice(), 4096).unwrap();
        disk.sync().unwrap();
        let mut back = AlignedBuf::zeroed(8192);
        disk.read_at(back.as_mut_slice(), 4096).unwrap();
        assert_eq!(back.as_slice(), data.as_slice());
        let err = disk.read_at(back.as_mut_slice(), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("dev0"), "{err}");
    }
}
