//! The board of resyncs and rebuilds: what `tessera status` and
//! `resync list` show while data moves.
//!
//! Owns: one row per resync (volume + component) with the live progress
//! counters of its current attempt, and the most recent finished rows
//! (bounded by [`FINISHED_KEPT`]). Must not touch: the resyncs themselves;
//! hosts report attempts starting, ending and waiting to retry.
//! Invariants: a component appears once: a retry replaces the row of the
//! attempt before it (counting attempts, keeping the last error); only the
//! attempt that owns a row ends it, so a superseded attempt (an old owner's)
//! cannot overwrite its successor's row; an attempt dropped before it ended
//! (its host stopped) ends as failed, never stays "running".

use crate::control::{ResyncState, ResyncView};
use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_object::{ResyncError, ResyncProgress, ResyncReport};
use tessera_types::{ComponentId, HostId, VolumeId};

/// Finished rows kept for display.
pub const FINISHED_KEPT: usize = 32;

/// How long a failed row shows as waiting after its owner last said a
/// retry is pending: six ticks of the host's control loop (500 ms each),
/// which says it on every tick. A row no owner speaks for any more (the
/// component was replaced, the volume deleted) falls back to failed.
pub const WAITING_FRESH: Duration = Duration::from_secs(3);

/// Why an attempt dropped without a result ended.
const DROPPED: &str = "stopped before it finished (its host stopped)";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Running,
    Done,
    Failed,
}

struct Row {
    volume: VolumeId,
    component: ComponentId,
    host: HostId,
    kind: &'static str,
    attempts: u32,
    started: Instant,
    finished: Option<Instant>,
    progress: Arc<ResyncProgress>,
    outcome: Outcome,
    error: Option<String>,
    /// When its owner last said a retry is pending.
    retry_pending: Option<Instant>,
}

impl Row {
    fn view(&self, now: Instant) -> ResyncView {
        let done = self.progress.done_bytes.load(Ordering::Relaxed);
        let left = self.progress.left_bytes.load(Ordering::Relaxed);
        let copied = self.progress.copied_bytes.load(Ordering::Relaxed);
        let elapsed = self
            .finished
            .unwrap_or(now)
            .saturating_duration_since(self.started)
            .as_secs_f64()
            .max(0.001);
        let rate = (done as f64 / elapsed) as u64;
        let state = match self.outcome {
            Outcome::Running => ResyncState::Running,
            Outcome::Done => ResyncState::Done,
            Outcome::Failed
                if self
                    .retry_pending
                    .is_some_and(|t| now.saturating_duration_since(t) < WAITING_FRESH) =>
            {
                ResyncState::Waiting
            }
            Outcome::Failed => ResyncState::Failed,
        };
        ResyncView {
            volume: self.volume.to_string(),
            component: self.component,
            host: self.host.to_string(),
            kind: self.kind.to_string(),
            state,
            error: self.error.clone(),
            attempts: self.attempts,
            done_bytes: done,
            left_bytes: left,
            copied_bytes: copied,
            rate_bytes_per_s: rate,
            eta_s: eta_s(state, left, rate),
        }
    }
}

/// Seconds left for `left_bytes` at `rate_bytes_per_s`, rounded up; None
/// unless running, or while the rate is unknown (nothing examined yet).
pub fn eta_s(state: ResyncState, left_bytes: u64, rate_bytes_per_s: u64) -> Option<u64> {
    if state != ResyncState::Running {
        return None;
    }
    if left_bytes == 0 {
        return Some(0);
    }
    if rate_bytes_per_s == 0 {
        return None;
    }
    Some(left_bytes.div_ceil(rate_bytes_per_s))
}

/// Resyncs of every host in this process.
#[derive(Default)]
pub struct ResyncBoard {
    rows: Mutex<Vec<Row>>,
}

/// One attempt of a resync, registered on the board. Its progress counters
/// are what the board shows; [`ResyncAttempt::finish`] records the result.
/// Dropped without a result (its task aborted), it ends as failed.
pub struct ResyncAttempt {
    board: Arc<ResyncBoard>,
    progress: Arc<ResyncProgress>,
    ended: bool,
}

impl ResyncAttempt {
    /// The counters the resync updates as it copies.
    pub fn progress(&self) -> &ResyncProgress {
        &self.progress
    }

    /// Records how the attempt ended.
    pub fn finish(mut self, result: &Result<ResyncReport, ResyncError>) {
        self.ended = true;
        match result {
            Ok(_) => self.board.end(&self.progress, Outcome::Done, None),
            Err(e) => self
                .board
                .end(&self.progress, Outcome::Failed, Some(e.to_string())),
        }
    }
}

impl Drop for ResyncAttempt {
    fn drop(&mut self) {
        if !self.ended {
            self.board
                .end(&self.progress, Outcome::Failed, Some(DROPPED.to_string()));
        }
    }
}

