//! Shared fixtures for the iSCSI transport tests: an in-process server on a
//! loopback port, a small SCSI target for the transport's own tests, a raw
//! initiator that speaks PDUs, and bounded subprocesses for real clients.
#![allow(dead_code)]

use async_trait::async_trait;
use bytes::Bytes;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tessera_blockdev::{BlockDevice, MemoryDevice, WriteFlags};
use tessera_iscsi::pdu::{self, Digests, LoginRequest, Pdu, BHS_BYTES};
use tessera_iscsi::scsi::{self, Nexus, Reset, ScsiTarget, Status};
use tessera_iscsi::text;
use tessera_iscsi::{
    serve, ChapCredentials, StaticCatalog, TargetCatalog, TargetEntry, TargetPortal,
};
use tokio::net::TcpListener;

pub const BLOCK: usize = 512;

/// A server running on its own runtime thread; stopped and joined on drop.
pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    pub fn start(catalog: Arc<dyn TargetCatalog>) -> TestServer {
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
                serve(listener, catalog, async move {
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

    pub fn url(&self, target: &str) -> String {
        format!("iscsi://{}/{}/0", self.addr, target)
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

/// A minimal block target for the transport tests: TEST UNIT READY,
/// INQUIRY, READ CAPACITY(10), READ(10) and WRITE(10) over a memory
/// device. Reads of LBA 1000 wait a second (for ABORT TASK tests).
pub struct SmallTarget {
    pub device: MemoryDevice,
    pub resets: AtomicU32,
    pub ended: AtomicU32,
}

impl SmallTarget {
    pub fn new(bytes: u64) -> Arc<SmallTarget> {
        Arc::new(SmallTarget {
            device: MemoryDevice::new("small", bytes),
            resets: AtomicU32::new(0),
            ended: AtomicU32::new(0),
        })
    }
}

fn check(key: u8, asc: u8) -> scsi::Response {
    let mut sense = vec![0u8; 18];
    sense[0] = 0x70;
    sense[2] = key;
    sense[7] = 10;
    sense[12] = asc;
    scsi::Response {
        status: Status::CheckCondition,
        sense: Some(Bytes::from(sense)),
        data_in: Bytes::new(),
        data_out_used: 0,
    }
}

fn good(data_in: Vec<u8>, limit: u32, data_out_used: u32) -> scsi::Response {
    let mut data_in = data_in;
    data_in.truncate(limit as usize);
    scsi::Response {
        status: Status::Good,
        sense: None,
        data_in: Bytes::from(data_in),
        data_out_used,
    }
}

#[async_trait]
impl ScsiTarget for SmallTarget {
    async fn execute(&self, c: scsi::Command) -> scsi::Response {
        if c.lun != 0 {
            return check(0x05, 0x25);
        }
        let cdb = &c.cdb;
        match cdb[0] {
            0x00 => good(Vec::new(), 0, 0),
            0x12 => {
                let alloc = u16::from_be_bytes([cdb[3], cdb[4]]) as u32;
                let mut inq = vec![0u8; 36];
                inq[2] = 6;
                inq[3] = 2;
                inq[4] = 31;
                inq[8..16].copy_from_slice(b"TESSERA ");
                inq[16..32].copy_from_slice(b"SMALL TEST UNIT ");
                good(inq, alloc.min(c.expected_data_in), 0)
            }
            0x25 => {
                let blocks = self.device.info().size_bytes / BLOCK as u64;
                let mut d = ((blocks - 1) as u32).to_be_bytes().to_vec();
                d.extend_from_slice(&(BLOCK as u32).to_be_bytes());
                good(d, c.expected_data_in, 0)
            }
            0x28 | 0x2a => {
                let lba = u32::from_be_bytes([cdb[2], cdb[3], cdb[4], cdb[5]]) as u64;
                let len = u16::from_be_bytes([cdb[7], cdb[8]]) as u64 * BLOCK as u64;
                let offset = lba * BLOCK as u64;
                if offset + len > self.device.info().size_bytes {
                    return check(0x05, 0x21);
                }
                if cdb[0] == 0x28 {
                    if lba == 1000 {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    match self.device.read(offset, len).await {
                        Ok(d) => good(d.to_vec(), c.expected_data_in, 0),
                        Err(_) => check(0x03, 0x11),
                    }
                } else {
                    // Writes what arrived, up to what the CDB asks for;
                    // reports the CDB's length so the transport sees
                    // overflow and underflow.
                    let have = (c.data_out.len() as u64).min(len) / BLOCK as u64 * BLOCK as u64;
                    if have > 0 {
                        let data = c.data_out.slice(..have as usize);
                        if self
                            .device
                            .write(offset, data, WriteFlags::default())
                            .await
                            .is_err()
                        {
                            return check(0x03, 0x0c);
                        }
                    }
                    good(Vec::new(), 0, len as u32)
                }
            }
            _ => check(0x05, 0x20),
        }
    }

    async fn reset(&self, _nexus: &Nexus, _reset: Reset) {
        self.resets.fetch_add(1, Ordering::Relaxed);
    }

    async fn nexus_ended(&self, _nexus: &Nexus) {
        self.ended.fetch_add(1, Ordering::Relaxed);
    }
}

pub fn entry(name: &str, device: Arc<dyn ScsiTarget>, port: u16) -> TargetEntry {
    TargetEntry {
        name: name.into(),
        alias: Some(format!("alias of {name}")),
        device,
        portals: vec![
            TargetPortal {
                address: "127.0.0.1:3260".into(),
                portal_group_tag: 1,
            },
            TargetPortal {
                address: "127.0.0.2:3260".into(),
                portal_group_tag: 2,
            },
        ],
        portal_group_tag: port,
        relative_port: port,
        initiators: tessera_iscsi::Initiators::Any,
        chap: ChapCredentials::default(),
        session_hold: None,
    }
}

pub fn single_target(name: &str, target: Arc<dyn ScsiTarget>) -> Arc<StaticCatalog> {
    let catalog = Arc::new(StaticCatalog::new());
    catalog.insert(entry(name, target, 1));
    catalog
}

/// An initiator speaking raw PDUs over a blocking socket.
pub struct RawInitiator {
    pub stream: TcpStream,
    pub digests: Digests,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub itt: u32,
    pub isid: [u8; 6],
}

impl RawInitiator {
    pub fn connect(addr: SocketAddr) -> RawInitiator {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        RawInitiator {
            stream,
            digests: Digests::default(),
            cmd_sn: 1,
            exp_stat_sn: 0,
            itt: 0x100,
            isid: [0x80, 0x12, 0x34, 0x56, 0x78, 0x9a],
        }
    }

    pub fn next_itt(&mut self) -> u32 {
        self.itt += 1;
        self.itt
    }

    pub fn send(&mut self, pdu: &Pdu) {
        self.send_raw(&pdu.to_bytes(self.digests));
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    /// The next PDU, or `None` when the connection closed or nothing came
    /// within the read timeout.
    pub fn recv(&mut self) -> Option<Pdu> {
        let mut head = vec![0u8; BHS_BYTES];
        self.stream.read_exact(&mut head).ok()?;
        let header: [u8; BHS_BYTES] = head.clone().try_into().ok()?;
        let layout = pdu::Frame::layout(&header, self.digests);
        let mut rest = vec![0u8; layout.total_bytes - BHS_BYTES];
        self.stream.read_exact(&mut rest).ok()?;
        head.extend_from_slice(&rest);
        let (pdu, _) = Pdu::parse(&head, self.digests, pdu::MAX_DATA_SEGMENT_BYTES)
            .expect("target PDU decodes")
            .expect("whole PDU");
        if let Some(sn) = stat_sn(&pdu) {
            self.exp_stat_sn = sn.wrapping_add(1);
        }
        Some(pdu)
    }

    /// Whether the target closed the connection (reads end) within the
    /// read timeout.
    pub fn closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        loop {
            match self.stream.read(&mut byte) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    /// Sends one login request with these keys.
    pub fn login_request(
        &mut self,
        csg: u8,
        nsg: u8,
        transit: bool,
        keys: &[(&str, &str)],
    ) -> pdu::LoginResponse {
        let pairs: Vec<(String, String)> = keys
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let req = Pdu::LoginRequest(LoginRequest {
            transit,
            continue_text: false,
            current_stage: csg,
            next_stage: nsg,
            version_max: 0,
            version_min: 0,
            isid: self.isid,
            tsih: 0,
            itt: 1,
            cid: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            data: Bytes::from(text::encode(&pairs)),
        });
        self.send(&req);
        match self.recv() {
            Some(Pdu::LoginResponse(r)) => r,
            other => panic!("expected a login response, got {other:?}"),
        }
    }

    /// Logs in straight to the full-feature phase with `keys` (plus the
    /// names) in the operational stage.
    pub fn login(&mut self, target: &str, keys: &[(&str, &str)]) -> pdu::LoginResponse {
        let mut all = vec![
            ("InitiatorName", "iqn.2026-11.test:raw"),
            ("SessionType", "Normal"),
            ("TargetName", target),
        ];
        all.extend_from_slice(keys);
        let r = self.login_request(1, 3, true, &all);
        assert_eq!(
            (r.status_class, r.status_detail),
            (0, 0),
            "login refused: {r:?}"
        );
        assert!(r.transit);
        assert_ne!(r.tsih, 0);
        r
    }

    pub fn command(
        &mut self,
        cdb: &[u8],
        read: bool,
        write: bool,
        expected_length: u32,
        data: Bytes,
        final_pdu: bool,
    ) -> u32 {
        let itt = self.next_itt();
        let mut full = cdb.to_vec();
        full.resize(16.max(cdb.len()), 0);
        let cmd = Pdu::ScsiCommand(pdu::ScsiCommand {
            immediate: false,
            final_pdu,
            read,
            write,
            attribute: 1,
            lun: pdu::lun_field(0),
            itt,
            expected_length,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb: Bytes::from(full),
            bidi_read_length: None,
            data,
        });
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        self.send(&cmd);
        itt
    }

    pub fn nop(&mut self, data: &[u8]) -> u32 {
        let itt = self.next_itt();
        let nop = Pdu::NopOut(pdu::NopOut {
            immediate: true,
            lun: [0; 8],
            itt,
            ttt: pdu::RESERVED_TAG,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            data: Bytes::copy_from_slice(data),
        });
        self.send(&nop);
        itt
    }
}

fn stat_sn(pdu: &Pdu) -> Option<u32> {
    match pdu {
        Pdu::ScsiResponse(p) => Some(p.stat_sn),
        Pdu::NopIn(p) if p.itt != pdu::RESERVED_TAG => Some(p.stat_sn),
        Pdu::TaskMgmtResponse(p) => Some(p.stat_sn),
        Pdu::LoginResponse(p) => Some(p.stat_sn),
        Pdu::TextResponse(p) => Some(p.stat_sn),
        Pdu::LogoutResponse(p) => Some(p.stat_sn),
        Pdu::Reject(p) => Some(p.stat_sn),
        Pdu::DataIn(p) if p.status.is_some() => Some(p.stat_sn),
        _ => None,
    }
}

pub fn read10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut cdb = vec![0x28, 0];
    cdb.extend_from_slice(&lba.to_be_bytes());
    cdb.push(0);
    cdb.extend_from_slice(&blocks.to_be_bytes());
    cdb.push(0);
    cdb
}

pub fn write10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut cdb = read10(lba, blocks);
    cdb[0] = 0x2a;
    cdb
}

/// Whether `program` can be run. Missing tools fail the test when
/// `TESSERA_REQUIRE_TOOLS=1`, and skip it (with a message) otherwise.
pub fn have_tool(program: &str, probe: &[&str]) -> bool {
    let found = Command::new(program)
        .args(probe)
        .output()
        .map(|o| o.status.code().is_some())
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

/// Random bytes from a seeded generator (reproducible test data).
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = vec![0u8; len];
    rng.fill_bytes(&mut out);
    out
}
