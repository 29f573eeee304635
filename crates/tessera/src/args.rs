//! The command line: every verb, its arguments and their parsing.
//!
//! Owns: the grammar of `tessera` (clap derive) and the conversion of human
//! sizes into bytes. Must not touch: the network or the engine; a parsed
//! [`Cli`] is plain data.
//! Invariant: a size the user typed is turned into bytes here, once, with
//! [`tessera_types::parse_size`] (exact, no rounding), and must be a
//! positive multiple of 4 KiB; a bad size is a usage error (exit 2) and no
//! request is sent.

use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// Where the CLI looks for the API when neither `--api` nor `TESSERA_API`
/// says: host 1 of a `tessera up` cluster on this machine.
pub const DEFAULT_API_URL: &str = "https://127.0.0.1:9480";

/// Tessera: hyperconverged block storage. Hosts pool their disks into one
/// datastore of mirrored, checksummed, thin block volumes served over NBD
/// and iSCSI.
#[derive(Debug, Parser)]
#[command(name = "tessera", version)]
pub struct Cli {
    /// URL of the REST API (default https://127.0.0.1:9480).
    #[arg(long, global = true, env = "TESSERA_API", default_value = DEFAULT_API_URL)]
    pub api: String,

    /// Print the API's JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    /// API token to present (else TESSERA_TOKEN, else the file of
    /// --token-file, else ./tessera-data/admin.token if there).
    #[arg(long, global = true, env = "TESSERA_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// File holding the API token (`tessera up` writes its admin token to
    /// DATA_DIR/admin.token).
    #[arg(long, global = true, env = "TESSERA_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,

