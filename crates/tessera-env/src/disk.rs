//! Devices as the store sees them: the [`Disk`] trait, aligned buffers, and
//! the real backend over a file or block device ([`FileDisk`]).
//!
//! Owns: positional block I/O and durability (`fdatasync`, and `O_DSYNC`
//! for a write that must be durable on its own). Must not touch:
//! what the bytes mean. Invariants: every offset and length the store passes
//! is a multiple of [`DISK_ALIGN`], so the same calls work with `O_DIRECT`;
//! an I/O error is returned as a [`DiskError`] naming the device, operation
//! and range, never as a panic. A [`FileDisk`] holds an advisory lock on its
//! file for as long as it is open (`flock`: exclusive when opened writable,
//! shared when read-only), so two openers that could harm each other (a host
//! serving the devices and another host or an offline check) cannot both
//! have them: the second is refused with an error for which
//! [`DiskError::is_in_use`] is true. Flock locks belong to the open file, not
//! the process, so a second open in the same process conflicts too.
//!
//! The trait is blocking on purpose: a positional read or write on a file is
//! one system call, and the caller decides which thread pays for it (the
//! store runs its writes on its own log thread and its reads through the
//! runtime's blocking pool), so no extra thread handoff is hidden here.

use bytes::Bytes;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

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

    /// The error of an open refused because another opener holds a
    /// conflicting lock on the device.
    pub fn in_use(device: &str) -> Self {
        DiskError {
            device: device.to_string(),
            op: "lock",
            offset: 0,
            len: 0,
            kind: std::io::ErrorKind::WouldBlock,
            message: "the device is in use: another opener holds its lock".to_string(),
        }
    }

    /// True when the device ran out of space (ENOSPC).
    pub fn is_no_space(&self) -> bool {
        self.kind == std::io::ErrorKind::StorageFull
    }

    /// True when an open was refused because another opener (in this
    /// process or another) holds a conflicting lock on the device.
    pub fn is_in_use(&self) -> bool {
        self.op == "lock" && self.kind == std::io::ErrorKind::WouldBlock
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
    /// Writes `pieces` one after another from `offset`, with the effect of
    /// [`Disk::write_at`] of them joined. By default they are joined into
    /// one buffer first; a device that can write them where they lie
    /// (`pwritev`) saves that copy: the destager writes runs of blocks
    /// that each lie in a buffer of their own.
    fn write_pieces_at(&self, pieces: &[Bytes], offset: u64) -> Result<(), DiskError> {
        match pieces {
            [one] => self.write_at(one, offset),
            _ => self.write_at(AlignedBuf::joined(pieces).as_slice(), offset),
        }
    }
    /// Writes `buf` at `offset` and returns once this write is durable
    /// (`O_DSYNC`). It says nothing of other writes: those not yet synced
    /// stay so. For a write that is all there is to make durable (a lone
    /// commit of the write log): one system call, and on a device with a
    /// volatile cache the kernel issues the cache flush from the write's
    /// completion instead of waking the caller to ask for it. Measured on a
    /// virtio disk: 51 us per 8 KiB write, against 109 us for the write and
    /// an `fdatasync`. By default [`Disk::write_at`] then [`Disk::sync`].
    fn write_durable_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.write_at(buf, offset)?;
        self.sync()
    }
    /// Writes `buf` at `offset` past the host's page cache where the device
    /// allows it (`O_DIRECT`), for large writes that are not read back soon:
    /// copying them into the page cache costs more CPU than the write, and
    /// the sync then writes them back all at once. `buf` and `offset` must
    /// be multiples of [`DISK_ALIGN`] (and `buf` start aligned). Not durable
    /// until [`Disk::sync`] returns. By default the same as
    /// [`Disk::write_at`].
    fn write_uncached_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.write_at(buf, offset)
    }
    /// Reads `buf.len()` bytes at `offset` past the host's page cache where
    /// the device allows it, for large reads of data read once (a resync
    /// or rebuild copying a component): the page cache would cost a copy
    /// and evict what guests read again. Sees every completed write (the
    /// kernel writes cached pages of the range back first). Alignment as
    /// for [`Disk::write_uncached_at`]. By default the same as
    /// [`Disk::read_at`].
    fn read_uncached_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        self.read_at(buf, offset)
    }
    /// [`Disk::read_at`] or [`Disk::read_uncached_at`], as `via` says.
    fn read_via(&self, buf: &mut [u8], offset: u64, via: ReadVia) -> Result<(), DiskError> {
        match via {
            ReadVia::PageCache => self.read_at(buf, offset),
            ReadVia::Uncached => self.read_uncached_at(buf, offset),
        }
    }
    /// Appends `len` bytes read at `offset` to `buf`, through the page
    /// cache or past it as `via` says (see [`Disk::read_uncached_at`]).
    /// A backend that can read into the buffer's spare room does, so the
    /// bytes are never zeroed before the device fills them (a 1 MiB read
    /// for a rebuild spent as much CPU zeroing its buffer as reading it).
    /// On error `buf` is as it was. By default `buf` grows by `len` zeroed
    /// bytes that the read then fills.
    fn read_appending(
        &self,
        buf: &mut AlignedBuf,
        len: usize,
        offset: u64,
        via: ReadVia,
    ) -> Result<(), DiskError> {
        let at = buf.len();
        buf.extend_zeroed(len);
        let read = self.read_via(&mut buf.as_mut_slice()[at..], offset, via);
        if read.is_err() {
            buf.truncate(at);
        }
        read
    }
    /// Reads `buf.len()` bytes at `offset` only if that takes no wait for
    /// the device: true when the host's page cache held them all and `buf`
    /// has them; false (and `buf` undefined) when the device would have to
    /// be read, or the backend cannot tell. A caller that must not block
    /// (a runtime thread serving many clients) reads what is cached at
    /// once and hands the rest to a thread that may wait. By default false.
    fn read_at_if_cached(&self, buf: &mut [u8], offset: u64) -> Result<bool, DiskError> {
        let _ = (buf, offset);
        Ok(false)
    }
    /// Starts reading the `len` bytes at `offset` into the host's page
    /// cache, without waiting for them (`POSIX_FADV_WILLNEED`): a hint, so
    /// that the blocks around a read that missed the page cache are there
    /// when they are read next. Nothing where there is no page cache (a
    /// device opened `O_DIRECT`, one in memory). By default nothing.
    fn read_around(&self, offset: u64, len: u64) {
        let _ = (offset, len);
    }
    /// The descriptor through which a write of `len` bytes at `offset`
    /// can be submitted without blocking ([`crate::IoRing`]) with the effect
    /// of [`Disk::write_durable_at`]: durable when it completes. `None`
    /// where that cannot be (a device in memory, a range `O_DIRECT`
    /// refuses): the caller then uses [`Disk::write_durable_at`]. The
    /// descriptor stays open as long as the device.
    fn durable_write_fd(&self, len: usize, offset: u64) -> Option<std::os::fd::RawFd> {
        let _ = (len, offset);
        None
    }
    /// The descriptor through which a write of `len` bytes at `offset`
    /// can be submitted past the page cache (`O_DIRECT`) without blocking
    /// ([`crate::IoRing::write_uncached`], which does not flush it), with
    /// the effect of [`Disk::write_uncached_at`]. `None` where that cannot
    /// be (a device in memory, one that transforms what it stores, a range
    /// `O_DIRECT` refuses): the caller then uses the blocking calls. The
    /// descriptor stays open as long as the device.
    fn uncached_write_fd(&self, len: usize, offset: u64) -> Option<std::os::fd::RawFd> {
        let _ = (len, offset);
        None
    }
    /// The descriptor through which a read of `len` bytes at `offset` can
    /// be submitted without blocking ([`crate::IoRing::reserve_read`]) with
    /// the effect of [`Disk::read_at`], and whether it reads only into
    /// aligned buffers. `None` where that cannot be (a device in memory,
    /// one that transforms what it stores, a range `O_DIRECT` refuses): the
    /// caller then uses [`Disk::read_at`]. The descriptor stays open as
    /// long as the device.
    fn read_fd(&self, len: usize, offset: u64) -> Option<ReadFd> {
        let _ = (len, offset);
        None
    }
    /// Readies `buf` to be written at `offset` by a caller that submits
    /// the write to the kernel itself ([`crate::IoRing`]): the descriptor,
    /// the bytes as the device stores them, and what must stay held until
    /// the write has completed. `Err` gives `buf` back unchanged, for
    /// [`Disk::write_durable_at`]. By default the bytes go as they are
    /// through [`Disk::durable_write_fd`]; a device that transforms what it
    /// stores (encryption) does that here.
    fn prepare_durable_write(
        &self,
        buf: AlignedBuf,
        offset: u64,
    ) -> Result<PreparedWrite, AlignedBuf> {
        match self.durable_write_fd(buf.len(), offset) {
            Some(fd) => Ok(PreparedWrite {
                fd,
                buf,
                hold: None,
            }),
            None => Err(buf),
        }
    }
    /// Readies a copy of `data` to be written at `offset` past the page
    /// cache by a caller that submits the write itself
    /// ([`crate::IoRing::write_uncached_copy`]): the descriptor of
    /// [`Disk::uncached_write_fd`], the bytes as the device stores them in a
    /// buffer of their own, and what must stay held until the write has
    /// completed. `None` where the write cannot go that way (see
    /// [`Disk::can_prepare_uncached_write`]). By default the bytes are
    /// copied as they are: for a payload that does not start on a
    /// [`DISK_ALIGN`] boundary; a device that transforms what it stores
    /// (encryption) transforms them into the copy instead.
    fn prepare_uncached_write(&self, data: &[u8], offset: u64) -> Option<PreparedWrite> {
        let fd = self.uncached_write_fd(data.len(), offset)?;
        Some(PreparedWrite {
            fd,
            buf: AlignedBuf::copy_of(data),
            hold: None,
        })
    }
    /// Whether [`Disk::prepare_uncached_write`] takes a write of `len`
    /// bytes at `offset`, asked before its bytes are copied.
    fn can_prepare_uncached_write(&self, len: usize, offset: u64) -> bool {
        self.uncached_write_fd(len, offset).is_some()
    }
    /// Bytes on the device.
    fn size(&self) -> u64;
    /// A name for messages (the path).
    fn name(&self) -> String;
}

