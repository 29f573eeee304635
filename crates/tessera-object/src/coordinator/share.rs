//! Copies that share stored blocks instead of moving data: EXTENDED COPY
//! inside the datastore (a VM cloned within one VMFS datastore, a template
//! volume copied into a new one).
//!
//! Owns: [`Coordinator::copy_shared`]: which parts of a copy can be shared
//! and which are copied as data, the range locks of both ranges while
//! blocks are shared, and the settling of each target copy's outcome.
//! Must not touch: the store; blocks are shared through
//! [`ComponentIo::clone_blocks`](crate::ComponentIo::clone_blocks).
//!
//! A part is shared when it is whole 4 KiB blocks and every copy of its
//! target column that receives writes has an Active copy of its source
//! column on the same host and disk group; anything else (unaligned edges,
//! copies on different disk groups, a host that refuses) is copied as data,
//! so the bytes that result are the same either way.
//!
//! Invariants:
//! - sharing is a write to the target range: it holds the target's range
//!   locks, carries the owner's epoch, reaches every copy that receives
//!   writes, leaves the range dirty on copies that do not (Absent, Degraded)
//!   and on copies that fail (which become Absent, recorded before the copy
//!   is acknowledged), and succeeds only with a copy per column and quorum;
//! - the source range is locked as well while its blocks are shared, so a
//!   concurrent write to the source lands on every target copy's source
//!   before or after the clone, never between: target copies never diverge;
//! - range locks of two volumes are taken in one global order (volume name,
//!   column, first block), the order every single-volume request follows
//!   too, so two copies in opposite directions cannot wait on each other.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::future::join_all;
use tessera_blockdev::{check_range, copy_by_data, BlockError};
use tessera_types::layout::{ComponentPlacement, ComponentState, Layout};
use tessera_types::{ComponentId, Lba, BLOCK_BYTES};

use super::{bad, receives_writes, Coordinator, IntentHold};
use crate::component_io::{BlockClone, ComponentError, CLONE_BLOCKS_MAX};
use crate::range_lock::{RangeGuard, RangeLock};

/// Volume bytes one step of a sharing copy covers: the range locks are held
/// for one step only, and a step's clones (at most [`CLONE_BLOCKS_MAX`]
/// blocks each) go to every copy at once.
pub const SHARE_STEP_BYTES: u64 = 8 * CLONE_BLOCKS_MAX * BLOCK_BYTES;

/// What a copy did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CopyReport {
    /// Bytes whose stored blocks were shared: no data moved.
    pub shared_bytes: u64,
    /// Bytes copied as data (unaligned edges, parts that could not be
    /// shared).
    pub copied_bytes: u64,
}

/// Whole blocks of one source column and one target column, at most
/// [`CLONE_BLOCKS_MAX`]: what one clone per target copy covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    /// Byte offset inside the step.
    at: u64,
    /// Bytes.
    len: u64,
    source_column: usize,
    source_block: u64,
    target_column: usize,
    target_block: u64,
}

impl Piece {
    fn blocks(&self) -> u64 {
        self.len / BLOCK_BYTES
    }
}

/// Cuts the block-aligned copy of `len` bytes from `source` offset `s` to
/// `target` offset `d` into pieces that each lie in one column of both
/// layouts, merging neighbours that stay contiguous in both (a one-column
/// layout gives one piece per [`CLONE_BLOCKS_MAX`] blocks).
fn pieces(source: &Layout, s: u64, target: &Layout, d: u64, len: u64) -> Vec<Piece> {
    let from = source.map_range(s, len);
    let to = target.map_range(d, len);
    let mut merged: Vec<Piece> = Vec::new();
    let (mut i, mut j, mut at) = (0, 0, 0);
    while at < len && i < from.len() && j < to.len() {
        let (a, b) = (&from[i], &to[j]);
        let (a_in, b_in) = (at - a.buffer_offset, at - b.buffer_offset);
        let step = (a.len - a_in).min(b.len - b_in);
        let next = Piece {
            at,
            len: step,
            source_column: a.column,
            source_block: (a.component_offset + a_in) / BLOCK_BYTES,
            target_column: b.column,
            target_block: (b.component_offset + b_in) / BLOCK_BYTES,
        };
        match merged.last_mut() {
            Some(p)
                if p.source_column == next.source_column
                    && p.target_column == next.target_column
                    && p.source_block + p.blocks() == next.source_block
                    && p.target_block + p.blocks() == next.target_block =>
            {
                p.len += step;
            }
            _ => merged.push(next),
        }
        at += step;
        if a_in + step == a.len {
            i += 1;
        }
        if b_in + step == b.len {
            j += 1;
        }
    }
    let mut out = Vec::with_capacity(merged.len());
    for p in merged {
        let mut done = 0;
        while done < p.blocks() {
            let blocks = (p.blocks() - done).min(CLONE_BLOCKS_MAX);
            out.push(Piece {
                at: p.at + done * BLOCK_BYTES,
                len: blocks * BLOCK_BYTES,
                source_block: p.source_block + done,
                target_block: p.target_block + done,
                ..p
            });
            done += blocks;
        }
    }
    out
}

