//! Device writes (and reads through the page cache) that do not block the
//! thread that asks for them: one io_uring per disk group, its completions
//! reaped on the async runtime.
//!
//! Owns: the ring, the buffers and devices of the writes in flight, and the
//! task that reaps completions. A runtime thread that commits a lone write
//! would otherwise wait in `pwrite` for the device (a few hundred
//! microseconds on a disk with a volatile cache), and while it waits no
//! thread of a two-core host watches the sockets: the second copy's answer
//! waits for it. Handing the write to a log thread instead costs two thread
//! wake-ups. Submitted here, the write is in the device's queue when the
//! call returns, the thread goes on serving, and the completion wakes the
//! runtime through an eventfd it already polls. A large write's data goes
//! the same way, past the page cache and durable on completion, so no
//! device thread is woken for it and none wakes the caller back: from
//! where it lies, or from a copy the device makes as it stores the bytes
//! (an encrypted device encrypts into it).
//!
//! Must not touch: what the bytes mean, when a write is acknowledged (the
//! caller's `on_done` decides).
//!
//! Invariants (the submission's `unsafe` rests on the first; the eventfd's
//! registration on the ring's holding the eventfd open as long as the
//! reactor watches it):
//! - A buffer handed to the kernel is neither moved, freed nor touched
//!   until the kernel has answered for it: the ring keeps the buffer (a heap
//!   allocation, which does not move when its owner does; for a placed
//!   write's data, a share of the payload's buffer, which keeps that
//!   allocation alive and unmoved whoever else lets go of it) and the device
//!   (so its descriptor stays open) in the operation's slot until its
//!   completion is reaped; a ring dropped with operations in flight waits
//!   for them, and leaks (never frees) what it could not wait for. A
//!   reaper dropped before its ring (its runtime shut down) waits for them
//!   too, so their `on_done` run and what they hold is released.
//! - Every accepted operation's `on_done` runs exactly once: on the reaper
//!   task with the kernel's answer, or at once with the error when the
//!   ring could not submit it. A short write or read is reported as an
//!   error; a read's buffer, which only the kernel touches while it is in
//!   flight, goes to its `on_done` whole or not at all. A read's room is
//!   never initialized before the kernel fills it; its bytes count as the
//!   buffer's only once the kernel has reported writing every one of them.
//! - At most [`IoRing::IN_FLIGHT_MAX`] operations are in flight, fewer than
//!   the completion queue holds, so completions never overflow it.
//! - An operation started under a plug ([`crate::plug`]) is queued and
//!   reaches the kernel when that plug closes, with the others its poll
//!   queued (one system call, one doorbell of the device), or sooner with
//!   an operation started at once; no entry stays queued past the end of
//!   the poll that queued it.
//! - The submission and completion queues are touched only under the
//!   slots' lock (pushing entries, draining completions: no system call);
//!   the system call that hands the entries to the kernel runs outside it,
//!   by one thread at a time (the submitter): a thread that finds another
//!   submitting leaves its entries to it instead of waiting for the
//!   kernel's lock, and the submitter, before it stops, submits what was
//!   published meanwhile. `pending` lists, in order, the entries published
//!   and not yet consumed by the kernel (it consumes them in order and
//!   says how many), so a refused submission fails exactly those.
//! - Where io_uring is missing (an old kernel, a sandbox that forbids it)
//!   or there is no runtime, [`IoRing::new`] fails and callers keep their
//!   blocking path; a device that cannot take a write this way
//!   ([`Disk::prepare_durable_write`] gives it back) gets the write back
//!   unchanged. What a device asks to hold until its write completes (an
//!   encrypted device's claim on the pieces it wrote) is kept in the slot
//!   with the buffer, and released with it.

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::{AlignedBuf, Disk, ReadFd};

/// What runs when a write ends: `Ok` once every byte is written and
/// durable, or why not.
pub type WriteDone = Box<dyn FnOnce(std::io::Result<()>) + Send>;

/// What runs when a read ends: every byte asked for, in the buffer the
/// read was given ([`ReadPlace::submit`]), or why not.
pub type ReadDone = Box<dyn FnOnce(std::io::Result<bytes::Bytes>) + Send>;

/// What runs when an operation ends.
enum Done {
    Write(WriteDone),
    Read(ReadDone),
}

impl Done {
    fn fail(self, e: std::io::Error) {
        match self {
            Done::Write(f) => f(Err(e)),
            Done::Read(f) => f(Err(e)),
        }
    }
}

/// What an operation handed to the kernel does with its buffer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OpKind {
    /// Writes it.
    Write,
    /// Fills it (a read's buffer).
    Read,
}

/// The bytes the kernel holds: a write's buffer the ring owns, or a share
/// of one (a reference-counted slice, which keeps its allocation alive,
/// unmoved, as long as the ring keeps it); or where a read puts its bytes.
enum Held {
    Owned(AlignedBuf),
    Shared(bytes::Bytes),
    Filling(ReadInto),
}

/// Where a read's `len` bytes go: the spare room of the buffer the caller
/// gave, never initialized (no page is cleared only to be overwritten),
/// which becomes the answer without a copy; or, for a device that needs
/// aligned buffers (`O_DIRECT`), the spare room of an aligned buffer
/// first, copied into the caller's at completion. Either way the answer
/// lies in the caller's buffer, never in a larger one the ring made: a
/// cache that keeps it holds only what its owner allocated.
struct ReadInto {
    into: Vec<u8>,
    bounce: Option<AlignedBuf>,
    len: usize,
}

impl ReadInto {
    fn new(mut into: Vec<u8>, len: usize, aligned: bool) -> ReadInto {
        into.clear();
        let bounce = if aligned {
            Some(AlignedBuf::with_capacity(len))
        } else {
            into.reserve_exact(len);
            None
        };
        ReadInto { into, bounce, len }
    }

