//! Reservations: persistent (PERSISTENT RESERVE IN/OUT) and the older
//! RESERVE(6)/RELEASE(6), as one state shared by every host and path.
//!
//! Owns: [`ReservationState`] (what a host stores through
//! [`UnitEnvironment`](super::UnitEnvironment)), the conflict rule of SPC-5
//! table 'SPC commands that are allowed in the presence of various
//! reservations' and SBC-4's block commands table, the PR OUT service actions
//! as a pure transition of that state, and the PR IN data.
//! Must not touch: devices, sessions. Everything here is pure so it can be
//! property-tested and fuzzed.
//! Invariants: a nexus holds at most one registration; the reservation,
//! when present, belongs to a registered nexus (or to every registrant for
//! the all-registrants types); the generation changes on REGISTER, CLEAR and
//! PREEMPT, never on RESERVE or RELEASE.

use super::sense::{asc, Sense};
use super::Nexus;
use bytes::{BufMut, Bytes, BytesMut};

/// Persistent reservation types (SPC-5 table 'Persistent reservation type
/// codes').
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrType {
    /// 1: only the holder writes.
    WriteExclusive,
    /// 3: only the holder reads or writes.
    ExclusiveAccess,
    /// 5: registrants write.
    WriteExclusiveRegistrantsOnly,
    /// 6: registrants read and write.
    ExclusiveAccessRegistrantsOnly,
    /// 7: every registrant holds it; registrants write.
    WriteExclusiveAllRegistrants,
    /// 8: every registrant holds it; registrants read and write.
    ExclusiveAccessAllRegistrants,
}

impl PrType {
    /// From the TYPE field.
    pub fn from_code(code: u8) -> Option<PrType> {
        Some(match code {
            1 => PrType::WriteExclusive,
            3 => PrType::ExclusiveAccess,
            5 => PrType::WriteExclusiveRegistrantsOnly,
            6 => PrType::ExclusiveAccessRegistrantsOnly,
            7 => PrType::WriteExclusiveAllRegistrants,
            8 => PrType::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    /// The TYPE field.
    pub fn code(self) -> u8 {
        match self {
            PrType::WriteExclusive => 1,
            PrType::ExclusiveAccess => 3,
            PrType::WriteExclusiveRegistrantsOnly => 5,
            PrType::ExclusiveAccessRegistrantsOnly => 6,
            PrType::WriteExclusiveAllRegistrants => 7,
            PrType::ExclusiveAccessAllRegistrants => 8,
        }
    }

    /// Every registrant is a holder.
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveAllRegistrants | PrType::ExclusiveAccessAllRegistrants
        )
    }

    /// Registered nexuses have the holder's access.
    pub fn registrants_have_access(self) -> bool {
        !matches!(self, PrType::WriteExclusive | PrType::ExclusiveAccess)
    }

    /// Reads from nexuses without access conflict.
    pub fn exclusive_access(self) -> bool {
        matches!(
            self,
            PrType::ExclusiveAccess
                | PrType::ExclusiveAccessRegistrantsOnly
                | PrType::ExclusiveAccessAllRegistrants
        )
    }
}

/// One registered I_T nexus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The nexus.
    pub nexus: Nexus,
    /// Its reservation key (never 0).
    pub key: u64,
}

/// The persistent reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistentReservation {
    /// The nexus that reserved (for the all-registrants types, the one that
    /// happened to; every registrant holds it).
    pub holder: Nexus,
    /// Type.
    pub kind: PrType,
}

/// Everything reservations are, for one logical unit, shared by every host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReservationState {
    /// PRGENERATION.
    pub generation: u32,
    /// Registrations, in registration order.
    pub registrations: Vec<Registration>,
    /// The persistent reservation.
    pub reservation: Option<PersistentReservation>,
    /// The RESERVE(6) holder.
    pub legacy_holder: Option<Nexus>,
    /// APTPL as last set by a REGISTER (the state is always kept across
    /// power loss; this is what READ FULL STATUS and REPORT CAPABILITIES say).
    pub persist_through_power_loss: bool,
    /// The latest unit attentions raised for nexuses that any host may
    /// serve (resets, preempted or released reservations), oldest first.
    pub attentions: Vec<SharedAttention>,
}

