#!/usr/bin/env bash
# Cluster benchmark: an FTT=1 volume of `tessera up` (four hosts in one
# process, two copies of every write) versus nbdkit's file plugin serving a
# file on the same disk (one copy), in the same run, both through fio's nbd
# engine over loopback. Prints each figure and the ratio Tessera / nbdkit.
#
# A second reference, the same plugin with every write forced to FUA
# (--filter=fua fuamode=force), has Tessera's durability: its ratio is the
# "ratio-fua" column.
#
# Profiles (issue targets in brackets):
#   mixed     "Iometer mixed": 4 KiB random, 70% read, 8 jobs x iodepth 8  [IOPS >= 0.8x]
#   qd1write  4 KiB random write, 1 job, iodepth 1, mean latency            [latency <= 1.5x]
#   seqwrite  256 KiB sequential write, 1 job, iodepth 8                    [MB/s >= 0.8x]
# Then the resident memory of `tessera up`, idle and after writing
# MEMORY_WRITE bytes (default 4G) to a volume.
#
# Environment: RUNTIME (seconds per profile, default 15), SIZE (volume and
# file size, default 2G), MEMORY_WRITE (default 4G; 0 skips the memory
# figure), CARGO_TARGET_DIR (default target).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-15}
SIZE=${SIZE:-2G}
MEMORY_WRITE=${MEMORY_WRITE:-4G}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}

for tool in fio nbdkit python3; do
  command -v "$tool" >/dev/null || { echo "cluster-bench: $tool is required" >&2; exit 1; }
done

cargo build --release -q -p tessera
tessera="$CARGO_TARGET_DIR/release/tessera"

work=$(mktemp -d -p "${BENCH_DIR:-/work}" tessera-bench.XXXXXX)
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
wait_port() { # host port
  for _ in $(seq 300); do
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "cluster-bench: nothing listening on $1:$2" >&2
  exit 1
}

# fio against URI with a profile; prints "iops lat_us bw_kib" from JSON.
run_fio() { # uri profile
  local uri=$1 profile=$2 args
  case $profile in
    mixed) args=(--rw=randrw --rwmixread=70 --bs=4k --numjobs=8 --iodepth=8) ;;
    qd1write) args=(--rw=randwrite --bs=4k --numjobs=1 --iodepth=1) ;;
    seqwrite) args=(--rw=write --bs=256k --numjobs=1 --iodepth=8) ;;
  esac
  fio --name=bench --ioengine=nbd --uri="$uri" "${args[@]}" --size="$SIZE" \
      --time_based --runtime="$RUNTIME" --group_reporting --output-format=json \
      > "$work/fio.json"
  python3 - "$work/fio.json" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
job = json.loads(text[text.index("{"):])["jobs"][0]
r, w = job["read"], job["write"]
iops = r["iops"] + w["iops"]
lat = w["lat_ns"]["mean"] / 1000 if w["io_bytes"] else r["lat_ns"]["mean"] / 1000
bw = r["bw"] + w["bw"]
print(f"{iops:.0f} {lat:.1f} {bw:.0f}")
PY
}

# --- Tessera -----------------------------------------------------------------
octet=$(( (RANDOM % 200) + 20 ))
bind="127.$octet.$(( RANDOM % 250 )).1"
api_port=$(free_port); nbd_port=$(free_port); transport_port=$(free_port)
"$tessera" up --data-dir "$work/data" --bind "$bind" --api-port "$api_port" \
  --nbd-port "$nbd_port" --transport-port "$transport_port" --host-capacity 12G \
  > "$work/up.log" 2>&1 &
up_pid=$!
pids+=("$up_pid")
wait_port "$bind" "$api_port"
api="http://$bind:$api_port"
"$tessera" --api "$api" volume create bench --size "$SIZE" >/dev/null
# Wait for an owner.
for _ in $(seq 100); do
  "$tessera" --api "$api" volume list --json | python3 -c 'import json,sys; v=[x for x in json.load(sys.stdin) if x["name"]=="bench"][0]; sys.exit(0 if v["owner"] else 1)' && break
  sleep 0.2
