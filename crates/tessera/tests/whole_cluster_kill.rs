//! kill -9 of the whole `tessera up` (every host at once) under a client
//! with 16 writes in flight, then `tessera up` again on the same data
//! directory: every write the server acknowledged reads back, no block is
//! torn, and none holds data that was never written to it. The oracle is
//! the client's own record of what was acknowledged (fio's `verify_state`
//! counts the writes in flight when the server died as done, so it would
//! report writes lost that were never acknowledged).

mod common;

use common::have;
use common::up::{wait_for, UpCluster};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Debian's python3 has libnbd's bindings (whichever python3 is first on
/// the PATH may not).
const PYTHON: &str = "/usr/bin/python3";
const BLOCKS: u64 = 8192;
const MAGIC: u64 = 0x7e55_e7a0_0c1a_55ed;

/// Writes 4 KiB blocks at random LBAs of `uri`, 16 in flight, never two at
/// once to one LBA (so the order of a block's versions is the order they
/// were issued in), each block its LBA and version over and over. Prints
/// `I lba version` before each write is issued and `A lba version` once
/// the server acknowledged it, and ends when the server goes away.
const WRITER: &str = r#"
import nbd, random, struct, sys
uri, blocks, seed, version = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
h = nbd.NBD()
h.connect_uri(uri)
rng = random.Random(seed)
busy, held = set(), {}
def block(lba, v):
    return struct.pack('<QQQ', 0x7e55e7a00c1a55ed, lba, v) * 170 + bytes(16)
def done(lba, v):
    def completed(err):
        busy.discard(lba)
        held.pop(v, None)
        if err.value == 0:
            sys.stdout.write(f"A {lba} {v}\n")
        return 1
    return completed
try:
    while True:
        while len(busy) < 16:
            lba = rng.randrange(blocks)
            if lba in busy:
                continue
            version += 1
            busy.add(lba)
            sys.stdout.write(f"I {lba} {version}\n")
            sys.stdout.flush()
            held[version] = nbd.Buffer.from_bytearray(bytearray(block(lba, version)))
            h.aio_pwrite(held[version], lba * 4096, completion=done(lba, version))
        h.poll(-1)
        sys.stdout.flush()
except nbd.Error:
    sys.stdout.flush()
"#;

/// What the client was told, per LBA: the versions issued in order, and
/// the last one acknowledged.
#[derive(Default)]
struct Ledger {
    issued: HashMap<u64, Vec<u64>>,
    acked: HashMap<u64, u64>,
    acks: u64,
    last_version: u64,
}

impl Ledger {
    fn record(&mut self, line: &str) {
        let mut parts = line.split_whitespace();
        let (Some(kind), Some(lba), Some(v)) = (parts.next(), parts.next(), parts.next()) else {
            return;
        };
        let (Ok(lba), Ok(v)) = (lba.parse::<u64>(), v.parse::<u64>()) else {
            return;
        };
        match kind {
            "I" => {
                self.issued.entry(lba).or_default().push(v);
                self.last_version = self.last_version.max(v);
            }
            "A" => {
                let last = self.acked.entry(lba).or_default();
                *last = (*last).max(v);
                self.acks += 1;
            }
            _ => {}
        }
    }
}

/// The block the writer writes for `lba` at version `v`.
fn block(lba: u64, v: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(4096);
    for _ in 0..170 {
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&lba.to_le_bytes());
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.resize(4096, 0);
    b
}

#[derive(Debug, Default)]
struct Violations {
    lost: Vec<(u64, u64, u64)>,
    torn: Vec<u64>,
    phantom: Vec<(u64, u64)>,
}

/// Each block of the volume's image against the ledger.
fn check(image: &[u8], ledger: &Ledger) -> Violations {
    let mut v = Violations::default();
    for lba in 0..BLOCKS {
        let b = &image[(lba * 4096) as usize..((lba + 1) * 4096) as usize];
        let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        let version = if b.iter().all(|&x| x == 0) {
            0
        } else if word(0) == MAGIC && word(1) == lba && b == block(lba, word(2)).as_slice() {
            word(2)
        } else {
            v.torn.push(lba);
            continue;
        };
        let issued = ledger.issued.get(&lba);
        if version != 0 && !issued.is_some_and(|i| i.contains(&version)) {
            v.phantom.push((lba, version));
        }
        if let Some(&acked) = ledger.acked.get(&lba) {
            if version < acked {
                v.lost.push((lba, acked, version));
            }
        }
    }
    v
}

#[test]
fn kill_9_of_the_whole_cluster_loses_no_acknowledged_write() {
    let bindings = Command::new(PYTHON)
        .args(["-c", "import nbd"])
        .status()
        .is_ok_and(|s| s.success());
    if !bindings && !have("libnbd-python-bindings") {
        return;
    }
    if !have("nbdcopy") {
        return;
    }
    let mut up = UpCluster::start(231, &[]);
    let (_, mut uri) = up.create_volume("crash", "32M", None);
    let mut ledger = Ledger::default();
    for cycle in 0..2u64 {
        let mut writer = Command::new(PYTHON)
            .args([
                "-c",
                WRITER,
                &uri,
                &BLOCKS.to_string(),
                &(cycle + 1).to_string(),
                &ledger.last_version.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the writer starts");
        let stdout = writer.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .collect::<Vec<String>>()
        });
        std::thread::sleep(Duration::from_secs(4));
        up.kill_and_restart();
        let out = writer.wait_with_output().unwrap();
        let lines = reader.join().unwrap();
        let acks_before = ledger.acks;
        for line in &lines {
            ledger.record(line);
        }
        assert!(
            ledger.acks - acks_before > 100,
            "cycle {cycle}: {} writes acknowledged before the kill; the writer said: {}",
            ledger.acks - acks_before,
            String::from_utf8_lossy(&out.stderr)
        );
        // Unavailable until its hosts have opened their stores again (a
        // read then fails), degraded while a copy catches up.
        let view = wait_for(&up.api, "crash", "healthy copies after the restart", |v| {
            v["owner"].is_string() && v["state"] == "healthy"
        });
        uri = up.nbd_uri(view["owner"].as_str().unwrap(), "crash");
        let image = tempfile::NamedTempFile::new().unwrap();
        let copied = Command::new("nbdcopy")
            .args([&uri, image.path().to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            copied.status.success(),
            "cycle {cycle}: nbdcopy after the restart: {}",
            String::from_utf8_lossy(&copied.stderr)
        );
        let violations = check(&std::fs::read(image.path()).unwrap(), &ledger);
        println!(
            "cycle {cycle}: {} writes issued, {} acknowledged in all; {violations:?}",
            ledger.last_version, ledger.acks
        );
        assert!(
            violations.lost.is_empty()
                && violations.torn.is_empty()
                && violations.phantom.is_empty(),
            "cycle {cycle}: {violations:?}"
        );
    }
}

/// The checker itself: a block older than its last acknowledged version,
/// one half overwritten, and one holding a version never written to it are
/// each reported; unwritten and newer-than-acknowledged blocks are not.
#[test]
fn the_checker_reports_lost_torn_and_phantom_blocks() {
    let mut ledger = Ledger::default();
    for line in [
        "I 1 5", "A 1 5", "I 1 9", "A 1 9", "I 2 3", "A 2 3", "I 3 4", "I 4 6", "A 4 6", "I 4 8",
    ] {
        ledger.record(line);
    }
    let mut image = vec![0u8; (BLOCKS * 4096) as usize];
    let mut put = |lba: u64, bytes: &[u8]| {
        image[(lba * 4096) as usize..(lba * 4096) as usize + bytes.len()].copy_from_slice(bytes)
    };
    put(1, &block(1, 5));
    put(2, &block(2, 3)[..2048]);
    put(3, &block(3, 7));
    put(4, &block(4, 8));
    let v = check(&image, &ledger);
    assert_eq!(v.lost, vec![(1, 9, 5)]);
    assert_eq!(v.torn, vec![2]);
    assert_eq!(v.phantom, vec![(3, 7)]);
}
