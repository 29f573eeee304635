//! Developer tasks: `cargo xtask ci` (what CI runs), `cargo xtask layers`
//! (the dependency-layer check), `cargo xtask tidy` (style checks that
//! rustfmt and clippy do not make) and `cargo xtask fresh-machine` (the
//! README's first command, built and started as on a machine without
//! `protoc`).
//!
//! The layer table below is the executable form of the crate map in
//! `docs/ARCHITECTURE.md`: a crate may depend only on crates of a lower layer,
//! and the pure crates may not pull in an async runtime, the file system or a
//! clock. Change both together.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Layer of every workspace crate. `None` marks side crates (test fixtures,
/// simulator, tasks) that nothing may depend on except as a dev-dependency.
const LAYERS: &[(&str, Option<u8>)] = &[
    ("tessera-types", Some(1)),
    ("tessera-cache", Some(1)),
    ("tessera-format", Some(2)),
    ("tessera-wire", Some(2)),
    ("tessera-placement", Some(2)),
    ("tessera-control", Some(2)),
    ("tessera-erasure", Some(2)),
    ("tessera-blockdev", Some(2)),
    ("tessera-env", Some(2)),
    ("tessera-tls", Some(2)),
    ("tessera-store", Some(3)),
    ("tessera-object", Some(3)),
    ("tessera-directory", Some(3)),
    ("tessera-nbd", Some(3)),
    ("tessera-iscsi", Some(3)),
    ("tessera-transport", Some(3)),
    ("tessera-replica", Some(4)),
    ("tessera-node", Some(5)),
    ("tessera", Some(6)),
    ("tessera-testkit", None),
    ("tessera-sim", None),
    ("xtask", None),
    ("vendored-protoc", None),
];

/// Crates that hold pure logic: no runtime, no file system, no clock, so they
/// can be tested exhaustively and run inside a simulator.
const PURE: &[&str] = &[
    "tessera-types",
    "tessera-cache",
    "tessera-format",
    "tessera-wire",
    "tessera-placement",
    "tessera-control",
    "tessera-erasure",
    "tessera-blockdev",
];

/// Dependencies a pure crate may not have.
const IMPURE_DEPS: &[&str] = &[
    "tokio",
    "async-std",
    "mio",
    "redb",
    "etcd-client",
    "reqwest",
    "axum",
];

/// Source text a pure crate may not contain (outside tests it would make the
/// crate reach the outside world).
const IMPURE_CALLS: &[&str] = &[
    "std::fs",
    "Instant::now",
    "SystemTime::now",
    "thread_rng",
    "std::net",
    "tokio::",
];

fn main() -> Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    match task.as_str() {
        "ci" => ci(),
        "layers" => layers(),
        "tidy" => tidy(),
        "fresh-machine" => fresh_machine(),
        "sim" => sim(&std::env::args().skip(2).collect::<Vec<_>>()),
        _ => {
            eprintln!("usage: cargo xtask <ci|layers|tidy|fresh-machine|sim>");
            eprintln!("  ci             fmt check, layers, tidy, clippy -D warnings, fresh-machine, all tests");
            eprintln!("  layers         check that every crate depends only on lower layers");
            eprintln!("  tidy           module docs present, no dbg!/todo! in libraries");
            eprintln!(
                "  fresh-machine  `cargo run --release -p tessera -- up` with no protoc on the"
            );
            eprintln!("                 PATH and PROTOC unset: builds, prints its banner, answers");
            eprintln!("                 `tessera status`, stops cleanly on SIGINT");
            eprintln!("  sim [--seeds N] [--first S]");
            eprintln!("                 the cluster simulator over N seeds from S (default 10000 from 1),");
            eprintln!(
                "                 release build; a breach prints its seed and how to replay it"
            );
            std::process::exit(2);
        }
    }
}

