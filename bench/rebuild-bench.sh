#!/usr/bin/env bash
# Rebuild and QoS benchmark: what a rebuild costs the guests of its owner
# host, how fast it goes under their load, and whether per-volume QoS
# (IOPS limit and IOPS minimum, enforced by the owner's I/O scheduler)
# holds, on `tessera up --fault-injection` (four hosts in one process, FTT=1
# volumes), through fio's nbd engine over loopback. Every figure is a ratio
# against a reference measured in the same run. Targets in brackets.
#
# Parts (PARTS, default "rebuild multiplier limit minimum"):
#   rebuild     "Iometer mixed" (4 KiB random, 70% read, 8 jobs x 8 deep) on
#               volume fg while the lost copy of volume rb is rebuilt after
#               its disk group failed (`tessera fault fail-device HOST
#               --device 0`). fg IOPS during the rebuild / fg IOPS of the
#               same fio for RUNTIME seconds just before the failure
#               [>= 0.9]; rebuild rate with fg running / rebuild rate of
#               the same failure on a separate cluster with no guest I/O
#               [>= 0.5].
#   multiplier  the same with-fg measurement with resync_delay_multiplier
#               at each of MULTIPLIERS (default "1 6 64"), a fresh cluster
#               each (a failed disk group stays failed, and the rebuild
#               needs the fourth host). The rebuild part's figures are
#               those of multiplier 1, the default.
#   limit       a volume whose policy has --iops-limit 2000 and a neighbour
#               with no QoS, same owner, each under fio 4 KiB randrw 70/30
#               at iodepth 16, at once: limited IOPS / 2000 [0.95-1.05],
#               and the neighbour's IOPS.
#   minimum     a volume whose policy has --iops-minimum 1000 and eight
#               neighbours with no QoS, same owner, nine fio 4 KiB randrw
#               70/30 at iodepth 16 started together (9 x 16 = 144
#               operations, more than the 64 the owner's scheduler lets run
#               at once, so a queue can form in it; where the CPUs are the
#               bound, much of it waits in the clients and the sockets
#               instead): the reserved volume's IOPS [>= 1000] and the
#               neighbours' sum; the reference is the same run just before,
#               with the minimum set to 0 (none).
#
# Placement. The I/O scheduler is per owner host, so fg and rb must have the
# same owner, and the failed disk group must hold rb's second data copy but
# no component of fg. Placement is deterministic (a volume's first data copy
# goes to the disk group with the most free space, which then owns it; the
# second to the next; the witness to the freest host left), so the script
# steers it with thin placeholder volumes of FTT=0 and 100% space
# reservation (no data is written to them) before creating rb and fg, and
# deletes them afterwards; it checks the result with `object show` and
# prints the hosts. The limit and minimum volumes are all created, unwritten,
# after one placeholder makes one host the freest, so they share its owner.
#
# Measurement. rb (RB_SIZE) and fg (FG_SIZE) are filled first (1 MiB
# sequential writes over the whole volume), so the rebuild copies real data
# and fg's reads find some. A failed device is noticed at the next I/O that
# reaches it, so right after the failure 16 writes of 4 KiB go to rb. The
# rebuild is watched with `tessera resync list --json` every 0.5 s (its row:
# volume rb, kind rebuild). The rebuild rate is the growth of the row's
# copied_bytes between the first and the last poll that saw it running,
# over the time between those polls (so start-up and the wait for the
# failure to be noticed are not counted; for a rebuild that finished, its
# own rate_bytes_per_s, examined bytes over its whole attempt, is printed
# beside it). For the rebuild alone, the CPU time of `tessera up` from the
# failure to the end over the bytes the rebuild copied is printed too (ms
# per MiB): less noisy than the rates on a shared machine, and what the
# guests lose to a rebuild where the CPUs are the bound. The with-fg fio
# starts 3 s before the failure, prints its
# counters every second (--status-interval=1, JSON), and is stopped once
# the rebuild finished or FG_MAX seconds after it started; fg's IOPS during
# the rebuild count only the operations between the first and the last of
# those snapshots taken while the polls saw the rebuild running. A rebuild
# still running at FG_MAX is rated over that window only (printed as
# "unfinished"), and its cluster is stopped.
#
# Environment: RUNTIME (seconds of each fio that is not stopped by a
# rebuild, default 20), RB_SIZE (default 4G: 16-26 s of rebuild alone on
# the 2-core machine of bench/RESULTS.md), FG_SIZE (default 1G), FG_IODEPTH
# (iodepth of each of fg's 8 jobs, default 8: 64 in flight, as many as the
# owner's scheduler runs at once; deeper lets a queue form in it, which is
# where the multiplier acts: on the machine of bench/RESULTS.md it did at
# 64, not at 16), QOS_SIZE
# (each limit/minimum volume, default 512M), FG_MAX (longest with-fg
# window, default 90), MULTIPLIERS (default "1 6 64"), PARTS (default "rebuild
# multiplier limit minimum"), IOPS_LIMIT (default 2000), IOPS_MINIMUM
# (default 1000), REBUILD_ROUNDS (default 1: with more, the rebuild part
# runs the rebuild alone and the rebuild beside fg at multiplier 1 that
# many times in turns, each pair's ratios taken within the pair, and the
# summary gives their medians: on a shared machine whose speed moves
# between one cluster and the next by more than the effect measured, one
# pair says little), HOST_CAPACITY (default 8G), BENCH_DIR (where
# the clusters' devices go, default /work: each rebuild cluster needs about
# 3 x RB_SIZE + 2 x FG_SIZE + 4 GiB of it), CARGO_TARGET_DIR (default
# target), TESSERA_BIN (a `tessera` binary to run instead of building this
# tree).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-20}
RB_SIZE=${RB_SIZE:-4G}
FG_SIZE=${FG_SIZE:-1G}
QOS_SIZE=${QOS_SIZE:-512M}
FG_MAX=${FG_MAX:-90}
FG_IODEPTH=${FG_IODEPTH:-8}
MULTIPLIERS=${MULTIPLIERS:-1 6 64}
PARTS=${PARTS:-rebuild multiplier limit minimum}
HOST_CAPACITY=${HOST_CAPACITY:-8G}
IOPS_LIMIT=${IOPS_LIMIT:-2000}
IOPS_MINIMUM=${IOPS_MINIMUM:-1000}
REBUILD_ROUNDS=${REBUILD_ROUNDS:-1}
# Seconds for a change of space (a create, a delete, a fill) to reach the
# directory that placement reads: hosts publish their usage every 2 s.
SETTLE=2.5
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}

