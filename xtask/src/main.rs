//! Developer tasks: `cargo xtask ci` (what CI runs), `cargo xtask layers`
//! (the dependency-layer check) and `cargo xtask tidy` (style checks that
//! rustfmt and clippy do not make).
//!
//! The layer table below is the executable form of the crate map in
//! `docs/ARCHITECTURE.md`: a crate may depend only on crates of a lower layer,
//! and the pure crates may not pull in an async runtime, the file system or a
//! clock. Change both together.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Layer of every workspace crate. `None` marks side crates (test fixtures,
/// simulator, tasks) that nothing may depend on except as a dev-dependency.
const LAYERS: &[(&str, Option<u8>)] = &[
    ("tessera-types", Some(1)),
    ("tessera-format", Some(2)),
    ("tessera-wire", Some(2)),
    ("tessera-placement", Some(2)),
    ("tessera-erasure", Some(2)),
    ("tessera-blockdev", Some(2)),
    ("tessera-env", Some(2)),
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
    "tessera-format",
    "tessera-wire",
    "tessera-placement",
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
        _ => {
            eprintln!("usage: cargo xtask <ci|layers|tidy>");
            eprintln!("  ci      fmt check, clippy -D warnings, layers, tidy, all tests");
            eprintln!("  layers  check that every crate depends only on lower layers");
            eprintln!("  tidy    module docs present, no dbg!/todo! in libraries");
            std::process::exit(2);
        }
    }
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
    run("cargo", &["test", "--workspace", "--no-fail-fast"])?;
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
