//! Round-trip latency of a 4 KiB `Write` call over loopback, against a plain
//! TCP ping-pong of the same size measured in the same run (the machine is
//! shared and noisy, so only the ratio means something).
//!
//! Run: `cargo run --release -p tessera-transport --example write_latency [calls]`
//!
//! Prints, for each setup, p50 / p99 / mean latency at queue depth 1 and the
//! ratio of the p50 to the plain TCP reference, then the rate at queue
//! depth 16 and the throughput of 1 MiB writes.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use tessera_transport::{
    QueueClass, Request, RequestHandler, Response, Transport, TransportConfig,
};
use tessera_types::{ComponentId, Epoch, HostId, Lba, VolumeId};
use tessera_wire::ComponentRef;

/// Answers every request at once: the figure is the transport's own cost.
struct NullReplica;

#[async_trait]
impl RequestHandler for NullReplica {
    async fn handle(&self, _from: HostId, _class: QueueClass, _request: Request) -> Response {
        Response::Ok
    }
}

struct Figures {
    p50: Duration,
    p99: Duration,
    mean: Duration,
}

fn figures(mut samples: Vec<Duration>) -> Figures {
    samples.sort();
    let total: Duration = samples.iter().sum();
    Figures {
        p50: samples[samples.len() / 2],
        p99: samples[samples.len() * 99 / 100],
        mean: total / samples.len() as u32,
    }
}

fn print(label: &str, f: &Figures, reference: Option<&Figures>) {
    let ratio = reference
        .map(|r| {
            format!(
                "  {:.2}x plain TCP",
                f.p50.as_secs_f64() / r.p50.as_secs_f64()
            )
        })
        .unwrap_or_default();
    println!(
        "{label:<44} p50 {:>7.1} us  p99 {:>7.1} us  mean {:>7.1} us{ratio}",
        f.p50.as_secs_f64() * 1e6,
        f.p99.as_secs_f64() * 1e6,
        f.mean.as_secs_f64() * 1e6,
    );
}

/// Plain blocking TCP: 4 KiB + 28 bytes out, 28 bytes back, one thread per end.
fn plain_tcp(calls: usize) -> Figures {
    const REQUEST: usize = 4096 + 28;
    const ANSWER: usize = 28;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut buf = vec![0u8; REQUEST];
        while s.read_exact(&mut buf).is_ok() {
            if s.write_all(&buf[..ANSWER]).is_err() {
                break;
            }
        }
    });
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    let out = vec![7u8; REQUEST];
    let mut back = vec![0u8; ANSWER];
    let mut samples = Vec::with_capacity(calls);
    for i in 0..calls + calls / 10 {
        let t = Instant::now();
        c.write_all(&out).unwrap();
        c.read_exact(&mut back).unwrap();
        if i >= calls / 10 {
            samples.push(t.elapsed());
        }
    }
    drop(c);
    server.join().unwrap();
    figures(samples)
}

fn write_request(i: u64) -> Request {
    Request::Write {
        component: ComponentRef {
            volume: VolumeId::new("bench").unwrap(),
            id: ComponentId(1),
        },
        lba: Lba(i % 1024),
        epoch: Epoch(1),
        data: Bytes::from(vec![0x5a; 4096]),
    }
}

async fn transport_pair() -> (Arc<Transport>, Arc<Transport>) {
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = Transport::bind(
        HostId::new("h1").unwrap(),
        any,
        Arc::new(NullReplica),
        TransportConfig::default(),
    )
    .await
    .unwrap();
    let b = Transport::bind(
        HostId::new("h2").unwrap(),
        any,
        Arc::new(NullReplica),
        TransportConfig::default(),
    )
    .await
    .unwrap();
    (Arc::new(a), Arc::new(b))
}

async fn transport_qd1(calls: usize) -> Figures {
    let (a, b) = transport_pair().await;
    let (to, addr) = (b.host().clone(), b.local_addr());
    let mut samples = Vec::with_capacity(calls);
    for i in 0..(calls + calls / 10) as u64 {
        let request = write_request(i);
        let t = Instant::now();
        let answer = a.call(&to, addr, QueueClass::Guest, request).await.unwrap();
        let took = t.elapsed();
        assert_eq!(answer, Response::Ok);
        if i as usize >= calls / 10 {
            samples.push(took);
        }
    }
    a.shutdown().await;
    b.shutdown().await;
    figures(samples)
}

/// Bytes per second of 1 MiB writes at queue depth 1.
async fn transport_mib_writes(calls: usize) -> f64 {
    let (a, b) = transport_pair().await;
    let (to, addr) = (b.host().clone(), b.local_addr());
    let data = Bytes::from(vec![0x3c; 1 << 20]);
    let request = |i: u64| Request::Write {
        component: ComponentRef {
            volume: VolumeId::new("bench").unwrap(),
            id: ComponentId(1),
        },
        lba: Lba(i * 256),
        epoch: Epoch(1),
        data: data.clone(),
    };
    a.call(&to, addr, QueueClass::Resync, request(0))
        .await
        .unwrap();
    let t = Instant::now();
    for i in 0..calls as u64 {
        a.call(&to, addr, QueueClass::Resync, request(i))
            .await
            .unwrap();
    }
    let rate = (calls << 20) as f64 / t.elapsed().as_secs_f64();
    a.shutdown().await;
    b.shutdown().await;
    rate
}

async fn transport_rate(calls: usize, depth: usize) -> f64 {
    let (a, b) = transport_pair().await;
    let (to, addr) = (b.host().clone(), b.local_addr());
    a.call(&to, addr, QueueClass::Guest, Request::Ping)
        .await
        .unwrap();
    let t = Instant::now();
    let mut workers = Vec::new();
    for w in 0..depth {
        let (a, to) = (a.clone(), to.clone());
        workers.push(tokio::spawn(async move {
            for i in 0..(calls / depth) as u64 {
                a.call(&to, addr, QueueClass::Guest, write_request(i + w as u64))
                    .await
                    .unwrap();
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    let rate = (calls / depth * depth) as f64 / t.elapsed().as_secs_f64();
    a.shutdown().await;
    b.shutdown().await;
    rate
}

fn main() {
    let calls: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    println!(
        "4 KiB Write round trip over loopback, {calls} calls after {} warm-up",
        calls / 10
    );

    let plain = plain_tcp(calls);
    print("plain TCP ping-pong, blocking, 2 threads", &plain, None);

    let one_thread = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let f = one_thread.block_on(transport_qd1(calls));
    print("transport, both hosts on one thread", &f, Some(&plain));
    let rate = one_thread.block_on(transport_rate(calls, 16));
    println!(
        "{:<44} {rate:>9.0} calls/s",
        "transport, one thread, queue depth 16"
    );
    drop(one_thread);

    let two_threads = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let f = two_threads.block_on(transport_qd1(calls));
    print(
        "transport, both hosts on 2 worker threads",
        &f,
        Some(&plain),
    );
    let rate = two_threads.block_on(transport_rate(calls, 16));
    println!(
        "{:<44} {rate:>9.0} calls/s",
        "transport, 2 workers, queue depth 16"
    );
    let rate = two_threads.block_on(transport_mib_writes(500));
    println!(
        "{:<44} {:>9.0} MiB/s",
        "transport, 2 workers, 1 MiB writes, depth 1",
        rate / f64::from(1 << 20)
    );
}
