//! INQUIRY data, VPD pages and REPORT TARGET PORT GROUPS.
//!
//! Owns: what the unit says it is (SPC-5 standard INQUIRY data with version
//! descriptors, VPD 0x00, 0x80, 0x83, 0x86, 0x8F, 0xB0, 0xB1, 0xB2) and the
//! ALUA port group data; what they say of the VAAI offloads follows the
//! [`Offloads`] the unit offers at the time.
//! Invariant: the NAA designator depends only on `DeviceInfo::serial`, so
//! every host serving a volume reports the same identity and a multipath
//! initiator joins the paths.

use super::cdb::op;
use super::environment::{Offloads, TargetPortGroup};
use super::unit::UnitSettings;
use bytes::{BufMut, Bytes, BytesMut};
use tessera_blockdev::DeviceInfo;

/// IEEE company identifier in the NAA designator: zero, as the project has
/// no registered OUI; the vendor-specific fields carry the identity.
const NAA_COMPANY_ID: u32 = 0x000000;
/// Vendor-specific 36 bits of every Tessera NAA designator.
const NAA_VENDOR_TAG: u64 = 0x7E5_5E7A;

/// The 16-byte NAA IEEE Registered Extended (type 6) designator of a
/// volume with `serial`.
pub fn naa_designator(serial: u64) -> [u8; 16] {
    let high: u64 = (0x6u64 << 60) | ((NAA_COMPANY_ID as u64) << 36) | NAA_VENDOR_TAG;
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&high.to_be_bytes());
    out[8..].copy_from_slice(&serial.to_be_bytes());
    out
}

/// VPD pages this unit has, ascending.
pub const VPD_PAGES: &[u8] = &[0x00, 0x80, 0x83, 0x86, 0x8F, 0xB0, 0xB1, 0xB2];

fn padded(text: &str, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = text
        .bytes()
        .filter(|b| (0x20..0x7F).contains(b))
        .take(len)
        .collect();
    v.resize(len, b' ');
    v
}

/// Standard INQUIRY data of a present unit (peripheral qualifier 0) or of a
/// LUN with no unit (qualifier 3, device type 0x1F); `third_party_copy`
/// sets 3PC (the unit offers EXTENDED COPY).
pub fn standard(settings: &UnitSettings, present: bool, third_party_copy: bool) -> Bytes {
    let mut d = vec![0u8; 96];
    d[0] = if present { 0x00 } else { 0x7F };
    d[2] = 0x06; // SPC-4
    d[3] = 0x10 | 0x02; // HISUP, response data format 2
    d[4] = (d.len() - 5) as u8;
    d[5] = 0x10 | if third_party_copy { 0x08 } else { 0 }; // TPGS implicit ALUA, 3PC
    d[6] = 0x10; // MULTIP: one port per host
    d[7] = 0x02; // CMDQUE
    d[8..16].copy_from_slice(&padded(&settings.vendor, 8));
    d[16..32].copy_from_slice(&padded(&settings.product, 16));
    d[32..36].copy_from_slice(&padded(&settings.revision, 4));
    // Version descriptors: SAM-5, iSCSI, SPC-4, SBC-3.
    for (i, v) in [0x00A0u16, 0x0960, 0x0460, 0x04C0].iter().enumerate() {
        d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
    }
    Bytes::from(d)
}

fn page(code: u8, body: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(4 + body.len());
    out.put_u8(0);
    out.put_u8(code);
    out.put_u16(body.len() as u16);
    out.put_slice(body);
    out.freeze()
}

/// What a VPD page needs to know about the nexus asking.
pub struct VpdContext<'a> {
    /// The device.
    pub info: &'a DeviceInfo,
    /// Unit settings.
    pub settings: &'a UnitSettings,
    /// Relative target port of the nexus.
    pub relative_port: u16,
    /// Port groups of the unit.
    pub port_groups: &'a [TargetPortGroup],
    /// The offloads the unit offers now.
    pub offloads: Offloads,
}

/// The VPD pages a unit offering `offloads` has, ascending: the third-party
/// copy page only while it offers EXTENDED COPY.
pub fn vpd_pages(offloads: Offloads) -> Vec<u8> {
    VPD_PAGES
        .iter()
        .copied()
        .filter(|&p| p != 0x8F || offloads.extended_copy)
        .collect()
}

/// The target port group a relative port belongs to (its own number when no
/// group lists it).
pub fn group_of(groups: &[TargetPortGroup], relative_port: u16) -> u16 {
    groups
        .iter()
        .find(|g| g.ports.contains(&relative_port))
        .map_or(relative_port, |g| g.id)
}

