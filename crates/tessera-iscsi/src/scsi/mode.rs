//! Mode pages: caching (0x08), control (0x0A) and informational exceptions
//! (0x1C), for MODE SENSE and MODE SELECT (6 and 10).
//!
//! Owns: the encoding of each page with its current, changeable, default
//! and saved values, and the parsing of a MODE SELECT parameter list into a
//! new [`ModeState`]. Pure.
//! Invariants: only the bits the changeable page shows can change (WCE,
//! D_SENSE, SWP); a parameter list that changes anything else changes
//! nothing. Nothing is saved: saved values are the defaults.

use super::sense::{asc, Sense};
use bytes::{BufMut, Bytes, BytesMut};

/// Mode parameters of a unit, shared by every nexus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeState {
    /// WCE: writes without FUA may be acknowledged before they are durable.
    pub write_cache: bool,
    /// D_SENSE: sense data in descriptor format.
    pub descriptor_sense: bool,
    /// SWP: the unit refuses writes (software write protect).
    pub software_write_protect: bool,
}

impl Default for ModeState {
    fn default() -> Self {
        ModeState {
            write_cache: true,
            descriptor_sense: false,
            software_write_protect: false,
        }
    }
}

/// Page codes.
pub const CACHING: u8 = 0x08;
/// Control mode page.
pub const CONTROL: u8 = 0x0A;
/// Informational exceptions control page.
pub const INFORMATIONAL_EXCEPTIONS: u8 = 0x1C;
/// Every page.
pub const ALL_PAGES: u8 = 0x3F;
const PAGES: [u8; 3] = [CACHING, CONTROL, INFORMATIONAL_EXCEPTIONS];

/// Page control values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Values {
    Current,
    Changeable,
    Default,
}

fn encode_page(code: u8, state: &ModeState, values: Values) -> Vec<u8> {
    let (wce, dsense, swp) = match values {
        Values::Current => (
            state.write_cache,
            state.descriptor_sense,
            state.software_write_protect,
        ),
        Values::Changeable => (true, true, true),
        Values::Default => {
            let d = ModeState::default();
            (d.write_cache, d.descriptor_sense, d.software_write_protect)
        }
    };
    let changeable = values == Values::Changeable;
    match code {
        CACHING => {
            let mut p = vec![0u8; 20];
            p[0] = CACHING;
            p[1] = 18;
            p[2] = if wce { 0x04 } else { 0 };
            p
        }
        CONTROL => {
            let mut p = vec![0u8; 12];
            p[0] = CONTROL;
            p[1] = 10;
            p[2] = if dsense { 0x04 } else { 0 };
            if !changeable {
                p[3] = 0x10; // unrestricted reordering
                p[8..10].copy_from_slice(&[0xFF, 0xFF]); // busy timeout: unlimited
            }
            p[4] = if swp { 0x08 } else { 0 };
            p
        }
        _ => {
            let mut p = vec![0u8; 12];
            p[0] = INFORMATIONAL_EXCEPTIONS;
            p[1] = 10;
            p
        }
    }
}

/// The fields of a MODE SENSE CDB.
#[derive(Debug, Clone, Copy)]
pub struct ModeSenseRequest {
    /// MODE SENSE(10).
    pub ten: bool,
    /// Disable block descriptors.
    pub dbd: bool,
    /// Long LBA block descriptor accepted.
    pub llbaa: bool,
    /// Page control.
    pub page_control: u8,
    /// Page code.
    pub page: u8,
    /// Subpage code.
    pub subpage: u8,
}

/// MODE SENSE data, untruncated.
pub fn mode_sense(
    req: &ModeSenseRequest,
    state: &ModeState,
    blocks: u64,
    block_bytes: u32,
    write_protected: bool,
) -> Result<Bytes, Sense> {
    let values = match req.page_control {
        0 => Values::Current,
        1 => Values::Changeable,
        _ => Values::Default,
    };
    let pages: Vec<u8> = match (req.page, req.subpage) {
        (ALL_PAGES, 0x00 | 0xFF) => PAGES.to_vec(),
        (p, 0x00) if PAGES.contains(&p) => vec![p],
        (p, _) if PAGES.contains(&p) || p == ALL_PAGES => {
            return Err(Sense::invalid_cdb_field(3, None))
        }
        _ => return Err(Sense::invalid_cdb_field(2, Some(5))),
    };
    let mut body = Vec::new();
    for p in pages {
        body.extend(encode_page(p, state, values));
    }
    let device_specific = 0x10 | if write_protected { 0x80 } else { 0 }; // DPOFUA, WP
    let long = req.ten && req.llbaa;
    let mut descriptor = BytesMut::new();
    if !req.dbd {
        if long {
            descriptor.put_u64(blocks);
            descriptor.put_u32(0);
            descriptor.put_u32(block_bytes);
        } else {
            descriptor.put_u32(blocks.min(u32::MAX as u64) as u32);
            descriptor.put_u8(0);
            descriptor.put_uint(block_bytes as u64, 3);
        }
    }
    let mut out = BytesMut::new();
    if req.ten {
        let total = 8 + descriptor.len() + body.len();
        out.put_u16((total - 2) as u16);
        out.put_u8(0);
        out.put_u8(device_specific);
        out.put_u8(u8::from(long));
        out.put_u8(0);
        out.put_u16(descriptor.len() as u16);
    } else {
        let total = 4 + descriptor.len() + body.len();
        out.put_u8((total - 1).min(255) as u8);
        out.put_u8(0);
        out.put_u8(device_specific);
        out.put_u8(descriptor.len() as u8);
    }
    out.put_slice(&descriptor);
    out.put_slice(&body);
    Ok(out.freeze())
}