for tool in fio python3; do
  command -v "$tool" >/dev/null || { echo "rebuild-bench: $tool is required" >&2; exit 1; }
done
has_part() { [[ " $PARTS " == *" $1 "* ]]; }

# TESSERA_BIN runs another build (e.g. the commit before a change, for a
# same-machine comparison) instead of building this tree.
if [ -z "${TESSERA_BIN:-}" ]; then
  cargo build --release -q -p tessera
fi
tessera=${TESSERA_BIN:-$CARGO_TARGET_DIR/release/tessera}

work=$(mktemp -d -p "${BENCH_DIR:-/work}" tessera-rebuild-bench.XXXXXX)
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
  echo "rebuild-bench: nothing listening on $1:$2" >&2
  exit 1
}
bytes() { # size with a binary unit -> bytes
  python3 -c '
import re, sys
m = re.fullmatch(r"(\d+)([KMGT]?)", sys.argv[1].upper())
print(int(m[1]) * 1024 ** " KMGT".index(m[2] or " "))' "$1"
}
ratio() { python3 -c 'import sys; a, b = (float(x or 0) for x in sys.argv[1:]); print(f"{a / b:.2f}" if b else "-")' "$1" "$2"; }
mib() { python3 -c 'import sys; print(f"{float(sys.argv[1] or 0) / 1048576:.0f}")' "$1"; }
start_s=$(date +%s)
echo "rebuild-bench: $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"

# --- Helpers in python -------------------------------------------------------
# Polls `resync list --json` every 0.5 s for volume rb's rebuild row until it
# is done or failed, or until MAX seconds after it was first seen running,
# or TIMEOUT seconds in all. Prints one JSON object: the samples (wall time,
# state, copied bytes) and the last row.
cat > "$work/poll.py" <<'PY'
import json, subprocess, sys, time
tessera, api, volume, max_s, timeout_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
samples, row, began = [], None, time.time()
first_running = None
while True:
    t = time.time()
    out = subprocess.run([tessera, "--api", api, "resync", "list", "--json"],
                         capture_output=True, text=True)
    rows = json.loads(out.stdout) if out.returncode == 0 else []
    rows = [r for r in rows if r["volume"] == volume and r["kind"] == "rebuild"]
    if rows:
        row = rows[0]
        samples.append([t, row["state"], row["copied_bytes"]])
        if row["state"] == "running" and first_running is None:
            first_running = t
        if row["state"] in ("done", "failed"):
            break
    if first_running is not None and t - first_running >= max_s:
        break
    if t - began >= timeout_s:
        break
    time.sleep(max(0.0, 0.5 - (time.time() - t)))