impl ResyncBoard {
    /// Registers an attempt to bring `component` up to date. A row of the
    /// same component that failed (or is still running elsewhere: ownership
    /// moved) is replaced by this attempt: its kind and error are kept and
    /// its attempts counted. After a finished one, a new resync starts at
    /// attempt 1.
    pub fn start(
        self: &Arc<Self>,
        volume: &VolumeId,
        component: ComponentId,
        host: &HostId,
        kind: &'static str,
    ) -> ResyncAttempt {
        let progress = Arc::new(ResyncProgress::default());
        let mut rows = self.rows.lock();
        let earlier = rows
            .iter()
            .position(|r| &r.volume == volume && r.component == component)
            .map(|pos| rows.remove(pos));
        let (kind, attempts, error) = match earlier {
            Some(e) if e.outcome != Outcome::Done => {
                (e.kind, e.attempts.saturating_add(1), e.error)
            }
            _ => (kind, 1, None),
        };
        rows.push(Row {
            volume: volume.clone(),
            component,
            host: host.clone(),
            kind,
            attempts,
            started: Instant::now(),
            finished: None,
            progress: Arc::clone(&progress),
            outcome: Outcome::Running,
            error,
            retry_pending: None,
        });
        let finished = rows.iter().filter(|r| r.finished.is_some()).count();
        if finished > FINISHED_KEPT {
            if let Some(pos) = rows.iter().position(|r| r.finished.is_some()) {
                rows.remove(pos);
            }
        }
        ResyncAttempt {
            board: Arc::clone(self),
            progress,
            ended: false,
        }
    }

    /// Ends the row `progress` belongs to, if this attempt still owns it.
    fn end(&self, progress: &Arc<ResyncProgress>, outcome: Outcome, error: Option<String>) {
        let mut rows = self.rows.lock();
        if let Some(r) = rows
            .iter_mut()
            .find(|r| Arc::ptr_eq(&r.progress, progress) && r.outcome == Outcome::Running)
        {
            r.finished = Some(Instant::now());
            r.outcome = outcome;
            r.error = error;
        }
    }

    /// Says that the failed resync of `component` will be tried again (its
    /// host is away, or the retry waits out a lease) and that `left_bytes`
    /// now wait for it (writes go on while it waits): the row shows
    /// `waiting` for [`WAITING_FRESH`].
    pub fn retry_pending(&self, volume: &VolumeId, component: ComponentId, left_bytes: u64) {
        let mut rows = self.rows.lock();
        if let Some(r) = rows.iter_mut().find(|r| {
            &r.volume == volume && r.component == component && r.outcome == Outcome::Failed
        }) {
            r.retry_pending = Some(Instant::now());
            r.progress.left_bytes.store(left_bytes, Ordering::Relaxed);
        }
    }