    /// CA certificate the API's HTTPS certificate must chain to (else
    /// tls/ca-cert.pem beside the token file, else
    /// ./tessera-data/tls/ca-cert.pem if there, else the system's roots).
    #[arg(long, global = true, env = "TESSERA_CA_CERT")]
    pub ca_cert: Option<std::path::PathBuf>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// What clients do to each volume and host, live, like esxtop: IOPS,
    /// MB/s, latency at the owner, queue, errors and the VAAI offloads.
    Top {
        /// Batch mode: CSV on stdout (a header, then one row per volume and
        /// per host each interval), as `esxtop -b`.
        #[arg(short = 'b', long)]
        batch: bool,
        /// Seconds between samples.
        #[arg(
            short = 'd',
            long = "delay",
            value_name = "SECONDS",
            default_value_t = 2,
            value_parser = clap::value_parser!(u64).range(1..=3600)
        )]
        delay: u64,
        /// Intervals to show, then exit (default: until Ctrl-C).
        #[arg(short = 'n', long = "iterations", value_name = "COUNT",
              value_parser = clap::value_parser!(u64).range(1..))]
        iterations: Option<u64>,
    },
    /// Health, capacity, hosts, volumes and resyncs of the cluster
    /// (`--watch`: again and again until Ctrl-C).
    Status {
        /// How often to print it again.
        #[command(flatten)]
        every: Watch,
    },
    /// Each problem of the cluster with a stable code, what it affects and
    /// what to do (exits 1 when any is an error).
    Health,
    /// Cluster settings: thin-provisioning limits and thresholds.
    #[command(subcommand)]
    Settings(SettingsCommand),
    /// Hosts: list them, or stop and start one (in `tessera up`).
    #[command(subcommand)]
    Host(HostCommand),
    /// Storage policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Volumes.
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// Snapshots of volumes: crash-consistent points in time, taken while
    /// clients write, each served read-only as the NBD export
    /// `volume@snapshot`.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// A volume's object: its component tree, and a comparison of its copies.
    #[command(subcommand)]
    Object(ObjectCommand),
    /// Resyncs and rebuilds with their progress.
    #[command(subcommand)]
    Resync(ResyncCommand),
    /// Scrubbing: every stored block verified against its checksum on a
    /// schedule, bad blocks rewritten from another copy.
    #[command(subcommand)]
    Scrub(ScrubCommand),
    /// Disk groups: emptying one before maintenance.
    #[command(subcommand)]
    DiskGroup(DiskGroupCommand),
    /// Encryption at rest: which disk groups are encrypted, under which
    /// key, and rekeying them.
    #[command(subcommand)]
    Encryption(EncryptionCommand),
    /// Inject faults into a test cluster's hosts (`tessera up
    /// --fault-injection`; refused by any other cluster).
    #[command(subcommand)]
    Fault(FaultCommand),
    /// API tokens: who may call the API, and as what (viewer, operator or
    /// admin).
    #[command(subcommand)]
    Token(TokenCommand),
    /// The latest changes asked of the API: who (which token), what, when
    /// and how each ended, refused ones included (admins only).
    Audit {
        /// How many of the latest changes to show.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// What the cluster did and why, oldest first: owners taken at an
    /// epoch, hosts found absent, resyncs and rebuilds started and ended,
    /// leases lost, and the changes asked of the API with who asked.
    Events {
        /// How many of the latest events to show.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Keep printing new events as they happen, until Ctrl-C.
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Offline tools for a host's devices.
    #[command(subcommand)]
    Store(StoreCommand),
    /// Run a whole cluster in this process on file-backed devices.
    Up(crate::daemon::UpArgs),
    /// Run one host from its configuration file.
    Node(crate::daemon::NodeArgs),
}

/// `tessera token ...`
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a token; it is printed this once (keep it in TESSERA_TOKEN or
    /// a 0600 file named by TESSERA_TOKEN_FILE).
    Create {
        /// What it is for (1 to 64 letters, digits, '.', '_', '-' or '@').
        name: String,
        /// viewer (reads), operator (also manages volumes and snapshots)
        /// or admin (also manages hosts, policies, settings and tokens).
        #[arg(long)]
        role: String,
        /// How long it is accepted, e.g. 90d, 12h, 30m or 3600s (default:
        /// until revoked).
        #[arg(long, value_parser = parse_duration_arg)]
        expires_in: Option<u64>,
    },
    /// Every token: id, name, role, when made and until when (no secrets).
    List,
    /// Revoke a token: it is refused from the next request on.
    Revoke {
        /// The token's id (`token list`).
        id: String,
    },
}

/// Parses a duration such as `90d`, `12h`, `30m`, `45s` or `3600` into
/// seconds.
pub fn parse_duration_arg(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "{text:?}: a duration is a number and s, m, h or d, e.g. 90d"
            ))
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?}: a duration is a number and s, m, h or d, e.g. 90d"))?;
    if n == 0 {
        return Err(format!("{text:?}: a token must last more than no time"));
    }
    n.checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// `tessera snapshot ...`
#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Take a snapshot of a volume now (its clients go on writing).
    Create {
        /// Volume name.
        volume: String,
        /// Snapshot name: 1 to 64 letters, digits, '.', '_' or '-'.
        name: String,
        /// Other volumes of a consistency group (comma-separated, or the
        /// option repeated): each gets a snapshot of the same name, all at
        /// one point in time (a database and its log on separate volumes).
        #[arg(long, value_delimiter = ',', value_name = "VOLUME")]
        group: Vec<String>,
    },
    /// A volume's snapshots, oldest first.
    List {
        /// Volume name.
        volume: String,
    },
    /// Delete a snapshot; the volume and its other snapshots stay as they
    /// are.
    Delete {
        /// Volume name.
        volume: String,
        /// Snapshot name.
        name: String,
    },
}