print(json.dumps({"samples": samples, "row": row}))
PY

# Rebuild rate from the poller's output: "rate_B/s window_start window_end
# copied_in_window state server_rate_B/s attempts". Window: first to last
# poll that saw the row running.
cat > "$work/rate.py" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
run = [s for s in d["samples"] if s[1] == "running"]
row = d["row"] or {}
if len(run) < 2:
    print("0 0 0 0", row.get("state", "none"), row.get("rate_bytes_per_s", 0), row.get("attempts", 0))
    sys.exit()
(t0, _, c0), (t1, _, c1) = run[0], run[-1]
print(f"{(c1 - c0) / (t1 - t0):.0f} {t0:.3f} {t1:.3f} {c1 - c0}", row["state"],
      row["rate_bytes_per_s"], row["attempts"])
PY

# IOPS of a fio JSON output file: with a window "T0 T1" (wall seconds), the
# operations between the first and the last --status-interval snapshot taken
# inside it, over the time between them ("iops seconds"); without, the
# final report's IOPS. Also names a fio error, if any.
cat > "$work/iops.py" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
dec, i, snaps = json.JSONDecoder(), 0, []
while (j := text.find("{", i)) >= 0:
    obj, i = dec.raw_decode(text, j)
    snaps.append(obj)
job = snaps[-1]["jobs"][0]
if job.get("error"):
    print(f"fio error {job['error']}", file=sys.stderr)
ios = lambda o: o["jobs"][0]["read"]["total_ios"] + o["jobs"][0]["write"]["total_ios"]
if len(sys.argv) == 2:
    print(f"{job['read']['iops'] + job['write']['iops']:.0f} {job['job_runtime'] / 1000 / max(1, len(snaps[-1]['jobs'])):.1f}")
    sys.exit()
t0, t1 = float(sys.argv[2]) * 1000, float(sys.argv[3]) * 1000
inside = [o for o in snaps if t0 <= o["timestamp_ms"] <= t1]
if len(inside) < 2:
    print("0 0")
    sys.exit()
a, b = inside[0], inside[-1]
dt = (b["timestamp_ms"] - a["timestamp_ms"]) / 1000
print(f"{(ios(b) - ios(a)) / dt:.0f} {dt:.1f}")
PY

# --- Clusters ------------------------------------------------------------------
# Starts `tessera up` in $work/NAME; sets api, prefix (host k is $prefix.k),
# nbd_port, up_pid, data.
start_cluster() { # name
  local octet third api_port transport_port iscsi_port
  octet=$(( (RANDOM % 200) + 20 )); third=$(( RANDOM % 250 ))
  prefix="127.$octet.$third"
  api_port=$(free_port); nbd_port=$(free_port); transport_port=$(free_port); iscsi_port=$(free_port)
  data="$work/$1"
  # The CLI presents the admin token `tessera up` writes there.
  export TESSERA_TOKEN_FILE="$data/admin.token"
  "$tessera" up --data-dir "$data" --bind "$prefix.1" --api-port "$api_port" \
    --nbd-port "$nbd_port" --iscsi-port "$iscsi_port" --transport-port "$transport_port" \
    --host-capacity "$HOST_CAPACITY" --fault-injection > "$work/$1.log" 2>&1 &
  up_pid=$!
  pids+=("$up_pid")
  wait_port "$prefix.1" "$api_port"
  api="https://$prefix.1:$api_port"
  for _ in $(seq 100); do
    tcli host list --json 2>/dev/null | python3 -c '
import json, sys
sys.exit(0 if sum(h["state"] == "present" for h in json.load(sys.stdin)) == 4 else 1)' && return 0
    sleep 0.2
  done
  echo "rebuild-bench: the four hosts of $1 did not come up (see its log)" >&2
  exit 1
}
stop_cluster() {
  kill "$up_pid" 2>/dev/null || true
  wait "$up_pid" 2>/dev/null || true
  rm -rf "$data"
}
tcli() { "$tessera" --api "$api" "$@"; }
owner_of() { # volume
  tcli volume list --json | python3 -c '
import json, sys
print([v for v in json.load(sys.stdin) if v["name"] == sys.argv[1]][0]["owner"] or "")' "$1"
}
# Hosts of a volume's components of ROLE (data|witness), in layout order.
hosts_of() { # volume role
  tcli object show "$1" --json | python3 -c '
import json, sys
print(" ".join(c["host"] for c in json.load(sys.stdin)["components"] if c["role"] == sys.argv[1]))' "$2"
}
uri_of() { # volume: through its owner's address
  local owner
  owner=$(owner_of "$1")
  echo "nbd://$prefix.${owner#host-}:$nbd_port/$1"
}
fill() { # volume size
  fio --name=fill --ioengine=nbd --uri="$(uri_of "$1")" --rw=write --bs=1m --iodepth=8 \
      --size="$2" --output-format=terse >/dev/null
}
# A placeholder: FTT=0, every byte reserved, never written; prints its host.
pad() { # name size
  tcli volume create "$1" --size "$2" --policy pad >/dev/null
  sleep "$SETTLE"
  hosts_of "$1" data
}
free_gib() { python3 -c 'import shutil, sys; print(shutil.disk_usage(sys.argv[1]).free >> 30)' "$work"; }
need_space() { # GiB
  if [ "$(free_gib)" -lt "$1" ]; then
    echo "rebuild-bench: $(free_gib) GiB free under $work, $1 GiB needed" >&2
    exit 1
  fi
}

