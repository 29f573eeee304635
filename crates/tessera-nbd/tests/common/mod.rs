//! Shared fixtures for the NBD server tests: an in-process server on a
//! loopback port, devices with injected faults, and running real clients as
//! bounded subprocesses.
#![allow(dead_code)]

use async_trait::async_trait;
use bytes::Bytes;
use std::any::Any;
use std::net::SocketAddr;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tessera_blockdev::{
    BlockDevice, BlockError, DeviceInfo, Extent, MemoryDevice, SpaceUsage, WriteFlags, ZeroMode,
};
use tessera_nbd::{serve, ExportCatalog, NbdTls};
use tokio::net::TcpListener;

/// A server running on its own runtime thread; stopped and joined on drop.
pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    pub fn start(catalog: Arc<dyn ExportCatalog>) -> TestServer {
        Self::start_with_tls(catalog, None)
    }

    /// A server offering (or requiring) TLS as `tls` says.
    pub fn start_with_tls(catalog: Arc<dyn ExportCatalog>, tls: Option<NbdTls>) -> TestServer {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
                addr_tx
                    .send(listener.local_addr().expect("address"))
                    .expect("report address");
                serve(listener, catalog, tls, async move {
                    let _ = stop_rx.await;
                })
                .await
                .expect("serve");
            });
        });
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("server did not start");
        TestServer {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd://{}/{}", self.addr, export)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Whether `program` can be run. Missing tools fail the test when
/// `TESSERA_REQUIRE_TOOLS=1`, and skip it (with a message) otherwise.
pub fn have_tool(program: &str, probe: &[&str]) -> bool {
    let found = Command::new(program)
        .args(probe)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !found {
        if std::env::var("TESSERA_REQUIRE_TOOLS").as_deref() == Ok("1") {
            panic!("{program} is required (TESSERA_REQUIRE_TOOLS=1) but cannot be run");
        }
        eprintln!("skipping: {program} is not installed");
    }
    found
}

/// Runs a command under `timeout`, so a hung client cannot hang the test.
pub fn run_bounded(seconds: u64, program: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.arg("-k").arg("5").arg(seconds.to_string()).arg(program);
    cmd.args(args);
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot start {program}: {e}"))
}

/// Runs a command under `timeout` and fails the test unless it succeeds.
pub fn run_ok(seconds: u64, program: &str, args: &[&str]) -> String {
    let out = run_bounded(seconds, program, args);
    assert!(
        out.status.success(),
        "{program} {args:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A memory device with injected faults: reads touching `bad_offset` fail
/// with a checksum error (as a volume whose every copy is corrupt), writes
/// that would allocate beyond `space_limit` bytes fail with `NoSpace` (as a
/// full datastore), and reads starting at `slow_read.0` wait `slow_read.1`.
pub struct FaultyDevice {
    pub inner: MemoryDevice,
    pub bad_offset: Option<u64>,
    pub space_limit: Option<u64>,
    pub slow_read: Option<(u64, Duration)>,
    pub reads: AtomicU64,
}

impl FaultyDevice {
    pub fn new(name: &str, size: u64) -> Self {
        FaultyDevice {
            inner: MemoryDevice::new(name, size),
            bad_offset: None,
            space_limit: None,
            slow_read: None,
            reads: AtomicU64::new(0),
        }
    }
}

#[async_trait]
impl BlockDevice for FaultyDevice {
    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }

    async fn read(&self, offset: u64, len: u64) -> Result<Bytes, BlockError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        if let Some((slow, delay)) = self.slow_read {
            if slow == offset {
                tokio::time::sleep(delay).await;
            }
        }
        if let Some(bad) = self.bad_offset {
            if bad >= offset && bad < offset + len {
                return Err(BlockError::Checksum { offset: bad });
            }
        }
        self.inner.read(offset, len).await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<(), BlockError> {
        if let Some(limit) = self.space_limit {
            if self.inner.space().allocated_bytes + data.len() as u64 > limit {
                return Err(BlockError::NoSpace {
                    offset,
                    len: data.len() as u64,
                });
            }
        }
        self.inner.write(offset, data, flags).await
    }

    async fn flush(&self) -> Result<(), BlockError> {
        self.inner.flush().await
    }

    async fn unmap(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        self.inner.unmap(offset, len).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<(), BlockError> {
        self.inner.write_zeroes(offset, len, mode).await
    }

    async fn compare_and_write(
        &self,
        offset: u64,
        expected: Bytes,
        new: Bytes,
    ) -> Result<(), BlockError> {
        self.inner.compare_and_write(offset, expected, new).await
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, BlockError> {
        self.inner.block_status(offset, len).await
    }

    fn space(&self) -> SpaceUsage {
        self.inner.space()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Random bytes from a seeded generator (reproducible test data).
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = vec![0u8; len];
    rng.fill_bytes(&mut out);
    out
}
