//! Multi-host mode with real processes: an etcd server, four `tessera node`
//! processes on their own loopback addresses, and fio's nbd engine verifying
//! CRC32C while hosts are killed with SIGKILL (a replica host, then the
//! owner) and while the owner is frozen with SIGSTOP past its lease.

mod common;

use common::{free_port, have};
use serde_json::Value;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HOSTS: usize = 4;

/// Kills its process when dropped, so a failing test leaves nothing behind.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

struct Cluster {
    dir: tempfile::TempDir,
    base: Ipv4Addr,
    nbd_port: u16,
    api_port: u16,
    configs: Vec<PathBuf>,
    nodes: Vec<Option<Proc>>,
    _etcd: Proc,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let seed = std::process::id();
        let base = Ipv4Addr::new(127, 30 + (seed % 200) as u8, (seed / 200 % 250) as u8, 1);
        let (client, peer) = (free_port(), free_port());
        let etcd = Command::new("etcd")
            .args([
                "--name=t",
                &format!("--data-dir={}", dir.path().join("etcd").display()),
                &format!("--listen-client-urls=http://127.0.0.1:{client}"),
                &format!("--advertise-client-urls=http://127.0.0.1:{client}"),
                &format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
                &format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
                &format!("--initial-cluster=t=http://127.0.0.1:{peer}"),
                "--heartbeat-interval=50",
                "--election-timeout=500",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd starts");
        let etcd = Proc(etcd);
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
            assert!(Instant::now() < deadline, "etcd did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let (transport_port, nbd_port, api_port) = (free_port(), free_port(), free_port());
        let mut configs = Vec::new();
        for k in 1..=HOSTS {
            let ip = Ipv4Addr::from(u32::from(base) + k as u32 - 1);
            let host_dir = dir.path().join(format!("host-{k}"));
            let toml = format!(
                r#"id = "host-{k}"
transport_addr = "{ip}:{transport_port}"
nbd_addr = "{ip}:{nbd_port}"
api_addr = "{ip}:{api_port}"
lease_ttl_ms = 3000
directory = {{ kind = "etcd", endpoints = ["http://127.0.0.1:{client}"] }}

[[disk_groups]]
id = "dg0"
cache = {{ path = "{d}/cache.img", size_bytes = 268435456 }}
capacity = [{{ path = "{d}/capacity-0.img", size_bytes = 1073741824 }}]
"#,
                d = host_dir.display()
            );
            let path = dir.path().join(format!("host-{k}.toml"));
            std::fs::write(&path, toml).unwrap();
            configs.push(path);
        }
        let mut cluster = Cluster {
            dir,
            base,
            nbd_port,
            api_port,
            configs,
            nodes: (0..HOSTS).map(|_| None).collect(),
            _etcd: etcd,
        };
        for k in 1..=HOSTS {
            cluster.start_node(k);
        }
        cluster
    }

    fn ip(&self, k: usize) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base) + k as u32 - 1)
    }

    fn start_node(&mut self, k: usize) {
        let log = std::fs::File::create(self.dir.path().join(format!("host-{k}.log"))).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["node", "--config"])
            .arg(&self.configs[k - 1])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("tessera node starts");
        self.nodes[k - 1] = Some(Proc(child));
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect((self.ip(k), self.api_port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "host-{k} did not start: {}",
                self.log(k)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self, k: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("host-{k}.log"))).unwrap_or_default()
    }

    fn kill(&mut self, k: usize) {
        if let Some(mut p) = self.nodes[k - 1].take() {
            signal(&p.0, "-KILL");
            let _ = p.0.wait();
        }
    }

    fn child(&self, k: usize) -> &Child {
        &self.nodes[k - 1].as_ref().unwrap().0
    }

    /// Runs the CLI against the API of a running host.
    fn cli(&self, args: &[&str]) -> (bool, String) {
        let k = (1..=HOSTS).find(|&k| self.nodes[k - 1].is_some()).unwrap();
        // The first host to serve the API wrote the cluster's admin token
        // beside its configuration file.
        let token_file = self.configs[0]
            .parent()
            .expect("a directory")
            .join("admin.token");
        let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .arg("--api")
            .arg(format!("http://{}:{}", self.ip(k), self.api_port))
            .args(args)
            .env("TESSERA_TOKEN_FILE", token_file)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    }

    fn object(&self, volume: &str) -> Value {
        let (ok, out) = self.cli(&["object", "show", volume, "--json"]);
        assert!(ok, "{out}");
        serde_json::from_str(&out).unwrap()
    }

    fn wait_for(&self, volume: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let view = self.object(volume);
            if ok(&view) {
                return view;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {view:#}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    fn host_number(name: &str) -> usize {
        name.trim_start_matches("host-").parse().unwrap()
    }

    fn fio(&self, k: usize, volume: &str, runtime_s: u32) -> Child {
        Command::new("fio")
            .args([
                "--name=verify",
                "--ioengine=nbd",
                &format!("--uri=nbd://{}:{}/{volume}", self.ip(k), self.nbd_port),
                "--rw=randrw",
                "--bs=4k",
                "--iodepth=8",
                "--size=64M",
                "--time_based",
                &format!("--runtime={runtime_s}"),
                "--verify=crc32c",
                "--verify_backlog=256",
                "--verify_fatal=1",
                "--verify_state_save=0",
                "--output-format=terse",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

fn finish(fio: Child, cluster: &Cluster) {
    let out = fio.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "fio failed: {}\n{}\nlogs:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        (1..=HOSTS)
            .map(|k| cluster.log(k))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn epoch(view: &Value) -> u64 {
    view["epoch"].as_u64().unwrap_or(0)
}

fn healthy(v: &Value) -> bool {
    v["owner"].is_string() && v["state"] == "healthy"
}

#[test]
fn etcd_and_four_node_processes_survive_kill_and_stop_of_hosts() {
    if !have("etcd") || !have("fio") {
        return;
    }
    let mut cluster = Cluster::start();
    let (ok, out) = cluster.cli(&["policy", "create", "default", "--ftt", "1"]);
    assert!(ok, "{out}");
    let (ok, out) = cluster.cli(&["volume", "create", "vm", "--size", "256M"]);
    assert!(ok, "{out}");
    let view = cluster.wait_for("vm", "an owner", healthy);
    let owner = Cluster::host_number(view["owner"].as_str().unwrap());
    let first_epoch = epoch(&view);

    // 1. kill -9 of a host holding a copy, not the owner; it comes back.
    let replica = view["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["role"] == "data")
        .map(|c| Cluster::host_number(c["host"].as_str().unwrap()))
        .find(|&h| h != owner)
        .unwrap();
    let fio = cluster.fio(owner, "vm", 14);
    std::thread::sleep(Duration::from_secs(3));
    cluster.kill(replica);
    std::thread::sleep(Duration::from_secs(6));
    cluster.start_node(replica);
    finish(fio, &cluster);
    cluster.wait_for("vm", "the copy to be resynced", healthy);
    let (ok, out) = cluster.cli(&["object", "verify", "vm"]);
    assert!(ok, "copies differ after a replica host was killed: {out}");

    // 2. kill -9 of the owner, the client attached through another host.
    let entry = (1..=HOSTS).find(|&k| k != owner).unwrap();
    let fio = cluster.fio(entry, "vm", 16);
    std::thread::sleep(Duration::from_secs(3));
    cluster.kill(owner);
    let moved = cluster.wait_for("vm", "a new owner", |v| {
        v["owner"]
            .as_str()
            .is_some_and(|o| Cluster::host_number(o) != owner)
    });
    assert!(
        epoch(&moved) > first_epoch,
        "ownership moves with a higher epoch"
    );
    finish(fio, &cluster);
    cluster.start_node(owner);
    let view = cluster.wait_for("vm", "the old owner's copy to be resynced", healthy);

    // 3. A stale owner: frozen past its lease, a new owner takes over, then it
    //    resumes with writes still queued; none may land.
    let frozen = Cluster::host_number(view["owner"].as_str().unwrap());
    let before = epoch(&view);
    let entry = (1..=HOSTS).find(|&k| k != frozen).unwrap();
    let fio = cluster.fio(entry, "vm", 16);
    std::thread::sleep(Duration::from_secs(2));
    signal(cluster.child(frozen), "-STOP");
    let moved = cluster.wait_for("vm", "an owner other than the frozen one", |v| {
        v["owner"]
            .as_str()
            .is_some_and(|o| Cluster::host_number(o) != frozen)
    });
    assert!(epoch(&moved) > before);
    signal(cluster.child(frozen), "-CONT");
    finish(fio, &cluster);
    cluster.wait_for("vm", "the cluster to heal", healthy);
    let (ok, out) = cluster.cli(&["object", "verify", "vm"]);
    assert!(ok, "copies differ after a stale owner resumed: {out}");
    eprintln!(
        "owner epoch rose from {first_epoch} to {} across two owner failures",
        epoch(&moved)
    );
}
