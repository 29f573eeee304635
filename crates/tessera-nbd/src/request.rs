//! Transmission requests: what a request header asks for, whether it is
//! allowed, and which NBD error a device failure becomes.
//!
//! Owns: the checks every request passes before it reaches the device
//! (command known, flags valid for the command, length within the payload
//! limit, range inside the export, export writable), the mapping from
//! [`BlockError`] to NBD error values, and turning a device's allocation map
//! into `base:allocation` descriptors.
//! Must not touch: sockets or devices; pure, so the fuzz target drives it.
//! Invariants: a rejected request never reaches the device; a write past the
//! end is `ENOSPC` and any other request past the end `EINVAL` (as nbdkit and
//! the protocol's error section say); descriptors never reach past the
//! requested range and never have length zero.

use crate::proto::{cmd, cmd_flags, errno, state, RequestHeader, MAX_PAYLOAD_BYTES};
use tessera_blockdev::{BlockError, Extent, ExtentKind, ZeroMode};

/// Most `base:allocation` descriptors in one reply; bounds the reply to
/// 512 KiB however fragmented the device is.
pub const MAX_DESCRIPTORS_PER_REPLY: usize = 64 * 1024;

/// A request that passed its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Read `len` bytes at `offset`.
    Read {
        /// First byte.
        offset: u64,
        /// Length.
        len: u32,
    },
    /// Write the payload at `offset`.
    Write {
        /// First byte.
        offset: u64,
        /// Length of the payload.
        len: u32,
        /// Durable before the reply.
        fua: bool,
    },
    /// Make every acknowledged write durable.
    Flush,
    /// Deallocate a range.
    Trim {
        /// First byte.
        offset: u64,
        /// Length.
        len: u32,
        /// Durable before the reply.
        fua: bool,
    },
    /// Prefetch a range.
    Cache {
        /// First byte.
        offset: u64,
        /// Length.
        len: u32,
    },
    /// Make a range read as zeros.
    WriteZeroes {
        /// First byte.
        offset: u64,
        /// Length.
        len: u32,
        /// Durable before the reply.
        fua: bool,
        /// Whether the range may become a hole.
        mode: ZeroMode,
        /// The client wants a quick failure rather than a slow zeroing.
        fast: bool,
    },
    /// Report the allocation of a range.
    BlockStatus {
        /// First byte.
        offset: u64,
        /// Length.
        len: u32,
        /// One extent is enough.
        req_one: bool,
        /// Context id of `base:allocation`.
        context: u32,
    },
    /// End the session once in-flight requests are answered.
    Disconnect,
}

/// What the request checks need to know about the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportView {
    /// Export size in bytes.
    pub size: u64,
    /// Writes are refused.
    pub read_only: bool,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// `base:allocation` context id, if negotiated.
    pub allocation_context: Option<u32>,
}

/// A request refused before it reached the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// NBD error value.
    pub errno: u32,
    /// What was wrong, for the error chunk and the log.
    pub message: String,
}

fn reject(errno: u32, message: String) -> Rejection {
    Rejection { errno, message }
}

/// Name of a command type, for messages.
pub fn command_name(command: u16) -> &'static str {
    match command {
        cmd::READ => "read",
        cmd::WRITE => "write",
        cmd::DISC => "disconnect",
        cmd::FLUSH => "flush",
        cmd::TRIM => "trim",
        cmd::CACHE => "cache",
        cmd::WRITE_ZEROES => "write zeroes",
        cmd::BLOCK_STATUS => "block status",
        _ => "unknown command",
    }
}

