//! Snapshots with a filesystem on them, as a user takes them: ext4 on a
//! volume of the real `tessera up` (nbdfuse and a loop device), files
//! written, the filesystem frozen (`fsfreeze`) for a snapshot taken with
//! the CLI, then files changed, deleted and added. The snapshot's read-only
//! export mounts and holds the files as they were; a linked clone of it
//! mounts, holds them too and takes writes of its own; and the volume,
//! reverted to the snapshot, holds them again and passes `e2fsck -fn`.
//!
//! Needs root, /dev/fuse, loop devices, nbdfuse (libnbd-bin), e2fsprogs
//! and util-linux; without them it skips with a message, unless
//! TESSERA_REQUIRE_TOOLS=1, when it fails.

mod common;

use common::mount::{can_mount, run_bounded, run_ok, Attached};
use common::up::{tessera, UpCluster};
use std::path::Path;

const MIB: usize = 1 << 20;

/// File contents that neither compress nor repeat.
fn contents(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The files as they are at the snapshot: name and seed.
const AT_SNAPSHOT: [(&str, u64); 4] = [("a", 1), ("b", 2), ("c", 3), ("d", 4)];

fn expect_files_at_snapshot(dir: &Path, what: &str) {
    for (name, seed) in AT_SNAPSHOT {
        let got = std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{what}: {name}: {e}"));
        assert!(
            got == contents(seed, 4 * MIB),
            "{what}: file {name} differs"
        );
    }
    assert!(
        !dir.join("e").exists(),
        "{what}: file e was made after the snapshot"
    );
}

fn cli(cluster: &UpCluster, args: &[&str]) -> String {
    let (ok, text) = tessera(&cluster.api, args);
    assert!(ok, "tessera {args:?}: {text}");
    text
}

#[test]
fn ext4_snapshots_mount_read_only_clone_and_revert() {
    if !can_mount() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let cluster = UpCluster::start(61, &[]);
    let (view, uri) = cluster.create_volume("fs", "256M", None);
    let owner = view["owner"].as_str().unwrap().to_string();

    // ext4 with four files, frozen while the snapshot is taken.
    let mut volume = Attached::new(&uri, &work.path().join("vol"), false);
    run_ok(300, "mkfs.ext4", &["-q", "-F", &volume.device]);
    let mnt = work.path().join("vol-mnt");
    volume.mount(&mnt, "rw");
    for (name, seed) in AT_SNAPSHOT {
        std::fs::write(mnt.join(name), contents(seed, 4 * MIB)).unwrap();
    }
    run_ok(120, "sync", &[]);
    let at = mnt.to_string_lossy().into_owned();
    run_ok(60, "fsfreeze", &["-f", &at]);
    let taken = tessera(&cluster.api, &["snapshot", "create", "fs", "s1"]);
    run_ok(60, "fsfreeze", &["-u", &at]);
    assert!(taken.0, "snapshot create: {}", taken.1);

    // Changed after it: one file rewritten, one deleted, one added.
    std::fs::write(mnt.join("a"), contents(10, 4 * MIB)).unwrap();
    std::fs::remove_file(mnt.join("b")).unwrap();
    std::fs::write(mnt.join("e"), contents(5, 4 * MIB)).unwrap();
    run_ok(120, "sync", &[]);

    // (a) The snapshot's export, mounted read-only, holds the files as they
    // were, from a host that is not the owner.
    let other = if owner == "host-1" {
        "host-2"
    } else {
        "host-1"
    };
    {
        let mut snapshot = Attached::new(
            &cluster.nbd_uri(other, "fs@s1"),
            &work.path().join("snap"),
            true,
        );
        let snap_mnt = work.path().join("snap-mnt");
        snapshot.mount(&snap_mnt, "ro,noload");
        expect_files_at_snapshot(&snap_mnt, "the snapshot");
        snapshot.unmount();
    }

    // (b) A linked clone mounts, holds them too, and diverges on its own.
    cli(
        &cluster,
        &["volume", "clone", "fs-clone", "--from", "fs@s1"],
    );
    {
        let mut clone = Attached::new(
            &cluster.nbd_uri(other, "fs-clone"),
            &work.path().join("clone"),
            false,
        );
        let clone_mnt = work.path().join("clone-mnt");
        clone.mount(&clone_mnt, "rw");
        expect_files_at_snapshot(&clone_mnt, "the clone");
        std::fs::write(clone_mnt.join("only-in-clone"), contents(7, MIB)).unwrap();
        run_ok(120, "sync", &[]);
        clone.unmount();
        let fsck = run_bounded(300, "e2fsck", &["-fn", &clone.device]);
        assert!(fsck.status.success(), "e2fsck of the clone: {fsck:?}");
    }
    assert!(
        !mnt.join("only-in-clone").exists(),
        "the volume does not see the clone's file"
    );
    assert!(mnt.join("e").exists(), "the volume keeps its own changes");

    // (c) Reverted (no client may have it open), the volume holds the
    // snapshot's files again, and its filesystem is clean.
    volume.unmount();
    drop(volume);
    cli(&cluster, &["volume", "revert", "fs", "--to", "s1"]);
    let mut volume = Attached::new(&uri, &work.path().join("vol-again"), false);
    let fsck = run_bounded(300, "e2fsck", &["-fn", &volume.device]);
    assert!(
        fsck.status.success(),
        "e2fsck after the revert: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    let again = work.path().join("vol-again-mnt");
    volume.mount(&again, "rw");
    expect_files_at_snapshot(&again, "the reverted volume");
    volume.unmount();
    let verify = cli(&cluster, &["object", "verify", "fs"]);
    assert!(verify.contains("copies identical"), "{verify}");
}
