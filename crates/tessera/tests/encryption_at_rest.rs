//! Encryption at rest through a real `tessera up --encrypt`: what fio
//! writes to a volume is nowhere on the hosts' device files, and a shallow
//! and a deep rekey of the hosts that hold its copies run while fio
//! verifies what it wrote.

mod common;

use common::have;
use common::up::{expect_success, fio, object, tessera, UpCluster};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// 16 bytes, so every 4 KiB block fio fills with it is the same block.
const SECRET: &str = "tessera-secret!!";

fn encryption(api: &str) -> Vec<Value> {
    let (ok, text) = tessera(api, &["--json", "encryption", "list"]);
    assert!(ok, "{text}");
    serde_json::from_str::<Vec<Value>>(&text).unwrap()
}

/// Device files of every host that hold `needle`, found by grep.
fn files_holding(data_dir: &std::path::Path, needle: &str) -> Vec<String> {
    let mut devices = Vec::new();
    for host in std::fs::read_dir(data_dir).unwrap().flatten() {
        for file in std::fs::read_dir(host.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if file.path().extension().is_some_and(|e| e == "img") {
                devices.push(file.path());
            }
        }
    }
    assert!(devices.len() >= 8, "device files: {devices:?}");
    let out = std::process::Command::new("grep")
        .args(["-l", "-a", "-F", needle])
        .args(&devices)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn an_encrypted_cluster_keeps_no_plaintext_and_rekeys_under_fio_verify() {
    if !have("fio") || !have("grep") {
        return;
    }
    let up = UpCluster::start(87, &["--encrypt", "--host-capacity", "256M"]);
    let api = up.api.clone();
    let groups = encryption(&api);
    assert_eq!(groups.len(), 4, "{groups:?}");
    let first_kek = groups[0]["encryption"]["kek_id"]
        .as_str()
        .unwrap()
        .to_string();
    for g in &groups {
        assert_eq!(g["encryption"]["cipher"], "aes-256-xts", "{g}");
        assert_eq!(g["encryption"]["kek_id"], first_kek.as_str(), "{g}");
        assert_eq!(g["encryption"]["generation"], 1, "{g}");
    }

    let (_, uri) = up.create_volume("vm", "64M", None);
    let pattern = format!("--verify_pattern=\"{SECRET}\"");
    let secret_half = [
        "--rw=write",
        "--bs=64k",
        "--verify=pattern",
        pattern.as_str(),
        "--do_verify=1",
    ];
    expect_success(
        fio(&uri, &secret_half).spawn().unwrap(),
        "writing the pattern",
    );
    // grep finds the pattern where it lies in clear (here, a file of its
    // own); on the devices it finds nothing.
    let control = up.data_dir.join("host-1").join("control.img");
    std::fs::write(&control, SECRET.repeat(256)).unwrap();
    assert_eq!(files_holding(&up.data_dir, SECRET).len(), 1);
    std::fs::remove_file(&control).unwrap();
    assert_eq!(files_holding(&up.data_dir, SECRET), Vec::<String>::new());

    // fio verifies the other half of the volume, run after run, while the
    // keys change underneath.
    let stop = Arc::new(AtomicBool::new(false));
    let verifier = {
        let (uri, stop) = (uri.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut runs = 0;
            while !stop.load(Ordering::Acquire) || runs == 0 {
                let run = fio(
                    &uri,
                    &[
                        "--rw=randrw",
                        "--offset=32M",
                        "--verify=crc32c",
                        "--verify_backlog=256",
                        "--time_based",
                        "--runtime=3",
                    ],
                )
                .spawn()
                .unwrap();
                expect_success(run, "verifying during the rekeys");
                runs += 1;
            }
            runs
        })
    };

    // Shallow rekey: a new key encryption key in the file every host
    // reads; each host seals its data key with it.
    let kek_file = up.data_dir.join("keys").join("kek");
    std::fs::remove_file(&kek_file).unwrap();
    let new_kek = tessera_store::KeyEncryptionKey::generate().unwrap();
    new_kek.save_new(&kek_file).unwrap();
    for k in 1..=4 {
        let host = format!("host-{k}");
        let (ok, text) = tessera(&api, &["encryption", "rekey", &host]);
        assert!(ok, "{text}");
        assert!(text.contains(&new_kek.id().to_string()), "{text}");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while encryption(&api)
        .iter()
        .any(|g| g["encryption"]["kek_id"] != new_kek.id().to_string().as_str())
    {
        assert!(Instant::now() < deadline, "{:?}", encryption(&api));
        std::thread::sleep(Duration::from_millis(300));
    }

    // Deep rekey of the hosts holding the volume's copies: one followed
    // to its end by the CLI, the other in the background.
    let view = object(&api, "vm");
    let mut data_hosts: Vec<String> = view["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["role"] == "data")
        .map(|c| c["host"].as_str().unwrap().to_string())
        .collect();
    data_hosts.sort();
    data_hosts.dedup();
    assert_eq!(data_hosts.len(), 2, "{view:#}");
    let (ok, text) = tessera(&api, &["encryption", "rekey", &data_hosts[1], "--deep"]);
    assert!(ok && text.contains("deep rekey started"), "{text}");
    let (ok, text) = tessera(&api, &["encryption", "rekey", &data_hosts[1], "--deep"]);
    assert!(!ok && text.contains("already under way"), "{text}");
    let (ok, text) = tessera(
        &api,
        &["encryption", "rekey", &data_hosts[0], "--deep", "--wait"],
    );
    assert!(ok && text.contains("deep rekey done"), "{text}");
    assert!(text.contains("rekeying dg0"), "no progress shown: {text}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let groups = encryption(&api);
        let done = groups
            .iter()
            .filter(|g| data_hosts.contains(&g["host"].as_str().unwrap().to_string()))
            .all(|g| g["encryption"]["generation"] == 2 && g["encryption"]["rekey"].is_null());
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "deep rekeys unfinished: {groups:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    stop.store(true, Ordering::Release);
    let runs = verifier.join().expect("fio verified through every rekey");
    assert!(runs >= 1);

    // The pattern reads back, and is still nowhere on the devices.
    expect_success(
        fio(&uri, &secret_half)
            .arg("--verify_only")
            .spawn()
            .unwrap(),
        "reading the pattern back after the rekeys",
    );
    assert_eq!(files_holding(&up.data_dir, SECRET), Vec::<String>::new());
    let (ok, text) = tessera(&api, &["encryption", "list"]);
    assert!(ok && text.contains("generation 2"), "{text}");
}