done
owner=$("$tessera" --api "$api" volume list --json | python3 -c 'import json,sys; print([x for x in json.load(sys.stdin) if x["name"]=="bench"][0]["owner"])')
k=${owner#host-}
owner_ip="127.$octet.$(echo "$bind" | cut -d. -f3).$k"
tessera_uri="nbd://$owner_ip:$nbd_port/bench"
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
idle_rss=$(rss_kib "$up_pid")

# --- nbdkit file plugin --------------------------------------------------------
truncate -s "$SIZE" "$work/nbdkit.img"
nbdkit_port=$(free_port)
nbdkit --foreground --exit-with-parent --port "$nbdkit_port" --ipaddr 127.0.0.1 \
  file "$work/nbdkit.img" &
pids+=("$!")
wait_port 127.0.0.1 "$nbdkit_port"
nbdkit_uri="nbd://127.0.0.1:$nbdkit_port"

# The same file plugin with every write forced to FUA (fdatasync before the
# reply): the reference with Tessera's durability.
nbdkit_fua_port=$(free_port)
truncate -s "$SIZE" "$work/nbdkit-fua.img"
nbdkit --foreground --exit-with-parent --port "$nbdkit_fua_port" --ipaddr 127.0.0.1 \
  --filter=fua file "$work/nbdkit-fua.img" fuamode=force &
pids+=("$!")
wait_port 127.0.0.1 "$nbdkit_fua_port"
nbdkit_fua_uri="nbd://127.0.0.1:$nbdkit_fua_port"

ratio() { python3 -c "print(f'{$1/$2:.2f}')"; }
printf '%-9s %14s %14s %14s %8s %8s %s\n' profile tessera nbdkit nbdkit-fua ratio ratio-fua target
for profile in seqwrite mixed qd1write; do
  read -r t_iops t_lat t_bw <<<"$(run_fio "$tessera_uri" "$profile")"
  read -r n_iops n_lat n_bw <<<"$(run_fio "$nbdkit_uri" "$profile")"
  read -r f_iops f_lat f_bw <<<"$(run_fio "$nbdkit_fua_uri" "$profile")"
  case $profile in
    mixed) printf '%-9s %9s IOPS %9s IOPS %9s IOPS %8s %8s %s\n' "$profile" "$t_iops" "$n_iops" "$f_iops" "$(ratio "$t_iops" "$n_iops")" "$(ratio "$t_iops" "$f_iops")" ">= 0.8" ;;
    qd1write) printf '%-9s %11s us %11s us %11s us %8s %8s %s\n' "$profile" "$t_lat" "$n_lat" "$f_lat" "$(ratio "$t_lat" "$n_lat")" "$(ratio "$t_lat" "$f_lat")" "<= 1.5 (latency)" ;;
    seqwrite) printf '%-9s %8s KiB/s %8s KiB/s %8s KiB/s %8s %8s %s\n' "$profile" "$t_bw" "$n_bw" "$f_bw" "$(ratio "$t_bw" "$n_bw")" "$(ratio "$t_bw" "$f_bw")" ">= 0.8" ;;
  esac
done

if [ "$MEMORY_WRITE" != "0" ]; then
  "$tessera" --api "$api" volume create memory --size "$MEMORY_WRITE" >/dev/null
  sleep 2
  fio --name=fill --ioengine=nbd --uri="nbd://$owner_ip:$nbd_port/memory" --rw=write \
      --bs=1m --iodepth=8 --size="$MEMORY_WRITE" --output-format=terse >/dev/null 2>&1 || \
    fio --name=fill --ioengine=nbd --uri="nbd://127.$octet.$(echo "$bind" | cut -d. -f3).1:$nbd_port/memory" --rw=write \
      --bs=1m --iodepth=8 --size="$MEMORY_WRITE" --output-format=terse >/dev/null
  echo "tessera up resident memory: idle $((idle_rss / 1024)) MiB, after writing $MEMORY_WRITE $(( $(rss_kib "$up_pid") / 1024 )) MiB"
fi
