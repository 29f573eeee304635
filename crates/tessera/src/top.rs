//! `tessera top`: what clients do to each volume and host, second by
//! second, like esxtop, from two samples of `GET /v1/activity`.
//!
//! Owns: the rates of one interval ([`interval_rows`], pure) and their two
//! shapes: a table redrawn in place, and CSV rows for batch mode (`-b`).
//! Must not touch: the API beyond `/v1/activity`.
//! Invariants: a rate is a difference of two counters over the measured
//! interval; a volume whose counters went back (another owner took it) or
//! that was not in the earlier sample is counted from zero, since its
//! counters started inside the interval; a host's row adds up its
//! volumes' operations, and its latency is their operations' mean.

use std::fmt::Write;
use tessera_node::control::{IoKind, IoKindSnapshot, VolumeActivity};

/// One row of one interval: a volume, or a host (the volumes it owns).
#[derive(Clone, Debug, PartialEq)]
pub struct TopRow {
    /// "volume" or "host".
    pub kind: &'static str,
    /// The volume's or the host's name.
    pub name: String,
    /// The host that counted (for a host row, itself).
    pub owner: String,
    /// Clients with the volume open (for a host: of its volumes).
    pub clients: u32,
    /// Reads per second.
    pub read_iops: f64,
    /// Writes per second.
    pub write_iops: f64,
    /// MiB read per second.
    pub read_mib_s: f64,
    /// MiB written per second.
    pub write_mib_s: f64,
    /// Mean read latency in the interval, microseconds.
    pub read_latency_us: f64,
    /// Mean write latency in the interval, microseconds.
    pub write_latency_us: f64,
    /// Operations under way on the owner on average (their latencies
    /// added up over the interval's length: Little's law).
    pub queue: f64,
    /// Errors per second.
    pub errors_s: f64,
    /// COMPARE AND WRITE (ATS) per second.
    pub ats_s: f64,
    /// ATS miscompares per second.
    pub ats_fail_s: f64,
    /// EXTENDED COPY commands per second.
    pub clone_s: f64,
    /// MiB per second EXTENDED COPY placed by sharing blocks.
    pub clone_mib_s: f64,
    /// Logical blocks zeroed by WRITE SAME per second.
    pub zero_blocks_s: f64,
    /// Logical blocks deallocated (UNMAP) per second.
    pub delete_blocks_s: f64,
}

/// The CSV header of batch mode.
pub const CSV_HEADER: &str = "time_unix,kind,name,owner,clients,read_iops,write_iops,read_mib_s,write_mib_s,read_latency_us,write_latency_us,queue,errors_s,ats_s,ats_fail_s,clone_s,clone_mib_s,zero_blocks_s,delete_blocks_s";

/// What changed between two samples of one kind of operation.
#[derive(Clone, Copy, Default)]
struct KindDelta {
    operations: u64,
    bytes: u64,
    errors: u64,
    latency_ns: u64,
}

fn kind_of(io: &[IoKindSnapshot], kind: IoKind) -> Option<&IoKindSnapshot> {
    io.iter().find(|k| k.kind == kind)
}

/// Whether `now` continues `then` (same owner, no counter went back).
fn continues(then: &VolumeActivity, now: &VolumeActivity) -> bool {
    then.owner == now.owner
        && now.io.iter().all(|k| {
            kind_of(&then.io, k.kind).is_none_or(|t| {
                t.operations <= k.operations
                    && t.bytes <= k.bytes
                    && t.errors <= k.errors
                    && t.latency_ns <= k.latency_ns
            })
        })
        && then.offloads.ats <= now.offloads.ats
        && then.offloads.clone_commands <= now.offloads.clone_commands
}

/// Changes of the offload counters (or their sums over volumes).
#[derive(Clone, Copy, Default)]
struct OffloadDelta {
    ats: u64,
    ats_fail: u64,
    clones: u64,
    clone_bytes: u64,
    zero_blocks: u64,
    delete_blocks: u64,
}

