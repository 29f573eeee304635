//! `tessera up`: a whole cluster in one process, on loopback.
//!
//! Owns: the layout of a local data directory (one subdirectory per host,
//! file-backed devices, the embedded directory database, the cluster CA and
//! certificates under `tls/`), the loopback addresses hosts bind (host k on
//! base+k-1), the `default` policy created on first start, and the API on
//! host 1, over HTTPS.
//! Invariant: starting again on the same data directory brings back the
//! same cluster, volumes, data and CA.

use crate::config::{
    DeviceConfig, DirectoryConfig, DiskGroupConfig, EncryptionConfig, HostConfig, TlsConfig,
};
use crate::control::{ClusterControl, ControlError, CreatePolicy};
use crate::control_plane::{ControlPlane, HostSet, HostSlot, HostStarter};
use crate::error::NodeError;
use crate::host::Host;
use crate::resync_board::ResyncBoard;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use tessera_env::SystemClock;
use tessera_types::{format_size, DiskGroupId, HostId};

/// Settings of `tessera up`.
#[derive(Clone, Debug)]
pub struct UpConfig {
    /// Where hosts keep their devices and the directory its database.
    pub data_dir: PathBuf,
    /// Address of host 1; host k binds this plus k-1.
    pub bind: Ipv4Addr,
    /// Number of hosts.
    pub hosts: usize,
    /// REST API port (host 1).
    pub api_port: u16,
    /// NBD port (every host).
    pub nbd_port: u16,
    /// iSCSI portal port (every host).
    pub iscsi_port: u16,
    /// Transport port (every host).
    pub transport_port: u16,
    /// Seconds a component may be absent before it is rebuilt elsewhere.
    pub repair_delay_s: u64,
    /// Capacity of each host's capacity device.
    pub host_capacity_bytes: u64,
    /// Whether hosts accept fault injection (devices made to fail on
    /// request); for test clusters.
    pub fault_injection: bool,
    /// Encryption at rest: the key encryption key's file for every host's
    /// disk groups. [`default_kek_path`] is made on first start if missing.
    pub kek_file: Option<PathBuf>,
}

/// Where `tessera up --encrypt` keeps the key encryption key it makes.
/// Beside the devices it is a convenience of a local cluster: a real
/// deployment keeps the key elsewhere (`[encryption] kek_file`).
pub fn default_kek_path(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("keys").join("kek")
}

/// Hosts `tessera up` can run: enough for FTT=3 (7 fault domains), few
/// enough for one machine.
pub const UP_HOSTS_MAX: usize = 16;

impl UpConfig {
    /// The cluster's TLS files (made by [`ensure_tls`]).
    fn credentials(&self) -> tessera_tls::ClusterCredentials {
        tessera_tls::ClusterCredentials::open(&tls_dir(&self.data_dir))
    }

    fn tls_config(&self) -> TlsConfig {
        let creds = self.credentials();
        TlsConfig {
            ca_cert: creds.ca_cert(),
            cert: creds.server_cert(),
            key: creds.server_key(),
            nbd_required: false,
            // The hosts of `tessera up` share one process: their traffic
            // never leaves it, so it is not encrypted.
            transport: false,
            secrets_key: Some(creds.secrets_key()),
        }
    }

    /// The addresses of every host.
    fn host_ips(&self) -> Vec<std::net::IpAddr> {
        (1..=self.hosts)
            .map(|k| Ipv4Addr::from(u32::from(self.bind) + k as u32 - 1).into())
            .collect()
    }