mixed_args=(--rw=randrw --rwmixread=70 --bs=4k --numjobs=8 --iodepth="$FG_IODEPTH" --group_reporting)

# --- Rebuild -------------------------------------------------------------------
rb_bytes=$(bytes "$RB_SIZE")
fg_bytes=$(bytes "$FG_SIZE")

# Places rb and fg as wanted on the running cluster (see the header) and
# fills them; sets owner, lost (the host whose disk group fails).
rebuild_layout() {
  tcli policy create pad --ftt 0 --space-reservation 100 >/dev/null
  # a on the future lost host; b, bigger, on the three others; then the b of
  # one of them goes, so it is the freest (rb's owner) and the lost host the
  # next (rb's second copy). After rb is filled, b > RB_SIZE keeps the owner
  # the freest for fg's first copy, and b < 1G + RB_SIZE leaves the lost
  # host the least free, so fg's other copy and witness go elsewhere.
  local a=$((1 << 30)) b=$((rb_bytes + (1 << 29))) h tries
  lost=$(pad pad-a "$a")
  local others=()
  for i in 1 2 3; do others+=("$(pad "pad-b$i" "$b")"); done
  tcli volume delete pad-b1 >/dev/null
  sleep "$SETTLE"
  tcli volume create rb --size "$RB_SIZE" >/dev/null
  owner=$(owner_of rb)
  read -r -a rb_data <<<"$(hosts_of rb data)"
  fill rb "$RB_SIZE"
  sleep "$SETTLE"
  for tries in 1 2 3 4 5; do
    tcli volume create fg --size "$FG_SIZE" >/dev/null
    fg_hosts="$(hosts_of fg data) $(hosts_of fg witness)"
    if [ "$(owner_of fg)" = "$owner" ] && [[ " $fg_hosts " != *" $lost "* ]]; then break; fi
    [ "$tries" = 5 ] && { echo "rebuild-bench: WARNING: fg is on $fg_hosts, owner $(owner_of fg): not the placement wanted"; break; }
    tcli volume delete fg >/dev/null
    sleep "$SETTLE"
  done
  for h in pad-a pad-b2 pad-b3; do tcli volume delete "$h" >/dev/null; done
  fill fg "$FG_SIZE"
  if [ "${rb_data[0]}" != "$owner" ] || [ "${rb_data[1]}" != "$lost" ]; then
    echo "rebuild-bench: WARNING: rb's copies are on ${rb_data[*]}, not $owner and $lost: failing the second copy's host"
    lost=${rb_data[1]}
  fi
  echo "  placement: rb owner $owner, copies ${rb_data[*]}, witness $(hosts_of rb witness); fg owner $(owner_of fg), copies $(hosts_of fg data), witness $(hosts_of fg witness); failing $lost's disk group (placeholders were on $lost and ${others[*]})"
  sleep "$SETTLE"
}