impl OffloadDelta {
    fn add(&mut self, d: &OffloadDelta) {
        self.ats += d.ats;
        self.ats_fail += d.ats_fail;
        self.clones += d.clones;
        self.clone_bytes += d.clone_bytes;
        self.zero_blocks += d.zero_blocks;
        self.delete_blocks += d.delete_blocks;
    }
}

/// Per-kind changes of one volume and its offloads' changes.
struct VolumeDelta {
    kinds: Vec<(IoKind, KindDelta)>,
    offloads: OffloadDelta,
}

fn delta(then: Option<&VolumeActivity>, now: &VolumeActivity) -> VolumeDelta {
    let then = then.filter(|t| continues(t, now));
    let kinds = now
        .io
        .iter()
        .map(|k| {
            let t = then.and_then(|t| kind_of(&t.io, k.kind));
            let base = |f: fn(&IoKindSnapshot) -> u64| t.map_or(0, f);
            (
                k.kind,
                KindDelta {
                    operations: k.operations - base(|t| t.operations),
                    bytes: k.bytes - base(|t| t.bytes),
                    errors: k.errors - base(|t| t.errors),
                    latency_ns: k.latency_ns - base(|t| t.latency_ns),
                },
            )
        })
        .collect();
    let (o, t) = (&now.offloads, then.map(|t| t.offloads).unwrap_or_default());
    VolumeDelta {
        kinds,
        offloads: OffloadDelta {
            ats: o.ats.saturating_sub(t.ats),
            ats_fail: o.ats_miscompare.saturating_sub(t.ats_miscompare),
            clones: o.clone_commands.saturating_sub(t.clone_commands),
            clone_bytes: o.clone_shared_bytes.saturating_sub(t.clone_shared_bytes),
            zero_blocks: o.zero_blocks.saturating_sub(t.zero_blocks),
            delete_blocks: o.delete_blocks.saturating_sub(t.delete_blocks),
        },
    }
}

/// Adds `d` into the running totals of a row.
#[derive(Default)]
struct Totals {
    clients: u32,
    read: KindDelta,
    write: KindDelta,
    all_latency_ns: u64,
    errors: u64,
    offloads: OffloadDelta,
}

impl Totals {
    fn add(&mut self, clients: u32, d: &VolumeDelta) {
        self.clients += clients;
        for (kind, k) in &d.kinds {
            let into = match kind {
                IoKind::Read => Some(&mut self.read),
                IoKind::Write => Some(&mut self.write),
                _ => None,
            };
            if let Some(into) = into {
                into.operations += k.operations;
                into.bytes += k.bytes;
                into.latency_ns += k.latency_ns;
            }
            self.all_latency_ns += k.latency_ns;
            self.errors += k.errors;
        }
        self.offloads.add(&d.offloads);
    }

    fn row(&self, kind: &'static str, name: String, owner: String, seconds: f64) -> TopRow {
        let per_s = |n: u64| n as f64 / seconds;
        let mib_s = |n: u64| n as f64 / (1u64 << 20) as f64 / seconds;
        let mean_us = |k: &KindDelta| {
            if k.operations == 0 {
                0.0
            } else {
                k.latency_ns as f64 / k.operations as f64 / 1000.0
            }
        };
        TopRow {
            kind,
            name,
            owner,
            clients: self.clients,
            read_iops: per_s(self.read.operations),
            write_iops: per_s(self.write.operations),
            read_mib_s: mib_s(self.read.bytes),
            write_mib_s: mib_s(self.write.bytes),
            read_latency_us: mean_us(&self.read),
            write_latency_us: mean_us(&self.write),
            queue: self.all_latency_ns as f64 / 1e9 / seconds,
            errors_s: per_s(self.errors),
            ats_s: per_s(self.offloads.ats),
            ats_fail_s: per_s(self.offloads.ats_fail),
            clone_s: per_s(self.offloads.clones),
            clone_mib_s: mib_s(self.offloads.clone_bytes),
            zero_blocks_s: per_s(self.offloads.zero_blocks),
            delete_blocks_s: per_s(self.offloads.delete_blocks),
        }
    }
}