    fn host_config(&self, k: usize) -> HostConfig {
        let ip = Ipv4Addr::from(u32::from(self.bind) + k as u32 - 1);
        let dir = self.data_dir.join(format!("host-{k}"));
        HostConfig {
            cluster: "tessera".into(),
            id: HostId(format!("host-{k}")),
            fault_domain: None,
            transport_addr: SocketAddr::new(ip.into(), self.transport_port),
            nbd_addr: SocketAddr::new(ip.into(), self.nbd_port),
            iscsi_addr: Some(SocketAddr::new(ip.into(), self.iscsi_port)),
            api_addr: (k == 1).then(|| SocketAddr::new(ip.into(), self.api_port)),
            tls: Some(self.tls_config()),
            directory: DirectoryConfig::Embedded {
                path: self.data_dir.join("directory.redb"),
            },
            disk_groups: vec![DiskGroupConfig {
                id: DiskGroupId("dg0".into()),
                cache: DeviceConfig {
                    path: dir.join("cache.img"),
                    size_bytes: (self.host_capacity_bytes / 8).clamp(256 << 20, 4 << 30),
                },
                capacity: vec![DeviceConfig {
                    path: dir.join("capacity-0.img"),
                    size_bytes: self.host_capacity_bytes,
                }],
            }],
            lease_ttl_ms: 4_000,
            repair_delay_s: self.repair_delay_s,
            index_cache_bytes: 32 << 20,
            direct_io: false,
            fault_injection: self.fault_injection,
            encryption: self.kek_file.clone().map(|kek_file| EncryptionConfig {
                kek_file,
                retired_kek_files: Vec::new(),
            }),
        }
    }
}

/// Makes the key encryption key of `tessera up --encrypt` on first start.
fn ensure_kek(config: &UpConfig) -> Result<(), String> {
    let Some(path) = &config.kek_file else {
        return Ok(());
    };
    if path.exists() || *path != default_kek_path(&config.data_dir) {
        return Ok(());
    }
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("cannot restrict {}: {e}", dir.display()))?;
    tessera_store::KeyEncryptionKey::generate()
        .and_then(|k| k.save_new(path))
        .map_err(|e| e.to_string())
}

/// Runs the cluster until `shutdown` completes, then stops every host cleanly.
pub async fn run(
    config: UpConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), NodeError> {
    let control = start(&config).await?;
    let sampling = control.start_activity_sampling();
    match control
        .write_first_admin_token(&admin_token_path(&config.data_dir))
        .await
        .map_err(NodeError::Config)?
    {
        crate::control_plane::AdminTokenFile::Absent(path) => tracing::warn!(
            path = %path.display(),
            "the cluster has API tokens but this file is gone: the CLI needs TESSERA_TOKEN (an admin makes one with `tessera token create`)"
        ),
        other => tracing::info!(?other, "admin token"),
    }
    let api_addr = SocketAddr::new(config.bind.into(), config.api_port);
    let listener = tokio::net::TcpListener::bind(api_addr)
        .await
        .map_err(|e| NodeError::Serve {
            host: HostId("host-1".into()),
            what: "API listener",
            detail: format!("{api_addr}: {e}"),
        })?;
    let api_control: Arc<dyn ClusterControl> = Arc::clone(&control) as Arc<dyn ClusterControl>;
    let tls = config
        .tls_config()
        .server()
        .map_err(|e| NodeError::Config(format!("API certificate: {e}")))?;
    let api = tokio::spawn(async move {
        let served = crate::api::serve_tls(listener, tls, api_control, std::future::pending());
        if let Err(e) = served.await {
            tracing::error!(error = %e, "API server stopped");
        }
    });
    let warning = match device_room(&config) {
        Ok(room) => room_warning(&room, &config.data_dir),
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell how much room the hosts' devices have");
            None
        }
    };
    if let Some(warning) = &warning {
        tracing::warn!("{warning}");
    }
    print_banner(&config, warning.as_deref());
    shutdown.await;
    tracing::info!("shutting down: stopping every host cleanly");
    api.abort();
    sampling.abort();
    control.hosts().stop_all().await;
    Ok(())
}

/// Starts every host and creates the `default` policy on first start.
pub async fn start(config: &UpConfig) -> Result<Arc<ControlPlane>, NodeError> {
    // Refused before anything is made on disk.
    check_hosts(config).map_err(NodeError::Config)?;
    std::fs::create_dir_all(&config.data_dir).map_err(|e| {
        NodeError::Config(format!("cannot create {}: {e}", config.data_dir.display()))
    })?;
    let first = config.host_config(1);
    let directory = crate::host::open_directory(&first.directory, Arc::new(SystemClock::default()))
        .await
        .map_err(NodeError::Config)?;
    start_on(config, directory).await
}

