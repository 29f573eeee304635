//! EXTENDED COPY (LID1) parameter lists and RECEIVE COPY RESULTS data.
//!
//! Owns: parsing an EXTENDED COPY parameter list into copy targets
//! (identification descriptors 0xE4) and block-to-block segments (0x02),
//! with the limits the copy manager reports, and the encodings of COPY
//! STATUS, OPERATING PARAMETERS and FAILED SEGMENT DETAILS. Pure; the unit
//! runs the segments through `BlockDevice::copy_from`.
//! Invariant: a list that fails a check copies nothing.

use super::sense::{asc, key, Sense};
use bytes::{BufMut, Bytes, BytesMut};

/// What the copy manager accepts (RECEIVE COPY RESULTS OPERATING
/// PARAMETERS and VPD 0x8F say the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyLimits {
    /// Copy target (CSCD) descriptors per list.
    pub max_target_descriptors: u16,
    /// Segment descriptors per list.
    pub max_segment_descriptors: u16,
    /// Bytes of target plus segment descriptors.
    pub max_descriptor_list_bytes: u32,
    /// Bytes one segment may copy.
    pub max_segment_bytes: u32,
    /// Copies in progress at once.
    pub max_concurrent_copies: u16,
}

impl Default for CopyLimits {
    fn default() -> Self {
        CopyLimits {
            max_target_descriptors: 2,
            max_segment_descriptors: 16,
            max_descriptor_list_bytes: 1024,
            // The block-to-block descriptor counts blocks in 16 bits.
            max_segment_bytes: 65535 * 512,
            max_concurrent_copies: 1,
        }
    }
}

/// Identification descriptor target type code.
pub const IDENTIFICATION_DESCRIPTOR: u8 = 0xE4;
/// Block device to block device segment type code.
pub const BLOCK_TO_BLOCK: u8 = 0x02;
const TARGET_DESCRIPTOR_BYTES: usize = 32;
const HEADER_BYTES: usize = 16;

/// A copy target named by its designator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyTarget {
    /// Designator type (3: NAA).
    pub designator_type: u8,
    /// The designator bytes.
    pub designator: Vec<u8>,
    /// Disk block length the initiator assumes.
    pub block_bytes: u32,
}

/// One block-to-block segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Source target index.
    pub source: u16,
    /// Destination target index.
    pub destination: u16,
    /// Blocks to copy.
    pub blocks: u16,
    /// First source LBA.
    pub source_lba: u64,
    /// First destination LBA.
    pub destination_lba: u64,
}

/// A parsed EXTENDED COPY.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyRequest {
    /// LIST IDENTIFIER.
    pub list_id: u8,
    /// Whether RECEIVE COPY RESULTS may ask about it (LIST ID USAGE 00b or 10b).
    pub keep_status: bool,
    /// Copy targets.
    pub targets: Vec<CopyTarget>,
    /// Segments, in order.
    pub segments: Vec<Segment>,
}

fn u16_at(d: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([d[at], d[at + 1]])
}

fn u32_at(d: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([d[at], d[at + 1], d[at + 2], d[at + 3]])
}

fn u64_at(d: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&d[at..at + 8]);
    u64::from_be_bytes(v)
}

/// COPY ABORTED with an ASC/ASCQ; the command-specific information names
/// the segment.
pub fn copy_aborted(code: (u8, u8), segment: usize) -> Sense {
    Sense::new(key::COPY_ABORTED, code).with_command_specific(segment as u64)
}

