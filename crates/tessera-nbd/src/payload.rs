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
//!   [`LARGEST_KEPT_BYTES`] is kept.
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

/// An empty buffer with room for exactly `len` bytes: a returned one of that
/// size if there is one, else a new one.
pub fn buffer(len: usize) -> Vec<u8> {
    let mut free = FREE.lock();
    if let Some(at) = free.buffers.iter().rposition(|b| b.capacity() == len) {
        let buffer = free.buffers.remove(at);
        free.bytes -= buffer.capacity();
        return buffer;
    }
    drop(free);
    Vec::with_capacity(len)
}

/// The payload in `buffer`, as `Bytes` that give the buffer back for reuse
/// once they and every piece cut from them are dropped.
pub fn freeze(buffer: Vec<u8>) -> Bytes {
    Bytes::from_owner(Returning(buffer))
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
        if capacity == 0 || capacity > LARGEST_KEPT_BYTES {
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
        first.extend(std::iter::repeat_n(7u8, len));
        let at = first.as_ptr();
        let payload = freeze(first);
        let piece = payload.slice(65536..131072);
        drop(payload);
        let other = buffer(len);
        assert_ne!(other.as_ptr(), at, "a buffer with a live piece was reused");
        assert_eq!(other.capacity(), len);
        assert!(piece.iter().all(|&b| b == 7));
        drop(piece);
        let again = buffer(len);
        assert_eq!(again.as_ptr(), at);
        assert!(again.is_empty());
        assert_eq!(again.capacity(), len);
    }
}