# Fails the lost disk group, makes I/O reach it, and polls the rebuild until
# it ends or has run MAX seconds; the poller's JSON goes to FILE.
fail_and_watch() { # file max
  tcli fault fail-device "$lost" --device 0 >/dev/null
  fio --name=notice --ioengine=nbd --uri="$(uri_of rb)" --rw=write --bs=4k --size=64k \
      --output-format=terse >/dev/null || true
  python3 "$work/poll.py" "$tessera" "$api" rb "$2" 900 > "$1"
}

# Prints the rebuild line and sets rate (B/s) for the poller's FILE.
report_rebuild() { # file label
  local t0 t1 copied state server attempts
  read -r rate t0 t1 copied state server attempts <<<"$(python3 "$work/rate.py" "$1")"
  local secs note=""
  secs=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
  if [ "$state" = done ]; then
    note=", done (its own rate over the whole attempt: $(mib "$server") MiB/s)"
  else
    note=", unfinished ($state when the watch stopped at $FG_MAX s)"
  fi
  [ "$attempts" -gt 1 ] 2>/dev/null && note="$note, $attempts attempts"
  echo "  $2: rebuild copied $(mib "$copied") MiB in ${secs} s = $(mib "$rate") MiB/s$note"
}

declare -A fg_before fg_during rb_rate fg_window
rate_alone="" cpu_alone=""
# CPU time (user + system) of a process so far, in microseconds.
cpu_us() {
  awk -v hz="$(getconf CLK_TCK)" '{print int(($14 + $15) * 1000000 / hz)}' "/proc/$1/stat"
}
run_rebuild() { # multiplier | alone
  local name="rebuild-$1"
  need_space $(( (3 * rb_bytes + 2 * fg_bytes) / (1 << 30) + 5 ))
  echo "cluster $name:"
  start_cluster "$name"
  [ "$1" != alone ] && tcli settings set resync_delay_multiplier "$1" >/dev/null
  rebuild_layout
  if [ "$1" = alone ]; then
    local cpu0 cpu1
    cpu0=$(cpu_us "$up_pid")
    fail_and_watch "$work/poll-$1.json" 900
    cpu1=$(cpu_us "$up_pid")
    report_rebuild "$work/poll-$1.json" "no guest I/O"
    rate_alone=$rate
    cpu_alone=$(python3 -c '
import json, sys
row = json.load(open(sys.argv[1]))["row"] or {}
print(f"{int(sys.argv[2]) / 1000 / max(row.get('"'"'copied_bytes'"'"', 0) / 2**20, 1):.2f}")' \
      "$work/poll-$1.json" "$((cpu1 - cpu0))")
    echo "  CPU of tessera up from the failure to the end: $cpu_alone ms per MiB rebuilt"
  else
    fio --name=fg --ioengine=nbd --uri="$(uri_of fg)" "${mixed_args[@]}" --size="$FG_SIZE" \
        --time_based --runtime="$RUNTIME" --output-format=json > "$work/fio-before.json"
    read -r fg_before[$1] _ <<<"$(python3 "$work/iops.py" "$work/fio-before.json")"
    fio --name=fg --ioengine=nbd --uri="$(uri_of fg)" "${mixed_args[@]}" --size="$FG_SIZE" \
        --time_based --runtime=$((FG_MAX + 900)) --status-interval=1 --output-format=json \
        --output="$work/fio-during.json" &
    local fio_pid=$!
    pids+=("$fio_pid")
    sleep 3
    fail_and_watch "$work/poll-$1.json" "$FG_MAX"
    kill -INT "$fio_pid" 2>/dev/null || true
    wait "$fio_pid" 2>/dev/null || true
    report_rebuild "$work/poll-$1.json" "multiplier $1, fg running"
    rb_rate[$1]=$rate
    local t0 t1
    read -r _ t0 t1 _ <<<"$(python3 "$work/rate.py" "$work/poll-$1.json")"
    read -r fg_during[$1] fg_window[$1] <<<"$(python3 "$work/iops.py" "$work/fio-during.json" "$t0" "$t1")"
    echo "  fg mixed: ${fg_before[$1]} IOPS before the failure ($RUNTIME s), ${fg_during[$1]} IOPS during the rebuild (${fg_window[$1]} s)"
  fi
  stop_cluster
}

multipliers=()
if has_part multiplier; then
  read -r -a multipliers <<<"$MULTIPLIERS"
elif has_part rebuild; then
  multipliers=(1)
fi
# Per round of the rebuild part: the rebuild alone (MiB/s, CPU ms per
# MiB) and, at multiplier 1, fg's ratio and the rebuild's ratio.
rounds_alone=() rounds_cpu=() rounds_fg=() rounds_rb=()
if has_part rebuild || has_part multiplier; then
  run_rebuild alone
  for m in "${multipliers[@]}"; do run_rebuild "$m"; done
fi
if has_part rebuild && [ "$REBUILD_ROUNDS" -gt 1 ]; then
  for round in $(seq "$REBUILD_ROUNDS"); do
    if [ "$round" -gt 1 ]; then
      echo "round $round of $REBUILD_ROUNDS:"
      run_rebuild alone
      run_rebuild 1
    fi
    rounds_alone+=("$(mib "$rate_alone")"); rounds_cpu+=("$cpu_alone")
    rounds_fg+=("$(ratio "${fg_during[1]}" "${fg_before[1]}")")
    rounds_rb+=("$(ratio "${rb_rate[1]}" "$rate_alone")")
  done
fi

# --- QoS -----------------------------------------------------------------------
declare -A qos
if has_part limit || has_part minimum; then
  need_space $(( 11 * 2 * $(bytes "$QOS_SIZE") / (1 << 30) + 5 ))
  echo "cluster qos:"
  start_cluster qos
  tcli policy create pad --ftt 0 --space-reservation 100 >/dev/null
  tcli policy create limited --ftt 1 --iops-limit "$IOPS_LIMIT" >/dev/null
  tcli policy create reserved --ftt 1 >/dev/null
  # One placeholder on each host, then the first goes: its host is the
  # freest by 1 GiB, so every volume below has its first copy, and its
  # owner, there.
  for i in 1 2 3 4; do pad "pad-$i" 1G >/dev/null; done
  tcli volume delete pad-1 >/dev/null
  sleep "$SETTLE"
  qos_volumes=(limited neighbour reserved n1 n2 n3 n4 n5 n6 n7 n8)
  for v in "${qos_volumes[@]}"; do
    policy=default
    case $v in limited|reserved) policy=$v ;; esac
    tcli volume create "$v" --size "$QOS_SIZE" --policy "$policy" >/dev/null
  done
  qos_owner=$(owner_of limited)
  for v in "${qos_volumes[@]}"; do
    for tries in 1 2 3 4 5; do
      [ "$(owner_of "$v")" = "$qos_owner" ] && break
      [ "$tries" = 5 ] && { echo "rebuild-bench: WARNING: $v is owned by $(owner_of "$v"), not $qos_owner"; break; }
      tcli volume delete "$v" >/dev/null
      sleep "$SETTLE"
      policy=default
      case $v in limited|reserved) policy=$v ;; esac
      tcli volume create "$v" --size "$QOS_SIZE" --policy "$policy" >/dev/null
    done
  done
  for i in 2 3 4; do tcli volume delete "pad-$i" >/dev/null; done
  echo "  owners: $(for v in "${qos_volumes[@]}"; do printf '%s=%s ' "$v" "$(owner_of "$v")"; done)"
  for v in "${qos_volumes[@]}"; do fill "$v" "$QOS_SIZE"; done
  qos_args=(--rw=randrw --rwmixread=70 --bs=4k --numjobs=1 --iodepth=16 --size="$QOS_SIZE"
            --time_based --runtime="$RUNTIME" --output-format=json)
  # fio on each VOLUME at once; sets qos[VOLUME] to its IOPS.
  run_together() { # volume...
    local v fio_pids=()
    for v in "$@"; do
      fio --name="$v" --ioengine=nbd --uri="$(uri_of "$v")" "${qos_args[@]}" \
          --output="$work/fio-$v.json" &
      fio_pids+=("$!")
    done
    pids+=("${fio_pids[@]}")
    for v in "${fio_pids[@]}"; do wait "$v" || true; done
    for v in "$@"; do read -r qos[$v] _ <<<"$(python3 "$work/iops.py" "$work/fio-$v.json")"; done
  }
  neighbours_sum() {
    local s=0 v
    for v in n1 n2 n3 n4 n5 n6 n7 n8; do s=$((s + qos[$v])); done
    echo "$s"
  }
  if has_part limit; then
    run_together limited neighbour
    limit_iops=${qos[limited]} limit_neighbour=${qos[neighbour]}
    echo "  limit: limited volume ${limit_iops} IOPS (limit $IOPS_LIMIT), neighbour ${limit_neighbour} IOPS"
  fi
  if has_part minimum; then
    run_together reserved n1 n2 n3 n4 n5 n6 n7 n8
    min_ref=${qos[reserved]} min_ref_n=$(neighbours_sum)
    echo "  minimum: with no minimum, reserved volume ${min_ref} IOPS, eight neighbours ${min_ref_n} IOPS in all"
    tcli policy set reserved --iops-minimum "$IOPS_MINIMUM" >/dev/null
    sleep 2
    echo "  reserved volume's QoS now: $(tcli volume list --json | python3 -c '