    /// The start of the `len` bytes of spare room the kernel fills.
    fn spare_mut_ptr(&mut self) -> *mut u8 {
        match &mut self.bounce {
            Some(bounce) => bounce.spare_mut_ptr(self.len),
            None => self.into.spare_capacity_mut().as_mut_ptr().cast(),
        }
    }

    /// The caller's buffer holding the bytes read.
    ///
    /// # Safety
    /// The kernel has reported writing all `len` bytes at
    /// [`ReadInto::spare_mut_ptr`], and neither buffer was touched since.
    #[allow(unsafe_code)]
    unsafe fn filled(mut self) -> Vec<u8> {
        match self.bounce {
            Some(mut bounce) => {
                // SAFETY: as the caller promises.
                unsafe { bounce.assume_appended(self.len) };
                self.into.extend_from_slice(bounce.as_slice());
            }
            // SAFETY: the room was reserved (`new`) and, as the caller
            // promises, every byte of it written.
            None => unsafe { self.into.set_len(self.len) },
        }
        self.into
    }
}

impl Held {
    fn as_ptr(&self) -> *const u8 {
        match self {
            Held::Owned(buf) => buf.as_slice().as_ptr(),
            Held::Shared(bytes) => bytes.as_ptr(),
            Held::Filling(_) => std::ptr::null(),
        }
    }

    /// Where the kernel puts what it reads: only a read's buffer.
    fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            Held::Filling(read) => read.spare_mut_ptr(),
            Held::Owned(_) | Held::Shared(_) => std::ptr::null_mut(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Held::Owned(buf) => buf.len(),
            Held::Shared(bytes) => bytes.len(),
            Held::Filling(read) => read.len,
        }
    }
}

/// An operation the kernel holds.
struct InFlight {
    /// The kernel reads from it (a write) or fills it (a read) until the
    /// operation's completion.
    buf: Held,
    /// Kept only so the descriptor stays open.
    _device: Arc<dyn Disk>,
    /// What the device asked to hold until the write completes.
    _hold: Option<Box<dyn Send>>,
    /// Taken when it ran (at submission, if submitting failed).
    on_done: Option<Done>,
    /// Which operation of the slot this is: a failed submission fails
    /// only the operations whose entries it left, not later ones in the
    /// same slots.
    number: u64,
}

struct Slots {
    ops: Vec<Option<InFlight>>,
    free: Vec<usize>,
    in_flight: usize,
    /// Slots whose entries are published and not yet consumed by the
    /// kernel, in order, each with its operation's number: pushed under a
    /// plug, they go to the kernel together when it closes
    /// ([`Ring::submit_queued`]), or with the next entry submitted at once.
    pending: VecDeque<(usize, u64)>,
    /// The number of the next operation.
    next_number: u64,
}

struct Ring {
    /// Its queues are touched only under `slots`' lock; its system calls
    /// (which take `&self`) are made without it.
    uring: io_uring::IoUring,
    slots: Mutex<Slots>,
    /// Set while a thread (the submitter) hands entries to the kernel.
    submitting: AtomicBool,
    /// The eventfd the kernel signals on each completion; the reaper holds
    /// the other reference, so neither closes it under the other.
    wakeup: Arc<OwnedFd>,
}

/// The eventfd as the runtime's reactor sees it.
struct Wakeup(Arc<OwnedFd>);

impl AsRawFd for Wakeup {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// One disk group's ring. Cheap to share by reference; dropping it waits
/// for the writes in flight.
pub struct IoRing {
    ring: Arc<Ring>,
}

impl IoRing {
    /// Writes in flight at most: the submission queue's entries (the
    /// completion queue holds twice as many).
    pub const IN_FLIGHT_MAX: usize = 64;

    /// A ring whose completions are reaped on the current tokio runtime.
    /// Fails where the kernel has no io_uring (or forbids it) or outside a
    /// runtime with I/O enabled.
    pub fn new() -> std::io::Result<IoRing> {
        let runtime = tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
        let ring = io_uring::IoUring::new(Self::IN_FLIGHT_MAX as u32)?;
        let wakeup = Arc::new(rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::NONBLOCK | rustix::event::EventfdFlags::CLOEXEC,
        )?);
        ring.submitter().register_eventfd(wakeup.as_raw_fd())?;
        let watched = register(Wakeup(Arc::clone(&wakeup)))?;
        let shared = Arc::new(Ring {
            uring: ring,
            submitting: AtomicBool::new(false),
            slots: Mutex::new(Slots {
                ops: Vec::new(),
                free: Vec::new(),
                in_flight: 0,
                pending: VecDeque::new(),
                next_number: 0,
            }),
            wakeup,
        });
        runtime.spawn(reap_completions(Arc::downgrade(&shared), watched));
        Ok(IoRing { ring: shared })
    }

    /// Starts writing `buf` at `offset` of `device`, durable when it
    /// completes (as [`Disk::write_durable_at`]), and returns at once;
    /// `on_done` runs when the write ends. Gives `buf` (unchanged) and
    /// `on_done` back, having started nothing, when the device cannot take
    /// the write this way ([`Disk::prepare_durable_write`]) or too many
    /// writes are in flight: the caller then writes with the blocking call.
    pub fn write_durable(
        &self,
        device: &Arc<dyn Disk>,
        buf: AlignedBuf,
        offset: u64,
        on_done: WriteDone,
    ) -> Result<(), (AlignedBuf, WriteDone)> {
        if u32::try_from(buf.len()).is_err() {
            return Err((buf, on_done));
        }
        // A place is taken before the device readies the bytes (an
        // encrypted one encrypts them in place): past that point the
        // buffer cannot be given back as it came.
        if !self.take_place() {
            return Err((buf, on_done));
        }
        let prepared = match device.prepare_durable_write(buf, offset) {
            Ok(prepared) => prepared,
            Err(buf) => {
                self.give_place_back();
                return Err((buf, on_done));
            }
        };
        self.submit(
            device,
            prepared.fd,
            Held::Owned(prepared.buf),
            offset,
            prepared.hold,
            on_done,
        );
        Ok(())
    }

