//! EXTENDED COPY inside the datastore on a four-host cluster in one process,
//! driven by a libiscsi initiator (`tests/tools/xcopy_range.c`, built here
//! with `cc -liscsi`) the way ESXi clones a virtual disk within one VMFS
//! datastore, checked with qemu-img and qemu-io through `iscsi://`: the
//! copy shares the stored blocks (the disk groups' physical usage does not
//! grow by what was copied), keeps its data when the source is overwritten,
//! gives the space back when both are unmapped, and gives the same bytes
//! when it has to move data instead.

mod fixture;

use fixture::{have, owner_and_other, qemu_io, run, wait_for_target, xcopy, xcopy_client, Cluster};
use std::path::Path;
use std::process::Command;
use tessera_node::control::{ClusterControl, ObjectView};

const MIB: u64 = 1 << 20;

/// Incompressible bytes, the same for the same seed.
fn random_bytes(seed: u64, len: u64) -> Vec<u8> {
    let mut x = seed | 1;
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

/// `qemu-img compare` of a local raw file against `len` bytes at `offset`
/// of the LUN at `url` (a raw image with an offset over the iSCSI LUN).
async fn range_matches(file: &Path, url: &str, offset: u64, len: u64) -> bool {
    let rest = url.strip_prefix("iscsi://").expect("an iscsi:// URL");
    let mut parts = rest.splitn(3, '/');
    let (portal, target, lun) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let image = format!(
        r#"json:{{"driver":"raw","offset":{offset},"size":{len},"file":{{"driver":"iscsi","transport":"tcp","portal":"{portal}","target":"{target}","lun":{lun}}}}}"#
    );
    let file = file.to_str().unwrap().to_string();
    tokio::task::spawn_blocking(move || {
        let out = Command::new("qemu-img")
            .args(["compare", "-q", "-f", "raw", &file, &image])
            .output()
            .expect("qemu-img starts");
        assert!(
            out.status.code().is_some_and(|c| c <= 1),
            "qemu-img compare failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.status.success()
    })
    .await
    .unwrap()
}

/// Physical bytes of every disk group of the datastore, as the API shows
/// them, once every disk group has moved its write log to the capacity
/// tier (data still in the log is not yet on the capacity devices).
async fn physical_bytes(cluster: &Cluster) -> u64 {
    for host in cluster.control.hosts().running() {
        for group in host.replica().disk_groups() {
            group.settle().await.expect("disk group settles");
        }
    }
    ClusterControl::hosts(cluster.control.as_ref())
        .await
        .unwrap()
        .iter()
        .flat_map(|h| &h.disk_groups)
        .map(|g| g.physical_bytes.expect("a host of this process"))
        .sum()
}

fn data_hosts(view: &ObjectView) -> Vec<(String, String)> {
    let mut hosts: Vec<(String, String)> = view
        .components
        .iter()
        .filter(|c| c.column.is_some())
        .map(|c| (c.host.clone(), c.disk_group.clone()))
        .collect();
    hosts.sort();
    hosts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_inside_a_volume_shares_blocks_keeps_them_on_overwrite_and_frees_them_on_unmap() {
    if !have("qemu-img") || !have("qemu-io") || !have("iscsi-inq") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(client) = xcopy_client(dir.path()) else {
        return;
    };
    let cluster = Cluster::start(3600).await;
    let view = cluster.create("vmfs", 256 * MIB).await;
    let (owner, _) = owner_and_other(&view);
    let url = cluster.iscsi_url(&owner, "vmfs");
    wait_for_target(&url).await;
    let empty = physical_bytes(&cluster).await;

    // A virtual disk's worth of data at the start of the datastore volume.
    let len = 64 * MIB;
    let original = dir.path().join("disk.raw");
    std::fs::write(&original, random_bytes(7, len)).unwrap();
    let (file, target) = (original.to_str().unwrap().to_string(), url.clone());
    tokio::task::spawn_blocking(move || {
        run(
            "qemu-img",
            &["convert", "-n", "-f", "raw", "-O", "raw", &file, &target],
        )
    })
    .await
    .unwrap();
    let written = physical_bytes(&cluster).await;
    assert!(
        written - empty >= 2 * len,
        "two copies of {len} bytes take {} bytes",
        written - empty
    );

    // Cloned to another range of the same volume, as ESXi clones a VM
    // inside one VMFS datastore: 16 MiB per command.
    let clone_at = 128 * MIB;
    let printed = xcopy(&client, &url, clone_at, &url, 0, len).await;
    assert!(printed.contains("with 4 commands"), "{printed}");
    assert!(range_matches(&original, &url, clone_at, len).await);
    let cloned = physical_bytes(&cluster).await;
    assert!(
        cloned - written < len / 16,
        "the copy of {len} bytes grew the datastore's physical usage by {} bytes",
        cloned - written
    );
    let after = cluster.control.object("vmfs").await.unwrap();
    assert_eq!(after.offloads.clone_shared_bytes, len);
    assert_eq!(after.offloads.clone_commands, 4);
    assert_eq!(
        after.offloads.clone_write_blocks,
        len / fixture::XCOPY_LBA_BYTES
    );
    let report = cluster.control.verify_object("vmfs").await.unwrap();
    assert!(report.identical, "{report:?}");

    // The guest of the source writes: the clone keeps the old data.
    qemu_io(&url, &["write -P 0x5a 0 8M"]).await;
    let read = qemu_io(&url, &["read -P 0x5a 0 8M"]).await;
    assert!(!read.contains("Pattern verification failed"), "{read}");
    assert!(range_matches(&original, &url, clone_at, len).await);
    let report = cluster.control.verify_object("vmfs").await.unwrap();
    assert!(report.identical, "{report:?}");

    // Both deleted: the space comes back.
    qemu_io(&url, &["discard 0 64M", "discard 128M 64M"]).await;
    let freed = physical_bytes(&cluster).await;
    assert!(
        freed < empty + 4 * MIB,
        "after unmapping both, {freed} bytes are in use (empty: {empty})"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copies_that_cannot_share_blocks_move_the_data_and_give_the_same_bytes() {
    if !have("qemu-img") || !have("iscsi-inq") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(client) = xcopy_client(dir.path()) else {
        return;
    };
    let cluster = Cluster::start(3600).await;
    let template = cluster.create("template", 64 * MIB).await;
    let vm = cluster.create("vm", 64 * MIB).await;
    let (owner, other) = owner_and_other(&template);
    let len = 16 * MIB;
    let original = dir.path().join("template.raw");
    std::fs::write(&original, random_bytes(11, len)).unwrap();
    let template_url = cluster.iscsi_url(&owner, "template");
    wait_for_target(&template_url).await;
    let (file, target) = (original.to_str().unwrap().to_string(), template_url.clone());
    tokio::task::spawn_blocking(move || {
        run(
            "qemu-img",
            &["convert", "-n", "-f", "raw", "-O", "raw", &file, &target],
        )
    })
    .await
    .unwrap();

    // Through a host that owns neither range's volume: the data moves
    // through the owner.
    let other_url = cluster.iscsi_url(&other, "template");
    wait_for_target(&other_url).await;
    xcopy(&client, &other_url, 32 * MIB, &other_url, 0, len).await;
    assert!(range_matches(&original, &template_url, 32 * MIB, len).await);
    let after = cluster.control.object("template").await.unwrap();
    assert_eq!(after.offloads.clone_shared_bytes, 0);

    // Into another volume, through its owner: shared only when one host
    // owns both and their copies sit on the same disk groups.
    let vm_owner = vm.owner.clone().expect("an owner");
    let vm_url = cluster.iscsi_url(&vm_owner, "vm");
    wait_for_target(&vm_url).await;
    let template_on_vm_owner = cluster.iscsi_url(&vm_owner, "template");
    wait_for_target(&template_on_vm_owner).await;
    xcopy(&client, &vm_url, 0, &template_on_vm_owner, 0, len).await;
    assert!(range_matches(&original, &vm_url, 0, len).await);
    let shares = vm_owner == owner && data_hosts(&template) == data_hosts(&vm);
    let after = cluster.control.object("vm").await.unwrap();
    assert_eq!(
        after.offloads.clone_shared_bytes,
        if shares { len } else { 0 },
        "template on {:?} owned by {owner}, vm on {:?} owned by {vm_owner}",
        data_hosts(&template),
        data_hosts(&vm)
    );
    for volume in ["template", "vm"] {
        let report = cluster.control.verify_object(volume).await.unwrap();
        assert!(report.identical, "{report:?}");
    }
    cluster.stop().await;
}
