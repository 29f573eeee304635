//! What a user watching a running `tessera up` sees while fio works on one
//! of two volumes: `tessera top -b -d 1 -n 5` writes five CSV rows per
//! volume that parse back, the busy volume's rows move and the idle one's
//! stay at zero; `/metrics` over HTTPS with a token answers the Prometheus
//! text format with the busy volume's operations counted, and refuses a
//! caller without a token. Skips without fio or curl.

mod common;

use common::have;
use common::up::{fio, tessera, UpCluster};
use std::collections::HashMap;
use std::process::Command;

/// Parses `top -b` output: the header's columns, then each row as a map.
fn parse_csv(text: &str) -> Vec<HashMap<String, String>> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    assert_eq!(header[0], "time_unix", "{text}");
    lines
        .map(|line| {
            let cells: Vec<&str> = line.split(',').collect();
            assert_eq!(
                cells.len(),
                header.len(),
                "a row of {} columns: {line}",
                header.len()
            );
            header
                .iter()
                .zip(cells)
                .map(|(h, c)| (h.to_string(), c.to_string()))
                .collect()
        })
        .collect()
}

fn number(row: &HashMap<String, String>, column: &str) -> f64 {
    row[column]
        .parse()
        .unwrap_or_else(|_| panic!("{column} is a number: {row:?}"))
}

#[test]
fn top_and_metrics_show_what_fio_does_to_a_volume() {
    if !have("fio") || !have("curl") {
        return;
    }
    let up = UpCluster::start(89, &[]);
    let (busy, uri) = up.create_volume("busy", "64M", None);
    up.create_volume("idle", "64M", None);
    let owner = busy["owner"].as_str().unwrap().to_string();

    let load = fio(&uri, &["--rw=randrw", "--time_based", "--runtime=9"])
        .spawn()
        .expect("fio starts");
    std::thread::sleep(std::time::Duration::from_secs(1));
    let (ok, text) = tessera(&up.api, &["top", "-b", "-d", "1", "-n", "5"]);
    let fio_out = load.wait_with_output().unwrap();
    assert!(fio_out.status.success(), "fio: {fio_out:?}");
    assert!(ok, "{text}");

    let rows = parse_csv(&text);
    let of = |name: &str| -> Vec<&HashMap<String, String>> {
        rows.iter()
            .filter(|r| r["kind"] == "volume" && r["name"] == name)
            .collect()
    };
    let (busy_rows, idle_rows) = (of("busy"), of("idle"));
    assert_eq!(busy_rows.len(), 5, "{text}");
    assert_eq!(idle_rows.len(), 5, "{text}");
    let moving = busy_rows
        .iter()
        .filter(|r| number(r, "read_iops") > 0.0 && number(r, "write_iops") > 0.0)
        .count();
    assert!(moving >= 4, "fio ran through the whole sample:\n{text}");
    for r in &busy_rows {
        assert_eq!(r["owner"], owner);
        assert_eq!(number(r, "clients"), 1.0, "{text}");
        if number(r, "write_iops") > 0.0 {
            assert!(number(r, "write_latency_us") > 0.0, "{text}");
            // 4 KiB writes: MiB/s is IOPS / 256.
            let ratio = number(r, "write_iops") / 256.0 / number(r, "write_mib_s");
            assert!((0.9..1.1).contains(&ratio), "{text}");
        }
    }
    for r in &idle_rows {
        for column in ["read_iops", "write_iops", "queue", "errors_s"] {
            assert_eq!(number(r, column), 0.0, "{text}");
        }
    }
    // The owner's host row adds up its volumes: at least the busy one's.
    let host_rows: Vec<_> = rows
        .iter()
        .filter(|r| r["kind"] == "host" && r["name"] == owner)
        .collect();
    assert_eq!(host_rows.len(), 5, "{text}");
    for (h, v) in host_rows.iter().zip(&busy_rows) {
        assert!(number(h, "write_iops") >= number(v, "write_iops"), "{text}");
    }

    // Prometheus over HTTPS, as a scraper with the token would.
    let token = std::fs::read_to_string(up.data_dir.join("admin.token")).unwrap();
    let ca = up.data_dir.join("tls").join("ca-cert.pem");
    let scrape = |auth: Option<&str>| {
        let mut curl = Command::new("curl");
        curl.args(["-s", "-i", "--cacert"]).arg(&ca);
        if let Some(token) = auth {
            curl.args(["-H", &format!("Authorization: Bearer {}", token.trim())]);
        }
        let out = curl.arg(format!("{}/metrics", up.api)).output().unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let answer = scrape(Some(&token));
    assert!(
        answer.starts_with("HTTP/2 200") || answer.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
    assert!(
        answer
            .to_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{answer}"
    );
    let writes = answer
        .lines()
        .find(|l| {
            l.starts_with("tessera_volume_operations_total{")
                && l.contains("volume=\"busy\"")
                && l.contains("op=\"write\"")
        })
        .unwrap_or_else(|| panic!("busy's writes in:\n{answer}"));
    let count: f64 = writes.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(count > 100.0, "{writes}");
    let refused = scrape(None);
    assert!(refused.contains(" 401"), "{refused}");
}