/// Checks a request header against the session and turns it into a command.
pub fn classify(h: &RequestHeader, view: &ExportView) -> Result<Command, Rejection> {
    let name = command_name(h.command);
    let allowed = match h.command {
        cmd::READ if view.structured => cmd_flags::FUA | cmd_flags::DF,
        cmd::READ | cmd::WRITE | cmd::FLUSH | cmd::TRIM | cmd::CACHE | cmd::DISC => cmd_flags::FUA,
        cmd::WRITE_ZEROES => cmd_flags::FUA | cmd_flags::NO_HOLE | cmd_flags::FAST_ZERO,
        cmd::BLOCK_STATUS => cmd_flags::FUA | cmd_flags::REQ_ONE,
        other => return Err(reject(errno::EINVAL, format!("unknown command {other}"))),
    };
    if h.flags & !allowed != 0 {
        return Err(reject(
            errno::EINVAL,
            format!("flags {:#x} are not valid for {name}", h.flags & !allowed),
        ));
    }
    let fua = h.flags & cmd_flags::FUA != 0;
    let writes = matches!(h.command, cmd::WRITE | cmd::TRIM | cmd::WRITE_ZEROES);
    if writes && view.read_only {
        return Err(reject(
            errno::EPERM,
            format!("{name} refused: the export is read-only"),
        ));
    }
    if matches!(h.command, cmd::READ | cmd::WRITE) && h.len > MAX_PAYLOAD_BYTES {
        return Err(reject(
            errno::EINVAL,
            format!(
                "{name} of {} bytes exceeds the {MAX_PAYLOAD_BYTES}-byte limit",
                h.len
            ),
        ));
    }
    let ranged = !matches!(h.command, cmd::FLUSH | cmd::DISC);
    if ranged {
        let past_end = h
            .offset
            .checked_add(h.len as u64)
            .is_none_or(|end| end > view.size);
        if past_end {
            let e = if matches!(h.command, cmd::WRITE | cmd::WRITE_ZEROES) {
                errno::ENOSPC
            } else {
                errno::EINVAL
            };
            return Err(reject(
                e,
                format!(
                    "{name} of {} bytes at offset {} reaches past the end of the {}-byte export",
                    h.len, h.offset, view.size
                ),
            ));
        }
    }
    let (offset, len) = (h.offset, h.len);
    Ok(match h.command {
        cmd::READ => Command::Read { offset, len },
        cmd::WRITE => Command::Write { offset, len, fua },
        cmd::FLUSH => Command::Flush,
        cmd::DISC => Command::Disconnect,
        cmd::TRIM => Command::Trim { offset, len, fua },
        cmd::CACHE => Command::Cache { offset, len },
        cmd::WRITE_ZEROES => Command::WriteZeroes {
            offset,
            len,
            fua,
            mode: if h.flags & cmd_flags::NO_HOLE != 0 {
                ZeroMode::KeepAllocated
            } else {
                ZeroMode::MayUnmap
            },
            fast: h.flags & cmd_flags::FAST_ZERO != 0,
        },
        _ => {
            let Some(context) = view.allocation_context.filter(|_| view.structured) else {
                return Err(reject(
                    errno::EINVAL,
                    "block status needs the base:allocation context negotiated".into(),
                ));
            };
            if len == 0 {
                return Err(reject(errno::EINVAL, "block status of zero bytes".into()));
            }
            Command::BlockStatus {
                offset,
                len,
                req_one: h.flags & cmd_flags::REQ_ONE != 0,
                context,
            }
        }
    })
}

/// The kind of operation a device error came from; decides how
/// [`BlockError::OutOfRange`] is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// READ, CACHE, BLOCK_STATUS.
    Read,
    /// WRITE, WRITE_ZEROES.
    Write,
    /// TRIM.
    Trim,
    /// FLUSH.
    Flush,
}

/// The NBD error value for a device error.
pub fn errno_for(op: OpKind, err: &BlockError, shutting_down: bool) -> u32 {
    match err {
        BlockError::OutOfRange { .. } => match op {
            OpKind::Write => errno::ENOSPC,
            _ => errno::EINVAL,
        },
        BlockError::NoSpace { .. } => errno::ENOSPC,
        BlockError::ReadOnly => errno::EPERM,
        BlockError::Checksum { .. }
        | BlockError::Io { .. }
        | BlockError::OutcomeUnknown { .. }
        | BlockError::Miscompare { .. } => errno::EIO,
        BlockError::Invalid { .. } => errno::EINVAL,
        BlockError::Unavailable { .. } => {
            if shutting_down {
                errno::ESHUTDOWN
            } else {
                errno::EIO
            }
        }
    }
}