import json, sys
print([v.get("qos") for v in json.load(sys.stdin) if v["name"] == "reserved"][0])')"
    run_together reserved n1 n2 n3 n4 n5 n6 n7 n8
    min_iops=${qos[reserved]} min_n=$(neighbours_sum)
    echo "  minimum: with --iops-minimum $IOPS_MINIMUM, reserved volume ${min_iops} IOPS, eight neighbours ${min_n} IOPS in all"
  fi
  stop_cluster
fi

# --- Summary -------------------------------------------------------------------
echo
printf '%-44s %12s %12s %6s  %s\n' figure measured reference ratio target
row() { printf '%-44s %12s %12s %6s  %s\n' "$@"; }
if [ -n "$rate_alone" ]; then
  row "rebuild alone, MiB/s" "$(mib "$rate_alone")" - - -
  row "rebuild alone, CPU ms per MiB" "$cpu_alone" - - -
fi
for m in "${multipliers[@]}"; do
  t_io="" t_rb=""
  if [ "$m" = 1 ]; then t_io="[>= 0.9]"; t_rb="[>= 0.5]"; fi
  row "m=$m fg mixed IOPS during rebuild / before" "${fg_during[$m]}" "${fg_before[$m]}" \
    "$(ratio "${fg_during[$m]}" "${fg_before[$m]}")" "$t_io"
  row "m=$m rebuild MiB/s with fg / alone" "$(mib "${rb_rate[$m]}")" "$(mib "$rate_alone")" \
    "$(ratio "${rb_rate[$m]}" "$rate_alone")" "$t_rb"
