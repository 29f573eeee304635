//! Serves one in-memory thin volume over iSCSI, for tests and benchmarks.
//!
//! Prints `listening on <address>` once the socket is bound, then serves
//! until SIGINT or SIGTERM. The target is
//! `iqn.2026-11.io.tessera:<name>`, LUN 0.

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::sync::Arc;
use tessera_blockdev::{BlockDevice, MemoryDevice};
use tessera_iscsi::scsi::{
    BlockTarget, LogicalUnit, MemoryDatastore, MemoryEnvironment, UnitSettings,
};
use tessera_iscsi::{
    serve, target_name_for_volume, ChapCredentials, ChapSecret, StaticCatalog, TargetEntry,
    TargetPortal,
};
use tokio::net::TcpListener;

#[derive(Parser)]
#[command(about = "Serve an in-memory volume over iSCSI")]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:3260")]
    listen: String,
    /// Volume size, with an optional K, M, G or T suffix (powers of 1024).
    #[arg(long, default_value = "1G")]
    size: String,
    /// Volume name; the target is iqn.2026-11.io.tessera:<name>.
    #[arg(long, default_value = "memory")]
    name: String,
    /// Logical block size: 512 (4 KiB physical blocks, "512e") or 4096
    /// ("4Kn").
    #[arg(long, default_value_t = 512, value_parser = parse_block_size)]
    block_size: u32,
    /// Runtime worker threads; 0 runs everything on one thread.
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Initiator names allowed in (repeat); none admits everyone.
    #[arg(long)]
    allow: Vec<String>,
    /// CHAP user the initiator must log in as.
    #[arg(long, requires = "chap_secret")]
    chap_user: Option<String>,
    /// CHAP secret of that user.
    #[arg(long)]
    chap_secret: Option<String>,
    /// CHAP user the target answers mutual CHAP with.
    #[arg(long, requires = "target_chap_secret")]
    target_chap_user: Option<String>,
    /// The target's mutual CHAP secret.
    #[arg(long)]
    target_chap_secret: Option<String>,
}

fn parse_block_size(text: &str) -> Result<u32, String> {
    match text {
        "512" => Ok(512),
        "4096" => Ok(4096),
        other => Err(format!(
            "{other} is not a block size this server serves: 512 or 4096"
        )),
    }
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
        let address = listener.local_addr()?;
        let device = MemoryDevice::new(args.name.clone(), size);
        let device: Arc<dyn BlockDevice> = Arc::new(if args.block_size == 4096 {
            device.with_4k_logical_blocks()
        } else {
            device
        });
        let datastore = MemoryDatastore::new();
        datastore.add(device.clone());
        let environment = Arc::new(MemoryEnvironment::new(datastore));
        let unit = Arc::new(LogicalUnit::new(
            device,
            environment,
            UnitSettings::default(),
        ));
        let target = Arc::new(BlockTarget::new());
        target.insert_unit(0, unit);
        let secret = |user: Option<String>, secret: Option<String>| {
            user.zip(secret).map(|(user, secret)| ChapSecret {
                user,
                secret: secret.into_bytes(),
            })
        };
        let catalog = Arc::new(StaticCatalog::new());
        catalog.insert(TargetEntry {
            name: target_name_for_volume(&args.name),
            alias: Some(args.name.clone()),
            device: target,
            portals: vec![TargetPortal {
                address: address.to_string(),
                portal_group_tag: 1,
            }],
            portal_group_tag: 1,
            relative_port: 1,
            initiators: if args.allow.is_empty() {
                tessera_iscsi::Initiators::Any
            } else {
                tessera_iscsi::Initiators::Only(args.allow.clone())
            },
            chap: ChapCredentials {
                initiator: secret(args.chap_user.clone(), args.chap_secret.clone()),
                target: secret(
                    args.target_chap_user.clone(),
                    args.target_chap_secret.clone(),
                ),
            },
            session_hold: None,
        });
        println!("listening on {address}");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let stop = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        serve(listener, catalog, stop).await?;
        Ok(())
    })
}
