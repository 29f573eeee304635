//! Buffers for large WRITE payloads, reused across requests and connections.
//!
//! Owns: the process-wide set of free payload buffers.
//! Must not touch: sockets or devices; the server reads into a buffer and
//! hands it to the device as `Bytes`.
//! Invariants:
//! - a buffer comes back only when every `Bytes` cut from it is dropped
//!   (the device may keep pieces of a payload for as long as it likes), so a
//!   reused buffer is never visible to anyone else;
//! - free buffers hold at most [`FREE_BYTES`] in all, and none larger than
//!   [`LARGEST_KEPT_BYTES`] (plus its alignment room) is kept;
//! - a payload starts at an address that is a multiple of
//!   [`PAYLOAD_ALIGN`].
//!
//! Why: a device that keeps a payload instead of copying it (the memory
//! device keeps whole-chunk pieces) frees an old one for each new one. A
//! fresh allocation of that size goes back and forth to the kernel through
//! the allocator and is faulted in page by page on every write; a returned
//! buffer is already mapped, and one a device returned at once is still in
//! cache.

use bytes::Bytes;
use parking_lot::Mutex;

/// Bytes the free buffers may hold in all: four connections with eight
/// 256 KiB writes each in flight, twice over.
pub const FREE_BYTES: usize = 16 << 20;
/// Largest buffer kept for reuse; larger payloads are rare enough to
/// allocate.
pub const LARGEST_KEPT_BYTES: usize = 4 << 20;

/// Free buffers, the one returned last at the end (it is the likeliest to
/// still be in cache).
static FREE: Mutex<FreeBuffers> = Mutex::new(FreeBuffers {
    buffers: Vec::new(),
    bytes: 0,
});

struct FreeBuffers {
    buffers: Vec<Vec<u8>>,
    /// Capacity of `buffers`, summed.
    bytes: usize,
}

/// Where a payload starts in its buffer: a multiple of this, so a device
/// that writes large payloads past the page cache (`O_DIRECT`, which needs
/// aligned memory) takes them as they are instead of copying them.
pub const PAYLOAD_ALIGN: usize = 4096;

/// A WRITE payload being read from the socket: the bytes from `start` on,
/// where `start` puts them at an address that is a multiple of
/// [`PAYLOAD_ALIGN`].
pub struct PayloadBuffer {
    raw: Vec<u8>,
    start: usize,
}

impl PayloadBuffer {
    /// Payload bytes read so far.
    pub fn filled(&self) -> usize {
        self.raw.len() - self.start
    }

    /// Appends bytes already read.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.raw.extend_from_slice(bytes);
    }

    /// What a socket read appends to (its spare room is the payload's rest).
    pub fn tail(&mut self) -> &mut Vec<u8> {
        &mut self.raw
    }
}

/// An empty payload buffer with room for exactly `len` bytes: a returned one
/// of that size if there is one, else a new one.
pub fn buffer(len: usize) -> PayloadBuffer {
    let mut free = FREE.lock();
    let raw = match free
        .buffers
        .iter()
        .rposition(|b| b.capacity() == len + PAYLOAD_ALIGN)
    {
        Some(at) => {
            let raw = free.buffers.remove(at);
            free.bytes -= raw.capacity();
            raw
        }
        None => {
            drop(free);
            Vec::with_capacity(len + PAYLOAD_ALIGN)
        }
    };
    aligned(raw)
}

/// `raw` (empty) padded up to its first aligned address.
fn aligned(mut raw: Vec<u8>) -> PayloadBuffer {
    let start = raw.as_ptr().align_offset(PAYLOAD_ALIGN).min(PAYLOAD_ALIGN);
    raw.resize(start, 0);
    PayloadBuffer { raw, start }
}

/// The payload in `buffer`, as `Bytes` that give the buffer back for reuse
/// once they and every piece cut from them are dropped.
pub fn freeze(buffer: PayloadBuffer) -> Bytes {
    let start = buffer.start;
    Bytes::from_owner(Returning(buffer.raw)).slice(start..)
}

/// Owns a payload buffer while `Bytes` point into it.
struct Returning(Vec<u8>);

impl AsRef<[u8]> for Returning {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        let capacity = self.0.capacity();
        if capacity == 0 || capacity > LARGEST_KEPT_BYTES + PAYLOAD_ALIGN {
            return;
        }
        let mut free = FREE.lock();
        if free.bytes + capacity <= FREE_BYTES {
            let mut buffer = std::mem::take(&mut self.0);
            buffer.clear();
            free.bytes += capacity;
            free.buffers.push(buffer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_only_after_every_piece_is_dropped() {
        // A size no other test uses, so buffers of parallel tests do not mix.
        let len = 3 * 65536 + 512;
        let mut first = buffer(len);
        first.extend_from_slice(&vec![7u8; len]);
        let payload = freeze(first);
        let at = payload.as_ptr();
        assert_eq!(at as usize % PAYLOAD_ALIGN, 0, "a payload starts aligned");
        assert_eq!(payload.len(), len);
        let piece = payload.slice(65536..131072);
        drop(payload);
        let mut other = buffer(len);
        assert_eq!(other.filled(), 0);
        other.extend_from_slice(&[1]);
        let other = freeze(other);
        assert_ne!(other.as_ptr(), at, "a buffer with a live piece was reused");
        assert!(piece.iter().all(|&b| b == 7));
        drop(piece);
        let mut again = buffer(len);
        assert_eq!(again.filled(), 0);
        again.tail().extend_from_slice(&[3; 10]);
        let again = freeze(again);
        assert_eq!(again.as_ptr(), at, "a returned buffer is reused");
        assert_eq!(&again[..], &[3; 10]);
    }
}
