//! Real initiators (libiscsi's iscsi-ls, iscsi-inq and iscsi-test-cu)
//! against the server on an in-memory volume served by the SCSI command
//! set of this crate.

mod common;

use common::{have_tool, run_bounded, TestServer};
use std::sync::Arc;
use tessera_blockdev::{BlockDevice, MemoryDevice};
use tessera_iscsi::scsi::{
    BlockTarget, LogicalUnit, MemoryDatastore, MemoryEnvironment, UnitSettings,
};
use tessera_iscsi::{
    target_name_for_volume, ChapCredentials, ChapSecret, StaticCatalog, TargetEntry, TargetPortal,
};

const MIB: u64 = 1 << 20;

fn volume_target(size: u64) -> Arc<BlockTarget> {
    let device: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new("vol", size));
    let datastore = MemoryDatastore::new();
    datastore.add(device.clone());
    let environment = Arc::new(MemoryEnvironment::new(datastore));
    let unit = Arc::new(LogicalUnit::new(
        device,
        environment,
        UnitSettings::default(),
    ));
    let target = Arc::new(BlockTarget::new());
    target.insert_unit(0, unit);
    target
}

fn catalog(chap: ChapCredentials) -> (Arc<StaticCatalog>, String) {
    let name = target_name_for_volume("vol");
    let catalog = Arc::new(StaticCatalog::new());
    catalog.insert(TargetEntry {
        name: name.clone(),
        alias: Some("vol".into()),
        device: volume_target(64 * MIB),
        portals: vec![
            TargetPortal {
                address: "127.0.0.1:3260".into(),
                portal_group_tag: 1,
            },
            TargetPortal {
                address: "127.0.0.2:3260".into(),
                portal_group_tag: 2,
            },
        ],
        portal_group_tag: 1,
        relative_port: 1,
        initiators: tessera_iscsi::Initiators::Any,
        chap,
        session_hold: None,
    });
    (catalog, name)
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn iscsi_ls_discovers_every_portal_and_iscsi_inq_reads_the_unit() {
    if !have_tool("iscsi-ls", &["--help"]) {
        return;
    }
    let (catalog, name) = catalog(ChapCredentials::default());
    let server = TestServer::start(catalog);
    let out = run_bounded(30, "iscsi-ls", &[&format!("iscsi://{}", server.addr)]);
    assert!(out.status.success(), "iscsi-ls: {out:?}");
    let text = stdout(&out);
    assert!(
        text.contains(&format!("Target:{name} Portal:127.0.0.1:3260,1")),
        "{text}"
    );
    assert!(
        text.contains(&format!("Target:{name} Portal:127.0.0.2:3260,2")),
        "{text}"
    );
    let out = run_bounded(30, "iscsi-inq", &[&server.url(&name)]);
    assert!(out.status.success(), "iscsi-inq: {out:?}");
    assert!(stdout(&out).contains("Peripheral Device Type:DIRECT_ACCESS"));
}

#[test]
fn chap_logins_from_libiscsi_need_the_right_secret() {
    if !have_tool("iscsi-inq", &["--help"]) {
        return;
    }
    let (catalog, name) = catalog(ChapCredentials {
        initiator: Some(ChapSecret {
            user: "alice".into(),
            secret: b"alice-secret-12".to_vec(),
        }),
        target: Some(ChapSecret {
            user: "tessera".into(),
            secret: b"target-secret-12".to_vec(),
        }),
    });
    let server = TestServer::start(catalog);
    let url = |auth: &str| format!("iscsi://{auth}{}/{name}/0", server.addr);
    let ok = run_bounded(30, "iscsi-inq", &[&url("alice%alice-secret-12@")]);
    assert!(ok.status.success(), "right secret refused: {ok:?}");
    let wrong = run_bounded(30, "iscsi-inq", &[&url("alice%wrong-secret-00@")]);
    assert!(!wrong.status.success(), "wrong secret admitted");
    let none = run_bounded(30, "iscsi-inq", &[&url("")]);
    assert!(!none.status.success(), "no credentials admitted");
    // Mutual CHAP: libiscsi takes the target's credentials from the
    // environment and checks the target's answer.
    let mut mutual = std::process::Command::new("timeout");
    mutual
        .args(["-k", "5", "30", "iscsi-inq", &url("alice%alice-secret-12@")])
        .env("LIBISCSI_CHAP_TARGET_USERNAME", "tessera")
        .env("LIBISCSI_CHAP_TARGET_PASSWORD", "target-secret-12");
    let out = mutual.output().expect("iscsi-inq");
    assert!(out.status.success(), "mutual CHAP refused: {out:?}");
    let mut bad_mutual = std::process::Command::new("timeout");
    bad_mutual
        .args(["-k", "5", "30", "iscsi-inq", &url("alice%alice-secret-12@")])
        .env("LIBISCSI_CHAP_TARGET_USERNAME", "tessera")
        .env("LIBISCSI_CHAP_TARGET_PASSWORD", "not-the-target");
    let out = bad_mutual.output().expect("iscsi-inq");
    assert!(
        !out.status.success(),
        "initiator accepted a wrong target answer"
    );
}

/// Runs one iscsi-test-cu family and checks CUnit's summary: every test
/// ran and none failed.
fn test_cu_family(family: &str) {
    let (catalog, name) = catalog(ChapCredentials::default());
    let server = TestServer::start(catalog);
    let out = run_bounded(
        300,
        "iscsi-test-cu",
        &["-d", "-t", family, &server.url(&name)],
    );
    let log = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    let summary = log
        .lines()
        .find(|l| l.trim_start().starts_with("tests "))
        .unwrap_or_else(|| panic!("no CUnit summary for {family}:\n{log}"));
    let numbers: Vec<u32> = summary
        .split_whitespace()
        .skip(1)
        .filter_map(|n| n.parse().ok())
        .collect();
    assert!(numbers.len() >= 4, "{summary}");
    assert!(numbers[1] > 0, "{family}: no test ran\n{log}");
    assert_eq!(numbers[3], 0, "{family}: tests failed\n{log}");
    assert!(
        out.status.success(),
        "{family}: exit {:?}\n{log}",
        out.status
    );
}

#[test]
fn iscsi_test_cu_iscsi_families_pass() {
    if !have_tool("iscsi-test-cu", &["--list"]) {
        return;
    }
    for family in [
        "ALL.iSCSIcmdsn",
        "ALL.iSCSIdatasn",
        "ALL.iSCSIResiduals",
        "ALL.iSCSITMF",
    ] {
        test_cu_family(family);
    }
}
