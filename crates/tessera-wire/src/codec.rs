//! Binary encoding of message payloads (wire v1).
//!
//! Owns: the field-by-field layout of every message. Integers are little
//! endian; names are a one-byte length plus bytes; texts a two-byte length
//! plus UTF-8; data buffers and lists a four-byte length (or count) plus
//! their contents.
//!
//! Invariants: the reader checks every length against the bytes left before
//! touching them (so a forged count cannot make it allocate), slices data
//! buffers out of the received payload instead of copying them, and refuses
//! trailing bytes. The writer copies small fields into one buffer and hands
//! data buffers of [`ZERO_COPY_MIN_BYTES`] or more on as their own chunks.

use bytes::{BufMut, Bytes, BytesMut};
use tessera_types::{ComponentId, Epoch, HostId, Lba, NameError, VolumeId};

use crate::message::{ComponentRef, Extent, ExtentKind, Message, MessageKind, Request, Response};
use crate::{VersionRange, WireError, WireErrorKind, WireVersion, ERROR_MESSAGE_BYTES_MAX};

/// Data buffers at least this long are passed to the socket by reference
/// rather than copied into the frame; below it one copy costs less than an
/// extra chunk in the vectored write.
pub(crate) const ZERO_COPY_MIN_BYTES: usize = 1024;

/// Bytes one encoded extent takes: offset, length, kind.
const EXTENT_BYTES: usize = 8 + 8 + 1;
/// Bytes one encoded range takes: first block, block count.
const RANGE_BYTES: usize = 8 + 8;

/// Accumulates a payload as a list of chunks.
pub(crate) struct PayloadWriter {
    chunks: Vec<Bytes>,
    current: BytesMut,
    len: usize,
}

impl PayloadWriter {
    pub(crate) fn new() -> PayloadWriter {
        PayloadWriter {
            chunks: Vec::new(),
            current: BytesMut::with_capacity(64),
            len: 0,
        }
    }

    fn u8(&mut self, v: u8) {
        self.current.put_u8(v);
        self.len += 1;
    }

    fn u16(&mut self, v: u16) {
        self.current.put_u16_le(v);
        self.len += 2;
    }

    fn u32(&mut self, v: u32) {
        self.current.put_u32_le(v);
        self.len += 4;
    }

    fn u64(&mut self, v: u64) {
        self.current.put_u64_le(v);
        self.len += 8;
    }

    fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }

    /// Names are at most [`tessera_types::NAME_BYTES_MAX`] bytes, so one
    /// length byte suffices.
    fn name(&mut self, name: &str) {
        let bytes = name.as_bytes();
        let len = bytes.len().min(u8::MAX as usize);
        self.u8(len as u8);
        self.current.put_slice(&bytes[..len]);
        self.len += len;
    }

    fn text(&mut self, text: &str) {
        let cut = cut_at_char_boundary(text, ERROR_MESSAGE_BYTES_MAX);
        self.u16(cut.len() as u16);
        self.current.put_slice(cut.as_bytes());
        self.len += cut.len();
    }

    /// A data buffer. Buffers longer than `u32::MAX` are refused by the frame
    /// limit before they get here.
    fn data(&mut self, data: &Bytes) {
        self.u32(data.len() as u32);
        if data.len() >= ZERO_COPY_MIN_BYTES {
            if !self.current.is_empty() {
                self.chunks.push(self.current.split().freeze());
            }
            self.chunks.push(data.clone());
        } else {
            self.current.put_slice(data);
        }
        self.len += data.len();
    }

    fn component(&mut self, c: &ComponentRef) {
        self.name(c.volume.as_str());
        self.u64(c.id.0);
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn finish(mut self) -> Vec<Bytes> {
        if !self.current.is_empty() {
            self.chunks.push(self.current.split().freeze());
        }
        self.chunks
    }
}

