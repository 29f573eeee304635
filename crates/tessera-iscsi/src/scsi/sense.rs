//! Sense data: what a CHECK CONDITION says, and its two encodings.
//!
//! Owns: sense keys and the additional sense codes this target reports,
//! the field pointer of an ILLEGAL REQUEST, fixed (0x70) and descriptor
//! (0x72) formats, and the one mapping from [`BlockError`] to sense.
//! Invariant: every code a command reports is named here, so tests and
//! documentation can enumerate them.

use bytes::{BufMut, Bytes, BytesMut};
use tessera_blockdev::BlockError;

/// Sense keys (SPC-5 table 'Sense key descriptions').
pub mod key {
    /// 0x0
    pub const NO_SENSE: u8 = 0x0;
    /// 0x2: the unit cannot serve the command now.
    pub const NOT_READY: u8 = 0x2;
    /// 0x3: data could not be read or written.
    pub const MEDIUM_ERROR: u8 = 0x3;
    /// 0x4: the target failed.
    pub const HARDWARE_ERROR: u8 = 0x4;
    /// 0x5: the command or its parameters are wrong.
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    /// 0x6: something changed since the nexus last looked.
    pub const UNIT_ATTENTION: u8 = 0x6;
    /// 0x7: the write is refused (write protect, no space).
    pub const DATA_PROTECT: u8 = 0x7;
    /// 0xA: an EXTENDED COPY stopped.
    pub const COPY_ABORTED: u8 = 0xA;
    /// 0xB: the command was aborted.
    pub const ABORTED_COMMAND: u8 = 0xB;
    /// 0xE: compared data differed.
    pub const MISCOMPARE: u8 = 0xE;
}