done
if [ "${#rounds_fg[@]}" -gt 1 ]; then
  median() { python3 -c 'import sys, statistics; v = [float(x) for x in sys.argv[1:] if x != "-"]; print(f"{statistics.median(v):.2f}" if v else "-")' "$@"; }
  echo "rounds (rebuild alone MiB/s, CPU ms per MiB; m=1 fg ratio, rebuild ratio):"
  for i in "${!rounds_fg[@]}"; do
    echo "  $((i + 1)): ${rounds_alone[$i]} MiB/s, ${rounds_cpu[$i]} ms; ${rounds_fg[$i]}, ${rounds_rb[$i]}"
  done
  row "rebuild alone, MiB/s (median of ${#rounds_fg[@]})" "$(median "${rounds_alone[@]}")" - - -
  row "m=1 fg ratio (median of ${#rounds_fg[@]} rounds)" - - "$(median "${rounds_fg[@]}")" "[>= 0.9]"
  row "m=1 rebuild ratio (median of ${#rounds_fg[@]} rounds)" - - "$(median "${rounds_rb[@]}")" "[>= 0.5]"
fi
if has_part limit; then
  row "limit: limited volume IOPS / limit" "$limit_iops" "$IOPS_LIMIT" "$(ratio "$limit_iops" "$IOPS_LIMIT")" "[0.95-1.05]"
  row "limit: neighbour IOPS (no QoS)" "$limit_neighbour" - - -
fi
if has_part minimum; then
  row "minimum: reserved IOPS / minimum" "$min_iops" "$IOPS_MINIMUM" "$(ratio "$min_iops" "$IOPS_MINIMUM")" "[>= 1.0]"
  row "minimum: reserved IOPS / same with none" "$min_iops" "$min_ref" "$(ratio "$min_iops" "$min_ref")" -
  row "minimum: 8 neighbours' IOPS / same with none" "$min_n" "$min_ref_n" "$(ratio "$min_n" "$min_ref_n")" -
fi
echo "load average at the end $(cut -d' ' -f1-3 /proc/loadavg); $(( $(date +%s) - start_s )) s in all"
