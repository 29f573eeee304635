//! The protobuf compiler for the build: `.cargo/config.toml` points `PROTOC`
//! at `scripts/protoc`, which runs this program, which runs the `protoc`
//! binary that the protoc-bin-vendored crate ships for this platform with the
//! arguments it was given. The etcd client's build script needs `protoc`; with
//! this, a fresh machine with only the Rust toolchain builds Tessera.
//!
//! Invariant: arguments, standard streams and the exit status pass through
//! unchanged, so prost-build sees exactly what a real `protoc` would give it.

use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let protoc = match protoc_bin_vendored::protoc_bin_path() {
        Ok(path) => path,
        Err(e) => {
            eprintln!("vendored-protoc: no protoc is shipped for this platform: {e}; install protoc and set PROTOC to its path");
            return ExitCode::from(2);
        }
    };
    match Command::new(&protoc)
        .args(std::env::args_os().skip(1))
        .status()
    {
        Ok(status) => match status.code() {
            Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            None => ExitCode::FAILURE,
        },
        Err(e) => {
            eprintln!("vendored-protoc: cannot run {}: {e}", protoc.display());
            ExitCode::from(2)
        }
    }
}