/// Parses an EXTENDED COPY parameter list; `Ok(None)` for an empty list
/// (nothing to do).
pub fn parse_extended_copy(
    length: u32,
    data: &[u8],
    limits: &CopyLimits,
) -> Result<Option<CopyRequest>, Sense> {
    let length = length as usize;
    if length == 0 {
        return Ok(None);
    }
    if length < HEADER_BYTES || data.len() < length {
        return Err(Sense::parameter_list_length());
    }
    let d = &data[..length];
    let targets_len = u16_at(d, 2) as usize;
    let segments_len = u32_at(d, 8) as usize;
    let inline_len = u32_at(d, 12) as usize;
    if HEADER_BYTES + targets_len + segments_len + inline_len > length {
        return Err(Sense::parameter_list_length());
    }
    if targets_len + segments_len > limits.max_descriptor_list_bytes as usize {
        return Err(Sense::parameter_list_length());
    }
    if inline_len != 0 {
        return Err(Sense::invalid_parameter_field(12, None));
    }
    if targets_len / TARGET_DESCRIPTOR_BYTES > limits.max_target_descriptors as usize {
        return Err(Sense::illegal(asc::TOO_MANY_TARGET_DESCRIPTORS));
    }
    let mut targets = Vec::new();
    let mut at = HEADER_BYTES;
    let targets_end = HEADER_BYTES + targets_len;
    while at < targets_end {
        if at + TARGET_DESCRIPTOR_BYTES > targets_end {
            return Err(Sense::parameter_list_length());
        }
        let t = &d[at..at + TARGET_DESCRIPTOR_BYTES];
        if t[0] != IDENTIFICATION_DESCRIPTOR {
            return Err(Sense::illegal(asc::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE));
        }
        if t[1] & 0x1F != 0 {
            // Only block devices (peripheral device type 0) are copy targets.
            return Err(Sense::invalid_parameter_field(at as u16 + 1, Some(4)));
        }
        let designator_len = (t[7] as usize).min(20);
        targets.push(CopyTarget {
            designator_type: t[5] & 0x0F,
            designator: t[8..8 + designator_len].to_vec(),
            block_bytes: u32::from_be_bytes([0, t[29], t[30], t[31]]),
        });
        at += TARGET_DESCRIPTOR_BYTES;
    }
    let segments_end = targets_end + segments_len;
    let mut headers = Vec::new();
    while at < segments_end {
        if at + 4 > segments_end {
            return Err(Sense::parameter_list_length());
        }
        let len = 4 + u16_at(d, at + 2) as usize;
        if at + len > segments_end {
            return Err(Sense::parameter_list_length());
        }
        headers.push((at, len));
        at += len;
        if headers.len() > limits.max_segment_descriptors as usize {
            return Err(Sense::illegal(asc::TOO_MANY_SEGMENT_DESCRIPTORS));
        }
    }
    let mut segments = Vec::new();
    for (at, len) in headers {
        let s = &d[at..at + len];
        if s[0] != BLOCK_TO_BLOCK {
            return Err(Sense::illegal(
                asc::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE,
            ));
        }
        if len != 0x1C {
            return Err(Sense::invalid_parameter_field(at as u16 + 2, None));
        }
        segments.push(Segment {
            source: u16_at(s, 4),
            destination: u16_at(s, 6),
            blocks: u16_at(s, 10),
            source_lba: u64_at(s, 12),
            destination_lba: u64_at(s, 20),
        });
    }
    let usage = (d[1] >> 3) & 0x03;
    Ok(Some(CopyRequest {
        list_id: d[0],
        keep_status: usage == 0 || usage == 2,
        targets,
        segments,
    }))
}

/// The outcome of a finished copy, kept for RECEIVE COPY RESULTS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyRecord {
    /// Segments done.
    pub segments_processed: u16,
    /// Bytes copied.
    pub bytes: u64,
    /// Why it stopped, when it failed.
    pub failure: Option<Sense>,
}

/// COPY STATUS data.
pub fn copy_status(record: &CopyRecord) -> Bytes {
    let mut out = BytesMut::with_capacity(12);
    out.put_u32(8);
    out.put_u8(if record.failure.is_some() { 0x02 } else { 0x01 });
    out.put_u16(record.segments_processed);
    // Transfer count in KiB when bytes would not fit.
    if record.bytes > u32::MAX as u64 {
        out.put_u8(0x01);
        out.put_u32((record.bytes >> 10).min(u32::MAX as u64) as u32);
    } else {
        out.put_u8(0x00);
        out.put_u32(record.bytes as u32);
    }
    out.freeze()
}

/// FAILED SEGMENT DETAILS data.
pub fn failed_segment_details(record: &CopyRecord, descriptor_sense: bool) -> Bytes {
    let sense = record
        .failure
        .as_ref()
        .map(|s| s.encode(descriptor_sense))
        .unwrap_or_default();
    let mut out = BytesMut::new();
    out.put_u32((56 + sense.len() - 4) as u32 + 4);
    out.put_bytes(0, 52);
    out.put_u8(if record.failure.is_some() { 0x02 } else { 0x00 });
    out.put_u8(0);
    out.put_u16(sense.len() as u16);
    out.put_slice(&sense);
    let len = (out.len() - 4) as u32;
    out[0..4].copy_from_slice(&len.to_be_bytes());
    out.freeze()
}

