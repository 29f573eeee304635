#!/usr/bin/env bash
# Resident memory of one disk group holding many snapshots of one volume
# (the component store on files with O_DIRECT): a volume written whole,
# SNAPSHOTS snapshots with WRITES random 4 KiB writes between each two,
# then 10 s of random reads spread over every snapshot. Prints the
# process's resident memory as snapshots are added and after the reads,
# beside the index cache's budget and what it holds: memory follows the
# configured budgets, not the number of snapshots or the volume's size.
#
# Environment: BENCH_DIR (default /work/bench-snapshot-memory), VOLUME_MIB
# (default 4096), SNAPSHOTS (default 1024), WRITES (default 64),
# INDEX_CACHE_MIB (default 64), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

BENCH_DIR=${BENCH_DIR:-/work/bench-snapshot-memory}
VOLUME_MIB=${VOLUME_MIB:-4096}
SNAPSHOTS=${SNAPSHOTS:-1024}
WRITES=${WRITES:-64}
INDEX_CACHE_MIB=${INDEX_CACHE_MIB:-64}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-tessera-store}

cargo build --release -q -p tessera-store --example snapshot_memory
rm -rf "$BENCH_DIR"
mkdir -p "$BENCH_DIR"
trap 'rm -rf "$BENCH_DIR"' EXIT
"$CARGO_TARGET_DIR/release/examples/snapshot_memory" "$BENCH_DIR" "$VOLUME_MIB" "$SNAPSHOTS" "$WRITES" "$INDEX_CACHE_MIB"