/// The device offset a read error names, when it lies inside the request
/// (then it goes out as `NBD_REPLY_TYPE_ERROR_OFFSET`).
pub fn error_offset(err: &BlockError, offset: u64, len: u32) -> Option<u64> {
    let at = match err {
        BlockError::Checksum { offset } | BlockError::Io { offset, .. } => *offset,
        _ => return None,
    };
    (at >= offset && at < offset + len as u64).then_some(at)
}

/// `base:allocation` flags of an extent kind.
pub fn allocation_flags(kind: ExtentKind) -> u32 {
    match kind {
        ExtentKind::Hole => state::HOLE | state::ZERO,
        ExtentKind::Zero => state::ZERO,
        ExtentKind::Data => 0,
    }
}

/// Turns a device's allocation map of `[offset, offset+len)` into
/// descriptors: clipped to the range, in order, merged where flags repeat,
/// at most `max` of them. A map that does not start at `offset` or has a gap
/// ends the list there; if nothing usable remains the whole range is
/// reported as allocated data (status 0), which the protocol always allows.
pub fn descriptors(extents: &[Extent], offset: u64, len: u32, max: usize) -> Vec<(u32, u32)> {
    let end = offset + len as u64;
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut pos = offset;
    for e in extents {
        if pos >= end || out.len() > max {
            break;
        }
        let e_end = e.offset.saturating_add(e.len);
        if e.offset > pos || e_end <= pos {
            break;
        }
        let take = (e_end.min(end) - pos) as u32;
        let flags = allocation_flags(e.kind);
        match out.last_mut() {
            Some((l, f)) if *f == flags => *l += take,
            _ => out.push((take, flags)),
        }
        pos += take as u64;
    }
    out.truncate(max.max(1));
    if out.is_empty() {
        out.push((len, 0));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn view() -> ExportView {
        ExportView {
            size: 1 << 20,
            read_only: false,
            structured: true,
            allocation_context: Some(1),
        }
    }

    fn header(command: u16, flags: u16, offset: u64, len: u32) -> RequestHeader {
        RequestHeader {
            flags,
            command,
            cookie: 1,
            offset,
            len,
        }
    }

    #[test]
    fn past_the_end_is_enospc_for_writes_and_einval_otherwise() {
        let v = view();
        for (command, expected) in [
            (cmd::WRITE, errno::ENOSPC),
            (cmd::WRITE_ZEROES, errno::ENOSPC),
            (cmd::READ, errno::EINVAL),
            (cmd::TRIM, errno::EINVAL),
            (cmd::CACHE, errno::EINVAL),
            (cmd::BLOCK_STATUS, errno::EINVAL),
        ] {
            let err = classify(&header(command, 0, (1 << 20) - 512, 1024), &v).unwrap_err();
            assert_eq!(err.errno, expected, "{}", command_name(command));
        }
        let err = classify(&header(cmd::READ, 0, u64::MAX, 1), &v).unwrap_err();
        assert_eq!(err.errno, errno::EINVAL);
    }

    #[test]
    fn read_only_export_refuses_every_write_with_eperm() {
        let v = ExportView {
            read_only: true,
            ..view()
        };
        for command in [cmd::WRITE, cmd::TRIM, cmd::WRITE_ZEROES] {
            assert_eq!(
                classify(&header(command, 0, 0, 512), &v).unwrap_err().errno,
                errno::EPERM
            );
        }
        assert!(classify(&header(cmd::READ, 0, 0, 512), &v).is_ok());
    }

    #[test]
    fn flags_are_checked_per_command() {
        let v = view();
        assert!(classify(&header(cmd::WRITE, cmd_flags::NO_HOLE, 0, 512), &v).is_err());
        assert!(classify(&header(cmd::WRITE_ZEROES, cmd_flags::NO_HOLE, 0, 512), &v).is_ok());
        assert!(classify(&header(cmd::READ, cmd_flags::DF, 0, 512), &v).is_ok());
        let simple = ExportView {
            structured: false,
            allocation_context: None,
            ..v
        };
        assert!(classify(&header(cmd::READ, cmd_flags::DF, 0, 512), &simple).is_err());
        assert!(classify(&header(cmd::BLOCK_STATUS, 0, 0, 512), &simple).is_err());
        assert_eq!(
            classify(&header(99, 0, 0, 0), &v).unwrap_err().errno,
            errno::EINVAL
        );
    }

    #[test]
    fn error_mapping_follows_the_table() {
        let range = BlockError::OutOfRange {
            op: "x",
            offset: 0,
            len: 1,
            size_bytes: 0,
        };
        assert_eq!(errno_for(OpKind::Read, &range, false), errno::EINVAL);
        assert_eq!(errno_for(OpKind::Write, &range, false), errno::ENOSPC);
        let full = BlockError::NoSpace { offset: 0, len: 1 };
        assert_eq!(errno_for(OpKind::Write, &full, false), errno::ENOSPC);
        assert_eq!(
            errno_for(OpKind::Write, &BlockError::ReadOnly, false),
            errno::EPERM
        );
        assert_eq!(
            errno_for(OpKind::Read, &BlockError::Checksum { offset: 0 }, false),
            errno::EIO
        );
        let gone = BlockError::Unavailable { reason: "x".into() };
        assert_eq!(errno_for(OpKind::Read, &gone, false), errno::EIO);
        assert_eq!(errno_for(OpKind::Read, &gone, true), errno::ESHUTDOWN);
        let bad = BlockError::Invalid { reason: "x".into() };
        assert_eq!(errno_for(OpKind::Flush, &bad, false), errno::EINVAL);
    }

    proptest! {
        /// Descriptors cover a prefix of the range, never exceed it, never
        /// have length zero and respect the count limit.
        #[test]
        fn descriptors_stay_inside_the_request(
            kinds in proptest::collection::vec((0u8..3, 1u64..20_000), 1..40),
            start in 0u64..10_000,
            len in 1u32..200_000,
            max in 1usize..8,
        ) {
            let mut extents = Vec::new();
            let mut pos = 0;
            for (k, l) in kinds {
                let kind = [ExtentKind::Data, ExtentKind::Zero, ExtentKind::Hole][k as usize];
                extents.push(Extent { offset: pos, len: l, kind });
                pos += l;
            }
            let offset = start.min(pos - 1);
            let relevant: Vec<Extent> = extents.into_iter().filter(|e| e.offset + e.len > offset).collect();
            let d = descriptors(&relevant, offset, len, max);
            prop_assert!(!d.is_empty());
            prop_assert!(d.len() <= max);
            prop_assert!(d.iter().all(|&(l, _)| l > 0));
            let total: u64 = d.iter().map(|&(l, _)| l as u64).sum();
            prop_assert!(total <= len as u64);
        }

        /// No header makes classification panic, and an accepted request
        /// always lies inside the export.
        #[test]
        fn classification_is_total(flags: u16, command in 0u16..10, offset: u64, len: u32, ro: bool, structured: bool) {
            let v = ExportView { size: 1 << 30, read_only: ro, structured, allocation_context: structured.then_some(1) };
            let h = header(command, flags, offset, len);
            if let Ok(c) = classify(&h, &v) {
                if !matches!(c, Command::Flush | Command::Disconnect) {
                    prop_assert!(offset + len as u64 <= v.size);
                }
            }
        }
    }
}
