//! Text keys (RFC 7143 sections 6 and 13): `key=value` pairs separated by
//! NUL bytes, and the negotiation of the operational keys.
//!
//! Owns: the text format, each key's kind (list, numerical minimum or
//! maximum, boolean AND/OR, declarative), its range and our side's value,
//! and the negotiated [`SessionParams`]. Must not touch: login stages, CHAP
//! or sockets.
//! Invariants:
//! - a key is answered at most once per negotiation and never with a value
//!   outside its range;
//! - unknown keys get `NotUnderstood`, malformed or out-of-range values
//!   `Reject`, keys that mean nothing in a discovery session `Irrelevant`;
//! - a text is bounded: at most [`MAX_TEXT_BYTES`] bytes, [`MAX_KEYS`] keys,
//!   names of at most 63 bytes.

use std::collections::HashSet;

/// Largest text (all PDUs of one request together) accepted, in bytes.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// Most keys one text may hold.
pub const MAX_KEYS: usize = 256;
/// Longest key name (RFC 7143 section 6.1).
const MAX_KEY_BYTES: usize = 63;
/// Longest value accepted: a CHAP challenge of 1024 bytes in hex, plus "0x".
const MAX_VALUE_BYTES: usize = 2 * 1024 + 2;

/// Why a text could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// The text is longer than [`MAX_TEXT_BYTES`] or holds too many keys.
    #[error("text too long ({0} bytes or keys)")]
    TooLong(usize),
    /// A pair has no `=`, an empty or over-long name, or bad UTF-8.
    #[error("malformed key=value pair {0:?}")]
    Malformed(String),
    /// A key appears twice.
    #[error("key {0} sent twice")]
    Duplicate(String),
}

/// Parses a text into pairs, in order. A missing final NUL is tolerated.
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    if data.len() > MAX_TEXT_BYTES {
        return Err(TextError::TooLong(data.len()));
    }
    let mut pairs = Vec::new();
    let mut seen = HashSet::new();
    for raw in data.split(|&b| b == 0) {
        if raw.is_empty() {
            continue;
        }
        if pairs.len() >= MAX_KEYS {
            return Err(TextError::TooLong(pairs.len()));
        }
        let text = std::str::from_utf8(raw)
            .map_err(|_| TextError::Malformed(String::from_utf8_lossy(raw).into_owned()))?;
        let Some((key, value)) = text.split_once('=') else {
            return Err(TextError::Malformed(text.into()));
        };
        if key.is_empty() || key.len() > MAX_KEY_BYTES || value.len() > MAX_VALUE_BYTES {
            return Err(TextError::Malformed(text.chars().take(80).collect()));
        }
        if !seen.insert(key.to_owned()) {
            return Err(TextError::Duplicate(key.into()));
        }
        pairs.push((key.to_owned(), value.to_owned()));
    }
    Ok(pairs)
}

/// Encodes pairs as a text, each followed by a NUL.
pub fn encode(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Session type a login asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionType {
    /// SCSI traffic to one target.
    #[default]
    Normal,
    /// SendTargets only.
    Discovery,
}

/// What our side offers: the limits of this target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetLimits {
    /// Largest data segment we receive, in bytes (declared to the initiator).
    pub max_recv_data_segment_length: u32,
    /// Largest burst we accept or send, in bytes.
    pub max_burst_length: u32,
    /// Largest unsolicited burst we accept, in bytes.
    pub first_burst_length: u32,
    /// R2Ts we keep outstanding per task.
    pub max_outstanding_r2t: u16,
    /// Whether we want an R2T before any write data.
    pub initial_r2t: bool,
    /// Whether we accept data in the command PDU.
    pub immediate_data: bool,
}

impl Default for TargetLimits {
    fn default() -> Self {
        TargetLimits {
            max_recv_data_segment_length: 256 * 1024,
            max_burst_length: 16 * 1024 * 1024 - 1024,
            first_burst_length: 256 * 1024,
            max_outstanding_r2t: 16,
            initial_r2t: false,
            immediate_data: true,
        }
    }
}

