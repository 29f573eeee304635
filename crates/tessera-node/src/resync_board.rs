//! The board of resyncs and rebuilds: what `tessera status` and
//! `resync list` show while data moves.
//!
//! Owns: one entry per resync with its live progress counters, and the
//! most recent finished ones (bounded by [`FINISHED_KEPT`]).

use crate::control::ResyncView;
use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tessera_object::{ResyncError, ResyncProgress, ResyncReport};
use tessera_types::{ComponentId, HostId, VolumeId};

/// Finished resyncs kept for display.
pub const FINISHED_KEPT: usize = 32;

struct Entry {
    volume: VolumeId,
    component: ComponentId,
    host: HostId,
    kind: &'static str,
    started: Instant,
    finished: Option<Instant>,
    progress: Arc<ResyncProgress>,
    state: String,
    copied_bytes: u64,
}

/// Resyncs of every host in this process.
#[derive(Default)]
pub struct ResyncBoard {
    entries: Mutex<Vec<Entry>>,
}

impl ResyncBoard {
    /// Registers a starting resync; returns its progress counters.
    pub fn start(
        &self,
        volume: &VolumeId,
        component: ComponentId,
        host: &HostId,
        kind: &'static str,
    ) -> Arc<ResyncProgress> {
        let progress = Arc::new(ResyncProgress::default());
        let mut entries = self.entries.lock();
        entries.push(Entry {
            volume: volume.clone(),
            component,
            host: host.clone(),
            kind,
            started: Instant::now(),
            finished: None,
            progress: Arc::clone(&progress),
            state: "running".into(),
            copied_bytes: 0,
        });
        let finished = entries.iter().filter(|e| e.finished.is_some()).count();
        if finished > FINISHED_KEPT {
            if let Some(pos) = entries.iter().position(|e| e.finished.is_some()) {
                entries.remove(pos);
            }
        }
        progress
    }

    /// Records how a resync ended.
    pub fn finish(
        &self,
        volume: &VolumeId,
        component: ComponentId,
        result: Result<ResyncReport, ResyncError>,
    ) {
        let mut entries = self.entries.lock();
        if let Some(e) = entries
            .iter_mut()
            .rev()
            .find(|e| &e.volume == volume && e.component == component && e.finished.is_none())
        {
            e.finished = Some(Instant::now());
            match result {
                Ok(report) => {
                    e.state = "done".into();
                    e.copied_bytes = report.copied_bytes;
                }
                Err(err) => e.state = format!("failed: {err}"),
            }
        }
    }

    /// Every entry, running ones first.
    pub fn views(&self) -> Vec<ResyncView> {
        let entries = self.entries.lock();
        let mut out: Vec<ResyncView> = entries
            .iter()
            .map(|e| {
                let done = e.progress.done_bytes.load(Ordering::Relaxed);
                let left = e.progress.left_bytes.load(Ordering::Relaxed);
                let elapsed = e
                    .finished
                    .unwrap_or_else(Instant::now)
                    .duration_since(e.started)
                    .as_secs_f64()
                    .max(0.001);
                ResyncView {
                    volume: e.volume.to_string(),
                    component: e.component,
                    host: e.host.to_string(),
                    kind: e.kind.to_string(),
                    state: e.state.clone(),
                    done_bytes: done,
                    left_bytes: left,
                    copied_bytes: e.copied_bytes,
                    rate_bytes_per_s: (done as f64 / elapsed) as u64,
                }
            })
            .collect();
        out.sort_by_key(|v| v.state != "running");
        out
    }
}
