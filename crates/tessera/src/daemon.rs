//! The daemon verbs: `tessera up` (a whole cluster in this process) and
//! `tessera node` (one host from its configuration file).
//!
//! Owns: turning the command line into the node library's configuration,
//! the async runtime, and the shutdown signal (Ctrl-C or SIGTERM). Must not
//! touch: what a host does; that is `tessera_node`'s.
//! Invariant: a signal asks for a clean shutdown once; the library finishes
//! in-flight work and returns, and only then does the process exit.

use crate::args::parse_size_arg;
use crate::client::CliError;
use clap::Args;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use tessera_node::up::UpConfig;

/// `tessera up` settings.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Directory for the hosts' devices and state, one subdirectory per host.
    #[arg(long, default_value = "./tessera-data")]
    pub data_dir: PathBuf,
    /// Address of host 1; host k binds this address + k-1.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: Ipv4Addr,
    /// Number of hosts.
    #[arg(long, default_value_t = 4)]
    pub hosts: usize,
    /// REST API port (on host 1).
    #[arg(long, default_value_t = 9480)]
    pub api_port: u16,
    /// NBD port (on every host).
    #[arg(long, default_value_t = 10809)]
    pub nbd_port: u16,
    /// iSCSI portal port (on every host).
    #[arg(long, default_value_t = 3260)]
    pub iscsi_port: u16,
    /// Host-to-host transport port (on every host).
    #[arg(long, default_value_t = 9500)]
    pub transport_port: u16,
    /// Seconds a host may be absent before its components are rebuilt elsewhere.
    #[arg(long, default_value_t = 3600)]
    pub repair_delay: u64,
    /// Capacity of each host's file-backed devices, e.g. 8G (a multiple of 4 KiB).
    #[arg(long, default_value = "8G", value_parser = parse_size_arg, allow_hyphen_values = true)]
    pub host_capacity: u64,
    /// Let `tessera fault` make devices fail, to see how the cluster copes
    /// (for test clusters: off unless given).
    #[arg(long)]
    pub fault_injection: bool,
    /// Encrypt the disk groups at rest (AES-256-XTS). On first start it
    /// makes a key encryption key in DATA_DIR/keys/kek; later starts use
    /// that key whenever the file is there.
    #[arg(long)]
    pub encrypt: bool,
    /// Encrypt the disk groups at rest with the key encryption key in this
    /// file (64 hexadecimal digits, mode 600) instead.
    #[arg(long, value_name = "FILE")]
    pub kek_file: Option<PathBuf>,
}

impl UpArgs {
    /// The node library's configuration for these settings.
    pub fn config(&self) -> UpConfig {
        UpConfig {
            data_dir: self.data_dir.clone(),
            bind: self.bind,
            hosts: self.hosts,
            api_port: self.api_port,
            nbd_port: self.nbd_port,
            iscsi_port: self.iscsi_port,
            transport_port: self.transport_port,
            repair_delay_s: self.repair_delay,
            host_capacity_bytes: self.host_capacity,
            fault_injection: self.fault_injection,
            kek_file: self.kek_file.clone().or_else(|| {
                let generated = tessera_node::up::default_kek_path(&self.data_dir);
                (self.encrypt || generated.exists()).then_some(generated)
            }),
        }
    }
}

/// `tessera node` settings.
#[derive(Debug, Args)]
pub struct NodeArgs {
    /// The host's configuration file (node.toml).
    #[arg(long)]
    pub config: PathBuf,
}

/// Runs `tessera up` until Ctrl-C or SIGTERM.
pub fn up(args: &UpArgs) -> Result<(), CliError> {
    let config = args.config();
    runtime()?.block_on(async move {
        tessera_node::up::run(config, shutdown_signal())
            .await
            .map_err(|e| CliError::Local(format!("tessera up: {e}")))
    })
}

/// Runs one host from its configuration file until Ctrl-C or SIGTERM.
pub fn node(args: &NodeArgs) -> Result<(), CliError> {
    let path = args.config.clone();
    runtime()?.block_on(async move {
        tessera_node::host::run_config_file(&path, shutdown_signal())
            .await
            .map_err(|e| CliError::Local(format!("tessera node {}: {e}", path.display())))
    })
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tessera")
        .build()
        .map_err(|e| CliError::Local(format!("cannot start the async runtime: {e}")))
}

/// Completes on the first Ctrl-C (SIGINT) or SIGTERM. The handlers are
/// installed when this is called, not when the future is first polled: a
/// daemon prints its banner before it waits, and a Ctrl-C that follows the
/// banner at once must still stop it cleanly. If a signal cannot be
/// watched, the other still works; if neither can, the future never
/// completes and the process ends only when killed.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let interrupt = signal(SignalKind::interrupt());
    let terminate = signal(SignalKind::terminate());
    async move {
        let wait = |s: std::io::Result<tokio::signal::unix::Signal>| async move {
            match s {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = wait(interrupt) => tracing::info!("Ctrl-C: shutting down"),
            () = wait(terminate) => tracing::info!("SIGTERM: shutting down"),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::args::{Cli, Command};
    use clap::Parser;
    use std::net::Ipv4Addr;
    use std::path::PathBuf;

    #[test]
    fn up_has_the_documented_defaults() {
        let cli = Cli::try_parse_from(["tessera", "up"]).expect("parses");
        let Command::Up(up) = cli.command else {
            panic!("not up");
        };
        let c = up.config();
        assert_eq!(c.data_dir, PathBuf::from("./tessera-data"));
        assert_eq!(c.bind, Ipv4Addr::LOCALHOST);
        assert_eq!(
            (
                c.hosts,
                c.api_port,
                c.nbd_port,
                c.transport_port,
                c.iscsi_port
            ),
            (4, 9480, 10809, 9500, 3260)
        );
        assert_eq!(c.repair_delay_s, 3600);
        assert_eq!(c.host_capacity_bytes, 8 << 30);
    }

    #[test]
    fn up_settings_reach_the_configuration() {
        let cli = Cli::try_parse_from([
            "tessera",
            "up",
            "--data-dir",
            "/tmp/d",
            "--bind",
            "127.0.1.1",
            "--hosts",
            "5",
            "--api-port",
            "1",
            "--nbd-port",
            "2",
            "--transport-port",
            "3",
            "--repair-delay",
            "4",
            "--host-capacity",
            "1G",
        ])
        .expect("parses");
        let Command::Up(up) = cli.command else {
            panic!("not up");
        };
        let c = up.config();
        assert_eq!(c.data_dir, PathBuf::from("/tmp/d"));
        assert_eq!(c.bind, Ipv4Addr::new(127, 0, 1, 1));
        assert_eq!(
            (
                c.hosts,
                c.api_port,
                c.nbd_port,
                c.transport_port,
                c.repair_delay_s
            ),
            (5, 1, 2, 3, 4)
        );
        assert_eq!(c.host_capacity_bytes, 1 << 30);
    }

    #[test]
    fn node_needs_its_config_file() {
        assert!(Cli::try_parse_from(["tessera", "node"]).is_err());
        let cli =
            Cli::try_parse_from(["tessera", "node", "--config", "node.toml"]).expect("parses");
        assert!(
            matches!(cli.command, Command::Node(n) if n.config == std::path::Path::new("node.toml"))
        );
    }
}