/// The name the certificate `tessera up` makes for local NBD clients proves
/// (`tls/client/`).
pub const LOCAL_CLIENT_NAME: &str = "local-client";

/// Makes the cluster CA on first start, and the hosts' and the local
/// client's certificates whenever they are missing, close to expiry, or
/// (for the hosts') do not cover every host's address.
fn ensure_tls(config: &UpConfig) -> Result<(), String> {
    tessera_tls::ClusterCredentials::ensure(
        &tls_dir(&config.data_dir),
        "tessera",
        &config.host_ips(),
        LOCAL_CLIENT_NAME,
    )
    .map(|_| ())
    .map_err(|e| format!("cluster certificates: {e}"))
}

/// Where `tessera up` keeps the cluster CA and certificates.
pub fn tls_dir(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("tls")
}

/// Refuses a number of hosts `tessera up` cannot run.
fn check_hosts(config: &UpConfig) -> Result<(), String> {
    match config.hosts {
        1..=UP_HOSTS_MAX => Ok(()),
        n => Err(format!("--hosts must be 1 to {UP_HOSTS_MAX}, not {n}")),
    }
}

/// Starts every host on `directory` (the one `config` names, opened by
/// the caller) and creates the `default` policy on first start.
pub async fn start_on(
    config: &UpConfig,
    directory: Arc<dyn tessera_directory::Directory>,
) -> Result<Arc<ControlPlane>, NodeError> {
    check_hosts(config).map_err(NodeError::Config)?;
    ensure_tls(config).map_err(NodeError::Config)?;
    ensure_kek(config).map_err(NodeError::Config)?;
    let board = Arc::new(ResyncBoard::default());
    let mut slots = Vec::new();
    for k in 1..=config.hosts {
        let host_config = config.host_config(k);
        let runtime = HostRuntime::new(&host_config.id).map_err(|e| NodeError::Serve {
            host: host_config.id.clone(),
            what: "runtime",
            detail: e.to_string(),
        })?;
        let runtime = Arc::new(runtime);
        let host = runtime
            .start(
                host_config.clone(),
                Arc::clone(&directory),
                Arc::clone(&board),
            )
            .await?;
        let (dir, b) = (Arc::clone(&directory), Arc::clone(&board));
        let starter: HostStarter = Arc::new(move || {
            let (cfg, dir, b) = (host_config.clone(), Arc::clone(&dir), Arc::clone(&b));
            let runtime = Arc::clone(&runtime);
            Box::pin(async move { runtime.start(cfg, dir, b).await.map_err(|e| e.to_string()) })
        });
        slots.push(HostSlot {
            id: host.id().clone(),
            host: parking_lot::Mutex::new(Some(host)),
            starter: Some(starter),
            stopped: parking_lot::Mutex::new(None),
        });
    }
    let secrets = config.host_config(1).secrets().map_err(NodeError::Config)?;
    let control = Arc::new(
        ControlPlane::new(directory, "tessera", HostSet::new(slots), board).with_secrets(secrets),
    );
    let default = CreatePolicy {
        name: "default".into(),
        failures_to_tolerate: 1,
        stripe_width: 1,
        space_reservation_pct: 0,
        qos: Default::default(),
    };
    match control.create_policy(default).await {
        Ok(_) => tracing::info!("created policy default (FTT=1, RAID-1)"),
        Err(ControlError::Conflict(_)) => {}
        Err(e) => {
            return Err(NodeError::Config(format!(
                "creating the default policy: {e}"
            )))
        }
    }
    Ok(control)
}

/// The threads one host of `tessera up` runs on: a runtime of its own, as
/// a host on its own machine has. The store commits a lone write on the
/// calling thread (write and sync, ~100-200 us on a fast device); on a
/// runtime shared by every host, the thread blocked there was often the
/// only one watching the sockets, so the second copy's request to another
/// host waited for the first copy's sync and the two copies were written
/// one after the other instead of at once.
struct HostRuntime {
    runtime: Option<tokio::runtime::Runtime>,
}

