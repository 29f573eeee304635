//! The byte stream of one connection in transmission: a TCP socket, or a
//! TCP socket carrying TLS after `NBD_OPT_STARTTLS`.
//!
//! Owns: moving plaintext in and out of the socket without waiting, the
//! way the transmission loop drives it (wait for readiness, then try).
//! Must not touch: NBD framing; callers see only bytes.
//! Invariants:
//! - plaintext rustls already decrypted counts as readable, so a request
//!   that arrived in the same TLS record as the one before is served without
//!   waiting for the socket;
//! - ciphertext rustls holds for the socket is pushed out before more
//!   plaintext is accepted, and [`Link::wants_write`] says when some still
//!   waits, so no reply stays in a buffer while the loop sleeps;
//! - ciphertext read from the socket ahead of what rustls took also counts
//!   as readable: rustls takes at most 4 KiB per read, so the link reads
//!   the socket in large chunks into an inbox rustls reads from (one
//!   system call per 64 KiB instead of per 4 KiB);
//! - a socket read that filled less than the inbox emptied the socket: the
//!   socket's readiness is dropped then, and once rustls has nothing left
//!   either the read says so, as a plain socket's short read does, so the
//!   loop neither asks the socket again to learn it is empty nor holds its
//!   replies for that;
//! - the cryptography is rustls's; this module only moves its records.

use bytes::BufMut;
use std::io::{self, BufRead, IoSlice, Read, Write};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Ciphertext bytes read from the socket at once.
const TLS_INBOX_BYTES: usize = 64 * 1024;
/// Longest wait for the socket while sending TLS's close_notify.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// The stream of a connection in transmission.
pub(crate) enum Link {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<TlsLink>),
}

/// TLS records over a non-blocking socket, driven by hand.
pub(crate) struct TlsLink {
    tcp: TcpStream,
    tls: rustls::ServerConnection,
    /// Decrypted bytes rustls holds that were not read yet.
    plaintext: usize,
    /// The peer closed (or sent close_notify) and every byte was read.
    eof: bool,
    /// Ciphertext read from the socket that rustls has not taken yet:
    /// `inbox[inbox_start..inbox_end]`.
    inbox: Vec<u8>,
    inbox_start: usize,
    inbox_end: usize,
    /// The last read of the socket found it empty or emptied it.
    socket_dry: bool,
}

/// `io::Read` for rustls: serves the inbox, refilled from the socket
/// (without waiting) when it is empty.
struct InboxRead<'a> {
    tcp: &'a TcpStream,
    inbox: &'a mut [u8],
    start: &'a mut usize,
    end: &'a mut usize,
    dry: &'a mut bool,
}

impl Read for InboxRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if *self.start == *self.end {
            let (tcp, inbox) = (self.tcp, &mut *self.inbox);
            let (n, dry) = match read_socket(tcp, inbox.len(), || tcp.try_read(inbox)) {
                Ok(read) => read,
                Err(e) => {
                    *self.dry = e.kind() == io::ErrorKind::WouldBlock;
                    return Err(e);
                }
            };
            *self.dry = dry;
            *self.start = 0;
            *self.end = n;
        }
        let n = buf.len().min(*self.end - *self.start);
        buf[..n].copy_from_slice(&self.inbox[*self.start..*self.start + n]);
        *self.start += n;
        Ok(n)
    }
}

/// Reads the socket without waiting through `read`, which fills at most
/// `room` bytes; with the bytes read, whether the read emptied the socket.
/// A read that came back short did: it reports `WouldBlock` to the
/// reactor, which forgets the socket's readiness unless an event came
/// meanwhile, as tokio's own reads do, so the socket is waited on again
/// without another system call to find it empty.
fn read_socket(
    tcp: &TcpStream,
    room: usize,
    read: impl FnOnce() -> io::Result<usize>,
) -> io::Result<(usize, bool)> {
    let mut got = None;
    let tried = tcp.try_io(tokio::io::Interest::READABLE, || {
        let n = read()?;
        got = Some(n);
        if n > 0 && n < room {
            Err(io::ErrorKind::WouldBlock.into())
        } else {
            Ok(n)
        }
    });
    match (tried, got) {
        (Ok(n), _) => Ok((n, false)),
        (Err(e), Some(n)) if e.kind() == io::ErrorKind::WouldBlock => Ok((n, true)),
        (Err(e), _) => Err(e),
    }
}

/// `io::Write` over a socket that never waits.
struct TryWrite<'a>(&'a TcpStream);

impl Write for TryWrite<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Link {
    /// TLS continuing on `tcp` with the handshake `tls` finished.
    pub(crate) fn tls(tcp: TcpStream, tls: rustls::ServerConnection) -> Self {
        let mut link = TlsLink {
            tcp,
            tls,
            plaintext: 0,
            eof: false,
            inbox: vec![0; TLS_INBOX_BYTES],
            inbox_start: 0,
            inbox_end: 0,
            socket_dry: false,
        };
        // Requests the client sent right behind the handshake may already
        // be decrypted.
        if let Ok(state) = link.tls.process_new_packets() {
            link.plaintext = state.plaintext_bytes_to_read();
        }
        Link::Tls(Box::new(link))
    }

