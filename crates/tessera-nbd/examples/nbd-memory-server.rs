//! Serves one in-memory thin device over NBD, for tests and benchmarks.
//!
//! Prints `listening on <address>` once the socket is bound, then serves
//! until SIGINT or SIGTERM.
//!
//! With `--thread-per-connection` every connection gets its own OS thread
//! running a single-threaded runtime (what `serve_connection` is for): a
//! request then never changes threads between socket and device, and the
//! kernel spreads connections over the cores.

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tessera_blockdev::MemoryDevice;
use tessera_nbd::{serve, serve_connection, StaticCatalog};
use tokio::net::TcpListener;

#[derive(Parser)]
#[command(about = "Serve an in-memory device over NBD")]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:10809")]
    listen: String,
    /// Device size, with an optional K, M, G or T suffix (powers of 1024).
    #[arg(long, default_value = "1G")]
    size: String,
    /// Export name.
    #[arg(long, default_value = "memory")]
    name: String,
    /// Refuse writes.
    #[arg(long)]
    read_only: bool,
    /// Runtime worker threads; 0 runs everything on one thread.
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// One OS thread with its own runtime per connection.
    #[arg(long)]
    thread_per_connection: bool,
}

/// Accepts on the calling thread and serves each connection on its own
/// thread; ends with the process (SIGINT/SIGTERM keep their default action).
fn serve_thread_per_connection(listen: &str, catalog: Arc<StaticCatalog>) -> Result<()> {
    let listener =
        std::net::TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
    println!("listening on {}", listener.local_addr()?);
    let open = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                std::thread::sleep(tessera_nbd::server::ACCEPT_BACKOFF);
                continue;
            }
        };
        if open.load(Ordering::Relaxed) >= tessera_nbd::server::MAX_CONNECTIONS {
            continue;
        }
        stream.set_nonblocking(true)?;
        let catalog = catalog.clone();
        let open = open.clone();
        open.fetch_add(1, Ordering::Relaxed);
        std::thread::Builder::new()
            .name("nbd-connection".into())
            .spawn(move || {
                let served = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(anyhow::Error::from)
                    .and_then(|runtime| {
                        runtime.block_on(async move {
                            let stream = tokio::net::TcpStream::from_std(stream)?;
                            serve_connection(stream, catalog, None, std::future::pending()).await?;
                            Ok(())
                        })
                    });
                if let Err(e) = served {
                    tracing::info!("{e}");
                }
                open.fetch_sub(1, Ordering::Relaxed);
            })?;
    }
    Ok(())
}

fn parse_size(text: &str) -> Result<u64> {
    let text = text.trim();
    let (digits, shift) = match text.chars().last() {
        Some('K' | 'k') => (&text[..text.len() - 1], 10),
        Some('M' | 'm') => (&text[..text.len() - 1], 20),
        Some('G' | 'g') => (&text[..text.len() - 1], 30),
        Some('T' | 't') => (&text[..text.len() - 1], 40),
        _ => (text, 0),
    };
    let n: u64 = digits
        .parse()
        .with_context(|| format!("bad size {text:?}"))?;
    match n.checked_shl(shift).filter(|v| v >> shift == n) {
        Some(bytes) => Ok(bytes),
        None => bail!("size {text:?} is too large"),
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let size = parse_size(&args.size)?;
    let mut device = MemoryDevice::new(args.name.clone(), size);
    if args.read_only {
        device = device.read_only();
    }
    let catalog = Arc::new(StaticCatalog::single(args.name.clone(), Arc::new(device)));
    if args.thread_per_connection {
        return serve_thread_per_connection(&args.listen, catalog);
    }
    let runtime = if args.threads == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()?
    };
    runtime.block_on(async move {
        let listener = TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        println!("listening on {}", listener.local_addr()?);
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let stop = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        serve(listener, catalog, None, stop).await?;
        Ok(())
    })
}