/// The rows of the interval of `seconds` between samples `then` and `now`:
/// each volume of `now` by name, then each host that owns any.
pub fn interval_rows(then: &[VolumeActivity], now: &[VolumeActivity], seconds: f64) -> Vec<TopRow> {
    let seconds = seconds.max(1e-3);
    let mut rows = Vec::new();
    let mut hosts: std::collections::BTreeMap<String, Totals> = Default::default();
    for v in now {
        let d = delta(then.iter().find(|t| t.volume == v.volume), v);
        let mut one = Totals::default();
        one.add(v.clients, &d);
        rows.push(one.row("volume", v.volume.clone(), v.owner.clone(), seconds));
        hosts.entry(v.owner.clone()).or_default().add(v.clients, &d);
    }
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    for (host, totals) in hosts {
        rows.push(totals.row("host", host.clone(), host, seconds));
    }
    rows
}

/// `row` as a CSV line of batch mode, at `time_unix`.
pub fn csv_line(time_unix: f64, row: &TopRow) -> String {
    format!(
        "{time_unix:.3},{},{},{},{},{:.1},{:.1},{:.2},{:.2},{:.0},{:.0},{:.2},{:.1},{:.1},{:.1},{:.1},{:.2},{:.1},{:.1}",
        row.kind,
        row.name,
        row.owner,
        row.clients,
        row.read_iops,
        row.write_iops,
        row.read_mib_s,
        row.write_mib_s,
        row.read_latency_us,
        row.write_latency_us,
        row.queue,
        row.errors_s,
        row.ats_s,
        row.ats_fail_s,
        row.clone_s,
        row.clone_mib_s,
        row.zero_blocks_s,
        row.delete_blocks_s,
    )
}

