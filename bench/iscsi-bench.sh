#!/usr/bin/env bash
# iSCSI target benchmark: Tessera's target on an in-memory volume
# (example `iscsi-memory-server`, release build) versus tgt serving a file
# of the same size in /dev/shm (tmpfs), both on loopback, in the same run.
# Prints each figure and the ratio Tessera / tgt (target >= 1.0x).
#
# Cases (the same parameters against both targets):
#   read   `iscsi-perf -m QD -b 8 -t RUNTIME`: 4 KiB sequential READ(16)
#          with QD commands in flight (default 128, the deepest queue
#          both targets' CmdSN windows admit)
#   write  `qemu-img bench -w -s 4k -d WDEPTH -c WCOUNT` over
#          qemu's iscsi:// driver: 4 KiB sequential writes
#
# Environment: RUNTIME (seconds per iscsi-perf run, default 10), SIZE
# (volume size, default 1G), QD (iscsi-perf queue depth, default 128),
# WDEPTH (qemu-img bench depth, default 64), WCOUNT (writes per qemu-img
# run, default 200000), THREADS (Tessera runtime threads, 0 = one thread,
# default 2), TGT_THREADS (tgtd I/O threads, default 2), REPEAT (runs per
# case and target, best kept, default 3), CARGO_TARGET_DIR (default
# /work/target-iscsi).
#
# The machine is shared: the two targets take turns (ABBA order) and the
# best run of each is compared, so a burst of other load does not decide
# the ratio. Only the processes started here are stopped (by PID); tgt's
# target is deleted and its backing file removed at exit.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-10}
SIZE=${SIZE:-1G}
QD=${QD:-128}
WDEPTH=${WDEPTH:-64}
WCOUNT=${WCOUNT:-200000}
THREADS=${THREADS:-2}
TGT_THREADS=${TGT_THREADS:-2}
REPEAT=${REPEAT:-3}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-iscsi}

for tool in iscsi-perf qemu-img tgtd tgtadm python3; do
  command -v "$tool" >/dev/null || { echo "iscsi-bench: $tool is required" >&2; exit 1; }
done

cargo build --release -q -p tessera-iscsi --example iscsi-memory-server
server_bin="$CARGO_TARGET_DIR/release/examples/iscsi-memory-server"

work=$(mktemp -d)
backing="/dev/shm/tessera-iscsi-bench-$$.img"
pids=()
tgt_control=""
tgt_tid=1
cleanup() {
  if [ -n "$tgt_control" ]; then
    tgtadm -C "$tgt_control" --lld iscsi --op delete --force --mode target --tid "$tgt_tid" \
      >/dev/null 2>&1 || true
    # tgtd leaves on this request, not on SIGTERM.
    tgtadm -C "$tgt_control" --op delete --mode system >/dev/null 2>&1 || true
  fi
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -f "$backing"
  if [ -n "$tgt_control" ]; then
    rm -f "/var/run/tgtd/socket.$tgt_control" "/var/run/tgtd/socket.$tgt_control.lock"
  fi
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "iscsi-bench: nothing listening on port $1" >&2
  exit 1
}

# Tessera.
tessera_port=$(free_port)
"$server_bin" --listen "127.0.0.1:$tessera_port" --size "$SIZE" --name bench \
  --threads "$THREADS" >"$work/tessera.log" 2>&1 &
pids+=($!)
tessera_url="iscsi://127.0.0.1:$tessera_port/iqn.2026-11.io.tessera:bench/0"

# tgt, on its own management socket so another tgtd on the machine is
# never touched.
tgt_port=$(free_port)
tgt_control=$(( 1000 + $$ % 50000 ))
truncate -s "$SIZE" "$backing"
tgtd -f -C "$tgt_control" -t "$TGT_THREADS" --iscsi "portal=127.0.0.1:$tgt_port" \
  >"$work/tgtd.log" 2>&1 &
pids+=($!)
wait_port "$tgt_port"
tgt_iqn="iqn.2026-11.io.tessera.bench:tgt"
for _ in $(seq 50); do
  tgtadm -C "$tgt_control" --lld iscsi --op new --mode target --tid "$tgt_tid" \
    -T "$tgt_iqn" 2>/dev/null && break
  sleep 0.1
done
tgtadm -C "$tgt_control" --lld iscsi --op new --mode logicalunit --tid "$tgt_tid" --lun 1 \
  -b "$backing"
tgtadm -C "$tgt_control" --lld iscsi --op bind --mode target --tid "$tgt_tid" -I ALL
tgt_url="iscsi://127.0.0.1:$tgt_port/$tgt_iqn/1"
wait_port "$tessera_port"

# One iscsi-perf run: prints the average IOPS.
read_iops() {
  iscsi-perf -m "$QD" -b 8 -t "$RUNTIME" "$1" 2>&1 | tr '\r' '\n' \
    | sed -n 's/^iops average \([0-9]*\).*/\1/p' | tail -1
}

# One qemu-img bench run: prints IOPS.
write_iops() {
  local seconds
  seconds=$(qemu-img bench -f raw -w -s 4k -d "$WDEPTH" -c "$WCOUNT" "$1" 2>&1 \
    | sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p')
  python3 -c "print(int($WCOUNT / $seconds))"
}

best() { # name value: keeps the highest value per name
  local file="$work/$1"
  if [ ! -s "$file" ] || [ "$2" -gt "$(cat "$file")" ]; then echo "$2" >"$file"; fi
}

run_case() { # case url name
  local v
  case "$1" in
    read) v=$(read_iops "$2") ;;
    write) v=$(write_iops "$2") ;;
  esac
  [ -n "$v" ] || { echo "iscsi-bench: $1 against $3 gave no figure" >&2; exit 1; }
  printf '  %-5s %-7s %8s IOPS\n' "$1" "$3" "$v"
  best "$1-$3" "$v"
}

echo "iscsi-bench: $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "  read:  iscsi-perf -m $QD -b 8 -t $RUNTIME (4 KiB sequential READ16)"
echo "  write: qemu-img bench -f raw -w -s 4k -d $WDEPTH -c $WCOUNT"
echo "  tessera: iscsi-memory-server --size $SIZE --threads $THREADS;" \
  "tgt: tgtd -t $TGT_THREADS, backing file $SIZE in /dev/shm"
for case in write read; do
  for i in $(seq "$REPEAT"); do
    if [ $((i % 2)) -eq 1 ]; then
      run_case "$case" "$tessera_url" tessera
      run_case "$case" "$tgt_url" tgt
    else
      run_case "$case" "$tgt_url" tgt
      run_case "$case" "$tessera_url" tessera
    fi
  done
done

echo
printf '%-6s %10s %10s %7s\n' case tessera tgt ratio
for case in read write; do
  t=$(cat "$work/$case-tessera")
  g=$(cat "$work/$case-tgt")
  printf '%-6s %10s %10s %7s\n' "$case" "$t" "$g" "$(python3 -c "print(f'{$t / $g:.2f}')")"
done
