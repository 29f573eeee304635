//! Entry points for fuzzing the SCSI side: CDB decoding, parameter-list
//! parsing and whole commands against an in-memory unit.
//!
//! Owns: nothing but the mapping from fuzzer bytes to calls. The cargo-fuzz
//! targets and the stable corpus replay both call these, so a crash found
//! by one is a test case for the other.
//! Invariant: every entry point returns for every input (no panic, no
//! unbounded allocation: lengths come from the input but are bounded by the
//! input's size or by the unit's limits).

use super::copy::{self, CopyLimits};
use super::environment::{MemoryDatastore, MemoryEnvironment};
use super::mode::{self, ModeState};
use super::reservations::{self, ReservationState};
use super::target::BlockTarget;
use super::unit::{self, LogicalUnit, UnitSettings};
use super::{cdb, Command, Nexus, ScsiTarget, TaskAttribute};
use bytes::Bytes;
use std::sync::Arc;
use tessera_blockdev::MemoryDevice;

/// Decodes `data` as a CDB.
pub fn cdb(data: &[u8]) {
    if cdb::decode(data).is_ok() {
        let _ = unit::expected_data_out(data, 512);
        let _ = unit::expected_data_out(data, 4096);
    }
}

/// Parses `data[1..]` with the parameter-list parser `data[0]` selects
/// (UNMAP, PERSISTENT RESERVE OUT, MODE SELECT 6/10, EXTENDED COPY), with
/// the CDB's parameter list length taken as the input's length.
pub fn parameter_list(data: &[u8]) {
    let Some((&which, list)) = data.split_first() else {
        return;
    };
    let length = list.len() as u32;
    match which % 5 {
        0 => {
            let _ = unit::parse_unmap(length, list, 1 << 20, 1 << 20, 256);
        }
        1 => {
            if let Ok(params) = reservations::parse_prout_parameters(length, list) {
                let mut state = ReservationState::default();
                let nexus = Nexus {
                    initiator_port: "iqn.fuzz,i,0x000000000001".into(),
                    relative_port: 1,
                };
                let sa = list.first().copied().unwrap_or(0) & 0x07;
                let _ = reservations::apply_prout(&mut state, &nexus, sa, 0, 1, &params);
                for sa in 0..4 {
                    let _ = reservations::prin_data(&state, sa);
                }
            }
        }
        2 | 3 => {
            let _ = mode::mode_select(
                which % 5 == 3,
                false,
                length,
                list,
                &ModeState::default(),
                512,
            );
        }
        _ => {
            if let Ok(Some(request)) =
                copy::parse_extended_copy(length, list, &CopyLimits::default())
            {
                let _ = request.segments.len();
            }
        }
    }
}

/// Runs one command on a fresh 1 MiB in-memory unit: `data[..16]` is the
/// CDB (zero-padded), the rest its data-out.
pub fn command(data: &[u8]) {
    let mut raw = [0u8; 16];
    let cut = data.len().min(16);
    raw[..cut].copy_from_slice(&data[..cut]);
    let data_out = Bytes::copy_from_slice(&data[cut..]);
    let datastore = MemoryDatastore::new();
    let device = Arc::new(MemoryDevice::new("fuzz", 1 << 20));
    datastore.add(device.clone());
    let unit = LogicalUnit::new(
        device,
        Arc::new(MemoryEnvironment::new(datastore)),
        UnitSettings::default(),
    );
    let target = BlockTarget::new();
    target.insert_unit(0, Arc::new(unit));
    let nexus = Nexus {
        initiator_port: "iqn.fuzz,i,0x000000000001".into(),
        relative_port: 1,
    };
    let make = |cdb: [u8; 16], data_out: Bytes| Command {
        nexus: nexus.clone(),
        lun: 0,
        cdb: Bytes::copy_from_slice(&cdb),
        data_out,
        expected_data_in: 1 << 16,
        attribute: TaskAttribute::Simple,
        tag: 1,
    };
    futures::executor::block_on(async {
        // The first command of a nexus meets the power-on attention.
        let _ = target.execute(make([0u8; 16], Bytes::new())).await;
        let response = target.execute(make(raw, data_out)).await;
        assert!(response.data_in.len() <= 1 << 16);
    });
}
