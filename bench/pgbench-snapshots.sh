#!/usr/bin/env bash
# PostgreSQL throughput while snapshots are taken: pgbench (TPC-B like, the
# default script) on PostgreSQL on ext4 on an FTT=1 volume of `tessera up`
# (nbdfuse and a loop device), ROUNDS times each way in turn (A B A B): a
# run with no snapshots, then a run with a snapshot taken with the CLI every
# SNAPSHOT_EVERY seconds (nothing stopped or frozen). Prints each run's tps
# and the ratio of the medians (with / without; the issue's target is >=
# 0.95), and the snapshots' create times as the CLI saw them.
#
# Needs root, /dev/fuse, a free loop device, nbdfuse, e2fsprogs and
# PostgreSQL's server binaries (/usr/lib/postgresql/*/bin).
#
# Environment: RUNTIME (seconds per run, default 30), ROUNDS (default 2),
# SNAPSHOT_EVERY (default 5), SCALE (pgbench scale, default 20), CLIENTS
# (default 8), VOLUME_SIZE (default 2G), BENCH_DIR (default /work),
# CARGO_TARGET_DIR (default target).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-30}
ROUNDS=${ROUNDS:-2}
SNAPSHOT_EVERY=${SNAPSHOT_EVERY:-5}
SCALE=${SCALE:-20}
CLIENTS=${CLIENTS:-8}
VOLUME_SIZE=${VOLUME_SIZE:-2G}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}

pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort | tail -1)
[ -x "$pgbin/initdb" ] || { echo "pgbench-snapshots: PostgreSQL is required" >&2; exit 1; }
for tool in nbdfuse losetup mkfs.ext4 runuser python3; do
  command -v "$tool" >/dev/null || { echo "pgbench-snapshots: $tool is required" >&2; exit 1; }
done

cargo build --release -q -p tessera
tessera="$(pwd)/$CARGO_TARGET_DIR/release/tessera"
[ -x "$tessera" ] || tessera="$CARGO_TARGET_DIR/release/tessera"

work=$(mktemp -d -p "${BENCH_DIR:-/work}" tessera-pgbench.XXXXXX)
chmod 755 "$work"
up_pid=""; fuse_pid=""; loopdev=""
cleanup() {
  [ -f "$work/mnt/pgdata/postmaster.pid" ] && runuser -u postgres -- "$pgbin/pg_ctl" -D "$work/mnt/pgdata" -m fast -w stop >/dev/null 2>&1 || true
  mountpoint -q "$work/mnt" && umount "$work/mnt" || true
  [ -n "$loopdev" ] && losetup -d "$loopdev" || true
  fusermount3 -u "$work/fuse" 2>/dev/null || true
  [ -n "$fuse_pid" ] && kill "$fuse_pid" 2>/dev/null || true
  [ -n "$up_pid" ] && kill "$up_pid" 2>/dev/null && wait "$up_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
bind=127.0.$(( $$ % 200 + 20 )).1
api_port=$(free_port); nbd_port=$(free_port)
# The CLI presents the admin token `tessera up` writes there.
export TESSERA_TOKEN_FILE="$work/data/admin.token"
"$tessera" up --data-dir "$work/data" --bind "$bind" --host-capacity 8G \
  --api-port "$api_port" --nbd-port "$nbd_port" \
  --iscsi-port "$(free_port)" --transport-port "$(free_port)" >"$work/up.log" 2>&1 &
up_pid=$!
cli() { "$tessera" --api "https://$bind:$api_port" "$@"; }
for _ in $(seq 300); do cli status >/dev/null 2>&1 && break; sleep 0.2; done
cli volume create pg --size "$VOLUME_SIZE" >/dev/null
owner=""
for _ in $(seq 300); do
  owner=$(cli volume show pg --json | python3 -c 'import json,sys; print(json.load(sys.stdin).get("owner") or "")')
  [ -n "$owner" ] && break
  sleep 0.2
done
k=${owner#host-}
ip=${bind%.1}.$k

mkdir -p "$work/fuse" "$work/mnt" "$work/sock" "$work/logs"
nbdfuse -P "$work/nbdfuse.pid" "$work/fuse/disk" "nbd://$ip:$nbd_port/pg" &
fuse_pid=$!
for _ in $(seq 600); do [ -e "$work/fuse/disk" ] && [ -f "$work/nbdfuse.pid" ] && break; sleep 0.05; done
loopdev=$(losetup -f --show "$work/fuse/disk")
mkfs.ext4 -q -F "$loopdev"
mount "$loopdev" "$work/mnt"
mkdir -p "$work/mnt/pgdata"
chown -R postgres:postgres "$work/mnt/pgdata" "$work/sock" "$work/logs"
runuser -u postgres -- "$pgbin/initdb" -D "$work/mnt/pgdata" -A trust -U postgres >/dev/null
port=$(free_port)
runuser -u postgres -- "$pgbin/pg_ctl" -D "$work/mnt/pgdata" -l "$work/logs/pg.log" -w \
  -o "-p $port -k $work/sock -c listen_addresses=''" start >/dev/null
pgb() { runuser -u postgres -- "$pgbin/pgbench" -h "$work/sock" -p "$port" -U postgres "$@" postgres; }
echo "pgbench: initialising scale $SCALE on volume pg (owner $owner)"
pgb -i -q -s "$SCALE" >/dev/null 2>&1

run() { # with_snapshots(0/1) round
  local snapper=""
  if [ "$1" = 1 ]; then
    (
      n=0
      while true; do
        sleep "$SNAPSHOT_EVERY"
        n=$((n + 1))
        start=$(date +%s%N)
        cli snapshot create pg "r$2-s$n" >/dev/null
        echo $(( ($(date +%s%N) - start) / 1000000 )) >> "$work/create-ms"
      done
    ) &
    snapper=$!
  fi
  tps=$(pgb -T "$RUNTIME" -c "$CLIENTS" -j 2 -n 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
  if [ -n "$snapper" ]; then kill "$snapper" 2>/dev/null; wait "$snapper" 2>/dev/null || true; fi
  echo "$tps"
}

without=(); with=()
for round in $(seq "$ROUNDS"); do
  a=$(run 0 "$round"); without+=("$a")
  b=$(run 1 "$round"); with+=("$b")
  echo "round $round: tps without snapshots $a, with a snapshot every ${SNAPSHOT_EVERY}s $b"
done
python3 - "${without[*]}" "${with[*]}" "$work/create-ms" <<'PY'
import statistics, sys
without = [float(x) for x in sys.argv[1].split()]
with_ = [float(x) for x in sys.argv[2].split()]
creates = sorted(int(x) for x in open(sys.argv[3]).read().split())
a, b = statistics.median(without), statistics.median(with_)
print(f"median tps: without {a:.0f}, with snapshots {b:.0f}: ratio {b / a:.3f} (target >= 0.95)")
print(f"snapshots taken: {len(creates)}; CLI create time median {statistics.median(creates)} ms, max {creates[-1]} ms")
PY
echo "snapshots of pg: $(cli snapshot list pg --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')"
