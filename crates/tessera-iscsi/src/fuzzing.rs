//! Entry points shared by the cargo-fuzz targets in `fuzz/` and the stable
//! test that replays their corpus: raw initiator bytes in, the same
//! decoders and state machines the server runs, invariants asserted.
//!
//! Owns: nothing but the drivers. Must not touch: sockets or tasks.
//! Invariant: for any input these functions return; a panic here is a bug
//! in the protocol code (or a broken invariant, asserted below).

use crate::catalog::{ChapCredentials, ChapSecret, StaticCatalog, TargetEntry};
use crate::login::{LoggedIn, Login, LoginStep, STAGE_FULL_FEATURE};
use crate::pdu::{Digests, Pdu, MAX_DATA_SEGMENT_BYTES};
use crate::scsi::{self, Nexus, Reset, ScsiTarget};
use crate::session::{Action, FullFeature, MAX_TASKS};
use crate::text::{self, negotiate_key, SessionParams, SessionType, TargetLimits};
use bytes::Bytes;
use std::sync::Arc;

/// Largest data segment the drivers accept, in bytes.
pub const FUZZ_MAX_DATA: u32 = 64 * 1024;

/// Splits `data` into PDUs: the first byte picks the digests, the rest is
/// PDUs back to back. Stops at the first error or incomplete PDU.
fn pdus(data: &[u8]) -> (Digests, Vec<Pdu>) {
    let Some((&mode, mut rest)) = data.split_first() else {
        return (Digests::default(), Vec::new());
    };
    let digests = Digests {
        header: mode & 1 != 0,
        data: mode & 2 != 0,
    };
    let mut out = Vec::new();
    while let Ok(Some((pdu, used))) = Pdu::parse(rest, digests, FUZZ_MAX_DATA) {
        assert!(used > 0 && used <= rest.len());
        rest = &rest[used..];
        out.push(pdu);
    }
    (digests, out)
}

/// Decodes PDUs and checks that each one re-encodes to bytes that decode
/// to the same PDU.
pub fn pdu(data: &[u8]) {
    let (digests, pdus) = pdus(data);
    for pdu in pdus {
        let wire = pdu.to_bytes(digests);
        assert_eq!(wire.len() % 4, 0, "unpadded PDU");
        let (again, used) = Pdu::parse(&wire, digests, MAX_DATA_SEGMENT_BYTES)
            .expect("re-encoded PDU decodes")
            .expect("re-encoded PDU is complete");
        assert_eq!(used, wire.len());
        assert_eq!(again, pdu, "PDU changed in a round trip");
    }
}

/// Parses `data` as a text and negotiates every key as a normal and as a
/// discovery session would.
pub fn text_keys(data: &[u8]) {
    let Ok(pairs) = text::parse(data) else {
        return;
    };
    assert_eq!(text::parse(&text::encode(&pairs)).as_ref(), Ok(&pairs));
    for session_type in [SessionType::Normal, SessionType::Discovery] {
        let limits = TargetLimits::default();
        let mut params = SessionParams::default();
        for (key, value) in &pairs {
            negotiate_key(&mut params, &limits, session_type, key, value);
        }
        params.settle(&limits);
        assert!(params.first_burst_length <= params.max_burst_length);
        assert!((512..1 << 24).contains(&params.initiator_max_recv_data_segment_length));
        assert!(params.max_outstanding_r2t >= 1);
        assert_eq!(params.error_recovery_level, 0);
        assert_eq!(params.max_connections, 1);
    }
}

/// A target that answers every command at once, for the drivers.
struct EchoTarget;

#[async_trait::async_trait]
impl ScsiTarget for EchoTarget {
    async fn execute(&self, command: scsi::Command) -> scsi::Response {
        answer(&command)
    }
    async fn reset(&self, _nexus: &Nexus, _reset: Reset) {}
    async fn nexus_ended(&self, _nexus: &Nexus) {}
}

/// The answer of [`EchoTarget`]: data-in as long as CDB byte 4 says in
/// 512-byte blocks, all data-out used.
fn answer(command: &scsi::Command) -> scsi::Response {
    let blocks = command.cdb.get(4).copied().unwrap_or(0) as usize;
    let len = (blocks * 512).min(command.expected_data_in as usize);
    scsi::Response {
        status: if command.cdb.first() == Some(&0xff) {
            scsi::Status::CheckCondition
        } else {
            scsi::Status::Good
        },
        sense: (command.cdb.first() == Some(&0xff)).then(|| Bytes::from_static(&[0x70; 18])),
        data_in: Bytes::from(vec![0u8; len]),
        data_out_used: command.data_out.len() as u32,
    }
}