/// A unit attention raised through one path that nexuses on every host must
/// see: each host raises it for the nexuses it serves when it next looks at
/// the shared state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedAttention {
    /// One more than the attention before it.
    pub sequence: u64,
    /// The nexus it is for; `None`: every nexus.
    pub nexus: Option<Nexus>,
    /// A nexus it is not for (the one that asked for a target reset).
    pub except: Option<Nexus>,
    /// ASC and ASCQ.
    pub code: (u8, u8),
}

/// Shared attentions kept; a host further behind than this raises only the
/// ones still kept (each is a hint to re-read state the nexus can still
/// read, not state of its own).
pub const SHARED_ATTENTIONS_KEPT: usize = 64;

/// How a command touches the medium, for the conflict rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Allowed under every reservation (INQUIRY, REPORT LUNS, REQUEST SENSE,
    /// READ CAPACITY, TEST UNIT READY, REPORT TARGET PORT GROUPS, REPORT
    /// SUPPORTED OPERATION CODES).
    Always,
    /// PERSISTENT RESERVE IN/OUT: allowed under persistent reservations (the
    /// service actions check themselves), conflicts under RESERVE(6).
    Persistent,
    /// Reads the medium: allowed from non-holders under the write-exclusive
    /// types.
    Read,
    /// Everything else: writes, MODE SENSE/SELECT, SYNCHRONIZE CACHE, copies.
    Write,
}

impl ReservationState {
    /// Records an attention every host raises for its matching nexuses.
    pub fn share_attention(&mut self, nexus: Option<Nexus>, except: Option<Nexus>, code: (u8, u8)) {
        let sequence = self.attention_sequence() + 1;
        self.attentions.push(SharedAttention {
            sequence,
            nexus,
            except,
            code,
        });
        if self.attentions.len() > SHARED_ATTENTIONS_KEPT {
            self.attentions.remove(0);
        }
    }

    /// The sequence number of the latest shared attention (0: none yet).
    pub fn attention_sequence(&self) -> u64 {
        self.attentions.last().map_or(0, |a| a.sequence)
    }

    /// The registration of a nexus.
    pub fn registration(&self, nexus: &Nexus) -> Option<&Registration> {
        self.registrations.iter().find(|r| &r.nexus == nexus)
    }

    /// Whether `nexus` holds the persistent reservation.
    pub fn is_holder(&self, nexus: &Nexus) -> bool {
        match &self.reservation {
            Some(r) if r.kind.all_registrants() => self.registration(nexus).is_some(),
            Some(r) => &r.holder == nexus,
            None => false,
        }
    }

    /// Whether a command of class `access` from `nexus` conflicts.
    pub fn conflicts(&self, nexus: &Nexus, access: Access) -> bool {
        if access == Access::Always {
            return false;
        }
        if let Some(holder) = &self.legacy_holder {
            return holder != nexus;
        }
        let Some(reservation) = &self.reservation else {
            return false;
        };
        if access == Access::Persistent {
            return false;
        }
        let has_access = self.is_holder(nexus)
            || (reservation.kind.registrants_have_access() && self.registration(nexus).is_some());
        if has_access {
            return false;
        }
        match access {
            Access::Read => reservation.kind.exclusive_access(),
            _ => true,
        }
    }

    /// RESERVE(6) from `nexus`: `false` is a RESERVATION CONFLICT.
    pub fn reserve_legacy(&mut self, nexus: &Nexus) -> bool {
        if self.reservation.is_some() {
            return false;
        }
        match &self.legacy_holder {
            Some(holder) if holder != nexus => false,
            _ => {
                self.legacy_holder = Some(nexus.clone());
                true
            }
        }
    }

    /// RELEASE(6) from `nexus`: releases only its own reservation.
    pub fn release_legacy(&mut self, nexus: &Nexus) {
        if self.legacy_holder.as_ref() == Some(nexus) {
            self.legacy_holder = None;
        }
    }