/// A VPD page, or `None` when the unit has no such page.
pub fn vpd(ctx: &VpdContext<'_>, code: u8) -> Option<Bytes> {
    let s = ctx.settings;
    let offloads = ctx.offloads;
    // A limit of 0 says the command is not offered (SBC-4 6.6.4).
    let offered = |on: bool, limit: u32| if on { limit } else { 0 };
    Some(match code {
        0x00 => page(0x00, &vpd_pages(offloads)),
        0x80 => page(0x80, format!("{:016X}", ctx.info.serial).as_bytes()),
        0x83 => {
            let mut b = BytesMut::new();
            b.put_slice(&[0x01, 0x03, 0x00, 16]);
            b.put_slice(&naa_designator(ctx.info.serial));
            let t10 = format!(
                "{}{:016X}",
                String::from_utf8_lossy(&padded(&s.vendor, 8)),
                ctx.info.serial
            );
            b.put_slice(&[0x02, 0x01, 0x00, t10.len() as u8]);
            b.put_slice(t10.as_bytes());
            b.put_slice(&[0x51, 0x94, 0x00, 4, 0, 0]);
            b.put_u16(ctx.relative_port);
            b.put_slice(&[0x51, 0x95, 0x00, 4, 0, 0]);
            b.put_u16(group_of(ctx.port_groups, ctx.relative_port));
            page(0x83, &b)
        }
        0x86 => {
            let mut b = [0u8; 60];
            b[1] = 0x04 | 0x02 | 0x01; // HEADSUP, ORDSUP, SIMPSUP
            b[2] = 0x01; // V_SUP: writes without FUA may sit in a volatile cache
            page(0x86, &b)
        }
        0x8F if offloads.extended_copy => third_party_copy(s),
        0xB0 => {
            let mut b = BytesMut::with_capacity(60);
            b.put_u8(0); // WSNZ 0: a zero-length WRITE SAME covers to the end
            b.put_u8(offered(
                offloads.compare_and_write,
                s.max_compare_and_write_blocks as u32,
            ) as u8);
            b.put_u16(1 << s.physical_exponent); // optimal transfer granularity
            b.put_u32(s.max_transfer_blocks);
            b.put_u32(s.optimal_transfer_blocks);
            b.put_u32(s.max_transfer_blocks); // maximum prefetch length
            b.put_u32(offered(offloads.unmap, s.max_unmap_blocks));
            b.put_u32(offered(offloads.unmap, s.max_unmap_descriptors));
            b.put_u32(1 << s.physical_exponent); // optimal unmap granularity
            b.put_u32(0x8000_0000); // UGAVALID, alignment 0
            b.put_u64(if offloads.write_same {
                s.max_write_same_blocks
            } else {
                0
            });
            b.put_u32(s.max_atomic_blocks);
            // Any alignment and granularity; no atomic boundaries.
            b.put_slice(&[0u8; 16]);
            page(0xB0, &b)
        }
        0xB1 => {
            let mut b = [0u8; 60];
            b[0..2].copy_from_slice(&1u16.to_be_bytes()); // non-rotating
            page(0xB1, &b)
        }
        // LBPU, LBPWS, LBPWS10 (as offered), LBPRZ=1; thin provisioned.
        0xB2 => {
            let unmap = if offloads.unmap { 0x80 } else { 0 };
            let write_same = if offloads.write_same { 0x40 | 0x20 } else { 0 };
            page(0xB2, &[0x00, unmap | write_same | 0x04, 0x02, 0x00])
        }
        _ => return None,
    })
}

fn tpc_descriptor(out: &mut BytesMut, kind: u16, body: &[u8]) {
    let len = body.len().div_ceil(4) * 4;
    out.put_u16(kind);
    out.put_u16(len as u16);
    out.put_slice(body);
    out.put_bytes(0, len - body.len());
}

/// VPD 0x8F: the EXTENDED COPY (LID1) this unit's copy manager offers.
fn third_party_copy(s: &UnitSettings) -> Bytes {
    let mut b = BytesMut::new();
    let commands = [
        op::EXTENDED_COPY,
        1,
        0x00,
        op::RECEIVE_COPY_RESULTS,
        3,
        0x00,
        0x03,
        0x04,
    ];
    let mut body = vec![commands.len() as u8];
    body.extend_from_slice(&commands);
    tpc_descriptor(&mut b, 0x0001, &body);
    let mut params = BytesMut::new();
    params.put_u32(0);
    params.put_u16(s.copy_limits.max_target_descriptors);
    params.put_u16(s.copy_limits.max_segment_descriptors);
    params.put_u32(s.copy_limits.max_descriptor_list_bytes);
    params.put_u32(0); // no inline data
    params.put_bytes(0, 12);
    tpc_descriptor(&mut b, 0x0008, &params);
    tpc_descriptor(&mut b, 0x0004, &[2, 0x02, 0xE4]);
    let mut general = BytesMut::new();
    general.put_u32(s.copy_limits.max_concurrent_copies as u32);
    general.put_u32(s.copy_limits.max_concurrent_copies as u32);
    general.put_u32(s.copy_limits.max_segment_bytes);
    general.put_u8(9); // data segment granularity: 512 bytes
    general.put_u8(0);
    general.put_bytes(0, 18);
    tpc_descriptor(&mut b, 0x8001, &general);
    page(0x8F, &b)
}

