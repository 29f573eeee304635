//! The Prometheus endpoint (`GET /metrics`): what the hosts this API
//! serves did and hold, in the Prometheus text format.
//!
//! Owns: the metric names, their help and labels ([`families`], a pure
//! function of the API's views) and their encoding (by `prometheus-client`).
//! Must not touch: the counters themselves (they live with what they count:
//! the coordinators, the SCSI units, the disk groups); every value here comes
//! from a [`ClusterControl`] view, so `/metrics` never says what the API
//! does not.
//!
//! Invariants: names follow Prometheus conventions (`tessera_` prefix, the
//! unit in the name, `_total` on counters); a counter is only ever a value
//! that grows while its owner runs; a series is labelled by what a user
//! names (volume, host, disk group), never by an internal id alone.

use crate::control::{
    ClusterControl, ControlError, HostActivity, HostView, ResyncView, ScrubView, VolumeActivity,
};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use tessera_object::LATENCY_BOUNDS_US;

/// The `Content-Type` of the answer.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Labels of one series.
type Labels = Vec<(&'static str, String)>;

/// What a series holds.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A counter or a gauge.
    Number(u64),
    /// A counter of seconds, from nanoseconds.
    Nanoseconds(u64),
    /// A latency histogram: per-bucket counts (not cumulative, one per
    /// bound of [`LATENCY_BOUNDS_US`] and one past the last) and the sum
    /// in nanoseconds.
    Latency {
        /// Operations per bucket.
        buckets: Vec<u64>,
        /// Their latencies added up, in nanoseconds.
        sum_ns: u64,
    },
}

/// One metric: its name without prefix, unit and `_total`, and its series.
#[derive(Clone, Debug)]
pub struct Family {
    /// Name, without `tessera_`, unit or `_total`.
    pub name: &'static str,
    /// One line for people.
    pub help: &'static str,
    /// Its unit, which the name ends with.
    pub unit: Option<Unit>,
    /// Counter, gauge or histogram.
    pub kind: MetricType,
    /// Its series.
    pub series: Vec<(Labels, Value)>,
}

impl Family {
    fn new(name: &'static str, help: &'static str, unit: Option<Unit>, kind: MetricType) -> Self {
        Family {
            name,
            help,
            unit,
            kind,
            series: Vec::new(),
        }
    }

    fn push(&mut self, labels: Labels, value: u64) {
        self.series.push((labels, Value::Number(value)));
    }
}

/// Every family, from the views of one scrape.
pub fn families(
    activity: &[VolumeActivity],
    host_activity: &[HostActivity],
    hosts: &[HostView],
    scrubs: &[ScrubView],
    resyncs: &[ResyncView],
) -> Vec<Family> {
    let mut out = Vec::new();
    out.extend(volume_families(activity));
    out.extend(host_families(hosts));
    out.extend(host_activity_families(host_activity));
    out.extend(scrub_families(scrubs));
    out.extend(resync_families(resyncs));
    out
}

