//! Frame I/O on a byte stream.
//!
//! Owns: writing an encoded frame with vectored writes (one system call for
//! a whole frame in the common case) and reading frames into a buffer that
//! the decoded data buffers share, so a payload is copied only by the kernel.

use std::io::IoSlice;

use bytes::{Buf, BytesMut};
use tessera_env::DISK_ALIGN;
use tessera_wire::{
    decode_frame, frame_bytes_needed, EncodedFrame, Frame, WireError, HEADER_BYTES,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The read side of a connection: a TCP socket's own half, or half of a
/// TLS stream.
pub(crate) type LinkReader = Box<dyn AsyncRead + Send + Unpin>;
/// The write side of a connection.
pub(crate) type LinkWriter = Box<dyn AsyncWrite + Send + Unpin>;

/// Splits a plain TCP connection (each half without a lock) or a TLS one.
pub(crate) fn split_link<S>(stream: S) -> (LinkReader, LinkWriter)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read, write) = tokio::io::split(stream);
    (Box::new(read), Box::new(write))
}

/// Splits a plain TCP connection into its owned halves.
pub(crate) fn split_tcp(stream: tokio::net::TcpStream) -> (LinkReader, LinkWriter) {
    let (read, write) = stream.into_split();
    (Box::new(read), Box::new(write))
}

/// Bytes asked of the kernel per read when no larger frame is pending:
/// enough for many small frames per system call.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Frames of at least this many bytes are read so that they end on a
/// [`DISK_ALIGN`] boundary (see `FrameReader::end_frame_aligned`): large
/// writes, whose data the store writes past the page cache.
const ALIGNED_FRAME_MIN_BYTES: usize = 64 * 1024;

/// Largest frame accepted before the handshake: a `Hello` is tens of bytes,
/// so a peer that has not introduced itself cannot make a host reserve
/// [`tessera_wire::MAX_FRAME_BYTES`] per connection.
pub(crate) const HANDSHAKE_FRAME_BYTES_MAX: usize = 4096;

/// Most chunks handed to one vectored write (a frame has a few; a batch
/// of small answers one or two each).
const IO_SLICES_MAX: usize = 64;

/// Writes all of `frame`.
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    frame: &EncodedFrame,
) -> std::io::Result<()> {
    write_frames(writer, std::slice::from_ref(frame)).await
}

/// Writes all of `frames`, one after the other, with as few vectored writes
/// as their chunks allow (one for a handful of small frames).
pub(crate) async fn write_frames<W: AsyncWrite + Unpin>(
    writer: &mut W,
    frames: &[EncodedFrame],
) -> std::io::Result<()> {
    write_frames_after(writer, frames, 0).await
}

/// Writes what is left of `frames` after their first `written` bytes.
pub(crate) async fn write_frames_after<W: AsyncWrite + Unpin>(
    writer: &mut W,
    frames: &[EncodedFrame],
    written: usize,
) -> std::io::Result<()> {
    let mut cursor = FramesCursor::new(frames, written);
    while !cursor.is_done() {
        let n = writer.write_vectored(&cursor.slices()).await?;
        cursor.advance(n)?;
    }
    writer.flush().await
}

/// How far [`write_frames_now`] got.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WrittenNow {
    /// Every byte was written and flushed.
    All,
    /// The stream took only these bytes without waiting (or took them all
    /// but could not flush them yet): the rest is for
    /// [`write_frames_after`].
    Part(usize),
}

/// Writes as much of `frames` as `writer` takes without waiting, from a
/// synchronous stretch of code (the end of a plugged poll): a socket with
/// room in its buffer takes them all at once.
pub(crate) fn write_frames_now<W: AsyncWrite + Unpin>(
    writer: &mut W,
    frames: &[EncodedFrame],
) -> std::io::Result<WrittenNow> {
    use std::task::{Context, Poll, Waker};
    // Nothing waits on this context: a stream that is not ready now is
    // finished by an asynchronous write, which registers its own waker.
    let mut cx = Context::from_waker(Waker::noop());
    let mut writer = std::pin::Pin::new(writer);
    let mut cursor = FramesCursor::new(frames, 0);
    while !cursor.is_done() {
        match writer
            .as_mut()
            .poll_write_vectored(&mut cx, &cursor.slices())
        {
            Poll::Ready(Ok(n)) => cursor.advance(n)?,
            Poll::Ready(Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Ok(WrittenNow::Part(cursor.written));
            }
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => return Ok(WrittenNow::Part(cursor.written)),
        }
    }
    match writer.as_mut().poll_flush(&mut cx) {
        Poll::Ready(Ok(())) => Ok(WrittenNow::All),
        Poll::Ready(Err(e)) => Err(e),
        Poll::Pending => Ok(WrittenNow::Part(cursor.written)),
    }
}