/// The catalog of the login driver: `iqn.fuzz:open` admits everyone,
/// `iqn.fuzz:chap` requires CHAP (and offers mutual CHAP), `iqn.fuzz:acl`
/// admits only `iqn.fuzz:allowed`.
fn catalog() -> StaticCatalog {
    let catalog = StaticCatalog::new();
    let entry = |name: &str| TargetEntry {
        name: name.into(),
        alias: None,
        device: Arc::new(EchoTarget),
        portals: Vec::new(),
        portal_group_tag: 1,
        relative_port: 1,
        initiators: crate::catalog::Initiators::Any,
        chap: ChapCredentials::default(),
        session_hold: None,
    };
    catalog.insert(entry("iqn.fuzz:open"));
    let mut chap = entry("iqn.fuzz:chap");
    chap.chap = ChapCredentials {
        initiator: Some(ChapSecret {
            user: "user".into(),
            secret: b"initiator-secret".to_vec(),
        }),
        target: Some(ChapSecret {
            user: "target".into(),
            secret: b"target-secret-1".to_vec(),
        }),
    };
    catalog.insert(chap);
    let mut acl = entry("iqn.fuzz:acl");
    acl.initiators = crate::catalog::Initiators::Only(vec!["iqn.fuzz:allowed".into()]);
    catalog.insert(acl);
    catalog
}

/// Feeds Login Requests to the login state machine; after a completed
/// login the remaining PDUs go to the full-feature phase.
pub fn login(data: &[u8]) {
    let (_, pdus) = pdus(data);
    let catalog = catalog();
    let mut login = Login::new(TargetLimits::default(), 1, MAX_TASKS);
    let mut rest = pdus.into_iter();
    for pdu in rest.by_ref() {
        let Pdu::LoginRequest(request) = pdu else {
            return;
        };
        match login.handle(&catalog, request) {
            LoginStep::Continue(response) => check_login_response(&response, false),
            LoginStep::Refuse(response, status) => {
                assert_ne!(status, 0);
                check_login_response(&response, false);
                return;
            }
            LoginStep::Complete(response, logged_in) => {
                check_login_response(&response, true);
                if let Some(target) = &logged_in.target {
                    assert_ne!(
                        target.name, "iqn.fuzz:chap",
                        "logged in to a CHAP target without the secret"
                    );
                    assert!(target.admits(&logged_in.initiator_name));
                }
                full_feature_with(&logged_in, rest.collect());
                return;
            }
        }
    }
}

fn check_login_response(pdu: &Pdu, complete: bool) {
    let Pdu::LoginResponse(r) = pdu else {
        panic!("login answered with {pdu:?}");
    };
    assert!(r.data.len() <= 8192, "login response longer than 8 KiB");
    assert!(
        text::parse(&r.data).is_ok(),
        "unparseable login response text"
    );
    assert_eq!(complete, r.transit && r.next_stage == STAGE_FULL_FEATURE);
    if complete {
        assert_ne!(r.tsih, 0);
    }
}

/// Feeds PDUs to the full-feature phase of a normal session with default
/// parameters (InitialR2T=No, ImmediateData=Yes, 8 KiB segments); every
/// command completes at once.
pub fn full_feature(data: &[u8]) {
    let (_, pdus) = pdus(data);
    let mut params = SessionParams {
        initial_r2t: false,
        ..SessionParams::default()
    };
    params.settle(&TargetLimits::default());
    let logged_in = LoggedIn {
        session_type: SessionType::Normal,
        target: None,
        initiator_name: "iqn.fuzz:initiator".into(),
        isid: [0x80, 0, 0, 0, 0, 1],
        tsih: 1,
        cid: 0,
        params,
        exp_cmd_sn: 1,
        max_cmd_sn: MAX_TASKS,
        stat_sn: 1,
    };
    full_feature_with(&logged_in, pdus);
}

fn full_feature_with(logged_in: &LoggedIn, pdus: Vec<Pdu>) {
    let catalog = catalog();
    let nexus = Nexus {
        initiator_port: "iqn.fuzz:initiator,i,0x800000000001".into(),
        relative_port: 1,
    };
    let mut session = FullFeature::new(logged_in, nexus);
    let segment = session.params().initiator_max_recv_data_segment_length as usize;
    let mut queue = Vec::new();
    for pdu in pdus {
        queue.extend(session.receive(pdu, &catalog));
        while let Some(action) = queue.pop() {
            match action {
                Action::Send(out) => {
                    check_sent(&out, segment);
                }
                Action::Execute(command) => {
                    let response = answer(&command);
                    queue.extend(session.complete(command.tag, response));
                }
                Action::Reset { itt, .. } => queue.extend(session.reset_done(itt)),
                Action::Abort(_) | Action::EndNexus => {}
                Action::Close => return,
            }
        }
        assert!(session.tasks_in_flight() <= 2 * MAX_TASKS as usize);
    }
}

/// Every PDU sent fits the initiator's segment limit and is a target PDU.
fn check_sent(pdu: &Pdu, segment: usize) {
    let frame = pdu.to_frame();
    assert!(
        frame.data.len() <= segment.max(48),
        "PDU over MaxRecvDataSegmentLength"
    );
    assert!(frame.opcode() >= 0x20, "target sent an initiator opcode");
}
