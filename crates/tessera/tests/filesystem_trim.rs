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

use serde_json::Value;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// What the test writes into the filesystem and then deletes.
const FILE_COUNT: u64 = 4;
const FILE_BYTES: u64 = 50 * MIB;
/// How long `tessera up`, the volume's owner and nbdfuse get to come up.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the used bytes get to reflect a write or a trim.
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(60);

fn tools_required() -> bool {
    std::env::var("TESSERA_REQUIRE_TOOLS").as_deref() == Ok("1")
}

/// Skips (returns false) or, under TESSERA_REQUIRE_TOOLS=1, fails.
fn missing(what: &str) -> bool {
    assert!(
        !tools_required(),
        "{what} (required: TESSERA_REQUIRE_TOOLS=1)"
    );
    eprintln!("skipping: {what}");
    false
}

fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    found || missing(&format!("{tool} is not installed"))
}

fn can_mount() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root || !Path::new("/dev/fuse").exists() {
        return missing("needs root and /dev/fuse for loop devices and mounts");
    }
    let loop_free = Command::new("losetup")
        .arg("-f")
        .output()
        .is_ok_and(|o| o.status.success());
    loop_free || missing("no free loop device (losetup -f failed)")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind a free port")
        .local_addr()
        .expect("local address")
        .port()
}

/// Runs a command, killed after `secs` seconds (coreutils `timeout`), so a
/// hung mount or fsck fails the test instead of blocking it.
fn run_bounded(secs: u32, program: &str, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("-k")
        .arg("5")
        .arg(secs.to_string())
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

fn run_ok(secs: u32, program: &str, args: &[&str]) -> String {
    let out = run_bounded(secs, program, args);
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stops a child process: SIGTERM, a grace period, then SIGKILL.
fn stop(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Undoes, in reverse order, whatever the test set up.
#[derive(Default)]
struct Teardown {
    mounted: Option<PathBuf>,
    loop_device: Option<String>,
    fuse_dir: Option<PathBuf>,
    nbdfuse: Option<Child>,
    cluster: Option<Child>,
}

impl Drop for Teardown {
    fn drop(&mut self) {
        if let Some(dir) = self.mounted.take() {
            let _ = run_bounded(60, "umount", &[&dir.to_string_lossy()]);
        }
        if let Some(dev) = self.loop_device.take() {
            let _ = run_bounded(30, "losetup", &["-d", &dev]);
        }
        if let Some(dir) = self.fuse_dir.take() {
            let _ = run_bounded(30, "fusermount3", &["-u", &dir.to_string_lossy()]);
        }
        if let Some(mut child) = self.nbdfuse.take() {
            stop(&mut child);
        }
        if let Some(mut child) = self.cluster.take() {
            stop(&mut child);
        }
    }
}

/// The `tessera` CLI against one cluster's API.
struct Cli {
    api: String,
}

impl Cli {
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .arg("--api")
            .arg(&self.api)
            .args(args)
            .env("RUST_LOG", "warn")
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
    for tool in [
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "e2fsck",
        "fstrim",
        "mount",
        "umount",
        "timeout",
    ] {
        if !have(tool) {
            return;
        }
    }
    if !can_mount() {
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
        api: format!("http://{bind}:{api_port}"),
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

    let fuse_dir = work.path().join("fuse");
    let mount_dir = work.path().join("mnt");
    std::fs::create_dir(&fuse_dir).expect("fuse dir");
    std::fs::create_dir(&mount_dir).expect("mount dir");
    let pidfile = work.path().join("nbdfuse.pid");
    let disk = fuse_dir.join("disk");
    let nbdfuse = Command::new("nbdfuse")
        .arg("-P")
        .arg(&pidfile)
        .arg(&disk)
        .arg(format!("nbd://{owner_ip}:{nbd_port}/fs"))
        .stdin(Stdio::null())
        .spawn()
        .expect("start nbdfuse");
    teardown.nbdfuse = Some(nbdfuse);
    teardown.fuse_dir = Some(fuse_dir.clone());
    let deadline = Instant::now() + START_TIMEOUT;
    while !pidfile.exists() || !disk.exists() {
        assert!(Instant::now() < deadline, "nbdfuse did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }

    let loop_device = run_ok(30, "losetup", &["-f", "--show", &disk.to_string_lossy()])
        .trim()
        .to_owned();
    teardown.loop_device = Some(loop_device.clone());
    run_ok(300, "mkfs.ext4", &["-q", "-F", &loop_device]);
    let mnt = mount_dir.to_string_lossy().into_owned();
    run_ok(60, "mount", &[&loop_device, &mnt]);
    teardown.mounted = Some(mount_dir.clone());
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

    run_ok(60, "umount", &[&mnt]);
    teardown.mounted = None;
    let fsck = run_bounded(300, "e2fsck", &["-fn", &loop_device]);
    assert!(
        fsck.status.success(),
        "e2fsck -fn is not clean: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    drop(teardown);
}
