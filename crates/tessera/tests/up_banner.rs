//! `tessera up` as a user runs it with its output redirected: the built
//! binary with stdout and stderr on pipes. The banner (how to connect over
//! the API, NBD and iSCSI, what to run next) is on stdout and nothing else
//! is; the logs are on stderr; neither carries a terminal colour code;
//! the admin token it makes is in its data directory, readable by its user
//! alone, and the CLI run beside `./tessera-data` finds it; the API speaks
//! TLS 1.3 with a certificate of the cluster CA it made (as `openssl
//! s_client` sees it) and tells a plain HTTP client to use HTTPS; and SIGINT
//! (Ctrl-C) stops every host and exits 0.

use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long three hosts get to start and print the banner.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long they get to stop after SIGINT.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// The banner's last line.
const BANNER_END: &str = "Stop with Ctrl-C.";

fn free_port(ip: Ipv4Addr) -> u16 {
    TcpListener::bind((ip, 0))
        .expect("bind a free port")
        .local_addr()
        .expect("local address")
        .port()
}

/// The `tessera up` process, killed if the test ends while it runs.
struct Up(Child);

impl Drop for Up {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn up_prints_its_banner_on_stdout_and_plain_logs_on_stderr() {
    let work = tempfile::tempdir().expect("temp dir");
    // Where `tessera up` keeps its data by default, seen from `work`.
    let data_dir = work.path().join("tessera-data");
    // A loopback subnet of its own, so the hosts meet no other test's.
    let seed = std::process::id();
    let bind = Ipv4Addr::new(127, 10 + (seed % 30) as u8, (seed / 30 % 250) as u8, 1);
    let (api_port, nbd_port, iscsi_port, transport_port) = (
        free_port(bind),
        free_port(bind),
        free_port(bind),
        free_port(bind),
    );
    let mut up = Up(Command::new(env!("CARGO_BIN_EXE_tessera"))
        .arg("up")
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["--bind", &bind.to_string()])
        .args(["--hosts", "3", "--host-capacity", "1G"])
        .args(["--api-port", &api_port.to_string()])
        .args(["--nbd-port", &nbd_port.to_string()])
        .args(["--iscsi-port", &iscsi_port.to_string()])
        .args(["--transport-port", &transport_port.to_string()])
        // The frontends and the host at debug: a secret must not reach even
        // those logs.
        .env(
            "RUST_LOG",
            "info,tessera_node=debug,tessera_iscsi=debug,tessera_nbd=debug",
        )
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tessera up"));

