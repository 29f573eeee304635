#!/usr/bin/env bash
# Snapshot depth benchmark of the component store (one disk group on files
# with O_DIRECT): 4 KiB random read IOPS of a volume at snapshot depths 0, 1,
# 8, 32, 256 and 1024 against a reference volume with no snapshots in the
# same disk group, measured in turn in the same run (ratio = volume /
# reference, median of ROUNDS); random 4 KiB writes to 45% of the blocks
# between snapshots up to depth 32, 1% after; snapshot create and delete
# latency with the longest write of a client writing meanwhile; resident
# memory with 1024 snapshots; space the snapshots hold against the blocks
# overwritten; a reference audit at the end.
#
# Environment: BENCH_DIR (default /work/bench-snapshot, on the disk to
# measure), VOLUME_MIB (default 256), SECONDS_PER_CASE (default 5), QD
# (default 8), ROUNDS (default 3), CONTENT_CACHE_MIB (the store's read cache
# of verified blocks; default its default: reads of a volume that fits it
# measure the index lookup's CPU cost, 0 measures reads from the device),
# CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

BENCH_DIR=${BENCH_DIR:-/work/bench-snapshot}
VOLUME_MIB=${VOLUME_MIB:-256}
SECS=${SECONDS_PER_CASE:-5}
QD=${QD:-8}
ROUNDS=${ROUNDS:-3}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-tessera-store}

cargo build --release -q -p tessera-store --example snapshot_bench
rm -rf "$BENCH_DIR"
mkdir -p "$BENCH_DIR"
trap 'rm -rf "$BENCH_DIR"' EXIT
"$CARGO_TARGET_DIR/release/examples/snapshot_bench" "$BENCH_DIR" "$VOLUME_MIB" "$SECS" "$QD" "$ROUNDS"
