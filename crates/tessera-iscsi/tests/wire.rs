//! The iSCSI transport over a real socket, driven with raw PDUs: login and
//! its refusals, CHAP misuse, discovery, data transfer with R2T and
//! Data-In, residuals, malformed input, the CmdSN window, task management
//! and logout.

mod common;

use bytes::Bytes;
use common::*;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tessera_iscsi::chap;
use tessera_iscsi::pdu::{self, reject_reason, Digests, Pdu, Residual, RESERVED_TAG};
use tessera_iscsi::{ChapCredentials, ChapSecret, StaticCatalog};

const TARGET: &str = "iqn.2026-11.io.tessera:vol";

fn server() -> (TestServer, Arc<SmallTarget>) {
    let target = SmallTarget::new(1 << 20);
    let server = TestServer::start(single_target(TARGET, target.clone()));
    (server, target)
}

fn status(r: &pdu::LoginResponse) -> u16 {
    (r.status_class as u16) << 8 | r.status_detail as u16
}

#[test]
fn nop_out_is_echoed_with_the_next_stat_sn() {
    let (server, _) = server();
    let mut c = RawInitiator::connect(server.addr);
    let login = c.login(TARGET, &[]);
    let itt = c.nop(b"are you there");
    match c.recv() {
        Some(Pdu::NopIn(n)) => {
            assert_eq!(n.itt, itt);
            assert_eq!(n.ttt, RESERVED_TAG);
            assert_eq!(&n.data[..], b"are you there");
            assert_eq!(n.stat_sn, login.stat_sn + 1);
            assert_eq!(n.exp_cmd_sn, 1);
        }
        other => panic!("expected NOP-In, got {other:?}"),
    }
}

#[test]
fn login_refusals_carry_the_standard_status() {
    let catalog = Arc::new(StaticCatalog::new());
    let mut acl = entry(TARGET, SmallTarget::new(1 << 20), 1);
    acl.initiators = tessera_iscsi::Initiators::Only(vec!["iqn.2026-11.test:someone-else".into()]);
    catalog.insert(acl);
    let server = TestServer::start(catalog);

    let mut c = RawInitiator::connect(server.addr);
    let r = c.login_request(
        1,
        3,
        true,
        &[
            ("InitiatorName", "iqn.2026-11.test:raw"),
            ("TargetName", "iqn.2026-11.io.tessera:missing"),
        ],
    );
    assert_eq!(status(&r), 0x0203, "target not found");
    assert!(c.closed());

    let mut c = RawInitiator::connect(server.addr);
    let r = c.login_request(
        1,
        3,
        true,
        &[
            ("InitiatorName", "iqn.2026-11.test:raw"),
            ("TargetName", TARGET),
        ],
    );
    assert_eq!(status(&r), 0x0202, "not in the access list");
    assert!(c.closed());

    let mut c = RawInitiator::connect(server.addr);
    let r = c.login_request(1, 3, true, &[("TargetName", TARGET)]);
    assert_eq!(status(&r), 0x0207, "no InitiatorName");

    let mut c = RawInitiator::connect(server.addr);
    let r = c.login_request(1, 3, true, &[("InitiatorName", "iqn.2026-11.test:raw")]);
    assert_eq!(status(&r), 0x0207, "normal session without TargetName");
}

/// A catalog that knows one target it does not serve now.
struct Refusing;

impl tessera_iscsi::TargetCatalog for Refusing {
    fn target_names(&self) -> Vec<String> {
        Vec::new()
    }
    fn target(&self, _name: &str) -> Option<tessera_iscsi::TargetEntry> {
        None
    }
    fn refusal(&self, name: &str) -> Option<String> {
        (name == TARGET).then(|| "volume vol is being filled".to_string())
    }
}

#[test]
fn a_login_to_a_target_not_served_for_now_is_service_unavailable_not_not_found() {
    let server = TestServer::start(Arc::new(Refusing));
    for (target, want) in [(TARGET, 0x0301), ("iqn.2026-11.io.tessera:missing", 0x0203)] {
        let mut c = RawInitiator::connect(server.addr);
        let r = c.login_request(
            1,
            3,
            true,
            &[
                ("InitiatorName", "iqn.2026-11.test:raw"),
                ("TargetName", target),
            ],
        );
        assert_eq!(status(&r), want, "{target}");
        assert!(c.closed());
    }
}