/// A durable write ready for the kernel ([`Disk::prepare_durable_write`]).
pub struct PreparedWrite {
    /// Where to write: durable when the write completes, open as long as
    /// the device.
    pub fd: std::os::fd::RawFd,
    /// The bytes to write, as the device stores them.
    pub buf: AlignedBuf,
    /// Dropped only once the write has completed (an encrypted device's
    /// claim on the pieces it wrote, which a deep rekey waits for).
    pub hold: Option<Box<dyn Send>>,
}

/// Which way a read goes: through the host's page cache
/// ([`Disk::read_at`]) or past it ([`Disk::read_uncached_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadVia {
    /// Through the page cache: blocks that may be read again.
    PageCache,
    /// Past it where the device allows: blocks read once (a copy).
    Uncached,
}

/// A descriptor to submit a device's reads through ([`Disk::read_fd`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadFd {
    /// The descriptor, open as long as the device.
    pub fd: std::os::fd::RawFd,
    /// Reads through it need a buffer aligned to [`DISK_ALIGN`]
    /// (`O_DIRECT`).
    pub aligned: bool,
}

/// A heap buffer whose start is aligned to [`DISK_ALIGN`], as `O_DIRECT`
/// needs, built by over-allocating and slicing. Two unsafe methods let the
/// kernel fill spare room that was never initialized:
/// [`AlignedBuf::extend_by_reading`] (`pread`) and
/// [`AlignedBuf::assume_appended`] (a read the ring submitted into
/// [`AlignedBuf::spare_mut_ptr`]); every byte below `raw.len()` is
/// initialized.
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

    /// An aligned copy of `bytes`, without zeroing the buffer first.
    pub fn copy_of(bytes: &[u8]) -> AlignedBuf {
        let mut buf = AlignedBuf::with_capacity(bytes.len());
        buf.extend_from_slice(bytes);
        buf
    }

    /// An aligned copy of `pieces`, one after another.
    pub fn joined(pieces: &[Bytes]) -> AlignedBuf {
        let mut buf = AlignedBuf::with_capacity(pieces.iter().map(|p| p.len()).sum());
        for p in pieces {
            buf.extend_from_slice(p);
        }
        buf
    }

    /// An empty buffer with room for `capacity` bytes, filled with
    /// [`AlignedBuf::extend_from_slice`]: a buffer that is written whole
    /// (a log write, a destage run) is never zeroed first.
    pub fn with_capacity(capacity: usize) -> AlignedBuf {
        let mut raw: Vec<u8> = Vec::with_capacity(capacity + DISK_ALIGN);
        let start = raw.as_ptr().align_offset(DISK_ALIGN).min(DISK_ALIGN);
        raw.resize(start, 0);
        AlignedBuf { raw, start, len: 0 }
    }

    /// Appends `bytes`.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.reserve(bytes.len());
        self.raw.extend_from_slice(bytes);
        self.len += bytes.len();
    }

    /// Appends `n` zero bytes.
    pub fn extend_zeroed(&mut self, n: usize) {
        self.reserve(n);
        self.raw.resize(self.raw.len() + n, 0);
        self.len += n;
    }

    /// Drops every byte past the first `len`.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.raw.truncate(self.start + len);
            self.len = len;
        }
    }

    /// Appends `n` bytes read from `file` at `offset` (`pread`, again after
    /// a short read), straight into the buffer's spare room, which is never
    /// zeroed. On error (end of file included) the buffer is as it was.
    ///
    /// Safety argument, the only unsafe code of the crate: `pread` is given
    /// a pointer into this `Vec`'s spare capacity (reserved just before,
    /// at least `n` bytes, not aliased by any reference) and a length that
    /// stays inside it; the length of the `Vec` moves past those bytes only
    /// once the kernel has reported writing all `n` of them, so no byte is
    /// ever seen uninitialized.
    #[allow(unsafe_code)]
    fn extend_by_reading(&mut self, file: &File, n: usize, offset: u64) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        self.reserve(n);
        let at = self.raw.len();
        let mut done = 0;
        while done < n {
            let spare = &mut self.raw.spare_capacity_mut()[done..n];
            let position = libc::off_t::try_from(offset + done as u64)
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
            // SAFETY: see the method's documentation: the kernel writes at
            // most `spare.len()` bytes into memory this `Vec` owns.
            let got = unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    spare.as_mut_ptr().cast(),
                    spare.len(),
                    position,
                )
            };
            match got {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                g if g < 0 => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
                g => done += g as usize,
            }
        }
        // SAFETY: bytes `at..at + n` were all written by the reads above.
        unsafe { self.raw.set_len(at + n) };
        self.len += n;
        Ok(())
    }

    /// Where the kernel may put the next `n` bytes (room reserved here,
    /// never initialized), aligned where the buffer is empty; they count
    /// as the buffer's only once [`AlignedBuf::assume_appended`] says so.
    pub(crate) fn spare_mut_ptr(&mut self, n: usize) -> *mut u8 {
        self.reserve(n);
        self.raw.spare_capacity_mut().as_mut_ptr().cast()
    }

    /// Takes the `n` bytes of spare room after the contents as written.
    ///
    /// # Safety
    /// All `n` bytes at [`AlignedBuf::spare_mut_ptr`] (called with at
    /// least `n`) were written since, and the buffer was not touched
    /// between the two calls.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn assume_appended(&mut self, n: usize) {
        debug_assert!(self.raw.len() + n <= self.raw.capacity());
        // SAFETY: as the caller promises, within the reserved room.
        unsafe { self.raw.set_len(self.raw.len() + n) };
        self.len += n;
    }

    /// Makes room for `n` more bytes. The start stays aligned: a `Vec` that
    /// grew could move, so a buffer that runs out moves itself to a new
    /// aligned one.
    fn reserve(&mut self, n: usize) {
        if self.raw.len() + n > self.raw.capacity() {
            let mut grown = AlignedBuf::with_capacity((self.len + n).max(2 * self.len));
            grown.extend_from_slice(self.as_slice());
            *self = grown;
        }
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
    /// Open with `O_DIRECT`: bypass the page cache (through it after all
    /// where the file system refuses `O_DIRECT`, as tmpfs does).
    pub direct_io: bool,
    /// Open read-only (offline checks). A read-only open takes a shared
    /// lock, which other read-only opens may share; a writable open takes an
    /// exclusive one.
    pub read_only: bool,
}

