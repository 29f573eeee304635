//! Frame I/O on a byte stream.
//!
//! Owns: writing an encoded frame with vectored writes (one system call for
//! a whole frame in the common case) and reading frames into a buffer that
//! the decoded data buffers share, so a payload is copied only by the kernel.

use std::io::IoSlice;

use bytes::BytesMut;
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
    let chunks: Vec<&[u8]> = frames
        .iter()
        .flat_map(|f| f.chunks().iter().map(|c| &c[..]))
        .filter(|c| !c.is_empty())
        .collect();
    let mut index = 0;
    let mut offset = 0;
    while index < chunks.len() {
        let slices: Vec<IoSlice<'_>> = chunks[index..]
            .iter()
            .take(IO_SLICES_MAX)
            .enumerate()
            .map(|(i, c)| IoSlice::new(if i == 0 { &c[offset..] } else { c }))
            .collect();
        let mut written = writer.write_vectored(&slices).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 && index < chunks.len() {
            let left = chunks[index].len() - offset;
            if written >= left {
                written -= left;
                index += 1;
                offset = 0;
            } else {
                offset += written;
                written = 0;
            }
        }
    }
    writer.flush().await
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
            self.buf.reserve(missing.max(READ_CHUNK_BYTES));
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