    /// What a reset or nexus loss ends: the RESERVE(6) reservation of
    /// `nexus` (or of anyone, when `nexus` is `None`: a LOGICAL UNIT RESET).
    pub fn drop_legacy(&mut self, nexus: Option<&Nexus>) -> bool {
        let drop = match (nexus, &self.legacy_holder) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(n), Some(h)) => n == h,
        };
        if drop {
            self.legacy_holder = None;
        }
        drop
    }

    fn unregister(&mut self, nexus: &Nexus, attentions: &mut Vec<(Nexus, (u8, u8))>) {
        self.registrations.retain(|r| &r.nexus != nexus);
        let release = match &self.reservation {
            Some(r) if r.kind.all_registrants() => self.registrations.is_empty(),
            Some(r) => &r.holder == nexus,
            None => false,
        };
        if release {
            let kind = self.reservation.take().map(|r| r.kind);
            if kind.is_some_and(|k| k.registrants_have_access() && !k.all_registrants()) {
                for r in &self.registrations {
                    attentions.push((r.nexus.clone(), asc::RESERVATIONS_RELEASED));
                }
            }
        }
    }
}

/// The 24-byte PERSISTENT RESERVE OUT parameter list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProutParameters {
    /// RESERVATION KEY.
    pub key: u64,
    /// SERVICE ACTION RESERVATION KEY.
    pub service_action_key: u64,
    /// APTPL bit.
    pub aptpl: bool,
}

/// PR OUT service actions.
pub mod prout {
    #![allow(missing_docs)]
    pub const REGISTER: u8 = 0x00;
    pub const RESERVE: u8 = 0x01;
    pub const RELEASE: u8 = 0x02;
    pub const CLEAR: u8 = 0x03;
    pub const PREEMPT: u8 = 0x04;
    pub const PREEMPT_AND_ABORT: u8 = 0x05;
    pub const REGISTER_AND_IGNORE_EXISTING_KEY: u8 = 0x06;
}

/// Parses the PR OUT parameter list: exactly 24 bytes, no SPEC_I_PT or
/// ALL_TG_PT (this target reports neither capability).
pub fn parse_prout_parameters(length: u32, data: &[u8]) -> Result<ProutParameters, Sense> {
    if length != 24 || data.len() < 24 {
        return Err(Sense::parameter_list_length());
    }
    if data[20] & 0x08 != 0 {
        return Err(Sense::invalid_parameter_field(20, Some(3)));
    }
    if data[20] & 0x04 != 0 {
        return Err(Sense::invalid_parameter_field(20, Some(2)));
    }
    let u64_at = |at: usize| {
        let mut v = [0u8; 8];
        v.copy_from_slice(&data[at..at + 8]);
        u64::from_be_bytes(v)
    };
    Ok(ProutParameters {
        key: u64_at(0),
        service_action_key: u64_at(8),
        aptpl: data[20] & 0x01 != 0,
    })
}

/// Why a PR OUT failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProutError {
    /// RESERVATION CONFLICT status.
    Conflict,
    /// CHECK CONDITION.
    Check(Sense),
}

/// A PR OUT that succeeded: the unit attentions it raises, per nexus.
pub type Attentions = Vec<(Nexus, (u8, u8))>;

/// Applies one PR OUT service action to `state` (SPC-5 5.14). On error,
/// `state` is unchanged.
pub fn apply_prout(
    state: &mut ReservationState,
    nexus: &Nexus,
    service_action: u8,
    scope: u8,
    kind: u8,
    params: &ProutParameters,
) -> Result<Attentions, ProutError> {
    let mut next = state.clone();
    let out = apply_prout_inner(&mut next, nexus, service_action, scope, kind, params)?;
    *state = next;
    Ok(out)
}