/// A file or block device, locked (see the module's documentation) until it
/// is dropped.
pub struct FileDisk {
    file: File,
    /// A second descriptor of the same file opened with `O_DIRECT`, when
    /// `file` goes through the page cache and the file system allows it:
    /// [`Disk::write_uncached_at`] writes through it. The lock is `file`'s.
    uncached: Option<File>,
    /// A third descriptor opened with `O_DSYNC` (and `O_DIRECT` when `file`
    /// has it), for [`Disk::write_durable_at`]; `None` on a read-only open.
    durable: Option<File>,
    /// Whether `file` is opened with `O_DIRECT` (so `durable` is too).
    direct: bool,
    /// The kernel refused `RWF_NOWAIT` once: [`Disk::read_at_if_cached`]
    /// says false from then on without asking.
    no_wait_refused: AtomicBool,
    path: PathBuf,
    size: u64,
}

impl FileDisk {
    /// Opens (and, if asked, creates) `path` and locks it: exclusively, or
    /// shared when `read_only`. A conflicting lock held by another opener
    /// fails the open at once with [`DiskError::in_use`]; nothing waits.
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
        let mut direct = options.direct_io;
        let mut file = match oo.open(path) {
            // A file system without O_DIRECT (tmpfs): the page cache it is.
            Err(e) if options.direct_io && e.raw_os_error() == Some(libc::EINVAL) => {
                direct = false;
                let mut buffered = OpenOptions::new();
                buffered.read(true).write(!options.read_only);
                buffered.open(path).map_err(err)?
            }
            opened => opened.map_err(err)?,
        };
        let locked = if options.read_only {
            file.try_lock_shared()
        } else {
            file.try_lock()
        };
        match locked {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(DiskError::in_use(&name)),
            Err(TryLockError::Error(e)) => return Err(DiskError::from_io(&name, "lock", 0, 0, &e)),
        }
        let size = file.seek(SeekFrom::End(0)).map_err(err)?;
        let _ = created;
        let uncached = if options.direct_io || options.read_only {
            None
        } else {
            // Where the file system refuses O_DIRECT (tmpfs), there is none.
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .ok()
        };
        let durable = if options.read_only {
            None
        } else {
            let flags = libc::O_DSYNC | if direct { libc::O_DIRECT } else { 0 };
            Some(
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(flags)
                    .open(path)
                    .map_err(err)?,
            )
        };
        Ok(FileDisk {
            file,
            uncached,
            durable,
            direct,
            no_wait_refused: AtomicBool::new(false),
            path: path.to_path_buf(),
            size,
        })
    }
}