/// `cargo xtask sim [--seeds N] [--first S]`: the simulators' seed tests
/// (the control plane's and the data path's, N seeds each) over more seeds
/// than CI runs.
fn sim(args: &[String]) -> Result<()> {
    let mut seeds = 10_000u64;
    let mut first = 1u64;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let value = |v: Option<&String>| -> Result<u64> {
            v.with_context(|| format!("{arg} needs a number"))?
                .parse()
                .with_context(|| format!("{arg} needs a number"))
        };
        match arg.as_str() {
            "--seeds" => seeds = value(rest.next())?,
            "--first" => first = value(rest.next())?,
            other => bail!("unknown argument {other:?}: use --seeds N and --first S"),
        }
    }
    eprintln!("$ TESSERA_SIM_SEEDS={seeds} TESSERA_SIM_DATA_SEEDS={seeds} TESSERA_SIM_FIRST_SEED={first} cargo test -p tessera-sim --release");
    let status = Command::new("cargo")
        .args([
            "test",
            "-p",
            "tessera-sim",
            "--release",
            "--test",
            "seeds",
            "no_seed_",
            "--",
            "--nocapture",
        ])
        .env("TESSERA_SIM_SEEDS", seeds.to_string())
        .env("TESSERA_SIM_DATA_SEEDS", seeds.to_string())
        .env("TESSERA_SIM_FIRST_SEED", first.to_string())
        .current_dir(workspace_root())
        .status()
        .context("starting cargo")?;
    if !status.success() {
        bail!("the simulator found a breach (its seed is printed above)");
    }
    Ok(())
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    eprintln!("$ {program} {}", args.join(" "));
    let status = Command::new(program)
        .args(args)
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("starting {program}"))?;
    if !status.success() {
        bail!("{program} {} failed with {status}", args.join(" "));
    }
    Ok(())
}

fn ci() -> Result<()> {
    run("cargo", &["fmt", "--all", "--check"])?;
    layers()?;
    tidy()?;
    run(
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    fresh_machine()?;
    run("cargo", &["test", "--workspace", "--no-fail-fast"])?;
    Ok(())
}

/// How long the README's first command may take to build Tessera in
/// release mode and start its hosts (a 2-core machine builds it from
/// nothing in well under this).
const FRESH_BUILD_AND_START_TIMEOUT: Duration = Duration::from_secs(40 * 60);
/// How long `tessera up` may take to stop every host after SIGINT.
const FRESH_STOP_TIMEOUT: Duration = Duration::from_secs(120);
/// The banner's last line: everything before it is on stdout once it is.
const BANNER_END: &str = "Stop with Ctrl-C.";

/// `cargo xtask fresh-machine`: runs the README's first command,
/// `cargo run --release -p tessera -- up` (with a temporary `--data-dir` and
/// free ports), as on a machine that has no `protoc`: PROTOC is unset and
/// no `protoc` is on the PATH ([`path_without_protoc`]), and the etcd client
/// is cleaned first so that its build script compiles the protobuf code
/// again, with the protoc shipped in a crate (`.cargo/config.toml`). Then
/// the banner must come on stdout, `tessera status` must answer, and SIGINT
/// to the process must stop it with exit status 0.
fn fresh_machine() -> Result<()> {
    let started = Instant::now();
    let seed = std::process::id();
    let work = WorkDir(std::env::temp_dir().join(format!("tessera-fresh-machine-{seed}")));
    let _ = std::fs::remove_dir_all(&work.0);
    std::fs::create_dir_all(&work.0).with_context(|| format!("creating {}", work.0.display()))?;
    let path = path_without_protoc(&work.0)?;
    let bare = |program: &str| {
        let mut command = Command::new(program);
        command
            .current_dir(workspace_root())
            .env("PATH", &path)
            .env_remove("PROTOC");
        command
    };
    eprintln!("$ cargo clean --release -p etcd-client");
    let cleaned = bare("cargo")
        .args(["clean", "--release", "-p", "etcd-client"])
        .status()
        .context("starting cargo clean")?;
    if !cleaned.success() {
        bail!("cargo clean --release -p etcd-client failed with {cleaned}");
    }

    // A loopback subnet of its own (host k on .k), so the hosts meet neither
    // a `tessera up` on the default addresses nor other tests.
    let bind = Ipv4Addr::new(127, 200 + (seed % 50) as u8, (seed / 50 % 250) as u8, 1);
    let port = || -> Result<u16> {
        Ok(TcpListener::bind((bind, 0))
            .with_context(|| format!("binding a free port on {bind}"))?
            .local_addr()?
            .port())
    };
    let (api_port, nbd_port, iscsi_port, transport_port) = (port()?, port()?, port()?, port()?);
    let data_dir = work.0.join("data");
    let args: Vec<String> = [
        "run",
        "--release",
        "-p",
        "tessera",
        "--",
        "up",
        "--data-dir",
        &data_dir.to_string_lossy(),
        "--bind",
        &bind.to_string(),
        "--api-port",
        &api_port.to_string(),
        "--nbd-port",
        &nbd_port.to_string(),
        "--iscsi-port",
        &iscsi_port.to_string(),
        "--transport-port",
        &transport_port.to_string(),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    eprintln!("$ cargo {}", args.join(" "));
    // `cargo run` replaces itself with `tessera` once it is built, so the
    // child's PID is the PID `tessera up` runs as.
    let child = bare("cargo")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting cargo run")?;
    let mut up = RunningUp(child);
    let result = check_fresh_up(&mut up, bind, api_port, &data_dir, started);
    drop(up);
    drop(work);
    let total = started.elapsed().as_secs_f64();
    match result {
        Ok(()) => {
            eprintln!("fresh-machine: ok in {total:.0} s");
            Ok(())
        }
        Err(e) => Err(e.context(format!("fresh-machine failed after {total:.0} s"))),
    }
}

/// The PATH of this process with no `protoc` on it. A directory that holds
/// one is replaced by a directory under `work` of links to everything else
/// in it (leaving the directory out would also take the linker and the
/// other tools it holds, as /usr/bin does).
fn path_without_protoc(work: &Path) -> Result<std::ffi::OsString> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = Vec::new();
    for (index, dir) in std::env::split_paths(&path).enumerate() {
        if !dir.join("protoc").exists() {
            dirs.push(dir);
            continue;
        }
        let shadow = work.join(format!("path-{index}"));
        std::fs::create_dir_all(&shadow)?;
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let name = entry?.file_name();
            if name != "protoc" {
                std::os::unix::fs::symlink(dir.join(&name), shadow.join(&name))?;
            }
        }
        eprintln!(
            "fresh-machine: {} holds a protoc: on the PATH as {}, everything but protoc",
            dir.display(),
            shadow.display()
        );
        dirs.push(shadow);
    }
    std::env::join_paths(dirs).context("joining PATH")
}