    let (line_sender, lines) = mpsc::channel::<String>();
    let stdout = up.0.stdout.take().expect("stdout pipe");
    let stdout_reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = line_sender.send(line);
        }
    });
    let mut stderr = up.0.stderr.take().expect("stderr pipe");
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });

    let deadline = Instant::now() + START_TIMEOUT;
    let mut banner = Vec::new();
    while banner.last().map(String::as_str) != Some(BANNER_END) {
        if let Ok(Some(status)) = up.0.try_wait() {
            let stderr = stderr_reader.join().unwrap_or_default();
            panic!(
                "tessera up exited ({status}) before its banner on stdout: {banner:#?}\n{stderr}"
            );
        }
        assert!(
            Instant::now() < deadline,
            "no banner on stdout within {START_TIMEOUT:?}: {banner:#?}"
        );
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) {
            banner.push(line);
        }
    }
    let text = banner.join("\n");
    let api = format!("https://{bind}:{api_port}");
    for expected in [
        "Tessera is up: 3 hosts, 1.0 GiB of capacity each".to_string(),
        format!("API:     {api}"),
        format!(
            "Token:   {} (an admin's; for the CLI: export TESSERA_TOKEN_FILE=",
            data_dir.join("admin.token").display()
        ),
        format!("tessera --api {api} volume create vm1 --size 10G"),
        format!(
            "host-3:  NBD 127.{}.{}.3:{nbd_port}",
            bind.octets()[1],
            bind.octets()[2]
        ),
        format!("iSCSI portal {bind}:{iscsi_port}"),
        "target iqn.2026-11.io.tessera:<volume>, LUN 0".to_string(),
        format!("nbdinfo nbd://{bind}:{nbd_port}/vm1"),
        format!(
            "TLS:     {}",
            data_dir.join("tls").join("ca-cert.pem").display()
        ),
        format!(
            "nbdinfo 'nbds://{bind}:{nbd_port}/vm1?tls-certificates={}'",
            data_dir.join("tls").join("client").display()
        ),
        format!("qemu-img info iscsi://{bind}:{iscsi_port}/iqn.2026-11.io.tessera:vm1/0"),
        "qemu-block-extra".to_string(),
        "cargo install --locked --path crates/tessera".to_string(),
    ] {
        assert!(
            text.contains(&expected),
            "banner lacks {expected:?}:\n{text}"
        );
    }

    // The admin token: readable by this user alone, found by the CLI run
    // where `./tessera-data` is; without it the API refuses.
    use std::os::unix::fs::PermissionsExt;
    let token_file = data_dir.join("admin.token");
    let mode = std::fs::metadata(&token_file)
        .expect("the admin token file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{}", token_file.display());
    let cli = |dir: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["--api", &api, "volume", "list"])
            .current_dir(dir)
            .env_remove("TESSERA_TOKEN")
            .env_remove("TESSERA_TOKEN_FILE")
            .output()
            .expect("run tessera")
    };
    let found = cli(work.path());
    assert!(
        found.status.success(),
        "{}",
        String::from_utf8_lossy(&found.stderr)
    );
    // Elsewhere the CLI finds neither the token nor the CA: it cannot
    // trust the API's certificate, and says where the CA is kept.
    let elsewhere = cli(&data_dir);
    assert_eq!(elsewhere.status.code(), Some(3));
    let said = String::from_utf8_lossy(&elsewhere.stderr);
    assert!(said.contains("--ca-cert"), "{said}");
    // Given the CA, it gets to the API, which wants a token.
    let ca = data_dir.join("tls").join("ca-cert.pem");
    let untokened = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["--api", &api, "volume", "list"])
        .arg("--ca-cert")
        .arg(&ca)
        .current_dir(&data_dir)
        .env_remove("TESSERA_TOKEN")
        .env_remove("TESSERA_TOKEN_FILE")
        .output()
        .expect("run tessera");
    assert_eq!(untokened.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&untokened.stderr).contains("needs a token"));

    // TLS 1.3 with a certificate the cluster CA signed, as openssl sees it.
    let handshake = Command::new("timeout")
        .args(["-k", "5", "30", "openssl", "s_client", "-brief", "-connect"])
        .arg(format!("{bind}:{api_port}"))
        .arg("-CAfile")
        .arg(&ca)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl");
    let seen = String::from_utf8_lossy(&handshake.stderr).to_string()
        + &String::from_utf8_lossy(&handshake.stdout);
    assert!(seen.contains("Protocol version: TLSv1.3"), "{seen}");
    assert!(seen.contains("Verification: OK"), "{seen}");
    // A client that speaks plain HTTP is told to use HTTPS.
    let mut plain = std::net::TcpStream::connect((bind, api_port)).expect("connect");
    use std::io::Write;
    plain
        .write_all(b"GET /v1/status HTTP/1.1\r\nHost: tessera\r\n\r\n")
        .expect("send");
    let mut answer = String::new();
    let _ = plain.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("served over HTTPS"), "{answer}");

    // A volume over NBD with TLS, as the banner says, and over iSCSI with
    // CHAP; the CHAP secret is in no API answer, no file of the data
    // directory (the directory keeps it sealed) and no log line.
    let tool = |name: &str| {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found || std::env::var("TESSERA_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "{name} is required (TESSERA_REQUIRE_TOOLS=1)"
        );
        found
    };
    let secret = format!("chap-{}-secret", std::process::id());
    let admin = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["--api", &api])
            .args(args)
            .current_dir(work.path())
            .env("TESSERA_CHAP_SECRET", &secret)
            .env_remove("TESSERA_TOKEN")
            .env_remove("TESSERA_TOKEN_FILE")
            .output()
            .expect("run tessera");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    admin(&["volume", "create", "vm1", "--size", "16M"]);
    if tool("nbdinfo") {
        let uri = format!(
            "nbds://{bind}:{nbd_port}/vm1?tls-certificates={}",
            data_dir.join("tls").join("client").display()
        );
        let out = Command::new("timeout")
            .args(["-k", "5", "60", "nbdinfo", "--size", &uri])
            .output()
            .expect("run nbdinfo");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            (16u64 << 20).to_string(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let shown = admin(&["volume", "access", "vm1", "--chap-user", "alice"]);
    assert!(shown.contains("CHAP as alice"), "{shown}");
    assert!(!shown.contains(&secret));
    let shown = admin(&["volume", "access", "vm1", "--json"]);
    assert!(!shown.contains(&secret), "{shown}");
    if tool("iscsi-inq") {
        let url =
            |auth: &str| format!("iscsi://{auth}@{bind}:{iscsi_port}/iqn.2026-11.io.tessera:vm1/0");
        let inquiry = |auth: &str| {
            Command::new("timeout")
                .args(["-k", "5", "60", "iscsi-inq", "-i", "iqn.2026-11.test:up"])
                .arg(url(auth))
                .output()
                .expect("run iscsi-inq")
                .status
                .success()
        };
        assert!(
            inquiry(&format!("alice%{secret}")),
            "the right secret was refused"
        );
        assert!(!inquiry("alice%wrong-secret-000"), "a wrong secret got in");
    }
    let mut holding = Vec::new();
    let mut pending = vec![data_dir.clone()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read the data directory") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                if bytes.windows(secret.len()).any(|w| w == secret.as_bytes()) {
                    holding.push(path);
                }
            }
        }
    }
    assert!(
        holding.is_empty(),
        "the CHAP secret is in plain text in {holding:?}"
    );

    let pid = up.0.id().to_string();
    let signalled = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("run kill");
    assert!(signalled.success(), "kill -INT {pid}: {signalled}");
    let deadline = Instant::now() + STOP_TIMEOUT;
    let status = loop {
        if let Some(status) = up.0.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "tessera up did not stop within {STOP_TIMEOUT:?} of SIGINT"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    stdout_reader.join().expect("stdout reader");
    let after: Vec<String> = lines.try_iter().collect();
    let logs = stderr_reader.join().expect("stderr reader");
    assert_eq!(
        status.code(),
        Some(0),
        "exit after SIGINT: {status}\n{logs}"
    );

    assert!(
        after.is_empty(),
        "stdout carries only the banner, but then: {after:#?}"
    );
    assert!(
        !text.contains(" INFO ") && !text.contains("tessera_"),
        "a log line on stdout:\n{text}"
    );
    assert!(!logs.contains(&secret), "the CHAP secret is in the log");
    for (stream, content) in [("stdout", &text), ("stderr", &logs)] {
        assert!(
            !content.contains("\x1b["),
            "a terminal colour code on {stream}, which is a pipe:\n{content}"
        );
    }
    for expected in [
        "INFO tessera_node::api: REST API listening",
        "Ctrl-C: shutting down",
        "host stopped host=host-3 clean=true",
    ] {
        assert!(
            logs.contains(expected),
            "stderr lacks {expected:?}:\n{logs}"
        );
    }
    assert!(
        !logs.contains(BANNER_END),
        "the banner is on stderr too:\n{logs}"
    );
}