/// Additional sense code and qualifier pairs this target reports.
pub mod asc {
    /// 0x00/0x00
    pub const NO_ADDITIONAL_SENSE: (u8, u8) = (0x00, 0x00);
    /// 0x04/0x0A: ALUA state transition; multipath initiators retry
    /// elsewhere.
    pub const NOT_READY_ASYMMETRIC_TRANSITION: (u8, u8) = (0x04, 0x0A);
    /// 0x04/0x02: START STOP UNIT stopped the unit.
    pub const NOT_READY_INITIALIZING_COMMAND_REQUIRED: (u8, u8) = (0x04, 0x02);
    /// 0x08/0x04
    pub const UNREACHABLE_COPY_TARGET: (u8, u8) = (0x08, 0x04);
    /// 0x0C/0x00
    pub const WRITE_ERROR: (u8, u8) = (0x0C, 0x00);
    /// 0x0D/0x02
    pub const COPY_TARGET_DEVICE_NOT_REACHABLE: (u8, u8) = (0x0D, 0x02);
    /// 0x11/0x00
    pub const UNRECOVERED_READ_ERROR: (u8, u8) = (0x11, 0x00);
    /// 0x1A/0x00
    pub const PARAMETER_LIST_LENGTH_ERROR: (u8, u8) = (0x1A, 0x00);
    /// 0x1D/0x00
    pub const MISCOMPARE_DURING_VERIFY: (u8, u8) = (0x1D, 0x00);
    /// 0x20/0x00
    pub const INVALID_COMMAND_OPERATION_CODE: (u8, u8) = (0x20, 0x00);
    /// 0x21/0x00
    pub const LBA_OUT_OF_RANGE: (u8, u8) = (0x21, 0x00);
    /// 0x24/0x00
    pub const INVALID_FIELD_IN_CDB: (u8, u8) = (0x24, 0x00);
    /// 0x25/0x00
    pub const LOGICAL_UNIT_NOT_SUPPORTED: (u8, u8) = (0x25, 0x00);
    /// 0x26/0x00
    pub const INVALID_FIELD_IN_PARAMETER_LIST: (u8, u8) = (0x26, 0x00);
    /// 0x26/0x04
    pub const INVALID_RELEASE_OF_PERSISTENT_RESERVATION: (u8, u8) = (0x26, 0x04);
    /// 0x26/0x06
    pub const TOO_MANY_TARGET_DESCRIPTORS: (u8, u8) = (0x26, 0x06);
    /// 0x26/0x07
    pub const UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE: (u8, u8) = (0x26, 0x07);
    /// 0x26/0x08
    pub const TOO_MANY_SEGMENT_DESCRIPTORS: (u8, u8) = (0x26, 0x08);
    /// 0x26/0x09
    pub const UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE: (u8, u8) = (0x26, 0x09);
    /// 0x27/0x00
    pub const WRITE_PROTECTED: (u8, u8) = (0x27, 0x00);
    /// 0x27/0x02
    pub const SOFTWARE_WRITE_PROTECTED: (u8, u8) = (0x27, 0x02);
    /// 0x27/0x07
    pub const SPACE_ALLOCATION_FAILED_WRITE_PROTECT: (u8, u8) = (0x27, 0x07);
    /// 0x29/0x00
    pub const POWER_ON_RESET: (u8, u8) = (0x29, 0x00);
    /// 0x29/0x03: a LOGICAL UNIT RESET or target reset arrived.
    pub const BUS_DEVICE_RESET: (u8, u8) = (0x29, 0x03);
    /// 0x2A/0x01
    pub const MODE_PARAMETERS_CHANGED: (u8, u8) = (0x2A, 0x01);
    /// 0x2A/0x03
    pub const RESERVATIONS_PREEMPTED: (u8, u8) = (0x2A, 0x03);
    /// 0x2A/0x04
    pub const RESERVATIONS_RELEASED: (u8, u8) = (0x2A, 0x04);
    /// 0x2A/0x05
    pub const REGISTRATIONS_PREEMPTED: (u8, u8) = (0x2A, 0x05);
    /// 0x2A/0x06
    pub const ASYMMETRIC_ACCESS_STATE_CHANGED: (u8, u8) = (0x2A, 0x06);
    /// 0x2A/0x09
    pub const CAPACITY_DATA_CHANGED: (u8, u8) = (0x2A, 0x09);
    /// 0x38/0x07
    pub const THIN_PROVISIONING_SOFT_THRESHOLD_REACHED: (u8, u8) = (0x38, 0x07);
    /// 0x39/0x00
    pub const SAVING_PARAMETERS_NOT_SUPPORTED: (u8, u8) = (0x39, 0x00);
    /// 0x3F/0x03
    pub const INQUIRY_DATA_HAS_CHANGED: (u8, u8) = (0x3F, 0x03);
    /// 0x3F/0x0E
    pub const REPORTED_LUNS_DATA_CHANGED: (u8, u8) = (0x3F, 0x0E);
    /// 0x44/0x00
    pub const INTERNAL_TARGET_FAILURE: (u8, u8) = (0x44, 0x00);
}

/// Where in the CDB or parameter list the offending field is (SPC-5
/// 'Field pointer sense key specific data').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldPointer {
    /// The field is in the CDB (else in the parameter list).
    pub in_cdb: bool,
    /// Byte of the field.
    pub byte: u16,
    /// Bit of the field, when it is narrower than a byte.
    pub bit: Option<u8>,
}

/// The sense data of one CHECK CONDITION.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sense {
    /// Sense key ([`key`]).
    pub key: u8,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
    /// INFORMATION field (an LBA, or a miscompare offset).
    pub information: Option<u64>,
    /// COMMAND-SPECIFIC INFORMATION field.
    pub command_specific: Option<u64>,
    /// Field pointer of an ILLEGAL REQUEST.
    pub field: Option<FieldPointer>,
}

impl Sense {
    /// Sense with a key and an ASC/ASCQ pair and nothing else.
    pub fn new(key: u8, code: (u8, u8)) -> Self {
        Sense {
            key,
            asc: code.0,
            ascq: code.1,
            information: None,
            command_specific: None,
            field: None,
        }
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN CDB, pointing at `byte` (and `bit`).
    pub fn invalid_cdb_field(byte: u16, bit: Option<u8>) -> Self {
        Sense {
            field: Some(FieldPointer {
                in_cdb: true,
                byte,
                bit,
            }),
            ..Sense::new(key::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_CDB)
        }
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST, pointing at `byte`.
    pub fn invalid_parameter_field(byte: u16, bit: Option<u8>) -> Self {
        Sense {
            field: Some(FieldPointer {
                in_cdb: false,
                byte,
                bit,
            }),
            ..Sense::new(key::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_PARAMETER_LIST)
        }
    }

    /// ILLEGAL REQUEST with another ASC/ASCQ.
    pub fn illegal(code: (u8, u8)) -> Self {
        Sense::new(key::ILLEGAL_REQUEST, code)
    }

    /// ILLEGAL REQUEST, PARAMETER LIST LENGTH ERROR.
    pub fn parameter_list_length() -> Self {
        Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR)
    }

    /// ILLEGAL REQUEST, LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub fn lba_out_of_range() -> Self {
        Sense::illegal(asc::LBA_OUT_OF_RANGE)
    }