fn volume_families(activity: &[VolumeActivity]) -> Vec<Family> {
    use MetricType::{Counter, Gauge, Histogram};
    let mut ops = Family::new(
        "volume_operations",
        "Client operations the volume's owner finished, failed ones included.",
        None,
        Counter,
    );
    let mut bytes = Family::new(
        "volume",
        "Bytes moved by the volume's client operations that succeeded (UNMAP and WRITE ZEROES: bytes covered).",
        Some(Unit::Bytes),
        Counter,
    );
    let mut errors = Family::new(
        "volume_operation_errors",
        "Client operations of the volume that failed.",
        None,
        Counter,
    );
    let mut latency = Family::new(
        "volume_operation_duration",
        "Time from a client operation's arrival at the volume's owner to its answer.",
        Some(Unit::Seconds),
        Histogram,
    );
    let mut clients = Family::new(
        "volume_clients",
        "NBD connections and iSCSI sessions that have the volume open.",
        None,
        Gauge,
    );
    let mut plain = [
        Family::new(
            "volume_read_cache_hits",
            "Blocks (4 KiB) of reads served from the owner's read cache.",
            None,
            Counter,
        ),
        Family::new(
            "volume_read_cache_misses",
            "Blocks (4 KiB) of reads the owner's read cache did not hold.",
            None,
            Counter,
        ),
        Family::new(
            "volume_checksum_repairs",
            "Blocks served from another copy after a checksum failure.",
            None,
            Counter,
        ),
        Family::new(
            "volume_resynced",
            "Bytes copied into the volume's components by resyncs and rebuilds.",
            Some(Unit::Bytes),
            Counter,
        ),
        Family::new(
            "volume_degraded_written",
            "Bytes written while some copy of the volume was absent.",
            Some(Unit::Bytes),
            Counter,
        ),
        Family::new(
            "vaai_ats",
            "COMPARE AND WRITE (ATS) commands.",
            None,
            Counter,
        ),
        Family::new(
            "vaai_ats_miscompares",
            "COMPARE AND WRITE commands that miscompared.",
            None,
            Counter,
        ),
        Family::new(
            "vaai_clone_commands",
            "EXTENDED COPY (XCOPY) commands.",
            None,
            Counter,
        ),
        Family::new(
            "vaai_clone_read_blocks",
            "Logical blocks read by EXTENDED COPY, the volume the source.",
            None,
            Counter,
        ),
        Family::new(
            "vaai_clone_written_blocks",
            "Logical blocks written by EXTENDED COPY, the volume the destination.",
            None,
            Counter,
        ),
        Family::new(
            "vaai_clone_shared",
            "Bytes EXTENDED COPY placed by sharing stored blocks, moving no data.",
            Some(Unit::Bytes),
            Counter,
        ),
        Family::new(
            "vaai_zero_blocks",
            "Logical blocks zeroed by WRITE SAME.",
            None,
            Counter,
        ),
        Family::new(
            "vaai_delete_blocks",
            "Logical blocks deallocated by UNMAP or WRITE SAME with UNMAP.",
            None,
            Counter,
        ),
        Family::new(
            "vaai_out_of_space",
            "SCSI commands that failed for lack of datastore space.",
            None,
            Counter,
        ),
    ];
    for a in activity {
        let volume = || vec![("volume", a.volume.clone()), ("owner", a.owner.clone())];
        for k in &a.io {
            let mut labels = volume();
            labels.push(("op", k.kind.name().to_string()));
            ops.push(labels.clone(), k.operations);
            bytes.push(labels.clone(), k.bytes);
            errors.push(labels.clone(), k.errors);
            latency.series.push((
                labels,
                Value::Latency {
                    buckets: k.latency_buckets.clone(),
                    sum_ns: k.latency_ns,
                },
            ));
        }
        clients.push(volume(), u64::from(a.clients));
        let o = &a.offloads;
        let values = [
            a.read_cache_hits,
            a.read_cache_misses,
            a.checksum_repairs,
            a.resynced_bytes,
            a.degraded_write_bytes,
            o.ats,
            o.ats_miscompare,
            o.clone_commands,
            o.clone_read_blocks,
            o.clone_write_blocks,
            o.clone_shared_bytes,
            o.zero_blocks,
            o.delete_blocks,
            o.out_of_space,
        ];
        for (family, value) in plain.iter_mut().zip(values) {
            family.push(volume(), value);
        }
    }
    let mut out = vec![ops, bytes, errors, latency, clients];
    out.extend(plain);
    out
}

