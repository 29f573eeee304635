//! `fstrim` on a filesystem in a thin volume gives the space back to the
//! datastore: the real `tessera up` binary, a volume created with the CLI,
//! attached with nbdfuse and a loop device, ext4 made and mounted on it,
//! 200 MiB of files written and deleted, `fstrim`, and the volume's used
//! bytes in `tessera volume list` must drop by most of what the files took.
//! Then the filesystem is unmounted and `e2fsck -fn` must find it clean.
//!
//! Needs root, /dev/fuse, loop devices, nbdfuse (libnbd-bin), e2fsprogs and
//! util-linux; without them it skips with a message, unless
//! TESSERA_REQUIRE_TOOLS=1, when it fails. Every path (success or failure)
//! unmounts, detaches the loop device, stops nbdfuse and stops `tessera up`.

mod common;

use common::free_port;
use common::mount::{can_mount, run_bounded, run_ok, stop, Attached};
use serde_json::Value;
use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// What the test writes into the filesystem and then deletes.
const FILE_COUNT: u64 = 4;
const FILE_BYTES: u64 = 50 * MIB;
/// How long `tessera up`, the volume's owner and nbdfuse get to come up.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the used bytes get to reflect a write or a trim.
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(60);

/// Stops `tessera up` however the test ends (the volume's mount, loop
/// device and nbdfuse go first: see `common::mount::Attached`).
#[derive(Default)]
struct Teardown {
    cluster: Option<Child>,
}

impl Drop for Teardown {
    fn drop(&mut self) {
        if let Some(mut child) = self.cluster.take() {
            stop(&mut child);
        }
    }
}

/// The `tessera` CLI against one cluster's API, with its admin token.
struct Cli {
    api: String,
    token_file: std::path::PathBuf,
}

impl Cli {
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .arg("--api")
            .arg(&self.api)
            .args(args)
            .env("RUST_LOG", "warn")
            .env("TESSERA_TOKEN_FILE", &self.token_file)
            .output()
            .expect("run tessera");
        assert!(
            out.status.success(),
            "tessera {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The volume's entry in `tessera volume list --json`.
    fn volume(&self, name: &str) -> Value {
        let list: Value =
            serde_json::from_str(&self.run(&["volume", "list", "--json"])).expect("JSON list");
        list.as_array()
            .and_then(|vols| vols.iter().find(|v| v["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("volume {name} is not listed: {list:#}"))
    }

    fn used_bytes(&self, name: &str) -> u64 {
        let volume = self.volume(name);
        volume["used_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("no used_bytes: {volume:#}"))
    }

    /// Polls the used bytes until `ok` holds; returns the last figure.
    fn wait_used(&self, name: &str, what: &str, ok: impl Fn(u64) -> bool) -> u64 {
        let deadline = Instant::now() + ACCOUNTING_TIMEOUT;
        loop {
            let used = self.used_bytes(name);
            if ok(used) || Instant::now() >= deadline {
                if !ok(used) {
                    eprintln!("used bytes of {name} after waiting for {what}: {used}");
                }
                return used;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// File contents that neither compress nor repeat: xorshift64 words.
fn file_contents(seed: u64, len: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len as usize);
    while (out.len() as u64) < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len as usize);
    out
}

#[test]
fn fstrim_in_a_thin_volume_returns_space_to_the_datastore() {
    if !can_mount() || !common::have("fstrim") {
        return;
    }
    let work = tempfile::tempdir().expect("temp dir");
    let mut teardown = Teardown::default();

    // A loopback subnet of its own, so hosts 1-4 do not meet other tests'.
    let seed = std::process::id();
    let bind = Ipv4Addr::new(127, 40 + (seed % 150) as u8, (seed / 150 % 250) as u8, 1);
    let (api_port, nbd_port, iscsi_port, transport_port) =
        (free_port(), free_port(), free_port(), free_port());
    let log_path = work.path().join("up.log");
    let cluster = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .arg("up")
        .arg("--data-dir")
        .arg(work.path().join("data"))
        .args(["--bind", &bind.to_string()])
        .args(["--api-port", &api_port.to_string()])
        .args(["--nbd-port", &nbd_port.to_string()])
        .args(["--iscsi-port", &iscsi_port.to_string()])
        .args(["--transport-port", &transport_port.to_string()])
        .args(["--host-capacity", "2G"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).expect("log file"))
        .spawn()
        .expect("start tessera up");
    teardown.cluster = Some(cluster);
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let deadline = Instant::now() + START_TIMEOUT;
    while std::net::TcpStream::connect((bind, api_port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "tessera up did not start: {}",
            log()
        );
        if let Some(Ok(Some(status))) = teardown.cluster.as_mut().map(Child::try_wait) {
            panic!("tessera up exited ({status}): {}", log());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let cli = Cli {
        api: format!("https://{bind}:{api_port}"),
        token_file: work.path().join("data").join("admin.token"),
    };

    cli.run(&["volume", "create", "fs", "--size", "1G"]);
    let owner = loop {
        let volume = cli.volume("fs");
        if let Some(owner) = volume["owner"].as_str() {
            break owner.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "volume fs got no owner: {volume:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let host: u32 = owner
        .trim_start_matches("host-")
        .parse()
        .unwrap_or_else(|_| panic!("owner {owner:?} is not host-N"));
    let owner_ip = Ipv4Addr::from(u32::from(bind) + host - 1);
    let empty = cli.used_bytes("fs");
    assert_eq!(empty, 0, "a new thin volume already uses {empty} bytes");

    let mut attached = Attached::new(
        &format!("nbd://{owner_ip}:{nbd_port}/fs"),
        &work.path().join("attach"),
        false,
    );
    let loop_device = attached.device.clone();
    run_ok(300, "mkfs.ext4", &["-q", "-F", &loop_device]);
    let mount_dir = work.path().join("mnt");
    let mnt = mount_dir.to_string_lossy().into_owned();
    attached.mount(&mount_dir, "rw");
    run_ok(120, "sync", &[]);
    let formatted = cli.used_bytes("fs");

    let written = FILE_COUNT * FILE_BYTES;
    for i in 0..FILE_COUNT {
        std::fs::write(
            mount_dir.join(format!("file{i}")),
            file_contents(i + 1, FILE_BYTES),
        )
        .expect("write a file");
    }
    run_ok(300, "sync", &[]);
    let full = cli.wait_used("fs", "the files' blocks", |used| {
        used >= formatted + written
    });
    assert!(
        full >= formatted + written,
        "writing {written} bytes of files moved used bytes only from {formatted} to {full}"
    );

    for i in 0..FILE_COUNT {
        std::fs::remove_file(mount_dir.join(format!("file{i}"))).expect("remove a file");
    }
    run_ok(120, "sync", &[]);
    run_ok(300, "fstrim", &[&mnt]);
    // Most of what the files took must come back; ext4 keeps a little
    // (journal and directory blocks written meanwhile).
    let returned_enough = |used: u64| used + written * 9 / 10 <= full;
    let trimmed = cli.wait_used("fs", "fstrim", returned_enough);
    assert!(
        returned_enough(trimmed),
        "fstrim returned too little: used bytes {formatted} after mkfs, {full} with \
         {written} bytes of files, {trimmed} after deleting them and fstrim"
    );
    eprintln!("used bytes: {formatted} after mkfs, {full} with the files, {trimmed} after fstrim");

    attached.unmount();
    let fsck = run_bounded(300, "e2fsck", &["-fn", &loop_device]);
    assert!(
        fsck.status.success(),
        "e2fsck -fn is not clean: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    drop(teardown);
}
