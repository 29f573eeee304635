//! The Prometheus endpoint on a four-host cluster in one process: fio over
//! NBD and EXTENDED COPY over iSCSI (the libiscsi initiator of
//! `tests/tools/xcopy_range.c`) move the counters by exactly what they did,
//! and `promtool check metrics` (Debian's prometheus package) accepts the
//! text. Skips without fio, or without libiscsi's tools for the copy.

mod fixture;

use fixture::{have, owner_and_other, run, wait_for_target, xcopy, xcopy_client, Cluster};
use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};

const MIB: u64 = 1 << 20;

/// The value of every sample of `text`, by its whole series name with labels.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("a sample line");
            (series.to_string(), value.parse().expect("a number"))
        })
        .collect()
}

/// The sample of `name` whose labels include every one of `labels`.
fn sample(all: &HashMap<String, f64>, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = all
        .iter()
        .filter(|(series, _)| {
            series.split('{').next() == Some(name)
                && labels
                    .iter()
                    .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(found.len(), 1, "one {name} with {labels:?}: {found:?}");
    found[0]
}

/// Runs fio on `uri`: `size` bytes of 4 KiB operations of `rw`, each block
/// once.
async fn fio(uri: &str, rw: &str, size: u64) {
    let args = [
        "--name=metrics".to_string(),
        "--ioengine=nbd".to_string(),
        format!("--uri={uri}"),
        format!("--rw={rw}"),
        "--bs=4k".to_string(),
        "--iodepth=8".to_string(),
        format!("--size={size}"),
    ];
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run("fio", &args)
    })
    .await
    .unwrap();
}

/// `promtool check metrics` on `text`: its complaints, or None when it
/// accepts it (or is not installed).
fn promtool_complaints(text: &str) -> Option<String> {
    if !have("promtool") {
        eprintln!("promtool not installed: the format check is skipped");
        return None;
    }
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (!out.status.success()).then(|| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fio_and_extended_copy_move_the_counters_by_what_they_did() {
    if !have("fio") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(3600).await;
    let view = cluster.create("vmfs", 256 * MIB).await;
    let (owner, other) = owner_and_other(&view);
    let volume = [("volume", "vmfs"), ("owner", owner.as_str())];
    let op = |kind: &'static str| [volume[0], volume[1], ("op", kind)];

    // Through a host that does not own the volume: counted on the owner.
    let uri = cluster.nbd_uri(&other, "vmfs");
    fio(&uri, "randwrite", 4 * MIB).await;
    fio(&uri, "randread", 4 * MIB).await;
    let text = tessera_node::metrics::scrape(cluster.control.as_ref())
        .await
        .unwrap();
    if let Some(complaints) = promtool_complaints(&text) {
        panic!("promtool refuses /metrics: {complaints}\n{text}");
    }
    let all = samples(&text);
    let blocks = (4 * MIB / 4096) as f64;
    for kind in ["write", "read"] {
        assert_eq!(
            sample(&all, "tessera_volume_operations_total", &op(kind)),
            blocks
        );
        assert_eq!(
            sample(&all, "tessera_volume_bytes_total", &op(kind)),
            (4 * MIB) as f64
        );
        assert_eq!(
            sample(&all, "tessera_volume_operation_errors_total", &op(kind)),
            0.0
        );
        // Every operation is in the histogram, and each took some time.
        assert_eq!(
            sample(
                &all,
                "tessera_volume_operation_duration_seconds_count",
                &op(kind)
            ),
            blocks
        );
        let mut bucket = op(kind).to_vec();
        bucket.push(("le", "+Inf"));
        assert_eq!(
            sample(
                &all,
                "tessera_volume_operation_duration_seconds_bucket",
                &bucket
            ),
            blocks
        );
        assert!(
            sample(
                &all,
                "tessera_volume_operation_duration_seconds_sum",
                &op(kind)
            ) > 0.0
        );
    }
    assert_eq!(sample(&all, "tessera_host_up", &[("host", &owner)]), 1.0);
    // The host fio reached forwarded every request to the owner, and the
    // owner's writes went through write logs.
    assert!(sample(&all, "tessera_transport_calls_total", &[("host", &other)]) >= 2.0 * blocks);
    // ... each to the owner: per peer, with the time they took.
    let to_owner = [("host", other.as_str()), ("peer", owner.as_str())];
    let forwarded = sample(&all, "tessera_transport_peer_calls_total", &to_owner);
    assert!(forwarded >= 2.0 * blocks, "{text}");
    let failed = sample(&all, "tessera_transport_peer_call_errors_total", &to_owner);
    let spent = sample(
        &all,
        "tessera_transport_peer_round_trip_seconds_total",
        &to_owner,
    );
    let mean = spent / (forwarded - failed);
    assert!(
        mean > 0.0 && mean < 1.0,
        "mean round trip {mean} s:
{text}"
    );
    let commits: f64 = all
        .iter()
        .filter(|(k, _)| k.starts_with("tessera_disk_group_log_group_commits_total{"))
        .map(|(_, v)| *v)
        .sum();
    assert!(commits > 0.0, "{text}");
    let groups = all
        .keys()
        .filter(|k| k.starts_with("tessera_disk_group_capacity_bytes{"))
        .count();
    assert_eq!(groups, 4, "one capacity series per disk group:\n{text}");

    // EXTENDED COPY inside the volume, as ESXi clones a VM inside one VMFS
    // datastore: 64 MiB in 4 commands of 16 MiB, shared, no data moved.
    if !have("iscsi-inq") {
        cluster.stop().await;
        return;
    }
    let Some(client) = xcopy_client(dir.path()) else {
        cluster.stop().await;
        return;
    };
    let url = cluster.iscsi_url(&owner, "vmfs");
    wait_for_target(&url).await;
    let printed = xcopy(&client, &url, 128 * MIB, &url, 0, 64 * MIB).await;
    assert!(printed.contains("with 4 commands"), "{printed}");
    let text = tessera_node::metrics::scrape(cluster.control.as_ref())
        .await
        .unwrap();
    let all = samples(&text);
    assert_eq!(
        sample(&all, "tessera_vaai_clone_commands_total", &volume),
        4.0
    );
    assert_eq!(
        sample(&all, "tessera_vaai_clone_shared_bytes_total", &volume),
        (64 * MIB) as f64
    );
    assert_eq!(
        sample(&all, "tessera_vaai_clone_written_blocks_total", &volume),
        (64 * MIB / fixture::XCOPY_LBA_BYTES) as f64
    );
    // The copy moved no client writes.
    assert_eq!(
        sample(&all, "tessera_volume_operations_total", &op("write")),
        blocks
    );
    cluster.stop().await;
}