fn cut_at_char_boundary(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Reads fields from one received payload.
pub(crate) struct PayloadReader {
    payload: Bytes,
    pos: usize,
    kind: &'static str,
}

impl PayloadReader {
    pub(crate) fn new(kind: MessageKind, payload: Bytes) -> PayloadReader {
        PayloadReader {
            payload,
            pos: 0,
            kind: kind.name(),
        }
    }

    fn left(&self) -> usize {
        self.payload.len() - self.pos
    }

    fn take(&mut self, field: &'static str, n: u64) -> Result<Bytes, WireError> {
        if n > self.left() as u64 {
            return Err(WireError::Truncated {
                kind: self.kind,
                field,
                need: n,
                have: self.left(),
            });
        }
        let n = n as usize;
        let out = self.payload.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], WireError> {
        let bytes = self.take(field, N as u64)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&bytes);
        Ok(out)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, WireError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    fn bool(&mut self, field: &'static str) -> Result<bool, WireError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(self.bad_tag(field, value as u64)),
        }
    }

    fn bad_tag(&self, field: &'static str, value: u64) -> WireError {
        WireError::BadTag {
            kind: self.kind,
            field,
            value,
        }
    }

    fn string(&mut self, field: &'static str, len: u64) -> Result<String, WireError> {
        let bytes = self.take(field, len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| WireError::BadText {
            kind: self.kind,
            field,
        })
    }

    fn name<T>(
        &mut self,
        field: &'static str,
        make: fn(String) -> Result<T, NameError>,
    ) -> Result<T, WireError> {
        let len = self.u8(field)?;
        let text = self.string(field, len as u64)?;
        make(text).map_err(|source| WireError::BadName {
            kind: self.kind,
            field,
            source,
        })
    }

    fn host(&mut self, field: &'static str) -> Result<HostId, WireError> {
        self.name(field, HostId::new)
    }

    fn volume(&mut self, field: &'static str) -> Result<VolumeId, WireError> {
        self.name(field, VolumeId::new)
    }

    fn text(&mut self, field: &'static str) -> Result<String, WireError> {
        let len = self.u16(field)? as usize;
        if len > ERROR_MESSAGE_BYTES_MAX {
            return Err(WireError::FieldTooLong {
                kind: self.kind,
                field,
                len,
                max: ERROR_MESSAGE_BYTES_MAX,
            });
        }
        self.string(field, len as u64)
    }

    fn data(&mut self, field: &'static str) -> Result<Bytes, WireError> {
        let len = self.u32(field)?;
        self.take(field, len as u64)
    }

    fn component(&mut self) -> Result<ComponentRef, WireError> {
        let volume = self.volume("component.volume")?;
        let id = ComponentId(self.u64("component.id")?);
        Ok(ComponentRef { volume, id })
    }

    fn lba(&mut self, field: &'static str) -> Result<Lba, WireError> {
        Ok(Lba(self.u64(field)?))
    }

    fn epoch(&mut self, field: &'static str) -> Result<Epoch, WireError> {
        Ok(Epoch(self.u64(field)?))
    }

    /// A list count, checked against the bytes left so that a forged count
    /// cannot make the reader reserve memory the payload does not back.
    fn count(&mut self, field: &'static str, item_bytes: usize) -> Result<usize, WireError> {
        let count = self.u32(field)? as u64;
        let need = count * item_bytes as u64;
        if need > self.left() as u64 {
            return Err(WireError::Truncated {
                kind: self.kind,
                field,
                need,
                have: self.left(),
            });
        }
        Ok(count as usize)
    }

    fn finish(self) -> Result<(), WireError> {
        if self.left() != 0 {
            return Err(WireError::TrailingBytes {
                kind: self.kind,
                extra: self.left(),
            });
        }
        Ok(())
    }
}

/// Writes the payload of `message` in wire v1 layout.
pub(crate) fn encode_payload(message: &Message, w: &mut PayloadWriter) -> Result<(), WireError> {
    match message {
        Message::Request(request) => encode_request(request, w),
        Message::Response(response) => encode_response(response, w),
    }
}