/// The operational parameters of a session and connection, starting at
/// the defaults of RFC 7143 section 13.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionParams {
    /// CRC32C on headers.
    pub header_digest: bool,
    /// CRC32C on data segments.
    pub data_digest: bool,
    /// MaxConnections.
    pub max_connections: u16,
    /// InitialR2T.
    pub initial_r2t: bool,
    /// ImmediateData.
    pub immediate_data: bool,
    /// Largest data segment we may send (the initiator's declaration).
    pub initiator_max_recv_data_segment_length: u32,
    /// Largest data segment we accept (our declaration).
    pub target_max_recv_data_segment_length: u32,
    /// MaxBurstLength.
    pub max_burst_length: u32,
    /// FirstBurstLength.
    pub first_burst_length: u32,
    /// DefaultTime2Wait, seconds.
    pub default_time_to_wait: u16,
    /// DefaultTime2Retain, seconds.
    pub default_time_to_retain: u16,
    /// MaxOutstandingR2T.
    pub max_outstanding_r2t: u16,
    /// DataPDUInOrder.
    pub data_pdu_in_order: bool,
    /// DataSequenceInOrder.
    pub data_sequence_in_order: bool,
    /// ErrorRecoveryLevel (always 0 here).
    pub error_recovery_level: u8,
}

impl Default for SessionParams {
    fn default() -> Self {
        SessionParams {
            header_digest: false,
            data_digest: false,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            initiator_max_recv_data_segment_length: 8192,
            target_max_recv_data_segment_length: 8192,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time_to_wait: 2,
            default_time_to_retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
        }
    }
}

/// The answer to one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyAnswer {
    /// Reply with this value.
    Reply(String),
    /// A declaration that needs no reply.
    Silent,
}

/// Range of a numerical key.
fn in_range(value: &str, min: u64, max: u64) -> Option<u64> {
    if value.is_empty() || value.len() > 20 {
        return None;
    }
    let n = if let Some(hex) = value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        u64::from_str_radix(hex, 16).ok()?
    } else {
        value.parse::<u64>().ok()?
    };
    (min..=max).contains(&n).then_some(n)
}

