//! PostgreSQL for the database tests: its server binaries, a server on a
//! data directory (stopped when dropped), and running its tools as the
//! `postgres` user.
#![allow(dead_code)]

use super::mount::run_ok;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The directory of PostgreSQL's server binaries, if installed.
pub fn postgres_bin() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists() && bin.join("pg_amcheck").exists())
        .collect();
    found.sort();
    found.pop()
}

/// Runs `program args` as the `postgres` user; fails the test unless it
/// succeeded.
pub fn as_postgres(program: &Path, args: &[&str]) -> String {
    let out = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("runuser starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{} {args:?}: {text}",
        program.display()
    );
    text
}

/// A PostgreSQL server on a data directory, stopped when dropped.
pub struct Server {
    bin: PathBuf,
    data: String,
    socket: String,
    port: String,
}

impl Server {
    pub fn start(bin: &Path, data: &Path, socket: &Path, port: u16, log: &Path) -> Server {
        let server = Server {
            bin: bin.to_path_buf(),
            data: data.to_string_lossy().into_owned(),
            socket: socket.to_string_lossy().into_owned(),
            port: port.to_string(),
        };
        let options = format!("-p {port} -k {} -c listen_addresses=''", server.socket);
        let started = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin.join("pg_ctl"))
            .args([
                "-D",
                &server.data,
                "-o",
                &options,
                "-l",
                &log.to_string_lossy(),
                "-w",
                "-t",
                "120",
                "start",
            ])
            .stdin(Stdio::null())
            .output()
            .expect("runuser starts");
        assert!(
            started.status.success(),
            "PostgreSQL did not start on {}: {}{}\nits log:\n{}",
            server.data,
            String::from_utf8_lossy(&started.stdout),
            String::from_utf8_lossy(&started.stderr),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        server
    }

    /// Connection arguments for the client tools.
    pub fn connect(&self) -> [&str; 6] {
        ["-h", &self.socket, "-p", &self.port, "-U", "postgres"]
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .args(["-D", &self.data, "-m", "fast", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A directory the `postgres` user owns.
pub fn postgres_dir(path: &Path) {
    std::fs::create_dir_all(path).unwrap();
    run_ok(
        30,
        "chown",
        &["-R", "postgres:postgres", &path.to_string_lossy()],
    );
}

/// Starts PostgreSQL on `pgdata`, a copy of a running database's data
/// directory taken as a crash would leave it (its lock file, whose process
/// is alive on this machine, goes first), so it recovers from its WAL; then
/// `pg_amcheck` must find nothing wrong and pgbench's account table must
/// hold `rows` rows. Returns the server, still running.
pub fn recover_and_check(
    bin: &Path,
    pgdata: &Path,
    socket: &Path,
    log: &Path,
    rows: u64,
) -> Server {
    std::fs::remove_file(pgdata.join("postmaster.pid")).unwrap();
    postgres_dir(socket);
    let recovered = Server::start(bin, pgdata, socket, super::free_port(), log);
    let mut check = recovered.connect().to_vec();
    check.extend(["--install-missing", "--heapallindexed", "-d", "postgres"]);
    as_postgres(&bin.join("pg_amcheck"), &check);
    let mut count = recovered.connect().to_vec();
    count.extend([
        "-d",
        "postgres",
        "-Atc",
        "select count(*) from pgbench_accounts",
    ]);
    let counted = as_postgres(&bin.join("psql"), &count);
    assert_eq!(counted.trim(), rows.to_string(), "account rows in the copy");
    recovered
}

/// What a database test needs before it starts: PostgreSQL's server
/// binaries (their directory), a machine that can mount, `runuser`, and a
/// working directory the `postgres` user reaches. None, after saying why,
/// when something is missing (a failure instead with
/// TESSERA_REQUIRE_TOOLS=1).
pub fn database_test_setup() -> Option<(PathBuf, tempfile::TempDir)> {
    let Some(bin) = postgres_bin() else {
        assert!(
            std::env::var("TESSERA_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "PostgreSQL's server binaries are required (TESSERA_REQUIRE_TOOLS=1)"
        );
        eprintln!("skipping: PostgreSQL is not installed");
        return None;
    };
    if !super::mount::can_mount() || !super::have("runuser") {
        return None;
    }
    let work = tempfile::tempdir().unwrap();
    // The server runs as `postgres`: it must reach its directories.
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    Some((bin, work))
}