fn encode_request(request: &Request, w: &mut PayloadWriter) -> Result<(), WireError> {
    match request {
        Request::Hello { versions, host } => {
            w.u16(versions.min);
            w.u16(versions.max);
            w.name(host.as_str());
        }
        Request::Ping => {}
        Request::CreateComponent {
            component,
            size_bytes,
            reserve_bytes,
        } => {
            w.component(component);
            w.u64(*size_bytes);
            w.u64(*reserve_bytes);
        }
        Request::DeleteComponent { component }
        | Request::Flush { component }
        | Request::ComponentStatus { component }
        | Request::HeldSpace { component } => w.component(component),
        Request::ResizeComponent {
            component,
            size_bytes,
        } => {
            w.component(component);
            w.u64(*size_bytes);
        }
        Request::Write {
            component,
            lba,
            epoch,
            data,
        } => {
            w.component(component);
            w.u64(lba.0);
            w.u64(epoch.0);
            w.data(data);
        }
        Request::Read {
            component,
            lba,
            blocks,
        } => {
            w.component(component);
            w.u64(lba.0);
            w.u32(*blocks);
        }
        Request::Unmap {
            component,
            lba,
            blocks,
            epoch,
        }
        | Request::WriteZeroes {
            component,
            lba,
            blocks,
            epoch,
        } => {
            w.component(component);
            w.u64(lba.0);
            w.u64(*blocks);
            w.u64(epoch.0);
        }
        Request::Fence { component, epoch } => {
            w.component(component);
            w.u64(epoch.0);
        }
        Request::CloneBlocks {
            source,
            source_lba,
            target,
            target_lba,
            blocks,
            epoch,
        } => {
            w.component(source);
            w.u64(source_lba.0);
            w.component(target);
            w.u64(target_lba.0);
            w.u64(*blocks);
            w.u64(epoch.0);
        }
        Request::SnapshotComponent {
            component,
            snapshot: made,
            epoch,
        }
        | Request::CloneSnapshot {
            snapshot: component,
            clone: made,
            epoch,
        } => {
            w.component(component);
            w.u64(made.0);
            w.u64(epoch.0);
        }
        Request::Allocated {
            component,
            from,
            blocks,
        } => {
            w.component(component);
            w.u64(from.0);
            w.u64(*blocks);
        }
        Request::Changed {
            component,
            base,
            from,
            blocks,
        } => {
            w.component(component);
            w.u64(base.0);
            w.u64(from.0);
            w.u64(*blocks);
        }
        Request::VolumeRead {
            volume,
            offset,
            len,
        } => {
            w.name(volume.as_str());
            w.u64(*offset);
            w.u32(*len);
        }
        Request::VolumeWrite {
            volume,
            offset,
            data,
            fua,
        } => {
            w.name(volume.as_str());
            w.u64(*offset);
            w.bool(*fua);
            w.data(data);
        }
        Request::VolumeFlush { volume } => w.name(volume.as_str()),
        Request::VolumeRepairCopy {
            volume,
            component,
            lba,
            blocks,
        } => {
            w.name(volume.as_str());
            w.u64(component.0);
            w.u64(lba.0);
            w.u32(*blocks);
        }
        Request::VolumeSnapshot {
            volume,
            name,
            snapshot,
            created_ms,
        } => {
            w.name(volume.as_str());
            w.text(name);
            w.u64(*snapshot);
            w.u64(*created_ms);
        }
        Request::VolumeHoldWrites {
            volume,
            hold,
            ttl_ms,
        } => {
            w.name(volume.as_str());
            w.u64(*hold);
            w.u64(*ttl_ms);
        }
        Request::VolumeReleaseWrites { volume, hold } => {
            w.name(volume.as_str());
            w.u64(*hold);
        }
        Request::VolumeSnapshotHeld {
            volume,
            hold,
            name,
            snapshot,
            created_ms,
        } => {
            w.name(volume.as_str());
            w.u64(*hold);
            w.text(name);
            w.u64(*snapshot);
            w.u64(*created_ms);
        }
        Request::VolumeUnmap {
            volume,
            offset,
            len,
        }
        | Request::VolumeBlockStatus {
            volume,
            offset,
            len,
        } => {
            w.name(volume.as_str());
            w.u64(*offset);
            w.u64(*len);
        }
        Request::VolumeWriteZeroes {
            volume,
            offset,
            len,
            may_unmap,
        } => {
            w.name(volume.as_str());
            w.u64(*offset);
            w.u64(*len);
            w.bool(*may_unmap);
        }
        Request::VolumeCompareAndWrite {
            volume,
            offset,
            expected,
            new,
        } => {
            w.name(volume.as_str());
            w.u64(*offset);
            w.data(expected);
            w.data(new);
        }
    }
    Ok(())
}