/// At most this many buffers go to one `pwritev` (Linux's `IOV_MAX`).
const PIECES_PER_CALL: usize = 1024;

/// Writes every byte of `pieces` from `offset` through `file`, as many
/// `pwritev` calls as it takes (a call may write less than it was given).
fn write_all_pieces_at(file: &File, pieces: &[Bytes], offset: u64) -> std::io::Result<()> {
    let mut offset = offset;
    for group in pieces.chunks(PIECES_PER_CALL) {
        let mut slices: Vec<std::io::IoSlice<'_>> =
            group.iter().map(|p| std::io::IoSlice::new(p)).collect();
        let mut left: &mut [std::io::IoSlice<'_>] = &mut slices;
        while !left.is_empty() {
            let n = rustix::io::pwritev(file, left, offset)?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            offset += n as u64;
            std::io::IoSlice::advance_slices(&mut left, n);
        }
    }
    Ok(())
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

    fn write_pieces_at(&self, pieces: &[Bytes], offset: u64) -> Result<(), DiskError> {
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        // Past the page cache every buffer must be aligned, which pieces
        // cut from other buffers need not be: those are joined first.
        let unaligned = |p: &Bytes| {
            !(p.as_ptr() as usize).is_multiple_of(DISK_ALIGN) || !p.len().is_multiple_of(DISK_ALIGN)
        };
        let written = if self.direct && pieces.iter().any(unaligned) {
            self.file
                .write_all_at(AlignedBuf::joined(pieces).as_slice(), offset)
        } else {
            write_all_pieces_at(&self.file, pieces, offset)
        };
        written.map_err(|e| DiskError::from_io(&self.name(), "write", offset, len as u64, &e))
    }

    fn write_durable_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        match &self.durable {
            Some(dsync) if !self.direct || direct_io_fits(buf, offset) => {
                dsync.write_all_at(buf, offset).map_err(|e| {
                    DiskError::from_io(&self.name(), "write", offset, buf.len() as u64, &e)
                })
            }
            _ => {
                self.write_at(buf, offset)?;
                self.sync()
            }
        }
    }

    fn durable_write_fd(&self, len: usize, offset: u64) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        let fits = len.is_multiple_of(DISK_ALIGN) && offset.is_multiple_of(DISK_ALIGN as u64);
        match &self.durable {
            Some(dsync) if !self.direct || fits => Some(dsync.as_raw_fd()),
            _ => None,
        }
    }

    fn read_fd(&self, len: usize, offset: u64) -> Option<ReadFd> {
        use std::os::fd::AsRawFd;
        // The descriptor `read_at` reads through: the page cache, or the
        // device itself where the file was opened `O_DIRECT`, for a range
        // that meets its alignment (the ring then reads into an aligned
        // buffer).
        let fits = len.is_multiple_of(DISK_ALIGN) && offset.is_multiple_of(DISK_ALIGN as u64);
        (!self.direct || fits).then(|| ReadFd {
            fd: self.file.as_raw_fd(),
            aligned: self.direct,
        })
    }

    fn uncached_write_fd(&self, len: usize, offset: u64) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        if !len.is_multiple_of(DISK_ALIGN) || !offset.is_multiple_of(DISK_ALIGN as u64) {
            return None;
        }
        match &self.uncached {
            Some(direct) => Some(direct.as_raw_fd()),
            None if self.direct => Some(self.file.as_raw_fd()),
            None => None,
        }
    }

    fn write_uncached_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        match &self.uncached {
            // The kernel writes back and drops any cached pages of the range
            // first, so reads through the page cache see this data.
            Some(direct) if direct_io_fits(buf, offset) => {
                direct.write_all_at(buf, offset).map_err(|e| {
                    DiskError::from_io(&self.name(), "write", offset, buf.len() as u64, &e)
                })
            }
            _ => self.write_at(buf, offset),
        }
    }

    fn read_uncached_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        match &self.uncached {
            // The kernel writes back cached dirty pages of the range first,
            // so this sees writes that went through the page cache.
            Some(direct) if direct_io_fits(buf, offset) => {
                direct.read_exact_at(buf, offset).map_err(|e| {
                    DiskError::from_io(&self.name(), "read", offset, buf.len() as u64, &e)
                })
            }
            _ => self.read_at(buf, offset),
        }
    }

    fn read_appending(
        &self,
        buf: &mut AlignedBuf,
        len: usize,
        offset: u64,
        via: ReadVia,
    ) -> Result<(), DiskError> {
        // The destination starts at `buf.len()` past an aligned start.
        let fits = buf.len().is_multiple_of(DISK_ALIGN)
            && len.is_multiple_of(DISK_ALIGN)
            && offset.is_multiple_of(DISK_ALIGN as u64);
        let file = match (via, &self.uncached) {
            (ReadVia::Uncached, Some(direct)) if fits => direct,
            // Where `file` is O_DIRECT itself, a read that does not fit
            // fails as `read_at` would.
            _ => &self.file,
        };
        buf.extend_by_reading(file, len, offset)
            .map_err(|e| DiskError::from_io(&self.name(), "read", offset, len as u64, &e))
    }

    /// `preadv2` with `RWF_NOWAIT`: the kernel copies from the page cache
    /// and answers `EAGAIN` (or a short read) where a page is missing,
    /// instead of reading the device. A descriptor opened with `O_DIRECT`
    /// would read the device, so it is never asked.
    fn read_around(&self, offset: u64, len: u64) {
        if self.direct {
            return;
        }
        // Only a hint: a kernel that refuses it reads each block when asked.
        let _ = rustix::fs::fadvise(
            &self.file,
            offset,
            std::num::NonZeroU64::new(len),
            rustix::fs::Advice::WillNeed,
        );
    }

    fn read_at_if_cached(&self, buf: &mut [u8], offset: u64) -> Result<bool, DiskError> {
        if self.direct || buf.is_empty() || self.no_wait_refused.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let len = buf.len();
        let read = rustix::io::preadv2(
            &self.file,
            &mut [std::io::IoSliceMut::new(buf)],
            offset,
            rustix::io::ReadWriteFlags::NOWAIT,
        );
        match read {
            Ok(n) => Ok(n == len),
            Err(rustix::io::Errno::AGAIN) => Ok(false),
            // A kernel or file system without it: the caller's other way
            // (a read that may wait) is always right.
            Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => {
                self.no_wait_refused.store(true, Ordering::Relaxed);
                Ok(false)
            }
            Err(e) => Err(DiskError::from_io(
                &self.name(),
                "read",
                offset,
                len as u64,
                &std::io::Error::from(e),
            )),
        }
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }
}

