//! A real ext4 filesystem on the server: nbdfuse exposes the export as a
//! file, a loop device turns it into a block device, then mkfs.ext4, mount,
//! files written and read back, fstrim, umount and e2fsck.
//!
//! Needs root, /dev/fuse and loop devices; without root it skips with a
//! message. Every path (success or failure) unmounts, detaches the loop
//! device and stops nbdfuse.

mod common;

use common::{have_tool, random_bytes, run_bounded, run_ok, TestServer};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_blockdev::{BlockDevice, MemoryDevice};
use tessera_nbd::StaticCatalog;

const MIB: u64 = 1 << 20;
/// How long nbdfuse gets to come up.
const NBDFUSE_READY: Duration = Duration::from_secs(20);

/// Undoes, in reverse order, whatever the test set up.
#[derive(Default)]
struct Teardown {
    mounted: Option<PathBuf>,
    loop_device: Option<String>,
    fuse_dir: Option<PathBuf>,
    nbdfuse: Option<Child>,
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
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn write_and_check(dir: &Path, files: &[(String, Vec<u8>)]) {
    for (name, data) in files {
        std::fs::write(dir.join(name), data).expect("write file");
    }
    run_ok(60, "sync", &[]);
}

#[test]
fn ext4_on_nbdfuse_and_loop_device_mounts_trims_and_checks_clean() {
    for (tool, probe) in [
        ("nbdfuse", &["--version"][..]),
        ("losetup", &["--version"][..]),
        ("mkfs.ext4", &["-V"][..]),
        ("e2fsck", &["-V"][..]),
        ("fstrim", &["--version"][..]),
        ("fusermount3", &["--version"][..]),
    ] {
        if !have_tool(tool, probe) {
            return;
        }
    }
    if !is_root() || !Path::new("/dev/fuse").exists() {
        eprintln!("skipping: needs root and /dev/fuse for loop devices and mounts");
        return;
    }
    let device = Arc::new(MemoryDevice::new("fs", 256 * MIB));
    let server = TestServer::start(Arc::new(StaticCatalog::single("fs", device.clone())));
    let work = tempfile::tempdir().expect("temp dir");
    let fuse_dir = work.path().join("fuse");
    let mount_dir = work.path().join("mnt");
    std::fs::create_dir(&fuse_dir).expect("fuse dir");
    std::fs::create_dir(&mount_dir).expect("mount dir");
    let pidfile = work.path().join("nbdfuse.pid");
    let disk = fuse_dir.join("disk");

    let mut teardown = Teardown::default();
    let child = Command::new("nbdfuse")
        .arg("-P")
        .arg(&pidfile)
        .arg(&disk)
        .arg(server.uri("fs"))
        .stdin(Stdio::null())
        .spawn()
        .expect("start nbdfuse");
    teardown.nbdfuse = Some(child);
    teardown.fuse_dir = Some(fuse_dir.clone());
    let deadline = Instant::now() + NBDFUSE_READY;
    while !pidfile.exists() || !disk.exists() {
        assert!(Instant::now() < deadline, "nbdfuse did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }

    let loop_device = run_ok(30, "losetup", &["-f", "--show", &disk.to_string_lossy()])
        .trim()
        .to_owned();
    teardown.loop_device = Some(loop_device.clone());
    run_ok(120, "mkfs.ext4", &["-q", "-F", &loop_device]);
    let mnt = mount_dir.to_string_lossy().into_owned();
    run_ok(60, "mount", &[&loop_device, &mnt]);
    teardown.mounted = Some(mount_dir.clone());

    let files: Vec<(String, Vec<u8>)> = (0..3)
        .map(|i| (format!("file{i}"), random_bytes(100 + i, 8 * MIB as usize)))
        .collect();
    write_and_check(&mount_dir, &files);
    let written = device.space().allocated_bytes;
    assert!(
        written >= 24 * MIB,
        "only {written} bytes allocated after writing 24 MiB"
    );

    // Remount so the files are read back from the device, not the page cache.
    run_ok(60, "umount", &[&mnt]);
    teardown.mounted = None;
    run_ok(60, "mount", &[&loop_device, &mnt]);
    teardown.mounted = Some(mount_dir.clone());
    for (name, data) in &files {
        let back = std::fs::read(mount_dir.join(name)).expect("read file back");
        assert!(&back == data, "{name} read back differs");
    }

    for (name, _) in &files {
        std::fs::remove_file(mount_dir.join(name)).expect("remove file");
    }
    run_ok(60, "sync", &[]);
    run_ok(120, "fstrim", &[&mnt]);
    let trimmed = device.space().allocated_bytes;
    assert!(
        trimmed + 20 * MIB <= written,
        "fstrim returned too little space: {written} -> {trimmed} bytes"
    );

    run_ok(60, "umount", &[&mnt]);
    teardown.mounted = None;
    let fsck = run_bounded(120, "e2fsck", &["-fn", &loop_device]);
    assert!(
        fsck.status.success(),
        "e2fsck -fn is not clean: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    drop(teardown);
}
