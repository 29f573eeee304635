//! The transport over real sockets on 127.0.0.1: every request round trips,
//! answers are matched out of order, versions are negotiated, the fault
//! hooks shape traffic as a network would, and the guest queue never waits
//! behind resync traffic.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use tessera_env::SeededRng;
use tessera_transport::{
    FaultHooks, PartitionBehaviour, QueueClass, Request, RequestHandler, Response, Transport,
    TransportConfig, TransportError, VersionRange, WireErrorKind, MAX_IN_FLIGHT_PER_CONNECTION,
};
use tessera_types::{ComponentId, Epoch, HostId, Lba, VolumeId, BLOCK_BYTES};
use tessera_wire::{ComponentRef, Extent, ExtentKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Reads at this block are answered after [`SLOW_ANSWER`].
const SLOW_LBA: u64 = 999;
const SLOW_ANSWER: Duration = Duration::from_millis(1000);
/// Reads of this volume stand for bulk resync reads and take this long.
const RESYNC_VOLUME: &str = "resync-source";
const RESYNC_READ: Duration = Duration::from_millis(1000);
/// Writes to this volume are answered only once [`GATED_WRITES`] of them
/// arrived, all at the same moment.
const GATED_VOLUME: &str = "gated";
const GATED_WRITES: usize = 32;

fn host(name: &str) -> HostId {
    HostId::new(name).unwrap()
}

fn volume(name: &str) -> VolumeId {
    VolumeId::new(name).unwrap()
}

fn component(id: u64) -> ComponentRef {
    ComponentRef {
        volume: volume("vol-1"),
        id: ComponentId(id),
    }
}

fn pattern(seed: u64, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8)
            .collect::<Vec<u8>>(),
    )
}

/// The answer the test replica gives: derived from the request alone, so a
/// test can tell whether the answer it got belongs to the request it sent.
fn answer(request: &Request) -> Response {
    match request {
        Request::Read { lba, blocks, .. } => {
            Response::Data(pattern(lba.0, *blocks as usize * BLOCK_BYTES as usize))
        }
        Request::VolumeRead { offset, len, .. } => Response::Data(pattern(*offset, *len as usize)),
        Request::Allocated { from, blocks, .. } => {
            Response::Ranges(vec![(*from, *blocks / 2), (Lba(from.0 + blocks - 1), 1)])
        }
        Request::ComponentStatus { component } => Response::Status {
            size_bytes: component.id.0 << 20,
            epoch: Epoch(component.id.0 + 1),
            allocated_bytes: 4096,
            physical_bytes: 8192,
        },
        Request::VolumeBlockStatus { offset, len, .. } => Response::Extents(vec![
            Extent {
                offset: *offset,
                len: len / 2,
                kind: ExtentKind::Data,
            },
            Extent {
                offset: offset + len / 2,
                len: len - len / 2,
                kind: ExtentKind::Hole,
            },
        ]),
        Request::Fence { component, epoch } if epoch.0 < 5 => Response::error(
            WireErrorKind::StaleEpoch { highest: Epoch(5) },
            format!("{component}: {epoch} is below epoch 5"),
        ),
        Request::VolumeCompareAndWrite {
            volume,
            expected,
            new,
            ..
        } if expected != new => Response::error(
            WireErrorKind::Miscompare { offset: 3 },
            format!("volume {volume}: miscompare"),
        ),
        _ => Response::Ok,
    }
}

/// A replica service stand-in that records what it was asked.
struct RecordingReplica {
    seen: Mutex<Vec<(HostId, Request)>>,
    gate: tokio::sync::Barrier,
}

impl Default for RecordingReplica {
    fn default() -> Self {
        RecordingReplica {
            seen: Mutex::default(),
            gate: tokio::sync::Barrier::new(GATED_WRITES),
        }
    }
}

impl RecordingReplica {
    fn seen(&self) -> Vec<(HostId, Request)> {
        self.seen.lock().clone()
    }
}

#[async_trait]
impl RequestHandler for RecordingReplica {
    async fn handle(&self, from: HostId, _class: QueueClass, request: Request) -> Response {
        self.seen.lock().push((from, request.clone()));
        match &request {
            Request::Read { lba, .. } if lba.0 == SLOW_LBA => tokio::time::sleep(SLOW_ANSWER).await,
            Request::Read { component, .. } if component.volume.as_str() == RESYNC_VOLUME => {
                tokio::time::sleep(RESYNC_READ).await
            }
            Request::Write { component, .. } if component.volume.as_str() == GATED_VOLUME => {
                self.gate.wait().await;
            }
            _ => {}
        }
        answer(&request)
    }
}

struct Node {
    transport: Arc<Transport>,
    replica: Arc<RecordingReplica>,
}