fn encode_response(response: &Response, w: &mut PayloadWriter) -> Result<(), WireError> {
    match response {
        Response::HelloOk { version, host } => {
            w.u16(version.number());
            w.name(host.as_str());
        }
        Response::Pong | Response::Ok => {}
        Response::Data(data) => w.data(data),
        Response::Ranges(ranges) => {
            w.u32(list_len(MessageKind::Ranges, "ranges", ranges.len())?);
            for (lba, blocks) in ranges {
                w.u64(lba.0);
                w.u64(*blocks);
            }
        }
        Response::Extents(extents) => {
            w.u32(list_len(MessageKind::Extents, "extents", extents.len())?);
            for e in extents {
                w.u64(e.offset);
                w.u64(e.len);
                w.u8(match e.kind {
                    ExtentKind::Data => 0,
                    ExtentKind::Zero => 1,
                    ExtentKind::Hole => 2,
                });
            }
        }
        Response::Status {
            size_bytes,
            epoch,
            allocated_bytes,
            physical_bytes,
        } => {
            w.u64(*size_bytes);
            w.u64(epoch.0);
            w.u64(*allocated_bytes);
            w.u64(*physical_bytes);
        }
        Response::Held {
            alone_bytes,
            shared_bytes,
        } => {
            w.u64(*alone_bytes);
            w.u64(*shared_bytes);
        }
        Response::Error { kind, message } => {
            encode_error_kind(kind, w);
            w.text(message);
        }
    }
    Ok(())
}

fn list_len(kind: MessageKind, field: &'static str, len: usize) -> Result<u32, WireError> {
    u32::try_from(len).map_err(|_| WireError::FieldTooLong {
        kind: kind.name(),
        field,
        len,
        max: u32::MAX as usize,
    })
}

/// Error kinds: a tag byte, then the kind's argument (if any) as a u64 or,
/// for version ranges, two u16.
fn encode_error_kind(kind: &WireErrorKind, w: &mut PayloadWriter) {
    match kind {
        WireErrorKind::Invalid => w.u8(0),
        WireErrorKind::StaleEpoch { highest } => {
            w.u8(1);
            w.u64(highest.0);
        }
        WireErrorKind::Checksum { lba } => {
            w.u8(2);
            w.u64(lba.0);
        }
        WireErrorKind::NoSpace => w.u8(3),
        WireErrorKind::NotFound => w.u8(4),
        WireErrorKind::OutOfRange => w.u8(5),
        WireErrorKind::Miscompare { offset } => {
            w.u8(6);
            w.u64(*offset);
        }
        WireErrorKind::Io => w.u8(7),
        WireErrorKind::Unavailable => w.u8(8),
        WireErrorKind::NotOwner => w.u8(9),
        WireErrorKind::ReadOnly => w.u8(10),
        WireErrorKind::NoCommonVersion { supported } => {
            w.u8(11);
            w.u16(supported.min);
            w.u16(supported.max);
        }
        WireErrorKind::NotColocated => w.u8(12),
    }
}

fn decode_error_kind(r: &mut PayloadReader) -> Result<WireErrorKind, WireError> {
    let tag = r.u8("error.kind")?;
    Ok(match tag {
        0 => WireErrorKind::Invalid,
        1 => WireErrorKind::StaleEpoch {
            highest: r.epoch("error.highest")?,
        },
        2 => WireErrorKind::Checksum {
            lba: r.lba("error.lba")?,
        },
        3 => WireErrorKind::NoSpace,
        4 => WireErrorKind::NotFound,
        5 => WireErrorKind::OutOfRange,
        6 => WireErrorKind::Miscompare {
            offset: r.u64("error.offset")?,
        },
        7 => WireErrorKind::Io,
        8 => WireErrorKind::Unavailable,
        9 => WireErrorKind::NotOwner,
        10 => WireErrorKind::ReadOnly,
        11 => WireErrorKind::NoCommonVersion {
            supported: VersionRange {
                min: r.u16("error.supported.min")?,
                max: r.u16("error.supported.max")?,
            },
        },
        12 => WireErrorKind::NotColocated,
        other => return Err(r.bad_tag("error.kind", other as u64)),
    })
}

/// Reads the payload of a frame of `kind`. The handshake kinds decode the
/// same in every version; the others only in versions this build speaks
/// that carry the kind.
pub(crate) fn decode_payload(
    kind: MessageKind,
    version: u16,
    payload: Bytes,
) -> Result<Message, WireError> {
    if !kind.is_handshake() {
        check_kind_in_version(kind, WireVersion::from_number(version)?)?;
    }
    let mut r = PayloadReader::new(kind, payload);
    let message = if kind.is_request() {
        Message::Request(decode_request(kind, &mut r)?)
    } else {
        Message::Response(decode_response(kind, &mut r)?)
    };
    r.finish()?;
    Ok(message)
}