    /// Starts writing `data` at `offset` of `device` past the page cache
    /// (`O_DIRECT`) and returns at once; `on_done` runs when the write
    /// ends. The write is not flushed: it may still sit in the device's
    /// volatile cache until the caller syncs the device. The ring keeps `data`
    /// (a share of its buffer) until then, so the bytes are written where
    /// they lie, without a copy. Gives `data` and `on_done` back, having
    /// started nothing, when `data` does not start on a
    /// [`crate::DISK_ALIGN`] boundary, the device has no descriptor for
    /// such writes ([`Disk::uncached_write_fd`]: an encrypted device, one
    /// in memory, a tripped one) or too many writes are in flight: the
    /// caller then writes with the blocking calls.
    pub fn write_uncached(
        &self,
        device: &Arc<dyn Disk>,
        data: bytes::Bytes,
        offset: u64,
        on_done: WriteDone,
    ) -> Result<(), (bytes::Bytes, WriteDone)> {
        if u32::try_from(data.len()).is_err()
            || !(data.as_ptr() as usize).is_multiple_of(crate::DISK_ALIGN)
        {
            return Err((data, on_done));
        }
        let Some(fd) = device.uncached_write_fd(data.len(), offset) else {
            return Err((data, on_done));
        };
        if !self.take_place() {
            return Err((data, on_done));
        }
        self.submit(device, fd, Held::Shared(data), offset, None, on_done);
        Ok(())
    }

    /// As [`IoRing::write_uncached`], for bytes that cannot be
    /// written where they lie: the device writes a copy of `data` as it
    /// stores them ([`Disk::prepare_uncached_write`]: an encrypted device
    /// encrypts into the copy, in the same pass), and the ring keeps the
    /// copy until the write completes. Gives `on_done` back, having started
    /// nothing, when the device cannot take the write this way or too many
    /// writes are in flight.
    pub fn write_uncached_copy(
        &self,
        device: &Arc<dyn Disk>,
        data: &[u8],
        offset: u64,
        on_done: WriteDone,
    ) -> Result<(), WriteDone> {
        if u32::try_from(data.len()).is_err() || !self.take_place() {
            return Err(on_done);
        }
        let Some(prepared) = device.prepare_uncached_write(data, offset) else {
            self.give_place_back();
            return Err(on_done);
        };
        self.submit(
            device,
            prepared.fd,
            Held::Owned(prepared.buf),
            offset,
            prepared.hold,
            on_done,
        );
        Ok(())
    }

    /// Reserves a place for a read of `len` bytes at `offset` of `device`
    /// as [`Disk::read_at`] reads it (through the host's page cache, or
    /// past it on a device opened `O_DIRECT`), started with
    /// [`ReadPlace::submit`]: a read that must wait for the device then
    /// waits in the kernel, which completes it when the page is in,
    /// instead of on a thread the caller hands it to and that wakes the
    /// caller back (two cross-core wake-ups per read). `None` when the
    /// device has no descriptor for such reads ([`Disk::read_fd`]: an
    /// encrypted device, one in memory, a tripped one, a range `O_DIRECT`
    /// refuses) or every place is
    /// taken: the caller then reads with the blocking call.
    pub fn reserve_read(
        &self,
        device: &Arc<dyn Disk>,
        len: usize,
        offset: u64,
    ) -> Option<ReadPlace<'_>> {
        u32::try_from(len).ok()?;
        let ReadFd { fd, aligned } = device.read_fd(len, offset)?;
        if !self.take_place() {
            return None;
        }
        Some(ReadPlace {
            ring: self,
            device: Arc::clone(device),
            fd,
            aligned,
            len,
            offset,
            submitted: false,
        })
    }

    /// Takes a place among the writes in flight; false when they are all
    /// taken.
    fn take_place(&self) -> bool {
        let mut slots = self.ring.slots.lock();
        if slots.in_flight >= Self::IN_FLIGHT_MAX {
            return false;
        }
        slots.in_flight += 1;
        true
    }

    /// Gives back a place taken for a write that was not submitted.
    fn give_place_back(&self) {
        self.ring.slots.lock().in_flight -= 1;
    }

    /// Submits a write of `buf` through `fd` (a descriptor of `device`)
    /// whose place in flight the caller took; `on_done` runs with the
    /// answer, at once if the ring could not submit it.
    fn submit(
        &self,
        device: &Arc<dyn Disk>,
        fd: RawFd,
        buf: Held,
        offset: u64,
        hold: Option<Box<dyn Send>>,
        on_done: WriteDone,
    ) {
        let op = (OpKind::Write, buf, hold, Done::Write(on_done));
        self.submit_op(device, fd, offset, op);
    }

    /// Submits an operation on `buf` through `fd` (a descriptor of
    /// `device`) whose place in flight the caller took; its `on_done` runs
    /// with the answer, at once if the ring could not submit it.
    #[allow(unsafe_code)]
    fn submit_op(
        &self,
        device: &Arc<dyn Disk>,
        fd: RawFd,
        offset: u64,
        (kind, buf, hold, on_done): (OpKind, Held, Option<Box<dyn Send>>, Done),
    ) {
        let mut slots = self.ring.slots.lock();
        let number = slots.next_number;
        slots.next_number += 1;
        let slot = match slots.free.pop() {
            Some(slot) => slot,
            None => {
                slots.ops.push(None);
                slots.ops.len() - 1
            }
        };
        // The buffer is in its slot before the entry points into it.
        let held = &mut slots.ops[slot]
            .insert(InFlight {
                buf,
                _device: Arc::clone(device),
                _hold: hold,
                on_done: Some(on_done),
                number,
            })
            .buf;
        // The callers checked that the length fits.
        let len32 = held.len() as u32;
        let fd = io_uring::types::Fd(fd);
        let entry = match kind {
            OpKind::Write => io_uring::opcode::Write::new(fd, held.as_ptr(), len32)
                .offset(offset)
                .build(),
            OpKind::Read => io_uring::opcode::Read::new(fd, held.as_mut_ptr(), len32)
                .offset(offset)
                .build(),
        }
        .user_data(slot as u64);
        // SAFETY: the entry points into the buffer now kept in
        // `ops[slot]` (for a read, one the ring owns and nothing else
        // touches, for the kernel to fill), with its length; the buffer and
        // the device whose descriptor it names stay there until the
        // completion carrying `slot` is reaped (or, if it never comes,
        // until the ring is dropped, which waits for it or leaks them): see
        // the module's invariants. The submission queue is used under the
        // slots' lock, held here, and nowhere else.
        let pushed = unsafe { self.ring.uring.submission_shared().push(&entry) };
        if pushed.is_err() {
            // The submission queue holds at least IN_FLIGHT_MAX entries,
            // as many as may be in flight, queued or not, so it is never
            // full here; the operation fails all the same if it is.
            slots.in_flight -= 1;
            slots.free.push(slot);
            let on_done = slots.ops[slot].take().and_then(|mut op| op.on_done.take());
            drop(slots);
            if let Some(on_done) = on_done {
                on_done.fail(std::io::Error::other(
                    "the io_uring submission queue is full",
                ));
            }
            return;
        }
        slots.pending.push_back((slot, number));
        if !crate::plug::is_open() {
            drop(slots);
            self.ring.enter();
            return;
        }
        // Under a plug (a connection's task starting the requests it has
        // read), the entries its poll queues go to the kernel in one call
        // when the plug closes: one system call, and one doorbell of the
        // device, for all of them.
        let first = slots.pending.len() == 1;
        drop(slots);
        if first {
            let ring = Arc::downgrade(&self.ring);
            let flush = move || {
                if let Some(ring) = ring.upgrade() {
                    ring.submit_queued();
                }
            };
            if let Err(flush) = crate::plug::defer(flush) {
                flush();
            }
        }
    }
}

