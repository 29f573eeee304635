#!/usr/bin/env bash
# NBD frontend benchmark: Tessera's NBD server on an in-memory device versus
# `nbdkit memory` in the same run, both over loopback TCP, driven by fio's
# nbd engine. Prints each figure and the ratio Tessera / nbdkit (target
# >= 1.0x: the protocol layer must not be the bottleneck), with the CPU each
# server and the fio client spent per I/O (client and server share the two
# cores, so what one server makes the client spend counts too).
#
# Profiles:
#   mixed    "Iometer mixed": 4 KiB random, 70% read, 8 jobs x iodepth 8
#   seqwrite 256 KiB sequential write, 4 jobs x iodepth 8 (one region each)
#   seqread  256 KiB sequential read of what seqwrite wrote
#
# Environment: RUNTIME (seconds per profile, default 15), SIZE (export size,
# default 1G), THREADS (server runtime threads: 0 = one thread, N = a
# runtime with N workers, per-connection = one thread per connection;
# default 2),
# PROFILES (default "seqwrite mixed seqread"; seqread reads what seqwrite
# wrote), REPEAT (runs per profile and server, best one kept, default 3),
# CARGO_TARGET_DIR (default /work/target-tessera-nbd).
#
# The machine is shared: each side runs REPEAT times, the two sides take
# turns (ABBA order), and the best run of each side is compared, so a burst
# of someone else's load does not decide the ratio.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-15}
SIZE=${SIZE:-1G}
THREADS=${THREADS:-2}
PROFILES=${PROFILES:-seqwrite mixed seqread}
REPEAT=${REPEAT:-3}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-tessera-nbd}

for tool in fio nbdkit python3; do
  command -v "$tool" >/dev/null || { echo "nbd-bench: $tool is required" >&2; exit 1; }
done

cargo build --release -q -p tessera-nbd --example nbd-memory-server
server_bin="$CARGO_TARGET_DIR/release/examples/nbd-memory-server"

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
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
  echo "nbd-bench: nothing listening on port $1" >&2
  exit 1
}

tessera_port=$(free_port)
if [ "$THREADS" = per-connection ]; then
  server_mode=(--thread-per-connection)
else
  server_mode=(--threads "$THREADS")
fi
"$server_bin" --listen "127.0.0.1:$tessera_port" --size "$SIZE" "${server_mode[@]}" \
  >"$work/tessera.log" 2>&1 &
pids+=($!)
tessera_pid=$!
nbdkit_port=$(free_port)
nbdkit -f -i 127.0.0.1 -p "$nbdkit_port" memory "$SIZE" >"$work/nbdkit.log" 2>&1 &
pids+=($!)
nbdkit_pid=$!
wait_port "$tessera_port"
wait_port "$nbdkit_port"

# Writes a job file for a profile.
job() {
  local profile=$1 file="$work/$1.fio"
  {
    echo "[global]"
    echo "ioengine=nbd"
    echo "uri=\${NBD_URI}"
    echo "group_reporting=1"
    case $profile in
      mixed)
        echo "rw=randrw"; echo "rwmixread=70"; echo "bs=4k"
        echo "numjobs=8"; echo "iodepth=8"; echo "size=$SIZE"
        echo "time_based=1"; echo "runtime=$RUNTIME" ;;
      seqwrite|seqread)
        [ "$profile" = seqwrite ] && echo "rw=write" || echo "rw=read"
        echo "bs=256k"; echo "numjobs=4"; echo "iodepth=8"
        echo "size=256m"; echo "offset_increment=256m"
        echo "time_based=1"; echo "runtime=$RUNTIME" ;;
    esac
    echo "[$profile]"
  } >"$file"
  echo "$file"
}

# CPU time a process has used, in clock ticks (user + system).
cpu_ticks() {
  awk '{ print $14 + $15 }' "/proc/$1/stat"
}

# Runs a profile against a URI served by process $3; prints
# "IOPS MiB/s server-CPU-us-per-IO client-CPU-us-per-IO" (reads + writes).
# The client's CPU is fio's own figure (user + system, averaged over its
# jobs), which includes the kernel's work on the client side of loopback.
measure() {
  local profile=$1 uri=$2 pid=$3 before after jobs=4
  [ "$profile" = mixed ] && jobs=8
  before=$(cpu_ticks "$pid")
  NBD_URI=$uri fio --output-format=terse --terse-version=3 "$(job "$profile")" 2>/dev/null >"$work/fio.out"
  after=$(cpu_ticks "$pid")
  awk -F';' -v ticks=$((after - before)) -v hz="$(getconf CLK_TCK)" -v secs="$RUNTIME" -v jobs=$jobs '
    /^3;/ { iops = $8 + $49; usr = $88; sys = $89; sub("%", "", usr); sub("%", "", sys)
            printf "%.0f %.1f %.1f %.1f\n", iops, ($7 + $48) / 1024, ticks / hz * 1e6 / (iops * secs),
                   (usr + sys) / 100 * jobs * 1e6 / iops }' "$work/fio.out"
}

declare -A result
# Keeps the run with more IOPS.
best() {
  if [ -z "${1:-}" ]; then echo "$2"; return; fi
  awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " "); print (y[1] > x[1]) ? b : a }'
}
turn=0
for profile in $PROFILES; do
  for _ in $(seq "$REPEAT"); do
    if [ $((turn % 2)) -eq 0 ]; then order="tessera nbdkit"; else order="nbdkit tessera"; fi
    turn=$((turn + 1))
    for side in $order; do
      if [ "$side" = tessera ]; then port=$tessera_port pid=$tessera_pid; else port=$nbdkit_port pid=$nbdkit_pid; fi
      run=$(measure "$profile" "nbd://127.0.0.1:$port/" "$pid")
      echo "  $profile $side: $run (IOPS MiB/s server-CPU-us/IO client-CPU-us/IO), load average $(cut -d' ' -f1 /proc/loadavg)" >&2
      result[$profile.$side]=$(best "${result[$profile.$side]:-}" "$run")
    done
  done
done

printf '%-9s %37s %37s %7s %9s\n' profile "tessera IOPS MiB/s CPU-us/IO fio-us/IO" "nbdkit IOPS MiB/s CPU-us/IO fio-us/IO" ratio "CPU/IO"
for profile in $PROFILES; do
  read -r t_iops t_bw t_cpu t_client <<<"${result[$profile.tessera]}"
  read -r k_iops k_bw k_cpu k_client <<<"${result[$profile.nbdkit]}"
  ratio=$(awk -v a="$t_iops" -v b="$k_iops" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
  cpu=$(awk -v a="$t_cpu" -v b="$k_cpu" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print "n/a" }')
  printf '%-9s %9s %9s %8s %8s %9s %9s %8s %8s %6sx %8sx\n' "$profile" "$t_iops" "$t_bw" "$t_cpu" "$t_client" \
    "$k_iops" "$k_bw" "$k_cpu" "$k_client" "$ratio" "$cpu"
done
