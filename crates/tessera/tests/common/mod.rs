//! Helpers the tests that run real processes share.

pub mod mount;
pub mod postgres;
pub mod up;

use std::process::{Command, Stdio};

/// Whether `tool` is on the PATH; without it the test skips with a message,
/// unless TESSERA_REQUIRE_TOOLS=1, when it fails.
pub fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var("TESSERA_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "{tool} is required (TESSERA_REQUIRE_TOOLS=1) but not installed"
        );
        eprintln!("skipping: {tool} is not installed");
    }
    found
}

/// A loopback TCP port free at the time of asking.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