#[test]
fn operational_keys_are_negotiated_and_our_limit_declared() {
    let (server, _) = server();
    let mut c = RawInitiator::connect(server.addr);
    let r = c.login(
        TARGET,
        &[
            ("HeaderDigest", "None"),
            ("MaxBurstLength", "65536"),
            ("FirstBurstLength", "1048576"),
            ("InitialR2T", "No"),
            ("ImmediateData", "Yes"),
            ("MaxOutstandingR2T", "4"),
            ("MaxRecvDataSegmentLength", "4096"),
            ("X-com.example.Unknown", "1"),
            ("ErrorRecoveryLevel", "2"),
        ],
    );
    let keys = tessera_iscsi::text::parse(&r.data).expect("text");
    let get = |k: &str| {
        keys.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(get("HeaderDigest"), Some("None"));
    assert_eq!(get("MaxBurstLength"), Some("65536"));
    assert_eq!(get("FirstBurstLength"), Some("262144"));
    assert_eq!(get("InitialR2T"), Some("No"));
    assert_eq!(get("ImmediateData"), Some("Yes"));
    assert_eq!(get("MaxOutstandingR2T"), Some("4"));
    assert_eq!(get("X-com.example.Unknown"), Some("NotUnderstood"));
    assert_eq!(get("ErrorRecoveryLevel"), Some("0"));
    assert_eq!(get("MaxRecvDataSegmentLength"), Some("262144"));
    assert_eq!(get("TargetPortalGroupTag"), Some("1"));
}

#[test]
fn discovery_lists_every_target_on_every_portal() {
    let catalog = Arc::new(StaticCatalog::new());
    catalog.insert(entry("iqn.2026-11.io.tessera:a", SmallTarget::new(4096), 1));
    catalog.insert(entry("iqn.2026-11.io.tessera:b", SmallTarget::new(4096), 1));
    let server = TestServer::start(catalog);
    let mut c = RawInitiator::connect(server.addr);
    let r = c.login_request(
        1,
        3,
        true,
        &[
            ("InitiatorName", "iqn.2026-11.test:raw"),
            ("SessionType", "Discovery"),
            ("MaxBurstLength", "65536"),
        ],
    );
    assert_eq!(status(&r), 0);
    let keys = tessera_iscsi::text::parse(&r.data).unwrap();
    assert!(keys.contains(&("MaxBurstLength".into(), "Irrelevant".into())));
    c.send(&Pdu::TextRequest(pdu::TextRequest {
        immediate: true,
        final_pdu: true,
        continue_text: false,
        lun: [0; 8],
        itt: 7,
        ttt: RESERVED_TAG,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.exp_stat_sn,
        data: Bytes::from_static(b"SendTargets=All\0"),
    }));
    let Some(Pdu::TextResponse(t)) = c.recv() else {
        panic!("no text response");
    };
    assert!(t.final_pdu);
    let text = String::from_utf8(t.data.to_vec()).unwrap();
    let lines: Vec<&str> = text.split('\0').filter(|l| !l.is_empty()).collect();
    assert_eq!(
        lines,
        vec![
            "TargetName=iqn.2026-11.io.tessera:a",
            "TargetAddress=127.0.0.1:3260,1",
            "TargetAddress=127.0.0.2:3260,2",
            "TargetName=iqn.2026-11.io.tessera:b",
            "TargetAddress=127.0.0.1:3260,1",
            "TargetAddress=127.0.0.2:3260,2",
        ]
    );
    // A SCSI command in a discovery session is a protocol error.
    c.command(&[0, 0, 0, 0, 0, 0], false, false, 0, Bytes::new(), true);
    assert!(matches!(c.recv(), Some(Pdu::Reject(r)) if r.reason == reject_reason::PROTOCOL_ERROR));
}

fn chap_catalog(mutual: bool) -> Arc<StaticCatalog> {
    let catalog = Arc::new(StaticCatalog::new());
    let mut e = entry(TARGET, SmallTarget::new(1 << 20), 1);
    e.chap = ChapCredentials {
        initiator: Some(ChapSecret {
            user: "alice".into(),
            secret: b"alice-secret-12".to_vec(),
        }),
        target: mutual.then(|| ChapSecret {
            user: "tessera".into(),
            secret: b"target-secret-12".to_vec(),
        }),
    };
    catalog.insert(e);
    catalog
}

/// Runs CHAP up to the challenge; returns (CHAP_I, CHAP_C).
fn chap_challenge(c: &mut RawInitiator) -> (u8, Vec<u8>) {
    let r = c.login_request(
        0,
        1,
        true,
        &[
            ("InitiatorName", "iqn.2026-11.test:raw"),
            ("TargetName", TARGET),
            ("AuthMethod", "CHAP,None"),
        ],
    );
    assert_eq!(status(&r), 0);
    assert!(!r.transit, "no transit before authentication");
    let keys = tessera_iscsi::text::parse(&r.data).unwrap();
    assert!(keys.contains(&("AuthMethod".into(), "CHAP".into())));
    let r = c.login_request(0, 1, false, &[("CHAP_A", "7,5")]);
    let keys = tessera_iscsi::text::parse(&r.data).unwrap();
    let get = |k: &str| {
        keys.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("CHAP_A").as_deref(), Some("5"));
    let id: u8 = get("CHAP_I").unwrap().parse().unwrap();
    let challenge = chap::decode_binary(&get("CHAP_C").unwrap()).unwrap();
    (id, challenge)
}

#[test]
fn chap_refuses_missing_and_wrong_credentials_and_admits_the_right_ones() {
    let server = TestServer::start(chap_catalog(false));

    // Skipping security negotiation when CHAP is required.
    let mut c = RawInitiator::connect(server.addr);
    let r = c.login_request(
        1,
        3,
        true,
        &[
            ("InitiatorName", "iqn.2026-11.test:raw"),
            ("TargetName", TARGET),
        ],
    );
    assert_eq!(status(&r), 0x0201);
    assert!(c.closed());

    // Offering only None.
    let mut c = RawInitiator::connect(server.addr);
    let r = c.login_request(
        0,
        1,
        true,
        &[
            ("InitiatorName", "iqn.2026-11.test:raw"),
            ("TargetName", TARGET),
            ("AuthMethod", "None"),
        ],
    );
    assert_eq!(status(&r), 0x0201);

    // Wrong secret.
    let mut c = RawInitiator::connect(server.addr);
    let (id, challenge) = chap_challenge(&mut c);
    let bad = chap::response(id, b"not-the-secret", &challenge);
    let r = c.login_request(
        0,
        1,
        true,
        &[("CHAP_N", "alice"), ("CHAP_R", &chap::encode_hex(&bad))],
    );
    assert_eq!(status(&r), 0x0201);
    assert!(c.closed());

    // Malformed response.
    let mut c = RawInitiator::connect(server.addr);
    chap_challenge(&mut c);
    let r = c.login_request(0, 1, true, &[("CHAP_N", "alice"), ("CHAP_R", "0xzz")]);
    assert_eq!(status(&r), 0x0201);

    // The right secret, then operational negotiation, then a command.
    let mut c = RawInitiator::connect(server.addr);
    let (id, challenge) = chap_challenge(&mut c);
    let good = chap::response(id, b"alice-secret-12", &challenge);
    let r = c.login_request(
        0,
        1,
        true,
        &[("CHAP_N", "alice"), ("CHAP_R", &chap::encode_hex(&good))],
    );
    assert_eq!(status(&r), 0);
    assert!(r.transit && r.next_stage == 1);
    let r = c.login_request(1, 3, true, &[("MaxRecvDataSegmentLength", "8192")]);
    assert_eq!(status(&r), 0);
    assert!(r.transit && r.next_stage == 3);
    c.command(&[0; 6], false, false, 0, Bytes::new(), true);
    assert!(matches!(c.recv(), Some(Pdu::ScsiResponse(r)) if r.status == 0));

    // Mutual CHAP asked of a target without a secret of its own.
    let mut c = RawInitiator::connect(server.addr);
    let (id, challenge) = chap_challenge(&mut c);
    let good = chap::response(id, b"alice-secret-12", &challenge);
    let r = c.login_request(
        0,
        1,
        true,
        &[
            ("CHAP_N", "alice"),
            ("CHAP_R", &chap::encode_hex(&good)),
            ("CHAP_I", "9"),
            ("CHAP_C", "0x0102030405060708090a"),
        ],
    );
    assert_eq!(status(&r), 0x0201);
}

#[test]
fn mutual_chap_answers_the_initiator_and_refuses_a_reflected_challenge() {
    let server = TestServer::start(chap_catalog(true));

    let mut c = RawInitiator::connect(server.addr);
    let (id, challenge) = chap_challenge(&mut c);
    let good = chap::response(id, b"alice-secret-12", &challenge);
    let ours = [0x42u8; 16];
    let r = c.login_request(
        0,
        1,
        true,
        &[
            ("CHAP_N", "alice"),
            ("CHAP_R", &chap::encode_hex(&good)),
            ("CHAP_I", "77"),
            ("CHAP_C", &chap::encode_hex(&ours)),
        ],
    );
    assert_eq!(status(&r), 0);
    let keys = tessera_iscsi::text::parse(&r.data).unwrap();
    let get = |k: &str| {
        keys.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("CHAP_N").as_deref(), Some("tessera"));
    let answer = chap::decode_binary(&get("CHAP_R").unwrap()).unwrap();
    assert_eq!(
        answer,
        chap::response(77, b"target-secret-12", &ours).to_vec()
    );

    // The target's own challenge sent back to it.
    let mut c = RawInitiator::connect(server.addr);
    let (id, challenge) = chap_challenge(&mut c);
    let good = chap::response(id, b"alice-secret-12", &challenge);
    let r = c.login_request(
        0,
        1,
        true,
        &[
            ("CHAP_N", "alice"),
            ("CHAP_R", &chap::encode_hex(&good)),
            ("CHAP_I", &id.to_string()),
            ("CHAP_C", &chap::encode_hex(&challenge)),
        ],
    );
    assert_eq!(status(&r), 0x0201);
    assert!(c.closed());
}

/// Collects Data-In PDUs and the status of one read.
fn read_reply(
    c: &mut RawInitiator,
    itt: u32,
) -> (Vec<u8>, Vec<pdu::DataIn>, Option<pdu::ScsiResponse>) {
    let mut data = Vec::new();
    let mut pdus = Vec::new();
    loop {
        match c.recv() {
            Some(Pdu::DataIn(d)) => {
                assert_eq!(d.itt, itt);
                assert_eq!(d.buffer_offset as usize, data.len());
                data.extend_from_slice(&d.data);
                let done = d.status.is_some();
                pdus.push(d);
                if done {
                    return (data, pdus, None);
                }
            }
            Some(Pdu::ScsiResponse(r)) => {
                assert_eq!(r.itt, itt);
                return (data, pdus, Some(r));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn writes_are_solicited_with_r2t_and_reads_split_to_the_initiators_segment() {
    let (server, _) = server();
    let mut c = RawInitiator::connect(server.addr);
    c.login(
        TARGET,
        &[
            ("InitialR2T", "Yes"),
            ("ImmediateData", "Yes"),
            ("FirstBurstLength", "8192"),
            ("MaxBurstLength", "16384"),
            ("MaxOutstandingR2T", "2"),
            ("MaxRecvDataSegmentLength", "4096"),
        ],
    );
    let payload = random_bytes(1, 64 * 1024);
    let blocks = (payload.len() / BLOCK) as u16;
    // 4 KiB of immediate data; the rest solicited.
    let itt = c.command(
        &write10(8, blocks),
        false,
        true,
        payload.len() as u32,
        Bytes::copy_from_slice(&payload[..4096]),
        true,
    );
    let answer = |c: &mut RawInitiator, r: &pdu::R2t| {
        let mut sent = 0;
        let mut data_sn = 0;
        while sent < r.desired_length as usize {
            let at = r.buffer_offset as usize + sent;
            let len = (r.desired_length as usize - sent).min(8192);
            c.send(&Pdu::DataOut(pdu::DataOut {
                final_pdu: sent + len == r.desired_length as usize,
                lun: pdu::lun_field(0),
                itt,
                ttt: r.ttt,
                exp_stat_sn: c.exp_stat_sn,
                data_sn,
                buffer_offset: at as u32,
                data: Bytes::copy_from_slice(&payload[at..at + len]),
            }));
            data_sn += 1;
            sent += len;
        }
        sent
    };
    let mut outstanding = std::collections::VecDeque::new();
    let mut solicited = 4096usize;
    let mut covered = 4096usize;
    let mut next_r2t_sn = 0;
    while solicited < payload.len() {
        let Some(Pdu::R2t(r)) = c.recv() else {
            panic!("expected an R2T");
        };
        assert_eq!(r.itt, itt);
        assert_eq!(r.r2t_sn, next_r2t_sn);
        assert_eq!(r.buffer_offset as usize, solicited);
        assert!(r.desired_length <= 16384);
        next_r2t_sn += 1;
        solicited += r.desired_length as usize;
        outstanding.push_back(r);
        assert!(outstanding.len() <= 2, "more R2Ts than MaxOutstandingR2T");
        if outstanding.len() == 2 || solicited == payload.len() {
            let r = outstanding.pop_front().unwrap();
            covered += answer(&mut c, &r);
        }
    }
    while let Some(r) = outstanding.pop_front() {
        covered += answer(&mut c, &r);
    }
    match c.recv() {
        Some(Pdu::ScsiResponse(resp)) => {
            assert_eq!(resp.status, 0);
            assert_eq!(resp.residual, Residual::None);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(covered, payload.len());

    let itt = c.command(
        &read10(8, blocks),
        true,
        false,
        payload.len() as u32,
        Bytes::new(),
        true,
    );
    let (data, pdus, response) = read_reply(&mut c, itt);
    assert!(response.is_none(), "status rides in the last Data-In");
    assert_eq!(data, payload);
    assert_eq!(pdus.len(), payload.len() / 4096);
    for (i, d) in pdus.iter().enumerate() {
        assert_eq!(d.data_sn, i as u32);
        assert!(d.data.len() <= 4096);
    }
    // F closes every 16 KiB burst.
    assert!(pdus[3].final_pdu && !pdus[2].final_pdu);
}

#[test]
fn pipelined_writes_carried_whole_in_immediate_data_land_where_they_were_sent() {
    let (server, _) = server();
    let mut c = RawInitiator::connect(server.addr);
    c.login(TARGET, &[("InitialR2T", "Yes"), ("ImmediateData", "Yes")]);
    // Many commands in flight at once, so their data shares the target's
    // read buffer; each must still reach its own blocks.
    let writes = 48usize;
    let payload = random_bytes(7, writes * 4096);
    let mut tags = Vec::new();
    for (i, chunk) in payload.chunks(4096).enumerate() {
        tags.push(c.command(
            &write10((i * 8) as u32, 8),
            false,
            true,
            4096,
            Bytes::copy_from_slice(chunk),
            true,
        ));
    }
    for _ in 0..writes {
        match c.recv() {
            Some(Pdu::ScsiResponse(r)) => {
                assert!(tags.contains(&r.itt));
                assert_eq!(r.status, 0);
                assert_eq!(r.residual, Residual::None);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let itt = c.command(
        &read10(0, (writes * 8) as u16),
        true,
        false,
        payload.len() as u32,
        Bytes::new(),
        true,
    );
    assert_eq!(read_reply(&mut c, itt).0, payload);
}

#[test]
fn unsolicited_data_up_to_first_burst_then_r2t() {
    let (server, _) = server();
    let mut c = RawInitiator::connect(server.addr);
    c.login(
        TARGET,
        &[
            ("InitialR2T", "No"),
            ("ImmediateData", "No"),
            ("FirstBurstLength", "4096"),
        ],
    );
    let payload = random_bytes(2, 6144);
    let itt = c.command(&write10(0, 12), false, true, 6144, Bytes::new(), false);
    for (i, chunk) in payload[..4096].chunks(2048).enumerate() {
        c.send(&Pdu::DataOut(pdu::DataOut {
            final_pdu: i == 1,
            lun: pdu::lun_field(0),
            itt,
            ttt: RESERVED_TAG,
            exp_stat_sn: c.exp_stat_sn,
            data_sn: i as u32,
            buffer_offset: (i * 2048) as u32,
            data: Bytes::copy_from_slice(chunk),
        }));
    }
    let Some(Pdu::R2t(r)) = c.recv() else {
        panic!("expected an R2T for the rest");
    };
    assert_eq!((r.buffer_offset, r.desired_length), (4096, 2048));
    c.send(&Pdu::DataOut(pdu::DataOut {
        final_pdu: true,
        lun: pdu::lun_field(0),
        itt,
        ttt: r.ttt,
        exp_stat_sn: c.exp_stat_sn,
        data_sn: 0,
        buffer_offset: 4096,
        data: Bytes::copy_from_slice(&payload[4096..]),
    }));
    assert!(matches!(c.recv(), Some(Pdu::ScsiResponse(r)) if r.status == 0));
    let itt = c.command(&read10(0, 12), true, false, 6144, Bytes::new(), true);
    assert_eq!(read_reply(&mut c, itt).0, payload);
}

#[test]
fn residuals_are_exact_both_ways() {
    let (server, _) = server();
    let mut c = RawInitiator::connect(server.addr);
    c.login(TARGET, &[("ImmediateData", "Yes"), ("InitialR2T", "No")]);
    // Read of one block with room for 10000 bytes: underflow.
    let itt = c.command(&read10(0, 1), true, false, 10000, Bytes::new(), true);
    let (data, pdus, _) = read_reply(&mut c, itt);
    assert_eq!(data.len(), 512);
    assert_eq!(
        pdus.last().unwrap().residual,
        Residual::Underflow(10000 - 512)
    );
    // Read of two blocks with room for 200 bytes: overflow.
    let itt = c.command(&read10(0, 2), true, false, 200, Bytes::new(), true);
    let (data, pdus, _) = read_reply(&mut c, itt);
    assert_eq!(data.len(), 200);
    assert_eq!(
        pdus.last().unwrap().residual,
        Residual::Overflow(1024 - 200)
    );
    // Read with no room at all: overflow of the whole block, status alone.
    let itt = c.command(&read10(0, 1), true, false, 0, Bytes::new(), true);
    let (_, _, response) = read_reply(&mut c, itt);
    assert_eq!(response.unwrap().residual, Residual::Overflow(512));
    // Write of one block with 1024 bytes announced: underflow.
    c.command(
        &write10(0, 1),
        false,
        true,
        1024,
        Bytes::from(vec![1u8; 1024]),
        true,
    );
    let Some(Pdu::ScsiResponse(r)) = c.recv() else {
        panic!("no response")
    };
    assert_eq!(r.residual, Residual::Underflow(512));
    // Write of two blocks with 512 bytes announced: overflow.
    c.command(
        &write10(0, 2),
        false,
        true,
        512,
        Bytes::from(vec![1u8; 512]),
        true,
    );
    let Some(Pdu::ScsiResponse(r)) = c.recv() else {
        panic!("no response")
    };
    assert_eq!(r.residual, Residual::Overflow(512));
}

#[test]
fn malformed_pdus_are_rejected_and_the_connection_survives_what_it_can() {
    let (server, _) = server();
    let mut c = RawInitiator::connect(server.addr);
    c.login(TARGET, &[]);
    // Unknown opcode.
    let mut bad = [0u8; 48];
    bad[0] = 0x1c;
    bad[16..20].copy_from_slice(&[0, 0, 0, 9]);
    c.send_raw(&bad);
    match c.recv() {
        Some(Pdu::Reject(r)) => {
            assert_eq!(r.reason, reject_reason::COMMAND_NOT_SUPPORTED);
            assert_eq!(&r.header[..], &bad[..]);
        }
        other => panic!("expected a reject, got {other:?}"),
    }
    // A target opcode from the initiator.
    let mut bad = [0u8; 48];
    bad[0] = pdu::opcode::R2T;
    c.send_raw(&bad);
    assert!(
        matches!(c.recv(), Some(Pdu::Reject(r)) if r.reason == reject_reason::COMMAND_NOT_SUPPORTED)
    );
    // Immediate data on a read.
    c.command(
        &read10(0, 1),
        true,
        false,
        512,
        Bytes::from_static(b"oops"),
        true,
    );
    assert!(matches!(c.recv(), Some(Pdu::Reject(r)) if r.reason == reject_reason::PROTOCOL_ERROR));
    // The CmdSN of the rejected command was consumed: the next one runs.
    let itt = c.command(&[0; 6], false, false, 0, Bytes::new(), true);
    assert!(matches!(c.recv(), Some(Pdu::ScsiResponse(r)) if r.itt == itt && r.status == 0));
    // A SNACK at error recovery level 0.
    let mut snack = [0u8; 48];
    snack[0] = pdu::opcode::SNACK;
    c.send_raw(&snack);
    assert!(matches!(c.recv(), Some(Pdu::Reject(r)) if r.reason == reject_reason::PROTOCOL_ERROR));
    // A data segment longer than we declared: rejected, then closed.
    let mut huge = [0u8; 48];
    huge[0] = pdu::opcode::NOP_OUT | 0x40;
    huge[1] = 0x80;
    huge[5] = 0x10; // 1 MiB
    c.send_raw(&huge);
    assert!(matches!(c.recv(), Some(Pdu::Reject(r)) if r.reason == reject_reason::PROTOCOL_ERROR));
    assert!(c.closed());
}

#[test]
fn digests_are_checked_on_headers_and_data() {
    let (server, _) = server();
    let mut c = RawInitiator::connect(server.addr);
    let r = c.login(
        TARGET,
        &[("HeaderDigest", "CRC32C"), ("DataDigest", "CRC32C")],
    );
    let keys = tessera_iscsi::text::parse(&r.data).unwrap();
    assert!(keys.contains(&("DataDigest".into(), "CRC32C".into())));
    c.digests = Digests {
        header: true,
        data: true,
    };
    let itt = c.nop(b"digested");
    assert!(matches!(c.recv(), Some(Pdu::NopIn(n)) if n.itt == itt && &n.data[..] == b"digested"));
    // A data digest error: rejected, the connection stays.
    let nop = Pdu::NopOut(pdu::NopOut {
        immediate: true,
        lun: [0; 8],
        itt: 77,
        ttt: RESERVED_TAG,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.exp_stat_sn,
        data: Bytes::from_static(b"abcd"),
    });
    let mut wire = nop.to_bytes(c.digests);
    let at = wire.len() - 1;
    wire[at] ^= 0xff;
    c.send_raw(&wire);
    assert!(
        matches!(c.recv(), Some(Pdu::Reject(r)) if r.reason == reject_reason::DATA_DIGEST_ERROR)
    );
    let itt = c.nop(b"still here");
    assert!(matches!(c.recv(), Some(Pdu::NopIn(n)) if n.itt == itt));
    // A header digest error: the length cannot be trusted, so the
    // connection closes.
    let mut wire = nop.to_bytes(c.digests);
    wire[48] ^= 0xff;
    c.send_raw(&wire);
    assert!(c.closed());
}

#[test]
fn commands_outside_the_cmdsn_window_are_ignored() {
    let (server, _) = server();
    let mut c = RawInitiator::connect(server.addr);
    let login = c.login(TARGET, &[]);
    let max = login.max_cmd_sn;
    // CmdSN beyond MaxCmdSN: silently dropped.
    c.cmd_sn = max.wrapping_add(1);
    c.command(&[0; 6], false, false, 0, Bytes::new(), true);
    // CmdSN below ExpCmdSN: silently dropped.
    c.cmd_sn = 0;
    c.command(&[0; 6], false, false, 0, Bytes::new(), true);
    c.cmd_sn = 1;
    let itt = c.command(&[0; 6], false, false, 0, Bytes::new(), true);
    match c.recv() {
        Some(Pdu::ScsiResponse(r)) => {
            assert_eq!(r.itt, itt, "only the command inside the window is answered");
            assert_eq!(r.exp_cmd_sn, 2);
        }
        other => panic!("unexpected {other:?}"),
    }
    // Out of order inside the window: held until the gap fills.
    c.cmd_sn = 3;
    let later = c.command(&[0; 6], false, false, 0, Bytes::new(), true);
    c.cmd_sn = 2;
    let first = c.command(&[0; 6], false, false, 0, Bytes::new(), true);
    let a = c.recv();
    let b = c.recv();
    let tags: Vec<u32> = [a, b]
        .into_iter()
        .map(|p| match p {
            Some(Pdu::ScsiResponse(r)) => r.itt,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(tags, vec![first, later]);
}

#[test]
fn truncated_headers_end_quietly_and_the_server_keeps_serving() {
    let (server, target) = server();
    {
        let mut c = RawInitiator::connect(server.addr);
        c.send_raw(&[0x43, 0x87, 0, 0]);
        c.stream.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(c.closed());
    }
    {
        let mut c = RawInitiator::connect(server.addr);
        c.login(TARGET, &[]);
        c.send_raw(&[0x01, 0x80, 0, 0, 0, 0]);
        c.stream.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(c.closed());
    }
    let mut c = RawInitiator::connect(server.addr);
    c.login(TARGET, &[]);
    let itt = c.nop(b"");
    assert!(matches!(c.recv(), Some(Pdu::NopIn(n)) if n.itt == itt));
    drop(c);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        target.ended.load(Ordering::Relaxed) >= 2,
        "nexus_ended after each session"
    );
}

#[test]
fn abort_task_drops_the_command_and_lun_reset_reaches_the_target() {
    let (server, target) = server();
    let mut c = RawInitiator::connect(server.addr);
    c.login(TARGET, &[]);
    let slow_cmd_sn = c.cmd_sn;
    let slow = c.command(&read10(1000, 1), true, false, 512, Bytes::new(), true);
    c.send(&Pdu::TaskMgmtRequest(pdu::TaskMgmtRequest {
        immediate: true,
        function: 1,
        lun: pdu::lun_field(0),
        itt: 0x9999,
        referenced_tag: slow,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.exp_stat_sn,
        ref_cmd_sn: slow_cmd_sn,
        exp_data_sn: 0,
    }));
    match c.recv() {
        Some(Pdu::TaskMgmtResponse(r)) => {
            assert_eq!(r.itt, 0x9999);
            assert_eq!(r.response, 0, "function complete");
        }
        other => panic!("unexpected {other:?}"),
    }
    // The aborted read never answers; the next command does.
    let itt = c.command(&[0; 6], false, false, 0, Bytes::new(), true);
    match c.recv() {
        Some(Pdu::ScsiResponse(r)) => assert_eq!(r.itt, itt),
        other => panic!("unexpected {other:?}"),
    }
    // Aborting a task that is long done.
    c.send(&Pdu::TaskMgmtRequest(pdu::TaskMgmtRequest {
        immediate: true,
        function: 1,
        lun: pdu::lun_field(0),
        itt: 0x999a,
        referenced_tag: itt,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.exp_stat_sn,
        ref_cmd_sn: c.cmd_sn.wrapping_sub(1),
        exp_data_sn: 0,
    }));
    assert!(matches!(c.recv(), Some(Pdu::TaskMgmtResponse(r)) if r.response == 1));
    // LUN RESET.
    c.send(&Pdu::TaskMgmtRequest(pdu::TaskMgmtRequest {
        immediate: true,
        function: 5,
        lun: pdu::lun_field(0),
        itt: 0x999b,
        referenced_tag: RESERVED_TAG,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.exp_stat_sn,
        ref_cmd_sn: 0,
        exp_data_sn: 0,
    }));
    assert!(matches!(c.recv(), Some(Pdu::TaskMgmtResponse(r)) if r.response == 0));
    assert_eq!(target.resets.load(Ordering::Relaxed), 1);
}

#[test]
fn logout_answers_then_closes() {
    let (server, _) = server();
    let mut c = RawInitiator::connect(server.addr);
    c.login(TARGET, &[]);
    c.send(&Pdu::LogoutRequest(pdu::LogoutRequest {
        immediate: true,
        reason: 0,
        itt: 5,
        cid: 0,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.exp_stat_sn,
    }));
    match c.recv() {
        Some(Pdu::LogoutResponse(r)) => {
            assert_eq!(r.itt, 5);
            assert_eq!(r.response, 0);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(c.closed());
}

#[test]
fn data_out_out_of_sequence_ends_the_task_not_the_connection() {
    let (server, _) = server();
    let mut c = RawInitiator::connect(server.addr);
    c.login(TARGET, &[("InitialR2T", "Yes"), ("ImmediateData", "No")]);
    let itt = c.command(&write10(0, 2), false, true, 1024, Bytes::new(), true);
    let Some(Pdu::R2t(r)) = c.recv() else {
        panic!("expected R2T");
    };
    let data_out = |data_sn: u32, offset: u32| {
        Pdu::DataOut(pdu::DataOut {
            final_pdu: offset == 512,
            lun: pdu::lun_field(0),
            itt,
            ttt: r.ttt,
            exp_stat_sn: 0,
            data_sn,
            buffer_offset: offset,
            data: Bytes::from(vec![0u8; 512]),
        })
    };
    c.send(&data_out(27, 0));
    match c.recv() {
        Some(Pdu::ScsiResponse(resp)) => {
            assert_eq!(resp.itt, itt);
            assert_eq!(resp.status, 0x02);
            assert_eq!(resp.sense[2] & 0x0f, 0x0b, "ABORTED COMMAND");
            assert_eq!(resp.sense[12], 0x4b, "DATA PHASE ERROR");
        }
        other => panic!("unexpected {other:?}"),
    }
    // The rest of its data is dropped; the connection goes on.
    c.send(&data_out(1, 512));
    let tur = c.command(&[0; 6], false, false, 0, Bytes::new(), true);
    assert!(matches!(c.recv(), Some(Pdu::ScsiResponse(r)) if r.itt == tur && r.status == 0));
}