/// OPERATING PARAMETERS data.
pub fn operating_parameters(limits: &CopyLimits) -> Bytes {
    let codes = [BLOCK_TO_BLOCK, IDENTIFICATION_DESCRIPTOR];
    let mut out = BytesMut::new();
    out.put_u32(0);
    out.put_u8(0x01); // SNLID: list identifiers are per nexus
    out.put_bytes(0, 3);
    out.put_u16(limits.max_target_descriptors);
    out.put_u16(limits.max_segment_descriptors);
    out.put_u32(limits.max_descriptor_list_bytes);
    out.put_u32(limits.max_segment_bytes);
    out.put_u32(0); // maximum inline data length
    out.put_u32(0); // held data limit
    out.put_u32(0); // maximum stream device transfer size
    out.put_u16(0);
    out.put_u16(limits.max_concurrent_copies);
    out.put_u8(limits.max_concurrent_copies.min(255) as u8);
    out.put_u8(9); // data segment granularity: 2^9
    out.put_u8(0);
    out.put_u8(0);
    out.put_bytes(0, 3);
    out.put_u8(codes.len() as u8);
    out.put_slice(&codes);
    let len = (out.len() - 4) as u32;
    out[0..4].copy_from_slice(&len.to_be_bytes());
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(targets: usize, segments: usize) -> Vec<u8> {
        let mut d = vec![0u8; HEADER_BYTES];
        d[0] = 1;
        for _ in 0..targets {
            let mut t = [0u8; 32];
            t[0] = IDENTIFICATION_DESCRIPTOR;
            t[4] = 0x01;
            t[5] = 0x03;
            t[7] = 16;
            t[8] = 0x60;
            t[30] = 0x02;
            d.extend_from_slice(&t);
        }
        for _ in 0..segments {
            let mut s = [0u8; 28];
            s[0] = BLOCK_TO_BLOCK;
            s[3] = 0x18;
            s[11] = 8;
            s[27] = 64;
            d.extend_from_slice(&s);
        }
        let t = (targets * 32) as u16;
        d[2..4].copy_from_slice(&t.to_be_bytes());
        d[8..12].copy_from_slice(&((segments * 28) as u32).to_be_bytes());
        d
    }

    #[test]
    fn parses_targets_and_segments() {
        let d = list(1, 2);
        let req = parse_extended_copy(d.len() as u32, &d, &CopyLimits::default())
            .unwrap()
            .unwrap();
        assert_eq!(req.targets.len(), 1);
        assert_eq!(req.targets[0].block_bytes, 512);
        assert_eq!(req.targets[0].designator_type, 3);
        assert_eq!(req.segments.len(), 2);
        assert_eq!(req.segments[0].blocks, 8);
        assert_eq!(req.segments[0].destination_lba, 64);
        assert!(req.keep_status);
    }

    #[test]
    fn limits_and_truncation_are_refused() {
        let limits = CopyLimits::default();
        let d = list(3, 1);
        let s = parse_extended_copy(d.len() as u32, &d, &limits).unwrap_err();
        assert_eq!((s.asc, s.ascq), (0x26, 0x06));
        let d = list(1, 17);
        let s = parse_extended_copy(d.len() as u32, &d, &limits).unwrap_err();
        assert_eq!((s.asc, s.ascq), (0x26, 0x08));
        let d = list(1, 1);
        let s = parse_extended_copy(d.len() as u32 - 1, &d, &limits).unwrap_err();
        assert_eq!((s.asc, s.ascq), (0x1A, 0x00));
        assert_eq!(parse_extended_copy(0, &[], &limits), Ok(None));
        let mut d = list(1, 1);
        d[HEADER_BYTES] = 0xE0;
        let s = parse_extended_copy(d.len() as u32, &d, &limits).unwrap_err();
        assert_eq!((s.asc, s.ascq), (0x26, 0x07));
    }

    #[test]
    fn results_lengths_are_consistent() {
        let p = operating_parameters(&CopyLimits::default());
        assert_eq!(u32_at(&p, 0) as usize, p.len() - 4);
        assert_eq!(p[43] as usize, p.len() - 44);
        let record = CopyRecord {
            segments_processed: 1,
            bytes: 4096,
            failure: Some(Sense::illegal(asc::LBA_OUT_OF_RANGE)),
        };
        assert_eq!(copy_status(&record).len(), 12);
        let f = failed_segment_details(&record, false);
        assert_eq!(u32_at(&f, 0) as usize, f.len() - 4);
    }
}