/// Applies a MODE SELECT parameter list to `current`. `length` is the
/// CDB's parameter list length; `data` what the initiator sent.
pub fn mode_select(
    ten: bool,
    save: bool,
    length: u32,
    data: &[u8],
    current: &ModeState,
    block_bytes: u32,
) -> Result<ModeState, Sense> {
    if save {
        return Err(Sense::invalid_cdb_field(1, Some(0)));
    }
    let length = length as usize;
    if length == 0 {
        return Ok(*current);
    }
    if data.len() < length {
        return Err(Sense::parameter_list_length());
    }
    let data = &data[..length];
    let header = if ten { 8 } else { 4 };
    if data.len() < header {
        return Err(Sense::parameter_list_length());
    }
    let descriptors = if ten {
        u16::from_be_bytes([data[6], data[7]]) as usize
    } else {
        data[3] as usize
    };
    let long = ten && data[4] & 0x01 != 0;
    let descriptor_len = if long { 16 } else { 8 };
    if descriptors % descriptor_len != 0 {
        return Err(Sense::invalid_parameter_field(
            if ten { 6 } else { 3 },
            None,
        ));
    }
    if header + descriptors > data.len() {
        return Err(Sense::parameter_list_length());
    }
    for i in 0..descriptors / descriptor_len {
        let at = header + i * descriptor_len;
        let d = &data[at..at + descriptor_len];
        let len = if long {
            u32::from_be_bytes([d[12], d[13], d[14], d[15]])
        } else {
            u32::from_be_bytes([0, d[5], d[6], d[7]])
        };
        if len != block_bytes {
            return Err(Sense::invalid_parameter_field(
                (at + descriptor_len - 3) as u16,
                None,
            ));
        }
    }
    let mut next = *current;
    let mut at = header + descriptors;
    while at < data.len() {
        if at + 2 > data.len() {
            return Err(Sense::parameter_list_length());
        }
        let code = data[at] & 0x3F;
        if data[at] & 0x40 != 0 || !PAGES.contains(&code) {
            return Err(Sense::invalid_parameter_field(at as u16, None));
        }
        let ours = encode_page(code, current, Values::Current);
        let mask = encode_page(code, current, Values::Changeable);
        let len = data[at + 1] as usize + 2;
        if len != ours.len() {
            return Err(Sense::invalid_parameter_field(at as u16 + 1, None));
        }
        if at + len > data.len() {
            return Err(Sense::parameter_list_length());
        }
        let theirs = &data[at..at + len];
        for i in 2..len {
            if (theirs[i] ^ ours[i]) & !mask[i] != 0 {
                return Err(Sense::invalid_parameter_field((at + i) as u16, None));
            }
        }
        match code {
            CACHING => next.write_cache = theirs[2] & 0x04 != 0,
            CONTROL => {
                next.descriptor_sense = theirs[2] & 0x04 != 0;
                next.software_write_protect = theirs[4] & 0x08 != 0;
            }
            _ => {}
        }
        at += len;
    }
    Ok(next)
}

/// ILLEGAL REQUEST for a saved-values request when nothing can be saved.
pub fn saving_not_supported() -> Sense {
    Sense::illegal(asc::SAVING_PARAMETERS_NOT_SUPPORTED)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sense_all(ten: bool, pc: u8) -> Bytes {
        let req = ModeSenseRequest {
            ten,
            dbd: false,
            llbaa: false,
            page_control: pc,
            page: ALL_PAGES,
            subpage: 0,
        };
        mode_sense(&req, &ModeState::default(), 2048, 512, false).unwrap()
    }

    #[test]
    fn sense_lengths_are_consistent() {
        let six = sense_all(false, 0);
        assert_eq!(six[0] as usize, six.len() - 1);
        assert_eq!(six[2] & 0x10, 0x10);
        assert_eq!(six[3], 8);
        let ten = sense_all(true, 0);
        assert_eq!(u16::from_be_bytes([ten[0], ten[1]]) as usize, ten.len() - 2);
    }

    #[test]
    fn select_round_trips_changeable_bits_and_refuses_others() {
        let current = ModeState::default();
        let mut list = vec![0u8; 4];
        let mut control = encode_page(CONTROL, &current, Values::Current);
        control[2] |= 0x04;
        control[4] |= 0x08;
        list.extend(&control);
        let next = mode_select(false, false, list.len() as u32, &list, &current, 512).unwrap();
        assert!(next.descriptor_sense && next.software_write_protect);
        let mut bad = list.clone();
        bad[4 + 3] = 0x00; // queue algorithm modifier is not changeable
        let err = mode_select(false, false, bad.len() as u32, &bad, &current, 512).unwrap_err();
        assert_eq!((err.asc, err.ascq), (0x26, 0x00));
        let err = mode_select(false, false, 40, &list, &current, 512).unwrap_err();
        assert_eq!((err.asc, err.ascq), (0x1A, 0x00));
    }
}