/// A directory removed with everything in it when dropped.
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `cargo run ... up` process, killed if still running when dropped.
struct RunningUp(Child);

impl Drop for RunningUp {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// What the fresh `tessera up` must do once spawned: the banner on stdout,
/// `tessera status` answering, a clean stop on SIGINT.
fn check_fresh_up(
    up: &mut RunningUp,
    bind: Ipv4Addr,
    api_port: u16,
    data_dir: &Path,
    started: Instant,
) -> Result<()> {
    let (lines, stdout_lines) = mpsc::channel::<String>();
    let stdout = up.0.stdout.take().context("no stdout pipe")?;
    let stderr = up.0.stderr.take().context("no stderr pipe")?;
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    // Cargo's progress and tessera's logs go on to our stderr as they come;
    // the build must have run the etcd client's build script again.
    let (saw, compiled_etcd) = mpsc::channel::<()>();
    let copier = std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !sent && line.contains("Compiling etcd-client") {
                let _ = saw.send(());
                sent = true;
            }
            eprintln!("{line}");
        }
    });

    let deadline = started + FRESH_BUILD_AND_START_TIMEOUT;
    let mut banner = Vec::new();
    loop {
        if let Some(status) = up.0.try_wait()? {
            bail!(
                "tessera up exited ({status}) before its banner; stdout so far:\n{}",
                banner.join("\n")
            );
        }
        if Instant::now() > deadline {
            bail!(
                "no banner on stdout within {} s; stdout so far:\n{}",
                FRESH_BUILD_AND_START_TIMEOUT.as_secs(),
                banner.join("\n")
            );
        }
        match stdout_lines.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                let end = line == BANNER_END;
                banner.push(line);
                if end {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!(
                    "stdout closed before the banner ended:\n{}",
                    banner.join("\n")
                )
            }
        }
    }
    eprintln!(
        "fresh-machine: built and started in {:.0} s; banner on stdout:",
        started.elapsed().as_secs_f64()
    );
    for line in &banner {
        eprintln!("  | {line}");
    }
    if compiled_etcd.try_recv().is_err() {
        bail!("the build did not compile etcd-client again, so it did not show that no protoc is needed");
    }
    let api = format!("https://{bind}:{api_port}");
    if !banner.iter().any(|l| l.contains(&api)) {
        bail!("the banner does not name the API at {api}");
    }

    let target = metadata()?["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .context("cargo metadata has no target_directory")?;
    let tessera = target.join("release").join("tessera");
    eprintln!("$ {} status --api {api}", tessera.display());
    // `tessera up` wrote its admin token in its data directory.
    let status = Command::new(&tessera)
        .args(["status", "--api", &api])
        .env("TESSERA_TOKEN_FILE", data_dir.join("admin.token"))
        .output()
        .with_context(|| format!("running {}", tessera.display()))?;
    let text = String::from_utf8_lossy(&status.stdout);
    if !status.status.success() || !text.starts_with("cluster tessera:") {
        bail!(
            "tessera status failed ({}): {text}{}",
            status.status,
            String::from_utf8_lossy(&status.stderr)
        );
    }
    eprintln!("{}", text.lines().next().unwrap_or_default());

    let pid = up.0.id().to_string();
    eprintln!("$ kill -INT {pid}");
    let signalled = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .context("running kill")?;
    if !signalled.success() {
        bail!("kill -INT {pid} failed with {signalled}");
    }
    let stop_deadline = Instant::now() + FRESH_STOP_TIMEOUT;
    let exit = loop {
        if let Some(status) = up.0.try_wait()? {
            break status;
        }
        if Instant::now() > stop_deadline {
            bail!(
                "tessera up did not stop within {} s of SIGINT",
                FRESH_STOP_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = copier.join();
    if !exit.success() {
        bail!("tessera up exited with {exit} after SIGINT, not 0");
    }
    eprintln!("fresh-machine: stopped cleanly on SIGINT");
    Ok(())
}

fn metadata() -> Result<Value> {
    let out = Command::new("cargo")
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(workspace_root())
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn layers() -> Result<()> {
    let table: BTreeMap<&str, Option<u8>> = LAYERS.iter().copied().collect();
    let meta = metadata()?;
    let mut problems = Vec::new();
    let packages = meta["packages"].as_array().cloned().unwrap_or_default();
    for package in &packages {
        let name = package["name"].as_str().unwrap_or_default();
        let Some(&layer) = table.get(name) else {
            problems.push(format!(
                "{name}: not in the layer table of xtask (add it there and to docs/ARCHITECTURE.md)"
            ));
            continue;
        };
        for dep in package["dependencies"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let dep_name = dep["name"].as_str().unwrap_or_default();
            let is_dev = dep["kind"].as_str() == Some("dev");
            if is_dev {
                continue;
            }
            if PURE.contains(&name) && IMPURE_DEPS.contains(&dep_name) {
                problems.push(format!("{name} is pure logic but depends on {dep_name}"));
            }
            let Some(&dep_layer) = table.get(dep_name) else {
                continue;
            };
            match (layer, dep_layer) {
                (_, None) => problems.push(format!(
                    "{name} depends on side crate {dep_name} (allowed only as a dev-dependency)"
                )),
                (Some(l), Some(d)) if d >= l => problems.push(format!(
                    "{name} (layer {l}) depends on {dep_name} (layer {d}): dependencies must point down"
                )),
                _ => {}
            }
        }
        if PURE.contains(&name) {
            let manifest = PathBuf::from(package["manifest_path"].as_str().unwrap_or_default());
            if let Some(dir) = manifest.parent() {
                for file in rust_files(&dir.join("src"))? {
                    let text = std::fs::read_to_string(&file)?;
                    let body = text.split("#[cfg(test)]").next().unwrap_or_default();
                    for call in IMPURE_CALLS {
                        if body.contains(call) {
                            problems
                                .push(format!("{}: pure crate {name} uses {call}", file.display()));
                        }
                    }
                }
            }
        }
    }
    report("layers", &problems)
}

fn tidy() -> Result<()> {
    let mut problems = Vec::new();
    let root = workspace_root();
    for top in ["crates", "xtask"] {
        for file in rust_files(&root.join(top))? {
            let text = std::fs::read_to_string(&file)?;
            let first = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or_default();
            let is_module_root = !file.to_string_lossy().contains("/tests/")
                && !file.to_string_lossy().contains("/benches/");
            if is_module_root && !first.starts_with("//!") {
                problems.push(format!(
                    "{}: must begin with a //! comment saying what it owns and its invariants",
                    file.display()
                ));
            }
            // Spelled in pieces so that this file does not flag itself.
            let leftovers = [concat!("dbg", "!("), concat!("todo", "!(")];
            for (number, line) in text.lines().enumerate() {
                if leftovers.iter().any(|l| line.contains(l)) {
                    problems.push(format!(
                        "{}:{}: leftover {}",
                        file.display(),
                        number + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    report("tidy", &problems)
}

fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    if !dir.exists() {
        return Ok(out);
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n == "target") {
                    continue;
                }
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn report(check: &str, problems: &[String]) -> Result<()> {
    if problems.is_empty() {
        eprintln!("{check}: ok");
        return Ok(());
    }
    for p in problems {
        eprintln!("{check}: {p}");
    }
    bail!("{check}: {} problem(s)", problems.len())
}