/// Where a write of several frames stands: their chunks, and the next
/// byte to write.
struct FramesCursor<'a> {
    chunks: Vec<&'a [u8]>,
    index: usize,
    offset: usize,
    /// Bytes written so far.
    written: usize,
}

impl<'a> FramesCursor<'a> {
    /// A cursor past the first `written` bytes of `frames`.
    fn new(frames: &'a [EncodedFrame], written: usize) -> Self {
        let chunks: Vec<&[u8]> = frames
            .iter()
            .flat_map(|f| f.chunks().iter().map(|c| &c[..]))
            .filter(|c| !c.is_empty())
            .collect();
        let mut cursor = FramesCursor {
            chunks,
            index: 0,
            offset: 0,
            written: 0,
        };
        cursor.skip(written);
        cursor
    }

    fn is_done(&self) -> bool {
        self.index == self.chunks.len()
    }

    /// The next chunks to hand to one vectored write.
    fn slices(&self) -> Vec<IoSlice<'a>> {
        self.chunks[self.index..]
            .iter()
            .take(IO_SLICES_MAX)
            .enumerate()
            .map(|(i, c)| IoSlice::new(if i == 0 { &c[self.offset..] } else { c }))
            .collect()
    }

    /// Counts `n` more bytes written.
    fn advance(&mut self, n: usize) -> std::io::Result<()> {
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        self.skip(n);
        Ok(())
    }

    fn skip(&mut self, mut n: usize) {
        self.written += n;
        while n > 0 && self.index < self.chunks.len() {
            let left = self.chunks[self.index].len() - self.offset;
            if n >= left {
                n -= left;
                self.index += 1;
                self.offset = 0;
            } else {
                self.offset += n;
                n = 0;
            }
        }
    }
}

/// Why a stream stopped yielding frames.
#[derive(Debug)]
pub(crate) enum ReadFailure {
    /// The socket failed.
    Io(std::io::Error),
    /// The peer sent bytes that are not a frame.
    Wire(WireError),
    /// The peer closed the stream in the middle of a frame.
    Truncated,
}

impl std::fmt::Display for ReadFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadFailure::Io(e) => write!(f, "read failed: {e}"),
            ReadFailure::Wire(e) => write!(f, "malformed frame: {e}"),
            ReadFailure::Truncated => f.write_str("stream closed in the middle of a frame"),
        }
    }
}

/// Reads frames from one stream.
pub(crate) struct FrameReader<R> {
    stream: R,
    buf: BytesMut,
    /// Largest frame accepted now.
    limit: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub(crate) fn new(stream: R) -> Self {
        FrameReader {
            stream,
            buf: BytesMut::with_capacity(READ_CHUNK_BYTES),
            limit: tessera_wire::MAX_FRAME_BYTES,
        }
    }

    /// Accepts frames of at most `limit` bytes (never more than
    /// [`tessera_wire::MAX_FRAME_BYTES`]).
    pub(crate) fn set_limit(&mut self, limit: usize) {
        self.limit = limit.min(tessera_wire::MAX_FRAME_BYTES);
    }

    /// Makes the pending frame of `len` bytes end on a [`DISK_ALIGN`]
    /// boundary once it is read, moving what is buffered of it to a new
    /// buffer if it would not. The data of a write (and of a read's answer)
    /// is a multiple of 4 KiB at the end of its frame, so it then starts
    /// aligned and the store writes it past the page cache as it is,
    /// without copying it into an aligned buffer first.
    fn end_frame_aligned(&mut self, len: usize) {
        let ends_at = self.buf.as_ptr() as usize + len;
        if ends_at.is_multiple_of(DISK_ALIGN) && self.buf.capacity() >= len {
            return;
        }
        let mut fresh = BytesMut::with_capacity(len + DISK_ALIGN);
        let pad = (DISK_ALIGN - (fresh.as_ptr() as usize + len) % DISK_ALIGN) % DISK_ALIGN;
        fresh.resize(pad, 0);
        fresh.advance(pad);
        fresh.extend_from_slice(&self.buf);
        self.buf = fresh;
    }