/// Whether `buf` at `offset` meets `O_DIRECT`'s alignment.
fn direct_io_fits(buf: &[u8], offset: u64) -> bool {
    (buf.as_ptr() as usize).is_multiple_of(DISK_ALIGN)
        && buf.len().is_multiple_of(DISK_ALIGN)
        && offset.is_multiple_of(DISK_ALIGN as u64)
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
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let c = AlignedBuf::copy_of(&data);
            assert_eq!(c.as_slice().as_ptr() as usize % DISK_ALIGN, 0);
            assert_eq!(c.as_slice(), &data[..]);
        }
    }

    #[test]
    fn a_buffer_filled_piece_by_piece_stays_aligned_when_it_outgrows_its_room() {
        let mut b = AlignedBuf::with_capacity(4096);
        let mut expected = Vec::new();
        for round in 0..5u8 {
            let piece = vec![round + 1; 3000];
            b.extend_from_slice(&piece);
            expected.extend_from_slice(&piece);
            b.extend_zeroed(1096);
            expected.extend(std::iter::repeat_n(0u8, 1096));
            assert_eq!(b.as_slice().as_ptr() as usize % DISK_ALIGN, 0);
            assert_eq!(b.as_slice(), &expected[..]);
        }
        assert_eq!(b.len(), 5 * 4096);
        b.as_mut_slice()[0] = 9;
        assert_eq!(b.into_bytes()[0], 9);
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

    /// A 1 MiB file device `dev0` in `dir`.
    fn one_mib_disk(dir: &Path) -> FileDisk {
        one_mib_disk_named(dir, "dev0", false)
    }

    fn one_mib_disk_named(dir: &Path, name: &str, direct_io: bool) -> FileDisk {
        FileDisk::open(
            &dir.join(name),
            FileDiskOptions {
                create_bytes: Some(1 << 20),
                direct_io,
                ..Default::default()
            },
        )
        .unwrap()
    }

    /// Writes 0x11s at 8 KiB and reads them (so they are cached), writes
    /// 0x22s over them with `write` (then syncs) and checks that reads see
    /// the 0x22s; then, where `unaligned` says the device takes them, an
    /// unaligned buffer of 0x33s at 0 the same way.
    fn write_replaces_what_reads_see(
        disk: &FileDisk,
        unaligned: bool,
        write: impl Fn(&FileDisk, &[u8], u64) -> Result<(), DiskError>,
    ) {
        let mut old = AlignedBuf::zeroed(8192);
        old.as_mut_slice().fill(0x11);
        disk.write_at(old.as_slice(), 8192).unwrap();
        let mut back = AlignedBuf::zeroed(8192);
        disk.read_at(back.as_mut_slice(), 8192).unwrap();
        let mut new = AlignedBuf::zeroed(8192);
        new.as_mut_slice().fill(0x22);
        write(disk, new.as_slice(), 8192).unwrap();
        disk.sync().unwrap();
        disk.read_at(back.as_mut_slice(), 8192).unwrap();
        assert_eq!(back.as_slice(), new.as_slice());
        if unaligned {
            let bytes = vec![0x33u8; 4097];
            write(disk, &bytes[1..], 0).unwrap();
            let mut first = AlignedBuf::zeroed(4096);
            disk.read_at(first.as_mut_slice(), 0).unwrap();
            assert!(first.as_slice().iter().all(|&b| b == 0x33));
        }
    }

    #[test]
    fn an_uncached_write_is_read_back_through_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        // Cached first: the uncached write must replace what a read sees;
        // an unaligned buffer falls back to the page cache.
        write_replaces_what_reads_see(&one_mib_disk(dir.path()), true, |d, b, o| {
            d.write_uncached_at(b, o)
        });
    }

    #[test]
    fn a_durable_write_is_read_back_whatever_the_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        for direct_io in [false, true] {
            let disk = one_mib_disk_named(dir.path(), &format!("dev-{direct_io}"), direct_io);
            // A device opened O_DIRECT takes aligned buffers only; a cached
            // one writes an unaligned buffer, then syncs.
            write_replaces_what_reads_see(&disk, !direct_io, |d, b, o| d.write_durable_at(b, o));
        }
    }

    #[test]
    fn pieces_land_one_after_another_whatever_their_buffers() {
        let dir = tempfile::tempdir().unwrap();
        for direct_io in [false, true] {
            let disk = one_mib_disk_named(dir.path(), &format!("pieces-{direct_io}"), direct_io);
            // 200 blocks cut from one buffer 512 bytes in (unaligned for
            // O_DIRECT, which then takes them joined), each block numbered;
            // through the page cache, 1,100 small pieces after them (more
            // than one `pwritev` takes: 1,024 is the kernel's limit); then
            // one aligned block alone.
            let blocks = 200usize;
            let mut whole = vec![0u8; 512 + blocks * 4096];
            for (i, b) in whole[512..].chunks_mut(4096).enumerate() {
                b.fill(i as u8 ^ 0x5a);
            }
            let whole = Bytes::from(whole);
            let mut pieces: Vec<Bytes> = (0..blocks)
                .map(|i| whole.slice(512 + i * 4096..512 + (i + 1) * 4096))
                .collect();
            if !direct_io {
                pieces.extend((0..1100).map(|i| Bytes::from(vec![i as u8; 4])));
            }
            disk.write_pieces_at(&pieces, 8192).unwrap();
            let joined: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
            let mut back = AlignedBuf::zeroed(joined.len());
            disk.read_at(back.as_mut_slice(), 8192).unwrap();
            assert!(back.as_slice() == joined, "every piece where it belongs");
            let mut one = AlignedBuf::zeroed(4096);
            one.as_mut_slice().fill(0x77);
            disk.write_pieces_at(&[one.into_bytes()], 0).unwrap();
            let mut first = AlignedBuf::zeroed(4096);
            disk.read_at(first.as_mut_slice(), 0).unwrap();
            assert!(first.as_slice().iter().all(|&b| b == 0x77));
        }
    }

    /// Drops `disk`'s pages from the page cache until the block at
    /// `offset` is no longer served from it (the advice is best effort: a
    /// page another CPU's LRU batch still holds stays, so it is given
    /// again until the kernel has acted); false if it never was.
    fn dropped_from_page_cache(disk: &FileDisk, buf: &mut [u8], offset: u64) -> bool {
        (0..100).any(|_| {
            rustix::fs::fadvise(&disk.file, 0, None, rustix::fs::Advice::DontNeed).unwrap();
            let held = disk.read_at_if_cached(buf, offset).unwrap();
            if held {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            !held
        })
    }

    #[test]
    fn a_read_that_would_wait_for_the_device_is_left_to_the_caller() {
        let dir = tempfile::tempdir().unwrap();
        let disk = one_mib_disk(dir.path());
        let data: Vec<u8> = (0..4096).map(|i| (i % 249) as u8).collect();
        disk.write_at(&data, 8192).unwrap();
        disk.sync().unwrap();
        // Just written: in the page cache.
        let mut buf = vec![0u8; 4096];
        assert!(disk.read_at_if_cached(&mut buf, 8192).unwrap());
        assert_eq!(buf, data);
        // Dropped from the page cache (clean once synced): the device would
        // have to be read, so the caller is told to read it its own way.
        let mut missed = vec![0u8; 4096];
        assert!(
            dropped_from_page_cache(&disk, &mut missed, 8192),
            "a block the kernel dropped is still served"
        );
        // Which brings it back.
        disk.read_at(&mut missed, 8192).unwrap();
        assert!(disk.read_at_if_cached(&mut buf, 8192).unwrap());
        assert_eq!(buf, data);
        // Past the end: not served here; the caller's read reports it.
        assert!(!disk.read_at_if_cached(&mut buf, 1 << 20).unwrap());
        // A device opened O_DIRECT always reads the device.
        let direct = one_mib_disk_named(dir.path(), "direct", true);
        direct
            .write_at(AlignedBuf::copy_of(&data).as_slice(), 0)
            .unwrap();
        let mut aligned = AlignedBuf::zeroed(4096);
        assert!(!direct.read_at_if_cached(aligned.as_mut_slice(), 0).unwrap());
    }

    /// The blocks around a read that missed are read into the page cache
    /// when asked, without the caller waiting, and then served from it;
    /// a device opened `O_DIRECT` has no page cache to fill.
    #[test]
    fn blocks_read_around_are_then_served_from_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let disk = one_mib_disk(dir.path());
        let data: Vec<u8> = (0..65536).map(|i| (i % 239) as u8).collect();
        disk.write_at(&data, 65536).unwrap();
        disk.sync().unwrap();
        let mut buf = vec![0u8; 4096];
        // Random access: a probe that misses has the kernel read that one
        // page alone, never its neighbours.
        rustix::fs::fadvise(&disk.file, 0, None, rustix::fs::Advice::Random).unwrap();
        // Dropped from the page cache; only the window's first block is
        // probed here.
        assert!(
            dropped_from_page_cache(&disk, &mut buf, 65536),
            "the page cache kept the blocks"
        );
        disk.read_around(65536, 65536);
        // The kernel reads the window in the background, at once: when its
        // last block is in, so is every other, with the bytes written.
        let last = (0..500).any(|_| {
            let hit = disk.read_at_if_cached(&mut buf, 65536 + 15 * 4096).unwrap();
            if !hit {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            hit
        });
        assert!(last, "the window's last block was not read in");
        for b in 0..16u64 {
            assert!(
                disk.read_at_if_cached(&mut buf, 65536 + b * 4096).unwrap(),
                "block {b} of the window was not read in"
            );
            let at = (b * 4096) as usize;
            assert_eq!(buf, data[at..at + 4096], "block {b}");
        }
        // A direct device: nothing to read into, nothing happens.
        let direct = one_mib_disk_named(dir.path(), "direct", true);
        direct.read_around(0, 65536);
        let mut aligned = AlignedBuf::zeroed(4096);
        assert!(!direct.read_at_if_cached(aligned.as_mut_slice(), 0).unwrap());
    }

    #[test]
    fn an_uncached_read_sees_writes_still_in_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let disk = one_mib_disk(dir.path());
        // Dirty in the page cache, not synced: the read past it must still
        // see it (the kernel writes the range back first).
        let written: Vec<u8> = (0..3 * 4096).map(|i| (i % 251) as u8).collect();
        disk.write_at(&written, 4096).unwrap();
        let mut back = AlignedBuf::zeroed(3 * 4096);
        disk.read_uncached_at(back.as_mut_slice(), 4096).unwrap();
        assert_eq!(back.as_slice(), &written[..]);
        // Then an uncached write, read back both ways.
        let mut newer = AlignedBuf::zeroed(4096);
        newer.as_mut_slice().fill(0x5a);
        disk.write_uncached_at(newer.as_slice(), 8192).unwrap();
        let mut one = AlignedBuf::zeroed(4096);
        disk.read_uncached_at(one.as_mut_slice(), 8192).unwrap();
        assert_eq!(one.as_slice(), newer.as_slice());
        disk.read_at(one.as_mut_slice(), 8192).unwrap();
        assert_eq!(one.as_slice(), newer.as_slice());
        // An unaligned buffer falls back to the page cache.
        let mut unaligned = vec![0u8; 4097];
        disk.read_uncached_at(&mut unaligned[1..], 4096).unwrap();
        assert_eq!(&unaligned[1..], &written[..4096]);
        // Past the end is an error naming the device.
        let err = disk
            .read_uncached_at(back.as_mut_slice(), (1 << 20) - 4096)
            .unwrap_err();
        assert!(err.to_string().contains("dev0"), "{err}");
    }

    #[test]
    fn reads_appended_to_a_buffer_see_the_device_and_leave_it_whole_on_error() {
        let dir = tempfile::tempdir().unwrap();
        for direct_io in [false, true] {
            let disk = one_mib_disk_named(dir.path(), &format!("dev-{direct_io}"), direct_io);
            let data: Vec<u8> = (0..3 * 4096).map(|i| (i % 251) as u8).collect();
            disk.write_at(AlignedBuf::copy_of(&data).as_slice(), 4096)
                .unwrap();
            disk.sync().unwrap();
            // Pieces from memory and from the device, in any order, both
            // ways, growing past the room the buffer started with.
            let mut buf = AlignedBuf::with_capacity(4096);
            buf.extend_from_slice(&[7u8; 4096]);
            disk.read_appending(&mut buf, 8192, 4096, ReadVia::Uncached)
                .unwrap();
            buf.extend_zeroed(4096);
            disk.read_appending(&mut buf, 4096, 3 * 4096, ReadVia::PageCache)
                .unwrap();
            assert_eq!(buf.as_slice().as_ptr() as usize % DISK_ALIGN, 0);
            assert_eq!(buf.len(), 5 * 4096);
            assert_eq!(&buf.as_slice()[..4096], &[7u8; 4096][..]);
            assert_eq!(&buf.as_slice()[4096..3 * 4096], &data[..8192]);
            assert_eq!(&buf.as_slice()[3 * 4096..4 * 4096], &[0u8; 4096][..]);
            assert_eq!(&buf.as_slice()[4 * 4096..], &data[8192..]);
            // Past the end: an error naming the device, the buffer as it was.
            for via in [ReadVia::Uncached, ReadVia::PageCache] {
                let err = disk
                    .read_appending(&mut buf, 8192, (1 << 20) - 4096, via)
                    .unwrap_err();
                assert!(
                    err.to_string().contains(&format!("dev-{direct_io}")),
                    "{err}"
                );
                assert_eq!(buf.len(), 5 * 4096);
                assert_eq!(&buf.as_slice()[4 * 4096..], &data[8192..]);
            }
        }
    }

    #[test]
    fn an_open_device_is_locked_until_it_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev0");
        let writable = FileDiskOptions {
            create_bytes: Some(1 << 20),
            ..Default::default()
        };
        let read_only = FileDiskOptions {
            read_only: true,
            ..Default::default()
        };
        let first = FileDisk::open(&path, writable).unwrap();
        // A second open in the same process is another open file: refused,
        // writable or read-only, naming the device.
        for options in [writable, read_only] {
            let err = FileDisk::open(&path, options).err().expect("refused");
            assert!(err.is_in_use(), "{err}");
            assert!(err.to_string().contains("dev0"), "{err}");
            assert!(err.to_string().contains("in use"), "{err}");
        }
        drop(first);
        // Read-only opens share their lock, and keep writers out.
        let reader = FileDisk::open(&path, read_only).unwrap();
        let second_reader = FileDisk::open(&path, read_only).unwrap();
        let err = FileDisk::open(&path, writable).err().expect("refused");
        assert!(err.is_in_use(), "{err}");
        drop(reader);
        assert!(FileDisk::open(&path, writable).err().unwrap().is_in_use());
        drop(second_reader);
        let again = FileDisk::open(&path, writable).unwrap();
        assert_eq!(again.size(), 1 << 20);
        assert!(!DiskError::from_io("x", "read", 0, 0, &std::io::Error::other("x")).is_in_use());
    }
}
