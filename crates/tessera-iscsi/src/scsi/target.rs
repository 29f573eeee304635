//! A SCSI target device: the logical units behind one iSCSI target name.
//!
//! Owns: the LUN map, REPORT LUNS, what a LUN without a unit answers
//! (INQUIRY with peripheral qualifier 3, LOGICAL UNIT NOT SUPPORTED for the
//! rest), and the fan-out of resets and nexus loss to the units.
//! Invariant: a command reaches exactly the unit its LUN names, or none.

use super::cdb::{self, Cdb};
use super::inquiry;
use super::sense::{asc, Sense};
use super::unit::{LogicalUnit, UnitSettings};
use super::{Command, Nexus, Reset, Response, ScsiTarget, Status};
use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The logical units of one target.
#[derive(Default)]
pub struct BlockTarget {
    units: RwLock<BTreeMap<u64, Arc<LogicalUnit>>>,
    settings: UnitSettings,
}

impl BlockTarget {
    /// A target with no units.
    pub fn new() -> Self {
        BlockTarget::default()
    }

    /// Adds (or replaces) the unit at `lun`; every nexus of the other units
    /// sees REPORTED LUNS DATA HAS CHANGED.
    pub fn insert_unit(&self, lun: u64, unit: Arc<LogicalUnit>) {
        let mut units = self.units.write();
        for other in units.values() {
            other.raise_attention(asc::REPORTED_LUNS_DATA_CHANGED, None);
        }
        units.insert(lun, unit);
    }

    /// Removes the unit at `lun` (a deleted volume): its LUN then answers
    /// LOGICAL UNIT NOT SUPPORTED.
    pub fn remove_unit(&self, lun: u64) -> Option<Arc<LogicalUnit>> {
        let mut units = self.units.write();
        let removed = units.remove(&lun);
        if removed.is_some() {
            for other in units.values() {
                other.raise_attention(asc::REPORTED_LUNS_DATA_CHANGED, None);
            }
        }
        removed
    }

    /// The unit at `lun`.
    pub fn unit(&self, lun: u64) -> Option<Arc<LogicalUnit>> {
        self.units.read().get(&lun).cloned()
    }

    /// LUNs with a unit, ascending.
    pub fn luns(&self) -> Vec<u64> {
        self.units.read().keys().copied().collect()
    }

    fn report_luns(&self, select: u8, alloc: u32) -> Result<Bytes, Sense> {
        if alloc < 16 {
            return Err(Sense::invalid_cdb_field(6, None));
        }
        let luns = match select {
            0x00 | 0x02 => self.luns(),
            0x01 => Vec::new(),
            _ => return Err(Sense::invalid_cdb_field(2, None)),
        };
        let mut out = BytesMut::with_capacity(8 + 8 * luns.len());
        out.put_u32(8 * luns.len() as u32);
        out.put_u32(0);
        for lun in luns {
            out.put_slice(&encode_lun(lun));
        }
        let mut out = out.freeze();
        out.truncate(alloc as usize);
        Ok(out)
    }

    fn without_unit(&self, command: &Command) -> Response {
        let not_supported = Sense::illegal(asc::LOGICAL_UNIT_NOT_SUPPORTED);
        let outcome: Result<Bytes, Sense> = match cdb::decode(&command.cdb) {
            Ok(Cdb::Inquiry {
                evpd: false, alloc, ..
            }) => {
                let mut data = inquiry::standard(&self.settings, false, false);
                data.truncate(alloc as usize);
                Ok(data)
            }
            Ok(Cdb::ReportLuns { select, alloc }) => self.report_luns(select, alloc),
            Ok(Cdb::RequestSense { descriptor, alloc }) => {
                let mut data = not_supported.encode(descriptor);
                data.truncate(alloc as usize);
                Ok(data)
            }
            Ok(_) => Err(not_supported),
            Err(sense) => Err(sense),
        };
        finish(command, outcome)
    }
}

fn finish(command: &Command, outcome: Result<Bytes, Sense>) -> Response {
    match outcome {
        Ok(mut data) => {
            data.truncate(command.expected_data_in as usize);
            Response {
                status: Status::Good,
                sense: None,
                data_in: data,
                data_out_used: 0,
            }
        }
        Err(sense) => Response {
            status: Status::CheckCondition,
            sense: Some(sense.encode(false)),
            data_in: Bytes::new(),
            data_out_used: 0,
        },
    }
}

/// A LUN in the single-level format REPORT LUNS uses: peripheral device
/// addressing below 256, flat space addressing above.
pub fn encode_lun(lun: u64) -> [u8; 8] {
    let mut out = [0u8; 8];
    if lun < 256 {
        out[1] = lun as u8;
    } else {
        out[0] = 0x40 | ((lun >> 8) & 0x3F) as u8;
        out[1] = lun as u8;
    }
    out
}

#[async_trait::async_trait]
impl ScsiTarget for BlockTarget {
    async fn execute(&self, command: Command) -> Response {
        if command.cdb.first() == Some(&cdb::op::REPORT_LUNS) {
            // REPORT LUNS belongs to the target, whichever LUN it names, and
            // reports no unit attention (SPC-5).
            let outcome = match cdb::decode(&command.cdb) {
                Ok(Cdb::ReportLuns { select, alloc }) => self.report_luns(select, alloc),
                Ok(_) => Err(Sense::illegal(asc::INVALID_COMMAND_OPERATION_CODE)),
                Err(sense) => Err(sense),
            };
            return finish(&command, outcome);
        }
        match self.unit(command.lun) {
            Some(unit) => unit.execute(&command).await,
            None => self.without_unit(&command),
        }
    }

    async fn reset(&self, nexus: &Nexus, reset: Reset) {
        let units: Vec<Arc<LogicalUnit>> = match reset {
            Reset::LogicalUnit(lun) => self.unit(lun).into_iter().collect(),
            _ => self.units.read().values().cloned().collect(),
        };
        for unit in units {
            unit.reset(nexus, reset).await;
        }
    }

    async fn nexus_ended(&self, nexus: &Nexus) {
        let units: Vec<Arc<LogicalUnit>> = self.units.read().values().cloned().collect();
        for unit in units {
            unit.nexus_ended(nexus).await;
        }
    }
}
