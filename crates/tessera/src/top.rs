//! `tessera top`: what clients do to each volume and host, second by
//! second, like esxtop, from two samples of `GET /v1/activity`.
//!
//! Owns: the two shapes of one interval's rates (computed by
//! [`tessera_node::activity_history::interval_rates`]): a table redrawn in
//! place, and CSV rows for batch mode (`-b`).
//! Must not touch: the API beyond `/v1/activity`.

use std::fmt::Write;
use tessera_node::activity_history::ActivityRate;

/// The CSV header of batch mode.
pub const CSV_HEADER: &str = "time_unix,kind,name,owner,clients,read_iops,write_iops,read_mib_s,write_mib_s,read_latency_us,write_latency_us,queue,errors_s,ats_s,ats_fail_s,clone_s,clone_mib_s,zero_blocks_s,delete_blocks_s";

/// `row` as a CSV line of batch mode, at `time_unix`.
pub fn csv_line(time_unix: f64, row: &ActivityRate) -> String {
    format!(
        "{time_unix:.3},{},{},{},{},{:.1},{:.1},{:.2},{:.2},{:.0},{:.0},{:.2},{:.1},{:.1},{:.1},{:.1},{:.2},{:.1},{:.1}",
        row.kind.as_str(),
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
pub fn table(rows: &[ActivityRate], seconds: f64) -> String {
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
                r.kind.as_str().to_string(),
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
    use tessera_node::activity_history::interval_rates;
    use tessera_node::control::{OffloadView, VolumeActivity, VolumeIoStats};

    #[test]
    fn csv_lines_have_the_header_s_columns() {
        // Names hold only letters, digits, '.', '_' and '-': no quoting.
        let sample = VolumeActivity {
            volume: "vm-1.a_b".into(),
            owner: "host-1".into(),
            clients: 1,
            io: VolumeIoStats::default().snapshot(),
            read_cache_hits: 0,
            read_cache_misses: 0,
            checksum_repairs: 0,
            resynced_bytes: 0,
            degraded_write_bytes: 0,
            offloads: OffloadView::default(),
        };
        let rows = interval_rates(&[], &[sample], 1.0);
        let columns = CSV_HEADER.split(',').count();
        assert_eq!(rows.len(), 2);
        for r in &rows {
            assert_eq!(csv_line(1.0, r).split(',').count(), columns);
        }
    }
}