impl Coordinator {
    /// Copies `len` bytes from `source` at `src_offset` to this volume at
    /// `dst_offset`, sharing the stored blocks wherever the layouts allow
    /// (see the module documentation) and copying the rest as data.
    /// `source` may be this coordinator (the ranges must then not overlap,
    /// or everything is copied as data) or another volume's on the same
    /// datastore, whose components this coordinator's [`ComponentIo`]
    /// reaches. An error leaves the target range partly copied, as a failed
    /// write may; the caller may copy it again as data or report it.
    ///
    /// [`ComponentIo`]: crate::ComponentIo
    pub async fn copy_shared(
        &self,
        source: &Coordinator,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> Result<CopyReport, BlockError> {
        check_range(&source.info, "copy (source)", src_offset, len)?;
        check_range(&self.info, "copy (destination)", dst_offset, len)?;
        let mut report = CopyReport::default();
        if len == 0 {
            return Ok(report);
        }
        let overlapping = std::ptr::eq(self, source)
            && src_offset < dst_offset + len
            && dst_offset < src_offset + len;
        if overlapping || src_offset % BLOCK_BYTES != dst_offset % BLOCK_BYTES {
            copy_by_data(source, self, src_offset, dst_offset, len).await?;
            report.copied_bytes = len;
            return Ok(report);
        }
        let head = ((BLOCK_BYTES - dst_offset % BLOCK_BYTES) % BLOCK_BYTES).min(len);
        let body = (len - head) / BLOCK_BYTES * BLOCK_BYTES;
        let tail = len - head - body;
        if head > 0 {
            copy_by_data(source, self, src_offset, dst_offset, head).await?;
            report.copied_bytes += head;
        }
        let mut done = 0;
        while done < body {
            let step = (body - done).min(SHARE_STEP_BYTES);
            let (s, d) = (src_offset + head + done, dst_offset + head + done);
            let unshared = self.share_step(source, s, d, step).await?;
            let mut copied = 0;
            for (at, n) in unshared {
                copy_by_data(source, self, s + at, d + at, n).await?;
                copied += n;
            }
            report.copied_bytes += copied;
            report.shared_bytes += step - copied;
            done += step;
        }
        if tail > 0 {
            let at = head + body;
            copy_by_data(source, self, src_offset + at, dst_offset + at, tail).await?;
            report.copied_bytes += tail;
        }
        self.counters
            .shared_copy_bytes
            .fetch_add(report.shared_bytes, Ordering::Relaxed);
        Ok(report)
    }

    /// Shares the blocks of one step (block-aligned, at most
    /// [`SHARE_STEP_BYTES`]) with both ranges locked. Returns the parts
    /// (offset inside the step, bytes) that were not shared and must be
    /// copied as data, once the locks are released.
    async fn share_step(
        &self,
        source: &Coordinator,
        s: u64,
        d: u64,
        len: u64,
    ) -> Result<Vec<(u64, u64)>, BlockError> {
        source.check_usable()?;
        self.check_usable()?;
        let _guards = lock_both(source, s, self, d, len).await;
        // Sharing changes the target blocks like a write: their cached
        // entries go once the clones are settled, before the step returns.
        let _invalidate = self
            .cache
            .change(d / BLOCK_BYTES, len.div_ceil(BLOCK_BYTES));
        let source_layout = source.layout();
        let target_layout = self.layout();
        let source_volume = source_layout.volume.clone();
        let pieces = pieces(&source_layout, s, &target_layout, d, len);

        let mut unshared: BTreeSet<usize> = BTreeSet::new();
        let mut skipped = Vec::new();
        let mut spans = Vec::new();
        let mut calls = Vec::new();
        for (index, p) in pieces.iter().enumerate() {
            let copies = &target_layout.columns[p.target_column].copies;
            let sources = &source_layout.columns[p.source_column].copies;
            let plan: Option<Vec<(&ComponentPlacement, &ComponentPlacement)>> = copies
                .iter()
                .filter(|t| receives_writes(t))
                .map(|t| {
                    sources
                        .iter()
                        .find(|c| {
                            c.state == ComponentState::Active
                                && c.host == t.host
                                && c.disk_group == t.disk_group
                        })
                        .map(|c| (t, c))
                })
                .collect();
            let Some(plan) = plan.filter(|p| !p.is_empty()) else {
                unshared.insert(index);
                continue;
            };
            for t in copies.iter().filter(|t| !receives_writes(t)) {
                skipped.push((t.id, p.target_block, p.blocks(), p.len));
            }
            if plan.len() >= 2 {
                spans.push((p.target_column, p.target_block, p.blocks()));
            }
            for (t, c) in plan {
                let clone = BlockClone {
                    source_volume: source_volume.clone(),
                    source: c.clone(),
                    source_lba: Lba(p.source_block),
                    target: t.clone(),
                    target_lba: Lba(p.target_block),
                    blocks: p.blocks(),
                    epoch: self.epoch,
                };
                let io = Arc::clone(&self.io);
                calls.push(async move {
                    let result = io.clone_blocks(&clone).await;
                    (index, clone.target, result)
                });
            }
        }
        let (needs, intents) = {
            let mut state = self.state.lock();
            let mut degraded = 0;
            let needs: Vec<(ComponentId, u64, u64)> = skipped
                .iter()
                .map(|&(id, block, count, bytes)| {
                    state.missed(id, block, count);
                    degraded += bytes;
                    (id, block, count)
                })
                .collect();
            self.counters
                .degraded_write_bytes
                .fetch_add(degraded, Ordering::Relaxed);
            state.begin_changes(&spans);
            (
                needs,
                IntentHold {
                    coordinator: self,
                    spans,
                    settled: false,
                },
            )
        };
        // As for a write: recorded before any copy shares the blocks.
        if let Err(e) = self.record_intents_covering(&needs, &intents.spans).await {
            // Nothing was shared: no copy can differ from another by it.
            intents.settled();
            return Err(e);
        }
        let results = join_all(calls).await;
        intents.settled();

        let mut acked = vec![false; pieces.len()];
        let mut failure: Option<BlockError> = None;
        let mut state_changed = false;
        for (index, target, result) in results {
            let p = &pieces[index];
            match result {
                Ok(()) => acked[index] = true,
                Err(ComponentError::NotShared { detail, .. }) => {
                    tracing::info!(volume = %self.info.name, component = %target.id, host = %target.host, %detail, "blocks not shared; copying the data");
                    unshared.insert(index);
                }
                Err(ComponentError::StaleEpoch { highest, .. }) => {
                    failure = Some(self.superseded_by(highest));
                }
                Err(ComponentError::NoSpace { .. }) => {
                    failure.get_or_insert(BlockError::NoSpace {
                        offset: d + p.at,
                        len: p.len,
                    });
                    self.mark_missed(&[target.id], p.target_block, p.blocks());
                    state_changed = true;
                }
                Err(e) => {
                    tracing::warn!(volume = %self.info.name, component = %target.id, host = %target.host, error = %e, "copy missed a shared copy; continuing degraded");
                    self.mark_missed(&[target.id], p.target_block, p.blocks());
                    state_changed = true;
                }
            }
        }
        if state_changed {
            self.record().await?;
        }
        if let Some(e) = failure {
            return Err(e);
        }
        if let Some(p) = pieces
            .iter()
            .enumerate()
            .find(|(i, _)| !acked[*i] && !unshared.contains(i))
            .map(|(_, p)| p)
        {
            return Err(bad(format!(
                "volume {}: no copy of the data acknowledged the copy at offset {}",
                self.info.name,
                d + p.at
            )));
        }
        self.check_usable()?;
        let mut parts: Vec<(u64, u64)> = Vec::new();
        for p in unshared.into_iter().map(|i| pieces[i]) {
            match parts.last_mut() {
                Some((at, n)) if *at + *n == p.at => *n += p.len,
                _ => parts.push((p.at, p.len)),
            }
        }
        Ok(parts)
    }
}

/// Locks the column ranges of `[s, s+len)` of `source` and `[d, d+len)` of
/// `target` in the global order (volume name, column, first block), ranges
/// of one column lock merged where they overlap, so one copy never waits on
/// itself.
async fn lock_both(
    source: &Coordinator,
    s: u64,
    target: &Coordinator,
    d: u64,
    len: u64,
) -> Vec<RangeGuard> {
    let mut wanted: Vec<(&str, usize, u64, u64, &Arc<RangeLock>)> = Vec::new();
    for (c, offset) in [(source, s), (target, d)] {
        for (column, start, end) in c.column_spans(offset, len) {
            wanted.push((c.info.name.as_str(), column, start, end, &c.columns[column]));
        }
    }
    wanted.sort_by(|a, b| (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)));
    let mut merged: Vec<(u64, u64, &Arc<RangeLock>)> = Vec::new();
    for (_, _, start, end, lock) in wanted {
        match merged.last_mut() {
            Some((_, e, l)) if Arc::ptr_eq(l, lock) && start <= *e => *e = (*e).max(end),
            _ => merged.push((start, end, lock)),
        }
    }
    let mut guards = Vec::with_capacity(merged.len());
    for (start, end, lock) in merged {
        guards.push(lock.lock(start, end).await);
    }
    guards
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_types::layout::{ComponentRole, Mirror, STRIPE_UNIT_BYTES};
    use tessera_types::{ComponentId, DiskGroupId, FaultDomainId, HostId, VolumeId};