fn host_families(hosts: &[HostView]) -> Vec<Family> {
    use MetricType::{Counter, Gauge};
    let mut up = Family::new(
        "host_up",
        "1 while the host holds its lease, 0 when absent or stopped.",
        None,
        Gauge,
    );
    let mut cache = [
        Family::new(
            "host_read_cache_budget",
            "Memory the host's read cache may use.",
            Some(Unit::Bytes),
            Gauge,
        ),
        Family::new(
            "host_read_cache_cached",
            "Bytes of blocks the host's read cache holds.",
            Some(Unit::Bytes),
            Gauge,
        ),
        Family::new(
            "host_read_cache_hits",
            "Blocks read from the host's read cache.",
            None,
            Counter,
        ),
        Family::new(
            "host_read_cache_misses",
            "Blocks the host's read cache did not hold.",
            None,
            Counter,
        ),
    ];
    let mut groups = [
        Family::new(
            "disk_group_healthy",
            "1 while the disk group is healthy, 0 when degraded, failed or evacuated.",
            None,
            Gauge,
        ),
        Family::new(
            "disk_group_capacity",
            "The disk group's capacity.",
            Some(Unit::Bytes),
            Gauge,
        ),
        Family::new(
            "disk_group_used",
            "Bytes the disk group's components use.",
            Some(Unit::Bytes),
            Gauge,
        ),
        Family::new(
            "disk_group_reserved",
            "Bytes reserved by space reservations and not yet used.",
            Some(Unit::Bytes),
            Gauge,
        ),
        Family::new(
            "disk_group_free",
            "Bytes free for new data.",
            Some(Unit::Bytes),
            Gauge,
        ),
        Family::new(
            "disk_group_components",
            "Components (data copies and witnesses) placed on the disk group.",
            None,
            Gauge,
        ),
    ];
    let mut index = [
        Family::new(
            "disk_group_index_cache_resident",
            "Memory the disk group's index cache uses.",
            Some(Unit::Bytes),
            Gauge,
        ),
        Family::new(
            "disk_group_index_cache_hits",
            "Index page lookups the disk group's index cache answered.",
            None,
            Counter,
        ),
        Family::new(
            "disk_group_index_cache_misses",
            "Index page lookups that read the device.",
            None,
            Counter,
        ),
    ];
    for h in hosts {
        let host = || vec![("host", h.id.clone())];
        up.push(host(), u64::from(h.state == "present"));
        if let Some(rc) = &h.read_cache {
            let values = [rc.budget_bytes, rc.cached_bytes, rc.hits, rc.misses];
            for (family, value) in cache.iter_mut().zip(values) {
                family.push(host(), value);
            }
        }
        for g in &h.disk_groups {
            let group = || vec![("host", h.id.clone()), ("disk_group", g.id.clone())];
            let c = &g.capacity;
            let values = [
                u64::from(g.health == "healthy"),
                c.total_bytes,
                c.used_bytes,
                c.reserved_bytes,
                c.free_bytes,
                g.components,
            ];
            for (family, value) in groups.iter_mut().zip(values) {
                family.push(group(), value);
            }
            if let Some(ic) = &g.index_cache {
                let values = [ic.resident_bytes, ic.hits, ic.misses];
                for (family, value) in index.iter_mut().zip(values) {
                    family.push(group(), value);
                }
            }
        }
    }
    let mut out = vec![up];
    out.extend(cache);
    out.extend(groups);
    out.extend(index);
    out
}

fn host_activity_families(activity: &[HostActivity]) -> Vec<Family> {
    use MetricType::Counter;
    let mut transport = [
        Family::new(
            "transport_calls",
            "Calls (round trips) the host made to other hosts, failed ones included.",
            None,
            Counter,
        ),
        Family::new(
            "transport_call_errors",
            "Calls to other hosts that failed, timeouts included.",
            None,
            Counter,
        ),
        Family::new(
            "transport_timeouts",
            "Calls to other hosts that timed out.",
            None,
            Counter,
        ),
        Family::new(
            "transport_requests_served",
            "Requests of other hosts this host answered.",
            None,
            Counter,
        ),
    ];
    let mut logs = [
        Family::new(
            "disk_group_log_group_commits",
            "Group commits written to the disk group's write log.",
            None,
            Counter,
        ),
        Family::new(
            "disk_group_log_syncs",
            "Syncs of the disk group's log device.",
            None,
            Counter,
        ),
        Family::new(
            "disk_group_log_durable_commits",
            "Group commits written durable on their own, needing no sync.",
            None,
            Counter,
        ),
        Family::new(
            "disk_group_placed_writes",
            "Large writes stored straight on the capacity tier, past the log.",
            None,
            Counter,
        ),
        Family::new(
            "disk_group_placed",
            "Bytes of those writes.",
            Some(Unit::Bytes),
            Counter,
        ),
    ];
    for h in activity {
        let values = [
            h.transport_calls,
            h.transport_call_errors,
            h.transport_timeouts,
            h.transport_requests_served,
        ];
        for (family, value) in transport.iter_mut().zip(values) {
            family.push(vec![("host", h.host.clone())], value);
        }
        for g in &h.disk_groups {
            let values = [
                g.group_commits,
                g.log_syncs,
                g.durable_commits,
                g.placed_writes,
                g.placed_bytes,
            ];
            for (family, value) in logs.iter_mut().zip(values) {
                family.push(
                    vec![
                        ("host", h.host.clone()),
                        ("disk_group", g.disk_group.clone()),
                    ],
                    value,
                );
            }
        }
    }
    let mut peers = [
        Family::new(
            "transport_peer_calls",
            "Calls (round trips) the host made to one other host, failed ones included.",
            None,
            Counter,
        ),
        Family::new(
            "transport_peer_call_errors",
            "Calls to that host that failed, timeouts included.",
            None,
            Counter,
        ),
        Family::new(
            "transport_peer_timeouts",
            "Calls to that host that timed out.",
            None,
            Counter,
        ),
    ];
    let mut round_trips = Family::new(
        "transport_peer_round_trip",
        "Round trips of the calls that host answered, added up (their mean: over calls less errors).",
        Some(Unit::Seconds),
        Counter,
    );
    for h in activity {
        for p in &h.peers {
            let labels = vec![("host", h.host.clone()), ("peer", p.peer.clone())];
            for (family, value) in peers.iter_mut().zip([p.calls, p.call_errors, p.timeouts]) {
                family.push(labels.clone(), value);
            }
            round_trips
                .series
                .push((labels, Value::Nanoseconds(p.round_trip_ns)));
        }
    }
    let mut out: Vec<Family> = transport.into();
    out.extend(logs);
    out.extend(peers);
    out.push(round_trips);
    out
}