/// `tessera host ...`
#[derive(Debug, Subcommand)]
pub enum HostCommand {
    /// Hosts with their state, addresses and disk groups.
    List,
    /// One host with its disk groups.
    Show {
        /// Host id, e.g. host-2.
        host: String,
    },
    /// Stop one host's services, as a failure would (only in `tessera up`).
    Stop {
        /// Host id, e.g. host-2.
        host: String,
    },
    /// Start a stopped host again (only in `tessera up`).
    Start {
        /// Host id, e.g. host-2.
        host: String,
    },
    /// Empty a host before maintenance: nothing new is placed on it and
    /// every component on it is copied elsewhere, then dropped, keeping
    /// each volume's protection; refused when the rest cannot hold it.
    Evacuate {
        /// Host id, e.g. host-2.
        host: String,
        /// End the evacuation: the host takes new components again.
        #[arg(long)]
        end: bool,
    },
}

/// `tessera disk-group ...`
#[derive(Debug, Subcommand)]
pub enum DiskGroupCommand {
    /// Empty one disk group of a host before maintenance (as `host
    /// evacuate`, for that disk group only); `host evacuate HOST --end`
    /// ends it.
    Evacuate {
        /// Host id, e.g. host-2.
        host: String,
        /// The disk group, e.g. dg0.
        disk_group: String,
    },
}

/// `tessera encryption ...`
#[derive(Debug, Subcommand)]
pub enum EncryptionCommand {
    /// Every disk group's encryption: cipher, the key encryption key that
    /// seals its data key, the data key's generation, a deep rekey's
    /// progress.
    List,
    /// Rekey a host's encrypted disk groups with the key files of its
    /// configuration, read now. Shallow (the default): each data key is
    /// sealed again with the current key encryption key, in an instant.
    /// Deep: every block is also rewritten under a new data key, in the
    /// background, while volumes stay in use.
    Rekey {
        /// Host id, e.g. host-2.
        host: String,
        /// Rewrite every block under a new data key.
        #[arg(long)]
        deep: bool,
        /// Only this disk group.
        #[arg(long, value_name = "DG")]
        disk_group: Option<String>,
        /// With --deep: wait until the rewrite is done, printing progress.
        #[arg(long)]
        wait: bool,
    },
}

/// `tessera scrub ...`
#[derive(Debug, Subcommand)]
pub enum ScrubCommand {
    /// Each disk group's scrubbing: the pass under way or the last one,
    /// bad blocks found and repaired, when the next pass starts.
    List,
    /// Start a pass of every disk group of a host now (at 100 MiB/s).
    Start {
        /// Host id, e.g. host-2.
        host: String,
    },
}

/// `tessera fault ...`
#[derive(Debug, Subcommand)]
pub enum FaultCommand {
    /// Make one device of a host's disk group fail from now on, as a device
    /// that dies does: the cache device takes the whole disk group with it,
    /// a capacity device the components on it; their copies are rebuilt
    /// elsewhere at once.
    FailDevice {
        /// Host id, e.g. host-2.
        host: String,
        /// The disk group, e.g. dg0.
        #[arg(long, default_value = "dg0")]
        disk_group: String,
        /// 0 for the cache device, 1 and up for the capacity devices.
        #[arg(long)]
        device: usize,
    },
    /// Flip one bit of a stored 4 KiB block of a volume's copy on a host,
    /// past its checksum, as a latent media error does: reads and scrubs
    /// find it and the block is rewritten from another copy.
    CorruptBlock {
        /// Host id, e.g. host-2.
        host: String,
        /// The volume.
        #[arg(long)]
        volume: String,
        /// The block (4 KiB) in the copy's address space.
        #[arg(long)]
        block: u64,
    },
    /// Delay every frame a host sends to a peer (to every other host
    /// without --peer): a slow or distant link.
    Delay {
        /// Host id, e.g. host-2.
        host: String,
        /// Only frames to this host.
        #[arg(long)]
        peer: Option<String>,
        /// Fixed delay per frame in milliseconds (at most 60000).
        #[arg(long)]
        ms: u64,
        /// Further random delay per frame, up to this many milliseconds.
        #[arg(long, default_value_t = 0)]
        jitter_ms: u64,
    },
    /// Lose frames a host sends to a peer (every other host without
    /// --peer), each with the chance given.
    Drop {
        /// Host id, e.g. host-2.
        host: String,
        /// Only frames to this host.
        #[arg(long)]
        peer: Option<String>,
        /// Chance of loss per frame, 0 to 100 percent.
        #[arg(long)]
        percent: u8,
    },
    /// Cut the data path between a host and a peer (every other host
    /// without --peer), both ways.
    Partition {
        /// Host id, e.g. host-2.
        host: String,
        /// Only the link to this host.
        #[arg(long)]
        peer: Option<String>,
    },
    /// End every network fault set on a host.
    Heal {
        /// Host id, e.g. host-2.
        host: String,
    },
}