    /// Waits until a read may make progress.
    pub(crate) async fn readable(&self) -> io::Result<()> {
        match self {
            Link::Plain(tcp) => tcp.readable().await,
            Link::Tls(link)
                if link.plaintext > 0 || link.eof || link.inbox_start < link.inbox_end =>
            {
                Ok(())
            }
            Link::Tls(link) => link.tcp.readable().await,
        }
    }

    /// Waits until the socket takes bytes.
    pub(crate) async fn writable(&self) -> io::Result<()> {
        match self {
            Link::Plain(tcp) => tcp.writable().await,
            Link::Tls(link) => link.tcp.writable().await,
        }
    }

    /// Reads what is there without waiting: `Ok(0)` at the end of the
    /// stream, `WouldBlock` when nothing is. With the bytes read, whether
    /// they were all there was: a socket read that filled less than the
    /// room it was given emptied the socket (over TLS, once rustls and the
    /// inbox are empty too), which is then waited on again without another
    /// system call to find it so ([`read_socket`]).
    pub(crate) fn try_read_buf<B: BufMut>(&mut self, buf: &mut B) -> io::Result<(usize, bool)> {
        match self {
            Link::Plain(tcp) => {
                let room = buf.chunk_mut().len();
                read_socket(tcp, room, || tcp.try_read_buf(buf))
            }
            Link::Tls(link) => link.try_read_buf(buf),
        }
    }

    /// Writes what the socket takes without waiting.
    pub(crate) fn try_write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Link::Plain(tcp) => tcp.try_write_vectored(bufs),
            Link::Tls(link) => link.try_write_vectored(bufs),
        }
    }

    /// Bytes wait in the link for the socket (TLS records already made).
    pub(crate) fn wants_write(&self) -> bool {
        match self {
            Link::Plain(_) => false,
            Link::Tls(link) => link.tls.wants_write(),
        }
    }

    /// Pushes waiting bytes out without waiting; `Ok(true)` when none is
    /// left.
    pub(crate) fn flush_now(&mut self) -> io::Result<bool> {
        match self {
            Link::Plain(_) => Ok(true),
            Link::Tls(link) => link.flush_now(),
        }
    }

    /// Ends the stream cleanly (TLS: close_notify first).
    pub(crate) async fn shutdown(&mut self) {
        match self {
            Link::Plain(tcp) => {
                let _ = tcp.shutdown().await;
            }
            Link::Tls(link) => {
                link.tls.send_close_notify();
                let flushed = tokio::time::timeout(CLOSE_GRACE, async {
                    while !matches!(link.flush_now(), Ok(true) | Err(_)) {
                        if link.tcp.writable().await.is_err() {
                            return;
                        }
                    }
                })
                .await;
                let _ = flushed;
                let _ = link.tcp.shutdown().await;
            }
        }
    }
}

impl TlsLink {
    /// Plaintext into `buf`, straight from rustls's buffers; with it,
    /// whether that was all there was (rustls, the inbox and the socket
    /// are empty).
    fn try_read_buf<B: BufMut>(&mut self, buf: &mut B) -> io::Result<(usize, bool)> {
        loop {
            if self.plaintext > 0 {
                let mut n = 0;
                let mut reader = self.tls.reader();
                // `plaintext` bytes are there: rustls answers `WouldBlock`
                // only past them.
                while n < self.plaintext && buf.has_remaining_mut() {
                    let chunk = match reader.fill_buf() {
                        Ok(chunk) if !chunk.is_empty() => chunk,
                        Ok(_) => break,
                        Err(_) if n > 0 => break,
                        Err(e) => return Err(e),
                    };
                    let take = chunk.len().min(buf.remaining_mut()).min(self.plaintext - n);
                    buf.put_slice(&chunk[..take]);
                    reader.consume(take);
                    n += take;
                }
                self.plaintext -= n.min(self.plaintext);
                let empty =
                    self.plaintext == 0 && self.inbox_start == self.inbox_end && self.socket_dry;
                return Ok((n, empty));
            }
            if self.eof {
                return Ok((0, true));
            }
            let mut inbox = InboxRead {
                tcp: &self.tcp,
                inbox: &mut self.inbox,
                start: &mut self.inbox_start,
                end: &mut self.inbox_end,
                dry: &mut self.socket_dry,
            };
            if self.tls.read_tls(&mut inbox)? == 0 {
                self.eof = true;
                continue;
            }
            let state = self
                .tls
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            self.plaintext = state.plaintext_bytes_to_read();
            if state.peer_has_closed() && self.plaintext == 0 {
                self.eof = true;
            }
            // A key update or an alert may want an answer.
            self.flush_now()?;
        }
    }

    fn try_write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if !self.flush_now()? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = self.tls.writer().write_vectored(bufs)?;
        // What the socket does not take now waits for `writable`.
        self.flush_now()?;
        Ok(n)
    }

    fn flush_now(&mut self) -> io::Result<bool> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut TryWrite(&self.tcp)) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}