    /// The next frame, or `None` when the peer closed the stream cleanly.
    pub(crate) async fn next(&mut self) -> Result<Option<Frame>, ReadFailure> {
        loop {
            if let Some(frame) = decode_frame(&mut self.buf).map_err(ReadFailure::Wire)? {
                return Ok(Some(frame));
            }
            // Reserve room for the whole pending frame at once, so a large
            // payload lands in one buffer without reallocation.
            let needed = frame_bytes_needed(&self.buf)
                .map_err(ReadFailure::Wire)?
                .unwrap_or(HEADER_BYTES);
            if needed > self.limit {
                return Err(ReadFailure::Wire(WireError::FrameTooLarge {
                    len: needed as u64,
                    max: self.limit,
                }));
            }
            let missing = needed.saturating_sub(self.buf.len());
            if needed >= ALIGNED_FRAME_MIN_BYTES {
                // Room for the whole frame, ending aligned: `reserve` must
                // not move it again (it would, for more room).
                self.end_frame_aligned(needed);
            } else {
                self.buf.reserve(missing.max(READ_CHUNK_BYTES));
            }
            let n = self
                .stream
                .read_buf(&mut self.buf)
                .await
                .map_err(ReadFailure::Io)?;
            if n == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(ReadFailure::Truncated)
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use tessera_types::{ComponentId, Epoch, Lba, VolumeId};
    use tessera_wire::{encode_frame, ComponentRef, Message, QueueClass, Request, WireVersion};
    use tokio::io::AsyncWriteExt;

    fn write_frame(data: Bytes, id: u64) -> Vec<u8> {
        let message = Message::Request(Request::Write {
            component: ComponentRef {
                volume: VolumeId::new("vm1").unwrap(),
                id: ComponentId(7),
            },
            lba: Lba(id),
            epoch: Epoch(1),
            data,
        });
        let frame = encode_frame(WireVersion::CURRENT, id, QueueClass::Resync, &message).unwrap();
        frame
            .chunks()
            .iter()
            .flat_map(|c| c.iter().copied())
            .collect()
    }

    /// Large writes arrive with their data at an aligned address, however
    /// the stream is cut and whatever frames come before them, so the store
    /// can write them past the page cache without a copy; small frames
    /// around them decode as before.
    #[tokio::test]
    async fn the_data_of_a_large_write_frame_is_read_into_aligned_memory() {
        let sizes = [4096usize, 256 * 1024, 8192, 1 << 20, 64 * 1024, 4096];
        let mut stream = Vec::new();
        let mut sent = Vec::new();
        for (i, &size) in sizes.iter().enumerate() {
            let data: Bytes = (0..size).map(|b| (b * 7 + i) as u8).collect();
            stream.extend(write_frame(data.clone(), i as u64));
            sent.push(data);
        }
        for piece in [1000usize, 4096, 65_537, 1 << 20] {
            let (mut tx, rx) = tokio::io::duplex(piece);
            let bytes = stream.clone();
            let writer = tokio::spawn(async move {
                for chunk in bytes.chunks(piece) {
                    tx.write_all(chunk).await.unwrap();
                }
            });
            let mut reader = FrameReader::new(rx);
            for (i, data) in sent.iter().enumerate() {
                let frame = reader.next().await.unwrap().expect("a frame");
                let Message::Request(Request::Write { data: got, lba, .. }) = frame.message else {
                    panic!("not a write");
                };
                assert_eq!(lba, Lba(i as u64));
                assert_eq!(&got, data, "frame {i}, pieces of {piece}");
                if got.len() >= ALIGNED_FRAME_MIN_BYTES {
                    assert!(
                        (got.as_ptr() as usize).is_multiple_of(DISK_ALIGN),
                        "frame {i} of {} bytes, pieces of {piece}: data not aligned",
                        got.len()
                    );
                }
            }
            writer.await.unwrap();
            assert!(reader.next().await.unwrap().is_none());
        }
    }
}