/// `tessera policy ...`
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Create a RAID-1 policy.
    Create {
        /// Policy name.
        name: String,
        /// Failures to tolerate (0-3): FTT+1 copies of the data.
        #[arg(long)]
        ftt: u8,
        /// Columns each copy is striped across (1-12).
        #[arg(long, default_value_t = 1)]
        stripe_width: u8,
        /// Percent of a volume's size reserved up front (0 = thin, 100 = thick).
        #[arg(long, default_value_t = 0)]
        space_reservation: u8,
        #[command(flatten)]
        qos: QosArgs,
    },
    /// All policies.
    List,
    /// One policy.
    Show {
        /// Policy name.
        name: String,
    },
    /// Change a policy no volume uses (the options given replace the
    /// current values).
    Set {
        /// Policy name.
        name: String,
        /// Failures to tolerate (0-3).
        #[arg(long)]
        ftt: Option<u8>,
        /// Columns each copy is striped across (1-12).
        #[arg(long)]
        stripe_width: Option<u8>,
        /// Percent of a volume's size reserved up front.
        #[arg(long)]
        space_reservation: Option<u8>,
        #[command(flatten)]
        qos: QosArgs,
    },
    /// Delete a policy no volume uses.
    Delete {
        /// Policy name.
        name: String,
    },
}

/// A policy's QoS on the command line: each volume's limits and minimum,
/// enforced by its owner (0 removes one).
#[derive(Debug, Default, Clone, Copy, clap::Args)]
pub struct QosArgs {
    /// Operations per second each volume may not exceed (0: no limit).
    #[arg(long)]
    pub iops_limit: Option<u32>,
    /// MiB per second each volume may not exceed (0: no limit).
    #[arg(long, value_name = "MIB_S")]
    pub bandwidth_limit: Option<u32>,
    /// Operations per second each volume keeps however busy its owner is
    /// (0: none).
    #[arg(long)]
    pub iops_minimum: Option<u32>,
}

impl QosArgs {
    /// Whether any option was given.
    pub fn any(&self) -> bool {
        self.iops_limit.is_some() || self.bandwidth_limit.is_some() || self.iops_minimum.is_some()
    }

    /// The options given, as the API's `qos` object.
    pub fn json(&self) -> serde_json::Value {
        let mut qos = serde_json::Map::new();
        if let Some(v) = self.iops_limit {
            qos.insert("iops_limit".into(), v.into());
        }
        if let Some(v) = self.bandwidth_limit {
            qos.insert("bandwidth_limit_mib_s".into(), v.into());
        }
        if let Some(v) = self.iops_minimum {
            qos.insert("iops_minimum".into(), v.into());
        }
        serde_json::Value::Object(qos)
    }
}

