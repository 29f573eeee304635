//! Real NBD clients (libnbd's nbdinfo, nbdcopy and Python bindings, QEMU,
//! fio) against the server on an in-memory device.
//!
//! `TESSERA_NBD_COPY_MIB` sets the nbdcopy size (default 128 MiB; 1024 for
//! the full-size run).

mod common;

use common::{have_tool, random_bytes, run_bounded, run_ok, FaultyDevice, TestServer};
use serde_json::Value;
use std::sync::Arc;
use tessera_blockdev::{BlockDevice, MemoryDevice};
use tessera_nbd::StaticCatalog;

const MIB: u64 = 1 << 20;

#[test]
fn nbdinfo_json_shows_the_advertised_capabilities() {
    if !have_tool("nbdinfo", &["--version"]) {
        return;
    }
    let catalog = Arc::new(StaticCatalog::new());
    catalog.insert(
        "vol",
        Arc::new(MemoryDevice::new("vol", 64 * MIB)),
        Some("a thin test volume".into()),
    );
    catalog.insert(
        "ro",
        Arc::new(MemoryDevice::new("ro", 8 * MIB).read_only()),
        None,
    );
    let server = TestServer::start(catalog);

    let json: Value = serde_json::from_str(&run_ok(30, "nbdinfo", &["--json", &server.uri("vol")]))
        .expect("nbdinfo --json output");
    assert_eq!(json["protocol"], "newstyle-fixed");
    assert_eq!(json["structured"], true);
    let export = &json["exports"][0];
    assert_eq!(export["export-name"], "vol");
    assert_eq!(export["description"], "a thin test volume");
    assert_eq!(export["export-size"], 64 * MIB);
    assert_eq!(export["contexts"], serde_json::json!(["base:allocation"]));
    for capability in [
        "can_cache",
        "can_df",
        "can_fast_zero",
        "can_flush",
        "can_fua",
        "can_multi_conn",
        "can_trim",
        "can_zero",
    ] {
        assert_eq!(export[capability], true, "{capability}");
    }
    assert_eq!(export["is_read_only"], false);
    assert_eq!(export["block_size_minimum"], 512);
    assert_eq!(export["block_size_preferred"], 4096);
    assert_eq!(export["block_size_maximum"], 32 * MIB);

    let json: Value = serde_json::from_str(&run_ok(30, "nbdinfo", &["--json", &server.uri("ro")]))
        .expect("nbdinfo --json output");
    let export = &json["exports"][0];
    assert_eq!(export["is_read_only"], true);
    assert_eq!(export["can_trim"], false);
    assert_eq!(export["can_zero"], false);

    let list = run_ok(30, "nbdinfo", &["--list", "--json", &server.uri("")]);
    let list: Value = serde_json::from_str(&list).expect("nbdinfo --list --json output");
    let names: Vec<&str> = list["exports"]
        .as_array()
        .expect("exports")
        .iter()
        .filter_map(|e| e["export-name"].as_str())
        .collect();
    assert_eq!(names, vec!["ro", "vol"]);
}

/// `nbdinfo --map` lines as (offset, length, type).
fn map(uri: &str) -> Vec<(u64, u64, u32)> {
    run_ok(30, "nbdinfo", &["--map", uri])
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            Some((
                f.next()?.parse().ok()?,
                f.next()?.parse().ok()?,
                f.next()?.parse().ok()?,
            ))
        })
        .collect()
}

/// Debian's Python, which has the libnbd bindings (python3-libnbd).
const PYTHON: &str = "/usr/bin/python3";

/// Runs `code` with a libnbd handle `h` connected to `uri` (what `nbdsh -u
/// URI -c CODE` does, without depending on which `python3` is first in PATH).
fn nbdsh(uri: &str, code: &str) {
    let script =
        format!("import nbd\nh = nbd.NBD()\nh.connect_uri({uri:?})\n{code}\nh.shutdown()\n");
    run_ok(30, PYTHON, &["-c", &script]);
}

#[test]
fn nbdinfo_map_shows_data_where_written_and_holes_after_trim_and_zero() {
    if !have_tool("nbdinfo", &["--version"]) || !have_tool(PYTHON, &["-c", "import nbd"]) {
        return;
    }
    let device = Arc::new(MemoryDevice::new("thin", 16 * MIB));
    let server = TestServer::start(Arc::new(StaticCatalog::single("thin", device.clone())));
    let uri = server.uri("thin");
    assert_eq!(map(&uri), vec![(0, 16 * MIB, 3)]);

    nbdsh(&uri, "h.pwrite(b'\\x5a' * 65536, 1048576)");
    nbdsh(&uri, "h.pwrite(b'\\x01' * 4096, 8388608)");
    assert_eq!(
        map(&uri),
        vec![
            (0, MIB, 3),
            (MIB, 64 * 1024, 0),
            (MIB + 64 * 1024, 7 * MIB - 64 * 1024, 3),
            (8 * MIB, 4096, 0),
            (8 * MIB + 4096, 8 * MIB - 4096, 3),
        ]
    );
    assert_eq!(device.space().allocated_bytes, 68 * 1024);

    nbdsh(&uri, "h.trim(65536, 1048576)");
    nbdsh(&uri, "h.zero(4096, 8388608)");
    assert_eq!(map(&uri), vec![(0, 16 * MIB, 3)]);
    assert_eq!(device.space().allocated_bytes, 0);

    // Zeroing with NO_HOLE keeps the range allocated: zero but not a hole.
    nbdsh(&uri, "h.zero(8192, 0, nbd.CMD_FLAG_NO_HOLE)");
    assert_eq!(map(&uri), vec![(0, 8192, 2), (8192, 16 * MIB - 8192, 3)]);
}