/// REPORT TARGET PORT GROUPS data, untruncated.
pub fn target_port_groups(groups: &[TargetPortGroup], extended: bool) -> Bytes {
    let mut body = BytesMut::new();
    for g in groups {
        body.put_u8(g.state.code());
        // Supported states: transitioning, unavailable, standby,
        // active/non-optimized, active/optimized.
        body.put_u8(0x80 | 0x08 | 0x04 | 0x02 | 0x01);
        body.put_u16(g.id);
        body.put_u8(0);
        body.put_u8(0); // status: no change reason
        body.put_u8(0);
        body.put_u8(g.ports.len() as u8);
        for p in &g.ports {
            body.put_u16(0);
            body.put_u16(*p);
        }
    }
    let mut out = BytesMut::new();
    if extended {
        out.put_u32(body.len() as u32 + 4);
        out.put_u8(0x10);
        out.put_u8(0); // implicit transition time: unspecified
        out.put_u16(0);
    } else {
        out.put_u32(body.len() as u32);
    }
    out.put_slice(&body);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naa_is_type_6_and_carries_the_serial() {
        let d = naa_designator(0x1122_3344_5566_7788);
        assert_eq!(d[0] >> 4, 6);
        assert_eq!(&d[8..], &0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(naa_designator(1), naa_designator(1));
        assert_ne!(naa_designator(1), naa_designator(2));
    }

    /// A 1 GiB 512e device with `serial`.
    fn device_info(serial: u64) -> DeviceInfo {
        DeviceInfo {
            name: "v".into(),
            size_bytes: 1 << 30,
            logical_block_bytes: 512,
            preferred_block_bytes: 4096,
            read_only: false,
            serial,
        }
    }

    #[test]
    fn every_listed_page_exists_and_lengths_match() {
        let info = device_info(42);
        let settings = UnitSettings::default();
        let ctx = VpdContext {
            info: &info,
            settings: &settings,
            relative_port: 2,
            port_groups: &[],
            offloads: Offloads::ALL,
        };
        for &code in VPD_PAGES {
            let p = vpd(&ctx, code).unwrap();
            assert_eq!(p[1], code);
            assert_eq!(
                u16::from_be_bytes([p[2], p[3]]) as usize,
                p.len() - 4,
                "page {code:#x}"
            );
        }
        assert_eq!(vpd(&ctx, 0xB0).unwrap().len(), 64);
        assert!(vpd(&ctx, 0x81).is_none());
        let std = standard(&settings, true, true);
        assert_eq!(std[4] as usize, std.len() - 5);
        assert_eq!(std[5] & 0x08, 0x08, "3PC");
        assert_eq!(standard(&settings, true, false)[5] & 0x08, 0);
        assert_eq!(standard(&settings, false, false)[0], 0x7F);
    }

    #[test]
    fn offloads_turned_off_vanish_from_every_page() {
        let info = device_info(7);
        let settings = UnitSettings::default();
        let ctx = |offloads| VpdContext {
            info: &info,
            settings: &settings,
            relative_port: 1,
            port_groups: &[],
            offloads,
        };
        let none = Offloads {
            compare_and_write: false,
            extended_copy: false,
            write_same: false,
            unmap: false,
        };
        let all = ctx(Offloads::ALL);
        let off = ctx(none);
        assert!(vpd(&all, 0x00).unwrap()[4..].contains(&0x8F));
        assert!(!vpd(&off, 0x00).unwrap()[4..].contains(&0x8F));
        assert!(vpd(&off, 0x8F).is_none());
        let limits = vpd(&off, 0xB0).unwrap();
        assert_eq!(limits[5], 0, "MAXIMUM COMPARE AND WRITE LENGTH");
        assert_eq!(
            &limits[20..28],
            &[0u8; 8],
            "MAXIMUM UNMAP LBA and descriptor counts"
        );
        assert_eq!(&limits[36..44], &[0u8; 8], "MAXIMUM WRITE SAME LENGTH");
        let on = vpd(&all, 0xB0).unwrap();
        assert_eq!(on[5], 255);
        assert_ne!(&on[20..28], &[0u8; 8]);
        assert_ne!(&on[36..44], &[0u8; 8]);
        assert_eq!(vpd(&all, 0xB2).unwrap()[5], 0x80 | 0x40 | 0x20 | 0x04);
        assert_eq!(vpd(&off, 0xB2).unwrap()[5], 0x04, "LBPRZ only");
        let unmap_only = ctx(Offloads {
            unmap: true,
            ..none
        });
        assert_eq!(vpd(&unmap_only, 0xB2).unwrap()[5], 0x80 | 0x04);
    }
}