impl Node {
    fn addr(&self) -> SocketAddr {
        self.transport.local_addr()
    }
    fn host(&self) -> HostId {
        self.transport.host().clone()
    }
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn node_at(
    name: &str,
    addr: SocketAddr,
    config: TransportConfig,
    faults: &FaultHooks,
) -> Node {
    let replica = Arc::new(RecordingReplica::default());
    let transport =
        Transport::bind_with_faults(host(name), addr, replica.clone(), config, faults.clone())
            .await
            .unwrap();
    Node {
        transport: Arc::new(transport),
        replica,
    }
}

/// Two hosts sharing one seeded fault table.
async fn pair(config: TransportConfig) -> (Node, Node, FaultHooks) {
    let faults = FaultHooks::new(Arc::new(SeededRng::new(42)));
    let a = node_at("h1", loopback(), config.clone(), &faults).await;
    let b = node_at("h2", loopback(), config, &faults).await;
    (a, b, faults)
}

fn quick() -> TransportConfig {
    TransportConfig {
        call_timeout: Duration::from_millis(500),
        connect_timeout: Duration::from_millis(500),
        ..TransportConfig::default()
    }
}

async fn call(from: &Node, to: &Node, request: Request) -> Result<Response, TransportError> {
    from.transport
        .call(&to.host(), to.addr(), QueueClass::Guest, request)
        .await
}

fn every_request() -> Vec<Request> {
    vec![
        Request::Ping,
        Request::CreateComponent {
            component: component(1),
            size_bytes: 1 << 30,
            reserve_bytes: 1 << 20,
        },
        Request::DeleteComponent {
            component: component(2),
        },
        Request::ResizeComponent {
            component: component(3),
            size_bytes: 2 << 30,
        },
        Request::Write {
            component: component(4),
            lba: Lba(17),
            epoch: Epoch(6),
            data: pattern(4, 8192),
        },
        Request::Read {
            component: component(5),
            lba: Lba(3),
            blocks: 2,
        },
        Request::Unmap {
            component: component(6),
            lba: Lba(10),
            blocks: 100,
            epoch: Epoch(6),
        },
        Request::WriteZeroes {
            component: component(7),
            lba: Lba(20),
            blocks: 8,
            epoch: Epoch(6),
        },
        Request::Flush {
            component: component(8),
        },
        Request::Fence {
            component: component(9),
            epoch: Epoch(2),
        },
        Request::Fence {
            component: component(9),
            epoch: Epoch(7),
        },
        Request::Allocated {
            component: component(10),
            from: Lba(64),
            blocks: 128,
        },
        Request::ComponentStatus {
            component: component(11),
        },
        clone_blocks(),
        Request::VolumeRead {
            volume: volume("vol-2"),
            offset: 512,
            len: 3000,
        },
        Request::VolumeWrite {
            volume: volume("vol-2"),
            offset: 4096,
            data: pattern(9, 4096),
            fua: true,
        },
        Request::VolumeFlush {
            volume: volume("vol-2"),
        },
        Request::VolumeUnmap {
            volume: volume("vol-2"),
            offset: 0,
            len: 1 << 20,
        },
        Request::VolumeWriteZeroes {
            volume: volume("vol-2"),
            offset: 8192,
            len: 4096,
            may_unmap: true,
        },
        Request::VolumeCompareAndWrite {
            volume: volume("vol-2"),
            offset: 0,
            expected: pattern(1, 512),
            new: pattern(2, 512),
        },
        Request::VolumeCompareAndWrite {
            volume: volume("vol-2"),
            offset: 0,
            expected: pattern(1, 512),
            new: pattern(1, 512),
        },
        Request::VolumeBlockStatus {
            volume: volume("vol-2"),
            offset: 0,
            len: 1 << 20,
        },
        Request::VolumeRepairCopy {
            volume: volume("vol-2"),
            component: ComponentId(7),
            lba: Lba(3),
            blocks: 2,
        },
        Request::SnapshotComponent {
            component: component(3),
            snapshot: ComponentId(33),
            epoch: Epoch(4),
        },
        Request::CloneSnapshot {
            snapshot: component(33),
            clone: ComponentId(34),
            epoch: Epoch(4),
        },
        Request::VolumeSnapshot {
            volume: volume("vol-2"),
            name: "nightly".into(),
            snapshot: 99,
            created_ms: 1_700_000_000_000,
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_round_trips_with_its_answer() {
    let (a, b, _faults) = pair(TransportConfig::default()).await;
    for request in every_request() {
        let got = call(&a, &b, request.clone()).await.unwrap();
        let expected = match &request {
            Request::Ping => Response::Pong,
            other => answer(other),
        };
        assert_eq!(got, expected, "answer to {request:?}");
    }
    // The handler saw every request but Ping (the transport answers it),
    // intact, in order, and knew who sent it.
    let seen = b.replica.seen();
    let sent: Vec<Request> = every_request()
        .into_iter()
        .filter(|r| *r != Request::Ping)
        .collect();
    assert_eq!(seen.len(), sent.len());
    let served = sent.len() as u64;
    for ((from, got), sent) in seen.into_iter().zip(sent) {
        assert_eq!(from, a.host());
        assert_eq!(got, sent);
    }
    // All of it over one reused connection.
    let (a_stats, b_stats) = (a.transport.stats(), b.transport.stats());
    assert_eq!(a_stats.connections_opened, 1);
    assert_eq!(b_stats.connections_accepted, 1);
    assert_eq!(b_stats.requests_served, served);
    assert_eq!(a_stats.calls, every_request().len() as u64);
    assert_eq!(a_stats.call_errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_arrive_out_of_order_and_match_their_requests() {
    let (a, b, _faults) = pair(TransportConfig::default()).await;
    // Open the connection first so both calls share it.
    call(&a, &b, Request::Ping).await.unwrap();
    let slow = Request::Read {
        component: component(1),
        lba: Lba(SLOW_LBA),
        blocks: 1,
    };
    let started = Instant::now();
    let slow_call = {
        let (a, b) = (a.transport.clone(), (b.host(), b.addr()));
        let slow = slow.clone();
        tokio::spawn(async move {
            let response = a.call(&b.0, b.1, QueueClass::Guest, slow).await;
            (response, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut fast_latencies = Vec::new();
    for i in 0..20u64 {
        let fast = Request::Read {
            component: component(1),
            lba: Lba(i),
            blocks: 1,
        };
        let t = Instant::now();
        let got = call(&a, &b, fast.clone()).await.unwrap();
        fast_latencies.push(t.elapsed());
        assert_eq!(got, answer(&fast));
    }
    assert!(
        !slow_call.is_finished(),
        "the fast calls should all be answered while the slow one runs"
    );
    let (slow_got, slow_took) = slow_call.await.unwrap();
    assert_eq!(slow_got.unwrap(), answer(&slow));
    assert!(slow_took >= SLOW_ANSWER);
    let worst_fast = fast_latencies.iter().max().unwrap();
    assert!(
        *worst_fast < SLOW_ANSWER / 2,
        "fast calls waited behind the slow one: worst {worst_fast:?}"
    );
}

fn clone_blocks() -> Request {
    Request::CloneBlocks {
        source: ComponentRef {
            volume: volume("gold"),
            id: ComponentId(12),
        },
        source_lba: Lba(256),
        target: component(13),
        target_lba: Lba(0),
        blocks: 4096,
        epoch: Epoch(6),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_newer_than_the_peer_is_refused_before_it_is_sent() {
    let faults = FaultHooks::new(Arc::new(SeededRng::new(3)));
    let older = TransportConfig {
        versions: VersionRange { min: 1, max: 1 },
        ..quick()
    };
    let old_host = node_at("h1", loopback(), older, &faults).await;
    let new_host = node_at("h2", loopback(), quick(), &faults).await;
    call(&new_host, &old_host, Request::Ping).await.unwrap();

    // Sent, the older peer could not decode it and would close the
    // connection under every other request in flight on it.
    let err = call(&new_host, &old_host, clone_blocks())
        .await
        .unwrap_err();
    match &err {
        TransportError::Encode { peer, source, .. } => {
            assert_eq!(peer, &old_host.host());
            assert!(
                matches!(
                    **source,
                    tessera_wire::WireError::KindNotInVersion { since: 2, .. }
                ),
                "{source}"
            );
        }
        other => panic!("expected a refusal before sending, got {other}"),
    }
    assert!(err.to_string().contains("older release"), "{err}");
    assert!(!err.may_have_executed());
    // The connection carries on, and the peer never saw the request.
    let status = Request::ComponentStatus {
        component: component(4),
    };
    assert_eq!(
        call(&new_host, &old_host, status.clone()).await.unwrap(),
        answer(&status)
    );
    assert_eq!(new_host.transport.stats().connections_opened, 1);
    assert!(old_host
        .replica
        .seen()
        .iter()
        .all(|(_, r)| !matches!(r, Request::CloneBlocks { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disjoint_versions_are_refused_with_both_ranges() {
    let faults = FaultHooks::new(Arc::new(SeededRng::new(1)));
    let server = node_at("h1", loopback(), quick(), &faults).await;
    let future_config = TransportConfig {
        versions: VersionRange { min: 7, max: 9 },
        ..quick()
    };
    let future_host = node_at("h2", loopback(), future_config, &faults).await;

    // A newer host calling an older one.
    let err = call(&future_host, &server, Request::Ping)
        .await
        .unwrap_err();
    match &err {
        TransportError::VersionMismatch {
            peer, ours, theirs, ..
        } => {
            assert_eq!(peer, &server.host());
            assert_eq!(*ours, VersionRange { min: 7, max: 9 });
            assert_eq!(*theirs, VersionRange::SUPPORTED);
        }
        other => panic!("expected a version mismatch, got {other}"),
    }
    assert!(err.to_string().contains("v7..=v9"), "{err}");

    // An older host calling a newer one.
    let err = call(&server, &future_host, Request::Ping)
        .await
        .unwrap_err();
    assert!(
        matches!(err, TransportError::VersionMismatch { theirs, .. } if theirs == VersionRange { min: 7, max: 9 }),
        "{err}"
    );
    assert!(server.replica.seen().is_empty() && future_host.replica.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calling_the_wrong_host_at_an_address_is_refused() {
    let (a, b, _faults) = pair(quick()).await;
    let err = a
        .transport
        .call(&host("h9"), b.addr(), QueueClass::Guest, Request::Ping)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, TransportError::WrongHost { actual, .. } if *actual == b.host()),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_mebibyte_write_arrives_intact() {
    let (a, b, _faults) = pair(TransportConfig::default()).await;
    let data = pattern(77, 1 << 20);
    let write = Request::Write {
        component: component(1),
        lba: Lba(256),
        epoch: Epoch(3),
        data: data.clone(),
    };
    assert_eq!(call(&a, &b, write.clone()).await.unwrap(), Response::Ok);
    let read = Request::Read {
        component: component(1),
        lba: Lba(5),
        blocks: 256,
    };
    let Response::Data(got) = call(&a, &b, read).await.unwrap() else {
        panic!("read did not return data");
    };
    assert_eq!(got, pattern(5, 1 << 20));
    assert_eq!(b.replica.seen()[0].1, write);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_hook_adds_latency_in_each_direction() {
    let (a, b, faults) = pair(TransportConfig::default()).await;
    call(&a, &b, Request::Ping).await.unwrap();
    let t = Instant::now();
    call(&a, &b, Request::Ping).await.unwrap();
    let baseline = t.elapsed();

    faults.set_delay(
        &a.host(),
        &b.host(),
        Duration::from_millis(60),
        Duration::ZERO,
    );
    let t = Instant::now();
    call(&a, &b, Request::Ping).await.unwrap();
    let one_way = t.elapsed();
    assert!(one_way >= Duration::from_millis(60), "{one_way:?}");
    assert!(one_way < Duration::from_millis(60) + baseline + Duration::from_millis(400));

    faults.set_delay(
        &b.host(),
        &a.host(),
        Duration::from_millis(40),
        Duration::from_millis(20),
    );
    let t = Instant::now();
    call(&a, &b, Request::Ping).await.unwrap();
    let both = t.elapsed();
    assert!(both >= Duration::from_millis(100), "{both:?}");
    assert!(both < Duration::from_millis(120) + baseline + Duration::from_millis(400));

    faults.clear();
    let t = Instant::now();
    call(&a, &b, Request::Ping).await.unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_blocks_until_healed() {
    let (a, b, faults) = pair(quick()).await;
    call(&a, &b, Request::Ping).await.unwrap();
    faults.partition(&a.host(), &b.host());
    let write = Request::Flush {
        component: component(1),
    };
    let t = Instant::now();
    let err = call(&a, &b, write.clone()).await.unwrap_err();
    assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
    assert!(t.elapsed() >= quick().call_timeout);
    let err = call(&b, &a, write.clone()).await.unwrap_err();
    assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
    assert!(b.replica.seen().is_empty() && a.replica.seen().is_empty());
    assert!(a.transport.stats().frames_lost_to_faults > 0);
    assert_eq!(a.transport.stats().timeouts, 1);

    faults.heal(&a.host(), &b.host());
    assert_eq!(call(&a, &b, write.clone()).await.unwrap(), Response::Ok);
    assert_eq!(call(&b, &a, write).await.unwrap(), Response::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_host_reaches_nobody_and_fail_fast_says_so() {
    let config = TransportConfig {
        partition_behaviour: PartitionBehaviour::FailFast,
        ..quick()
    };
    let (a, b, faults) = pair(config).await;
    faults.isolate(&b.host());
    let t = Instant::now();
    let err = call(&a, &b, Request::Ping).await.unwrap_err();
    assert!(matches!(err, TransportError::Partitioned { .. }), "{err}");
    assert!(t.elapsed() < quick().call_timeout / 2, "{:?}", t.elapsed());
    assert_eq!(err.peer(), Some(&b.host()));
    faults.rejoin(&b.host());
    assert_eq!(call(&a, &b, Request::Ping).await.unwrap(), Response::Pong);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_way_partition_loses_only_one_direction() {
    let (a, b, faults) = pair(quick()).await;
    // Connections opened before the cut stay open (a new one could not
    // complete its handshake across a one-way cut).
    call(&a, &b, Request::Ping).await.unwrap();
    call(&b, &a, Request::Ping).await.unwrap();
    faults.partition_one_way(&a.host(), &b.host());
    let flush = Request::Flush {
        component: component(1),
    };
    // a -> b is cut: b never sees a's request.
    let err = call(&a, &b, flush.clone()).await.unwrap_err();
    assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
    assert!(b.replica.seen().is_empty());
    // b -> a works, but a's answers are lost on the way back: a executes the
    // request and b cannot know.
    let err = call(&b, &a, flush.clone()).await.unwrap_err();
    assert!(err.may_have_executed(), "{err}");
    assert_eq!(a.replica.seen(), vec![(b.host(), flush.clone())]);

    faults.heal(&a.host(), &b.host());
    assert_eq!(call(&a, &b, flush).await.unwrap(), Response::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_probability_is_roughly_honoured() {
    // Long enough that no delivered call times out on a loaded machine
    // (the calls run at once: a dropped one costs the test one timeout).
    let config = TransportConfig {
        call_timeout: Duration::from_millis(3000),
        ..TransportConfig::default()
    };
    let (a, b, faults) = pair(config).await;
    call(&a, &b, Request::Ping).await.unwrap();
    // Requests and answers are each lost with 20%: a call survives with 64%.
    faults.set_drop_probability(&a.host(), &b.host(), 0.2);
    faults.set_drop_probability(&b.host(), &a.host(), 0.2);
    const CALLS: usize = 400;
    let mut calls = Vec::new();
    for _ in 0..CALLS {
        let a = a.transport.clone();
        let (to, addr) = (b.host(), b.addr());
        calls.push(tokio::spawn(async move {
            a.call(&to, addr, QueueClass::Guest, Request::Ping).await
        }));
    }
    let mut answered = 0;
    for c in calls {
        match c.await.unwrap() {
            Ok(Response::Pong) => answered += 1,
            Ok(other) => panic!("unexpected answer {other:?}"),
            Err(TransportError::Timeout { .. }) => {}
            // A stall of the whole machine can leave the connection with no
            // frame for a call's timeout: it is closed as possibly dead,
            // and the calls still on it are lost, as the rule says.
            Err(TransportError::ConnectionLost { reason, .. })
                if reason.contains("silent for a whole call timeout") => {}
            Err(other) => panic!("unexpected error {other}"),
        }
    }
    let rate = answered as f64 / CALLS as f64;
    assert!((0.52..=0.76).contains(&rate), "answered {answered}/{CALLS}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_next_fails_exactly_that_many_calls() {
    let (a, b, faults) = pair(quick()).await;
    faults.fail_next(&a.host(), &b.host(), 2);
    for _ in 0..2 {
        let err = call(&a, &b, Request::Ping).await.unwrap_err();
        assert!(matches!(err, TransportError::Injected { .. }), "{err}");
    }
    assert_eq!(call(&a, &b, Request::Ping).await.unwrap(), Response::Pong);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_calls_do_not_wait_behind_resync_traffic() {
    let (a, b, _faults) = pair(TransportConfig::default()).await;
    // Fill every in-flight slot of the resync connection with slow reads.
    let mut resync = Vec::new();
    for i in 0..MAX_IN_FLIGHT_PER_CONNECTION as u64 + 16 {
        let a = a.transport.clone();
        let (to, addr) = (b.host(), b.addr());
        resync.push(tokio::spawn(async move {
            let read = Request::Read {
                component: ComponentRef {
                    volume: volume(RESYNC_VOLUME),
                    id: ComponentId(1),
                },
                lba: Lba(i * 16),
                blocks: 16,
            };
            // Bulk copies get a longer timeout than guest I/O: the last
            // ones queue behind a full connection.
            a.call_with_timeout(&to, addr, QueueClass::Resync, read, Duration::from_secs(20))
                .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let write = Request::Write {
        component: component(1),
        lba: Lba(0),
        epoch: Epoch(1),
        data: pattern(1, 4096),
    };
    assert_eq!(call(&a, &b, write).await.unwrap(), Response::Ok);
    let guest = t.elapsed();
    assert!(
        guest < RESYNC_READ / 3,
        "guest write waited {guest:?} behind resync reads"
    );
    assert!(
        resync.iter().all(|r| !r.is_finished()),
        "the resync reads should still be running"
    );
    for r in resync {
        let Response::Data(data) = r.await.unwrap().unwrap() else {
            panic!("resync read did not return data");
        };
        assert_eq!(data.len(), 16 * BLOCK_BYTES as usize);
    }
    // One connection per queue class.
    assert_eq!(a.transport.stats().connections_opened, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_request_does_not_hold_back_a_quick_one_on_the_same_connection() {
    let (a, b, _faults) = pair(TransportConfig::default()).await;
    let slow = {
        let a = a.transport.clone();
        let (to, addr) = (b.host(), b.addr());
        tokio::spawn(async move {
            let read = Request::Read {
                component: ComponentRef {
                    volume: volume(RESYNC_VOLUME),
                    id: ComponentId(1),
                },
                lba: Lba(0),
                blocks: 16,
            };
            a.call_with_timeout(&to, addr, QueueClass::Resync, read, Duration::from_secs(20))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t = Instant::now();
    let write = Request::Write {
        component: component(1),
        lba: Lba(0),
        epoch: Epoch(1),
        data: pattern(1, 4096),
    };
    // The same queue class, so the same connection as the slow read.
    let answer = a
        .transport
        .call(&b.host(), b.addr(), QueueClass::Resync, write)
        .await
        .unwrap();
    assert_eq!(answer, Response::Ok);
    assert!(
        t.elapsed() < RESYNC_READ / 3 && !slow.is_finished(),
        "the write waited {:?} behind the slow read",
        t.elapsed()
    );
    assert!(matches!(slow.await.unwrap().unwrap(), Response::Data(_)));
    assert_eq!(a.transport.stats().connections_opened, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_is_reached_again() {
    let faults = FaultHooks::new(Arc::new(SeededRng::new(3)));
    let a = node_at("h1", loopback(), quick(), &faults).await;
    let b = node_at("h2", loopback(), quick(), &faults).await;
    let addr = b.addr();
    assert_eq!(call(&a, &b, Request::Ping).await.unwrap(), Response::Pong);

    b.transport.shutdown().await;
    let err = a
        .transport
        .call(&host("h2"), addr, QueueClass::Guest, Request::Ping)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            TransportError::Connect { .. } | TransportError::ConnectionLost { .. }
        ),
        "{err}"
    );
    assert_eq!(err.peer(), Some(&host("h2")));

    let b2 = node_at("h2", addr, quick(), &faults).await;
    let flush = Request::Flush {
        component: component(1),
    };
    assert_eq!(call(&a, &b2, flush.clone()).await.unwrap(), Response::Ok);
    assert_eq!(b2.replica.seen(), vec![(a.host(), flush)]);
}

async fn expect_closed(stream: &mut tokio::net::TcpStream) {
    let mut buf = [0u8; 256];
    let closed = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "server kept a malformed connection open");
}

fn hello_bytes(name: &str) -> Bytes {
    tessera_wire::encode_frame(
        tessera_wire::WireVersion::CURRENT,
        0,
        QueueClass::Guest,
        &tessera_wire::Message::Request(Request::Hello {
            versions: VersionRange::SUPPORTED,
            host: host(name),
        }),
    )
    .unwrap()
    .to_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_close_the_connection_and_nothing_else() {
    let (a, b, _faults) = pair(quick()).await;

    // Garbage instead of a Hello.
    let mut raw = tokio::net::TcpStream::connect(b.addr()).await.unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    expect_closed(&mut raw).await;

    // A header announcing a large frame before any Hello.
    let mut raw = tokio::net::TcpStream::connect(b.addr()).await.unwrap();
    let mut early = [0u8; tessera_wire::HEADER_BYTES];
    early[..4].copy_from_slice(&tessera_wire::MAGIC);
    early[20..24].copy_from_slice(&(1u32 << 20).to_le_bytes());
    raw.write_all(&early).await.unwrap();
    expect_closed(&mut raw).await;

    // A good Hello, then a frame whose CRC is wrong.
    let mut raw = tokio::net::TcpStream::connect(b.addr()).await.unwrap();
    raw.write_all(&hello_bytes("h7")).await.unwrap();
    let mut bad = tessera_wire::encode_frame(
        tessera_wire::WireVersion::CURRENT,
        1,
        QueueClass::Guest,
        &tessera_wire::Message::Request(Request::Flush {
            component: component(1),
        }),
    )
    .unwrap()
    .to_bytes()
    .to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0x40;
    raw.write_all(&bad).await.unwrap();
    expect_closed(&mut raw).await;

    // A good Hello, then a header announcing a frame beyond the limit.
    let mut raw = tokio::net::TcpStream::connect(b.addr()).await.unwrap();
    raw.write_all(&hello_bytes("h7")).await.unwrap();
    let mut huge = [0u8; tessera_wire::HEADER_BYTES];
    huge[..4].copy_from_slice(&tessera_wire::MAGIC);
    huge[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
    raw.write_all(&huge).await.unwrap();
    expect_closed(&mut raw).await;

    // A response where a request belongs.
    let mut raw = tokio::net::TcpStream::connect(b.addr()).await.unwrap();
    raw.write_all(&hello_bytes("h7")).await.unwrap();
    let pong = tessera_wire::encode_frame(
        tessera_wire::WireVersion::CURRENT,
        1,
        QueueClass::Guest,
        &tessera_wire::Message::Response(Response::Pong),
    )
    .unwrap()
    .to_bytes();
    raw.write_all(&pong).await.unwrap();
    expect_closed(&mut raw).await;

    // The server is unharmed and the handler never saw the bad frames.
    assert_eq!(call(&a, &b, Request::Ping).await.unwrap(), Response::Pong);
    assert!(b.replica.seen().is_empty());
    assert_eq!(b.transport.stats().connections_closed_malformed, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_answers_times_out() {
    // A listener that accepts and stays silent: the handshake never ends.
    let silent = tokio::net::TcpListener::bind(loopback()).await.unwrap();
    let addr = silent.local_addr().unwrap();
    let keep = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let faults = FaultHooks::new(Arc::new(SeededRng::new(3)));
    let a = node_at("h1", loopback(), quick(), &faults).await;
    let t = Instant::now();
    let err = a
        .transport
        .call(&host("h2"), addr, QueueClass::Guest, Request::Ping)
        .await
        .unwrap_err();
    assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
    assert!(t.elapsed() < quick().call_timeout + Duration::from_millis(300));
    keep.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_of_mixed_sizes_arrive_intact_on_both_queues() {
    let (a, b, _faults) = pair(TransportConfig::default()).await;
    const TASKS: u64 = 24;
    const CALLS_PER_TASK: u64 = 6;
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let a = a.transport.clone();
        let (to, addr) = (b.host(), b.addr());
        tasks.push(tokio::spawn(async move {
            let mut sent = Vec::new();
            for c in 0..CALLS_PER_TASK {
                let seed = t * 1000 + c;
                // Sizes from empty to 2 MiB, so small frames interleave with
                // frames that take many reads.
                let len = ((seed * 7919) % 9) as usize * (256 << 10) + (seed % 3) as usize * 17;
                let request = Request::VolumeWrite {
                    volume: volume("vol-mixed"),
                    offset: seed * 4096,
                    data: pattern(seed, len),
                    fua: c % 2 == 0,
                };
                let class = if t % 2 == 0 {
                    QueueClass::Guest
                } else {
                    QueueClass::Resync
                };
                // Integrity is the point here, not latency: a loaded
                // machine may take a while for 144 frames of up to 2 MiB.
                let got = a
                    .call_with_timeout(&to, addr, class, request.clone(), Duration::from_secs(30))
                    .await
                    .unwrap();
                assert_eq!(got, Response::Ok);
                sent.push(request);
            }
            sent
        }));
    }
    let mut sent = Vec::new();
    for t in tasks {
        sent.extend(t.await.unwrap());
    }
    let mut seen: Vec<Request> = b.replica.seen().into_iter().map(|(_, r)| r).collect();
    let key = |r: &Request| match r {
        Request::VolumeWrite { offset, .. } => *offset,
        _ => u64::MAX,
    };
    sent.sort_by_key(key);
    seen.sort_by_key(key);
    assert_eq!(seen.len(), sent.len());
    assert!(seen == sent, "a request arrived altered");
}

/// Answers that are ready at the same moment (as a group commit
/// acknowledges many writes at once) reach the caller in one write of the
/// socket, not one each, and each still reaches its own caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_ready_together_go_out_together() {
    let (a, b, _faults) = pair(TransportConfig::default()).await;
    // Open the connection first, so the handshake's answer is not counted.
    assert_eq!(call(&a, &b, Request::Ping).await.unwrap(), Response::Pong);
    let before = b.transport.stats();
    let (to, addr) = (b.host(), b.addr());
    let calls = (0..GATED_WRITES as u64).map(|i| {
        let write = Request::Write {
            component: ComponentRef {
                volume: volume(GATED_VOLUME),
                id: ComponentId(1),
            },
            lba: Lba(i),
            epoch: Epoch(1),
            data: pattern(i, 4096),
        };
        let (a, to) = (a.transport.clone(), to.clone());
        async move { a.call(&to, addr, QueueClass::Guest, write).await }
    });
    for answer in futures::future::join_all(calls).await {
        assert_eq!(answer.unwrap(), Response::Ok);
    }
    let after = b.transport.stats();
    assert_eq!(
        after.requests_served - before.requests_served,
        GATED_WRITES as u64
    );
    let writes = after.answer_writes - before.answer_writes;
    assert!(
        writes <= 4,
        "{GATED_WRITES} answers ready together took {writes} writes"
    );
}

/// The calls a connection's task starts in one poll (as an NBD connection
/// starts the requests it has read, and each sends its second copy) reach
/// the peer in one write of the socket, not one each; each is answered
/// with its own answer and arrives intact, also when together they are
/// more than the socket takes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_started_in_one_poll_go_out_together() {
    use futures::StreamExt;
    let (a, b, _faults) = pair(TransportConfig::default()).await;
    // Open the connection first, so the handshake is not counted.
    assert_eq!(call(&a, &b, Request::Ping).await.unwrap(), Response::Pong);
    let (to, addr) = (b.host(), b.addr());
    for (round, (count, len)) in [(32u64, 4096usize), (24, 1 << 20), (64, 8192)]
        .into_iter()
        .enumerate()
    {
        let first_lba = round as u64 * 1000;
        let writes: Vec<Request> = (0..count)
            .map(|i| Request::Write {
                component: component(1),
                lba: Lba(first_lba + i),
                epoch: Epoch(1),
                data: pattern(first_lba + i, len),
            })
            .collect();
        let before = a.transport.stats();
        let seen_before = b.replica.seen().len();
        let mut in_flight = tessera_env::InFlight::new();
        for (i, write) in writes.iter().cloned().enumerate() {
            let (a, to) = (a.transport.clone(), to.clone());
            in_flight.push(async move { (i, a.call(&to, addr, QueueClass::Guest, write).await) });
        }
        let mut answered = vec![false; count as usize];
        while let Some((i, answer)) = in_flight.next().await {
            assert_eq!(
                answer.unwrap(),
                Response::Ok,
                "call {i} of {count} x {len} bytes"
            );
            assert!(!answered[i], "call {i} answered twice");
            answered[i] = true;
        }
        assert!(answered.iter().all(|&a| a));
        let seen: Vec<Request> = b.replica.seen()[seen_before..]
            .iter()
            .map(|(_, r)| r.clone())
            .collect();
        assert_eq!(seen.len(), writes.len());
        for write in &writes {
            assert!(
                seen.contains(write),
                "a write of {len} bytes arrived altered"
            );
        }
        let sent = a.transport.stats().request_writes - before.request_writes;
        if len <= 8192 {
            assert!(
                sent <= 2,
                "{count} calls started in one poll took {sent} writes"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transport_can_call_before_it_serves() {
    let faults = FaultHooks::new(Arc::new(SeededRng::new(5)));
    let b = node_at("h2", loopback(), TransportConfig::default(), &faults).await;
    let a = Arc::new(
        Transport::listen(
            host("h1"),
            loopback(),
            TransportConfig::default(),
            faults.clone(),
        )
        .unwrap(),
    );
    // Calling out works before serving.
    let got = a
        .call(&b.host(), b.addr(), QueueClass::Guest, Request::Ping)
        .await
        .unwrap();
    assert_eq!(got, Response::Pong);

    // A peer's call waits in the backlog until the handler is there.
    let early = {
        let b = b.transport.clone();
        let addr = a.local_addr();
        tokio::spawn(async move {
            let flush = Request::Flush {
                component: component(1),
            };
            b.call(&host("h1"), addr, QueueClass::Guest, flush).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!early.is_finished());
    let replica = Arc::new(RecordingReplica::default());
    a.serve(replica.clone()).unwrap();
    assert_eq!(early.await.unwrap().unwrap(), Response::Ok);
    assert_eq!(replica.seen().len(), 1);

    let again = a.serve(Arc::new(RecordingReplica::default())).unwrap_err();
    assert!(
        matches!(again, TransportError::AlreadyServing { .. }),
        "{again}"
    );
}

/// A peer that answers the handshake and pings, but stops reading its first
/// connection after the first ping.
async fn stalling_peer() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    use bytes::BytesMut;
    use tessera_wire::{decode_frame, encode_frame, Message, WireVersion};
    let listener = tokio::net::TcpListener::bind(loopback()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        let mut first = true;
        while let Ok((mut stream, _)) = listener.accept().await {
            let stall = std::mem::replace(&mut first, false);
            let answer = async move {
                let mut buf = BytesMut::new();
                let mut answered = 0;
                loop {
                    let frame = loop {
                        if let Some(frame) = decode_frame(&mut buf).unwrap() {
                            break frame;
                        }
                        if stream.read_buf(&mut buf).await.unwrap() == 0 {
                            return stream;
                        }
                    };
                    let answer = match frame.message {
                        Message::Request(Request::Hello { .. }) => Response::HelloOk {
                            version: WireVersion::CURRENT,
                            host: host("h2"),
                        },
                        _ => Response::Pong,
                    };
                    let bytes = encode_frame(
                        WireVersion::CURRENT,
                        frame.header.request_id,
                        frame.header.class,
                        &Message::Response(answer),
                    )
                    .unwrap()
                    .to_bytes();
                    stream.write_all(&bytes).await.unwrap();
                    answered += 1;
                    // The Hello and one ping, then silence.
                    if stall && answered == 2 {
                        return stream;
                    }
                }
            };
            if stall {
                held.push(answer.await);
            } else {
                tokio::spawn(answer);
            }
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_cut_short_by_a_cancelled_call_never_corrupts_the_next_call() {
    let (addr, peer) = stalling_peer().await;
    let faults = FaultHooks::new(Arc::new(SeededRng::new(9)));
    let a = node_at("h1", loopback(), TransportConfig::default(), &faults).await;
    let to = host("h2");
    assert_eq!(
        a.transport
            .call(&to, addr, QueueClass::Guest, Request::Ping)
            .await
            .unwrap(),
        Response::Pong
    );
    // The peer no longer reads: a large frame fills the socket buffers, and
    // the caller gives up (its own timeout, a select) halfway through.
    let write = Request::Write {
        component: component(1),
        lba: Lba(0),
        epoch: Epoch(1),
        data: pattern(3, 15 << 20),
    };
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        a.transport.call(&to, addr, QueueClass::Guest, write),
    )
    .await;
    assert!(
        abandoned.is_err(),
        "the stalled peer answered: {abandoned:?}"
    );
    // The next call must not follow the half-sent frame on the same stream:
    // the peer decodes strictly and would fail on the mixed bytes.
    assert_eq!(
        a.transport
            .call(&to, addr, QueueClass::Guest, Request::Ping)
            .await
            .unwrap(),
        Response::Pong
    );
    assert_eq!(a.transport.stats().connections_opened, 2);
    peer.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_set_on_one_host_of_separate_processes_cuts_both_ways() {
    // Separate tables, as in a multi-process cluster.
    let a = node_at(
        "h1",
        loopback(),
        quick(),
        &FaultHooks::new(Arc::new(SeededRng::new(1))),
    )
    .await;
    let b = node_at(
        "h2",
        loopback(),
        quick(),
        &FaultHooks::new(Arc::new(SeededRng::new(2))),
    )
    .await;
    call(&a, &b, Request::Ping).await.unwrap();
    call(&b, &a, Request::Ping).await.unwrap();
    a.transport.faults().partition(&a.host(), &b.host());
    let flush = Request::Flush {
        component: component(1),
    };
    let err = call(&a, &b, flush.clone()).await.unwrap_err();
    assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
    let err = call(&b, &a, flush.clone()).await.unwrap_err();
    assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
    assert!(a.replica.seen().is_empty() && b.replica.seen().is_empty());
    a.transport.faults().heal(&a.host(), &b.host());
    assert_eq!(call(&b, &a, flush.clone()).await.unwrap(), Response::Ok);
    assert_eq!(call(&a, &b, flush).await.unwrap(), Response::Ok);
}

/// TLS settings of a host whose certificate `ca` signed, trusting `trusted`.
fn host_tls(
    ca: &tessera_tls::CertificateAuthority,
    trusted: &tessera_tls::CertificateAuthority,
) -> tessera_transport::TransportTls {
    let issued = ca
        .issue(&tessera_tls::CertificateRequest {
            name: "host".into(),
            ips: vec!["127.0.0.1".parse().unwrap()],
            dns_names: Vec::new(),
            usage: tessera_tls::Usage::ServerAndClient,
        })
        .unwrap();
    let identity = tessera_tls::Identity::from_pem(&issued.cert_pem, &issued.key_pem).unwrap();
    let roots = tessera_tls::TrustedRoots::from_pem(&trusted.cert_pem()).unwrap();
    tessera_transport::TransportTls {
        server: tessera_tls::server_config(
            &identity,
            &tessera_tls::ClientCertificates::Required(roots.clone()),
        )
        .unwrap(),
        client: tessera_tls::client_config(&roots, Some(&identity)).unwrap(),
    }
}

/// Hosts holding certificates of the cluster CA talk over TLS, every
/// request intact; a host whose certificate another CA signed cannot join,
/// neither calling nor being called, and neither can a host without TLS.
#[tokio::test]
async fn hosts_of_the_cluster_ca_talk_over_tls_and_no_other_host_joins() {
    let ca = tessera_tls::CertificateAuthority::generate("cluster").unwrap();
    let other = tessera_tls::CertificateAuthority::generate("other").unwrap();
    let tls = |signer, trusted| TransportConfig {
        tls: Some(host_tls(signer, trusted)),
        ..quick()
    };
    let faults = FaultHooks::new(Arc::new(SeededRng::new(7)));
    let a = node_at("h1", loopback(), tls(&ca, &ca), &faults).await;
    let b = node_at("h2", loopback(), tls(&ca, &ca), &faults).await;
    for request in every_request() {
        let got = call(&a, &b, request.clone()).await.unwrap();
        let expected = match &request {
            Request::Ping => Response::Pong,
            other => answer(other),
        };
        assert_eq!(got, expected, "answer to {request:?} over TLS");
    }
    // A large write crosses TLS records intact.
    let big = Request::Write {
        component: component(4),
        lba: Lba(0),
        epoch: Epoch(6),
        data: pattern(9, 1 << 20),
    };
    assert_eq!(call(&b, &a, big.clone()).await.unwrap(), answer(&big));

    // Signed by another CA (it trusts the cluster's, and even so).
    let stranger = node_at("h3", loopback(), tls(&other, &ca), &faults).await;
    let refused = call(&stranger, &b, Request::Ping).await;
    assert!(
        refused.is_err(),
        "a host of another CA called in: {refused:?}"
    );
    let refused = call(&a, &stranger, Request::Ping).await;
    assert!(
        refused.is_err(),
        "a host of another CA was called: {refused:?}"
    );
    // Without TLS.
    let plain = node_at("h4", loopback(), quick(), &faults).await;
    assert!(call(&plain, &b, Request::Ping).await.is_err());
    assert!(call(&a, &plain, Request::Ping).await.is_err());
    // The cluster's hosts still talk.
    assert_eq!(call(&a, &b, Request::Ping).await.unwrap(), Response::Pong);
}
