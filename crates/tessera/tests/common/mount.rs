//! A volume (or a snapshot's export) as a Linux block device: nbdfuse
//! serves the NBD export as a file, a loop device makes it a disk, and a
//! filesystem on it may be mounted. Everything is undone when dropped, in
//! reverse order, whether the test passed or not.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Whether this machine can attach and mount (root, /dev/fuse, a free loop
/// device, the tools); without, the test skips with a message, unless
/// TESSERA_REQUIRE_TOOLS=1, when it fails.
pub fn can_mount() -> bool {
    for tool in [
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "e2fsck",
        "fsfreeze",
        "mount",
        "umount",
        "timeout",
    ] {
        if !super::have(tool) {
            return false;
        }
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let loop_free = Command::new("losetup")
        .arg("-f")
        .output()
        .is_ok_and(|o| o.status.success());
    let ok = root && Path::new("/dev/fuse").exists() && loop_free;
    if !ok {
        assert!(
            std::env::var("TESSERA_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "needs root, /dev/fuse and a free loop device (TESSERA_REQUIRE_TOOLS=1)"
        );
        eprintln!("skipping: needs root, /dev/fuse and a free loop device");
    }
    ok
}

/// Runs a command, killed after `secs` seconds, so a hung mount fails the
/// test instead of blocking it.
pub fn run_bounded(secs: u32, program: &str, args: &[&str]) -> Output {
    Command::new("timeout")
        .args(["-k", "5", &secs.to_string(), program])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program} starts: {e}"))
}

/// [`run_bounded`], failing the test unless it succeeded; its stdout.
pub fn run_ok(secs: u32, program: &str, args: &[&str]) -> String {
    let out = run_bounded(secs, program, args);
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An NBD export attached as a loop device, perhaps mounted.
pub struct Attached {
    /// The loop device.
    pub device: String,
    /// Where its filesystem is mounted, while it is.
    pub mounted: Option<PathBuf>,
    fuse_dir: PathBuf,
    nbdfuse: Option<Child>,
}

impl Attached {
    /// Attaches `uri` under `dir` (a directory of its own), read-only when
    /// `read_only`.
    pub fn new(uri: &str, dir: &Path, read_only: bool) -> Attached {
        let fuse_dir = dir.join("fuse");
        std::fs::create_dir_all(&fuse_dir).unwrap();
        let pidfile = dir.join("nbdfuse.pid");
        let disk = fuse_dir.join("disk");
        let mut command = Command::new("nbdfuse");
        if read_only {
            command.arg("--readonly");
        }
        let nbdfuse = command
            .arg("-P")
            .arg(&pidfile)
            .arg(&disk)
            .arg(uri)
            .stdin(Stdio::null())
            .spawn()
            .expect("nbdfuse starts");
        let mut attached = Attached {
            device: String::new(),
            mounted: None,
            fuse_dir,
            nbdfuse: Some(nbdfuse),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !pidfile.exists() || !disk.exists() {
            assert!(Instant::now() < deadline, "nbdfuse did not serve {uri}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let disk = disk.to_string_lossy().into_owned();
        let mut args = vec!["-f", "--show"];
        if read_only {
            args.push("-r");
        }
        args.push(&disk);
        attached.device = run_ok(30, "losetup", &args).trim().to_owned();
        attached
    }

    /// Mounts its filesystem at `dir` with `options` (`-o`).
    pub fn mount(&mut self, dir: &Path, options: &str) {
        std::fs::create_dir_all(dir).unwrap();
        let at = dir.to_string_lossy().into_owned();
        run_ok(60, "mount", &["-o", options, &self.device, &at]);
        self.mounted = Some(dir.to_path_buf());
    }

    /// Unmounts it.
    pub fn unmount(&mut self) {
        if let Some(dir) = self.mounted.take() {
            run_ok(60, "umount", &[&dir.to_string_lossy()]);
        }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if let Some(dir) = self.mounted.take() {
            let _ = run_bounded(60, "umount", &[&dir.to_string_lossy()]);
        }
        if !self.device.is_empty() {
            let _ = run_bounded(30, "losetup", &["-d", &self.device]);
        }
        let _ = run_bounded(30, "fusermount3", &["-u", &self.fuse_dir.to_string_lossy()]);
        if let Some(mut child) = self.nbdfuse.take() {
            stop(&mut child);
        }
    }
}

/// Stops a child process: SIGTERM, a grace period, then SIGKILL.
pub fn stop(child: &mut Child) {
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