fn apply_prout_inner(
    state: &mut ReservationState,
    nexus: &Nexus,
    service_action: u8,
    scope: u8,
    kind: u8,
    params: &ProutParameters,
) -> Result<Attentions, ProutError> {
    let mut attentions = Vec::new();
    let registered_key = state.registration(nexus).map(|r| r.key);
    let typed = || -> Result<PrType, ProutError> {
        if scope != 0 {
            return Err(ProutError::Check(Sense::invalid_cdb_field(2, Some(7))));
        }
        PrType::from_code(kind).ok_or(ProutError::Check(Sense::invalid_cdb_field(2, Some(3))))
    };
    match service_action {
        prout::REGISTER | prout::REGISTER_AND_IGNORE_EXISTING_KEY => {
            let ignore = service_action == prout::REGISTER_AND_IGNORE_EXISTING_KEY;
            match registered_key {
                None => {
                    if !ignore && params.key != 0 {
                        return Err(ProutError::Conflict);
                    }
                    if params.service_action_key != 0 {
                        state.registrations.push(Registration {
                            nexus: nexus.clone(),
                            key: params.service_action_key,
                        });
                        state.persist_through_power_loss = params.aptpl;
                        state.generation = state.generation.wrapping_add(1);
                    }
                }
                Some(key) => {
                    if !ignore && params.key != key {
                        return Err(ProutError::Conflict);
                    }
                    if params.service_action_key == 0 {
                        state.unregister(nexus, &mut attentions);
                    } else if let Some(r) =
                        state.registrations.iter_mut().find(|r| &r.nexus == nexus)
                    {
                        r.key = params.service_action_key;
                    }
                    state.persist_through_power_loss = params.aptpl;
                    state.generation = state.generation.wrapping_add(1);
                }
            }
        }
        prout::RESERVE => {
            if registered_key != Some(params.key) {
                return Err(ProutError::Conflict);
            }
            let kind = typed()?;
            match &state.reservation {
                None => {
                    state.reservation = Some(PersistentReservation {
                        holder: nexus.clone(),
                        kind,
                    });
                }
                Some(r) => {
                    if !(state.is_holder(nexus) && r.kind == kind) {
                        return Err(ProutError::Conflict);
                    }
                }
            }
        }
        prout::RELEASE => {
            if registered_key != Some(params.key) {
                return Err(ProutError::Conflict);
            }
            let Some(current) = state.reservation.clone() else {
                return Ok(attentions);
            };
            if !state.is_holder(nexus) {
                return Ok(attentions);
            }
            if scope != 0 || current.kind.code() != kind {
                return Err(ProutError::Check(Sense::illegal(
                    asc::INVALID_RELEASE_OF_PERSISTENT_RESERVATION,
                )));
            }
            state.reservation = None;
            if current.kind.registrants_have_access() {
                for r in state.registrations.iter().filter(|r| &r.nexus != nexus) {
                    attentions.push((r.nexus.clone(), asc::RESERVATIONS_RELEASED));
                }
            }
        }
        prout::CLEAR => {
            if registered_key != Some(params.key) {
                return Err(ProutError::Conflict);
            }
            for r in state.registrations.iter().filter(|r| &r.nexus != nexus) {
                attentions.push((r.nexus.clone(), asc::RESERVATIONS_PREEMPTED));
            }
            state.registrations.clear();
            state.reservation = None;
            state.generation = state.generation.wrapping_add(1);
        }
        prout::PREEMPT | prout::PREEMPT_AND_ABORT => {
            if registered_key != Some(params.key) {
                return Err(ProutError::Conflict);
            }
            let kind = typed()?;
            let target = params.service_action_key;
            let remove = |state: &mut ReservationState, attentions: &mut Attentions| {
                let before = state.registrations.len();
                state.registrations.retain(|r| {
                    let gone = r.key == target && &r.nexus != nexus;
                    if gone {
                        attentions.push((r.nexus.clone(), asc::REGISTRATIONS_PREEMPTED));
                    }
                    !gone
                });
                before != state.registrations.len()
            };
            match state.reservation.clone() {
                Some(r) if r.kind.all_registrants() => {
                    if target == 0 {
                        state.registrations.retain(|reg| {
                            let gone = &reg.nexus != nexus;
                            if gone {
                                attentions.push((reg.nexus.clone(), asc::REGISTRATIONS_PREEMPTED));
                            }
                            !gone
                        });
                        state.reservation = Some(PersistentReservation {
                            holder: nexus.clone(),
                            kind,
                        });
                    } else if !remove(state, &mut attentions) {
                        return Err(ProutError::Conflict);
                    }
                }
                Some(r) => {
                    let holder_key = state.registration(&r.holder).map(|h| h.key);
                    if holder_key == Some(target) {
                        remove(state, &mut attentions);
                        state.reservation = Some(PersistentReservation {
                            holder: nexus.clone(),
                            kind,
                        });
                    } else {
                        if target == 0 {
                            return Err(ProutError::Check(Sense::invalid_parameter_field(8, None)));
                        }
                        if !remove(state, &mut attentions) {
                            return Err(ProutError::Conflict);
                        }
                    }
                }
                None => {
                    if target == 0 {
                        return Err(ProutError::Check(Sense::invalid_parameter_field(8, None)));
                    }
                    if !remove(state, &mut attentions) {
                        return Err(ProutError::Conflict);
                    }
                }
            }
            state.generation = state.generation.wrapping_add(1);
        }
        _ => return Err(ProutError::Check(Sense::invalid_cdb_field(1, Some(4)))),
    }
    Ok(attentions)
}

