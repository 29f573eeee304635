//! A user's walk through `tessera up` with the built binary: create, resize
//! (to the same size, then larger), stop a host that holds a copy, start it
//! again and let it resync; at every step `volume list`, `volume show`,
//! `object show` and `status` agree, in tables and in `--json`, and
//! `tessera health` names what is wrong and clears when it is fixed.

use serde_json::Value;
use std::net::{Ipv4Addr, TcpListener};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `tessera up` in the background, stopped when the test ends.
struct Cluster {
    process: Child,
    api: String,
    _data: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

fn free_port(ip: Ipv4Addr) -> u16 {
    TcpListener::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Cluster {
    fn start() -> Cluster {
        let data = tempfile::tempdir().unwrap();
        let seed = std::process::id().wrapping_mul(31);
        let bind = Ipv4Addr::new(127, 40 + (seed % 30) as u8, (seed / 30 % 250) as u8, 1);
        let ports: Vec<String> = (0..4).map(|_| free_port(bind).to_string()).collect();
        let process = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .arg("up")
            .arg("--data-dir")
            .arg(data.path())
            .args(["--bind", &bind.to_string(), "--host-capacity", "1G"])
            .args(["--api-port", &ports[0], "--nbd-port", &ports[1]])
            .args(["--iscsi-port", &ports[2], "--transport-port", &ports[3]])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let cluster = Cluster {
            process,
            api: format!("https://{bind}:{}", ports[0]),
            _data: data,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while !cluster.tessera(&["status"]).status.success() {
            assert!(Instant::now() < deadline, "tessera up never answered");
            std::thread::sleep(Duration::from_millis(250));
        }
        cluster
    }

    fn tessera(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["--api", &self.api])
            .args(args)
            .env("TESSERA_TOKEN_FILE", self._data.path().join("admin.token"))
            .output()
            .unwrap()
    }

    /// Runs a verb that must succeed and returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.tessera(args);
        assert!(
            out.status.success(),
            "tessera {args:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        serde_json::from_str(&self.ok(&all)).unwrap()
    }
}

/// The element of a JSON array whose `name` is `name`.
fn named(list: &Value, name: &str) -> Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list:#}"))
        .clone()
}

/// State, owner and epoch of `vm1` as every view prints it, in JSON and in
/// the `volume list` table; retried while a change is under way between
/// two reads.
fn agreed_state(cluster: &Cluster) -> (String, Value, Value) {
    for _ in 0..30 {
        let listed = named(&cluster.json(&["volume", "list"]), "vm1");
        let one = cluster.json(&["volume", "show", "vm1"]);
        let object = cluster.json(&["object", "show", "vm1"]);
        let status = cluster.json(&["status"]);
        let in_status = named(&status["volumes"], "vm1");
        let table = cluster.ok(&["volume", "list"]);
        let row = table
            .lines()
            .find(|l| l.starts_with("vm1 "))
            .unwrap()
            .to_string();
        let key = |v: &Value| (v["state"].clone(), v["owner"].clone(), v["epoch"].clone());
        let all = [key(&listed), key(&one), key(&object), key(&in_status)];
        let state = listed["state"].as_str().unwrap().to_string();
        let owner = listed["owner"].as_str().unwrap_or("-").to_string();
        if all.windows(2).all(|w| w[0] == w[1])
            && row.contains(&format!(" {state} "))
            && row.contains(&format!(" {owner} "))
        {
            return (state, listed["owner"].clone(), listed["epoch"].clone());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("the views of vm1 keep disagreeing");
}

fn wait_until(cluster: &Cluster, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let status = cluster.json(&["status"]);
        if ok(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {status:#}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn has_check(status: &Value, code: &str) -> bool {
    status["checks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["code"] == code)
}

#[test]
fn list_show_object_status_and_json_agree_through_create_resize_host_stop_and_resync() {
    let cluster = Cluster::start();

    let created = cluster.json(&["volume", "create", "vm1", "--size", "64M"]);
    assert_eq!(created["state"], "healthy", "{created:#}");
    assert!(created["owner"].is_string(), "{created:#}");
    let text = cluster.ok(&["volume", "create", "vm2", "--size", "16M"]);
    assert!(text.contains("healthy, owner host-"), "{text}");
    let (state, owner, epoch) = agreed_state(&cluster);
    assert_eq!(
        (state.as_str(), &owner, &epoch),
        ("healthy", &created["owner"], &created["epoch"])
    );

    // Component ids read the same in JSON and in the tree.
    let object = cluster.json(&["object", "show", "vm1"]);
    let tree = cluster.ok(&["object", "show", "vm1"]);
    for c in object["components"].as_array().unwrap() {
        let id = c["id"].as_str().expect("a component id is text");
        assert!(
            id.starts_with('c') && tree.contains(id),
            "{id} not in:\n{tree}"
        );
    }
    // Every component is counted on its disk group.
    let hosts = cluster.json(&["host", "list"]);
    let counted: u64 = hosts
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|h| h["disk_groups"].as_array().unwrap().iter())
        .map(|g| g["components"].as_u64().unwrap())
        .sum();
    let placed = object["components"].as_array().unwrap().len() as u64
        + cluster.json(&["object", "show", "vm2"])["components"]
            .as_array()
            .unwrap()
            .len() as u64;
    assert_eq!(counted, placed);

    // A resize to the same size keeps the epoch; a larger one serves at once.
    let same = cluster.json(&["volume", "resize", "vm1", "--size", "64M"]);
    assert_eq!(same["epoch"], epoch, "{same:#}");
    let grown = cluster.json(&["volume", "resize", "vm1", "--size", "128M"]);
    assert_eq!(grown["state"], "healthy", "{grown:#}");
    assert_eq!(grown["size_bytes"], 128u64 << 20);
    agreed_state(&cluster);

    // A host holding a copy stops: every view says degraded at once, and
    // health says why, what it affects and what to do.
    let owner = grown["owner"].as_str().unwrap().to_string();
    let copy_host = object["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["role"] == "data" && c["host"] != owner.as_str())
        .map(|c| c["host"].as_str().unwrap().to_string())
        .expect("a copy on another host");
    cluster.ok(&["host", "stop", &copy_host]);
    let (state, _, _) = agreed_state(&cluster);
    assert_eq!(state, "degraded");
    let status = cluster.json(&["status"]);
    assert_eq!(status["health"], "degraded");
    assert!(has_check(&status, "HOST_DOWN"), "{status:#}");
    let health = cluster.tessera(&["health"]);
    let text = String::from_utf8_lossy(&health.stdout).to_string();
    assert!(health.status.success(), "warnings only: exit 0\n{text}");
    assert!(
        text.contains("[WARN] HOST_DOWN") && text.contains(&copy_host),
        "{text}"
    );
    assert!(text.contains("remedy: "), "{text}");
    let table = cluster.ok(&["status"]);
    assert!(table.contains("HOST_DOWN"), "{table}");

    // Writes go on while it is away; started again, it resyncs and every
    // check clears.
    cluster.ok(&["host", "start", &copy_host]);
    let status = wait_until(&cluster, "health to return", |s| {
        s["health"] == "healthy" && s["checks"].as_array().unwrap().is_empty()
    });
    assert!(status["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .all(|h| h["state"] == "present"));
    let (state, _, _) = agreed_state(&cluster);
    assert_eq!(state, "healthy");
    let health = cluster.ok(&["health"]);
    assert!(health.contains("no problems found"), "{health}");
    // Each resync shows once, with its current state.
    let resyncs = cluster.json(&["resync", "list"]);
    let mut seen: Vec<(String, String)> = resyncs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["volume"].as_str().unwrap().to_string(),
                r["component"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let rows = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), rows, "one row per resync: {resyncs:#}");
    assert!(resyncs
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["state"] != "running"));
}

#[test]
fn snapshots_are_taken_listed_cloned_and_deleted_through_the_cli() {
    let cluster = Cluster::start();
    cluster.ok(&["volume", "create", "db", "--size", "64M"]);
    let taken = cluster.json(&["snapshot", "create", "db", "nightly-1"]);
    assert_eq!(taken["name"], "nightly-1");
    assert_eq!(taken["export"], "db@nightly-1");
    assert_eq!(taken["iscsi_target"], "iqn.2026-11.io.tessera:db:nightly-1");
    assert_eq!(taken["size_bytes"], 64 << 20);
    assert_eq!(taken["components"].as_array().unwrap().len(), 2);
    let text = cluster.ok(&["snapshot", "create", "db", "nightly-2"]);
    assert!(
        text.contains("took snapshot nightly-2 of volume db")
            && text.contains("db@nightly-2")
            && text.contains("iSCSI target iqn.2026-11.io.tessera:db:nightly-2, LUN 0"),
        "{text}"
    );
    // Listed oldest first, in a table and in JSON.
    let listed = cluster.json(&["snapshot", "list", "db"]);
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["nightly-1", "nightly-2"]);
    let table = cluster.ok(&["snapshot", "list", "db"]);
    assert!(
        table.contains("nightly-1")
            && table.contains("db@nightly-2")
            && table.contains("iqn.2026-11.io.tessera:db:nightly-2"),
        "{table}"
    );
    // Bad requests get a clear error and change nothing.
    for (args, says) in [
        (
            &["snapshot", "create", "db", "nightly-1"][..],
            "already has a snapshot named nightly-1",
        ),
        (&["snapshot", "create", "db", "a/b"][..], "snapshot name"),
        (
            &["snapshot", "create", "nope", "x"][..],
            "no volume named nope",
        ),
        (
            &["snapshot", "delete", "db", "never"][..],
            "no snapshot named never",
        ),
    ] {
        let out = cluster.tessera(args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "tessera {args:?} succeeded: {text}");
        assert!(text.contains(says), "tessera {args:?}: {text}");
    }
    assert_eq!(
        cluster
            .json(&["snapshot", "list", "db"])
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // A linked clone is a volume at once.
    let clone = cluster.json(&["volume", "clone", "db-copy", "--from", "db@nightly-1"]);
    assert_eq!(clone["name"], "db-copy");
    assert_eq!(clone["size_bytes"], 64 << 20);
    assert_eq!(
        named(&cluster.json(&["volume", "list"]), "db-copy")["policy"],
        "default"
    );
    let out = cluster.tessera(&["volume", "clone", "x", "--from", "db"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("VOLUME@SNAPSHOT"));
    // Deleted: gone from the list.
    let text = cluster.ok(&["snapshot", "delete", "db", "nightly-1"]);
    assert!(
        text.contains("deleted snapshot nightly-1 of volume db"),
        "{text}"
    );
    let listed = cluster.json(&["snapshot", "list", "db"]);
    assert_eq!(named(&listed, "nightly-2")["export"], "db@nightly-2");
    assert_eq!(listed.as_array().unwrap().len(), 1);
    let text = cluster.ok(&["volume", "revert", "db", "--to", "nightly-2"]);
    assert!(text.contains("reverted volume db"), "{text}");
    let out = cluster.tessera(&["volume", "revert", "db", "--to", "nightly-1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no snapshot named nightly-1"));
    cluster.ok(&["snapshot", "delete", "db", "nightly-2"]);
    assert!(cluster
        .ok(&["snapshot", "list", "db"])
        .contains("no snapshots"));
}