/// A read with its place in flight taken ([`IoRing::reserve_read`]);
/// dropped unsubmitted, it gives the place back.
pub struct ReadPlace<'a> {
    ring: &'a IoRing,
    device: Arc<dyn Disk>,
    fd: RawFd,
    aligned: bool,
    len: usize,
    offset: u64,
    submitted: bool,
}

impl ReadPlace<'_> {
    /// Starts the read and returns at once; `on_done` gets every byte
    /// read, in `into` (emptied first, its allocation reused when it has
    /// room for them: a caller that recycles buffers allocates none), or
    /// the error.
    pub fn submit(mut self, into: Vec<u8>, on_done: ReadDone) {
        self.submitted = true;
        let buf = Held::Filling(ReadInto::new(into, self.len, self.aligned));
        let op = (OpKind::Read, buf, None, Done::Read(on_done));
        self.ring.submit_op(&self.device, self.fd, self.offset, op);
    }
}

impl Drop for ReadPlace<'_> {
    fn drop(&mut self) {
        if !self.submitted {
            self.ring.give_place_back();
        }
    }
}

/// Registers the eventfd with the current runtime's reactor; an error
/// (not a panic) where that runtime has no I/O driver.
#[allow(unsafe_code)]
fn register(wakeup: Wakeup) -> std::io::Result<AsyncFd<Wakeup>> {
    let registered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `Wakeup` holds a reference to the eventfd's `OwnedFd`,
        // so the descriptor stays open, and the same, for as long as the
        // `AsyncFd` that owns it.
        unsafe { AsyncFd::register_with_interest(wakeup, Interest::READABLE) }
    }));
    match registered {
        Ok(Ok(fd)) => Ok(fd),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(std::io::Error::other("the runtime has no I/O driver")),
    }
}

impl Ring {
    /// Submits the entries queued under a plug that has closed.
    fn submit_queued(&self) {
        if !self.slots.lock().pending.is_empty() {
            self.enter();
        }
    }