/// `tessera volume ...`
#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Take a volume back to one of its snapshots (refused while a client
    /// has it open): what was written since is gone; the snapshots stay.
    Revert {
        /// Volume name.
        name: String,
        /// The snapshot.
        #[arg(long)]
        to: String,
    },
    /// A new volume from a snapshot. A linked clone is made at once: it
    /// holds what the snapshot holds and shares its blocks until written.
    /// With --full, an independent copy placed by its policy, filled in the
    /// background (the command waits and shows the progress unless
    /// --no-wait). Either stays whole when the snapshot or its volume is
    /// deleted.
    Clone {
        /// The new volume's name.
        name: String,
        /// The snapshot, as VOLUME@SNAPSHOT.
        #[arg(long)]
        from: String,
        /// A full clone: a copy of the snapshot that shares no stored block
        /// with it, on any hosts and disk groups its policy's placement
        /// picks; it serves clients once it is filled.
        #[arg(long)]
        full: bool,
        /// The full clone's policy (the source volume's by default).
        #[arg(long, requires = "full")]
        policy: Option<String>,
        /// Return once the full clone is made, without waiting for its
        /// fill (`tessera volume show NAME` shows the progress).
        #[arg(long, requires = "full")]
        no_wait: bool,
    },
    /// Create a volume: its name is its NBD export name and the suffix of
    /// its iSCSI target, iqn.2026-11.io.tessera:NAME.
    Create {
        /// Volume name.
        name: String,
        /// Size, e.g. 10G, 512M, 1.5T (binary units, K = 1024): a positive
        /// multiple of 4 KiB.
        #[arg(long, value_parser = parse_size_arg, allow_hyphen_values = true)]
        size: u64,
        /// Policy name (default: the policy `default`).
        #[arg(long)]
        policy: Option<String>,
        /// Logical block size the volume presents: 512 (over 4 KiB physical
        /// blocks, "512e", the default) or 4096 ("4Kn").
        #[arg(long, value_parser = parse_block_size_arg)]
        block_size: Option<u32>,
    },
    /// All volumes with size, policy, block size, state, used bytes and owner.
    List,
    /// Grow a volume.
    Resize {
        /// Volume name.
        name: String,
        /// New size, e.g. 20G (a positive multiple of 4 KiB).
        #[arg(long, value_parser = parse_size_arg, allow_hyphen_values = true)]
        size: u64,
    },
    /// Rename a volume no client has open (its NBD export and iSCSI
    /// target take the new name; data and settings stay).
    Rename {
        /// Current name.
        name: String,
        /// New name.
        new_name: String,
    },
    /// One volume: size, policy, state, used bytes, owner, clients.
    Show {
        /// Volume name.
        name: String,
    },
    /// Delete a volume and its components. Refused while clients (NBD
    /// connections, iSCSI sessions) have it open, unless --force.
    Delete {
        /// Volume name.
        name: String,
        /// Delete even though clients have it open: their next request
        /// fails at once.
        #[arg(long)]
        force: bool,
    },
    /// Show or set who may use a volume over iSCSI and NBD (every host,
    /// its snapshots too): with no option, shows the settings; with any,
    /// replaces them. Settings that name anyone admit nobody else on
    /// either frontend.
    Access {
        /// Volume name.
        name: String,
        /// Admit only these initiator names (repeat for several).
        #[arg(long = "allow", value_name = "IQN")]
        allow: Vec<String>,
        /// Require CHAP with this user name.
        #[arg(long, requires = "chap_secret")]
        chap_user: Option<String>,
        /// The CHAP secret (12 to 255 characters).
        #[arg(long, env = "TESSERA_CHAP_SECRET", hide_env_values = true)]
        chap_secret: Option<String>,
        /// Mutual CHAP: the user name the target answers as.
        #[arg(long, requires_all = ["target_chap_secret", "chap_user"])]
        target_chap_user: Option<String>,
        /// Mutual CHAP: the target's secret (different from the initiator's).
        #[arg(long, env = "TESSERA_TARGET_CHAP_SECRET", hide_env_values = true)]
        target_chap_secret: Option<String>,
        /// Admit this NBD client, by the name its TLS client certificate
        /// (from the cluster CA) proves (repeat for several).
        #[arg(long = "nbd-client", value_name = "NAME")]
        nbd_clients: Vec<String>,
        /// Where NBD clients without a certificate may connect from while
        /// the settings name nobody: loopback (the default), anywhere or
        /// nowhere.
        #[arg(long, value_name = "WHERE", value_parser = ["loopback", "anywhere", "nowhere"])]
        plain_nbd: Option<String>,
        /// Admit every initiator without CHAP and plain NBD clients from
        /// loopback (clears every setting).
        #[arg(long, conflicts_with_all = ["allow", "chap_user", "target_chap_user", "nbd_clients", "plain_nbd"])]
        open: bool,
    },
}