/// Worker threads of one host's runtime.
const HOST_WORKER_THREADS: usize = 2;

impl HostRuntime {
    fn new(host: &HostId) -> std::io::Result<HostRuntime> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(HOST_WORKER_THREADS)
            .thread_name(host.to_string())
            .enable_all()
            .build()?;
        Ok(HostRuntime {
            runtime: Some(runtime),
        })
    }

    /// Starts a host whose tasks run on this runtime.
    async fn start(
        &self,
        config: HostConfig,
        directory: Arc<dyn tessera_directory::Directory>,
        board: Arc<ResyncBoard>,
    ) -> Result<Arc<Host>, NodeError> {
        let Some(runtime) = &self.runtime else {
            return Err(NodeError::Config("the host's runtime has stopped".into()));
        };
        let id = config.id.clone();
        runtime
            .spawn(Host::start(config, directory, board))
            .await
            .map_err(|e| NodeError::Serve {
                host: id,
                what: "start",
                detail: e.to_string(),
            })?
    }
}

impl Drop for HostRuntime {
    fn drop(&mut self) {
        // May be dropped on another runtime's thread, where a blocking
        // shutdown is not allowed; the hosts were stopped before.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Prints the banner on stdout (logs go to stderr), in one write, so a
/// reader of the pipe sees it whole; a warning goes under its first line.
fn print_banner(config: &UpConfig, warning: Option<&str>) {
    use std::io::Write;
    let mut text = banner(config);
    if let Some(warning) = warning {
        let first_line = text.find('\n').map_or(text.len(), |i| i + 1);
        text.insert_str(first_line, &format!("  Warning: {warning}\n"));
    }
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// How far the hosts' device files may still grow against the room their
/// file system has. The files are sparse: they take room as they are
/// written, and overwrites go to new blocks, so each tends to its full size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DeviceRoom {
    /// Bytes the device files can still grow by, all hosts together.
    growth_bytes: u64,
    /// Bytes free on the file system of the data directory.
    free_bytes: u64,
}

/// Measures [`DeviceRoom`] for the hosts of `config` (after they started,
/// so their files exist).
fn device_room(config: &UpConfig) -> std::io::Result<DeviceRoom> {
    let mut growth_bytes = 0u64;
    for k in 1..=config.hosts {
        for group in config.host_config(k).disk_groups {
            for device in std::iter::once(&group.cache).chain(&group.capacity) {
                let allocated = tessera_env::space::allocated_bytes(&device.path)?;
                growth_bytes += device.size_bytes.saturating_sub(allocated);
            }
        }
    }
    let free_bytes = tessera_env::space::free_bytes(&config.data_dir)?;
    Ok(DeviceRoom {
        growth_bytes,
        free_bytes,
    })
}

/// The warning (for the banner and the log) when the devices can outgrow
/// their file system: then writes fail once it is full, and the host whose
/// device could not grow marks that disk group failed.
fn room_warning(room: &DeviceRoom, data_dir: &std::path::Path) -> Option<String> {
    (room.growth_bytes > room.free_bytes).then(|| {
        format!(
            "the hosts' device files can still grow by {}, but the file system of {} has {} free. \
             When it is full, writes fail and the disk group whose device could not grow is marked failed: \
             free some room, or start with a smaller --host-capacity.",
            format_size(room.growth_bytes),
            data_dir.display(),
            format_size(room.free_bytes)
        )
    })
}

/// Where `tessera up` keeps its data unless told otherwise (relative to
/// the directory it runs in).
pub const DEFAULT_DATA_DIR: &str = "./tessera-data";

/// The file holding the admin token `tessera up` makes at a cluster's
/// first start, in its data directory.
pub fn admin_token_path(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("admin.token")
}

/// How to reach the cluster: the API, every host's NBD and iSCSI addresses,
/// the names volumes go by, and the commands to try next.
pub fn banner(config: &UpConfig) -> String {
    let api = format!("https://{}:{}", config.bind, config.api_port);
    // The CLI finds the API of a `tessera up` with the default settings by
    // itself; any other needs --api (or TESSERA_API).
    let cli = if config.bind == Ipv4Addr::LOCALHOST && config.api_port == 9480 {
        "tessera".to_string()
    } else {
        format!("tessera --api {api}")
    };
    let (ip, nbd, iscsi) = (config.bind, config.nbd_port, config.iscsi_port);
    let mut text = format!(
        "Tessera is up: {} hosts, {} of capacity each, data in {}\n",
        config.hosts,
        format_size(config.host_capacity_bytes),
        config.data_dir.display()
    );
    text += &format!("  API:     {api}   (the CLI: {cli} status; or set TESSERA_API={api})\n");
    text += &format!(
        "  Web:     {api}{}   (the dashboard: sign in with the token below; the browser must trust the CA below)\n",
        crate::dashboard::PATH
    );
    let token = admin_token_path(&config.data_dir);
    text += &if config.data_dir == std::path::Path::new(DEFAULT_DATA_DIR) {
        format!(
            "  Token:   {} (an admin's; the CLI reads it from there when run in this directory)\n",
            token.display()
        )
    } else {
        format!(
            "  Token:   {} (an admin's; for the CLI: export TESSERA_TOKEN_FILE={})\n",
            token.display(),
            token.display()
        )
    };
    let tls = tls_dir(&config.data_dir);
    text += &format!(
        "  TLS:     {} (the cluster CA; the CLI trusts it beside the token file)\n",
        tls.join("ca-cert.pem").display()
    );
    if let Some(kek) = &config.kek_file {
        text += &format!(
            "  At rest: new disk groups encrypted (AES-256-XTS); key encryption key in {}\n",
            kek.display()
        );
    }
    for k in 1..=config.hosts {
        let host_ip = Ipv4Addr::from(u32::from(config.bind) + k as u32 - 1);
        text += &format!(
            "  host-{k}:{:pad$}NBD {host_ip}:{nbd}   iSCSI portal {host_ip}:{iscsi}\n",
            "",
            pad = 3usize.saturating_sub(k.to_string().len()),
        );
    }
    text += &format!(
        "Every host serves every volume: over NBD as the export <volume> (nbd://{ip}:{nbd}/<volume>),\n\
         over iSCSI as the target iqn.2026-11.io.tessera:<volume>, LUN 0, through every host's portal.\n"
    );
    text += &format!("Create a volume:  {cli} volume create vm1 --size 10G\n");
    text += &format!(
        "Attach it:        nbdinfo nbd://{ip}:{nbd}/vm1   or   qemu-img info nbd://{ip}:{nbd}/vm1\n"
    );
    text += &format!(
        "Over TLS:         nbdinfo 'nbds://{ip}:{nbd}/vm1?tls-certificates={}'   (a client certificate of the cluster CA)\n",
        tls.join(tessera_tls::CLIENT_DIR).display()
    );
    text += &format!(
        "Or over iSCSI:    iscsi-ls -s iscsi://{ip}:{iscsi}   or   qemu-img info iscsi://{ip}:{iscsi}/iqn.2026-11.io.tessera:vm1/0\n"
    );
    text +=
        "                  (qemu-img reaches iscsi:// through Debian's qemu-block-extra package)\n";
    text +=
        &format!("Look around:      {cli} status   {cli} volume list   {cli} object show vm1\n");
    text += "No tessera on the PATH? cargo install --locked --path crates/tessera, or use target/release/tessera.\n";
    text += "Stop with Ctrl-C.\n";
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(bind: Ipv4Addr, api_port: u16) -> UpConfig {
        UpConfig {
            data_dir: PathBuf::from("./tessera-data"),
            bind,
            hosts: 4,
            api_port,
            nbd_port: 10809,
            iscsi_port: 3260,
            transport_port: 9500,
            repair_delay_s: 3600,
            host_capacity_bytes: 8 << 30,
            fault_injection: false,
            kek_file: None,
        }
    }

    #[test]
    fn devices_that_can_outgrow_their_file_system_are_warned_about() {
        let dir = std::path::Path::new("/srv/tessera");
        let short = DeviceRoom {
            growth_bytes: 40 << 30,
            free_bytes: 12 << 30,
        };
        let warning = room_warning(&short, dir).expect("a warning");
        assert!(warning.contains("can still grow by 40.0 GiB"), "{warning}");
        assert!(
            warning.contains("/srv/tessera has 12.0 GiB free"),
            "{warning}"
        );
        assert!(warning.contains("smaller --host-capacity"), "{warning}");
        let enough = DeviceRoom {
            growth_bytes: 12 << 30,
            free_bytes: 12 << 30,
        };
        assert_eq!(room_warning(&enough, dir), None);
    }

    #[test]
    fn the_room_of_sparse_devices_is_what_they_can_still_grow_by() {
        let data = tempfile::tempdir().unwrap();
        let mut cfg = config(Ipv4Addr::LOCALHOST, 9480);
        cfg.data_dir = data.path().to_path_buf();
        cfg.hosts = 2;
        cfg.host_capacity_bytes = 1 << 30;
        let mut full = 0;
        for k in 1..=cfg.hosts {
            for group in cfg.host_config(k).disk_groups {
                for device in std::iter::once(&group.cache).chain(&group.capacity) {
                    std::fs::create_dir_all(device.path.parent().unwrap()).unwrap();
                    let file = std::fs::File::create(&device.path).unwrap();
                    file.set_len(device.size_bytes).unwrap();
                    full += device.size_bytes;
                }
            }
        }
        // Host 1's capacity device gets 8 MiB written.
        let written = 8 << 20;
        std::fs::write(
            data.path().join("host-1/capacity-0.img"),
            vec![7u8; written],
        )
        .unwrap();
        let first = cfg.host_config(1).disk_groups[0].capacity[0].clone();
        std::fs::File::options()
            .write(true)
            .open(&first.path)
            .unwrap()
            .set_len(first.size_bytes)
            .unwrap();
        let room = device_room(&cfg).unwrap();
        assert!(
            room.growth_bytes <= full - written as u64 && room.growth_bytes > full - (16 << 20),
            "{room:?} of {full}"
        );
        assert!(room.free_bytes > 0);
    }

    #[test]
    fn the_banner_says_how_to_connect_over_the_api_nbd_and_iscsi() {
        let text = banner(&config(Ipv4Addr::LOCALHOST, 9480));
        for expected in [
            "Tessera is up: 4 hosts, 8.0 GiB of capacity each, data in ./tessera-data\n",
            "  API:     https://127.0.0.1:9480   (the CLI: tessera status;",
            "  TLS:     ./tessera-data/tls/ca-cert.pem",
            "nbds://127.0.0.1:10809/vm1?tls-certificates=./tessera-data/tls/client'",
            "  host-4:  NBD 127.0.0.4:10809   iSCSI portal 127.0.0.4:3260\n",
            "over iSCSI as the target iqn.2026-11.io.tessera:<volume>, LUN 0",
            "Create a volume:  tessera volume create vm1 --size 10G\n",
            "qemu-img info iscsi://127.0.0.1:3260/iqn.2026-11.io.tessera:vm1/0",
            "Debian's qemu-block-extra package",
        ] {
            assert!(text.contains(expected), "lacks {expected:?}:\n{text}");
        }
        assert!(text.ends_with("Stop with Ctrl-C.\n"), "{text}");
    }

    #[test]
    fn away_from_the_default_api_the_commands_carry_api() {
        let text = banner(&config(Ipv4Addr::new(127, 0, 1, 1), 9480));
        assert!(
            text.contains("Create a volume:  tessera --api https://127.0.1.1:9480 volume create"),
            "{text}"
        );
        let text = banner(&config(Ipv4Addr::LOCALHOST, 19480));
        assert!(
            text.contains("tessera --api https://127.0.0.1:19480 status"),
            "{text}"
        );
    }
}