    /// Hands the published entries to the kernel, outside the slots' lock,
    /// unless another thread is doing so (it then submits these too: it
    /// looks for entries published meanwhile before it stops). Retries an
    /// interrupted or busy call (the kernel consumed nothing then). Where
    /// the kernel refuses, every operation whose entry it left ends with
    /// the error; the kernel may still take such an entry later, so its
    /// buffer stays in its slot (freed when a completion comes, leaked with
    /// the ring otherwise).
    fn enter(&self) {
        loop {
            if self
                .submitting
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                return;
            }
            let submitted = loop {
                match self.uring.submit() {
                    Ok(n) => break Ok(n),
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                        ) =>
                    {
                        std::thread::yield_now();
                    }
                    Err(e) => break Err(e),
                }
            };
            let failed = self.consumed(submitted);
            self.submitting.store(false, Ordering::SeqCst);
            for (on_done, e) in failed {
                on_done.fail(e);
            }
            // Entries published while this thread submitted (their threads
            // left them to it), or after an entry the kernel refused (it
            // stops there, and ends that one with a completion of its own).
            if self.slots.lock().pending.is_empty() {
                return;
            }
        }
    }

    /// Takes the entries a submission consumed off `pending` (the kernel
    /// consumes them in order), or, where it was refused, ends every
    /// pending operation with the error (to run once the lock is released).
    fn consumed(&self, submitted: std::io::Result<usize>) -> Vec<(Done, std::io::Error)> {
        let mut slots = self.slots.lock();
        match submitted {
            Ok(n) => {
                let n = n.min(slots.pending.len());
                slots.pending.drain(..n);
                Vec::new()
            }
            Err(e) => {
                let pending = std::mem::take(&mut slots.pending);
                pending
                    .into_iter()
                    .filter_map(|(slot, number)| {
                        slots.ops[slot]
                            .as_mut()
                            .filter(|op| op.number == number)
                            .and_then(|op| op.on_done.take())
                    })
                    .map(|on_done| (on_done, std::io::Error::new(e.kind(), e.to_string())))
                    .collect()
            }
        }
    }

    /// Takes every completion the kernel posted and runs their `on_done`
    /// (outside the lock: they take the store's).
    #[allow(unsafe_code)]
    fn reap(&self) {
        let mut ended: Vec<(InFlight, i32)> = Vec::new();
        {
            let mut guard = self.slots.lock();
            let slots = &mut *guard;
            // SAFETY: the completion queue is used under the slots' lock,
            // held here, and nowhere else.
            for cqe in unsafe { self.uring.completion_shared() } {
                let slot = cqe.user_data() as usize;
                if let Some(op) = slots.ops.get_mut(slot).and_then(Option::take) {
                    slots.free.push(slot);
                    slots.in_flight -= 1;
                    ended.push((op, cqe.result()));
                }
            }
        }
        for (op, result) in ended {
            let len = op.buf.len();
            let short = |what: &str, kind| {
                std::io::Error::new(kind, format!("short {what}: {result} of {len} bytes"))
            };
            match op.on_done {
                Some(Done::Write(on_done)) => on_done(match result {
                    r if r < 0 => Err(std::io::Error::from_raw_os_error(-r)),
                    r if r as usize == len => Ok(()),
                    _ => Err(short("write", std::io::ErrorKind::WriteZero)),
                }),
                Some(Done::Read(on_done)) => on_done(match (result, op.buf) {
                    (r, _) if r < 0 => Err(std::io::Error::from_raw_os_error(-r)),
                    // SAFETY: the kernel reports every byte of the read
                    // written, into the room its entry named, and the
                    // buffer stayed in the slot, untouched, until now.
                    (r, Held::Filling(read)) if r as usize == len => {
                        Ok(bytes::Bytes::from(unsafe { read.filled() }))
                    }
                    _ => Err(short("read", std::io::ErrorKind::UnexpectedEof)),
                }),
                None => {}
            }
        }
    }
}