    /// The same sense with the INFORMATION field set.
    pub fn with_information(mut self, information: u64) -> Self {
        self.information = Some(information);
        self
    }

    /// The same sense with the COMMAND-SPECIFIC INFORMATION field set.
    pub fn with_command_specific(mut self, value: u64) -> Self {
        self.command_specific = Some(value);
        self
    }

    /// Sense for a block device error during a command that started at
    /// `first_byte` of the device; `writing` picks WRITE ERROR over
    /// UNRECOVERED READ ERROR for device failures.
    pub fn from_block_error(error: &BlockError, block_bytes: u64, writing: bool) -> Self {
        let lba = |offset: u64| offset / block_bytes.max(1);
        match error {
            BlockError::OutOfRange { .. } => Sense::lba_out_of_range(),
            BlockError::NoSpace { offset, .. } => Sense::new(
                key::DATA_PROTECT,
                asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT,
            )
            .with_information(lba(*offset)),
            BlockError::ReadOnly => Sense::new(key::DATA_PROTECT, asc::WRITE_PROTECTED),
            BlockError::Checksum { offset } => {
                Sense::new(key::MEDIUM_ERROR, asc::UNRECOVERED_READ_ERROR)
                    .with_information(lba(*offset))
            }
            BlockError::Miscompare { offset } => {
                Sense::new(key::MISCOMPARE, asc::MISCOMPARE_DURING_VERIFY).with_information(*offset)
            }
            BlockError::Io { offset, .. } | BlockError::OutcomeUnknown { offset, .. } => {
                let code = if writing {
                    asc::WRITE_ERROR
                } else {
                    asc::UNRECOVERED_READ_ERROR
                };
                Sense::new(key::MEDIUM_ERROR, code).with_information(lba(*offset))
            }
            BlockError::Unavailable { .. } => {
                Sense::new(key::NOT_READY, asc::NOT_READY_ASYMMETRIC_TRANSITION)
            }
            BlockError::Invalid { .. } => Sense::illegal(asc::INVALID_FIELD_IN_CDB),
        }
    }

    fn sense_key_specific(&self) -> Option<[u8; 3]> {
        let field = self.field?;
        let mut sks = [0x80u8, 0, 0];
        if field.in_cdb {
            sks[0] |= 0x40;
        }
        if let Some(bit) = field.bit {
            sks[0] |= 0x08 | (bit & 0x07);
        }
        sks[1..3].copy_from_slice(&field.byte.to_be_bytes());
        Some(sks)
    }

    /// Encodes the sense data: descriptor format when `descriptor` (the
    /// D_SENSE bit of the control mode page) or when the INFORMATION field
    /// does not fit the fixed format's four bytes.
    pub fn encode(&self, descriptor: bool) -> Bytes {
        let too_wide = |v: Option<u64>| v.is_some_and(|v| v > u32::MAX as u64);
        if descriptor || too_wide(self.information) || too_wide(self.command_specific) {
            return self.encode_descriptor();
        }
        let mut out = [0u8; 18];
        out[0] = 0x70;
        if let Some(info) = self.information {
            out[0] |= 0x80;
            out[3..7].copy_from_slice(&(info as u32).to_be_bytes());
        }
        out[2] = self.key & 0x0F;
        out[7] = 10;
        if let Some(cs) = self.command_specific {
            out[8..12].copy_from_slice(&(cs as u32).to_be_bytes());
        }
        out[12] = self.asc;
        out[13] = self.ascq;
        if let Some(sks) = self.sense_key_specific() {
            out[15..18].copy_from_slice(&sks);
        }
        Bytes::copy_from_slice(&out)
    }