    fn layout(width: usize) -> Layout {
        let copy = |id: u64| ComponentPlacement {
            id: ComponentId(id),
            role: ComponentRole::Data,
            host: HostId("h1".into()),
            disk_group: DiskGroupId("dg0".into()),
            fault_domain: FaultDomainId("h1".into()),
            votes: 1,
            size_bytes: 1 << 30,
            state: ComponentState::Active,
        };
        Layout {
            volume: VolumeId("v".into()),
            size_bytes: (width as u64) << 30,
            stripe_unit_bytes: STRIPE_UNIT_BYTES,
            columns: (0..width)
                .map(|i| Mirror {
                    copies: vec![copy(i as u64)],
                })
                .collect(),
            witnesses: Vec::new(),
            generation: 1,
        }
    }

    #[test]
    fn one_column_gives_pieces_of_the_clone_limit() {
        let one = layout(1);
        let got = pieces(&one, 0, &one, 64 << 20, 40 << 20);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].blocks(), CLONE_BLOCKS_MAX);
        assert_eq!(got[2].len, 8 << 20);
        assert_eq!(got[1].target_block, ((64 << 20) + (16 << 20)) / BLOCK_BYTES);
        assert_eq!(got.iter().map(|p| p.len).sum::<u64>(), 40 << 20);
    }

    #[test]
    fn stripes_cut_at_the_boundaries_of_both_sides() {
        let two = layout(2);
        // Half a stripe unit apart: every unit of the source spans two
        // target pieces.
        let got = pieces(&two, 0, &two, (8 << 20) + (512 << 10), 2 << 20);
        assert_eq!(
            got.iter().map(|p| p.len).collect::<Vec<_>>(),
            vec![512 << 10, 512 << 10, 512 << 10, 512 << 10]
        );
        assert_eq!(
            got.iter()
                .map(|p| (p.source_column, p.target_column))
                .collect::<Vec<_>>(),
            vec![(0, 0), (0, 1), (1, 1), (1, 0)]
        );
        // The same offsets in both: whole units, column for column.
        let same = pieces(&two, 0, &two, 8 << 20, 4 << 20);
        assert!(same.iter().all(|p| p.source_column == p.target_column));
        assert_eq!(same.iter().map(|p| p.len).sum::<u64>(), 4 << 20);
    }
}