#[test]
fn nbdcopy_round_trips_random_data() {
    if !have_tool("nbdcopy", &["--version"]) {
        return;
    }
    let mib: u64 = std::env::var("TESSERA_NBD_COPY_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128);
    let size = mib * MIB;
    let dir = tempfile::tempdir().expect("temp dir");
    let source = dir.path().join("source.img");
    let copy = dir.path().join("copy.img");
    let data = random_bytes(7, size as usize);
    std::fs::write(&source, &data).expect("write source");
    let device = Arc::new(MemoryDevice::new("copy", size));
    let server = TestServer::start(Arc::new(StaticCatalog::single("copy", device.clone())));
    let uri = server.uri("copy");
    let (src, dst) = (source.to_string_lossy(), copy.to_string_lossy());
    run_ok(600, "nbdcopy", &[&src, &uri]);
    assert_eq!(device.space().allocated_bytes, size);
    run_ok(600, "nbdcopy", &[&uri, &dst]);
    let back = std::fs::read(&copy).expect("read copy");
    assert!(back == data, "nbdcopy round trip of {mib} MiB differs");
}

#[test]
fn qemu_img_convert_and_compare_are_identical() {
    if !have_tool("qemu-img", &["--version"]) {
        return;
    }
    let size = 64 * MIB;
    let dir = tempfile::tempdir().expect("temp dir");
    let source = dir.path().join("source.img");
    // Random data with holes, so the sparse paths of both sides run too.
    let mut data = random_bytes(11, size as usize);
    for hole in [0..4 * MIB, 20 * MIB..21 * MIB, 60 * MIB..64 * MIB] {
        data[hole.start as usize..hole.end as usize].fill(0);
    }
    std::fs::write(&source, &data).expect("write source");
    let device = Arc::new(MemoryDevice::new("img", size));
    let server = TestServer::start(Arc::new(StaticCatalog::single("img", device.clone())));
    let uri = server.uri("img");
    let src = source.to_string_lossy();
    run_ok(
        300,
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", &src, &uri],
    );
    let out = run_bounded(
        300,
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", &src, &uri],
    );
    assert!(
        out.status.success(),
        "qemu-img compare: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The zero ranges stayed thin: no more than the data was allocated.
    assert!(device.space().allocated_bytes <= size - 9 * MIB);
}

#[test]
fn fio_nbd_engine_verifies_with_8_jobs_at_iodepth_8() {
    if !have_tool("fio", &["--version"]) {
        return;
    }
    let per_job = 8 * MIB;
    let device = Arc::new(MemoryDevice::new("fio", 8 * per_job));
    let server = TestServer::start(Arc::new(StaticCatalog::single("fio", device)));
    let uri = format!("--uri={}", server.uri("fio"));
    let dir = tempfile::tempdir().expect("temp dir");
    let job = dir.path().join("verify.fio");
    std::fs::write(
        &job,
        format!(
            "[global]\nioengine=nbd\n{}\nrw=randrw\nrwmixread=30\nbs=4k\niodepth=8\nnumjobs=8\n\
             size={per_job}\noffset_increment={per_job}\nverify=crc32c\nverify_fatal=1\nverify_state_save=0\n\
             do_verify=1\ngroup_reporting=1\n[verify]\n",
            uri.trim_start_matches("--")
        ),
    )
    .expect("job file");
    let out = run_ok(
        300,
        "fio",
        &["--output-format=json", &job.to_string_lossy()],
    );
    let json_start = out.find('{').expect("fio json");
    let report: Value = serde_json::from_str(&out[json_start..]).expect("fio json");
    let job = &report["jobs"][0];
    assert_eq!(job["error"], 0, "fio reported an error");
    assert!(job["write"]["io_bytes"].as_u64().unwrap_or(0) > 0);
    assert!(job["read"]["io_bytes"].as_u64().unwrap_or(0) > 0);
}

#[test]
fn libnbd_script_checks_options_commands_and_error_mapping() {
    let python = PYTHON;
    if !have_tool(python, &["-c", "import nbd"]) {
        return;
    }
    let catalog = Arc::new(StaticCatalog::new());
    catalog.insert("vol", Arc::new(MemoryDevice::new("vol", 16 * MIB)), None);
    catalog.insert(
        "ro",
        Arc::new(MemoryDevice::new("ro", 16 * MIB).read_only()),
        None,
    );
    let mut faulty = FaultyDevice::new("faulty", 16 * MIB);
    faulty.bad_offset = Some(MIB + 4096);
    faulty.space_limit = Some(2 * MIB);
    catalog.insert("faulty", Arc::new(faulty), None);
    let server = TestServer::start(catalog);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/nbd_checks.py");
    let out = run_bounded(
        120,
        python,
        &[
            script,
            &server.addr.ip().to_string(),
            &server.addr.port().to_string(),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "libnbd checks failed");
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}