/// PR IN service actions.
pub mod prin {
    #![allow(missing_docs)]
    pub const READ_KEYS: u8 = 0x00;
    pub const READ_RESERVATION: u8 = 0x01;
    pub const REPORT_CAPABILITIES: u8 = 0x02;
    pub const READ_FULL_STATUS: u8 = 0x03;
}

/// The iSCSI TransportID of an initiator port (SPC-5 'iSCSI TransportID'
/// format 01b): the name with its ISID, NUL-terminated, padded to four.
pub fn transport_id(nexus: &Nexus) -> Vec<u8> {
    let mut name = nexus.initiator_port.as_bytes().to_vec();
    name.push(0);
    while !name.len().is_multiple_of(4) || name.len() < 16 {
        name.push(0);
    }
    let mut out = vec![0x45, 0x00];
    out.extend_from_slice(&(name.len() as u16).to_be_bytes());
    out.extend_from_slice(&name);
    out
}

/// The PR IN data for `service_action`, untruncated; `None` for a service
/// action this target does not have.
pub fn prin_data(state: &ReservationState, service_action: u8) -> Option<Bytes> {
    let mut out = BytesMut::new();
    match service_action {
        prin::READ_KEYS => {
            out.put_u32(state.generation);
            out.put_u32(state.registrations.len() as u32 * 8);
            for r in &state.registrations {
                out.put_u64(r.key);
            }
        }
        prin::READ_RESERVATION => {
            out.put_u32(state.generation);
            match &state.reservation {
                None => out.put_u32(0),
                Some(r) => {
                    out.put_u32(16);
                    let key = if r.kind.all_registrants() {
                        0
                    } else {
                        state.registration(&r.holder).map_or(0, |h| h.key)
                    };
                    out.put_u64(key);
                    out.put_u32(0);
                    out.put_u8(0);
                    out.put_u8(r.kind.code());
                    out.put_u16(0);
                }
            }
        }
        prin::REPORT_CAPABILITIES => {
            out.put_u16(8);
            // CRH: RESERVE(6) conflicts with a persistent reservation;
            // PTPL_C: the state survives power loss (it lives in the
            // directory).
            out.put_u8(0x10 | 0x01);
            // TMV with ALLOW COMMANDS 0; PTPL_A as last registered.
            out.put_u8(0x80 | u8::from(state.persist_through_power_loss));
            out.put_u8(0x80 | 0x40 | 0x20 | 0x08 | 0x02);
            out.put_u8(0x01);
            out.put_u16(0);
        }
        prin::READ_FULL_STATUS => {
            out.put_u32(state.generation);
            out.put_u32(0);
            for r in &state.registrations {
                out.put_u64(r.key);
                out.put_u32(0);
                let holder = state.is_holder(&r.nexus);
                out.put_u8(u8::from(holder));
                out.put_u8(if holder {
                    state.reservation.as_ref().map_or(0, |res| res.kind.code())
                } else {
                    0
                });
                out.put_u32(0);
                out.put_u16(r.nexus.relative_port);
                let id = transport_id(&r.nexus);
                out.put_u32(id.len() as u32);
                out.put_slice(&id);
            }
            let len = (out.len() - 8) as u32;
            out[4..8].copy_from_slice(&len.to_be_bytes());
        }
        _ => return None,
    }
    Some(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nexus(name: &str) -> Nexus {
        Nexus {
            initiator_port: format!("{name},i,0x000000000001"),
            relative_port: 1,
        }
    }

    fn params(key: u64, sa_key: u64) -> ProutParameters {
        ProutParameters {
            key,
            service_action_key: sa_key,
            aptpl: false,
        }
    }

    #[test]
    fn register_reserve_and_conflicts_per_type() {
        let (a, b, c) = (nexus("a"), nexus("b"), nexus("c"));
        for code in [1u8, 3, 5, 6, 7, 8] {
            let kind = PrType::from_code(code).unwrap();
            let mut s = ReservationState::default();
            apply_prout(&mut s, &a, prout::REGISTER, 0, 0, &params(0, 1)).unwrap();
            apply_prout(&mut s, &b, prout::REGISTER, 0, 0, &params(0, 2)).unwrap();
            assert_eq!(s.generation, 2);
            apply_prout(&mut s, &a, prout::RESERVE, 0, code, &params(1, 0)).unwrap();
            assert_eq!(s.generation, 2, "RESERVE does not change the generation");
            assert!(!s.conflicts(&a, Access::Write));
            let registered_access = kind.registrants_have_access();
            assert_eq!(
                s.conflicts(&b, Access::Write),
                !registered_access,
                "type {code}"
            );
            assert_eq!(
                s.conflicts(&b, Access::Read),
                !registered_access && kind.exclusive_access(),
                "type {code}"
            );
            assert!(s.conflicts(&c, Access::Write));
            assert_eq!(s.conflicts(&c, Access::Read), kind.exclusive_access());
            assert!(!s.conflicts(&c, Access::Always));
            assert!(!s.conflicts(&c, Access::Persistent));
        }
    }

    #[test]
    fn wrong_key_conflicts_and_changes_nothing() {
        let a = nexus("a");
        let mut s = ReservationState::default();
        apply_prout(&mut s, &a, prout::REGISTER, 0, 0, &params(0, 7)).unwrap();
        let before = s.clone();
        assert_eq!(
            apply_prout(&mut s, &a, prout::REGISTER, 0, 0, &params(8, 9)),
            Err(ProutError::Conflict)
        );
        assert_eq!(s, before);
        assert_eq!(
            apply_prout(&mut s, &a, prout::RESERVE, 0, 2, &params(7, 0)),
            Err(ProutError::Check(Sense::invalid_cdb_field(2, Some(3))))
        );
        assert_eq!(s, before);
    }

    #[test]
    fn preempt_removes_the_holder_and_takes_over() {
        let (a, b) = (nexus("a"), nexus("b"));
        let mut s = ReservationState::default();
        apply_prout(&mut s, &a, prout::REGISTER, 0, 0, &params(0, 1)).unwrap();
        apply_prout(&mut s, &b, prout::REGISTER, 0, 0, &params(0, 2)).unwrap();
        apply_prout(&mut s, &a, prout::RESERVE, 0, 3, &params(1, 0)).unwrap();
        let ua = apply_prout(&mut s, &b, prout::PREEMPT, 0, 1, &params(2, 1)).unwrap();
        assert_eq!(ua, vec![(a.clone(), asc::REGISTRATIONS_PREEMPTED)]);
        assert_eq!(s.registrations.len(), 1);
        assert_eq!(s.reservation.as_ref().unwrap().holder, b);
        assert_eq!(s.generation, 3);
        let data = prin_data(&s, prin::READ_RESERVATION).unwrap();
        assert_eq!(&data[8..16], &2u64.to_be_bytes());
        assert_eq!(data[21], 1);
    }

    #[test]
    fn legacy_reservation_conflicts_and_is_dropped_by_its_holder() {
        let (a, b) = (nexus("a"), nexus("b"));
        let mut s = ReservationState::default();
        assert!(s.reserve_legacy(&a));
        assert!(s.reserve_legacy(&a));
        assert!(!s.reserve_legacy(&b));
        assert!(s.conflicts(&b, Access::Read));
        assert!(s.conflicts(&b, Access::Persistent));
        assert!(!s.conflicts(&b, Access::Always));
        s.release_legacy(&b);
        assert!(s.legacy_holder.is_some());
        assert!(s.drop_legacy(Some(&a)));
        assert!(!s.conflicts(&b, Access::Write));
    }

    #[test]
    fn full_status_lists_transport_ids() {
        let a = nexus("iqn.2024-01.org.example:host");
        let mut s = ReservationState::default();
        apply_prout(&mut s, &a, prout::REGISTER, 0, 0, &params(0, 5)).unwrap();
        let data = prin_data(&s, prin::READ_FULL_STATUS).unwrap();
        let len = u32::from_be_bytes([data[4], data[5], data[6], data[7]]) as usize;
        assert_eq!(len, data.len() - 8);
        assert_eq!(data[8 + 24], 0x45);
        assert_eq!(transport_id(&a).len() % 4, 0);
    }
}