fn scrub_families(scrubs: &[ScrubView]) -> Vec<Family> {
    use MetricType::{Counter, Gauge};
    let mut families = [
        Family::new(
            "scrub_passes",
            "Scrub passes the disk group finished since its host started.",
            None,
            Counter,
        ),
        Family::new(
            "scrub_checked_blocks",
            "Blocks the current scrub pass has verified.",
            None,
            Gauge,
        ),
        Family::new(
            "scrub_pass_blocks",
            "Blocks the current scrub pass verifies in all.",
            None,
            Gauge,
        ),
        Family::new(
            "scrub_bad_blocks",
            "Blocks scrubbing found failing their checksum.",
            None,
            Counter,
        ),
        Family::new(
            "scrub_repaired_blocks",
            "Bad blocks rewritten from another copy.",
            None,
            Counter,
        ),
        Family::new(
            "scrub_unrepaired_blocks",
            "Bad blocks no other copy could repair.",
            None,
            Counter,
        ),
    ];
    for s in scrubs {
        let values = [
            s.passes,
            s.checked_blocks,
            s.total_blocks,
            s.bad_blocks,
            s.repaired_blocks,
            s.unrepaired_blocks,
        ];
        for (family, value) in families.iter_mut().zip(values) {
            family.push(
                vec![
                    ("host", s.host.clone()),
                    ("disk_group", s.disk_group.clone()),
                ],
                value,
            );
        }
    }
    families.into()
}

fn resync_families(resyncs: &[ResyncView]) -> Vec<Family> {
    use MetricType::Gauge;
    let mut families = [
        Family::new(
            "resync_done",
            "Bytes of dirty address space the resync or rebuild has examined.",
            Some(Unit::Bytes),
            Gauge,
        ),
        Family::new(
            "resync_left",
            "Bytes of address space still to resync.",
            Some(Unit::Bytes),
            Gauge,
        ),
        Family::new(
            "resync_copied",
            "Bytes of data the resync or rebuild has copied.",
            Some(Unit::Bytes),
            Gauge,
        ),
        Family::new(
            "resync_rate",
            "Bytes per second the resync or rebuild copies now.",
            Some(Unit::Other("bytes_per_second".into())),
            Gauge,
        ),
    ];
    for r in resyncs {
        let values = [
            r.done_bytes,
            r.left_bytes,
            r.copied_bytes,
            r.rate_bytes_per_s,
        ];
        for (family, value) in families.iter_mut().zip(values) {
            family.push(
                vec![
                    ("volume", r.volume.clone()),
                    ("component", r.component.to_string()),
                    ("host", r.host.clone()),
                    ("kind", r.kind.clone()),
                ],
                value,
            );
        }
    }
    families.into()
}