/// The rows as the table of interactive mode.
pub fn table(rows: &[TopRow], seconds: f64) -> String {
    let mut out =
        format!("tessera top: the last {seconds:.1} s, latency at the owner (Ctrl-C stops)\n\n");
    let header = [
        "KIND",
        "NAME",
        "OWNER",
        "CLIENTS",
        "READ/s",
        "WRITE/s",
        "MBREAD/s",
        "MBWRTN/s",
        "RD LAT us",
        "WR LAT us",
        "QUEUE",
        "ERR/s",
        "ATS/s",
        "ATSF/s",
        "CLONE/s",
        "CLONEMB/s",
        "ZERO/s",
        "DELETE/s",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.kind.to_string(),
                r.name.clone(),
                r.owner.clone(),
                r.clients.to_string(),
                format!("{:.0}", r.read_iops),
                format!("{:.0}", r.write_iops),
                format!("{:.1}", r.read_mib_s),
                format!("{:.1}", r.write_mib_s),
                format!("{:.0}", r.read_latency_us),
                format!("{:.0}", r.write_latency_us),
                format!("{:.1}", r.queue),
                format!("{:.0}", r.errors_s),
                format!("{:.0}", r.ats_s),
                format!("{:.0}", r.ats_fail_s),
                format!("{:.0}", r.clone_s),
                format!("{:.1}", r.clone_mib_s),
                format!("{:.0}", r.zero_blocks_s),
                format!("{:.0}", r.delete_blocks_s),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            cells
                .iter()
                .map(|c| c[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |out: &mut String, items: &[&str]| {
        for (i, item) in items.iter().enumerate() {
            // Names left, figures right.
            if i < 3 {
                let _ = write!(out, "{item:<w$}  ", w = widths[i]);
            } else {
                let _ = write!(out, "{item:>w$}  ", w = widths[i]);
            }
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
    };
    line(&mut out, &header);
    for c in &cells {
        let items: Vec<&str> = c.iter().map(String::as_str).collect();
        line(&mut out, &items);
    }
    if rows.is_empty() {
        out.push_str("no volume has an owner in the hosts this API serves\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tessera_node::control::{OffloadView, VolumeIoStats};

    fn sample(volume: &str, owner: &str, stats: &VolumeIoStats, ats: u64) -> VolumeActivity {
        VolumeActivity {
            volume: volume.into(),
            owner: owner.into(),
            clients: 1,
            io: stats.snapshot(),
            read_cache_hits: 0,
            read_cache_misses: 0,
            checksum_repairs: 0,
            resynced_bytes: 0,
            degraded_write_bytes: 0,
            offloads: OffloadView {
                ats,
                ..OffloadView::default()
            },
        }
    }

    #[test]
    fn rates_are_the_counters_differences_over_the_interval() {
        let (a, b) = (VolumeIoStats::default(), VolumeIoStats::default());
        a.record(IoKind::Write, 4096, Duration::from_micros(100), true);
        let then = vec![sample("a", "host-1", &a, 0), sample("b", "host-1", &b, 0)];
        for _ in 0..200 {
            a.record(IoKind::Write, 4096, Duration::from_micros(300), true);
        }
        for _ in 0..100 {
            b.record(IoKind::Read, 8192, Duration::from_micros(50), true);
        }
        let now = vec![sample("a", "host-1", &a, 10), sample("b", "host-1", &b, 0)];
        let rows = interval_rows(&then, &now, 2.0);
        assert_eq!(rows.len(), 3, "{rows:?}");
        let (ra, rb, host) = (&rows[0], &rows[1], &rows[2]);
        assert_eq!(
            (ra.name.as_str(), ra.write_iops, ra.read_iops),
            ("a", 100.0, 0.0)
        );
        assert_eq!(ra.write_mib_s, 200.0 * 4096.0 / 1048576.0 / 2.0);
        assert!((ra.write_latency_us - 300.0).abs() < 1e-9);
        assert_eq!(ra.ats_s, 5.0);
        assert_eq!((rb.read_iops, rb.read_latency_us), (50.0, 50.0));
        // Host: both volumes; queue = (200 x 300 us + 100 x 50 us) / 2 s.
        assert_eq!((host.kind, host.name.as_str()), ("host", "host-1"));
        assert_eq!(
            (host.read_iops, host.write_iops, host.clients),
            (50.0, 100.0, 2)
        );
        assert!((host.queue - 0.0325).abs() < 1e-9, "{}", host.queue);
    }

    #[test]
    fn a_new_owner_or_a_new_volume_counts_from_zero() {
        let old = VolumeIoStats::default();
        for _ in 0..1000 {
            old.record(IoKind::Write, 4096, Duration::from_micros(100), true);
        }
        let then = vec![sample("a", "host-1", &old, 0)];
        let fresh = VolumeIoStats::default();
        for _ in 0..10 {
            fresh.record(IoKind::Write, 4096, Duration::from_micros(100), true);
        }
        let moved = vec![
            sample("a", "host-2", &fresh, 0),
            sample("c", "host-2", &fresh, 0),
        ];
        let rows = interval_rows(&then, &moved, 1.0);
        assert_eq!(rows[0].write_iops, 10.0);
        assert_eq!(rows[1].write_iops, 10.0);
    }

    #[test]
    fn csv_lines_have_the_header_s_columns() {
        // Names hold only letters, digits, '.', '_' and '-': no quoting.
        let stats = VolumeIoStats::default();
        let rows = interval_rows(&[], &[sample("vm-1.a_b", "host-1", &stats, 0)], 1.0);
        let columns = CSV_HEADER.split(',').count();
        assert_eq!(rows.len(), 2);
        for r in &rows {
            assert_eq!(csv_line(1.0, r).split(',').count(), columns);
        }
    }
}
