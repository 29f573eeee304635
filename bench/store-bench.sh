#!/usr/bin/env bash
# Component store benchmark: 4 KiB random write and read IOPS at queue depths
# 1, 8 and 32 and 256 KiB sequential writes at QD8 through the store
# (durable acknowledgements, O_DIRECT devices) against fio on a raw file on
# the same disk, in the same run, and the store's resident memory after
# writing MEM_GIB sequentially.
#
# Reference (fio, O_DIRECT): writes at QD1 with fdatasync after each write
# (psync); writes and reads at QD 8/32 with libaio and no sync; reads at QD1
# with psync. Prints one line per case with both figures and the ratio.
# Each store case ends by settling the disk group (not timed), so no case
# measures the destaging of the one before.
#
# Environment: BENCH_DIR (default /work/bench-store, must be on the disk to
# measure), SIZE_GIB (data set, default 2), SECONDS_PER_CASE (default 10),
# ROUNDS (fio and store runs alternated per case, median kept; default 3),
# MEM_GIB (default 4; 0 skips), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

BENCH_DIR=${BENCH_DIR:-/work/bench-store}
SIZE_GIB=${SIZE_GIB:-2}
SECS=${SECONDS_PER_CASE:-10}
MEM_GIB=${MEM_GIB:-4}
ROUNDS=${ROUNDS:-3}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-tessera-store}

command -v fio >/dev/null || { echo "fio is required (apt-get install fio)"; exit 1; }
cargo build --release -q -p tessera-store --example store_bench
BIN="$CARGO_TARGET_DIR/release/examples/store_bench"

rm -rf "$BENCH_DIR"
mkdir -p "$BENCH_DIR"
trap 'rm -rf "$BENCH_DIR"' EXIT

echo "preparing: store with ${SIZE_GIB} GiB written, raw file of ${SIZE_GIB} GiB"
"$BIN" prepare "$BENCH_DIR" "$SIZE_GIB" >/dev/null
fio --name=layout --filename="$BENCH_DIR/raw.img" --size="${SIZE_GIB}G" --rw=write --bs=1M \
    --direct=1 --ioengine=psync --end_fsync=1 --output=/dev/null

fio_iops() { # rw qd [durable] [block size]
  local rw=$1 qd=$2 durable=${3:-} bs=${4:-4k} extra=()
  if [ "$qd" -eq 1 ]; then
    extra=(--ioengine=psync)
    [ "$rw" = randwrite ] && extra+=(--fdatasync=1)
  else
    extra=(--ioengine=libaio --iodepth="$qd")
    [ -n "$durable" ] && extra+=(--fdatasync="$qd")
  fi
  fio --name=ref --filename="$BENCH_DIR/raw.img" --size="${SIZE_GIB}G" --rw="$rw" --bs="$bs" \
      --direct=1 --time_based --runtime="$SECS" --randrepeat=0 "${extra[@]}" \
      --output-format=json | python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
print(int(j["write"]["iops"] + j["read"]["iops"]))'
}

store_iops() { # mode qd (mode seqwrite: 256 KiB sequential writes)
  "$BIN" "$1" "$BENCH_DIR" "$SIZE_GIB" "$2" "$SECS" | sed -n 's/^iops=\([0-9]*\).*/\1/p'
}

# For writes at QD 8/32 a second reference is printed (informational; the
# ratio above is against fio without syncs): fio at the same depth with an
# fdatasync after every QD writes, the best a client that needs durable
# writes gets from the raw file, since the device has a volatile write cache
# and every durable write needs a flush (see bench/RESULTS.md).
median() { python3 -c 'import statistics, sys; print(int(statistics.median(int(x) for x in sys.argv[1:])))' "$@"; }

# Each case alternates fio and the store ROUNDS times and prints the median
# of each side: the disk of a shared machine moves by 2x within minutes, and
# alternating spreads that over both sides.
printf '%-8s %4s %12s %12s %7s %14s %7s\n' case qd store_iops fio_iops ratio fio_durable ratio
# The last case, 256 KiB sequential writes at QD8 (a file copy or a
# restore), counts 256 KiB operations on both sides.
for case in write:1 write:8 write:32 read:1 read:8 read:32 seqwrite:8; do
  mode=${case%:*} qd=${case#*:}
  rw=rand$mode bs=4k
  [ "$mode" = seqwrite ] && rw=write bs=256k
  refs=() gots=() drefs=()
  for _ in $(seq "$ROUNDS"); do
    refs+=("$(fio_iops "$rw" "$qd" "" "$bs")")
    gots+=("$(store_iops "$mode" "$qd")")
    if [ "$mode" != read ] && [ "$qd" -gt 1 ]; then
      drefs+=("$(fio_iops "$rw" "$qd" durable "$bs")")
    fi
  done
  ref=$(median "${refs[@]}")
  got=$(median "${gots[@]}")
  ratio=$(python3 -c "print(f'{$got/$ref:.2f}')")
  dref='-' dratio='-'
  if [ "${#drefs[@]}" -gt 0 ]; then
    dref=$(median "${drefs[@]}")
    dratio=$(python3 -c "print(f'{$got/$dref:.2f}')")
  fi
  printf '%-8s %4s %12s %12s %7s %14s %7s\n' "$mode" "$qd" "$got" "$ref" "$ratio" "$dref" "$dratio"
done

if [ "$MEM_GIB" -gt 0 ]; then
rm -f "$BENCH_DIR"/store-*.img
echo "memory: $("$BIN" memory "$BENCH_DIR" "$MEM_GIB")"
fi