    /// Every row: running ones first, then waiting ones, then the rest;
    /// each group oldest attempt first.
    pub fn views(&self) -> Vec<ResyncView> {
        let now = Instant::now();
        let rows = self.rows.lock();
        let mut out: Vec<ResyncView> = rows.iter().map(|r| r.view(now)).collect();
        out.sort_by_key(|v| match v.state {
            ResyncState::Running => 0,
            ResyncState::Waiting => 1,
            ResyncState::Done | ResyncState::Failed => 2,
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume() -> VolumeId {
        VolumeId::new("vm1").expect("name")
    }

    fn host() -> HostId {
        HostId("host-2".into())
    }

    fn refused() -> ResyncError {
        ResyncError::Unavailable {
            volume: "vm1".into(),
            reason: "Connection refused".into(),
        }
    }

    fn report(copied_bytes: u64) -> ResyncReport {
        ResyncReport {
            component: ComponentId(7),
            dirty_bytes: copied_bytes,
            copied_bytes,
        }
    }

    #[test]
    fn a_retry_replaces_the_failed_attempt_and_success_clears_the_error() {
        let board = Arc::new(ResyncBoard::default());
        let first = board.start(&volume(), ComponentId(7), &host(), "resync");
        first.finish(&Err(refused()));
        let v = board.views();
        assert_eq!(v.len(), 1);
        assert_eq!((v[0].state, v[0].attempts), (ResyncState::Failed, 1));
        assert!(v[0].error.as_deref().is_some_and(|e| e.contains("refused")));

        let second = board.start(&volume(), ComponentId(7), &host(), "resync");
        let v = board.views();
        assert_eq!(v.len(), 1, "one row per component: {v:?}");
        assert_eq!((v[0].state, v[0].attempts), (ResyncState::Running, 2));
        assert!(
            v[0].error.is_some(),
            "the last error is kept while retrying"
        );

        second.finish(&Ok(report(4096)));
        let v = board.views();
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!((v[0].state, v[0].attempts), (ResyncState::Done, 2));
        assert_eq!(v[0].error, None);
    }

    #[test]
    fn a_new_resync_after_a_finished_one_starts_at_attempt_one() {
        let board = Arc::new(ResyncBoard::default());
        board
            .start(&volume(), ComponentId(7), &host(), "resync")
            .finish(&Ok(report(0)));
        let _again = board.start(&volume(), ComponentId(7), &host(), "resync");
        let other = board.start(&volume(), ComponentId(8), &host(), "rebuild");
        let v = board.views();
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v.iter().all(|r| r.attempts == 1 && r.error.is_none()));
        other.finish(&Err(refused()));
        // A retry of a rebuild (started by the resync path) stays a rebuild.
        let _retry = board.start(&volume(), ComponentId(8), &host(), "resync");
        let v = board.views();
        let rebuild = v.iter().find(|r| r.component == ComponentId(8)).unwrap();
        assert_eq!((rebuild.kind.as_str(), rebuild.attempts), ("rebuild", 2));
    }

    #[test]
    fn a_superseded_attempt_cannot_end_its_successors_row() {
        let board = Arc::new(ResyncBoard::default());
        let old_owner = board.start(&volume(), ComponentId(7), &host(), "resync");
        let new_owner = board.start(&volume(), ComponentId(7), &host(), "resync");
        old_owner.finish(&Err(refused()));
        let v = board.views();
        assert_eq!((v.len(), v[0].state), (1, ResyncState::Running), "{v:?}");
        drop(new_owner);
        let v = board.views();
        assert_eq!(v[0].state, ResyncState::Failed);
        assert_eq!(v[0].error.as_deref(), Some(DROPPED));
    }

    #[test]
    fn copied_bytes_are_shown_while_the_attempt_runs() {
        let board = Arc::new(ResyncBoard::default());
        let attempt = board.start(&volume(), ComponentId(7), &host(), "resync");
        let p = attempt.progress();
        p.done_bytes.store(3 << 20, Ordering::Relaxed);
        p.left_bytes.store(1 << 20, Ordering::Relaxed);
        p.copied_bytes.store(512 << 10, Ordering::Relaxed);
        let v = &board.views()[0];
        assert_eq!(v.state, ResyncState::Running);
        assert_eq!(
            (v.done_bytes, v.left_bytes, v.copied_bytes),
            (3 << 20, 1 << 20, 512 << 10)
        );
        assert!(v.rate_bytes_per_s > 0);
        assert!(v.eta_s.is_some(), "{v:?}");
        attempt.finish(&Err(refused()));
        let v = &board.views()[0];
        assert_eq!(
            v.copied_bytes,
            512 << 10,
            "a failed attempt keeps its count"
        );
        assert_eq!(v.eta_s, None);
    }

    #[test]
    fn a_failed_row_waits_while_its_owner_says_a_retry_is_pending() {
        let board = Arc::new(ResyncBoard::default());
        board
            .start(&volume(), ComponentId(7), &host(), "resync")
            .finish(&Err(refused()));
        board.retry_pending(&volume(), ComponentId(7), 5 << 20);
        let v = &board.views()[0];
        assert_eq!(v.state, ResyncState::Waiting);
        assert_eq!(v.left_bytes, 5 << 20, "what waits grows with the writes");
        board.rows.lock()[0].retry_pending = Some(Instant::now() - WAITING_FRESH);
        assert_eq!(board.views()[0].state, ResyncState::Failed);
    }

    #[test]
    fn running_rows_come_first_then_waiting_ones() {
        let board = Arc::new(ResyncBoard::default());
        board
            .start(&volume(), ComponentId(1), &host(), "resync")
            .finish(&Ok(report(0)));
        board
            .start(&volume(), ComponentId(2), &host(), "resync")
            .finish(&Err(refused()));
        board.retry_pending(&volume(), ComponentId(2), 0);
        let _running = board.start(&volume(), ComponentId(3), &host(), "resync");
        let order: Vec<ResyncState> = board.views().iter().map(|v| v.state).collect();
        assert_eq!(
            order,
            [
                ResyncState::Running,
                ResyncState::Waiting,
                ResyncState::Done
            ]
        );
    }

    #[test]
    fn the_json_names_the_component_as_tables_do_and_the_state_in_one_word() {
        let board = Arc::new(ResyncBoard::default());
        board
            .start(&volume(), ComponentId(0x2a), &host(), "resync")
            .finish(&Err(refused()));
        let json = serde_json::to_value(&board.views()[0]).expect("serializes");
        assert_eq!(json["component"], "c000000000000002a");
        assert_eq!(json["state"], "failed");
        assert_eq!(json["error"], "volume vm1: Connection refused");
        assert_eq!(json["attempts"], 1);
        assert_eq!(json["eta_s"], serde_json::Value::Null);
        for field in [
            "volume",
            "host",
            "kind",
            "done_bytes",
            "left_bytes",
            "copied_bytes",
            "rate_bytes_per_s",
        ] {
            assert!(json.get(field).is_some(), "{field} missing: {json}");
        }
        let back: ResyncView = serde_json::from_value(json).expect("reads back");
        assert_eq!(back, board.views()[0]);
    }

    #[test]
    fn eta_is_known_only_while_running_with_a_rate() {
        assert_eq!(eta_s(ResyncState::Running, 10, 3), Some(4));
        assert_eq!(eta_s(ResyncState::Running, 0, 0), Some(0));
        assert_eq!(eta_s(ResyncState::Running, 10, 0), None);
        assert_eq!(eta_s(ResyncState::Done, 10, 3), None);
        assert_eq!(eta_s(ResyncState::Waiting, 10, 3), None);
    }
}