/// Refuses a kind newer than the connection's version.
pub(crate) fn check_kind_in_version(
    kind: MessageKind,
    version: WireVersion,
) -> Result<(), WireError> {
    if kind.since() > version {
        return Err(WireError::KindNotInVersion {
            kind: kind.name(),
            version: version.number(),
            since: kind.since().number(),
        });
    }
    Ok(())
}

fn decode_request(kind: MessageKind, r: &mut PayloadReader) -> Result<Request, WireError> {
    Ok(match kind {
        MessageKind::Hello => Request::Hello {
            versions: VersionRange {
                min: r.u16("versions.min")?,
                max: r.u16("versions.max")?,
            },
            host: r.host("host")?,
        },
        MessageKind::Ping => Request::Ping,
        MessageKind::CreateComponent => Request::CreateComponent {
            component: r.component()?,
            size_bytes: r.u64("size_bytes")?,
            reserve_bytes: r.u64("reserve_bytes")?,
        },
        MessageKind::DeleteComponent => Request::DeleteComponent {
            component: r.component()?,
        },
        MessageKind::ResizeComponent => Request::ResizeComponent {
            component: r.component()?,
            size_bytes: r.u64("size_bytes")?,
        },
        MessageKind::Write => Request::Write {
            component: r.component()?,
            lba: r.lba("lba")?,
            epoch: r.epoch("epoch")?,
            data: r.data("data")?,
        },
        MessageKind::Read => Request::Read {
            component: r.component()?,
            lba: r.lba("lba")?,
            blocks: r.u32("blocks")?,
        },
        MessageKind::Unmap => Request::Unmap {
            component: r.component()?,
            lba: r.lba("lba")?,
            blocks: r.u64("blocks")?,
            epoch: r.epoch("epoch")?,
        },
        MessageKind::WriteZeroes => Request::WriteZeroes {
            component: r.component()?,
            lba: r.lba("lba")?,
            blocks: r.u64("blocks")?,
            epoch: r.epoch("epoch")?,
        },
        MessageKind::Flush => Request::Flush {
            component: r.component()?,
        },
        MessageKind::Fence => Request::Fence {
            component: r.component()?,
            epoch: r.epoch("epoch")?,
        },
        MessageKind::Allocated => Request::Allocated {
            component: r.component()?,
            from: r.lba("from")?,
            blocks: r.u64("blocks")?,
        },
        MessageKind::Changed => Request::Changed {
            component: r.component()?,
            base: ComponentId(r.u64("base")?),
            from: r.lba("from")?,
            blocks: r.u64("blocks")?,
        },
        MessageKind::ComponentStatus => Request::ComponentStatus {
            component: r.component()?,
        },
        MessageKind::HeldSpace => Request::HeldSpace {
            component: r.component()?,
        },
        MessageKind::CloneBlocks => Request::CloneBlocks {
            source: r.component()?,
            source_lba: r.lba("source_lba")?,
            target: r.component()?,
            target_lba: r.lba("target_lba")?,
            blocks: r.u64("blocks")?,
            epoch: r.epoch("epoch")?,
        },
        MessageKind::SnapshotComponent => Request::SnapshotComponent {
            component: r.component()?,
            snapshot: ComponentId(r.u64("snapshot")?),
            epoch: r.epoch("epoch")?,
        },
        MessageKind::CloneSnapshot => Request::CloneSnapshot {
            snapshot: r.component()?,
            clone: ComponentId(r.u64("clone")?),
            epoch: r.epoch("epoch")?,
        },
        MessageKind::VolumeRead => Request::VolumeRead {
            volume: r.volume("volume")?,
            offset: r.u64("offset")?,
            len: r.u32("len")?,
        },
        MessageKind::VolumeWrite => Request::VolumeWrite {
            volume: r.volume("volume")?,
            offset: r.u64("offset")?,
            fua: r.bool("fua")?,
            data: r.data("data")?,
        },
        MessageKind::VolumeFlush => Request::VolumeFlush {
            volume: r.volume("volume")?,
        },
        MessageKind::VolumeUnmap => Request::VolumeUnmap {
            volume: r.volume("volume")?,
            offset: r.u64("offset")?,
            len: r.u64("len")?,
        },
        MessageKind::VolumeWriteZeroes => Request::VolumeWriteZeroes {
            volume: r.volume("volume")?,
            offset: r.u64("offset")?,
            len: r.u64("len")?,
            may_unmap: r.bool("may_unmap")?,
        },
        MessageKind::VolumeCompareAndWrite => Request::VolumeCompareAndWrite {
            volume: r.volume("volume")?,
            offset: r.u64("offset")?,
            expected: r.data("expected")?,
            new: r.data("new")?,
        },
        MessageKind::VolumeBlockStatus => Request::VolumeBlockStatus {
            volume: r.volume("volume")?,
            offset: r.u64("offset")?,
            len: r.u64("len")?,
        },
        MessageKind::VolumeRepairCopy => Request::VolumeRepairCopy {
            volume: r.volume("volume")?,
            component: ComponentId(r.u64("component")?),
            lba: r.lba("lba")?,
            blocks: r.u32("blocks")?,
        },
        MessageKind::VolumeSnapshot => Request::VolumeSnapshot {
            volume: r.volume("volume")?,
            name: r.text("name")?,
            snapshot: r.u64("snapshot")?,
            created_ms: r.u64("created_ms")?,
        },
        MessageKind::VolumeHoldWrites => Request::VolumeHoldWrites {
            volume: r.volume("volume")?,
            hold: r.u64("hold")?,
            ttl_ms: r.u64("ttl_ms")?,
        },
        MessageKind::VolumeReleaseWrites => Request::VolumeReleaseWrites {
            volume: r.volume("volume")?,
            hold: r.u64("hold")?,
        },
        MessageKind::VolumeSnapshotHeld => Request::VolumeSnapshotHeld {
            volume: r.volume("volume")?,
            hold: r.u64("hold")?,
            name: r.text("name")?,
            snapshot: r.u64("snapshot")?,
            created_ms: r.u64("created_ms")?,
        },
        other => {
            return Err(WireError::UnknownKind {
                kind: other.number(),
            })
        }
    })
}