/// The families of one scrape, as `prometheus-client` asks for them.
#[derive(Debug)]
struct Scrape(Vec<Family>);

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in &self.0 {
            let mut metric = encoder.encode_descriptor(
                family.name,
                family.help,
                family.unit.as_ref(),
                family.kind,
            )?;
            for (labels, value) in &family.series {
                let mut series = metric.encode_family(labels)?;
                match (value, family.kind) {
                    (Value::Number(v), MetricType::Counter) => {
                        series.encode_counter::<NoLabelSet, _, f64>(v, None)?
                    }
                    (Value::Number(v), _) => series.encode_gauge(&(*v as i64))?,
                    (Value::Nanoseconds(ns), _) => {
                        series.encode_counter::<NoLabelSet, _, f64>(&(*ns as f64 / 1e9), None)?
                    }
                    (Value::Latency { buckets, sum_ns }, _) => {
                        // The encoder adds the buckets up into Prometheus's
                        // cumulative `le` form itself.
                        let bounds = LATENCY_BOUNDS_US
                            .iter()
                            .map(|us| *us as f64 / 1e6)
                            .chain([f64::INFINITY]);
                        let per_bucket: Vec<(f64, u64)> =
                            bounds.zip(buckets.iter().copied()).collect();
                        series.encode_histogram::<NoLabelSet>(
                            *sum_ns as f64 / 1e9,
                            buckets.iter().sum(),
                            &per_bucket,
                            None,
                        )?
                    }
                }
            }
        }
        Ok(())
    }
}

/// Encodes `families` in the Prometheus text format.
pub fn encode(families: Vec<Family>) -> String {
    let mut registry = Registry::with_prefix("tessera");
    registry.register_collector(Box::new(Scrape(families)));
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)
        .expect("writing to a String cannot fail");
    text
}

/// One scrape of what `control` serves.
pub async fn scrape(control: &dyn ClusterControl) -> Result<String, ControlError> {
    let activity = control.activity().await?;
    let host_activity = control.host_activity().await?;
    let hosts = control.hosts().await?;
    let scrubs = control.scrubs().await?;
    let resyncs = control.resyncs().await?;
    Ok(encode(families(
        &activity,
        &host_activity,
        &hosts,
        &scrubs,
        &resyncs,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::OffloadView;
    use tessera_object::{IoKind, VolumeIoStats};

    fn activity() -> VolumeActivity {
        let io = VolumeIoStats::default();
        io.record(
            IoKind::Write,
            4096,
            std::time::Duration::from_micros(120),
            true,
        );
        io.record(
            IoKind::Write,
            4096,
            std::time::Duration::from_millis(2),
            true,
        );
        io.record(
            IoKind::Read,
            8192,
            std::time::Duration::from_micros(40),
            true,
        );
        VolumeActivity {
            volume: "vm1".into(),
            owner: "host-2".into(),
            clients: 1,
            io: io.snapshot(),
            read_cache_hits: 3,
            read_cache_misses: 4,
            checksum_repairs: 0,
            resynced_bytes: 0,
            degraded_write_bytes: 0,
            offloads: OffloadView {
                clone_commands: 2,
                ..OffloadView::default()
            },
        }
    }

    #[test]
    fn counters_histograms_and_units_follow_the_conventions() {
        let text = encode(families(&[activity()], &[], &[], &[], &[]));
        for line in [
            "# TYPE tessera_volume_operations_total counter",
            "tessera_volume_operations_total{volume=\"vm1\",owner=\"host-2\",op=\"write\"} 2",
            "tessera_volume_bytes_total{volume=\"vm1\",owner=\"host-2\",op=\"read\"} 8192",
            "# TYPE tessera_volume_operation_duration_seconds histogram",
            "tessera_volume_operation_duration_seconds_bucket{volume=\"vm1\",owner=\"host-2\",op=\"write\",le=\"0.00025\"} 1",
            "tessera_volume_operation_duration_seconds_bucket{volume=\"vm1\",owner=\"host-2\",op=\"write\",le=\"0.0025\"} 2",
            "tessera_volume_operation_duration_seconds_bucket{volume=\"vm1\",owner=\"host-2\",op=\"write\",le=\"+Inf\"} 2",
            "tessera_volume_operation_duration_seconds_count{volume=\"vm1\",owner=\"host-2\",op=\"write\"} 2",
            "tessera_volume_clients{volume=\"vm1\",owner=\"host-2\"} 1",
            "tessera_vaai_clone_commands_total{volume=\"vm1\",owner=\"host-2\"} 2",
            "tessera_volume_read_cache_misses_total{volume=\"vm1\",owner=\"host-2\"} 4",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
        // The sum is in seconds: 120 us + 2 ms.
        assert!(text.lines().any(|l| l.starts_with(
            "tessera_volume_operation_duration_seconds_sum{volume=\"vm1\",owner=\"host-2\",op=\"write\"} 0.00212"
        )));
    }
}