impl Ring {
    /// Waits (blocking) for the writes in flight and runs their `on_done`;
    /// what it cannot wait for (the kernel refuses to wait) is leaked, never
    /// freed, so the kernel never writes from freed memory.
    fn wait_in_flight(&self) {
        for _ in 0..10_000 {
            {
                let mut slots = self.slots.lock();
                if slots.in_flight == 0 {
                    break;
                }
                // Submitted here with the wait, queued or not.
                match self.uring.submit_and_wait(1) {
                    Ok(n) => {
                        let n = n.min(slots.pending.len());
                        slots.pending.drain(..n);
                    }
                    Err(_) => break,
                }
            }
            self.reap();
        }
        let mut slots = self.slots.lock();
        if slots.in_flight > 0 {
            slots.in_flight = 0;
            for op in slots.ops.drain(..).flatten() {
                std::mem::forget(op);
            }
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Wake the reaper so that it sees the ring gone and ends.
        let _ = rustix::io::write(self.wakeup.as_fd(), &1u64.to_ne_bytes());
        self.wait_in_flight();
    }
}

/// Finishes the writes in flight when the reaper is dropped before its
/// ring (its runtime shut down): their `on_done` still run, and what they
/// hold (a disk group's devices and locks among them) is released.
struct ReaperGone(Weak<Ring>);

impl Drop for ReaperGone {
    fn drop(&mut self) {
        if let Some(ring) = self.0.upgrade() {
            ring.wait_in_flight();
        }
    }
}

/// Reaps completions each time the kernel signals the eventfd, until the
/// ring is dropped.
async fn reap_completions(ring: Weak<Ring>, wakeup: AsyncFd<Wakeup>) {
    let _gone = ReaperGone(ring.clone());
    loop {
        let Ok(mut ready) = wakeup.readable().await else {
            return;
        };
        // Cleared before the counter is read and the queue drained: a
        // completion posted after the drain signals again.
        ready.clear_ready();
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(wakeup.get_ref().0.as_fd(), &mut counter);
        let Some(ring) = ring.upgrade() else {
            return;
        };
        ring.reap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FileDisk, FileDiskOptions};
    use tokio::sync::oneshot;

    /// A ring and a directory for a device; `None`, said on stderr, where
    /// the kernel offers no io_uring (the stores' blocking path is then
    /// the one in use, and its own tests cover it).
    fn ring_and_dir() -> Option<(IoRing, tempfile::TempDir)> {
        match IoRing::new() {
            Ok(ring) => Some((ring, tempfile::tempdir().expect("tempdir"))),
            Err(e) => {
                eprintln!("no io_uring here ({e}): nothing to test");
                None
            }
        }
    }

    fn open(dir: &tempfile::TempDir) -> Arc<dyn Disk> {
        open_with(dir, true)
    }

    /// A device of 1 MiB, opened with `O_DIRECT` or (as capacity devices
    /// are, read through the page cache) without.
    fn open_with(dir: &tempfile::TempDir, direct_io: bool) -> Arc<dyn Disk> {
        Arc::new(
            FileDisk::open(
                &dir.path().join("dev"),
                FileDiskOptions {
                    create_bytes: Some(1 << 20),
                    direct_io,
                    read_only: false,
                },
            )
            .expect("open"),
        )
    }

    /// A device read through the page cache, as capacity devices are,
    /// whose 8 KiB at `offset` are in the page cache (a write past it must
    /// not leave them stale); `None`, said on stderr, where the file system
    /// refuses `O_DIRECT`.
    fn cached_device(dir: &tempfile::TempDir, offset: u64) -> Option<Arc<dyn Disk>> {
        let disk = open_with(dir, false);
        if disk.uncached_write_fd(8192, 0).is_none() {
            eprintln!("no O_DIRECT on this file system: nothing to test");
            return None;
        }
        disk.write_at(&[1; 8192], offset).expect("write");
        disk.read_at(&mut [0u8; 8192], offset).expect("read");
        Some(disk)
    }

    async fn write(
        ring: &IoRing,
        disk: &Arc<dyn Disk>,
        fill: u8,
        offset: u64,
    ) -> std::io::Result<()> {
        let (tx, rx) = oneshot::channel();
        let mut buf = AlignedBuf::with_capacity(8192);
        buf.extend_from_slice(&[fill; 8192]);
        let on_done: WriteDone = Box::new(move |r| {
            let _ = tx.send(r);
        });
        match ring.write_durable(disk, buf, offset, on_done) {
            Ok(()) => rx.await.expect("on_done ran"),
            // Beyond IN_FLIGHT_MAX the write comes back, as to a caller,
            // which writes it itself.
            Err((buf, _)) => disk
                .write_durable_at(buf.as_slice(), offset)
                .map_err(|e| std::io::Error::other(e.to_string())),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_land_where_asked_and_concurrent_ones_all_complete() {
        let Some((ring, dir)) = ring_and_dir() else {
            return;
        };
        let disk = open(&dir);
        let writes = (0..100u64).map(|i| write(&ring, &disk, i as u8 + 1, (i % 100) * 8192));
        for result in futures::future::join_all(writes).await {
            result.expect("write");
        }
        let mut back = AlignedBuf::zeroed(8192);
        for i in 0..100u64 {
            disk.read_at(back.as_mut_slice(), i * 8192).expect("read");
            assert!(
                back.as_slice().iter().all(|&b| b == i as u8 + 1),
                "block {i}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_misaligned_write_is_given_back_and_a_failed_one_reports_its_error() {
        let Some((ring, dir)) = ring_and_dir() else {
            return;
        };
        let disk = open(&dir);
        // A misaligned offset cannot go to an O_DIRECT descriptor: the
        // caller gets the write back for its blocking path.
        let mut buf = AlignedBuf::with_capacity(4096);
        buf.extend_from_slice(&[7; 4096]);
        let given_back = ring.write_durable(&disk, buf, 100, Box::new(|_| {}));
        assert!(given_back.is_err());
        // A bad descriptor's error reaches on_done.
        let (tx, rx) = oneshot::channel();
        let closed: Arc<dyn Disk> = Arc::new(ClosedDisk);
        let mut buf = AlignedBuf::with_capacity(4096);
        buf.extend_from_slice(&[7; 4096]);
        let accepted = ring.write_durable(
            &closed,
            buf,
            0,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        assert!(accepted.is_ok());
        let err = rx.await.expect("on_done ran").expect_err("bad descriptor");
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_shared_slice_is_written_past_the_page_cache_and_read_back_through_it() {
        let Some((ring, dir)) = ring_and_dir() else {
            return;
        };
        let Some(disk) = cached_device(&dir, 16384) else {
            return;
        };
        let mut back = vec![0u8; 8192];
        // Two blocks out of the middle of a larger buffer, the way a write
        // is a slice of the buffer its payload was read into; the caller
        // lets go of the buffer before the write completes.
        let mut whole = AlignedBuf::with_capacity(4 * 4096);
        for b in 0..4u8 {
            whole.extend_from_slice(&[b + 10; 4096]);
        }
        let slice = whole.into_bytes().slice(4096..3 * 4096);
        let (tx, rx) = oneshot::channel();
        let accepted = ring.write_uncached(
            &disk,
            slice,
            16384,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        assert!(accepted.is_ok(), "an aligned slice is taken");
        rx.await.expect("on_done ran").expect("write");
        disk.read_at(&mut back, 16384).expect("read");
        assert!(back[..4096].iter().all(|&b| b == 11));
        assert!(back[4096..].iter().all(|&b| b == 12));
        // A slice that does not start on a boundary is given back as it is.
        let mut whole = AlignedBuf::with_capacity(2 * 4096);
        whole.extend_from_slice(&[5; 2 * 4096]);
        let odd = whole.into_bytes().slice(512..512 + 4096);
        match ring.write_uncached(&disk, odd, 0, Box::new(|_| {})) {
            Err((back, _)) => assert_eq!(back.len(), 4096),
            Ok(()) => panic!("a misaligned slice was taken"),
        }
        // A device without such a descriptor gives it back too.
        let closed: Arc<dyn Disk> = Arc::new(ClosedDisk);
        let mut whole = AlignedBuf::with_capacity(4096);
        whole.extend_from_slice(&[5; 4096]);
        assert!(ring
            .write_uncached(&closed, whole.into_bytes(), 0, Box::new(|_| {}))
            .is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slice_off_the_boundary_is_written_as_a_copy_past_the_page_cache() {
        let Some((ring, dir)) = ring_and_dir() else {
            return;
        };
        let Some(disk) = cached_device(&dir, 8192) else {
            return;
        };
        let mut back = vec![0u8; 8192];
        // Two blocks 512 bytes into a buffer, as a payload read after a
        // header lies; the caller reuses its buffer as soon as the call
        // returns, so the ring must have taken a copy.
        let mut whole = vec![0u8; 512 + 8192];
        whole[512..512 + 4096].fill(21);
        whole[512 + 4096..].fill(22);
        let (tx, rx) = oneshot::channel();
        let accepted = ring.write_uncached_copy(
            &disk,
            &whole[512..],
            8192,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        assert!(accepted.is_ok(), "a copy is taken");
        whole.fill(0xEE);
        rx.await.expect("on_done ran").expect("write");
        disk.read_at(&mut back, 8192).expect("read");
        assert!(back[..4096].iter().all(|&b| b == 21));
        assert!(back[4096..].iter().all(|&b| b == 22));
        // A device without a descriptor for such writes gives the write
        // back, having run nothing.
        let closed: Arc<dyn Disk> = Arc::new(ClosedDisk);
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&ran);
        let refused = ring.write_uncached_copy(
            &closed,
            &[5; 4096],
            0,
            Box::new(move |_| flag.store(true, std::sync::atomic::Ordering::SeqCst)),
        );
        assert!(refused.is_err());
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_ring_dropped_with_writes_in_flight_waits_for_them() {
        let Some((ring, dir)) = ring_and_dir() else {
            return;
        };
        let disk = open(&dir);
        for i in 0..32u64 {
            let mut buf = AlignedBuf::with_capacity(8192);
            buf.extend_from_slice(&[0xA5; 8192]);
            assert!(ring
                .write_durable(&disk, buf, i * 8192, Box::new(|_| {}))
                .is_ok());
        }
        drop(ring);
        let mut back = AlignedBuf::zeroed(8192);
        for i in 0..32u64 {
            disk.read_at(back.as_mut_slice(), i * 8192).expect("read");
            assert!(back.as_slice().iter().all(|&b| b == 0xA5), "block {i}");
        }
    }

    #[test]
    fn every_on_done_runs_once_even_when_the_runtime_stops_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let Ok(ring) = runtime.block_on(async { IoRing::new() }) else {
            return;
        };
        let disk = open(&dir);
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut accepted = 0;
        for i in 0..16u64 {
            let mut buf = AlignedBuf::with_capacity(8192);
            buf.extend_from_slice(&[3; 8192]);
            let ran = Arc::clone(&ran);
            let on_done: WriteDone = Box::new(move |r| {
                r.expect("write");
                ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
            if ring.write_durable(&disk, buf, i * 8192, on_done).is_ok() {
                accepted += 1;
            }
        }
        drop(runtime);
        drop(ring);
        assert_eq!(accepted, 16);
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 16);
    }

    async fn read(
        ring: &IoRing,
        disk: &Arc<dyn Disk>,
        len: usize,
        offset: u64,
    ) -> Option<std::io::Result<bytes::Bytes>> {
        let place = ring.reserve_read(disk, len, offset)?;
        let (tx, rx) = oneshot::channel();
        place.submit(
            Vec::new(),
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        Some(rx.await.expect("on_done ran"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_through_the_page_cache_see_every_write_and_report_a_short_one() {
        let Some((ring, dir)) = ring_and_dir() else {
            return;
        };
        // Capacity devices are read through the page cache.
        let disk = open_with(&dir, false);
        disk.write_at(&[0x5A; 8192], 4096).expect("write");
        let back = read(&ring, &disk, 8192, 4096)
            .await
            .expect("taken")
            .expect("read");
        assert!(back.iter().all(|&b| b == 0x5A));
        assert_eq!(back.len(), 8192);
        // Read into the buffer given, where it has room: a caller that
        // recycles its buffers allocates none.
        let mut recycled = Vec::with_capacity(4096);
        recycled.extend_from_slice(&[0xEE; 100]);
        let at = recycled.as_ptr();
        let place = ring.reserve_read(&disk, 4096, 4096).expect("a place");
        let (tx, rx) = oneshot::channel();
        place.submit(
            recycled,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        let back = rx.await.expect("on_done ran").expect("read");
        assert_eq!((back.as_ptr(), back.len()), (at, 4096));
        assert!(back.iter().all(|&b| b == 0x5A));
        // Many at once, each into its own buffer.
        for i in 0..64u64 {
            disk.write_at(&[i as u8; 4096], i * 4096).expect("write");
        }
        let reads = (0..64u64).map(|i| read(&ring, &disk, 4096, i * 4096));
        for (i, r) in futures::future::join_all(reads)
            .await
            .into_iter()
            .enumerate()
        {
            let buf = r.expect("taken").expect("read");
            assert!(buf.iter().all(|&b| b == i as u8), "block {i}");
        }
        // Past the end of the device: an error, not a buffer with zeros.
        let end = disk.size();
        let Some(Err(err)) = read(&ring, &disk, 8192, end - 4096).await else {
            panic!("a read past the end succeeded");
        };
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "{err}");
        // A device opened O_DIRECT is read past the page cache, in ranges
        // that meet its alignment only.
        let direct_dir = tempfile::tempdir().expect("tempdir");
        let direct = open(&direct_dir);
        if direct.uncached_write_fd(4096, 0).is_some() {
            direct
                .write_durable_at(AlignedBuf::copy_of(&[0xC3; 8192]).as_slice(), 4096)
                .expect("write");
            let back = read(&ring, &direct, 8192, 4096)
                .await
                .expect("taken")
                .expect("read");
            assert!(back.iter().all(|&b| b == 0xC3));
            assert!(ring.reserve_read(&direct, 4096, 512).is_none());
            assert!(ring.reserve_read(&direct, 1000, 0).is_none());
        }
        // Places reserved and dropped unsubmitted come back.
        let held: Vec<_> = (0..IoRing::IN_FLIGHT_MAX)
            .map(|_| ring.reserve_read(&disk, 4096, 0).expect("a place"))
            .collect();
        assert!(
            ring.reserve_read(&disk, 4096, 0).is_none(),
            "every place taken"
        );
        drop(held);
        assert!(read(&ring, &disk, 4096, 0).await.expect("taken").is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_started_under_a_plug_reach_the_kernel_together_when_it_closes() {
        let Some((ring, dir)) = ring_and_dir() else {
            return;
        };
        let disk = open_with(&dir, false);
        for i in 0..4u64 {
            disk.write_at(&[i as u8 + 1; 4096], i * 4096)
                .expect("write");
        }
        #[allow(unsafe_code)]
        let queued = |ring: &IoRing| {
            let slots = ring.ring.slots.lock();
            // SAFETY: under the slots' lock, as everywhere.
            let entries = unsafe { ring.ring.uring.submission_shared() }.len();
            (slots.pending.len(), entries)
        };
        let mut answers = Vec::new();
        let plug = crate::Plug::open();
        for i in 0..4u64 {
            let (tx, rx) = oneshot::channel();
            let place = ring.reserve_read(&disk, 4096, i * 4096).expect("a place");
            place.submit(
                Vec::new(),
                Box::new(move |r| {
                    let _ = tx.send(r);
                }),
            );
            answers.push(rx);
        }
        assert_eq!(queued(&ring), (4, 4), "queued, not yet submitted");
        drop(plug);
        assert_eq!(queued(&ring), (0, 0), "submitted when the plug closed");
        for (i, rx) in answers.into_iter().enumerate() {
            let buf = rx.await.expect("on_done ran").expect("read");
            assert!(buf.iter().all(|&b| b == i as u8 + 1), "block {i}");
        }
        // Without a plug, at once.
        let (tx, rx) = oneshot::channel();
        let place = ring.reserve_read(&disk, 4096, 0).expect("a place");
        place.submit(
            Vec::new(),
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        assert_eq!(queued(&ring), (0, 0));
        assert!(rx.await.expect("on_done ran").is_ok());
    }

    /// Threads that submit at once (each its own blocks, 16 in flight,
    /// while the others push and the reaper drains) get every write and
    /// read answered once, with their own bytes: no entry is lost or
    /// submitted twice when submissions run outside the slots' lock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn operations_started_from_several_threads_at_once_all_end_with_their_own_bytes() {
        let Some((ring, dir)) = ring_and_dir() else {
            return;
        };
        let ring = Arc::new(ring);
        let disk = open_with(&dir, true);
        const BLOCKS: u64 = 16;
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (ring, disk) = (Arc::clone(&ring), Arc::clone(&disk));
                std::thread::spawn(move || {
                    for round in 0..25u64 {
                        let fill = |block: u64| (t * 50 + round + block) as u8;
                        let at = |block: u64| (t * BLOCKS + block) * 4096;
                        let (tx, rx) = std::sync::mpsc::channel();
                        for block in 0..BLOCKS {
                            let mut buf = AlignedBuf::with_capacity(4096);
                            buf.extend_from_slice(&[fill(block); 4096]);
                            let answer = tx.clone();
                            let on_done: WriteDone = Box::new(move |r| {
                                let _ = answer.send(r.map(|()| None));
                            });
                            if let Err((buf, _)) =
                                ring.write_durable(&disk, buf, at(block), on_done)
                            {
                                let r = disk.write_durable_at(buf.as_slice(), at(block));
                                tx.send(r.map(|()| None).map_err(std::io::Error::other))
                                    .expect("send");
                            }
                        }
                        for _ in 0..BLOCKS {
                            rx.recv().expect("every write answered").expect("write");
                        }
                        for block in 0..BLOCKS {
                            let place = loop {
                                match ring.reserve_read(&disk, 4096, at(block)) {
                                    Some(place) => break place,
                                    None => std::thread::yield_now(),
                                }
                            };
                            let tx = tx.clone();
                            place.submit(
                                Vec::new(),
                                Box::new(move |r| {
                                    let _ = tx.send(r.map(|buf| Some((block, buf))));
                                }),
                            );
                        }
                        let mut seen = [false; BLOCKS as usize];
                        for _ in 0..BLOCKS {
                            let (block, buf) = rx
                                .recv()
                                .expect("every read answered")
                                .expect("read")
                                .expect("a read's answer");
                            assert!(!seen[block as usize], "block {block} answered twice");
                            seen[block as usize] = true;
                            assert!(
                                buf.iter().all(|&b| b == fill(block)),
                                "thread {t} round {round} block {block}"
                            );
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            tokio::task::spawn_blocking(move || thread.join())
                .await
                .expect("join")
                .expect("the thread's checks held");
        }
        assert_eq!(ring.ring.slots.lock().in_flight, 0);
    }

    /// A device whose descriptor is not open.
    struct ClosedDisk;

    impl Disk for ClosedDisk {
        fn read_at(&self, _: &mut [u8], _: u64) -> Result<(), crate::DiskError> {
            unreachable!()
        }
        fn write_at(&self, _: &[u8], _: u64) -> Result<(), crate::DiskError> {
            unreachable!()
        }
        fn sync(&self) -> Result<(), crate::DiskError> {
            unreachable!()
        }
        fn size(&self) -> u64 {
            1 << 20
        }
        fn name(&self) -> String {
            "closed".into()
        }
        fn durable_write_fd(&self, _: usize, _: u64) -> Option<RawFd> {
            Some(-1)
        }
    }
}