fn boolean(value: &str) -> Option<bool> {
    match value {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn yes_no(v: bool) -> String {
    if v { "Yes" } else { "No" }.into()
}

/// The digest to use from an initiator's list: the first one we support.
fn pick_digest(value: &str) -> Option<bool> {
    value.split(',').find_map(|v| match v {
        "CRC32C" => Some(true),
        "None" => Some(false),
        _ => None,
    })
}

/// Keys that may only be negotiated during login.
pub fn is_login_only(key: &str) -> bool {
    matches!(
        key,
        "HeaderDigest"
            | "DataDigest"
            | "MaxConnections"
            | "InitialR2T"
            | "ImmediateData"
            | "MaxBurstLength"
            | "FirstBurstLength"
            | "DefaultTime2Wait"
            | "DefaultTime2Retain"
            | "MaxOutstandingR2T"
            | "DataPDUInOrder"
            | "DataSequenceInOrder"
            | "ErrorRecoveryLevel"
            | "SessionType"
            | "InitiatorName"
            | "TargetName"
            | "AuthMethod"
            | "IFMarker"
            | "OFMarker"
            | "IFMarkInt"
            | "OFMarkInt"
    )
}

/// Negotiates one operational key offered by the initiator, updating
/// `params`. Keys of the login itself (names, session type, security) are
/// the login's business and not handled here.
pub fn negotiate_key(
    params: &mut SessionParams,
    limits: &TargetLimits,
    session_type: SessionType,
    key: &str,
    value: &str,
) -> KeyAnswer {
    let reject = || KeyAnswer::Reply("Reject".into());
    let discovery = session_type == SessionType::Discovery;
    let irrelevant_in_discovery = matches!(
        key,
        "MaxConnections"
            | "InitialR2T"
            | "ImmediateData"
            | "MaxBurstLength"
            | "FirstBurstLength"
            | "MaxOutstandingR2T"
            | "DataPDUInOrder"
            | "DataSequenceInOrder"
    );
    if discovery && irrelevant_in_discovery {
        return KeyAnswer::Reply("Irrelevant".into());
    }
    // NotUnderstood is an answer to a key, a Reject or Irrelevant the
    // initiator sends back to ours: nothing to say to either.
    if matches!(value, "NotUnderstood" | "Irrelevant" | "Reject") {
        return KeyAnswer::Silent;
    }
    match key {
        "HeaderDigest" | "DataDigest" => match pick_digest(value) {
            Some(on) => {
                if key == "HeaderDigest" {
                    params.header_digest = on;
                } else {
                    params.data_digest = on;
                }
                KeyAnswer::Reply(if on { "CRC32C" } else { "None" }.into())
            }
            None => reject(),
        },
        "MaxConnections" => match in_range(value, 1, 65535) {
            Some(_) => {
                params.max_connections = 1;
                KeyAnswer::Reply("1".into())
            }
            None => reject(),
        },
        "InitialR2T" => match boolean(value) {
            Some(v) => {
                params.initial_r2t = v || limits.initial_r2t;
                KeyAnswer::Reply(yes_no(params.initial_r2t))
            }
            None => reject(),
        },
        "ImmediateData" => match boolean(value) {
            Some(v) => {
                params.immediate_data = v && limits.immediate_data;
                KeyAnswer::Reply(yes_no(params.immediate_data))
            }
            None => reject(),
        },
        "DataPDUInOrder" | "DataSequenceInOrder" => match boolean(value) {
            // OR with our Yes: in order either way.
            Some(_) => KeyAnswer::Reply("Yes".into()),
            None => reject(),
        },
        "MaxRecvDataSegmentLength" => match in_range(value, 512, (1 << 24) - 1) {
            Some(n) => {
                params.initiator_max_recv_data_segment_length = n as u32;
                KeyAnswer::Silent
            }
            None => reject(),
        },
        "MaxBurstLength" => match in_range(value, 512, (1 << 24) - 1) {
            Some(n) => {
                params.max_burst_length = (n as u32).min(limits.max_burst_length);
                params.first_burst_length = params.first_burst_length.min(params.max_burst_length);
                KeyAnswer::Reply(params.max_burst_length.to_string())
            }
            None => reject(),
        },
        "FirstBurstLength" => match in_range(value, 512, (1 << 24) - 1) {
            Some(n) => {
                params.first_burst_length = (n as u32).min(limits.first_burst_length);
                KeyAnswer::Reply(params.first_burst_length.to_string())
            }
            None => reject(),
        },
        "DefaultTime2Wait" => match in_range(value, 0, 3600) {
            Some(n) => {
                params.default_time_to_wait = (n as u16).max(2);
                KeyAnswer::Reply(params.default_time_to_wait.to_string())
            }
            None => reject(),
        },
        "DefaultTime2Retain" => match in_range(value, 0, 3600) {
            // Tasks are not kept for reassignment (error recovery level 0).
            Some(_) => {
                params.default_time_to_retain = 0;
                KeyAnswer::Reply("0".into())
            }
            None => reject(),
        },
        "MaxOutstandingR2T" => match in_range(value, 1, 65535) {
            Some(n) => {
                params.max_outstanding_r2t = (n as u16).min(limits.max_outstanding_r2t);
                KeyAnswer::Reply(params.max_outstanding_r2t.to_string())
            }
            None => reject(),
        },
        "ErrorRecoveryLevel" => match in_range(value, 0, 2) {
            Some(_) => {
                params.error_recovery_level = 0;
                KeyAnswer::Reply("0".into())
            }
            None => reject(),
        },
        // RFC 3720 markers, gone from RFC 7143: older initiators still offer
        // them, and No is the only answer.
        "IFMarker" | "OFMarker" => match boolean(value) {
            Some(_) => KeyAnswer::Reply("No".into()),
            None => reject(),
        },
        "IFMarkInt" | "OFMarkInt" => KeyAnswer::Reply("Irrelevant".into()),
        // RFC 7144: we speak RFC 7143, level 1.
        "iSCSIProtocolLevel" => match in_range(value, 0, 31) {
            Some(n) => KeyAnswer::Reply(n.min(1).to_string()),
            None => reject(),
        },
        "InitiatorAlias" => KeyAnswer::Silent,
        _ => KeyAnswer::Reply("NotUnderstood".into()),
    }
}

impl SessionParams {
    /// Applies our declarations and the one constraint between keys
    /// (FirstBurstLength <= MaxBurstLength) once negotiation ends.
    pub fn settle(&mut self, limits: &TargetLimits) {
        self.target_max_recv_data_segment_length = limits.max_recv_data_segment_length;
        self.first_burst_length = self.first_burst_length.min(self.max_burst_length);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn answer(key: &str, value: &str) -> (KeyAnswer, SessionParams) {
        let mut p = SessionParams::default();
        let a = negotiate_key(
            &mut p,
            &TargetLimits::default(),
            SessionType::Normal,
            key,
            value,
        );
        (a, p)
    }

    fn reply(s: &str) -> KeyAnswer {
        KeyAnswer::Reply(s.into())
    }

    #[test]
    fn parses_pairs_and_refuses_duplicates_and_garbage() {
        let pairs = parse(b"InitiatorName=iqn.x\0SessionType=Normal\0").unwrap();
        assert_eq!(pairs.len(), 2);
        assert_eq!(pairs[1], ("SessionType".into(), "Normal".into()));
        assert!(matches!(parse(b"A=1\0A=2\0"), Err(TextError::Duplicate(_))));
        assert!(matches!(parse(b"novalue\0"), Err(TextError::Malformed(_))));
        assert!(matches!(parse(b"=x\0"), Err(TextError::Malformed(_))));
        assert!(parse(&vec![b'a'; MAX_TEXT_BYTES + 1]).is_err());
        assert_eq!(parse(b"A=\0").unwrap(), vec![("A".into(), String::new())]);
    }

    #[test]
    fn digests_take_the_first_supported_choice() {
        let (a, p) = answer("HeaderDigest", "CRC32C,None");
        assert_eq!(a, reply("CRC32C"));
        assert!(p.header_digest);
        assert_eq!(answer("DataDigest", "None,CRC32C").0, reply("None"));
        assert_eq!(answer("DataDigest", "MD5").0, reply("Reject"));
    }

    #[test]
    fn booleans_follow_and_and_or() {
        // InitialR2T is OR: our No leaves the initiator's value.
        assert_eq!(answer("InitialR2T", "Yes").0, reply("Yes"));
        assert_eq!(answer("InitialR2T", "No").0, reply("No"));
        // ImmediateData is AND.
        assert_eq!(answer("ImmediateData", "No").0, reply("No"));
        assert_eq!(answer("ImmediateData", "Yes").0, reply("Yes"));
        assert_eq!(answer("ImmediateData", "yes").0, reply("Reject"));
        assert_eq!(answer("DataPDUInOrder", "No").0, reply("Yes"));
    }

    #[test]
    fn numbers_take_the_minimum_or_maximum_in_range() {
        assert_eq!(answer("MaxBurstLength", "262144").0, reply("262144"));
        assert_eq!(answer("MaxBurstLength", "100").0, reply("Reject"));
        assert_eq!(answer("MaxBurstLength", "16777216").0, reply("Reject"));
        assert_eq!(answer("MaxOutstandingR2T", "64").0, reply("16"));
        assert_eq!(answer("DefaultTime2Wait", "0").0, reply("2"));
        assert_eq!(answer("DefaultTime2Wait", "5").0, reply("5"));
        assert_eq!(answer("ErrorRecoveryLevel", "2").0, reply("0"));
        assert_eq!(answer("MaxConnections", "8").0, reply("1"));
        assert_eq!(answer("MaxConnections", "0").0, reply("Reject"));
        assert_eq!(answer("DefaultTime2Retain", "x").0, reply("Reject"));
    }

    #[test]
    fn declarations_and_unknown_keys() {
        let (a, p) = answer("MaxRecvDataSegmentLength", "65536");
        assert_eq!(a, KeyAnswer::Silent);
        assert_eq!(p.initiator_max_recv_data_segment_length, 65536);
        assert_eq!(answer("MaxRecvDataSegmentLength", "1").0, reply("Reject"));
        assert_eq!(answer("X-com.example.Key", "1").0, reply("NotUnderstood"));
        let mut p = SessionParams::default();
        assert_eq!(
            negotiate_key(
                &mut p,
                &TargetLimits::default(),
                SessionType::Discovery,
                "MaxBurstLength",
                "512"
            ),
            reply("Irrelevant")
        );
    }

    #[test]
    fn first_burst_never_exceeds_max_burst() {
        let limits = TargetLimits::default();
        let mut p = SessionParams::default();
        negotiate_key(
            &mut p,
            &limits,
            SessionType::Normal,
            "FirstBurstLength",
            "1048576",
        );
        negotiate_key(
            &mut p,
            &limits,
            SessionType::Normal,
            "MaxBurstLength",
            "65536",
        );
        p.settle(&limits);
        assert!(p.first_burst_length <= p.max_burst_length);
    }

    proptest! {
        #[test]
        fn parse_never_panics_and_encode_round_trips(
            pairs in proptest::collection::btree_map("[A-Za-z][A-Za-z0-9.]{0,20}", "[ -~&&[^=]]{0,30}", 0..10)
        ) {
            let pairs: Vec<(String, String)> = pairs.into_iter().collect();
            prop_assert_eq!(parse(&encode(&pairs)).unwrap(), pairs);
        }

        #[test]
        fn negotiated_numbers_stay_in_range(key in prop_oneof![
            Just("MaxBurstLength"), Just("FirstBurstLength"), Just("MaxOutstandingR2T"),
            Just("DefaultTime2Wait"), Just("DefaultTime2Retain"), Just("MaxConnections")
        ], value in any::<u32>()) {
            let limits = TargetLimits::default();
            let mut p = SessionParams::default();
            let a = negotiate_key(&mut p, &limits, SessionType::Normal, key, &value.to_string());
            p.settle(&limits);
            if let KeyAnswer::Reply(v) = a {
                if v != "Reject" {
                    let n: u64 = v.parse().unwrap();
                    prop_assert!(n <= value as u64 || key == "DefaultTime2Wait");
                }
            }
            prop_assert!(p.first_burst_length <= p.max_burst_length);
            prop_assert!(p.max_outstanding_r2t >= 1);
        }
    }
}