/// `tessera object ...`
#[derive(Debug, Subcommand)]
pub enum ObjectCommand {
    /// The component tree: columns, copies, witnesses.
    Show {
        /// Volume name.
        name: String,
    },
    /// Compare every active copy block by block; exits 1 if they differ.
    Verify {
        /// Volume name.
        name: String,
    },
}

/// `tessera settings ...`
#[derive(Debug, Subcommand)]
pub enum SettingsCommand {
    /// Every setting with its value, default and meaning (`--host`: the
    /// values that host follows, and which are its own).
    #[command(visible_alias = "list")]
    Show {
        /// A host, for the values it follows.
        #[arg(long, value_name = "HOST")]
        host: Option<String>,
    },
    /// One setting with its value, default and meaning (`--json`: the
    /// value alone, as the API holds it).
    Get {
        /// Setting name.
        name: String,
        /// A host, for the value it follows.
        #[arg(long, value_name = "HOST")]
        host: Option<String>,
    },
    /// Change one setting: max_overcommit_ratio, nearly_full_pct, full_pct,
    /// read_cache_bytes (a size, 0 to disable, or `default`),
    /// index_cache_bytes (a size, or `default`: each host's configured
    /// budget), index_prefetch_bytes (a size, 0 turns read-ahead off),
    /// scrub_period_h (hours, 0 to turn the scheduled scrub off),
    /// resync_delay_multiplier (1-256: how much resync yields to guests),
    /// repair_delay_s (seconds before an absent copy is rebuilt elsewhere,
    /// or `default`), lease_ttl_ms (milliseconds a silent host keeps its
    /// volumes, or `default`), vaai_ats, vaai_xcopy, vaai_write_same, vaai_unmap
    /// (on or off: the VAAI offloads iSCSI units offer). With `--host`, for
    /// that host alone (the caches, scrub, resync multiplier and VAAI
    /// settings may differ per host).
    Set {
        /// Setting name.
        name: String,
        /// New value.
        value: String,
        /// A host, to set its own value.
        #[arg(long, value_name = "HOST")]
        host: Option<String>,
    },
    /// Put one setting back to its default; with `--host`, make that host
    /// follow the cluster's value again.
    Reset {
        /// Setting name.
        name: String,
        /// A host whose own value goes.
        #[arg(long, value_name = "HOST")]
        host: Option<String>,
    },
}

/// `tessera resync ...`
#[derive(Debug, Subcommand)]
pub enum ResyncCommand {
    /// Running and recent resyncs and rebuilds with bytes done, bytes left,
    /// bytes copied, rate and time left; one row per component.
    /// With `--watch`, until no resync is running or waiting to retry.
    List {
        /// How often to print it again.
        #[command(flatten)]
        every: Watch,
    },
}

/// `--watch [SECONDS]` of a listing a user follows.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Watch {
    /// Print again every SECONDS (default 2); Ctrl-C stops.
    #[arg(
        long,
        value_name = "SECONDS",
        num_args = 0..=1,
        default_missing_value = "2",
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub watch: Option<u64>,
}

/// `tessera store ...`
#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Check one disk group's devices offline (the host must be stopped);
    /// exits 1 if problems are found.
    Check {
        /// The disk group's devices (cache and capacity), in any order.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Key file of the key encryption key that seals an encrypted
        /// group's data key (the host's `[encryption] kek_file`).
        #[arg(long, value_name = "FILE")]
        kek_file: Option<PathBuf>,
    },
}