    fn encode_descriptor(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(48);
        out.put_slice(&[0x72, self.key & 0x0F, self.asc, self.ascq, 0, 0, 0, 0]);
        if let Some(info) = self.information {
            out.put_slice(&[0x00, 0x0A, 0x80, 0x00]);
            out.put_u64(info);
        }
        if let Some(cs) = self.command_specific {
            out.put_slice(&[0x01, 0x0A, 0x00, 0x00]);
            out.put_u64(cs);
        }
        if let Some(sks) = self.sense_key_specific() {
            out.put_slice(&[0x02, 0x06, 0x00, 0x00]);
            out.put_slice(&sks);
            out.put_u8(0);
        }
        out[7] = (out.len() - 8) as u8;
        out.freeze()
    }
}

/// Reads sense key, ASC and ASCQ back from either encoding (for tests and
/// logs); `None` when the buffer is neither format.
pub fn decode_key_code(sense: &[u8]) -> Option<(u8, u8, u8)> {
    match sense.first()? & 0x7F {
        0x70 | 0x71 if sense.len() >= 14 => Some((sense[2] & 0x0F, sense[12], sense[13])),
        0x72 | 0x73 if sense.len() >= 4 => Some((sense[1] & 0x0F, sense[2], sense[3])),
        _ => None,
    }
}

/// Reads the INFORMATION field back from either encoding.
pub fn decode_information(sense: &[u8]) -> Option<u64> {
    match sense.first()? & 0x7F {
        0x70 | 0x71 if sense.len() >= 7 && sense[0] & 0x80 != 0 => {
            Some(u32::from_be_bytes([sense[3], sense[4], sense[5], sense[6]]) as u64)
        }
        0x72 | 0x73 => {
            let mut at = 8;
            while at + 2 <= sense.len() {
                let (kind, len) = (sense[at], sense[at + 1] as usize);
                if kind == 0 && at + 12 <= sense.len() {
                    let mut v = [0u8; 8];
                    v.copy_from_slice(&sense[at + 4..at + 12]);
                    return Some(u64::from_be_bytes(v));
                }
                at += 2 + len;
            }
            None
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_format_carries_field_pointer_and_information() {
        let sense = Sense::invalid_cdb_field(2, Some(3)).with_information(7);
        let raw = sense.encode(false);
        assert_eq!(raw.len(), 18);
        assert_eq!(raw[0], 0xF0);
        assert_eq!(decode_key_code(&raw), Some((key::ILLEGAL_REQUEST, 0x24, 0)));
        assert_eq!(decode_information(&raw), Some(7));
        assert_eq!(&raw[15..18], &[0x80 | 0x40 | 0x08 | 3, 0, 2]);
    }

    #[test]
    fn wide_information_switches_to_descriptor_format() {
        let sense =
            Sense::new(key::MEDIUM_ERROR, asc::UNRECOVERED_READ_ERROR).with_information(1 << 40);
        let raw = sense.encode(false);
        assert_eq!(raw[0], 0x72);
        assert_eq!(decode_key_code(&raw), Some((key::MEDIUM_ERROR, 0x11, 0)));
        assert_eq!(decode_information(&raw), Some(1 << 40));
        assert_eq!(raw[7] as usize, raw.len() - 8);
    }

    #[test]
    fn block_errors_map_to_their_sense() {
        let no_space = BlockError::NoSpace {
            offset: 4096,
            len: 512,
        };
        let s = Sense::from_block_error(&no_space, 512, true);
        assert_eq!((s.key, s.asc, s.ascq), (key::DATA_PROTECT, 0x27, 0x07));
        assert_eq!(s.information, Some(8));
        let s = Sense::from_block_error(&BlockError::Checksum { offset: 1024 }, 512, false);
        assert_eq!(
            (s.key, s.asc, s.ascq, s.information),
            (key::MEDIUM_ERROR, 0x11, 0, Some(2))
        );
        let s = Sense::from_block_error(
            &BlockError::Unavailable {
                reason: "no quorum".into(),
            },
            512,
            false,
        );
        assert_eq!((s.key, s.asc, s.ascq), (key::NOT_READY, 0x04, 0x0A));
    }
}