fn decode_response(kind: MessageKind, r: &mut PayloadReader) -> Result<Response, WireError> {
    Ok(match kind {
        MessageKind::HelloOk => Response::HelloOk {
            version: WireVersion::from_number(r.u16("version")?)?,
            host: r.host("host")?,
        },
        MessageKind::Pong => Response::Pong,
        MessageKind::Ok => Response::Ok,
        MessageKind::Data => Response::Data(r.data("data")?),
        MessageKind::Ranges => {
            let count = r.count("ranges", RANGE_BYTES)?;
            let mut ranges = Vec::with_capacity(count);
            for _ in 0..count {
                ranges.push((r.lba("ranges.lba")?, r.u64("ranges.blocks")?));
            }
            Response::Ranges(ranges)
        }
        MessageKind::Extents => {
            let count = r.count("extents", EXTENT_BYTES)?;
            let mut extents = Vec::with_capacity(count);
            for _ in 0..count {
                let offset = r.u64("extents.offset")?;
                let len = r.u64("extents.len")?;
                let kind = match r.u8("extents.kind")? {
                    0 => ExtentKind::Data,
                    1 => ExtentKind::Zero,
                    2 => ExtentKind::Hole,
                    other => return Err(r.bad_tag("extents.kind", other as u64)),
                };
                extents.push(Extent { offset, len, kind });
            }
            Response::Extents(extents)
        }
        MessageKind::Status => Response::Status {
            size_bytes: r.u64("size_bytes")?,
            epoch: r.epoch("epoch")?,
            allocated_bytes: r.u64("allocated_bytes")?,
            physical_bytes: r.u64("physical_bytes")?,
        },
        MessageKind::Held => Response::Held {
            alone_bytes: r.u64("alone_bytes")?,
            shared_bytes: r.u64("shared_bytes")?,
        },
        MessageKind::Error => Response::Error {
            kind: decode_error_kind(r)?,
            message: r.text("message")?,
        },
        other => {
            return Err(WireError::UnknownKind {
                kind: other.number(),
            })
        }
    })
}