/// Parses a logical block size for clap: 512 or 4096.
pub fn parse_block_size_arg(text: &str) -> Result<u32, String> {
    match text {
        "512" => Ok(512),
        "4096" => Ok(4096),
        other => Err(format!(
            "{other} is not a block size a volume can present: 512 (512e) or 4096 (4Kn)"
        )),
    }
}

/// Parses a size for clap: a human size ([`tessera_types::parse_size`])
/// that is a positive multiple of 4 KiB, since volumes and devices are
/// stored in 4 KiB blocks. Each refusal names what was typed.
pub fn parse_size_arg(text: &str) -> Result<u64, String> {
    let bytes = tessera_types::parse_size(text).map_err(|e| e.to_string())?;
    let block = tessera_types::BLOCK_BYTES;
    if bytes == 0 {
        return Err(format!(
            "{text:?} is zero bytes: a size must be at least 4K ({block} bytes)"
        ));
    }
    let below = bytes - bytes % block;
    if below != bytes {
        let nearest = match below.checked_add(block) {
            Some(above) if below > 0 => format!("sizes are {below} and {above} bytes"),
            Some(above) => format!("size is {above} bytes"),
            None => format!("size is {below} bytes"),
        };
        return Err(format!(
            "{text:?} is {bytes} bytes, not a multiple of 4K ({block} bytes), the block size \
             Tessera stores; the nearest valid {nearest}"
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("tessera").chain(args.iter().copied()))
    }

    #[test]
    fn the_grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_names_both_protocols_and_the_iscsi_target() {
        let help = Cli::command().render_help().to_string();
        assert!(help.contains("served over NBD and iSCSI"), "{help}");
        let mut command = Cli::command();
        let create = command
            .find_subcommand_mut("volume")
            .and_then(|v| v.find_subcommand_mut("create"))
            .expect("volume create");
        let help = create.render_help().to_string();
        assert!(help.contains("iqn.2026-11.io.tessera:NAME"), "{help}");
    }

    #[test]
    fn volume_create_reads_sizes_with_units() {
        let cli = parse(&[
            "volume", "create", "vol1", "--size", "10G", "--policy", "gold",
        ])
        .expect("parses");
        match cli.command {
            Command::Volume(VolumeCommand::Create {
                name, size, policy, ..
            }) => {
                assert_eq!(name, "vol1");
                assert_eq!(size, 10 << 30);
                assert_eq!(policy.as_deref(), Some("gold"));
            }
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn volume_create_takes_a_block_size_of_512_or_4096_only() {
        let cli = parse(&[
            "volume",
            "create",
            "vol1",
            "--size",
            "1G",
            "--block-size",
            "4096",
        ])
        .expect("parses");
        match cli.command {
            Command::Volume(VolumeCommand::Create { block_size, .. }) => {
                assert_eq!(block_size, Some(4096));
            }
            other => panic!("parsed as {other:?}"),
        }
        let e = parse(&[
            "volume",
            "create",
            "vol1",
            "--size",
            "1G",
            "--block-size",
            "1024",
        ])
        .expect_err("refused");
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("512 (512e) or 4096 (4Kn)"), "{e}");
    }

    #[test]
    fn a_bad_size_is_a_usage_error_that_names_the_forms() {
        let e = parse(&["volume", "create", "vol1", "--size", "ten"]).expect_err("refused");
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("10G"), "{e}");
    }

    /// The message clap prints for `volume create v --size SIZE`.
    fn size_refusal(size: &str) -> String {
        let e = parse(&["volume", "create", "v", "--size", size]).expect_err(size);
        assert_eq!(e.exit_code(), 2, "{size}: {e}");
        e.to_string()
    }

    #[test]
    fn sizes_are_exact_and_refusals_say_what_is_wrong() {
        for (text, bytes) in [("1.5G", 1_610_612_736), ("4096", 4096), ("0.5M", 512 << 10)] {
            match parse(&["volume", "resize", "v", "--size", text]).map(|c| c.command) {
                Ok(Command::Volume(VolumeCommand::Resize { size, .. })) => {
                    assert_eq!(size, bytes, "{text}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        for (text, message) in [
            ("1.5", "is 1.5 bytes, not a whole number of bytes"),
            ("0.1K", "is 102.4 bytes, not a whole number of bytes"),
            ("-5G", "a size cannot be negative"),
            ("99999999T", "is too large: the largest size is 18446744073709551615 bytes"),
            ("18446744073709551616", "is too large"),
            ("0", "\"0\" is zero bytes: a size must be at least 4K (4096 bytes)"),
            ("0G", "is zero bytes"),
            ("1000", "\"1000\" is 1000 bytes, not a multiple of 4K (4096 bytes), the block size Tessera stores; the nearest valid size is 4096 bytes"),
            ("1.5K", "\"1.5K\" is 1536 bytes, not a multiple of 4K"),
            ("10001", "the nearest valid sizes are 8192 and 12288 bytes"),
            ("18446744073709551615", "the nearest valid size is 18446744073709547520 bytes"),
        ] {
            let e = size_refusal(text);
            assert!(e.contains(message), "{text}: {e}");
            assert!(e.contains(&format!("invalid value '{text}' for '--size <SIZE>'")), "{e}");
        }
        let e = parse(&["up", "--host-capacity", "-1G"]).expect_err("negative");
        assert!(e.to_string().contains("cannot be negative"), "{e}");
    }

    #[test]
    fn policy_create_has_defaults_for_width_and_reservation() {
        let cli = parse(&["policy", "create", "gold", "--ftt", "2"]).expect("parses");
        match cli.command {
            Command::Policy(PolicyCommand::Create {
                name,
                ftt,
                stripe_width,
                space_reservation,
                qos,
            }) => {
                assert_eq!((name.as_str(), ftt), ("gold", 2));
                assert_eq!((stripe_width, space_reservation), (1, 0));
                assert!(!qos.any(), "no QoS unless asked");
            }
            other => panic!("parsed as {other:?}"),
        }
        assert!(
            parse(&["policy", "create", "gold"]).is_err(),
            "--ftt is required"
        );
    }

    #[test]
    fn policy_qos_options_become_the_apis_qos_object() {
        let cli = parse(&[
            "policy",
            "set",
            "gold",
            "--iops-limit",
            "2000",
            "--iops-minimum",
            "0",
        ])
        .expect("parses");
        match cli.command {
            Command::Policy(PolicyCommand::Set { qos, .. }) => assert_eq!(
                qos.json(),
                serde_json::json!({"iops_limit": 2000, "iops_minimum": 0})
            ),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn json_and_api_are_accepted_after_the_verb() {
        let cli =
            parse(&["volume", "list", "--json", "--api", "http://10.0.0.1:1"]).expect("parses");
        assert!(cli.json);
        assert_eq!(cli.api, "http://10.0.0.1:1");
    }

    #[test]
    fn resync_list_watches_every_two_seconds_unless_told() {
        let watch = |args: &[&str]| match parse(args).map(|c| c.command) {
            Ok(Command::Resync(ResyncCommand::List { every })) => Ok(every.watch),
            Ok(other) => panic!("parsed as {other:?}"),
            Err(e) => Err(e.exit_code()),
        };
        assert_eq!(watch(&["resync", "list"]), Ok(None));
        assert_eq!(watch(&["resync", "list", "--watch"]), Ok(Some(2)));
        assert_eq!(watch(&["resync", "list", "--watch", "5"]), Ok(Some(5)));
        assert_eq!(watch(&["resync", "list", "--watch", "0"]), Err(2));
        assert_eq!(watch(&["resync", "list", "--watch", "--json"]), Ok(Some(2)));
    }

    #[test]
    fn store_check_needs_a_path() {
        assert_eq!(
            parse(&["store", "check"]).expect_err("refused").exit_code(),
            2
        );
    }
}
