#!/usr/bin/env bash
# Cluster benchmark: an FTT=1 volume of `tessera up` (four hosts in one
# process, two copies of every write) versus nbdkit's file plugin serving a
# file on the same disk (one copy), in the same run, both through fio's nbd
# engine over loopback. Prints each figure and the ratio Tessera / reference.
#
# References, all on the same disk in the same run:
#   nbdkit      nbdkit's file plugin, acknowledging writes from the page cache
#   nbdkit-fua  the same plugin with every write forced to FUA
#               (--filter=fua fuamode=force): Tessera's durability, one copy
#   nbdkit-dev  the FUA plugin with cache=none: reads come from the device
#               and not from the page cache, as Tessera's reads of data
#               written in large writes do (placed writes go past it)
#   raw         fio on a file of its own, no network: O_DIRECT, and for
#               writes an fdatasync after each (the device's own bound; its
#               QD 1 latency is the time per write and fdatasync)
#   raw x2      for seqwrite, two such fio jobs at once on two files: what
#               the disk gives two copies, halved (every mirrored byte is
#               written twice to the same disk here); raw x2 / nbdkit-fua is
#               the best ratio any mirror on this one disk can reach
#   floor       for randwrite and randread, the CPU per I/O of nbdkit's
#               null plugin (a server that keeps nothing): what the NBD
#               protocol over loopback alone costs a server on this machine
#   bound       for qd1write, what the hardware allows a mirrored 4 KiB
#               write with both copies on this disk: the time of two durable
#               8 KiB writes at once (fio, two jobs, O_DIRECT + O_DSYNC, on
#               written files: a 4 KiB write's log record is a header block
#               and its data block) plus two loopback round trips (client to
#               owner, owner to the second copy), each timed as a 4 KiB QD 1
#               write to nbdkit's null plugin; nbdkit-fua's own bound is one
#               durable 4 KiB write plus one round trip. Printed with the
#               share of Tessera's latency above the bound (ours to remove)
#
# Profiles (issue targets in brackets, against nbdkit-fua unless said):
#   seqwrite  256 KiB sequential write, 1 job, iodepth 8           [MB/s >= 0.6x]
#   mixed     "Iometer mixed": 4 KiB random, 70% read, 8 jobs x 8  [IOPS >= 1.2x]
#   qd1write  4 KiB random write, 1 job, iodepth 1, mean latency   [<= 1.3x]
#   qd1read   4 KiB random read, 1 job, iodepth 1, mean latency    [<= 1.1x of nbdkit]
#   randwrite 4 KiB random write, iodepth 16: CPU per mirrored write  [<= 15 us]
#   randread  4 KiB random read, iodepth 16: CPU per read             [<= 8 us]
# and, for Tessera, the CPU time `tessera up` spent per I/O (user + system,
# from /proc/PID/stat) during each profile, and on the line below it where
# that time went by kind of thread (from /proc/PID/task/*/stat: the
# owner's host, the other hosts, store threads, the kernel's io_uring
# workers). Every volume and file is filled first, so reads find data,
# and read once whole before the first read profile, so every server's
# reads start from the host's page cache holding its data (the QD 1 read
# before that pass is printed too); Tessera's volume is written over until
# HOST_CAPACITY has gone through it (at least once whole), so its hosts'
# sparse capacity files are written once (see the fill below) and no profile
# pays ext4's allocation. Then the resident memory of `tessera up`, idle
# and after writing MEMORY_WRITE bytes (default 40G) to a 4 GiB volume
# (written over and over, so the disk needs room for two copies of 4 GiB,
# not of MEMORY_WRITE).
#
# Environment: RUNTIME (seconds per profile, default 15), SIZE (volume and
# file size, default 2G), MEMORY_WRITE (default 40G; 0 skips the memory
# figure), PROFILES (default "seqwrite mixed qd1write qd1read randwrite
# randread"),
# CARGO_TARGET_DIR (default target), UP_LOG (a file to keep the log of
# `tessera up` in).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-15}
SIZE=${SIZE:-2G}
MEMORY_WRITE=${MEMORY_WRITE:-40G}
# Capacity device of each of the four hosts: file-backed, so the disk under
# the bench needs room for the two hosts holding the copies (plus 1/8 each
# for the write logs) once enough data went through to touch every block,
# and for four SIZE files of references: about 24 GiB with the defaults. A
# disk that fills shows as write errors and dropped connections, not as a
# slower figure.
HOST_CAPACITY=${HOST_CAPACITY:-5G}
PROFILES=${PROFILES:-seqwrite mixed qd1write qd1read randwrite randread}
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
  # UP_LOG keeps the serving process's log (to see why a profile failed).
  if [ -n "${UP_LOG:-}" ] && [ -f "$work/up.log" ]; then cp "$work/up.log" "$UP_LOG"; fi
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

profile_args() { # profile
  case $1 in
    mixed) echo --rw=randrw --rwmixread=70 --bs=4k --numjobs=8 --iodepth=8 ;;
    qd1write) echo --rw=randwrite --bs=4k --numjobs=1 --iodepth=1 ;;
    qd1read) echo --rw=randread --bs=4k --numjobs=1 --iodepth=1 ;;
    seqwrite) echo --rw=write --bs=256k --numjobs=1 --iodepth=8 ;;
    randwrite) echo --rw=randwrite --bs=4k --numjobs=1 --iodepth=16 ;;
    randread) echo --rw=randread --bs=4k --numjobs=1 --iodepth=16 ;;
  esac
}

# Prints "iops lat_us bw_kib" from fio's JSON output in $work/fio.json.
# With "cycle", the latency is the time per operation (1 / IOPS, for one
# job at queue depth 1): for raw writes it then counts the fdatasync after
# each write, which fio's write latency leaves out.
fio_figures() { # [cycle]
  python3 - "$work/fio.json" "${1:-}" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
job = json.loads(text[text.index("{"):])["jobs"][0]
r, w = job["read"], job["write"]
iops = r["iops"] + w["iops"]
lat = w["lat_ns"]["mean"] / 1000 if w["io_bytes"] else r["lat_ns"]["mean"] / 1000
if sys.argv[2] == "cycle" and iops > 0:
    lat = 1e6 / iops
bw = r["bw"] + w["bw"]
print(f"{iops:.0f} {lat:.1f} {bw:.0f}")
PY
}

# fio against URI with a profile; prints "iops lat_us bw_kib".
run_fio() { # uri profile
  # shellcheck disable=SC2046
  fio --name=bench --ioengine=nbd --uri="$1" $(profile_args "$2") --size="$SIZE" \
      --time_based --runtime="$RUNTIME" --group_reporting --output-format=json \
      > "$work/fio.json"
  fio_figures
}

# fio on a file of its own with the same profile: O_DIRECT, libaio, and an
# fdatasync after every write.
run_raw() { # profile
  # shellcheck disable=SC2046
  fio --name=bench --filename="$work/raw.img" --ioengine=libaio --direct=1 --fdatasync=1 \
      $(profile_args "$1") --size="$SIZE" --time_based --runtime="$RUNTIME" \
      --group_reporting --output-format=json > "$work/fio.json"
  fio_figures cycle
}

# Two raw jobs at once, each on a file of its own: the disk's bandwidth for
# two copies of a sequential stream, halved, in KiB/s.
run_raw_two_copies() {
  # shellcheck disable=SC2046
  fio --name=bench --directory="$work" --filename_format='raw-copy.$jobnum' --numjobs=2 \
      --ioengine=libaio --direct=1 --fdatasync=1 $(profile_args seqwrite | sed 's/--numjobs=1//') \
      --size="$SIZE" --time_based --runtime="$RUNTIME" --group_reporting --output-format=json \
      > "$work/fio.json"
  read -r _ _ bw <<<"$(fio_figures)"
  rm -f "$work"/raw-copy.*
  echo $(( bw / 2 ))
}

# What the hardware allows a QD 1 write: prints "two one rtt" in us, the
# time per write of two jobs at once each writing 8 KiB durable (O_DSYNC)
# on a written file of its own, of one job writing 4 KiB durable, and of a
# 4 KiB write to nbdkit's null plugin (a loopback round trip through a
# server that keeps nothing).
qd1_write_bound() {
  local two one rtt
  fio --name=layout --directory="$work" --filename_format='bound.$jobnum' --numjobs=2 \
      --rw=write --bs=1m --direct=1 --size=256M --output-format=terse >/dev/null
  fio --name=bench --directory="$work" --filename_format='bound.$jobnum' --numjobs=2 \
      --rw=randwrite --bs=8k --iodepth=1 --direct=1 --sync=dsync --size=256M \
      --time_based --runtime="$RUNTIME" --group_reporting --output-format=json > "$work/fio.json"
  read -r _ two _ <<<"$(fio_figures)"
  fio --name=bench --filename="$work/bound.0" --rw=randwrite --bs=4k --iodepth=1 --direct=1 \
      --sync=dsync --size=256M --time_based --runtime="$RUNTIME" --output-format=json \
      > "$work/fio.json"
  read -r _ one _ <<<"$(fio_figures)"
  rm -f "$work"/bound.*
  local null_port
  null_port=$(free_port)
  nbdkit --foreground --exit-with-parent --port "$null_port" --ipaddr 127.0.0.1 null size=1G &
  local null_pid=$!
  wait_port 127.0.0.1 "$null_port"
  # shellcheck disable=SC2046
  fio --name=bench --ioengine=nbd --uri="nbd://127.0.0.1:$null_port" $(profile_args qd1write) \
      --size=1G --time_based --runtime="$RUNTIME" --output-format=json > "$work/fio.json"
  read -r _ rtt _ <<<"$(fio_figures)"
  kill "$null_pid" 2>/dev/null || true
  wait "$null_pid" 2>/dev/null || true
  echo "$two $one $rtt"
}

# What the NBD protocol alone costs a server on this machine: nbdkit's null
# plugin (stores nothing, reads zeros) under a profile; prints "iops
# cpu_per_io" (CPU of the nbdkit process, user + system).
null_floor() { # profile
  local port pid before iops
  port=$(free_port)
  nbdkit --foreground --exit-with-parent --port "$port" --ipaddr 127.0.0.1 null size="$SIZE" &
  pid=$!
  wait_port 127.0.0.1 "$port"
  before=$(cpu_us "$pid")
  read -r iops _ _ <<<"$(run_fio "nbd://127.0.0.1:$port" "$1")"
  echo "$iops $(cpu_per_io "$pid" "$before" "$iops")"
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

fill() { # uri [bytes to write, over and over the volume; default SIZE]
  fio --name=fill --ioengine=nbd --uri="$1" --rw=write --bs=1m --iodepth=8 --size="$SIZE" \
      --io_size="${2:-$SIZE}" --output-format=terse >/dev/null
}

# CPU time (user + system) of a process so far, in microseconds.
cpu_us() {
  awk -v hz="$(getconf CLK_TCK)" '{print int(($14 + $15) * 1000000 / hz)}' "/proc/$1/stat"
}

# --- Tessera -----------------------------------------------------------------
octet=$(( (RANDOM % 200) + 20 ))
bind="127.$octet.$(( RANDOM % 250 )).1"
api_port=$(free_port); nbd_port=$(free_port); transport_port=$(free_port)
# The CLI presents the admin token `tessera up` writes there.
export TESSERA_TOKEN_FILE="$work/data/admin.token"
"$tessera" up --data-dir "$work/data" --bind "$bind" --api-port "$api_port" \
  --nbd-port "$nbd_port" --transport-port "$transport_port" --host-capacity "$HOST_CAPACITY" \
  > "$work/up.log" 2>&1 &
up_pid=$!
pids+=("$up_pid")
wait_port "$bind" "$api_port"
api="https://$bind:$api_port"
# The API answers once the first host is up; the others start one after the
# other (seconds each on a slow disk), and placement needs three.
for _ in $(seq 600); do
  present=$("$tessera" --api "$api" --json host list 2>/dev/null |
    python3 -c 'import json, sys; print(sum(h["state"] == "present" for h in json.load(sys.stdin)))' 2>/dev/null || echo 0)
  [ "$present" = 4 ] && break
  sleep 0.2
done
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
nbdkit_fua_pid=$!
pids+=("$nbdkit_fua_pid")
wait_port 127.0.0.1 "$nbdkit_fua_port"
nbdkit_fua_uri="nbd://127.0.0.1:$nbdkit_fua_port"

# The same with the page cache kept out (cache=none: each block read or
# written is dropped from it), so its reads come from the device.
nbdkit_dev_port=$(free_port)
truncate -s "$SIZE" "$work/nbdkit-dev.img"
nbdkit --foreground --exit-with-parent --port "$nbdkit_dev_port" --ipaddr 127.0.0.1 \
  --filter=fua file "$work/nbdkit-dev.img" fuamode=force cache=none &
nbdkit_dev_pid=$!
pids+=("$nbdkit_dev_pid")
wait_port 127.0.0.1 "$nbdkit_dev_port"
nbdkit_dev_uri="nbd://127.0.0.1:$nbdkit_dev_port"

# Each reference's file is written once, so none of it is left to allocate.
# Tessera's devices are files too, sparse at first, and a large write goes
# to newly allocated capacity blocks, taken in turn across the whole device:
# until every block of a host's capacity file has been written once, such
# writes make ext4 allocate blocks and commit its journal (a cost that
# block devices, and the references' files, do not have). So the volume is
# written over until that much has gone through each copy.
# (At least the whole volume, when it is larger than a host's capacity.)
fill "$tessera_uri" "$(python3 -c "
import sys
units = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30, 'T': 1 << 40}
def size(text):
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
print(max(size(sys.argv[1]), size(sys.argv[2])))" "$SIZE" "$HOST_CAPACITY")"
fill "$nbdkit_uri"
fill "$nbdkit_fua_uri"
fill "$nbdkit_dev_uri"
fio --name=fill --filename="$work/raw.img" --rw=write --bs=1m --iodepth=8 --ioengine=libaio \
    --direct=1 --size="$SIZE" --output-format=terse >/dev/null

ratio() { python3 -c "print(f'{$1/$2:.2f}')"; }
# Columns: Tessera, the four references, then Tessera / each reference
# (r-dev: against nbdkit-dev), and the CPU time (user + system) per I/O of
# `tessera up` (two copies of every write) and of the nbdkit-fua and
# nbdkit-dev servers (one copy): what a plain server spends per I/O on
# this machine's syscalls, wake-ups and device doorbells.
printf '%-9s %14s %14s %14s %14s %14s %6s %6s %6s %6s %8s %8s %8s %s\n' profile tessera nbdkit \
  nbdkit-fua nbdkit-dev raw ratio r-fua r-dev r-raw cpu/io fua-cpu dev-cpu target
# CPU microseconds per I/O of process $1 since $2, for $3 I/Os per second
# over RUNTIME.
cpu_per_io() {
  local ios
  ios=$(python3 -c "print(max(1, round($3 * $RUNTIME)))")
  echo "$(( ($(cpu_us "$1") - $2) / ios ))us"
}
# CPU ticks (user + system) of each thread of process $1, as "name ticks"
# lines (threads that ended meanwhile are missed: the workers and device
# threads of `tessera up` live as long as it does).
thread_ticks() {
  for t in /proc/"$1"/task/*; do
    awk '{ s = $0; sub(/^[^(]*\(/, "", s); name = s; sub(/\).*$/, "", name);
           sub(/^.*\) /, "", s); split(s, f, " "); print name, f[12] + f[13] }' "$t/stat" 2>/dev/null
  done
}
# Where `tessera up`'s CPU per I/O went since the ticks in file $2 (taken
# with thread_ticks), for $3 I/Os per second over RUNTIME: by kind of
# thread (the owner's host's runtime workers, the other hosts' (the second
# copy), the destager, store readers, the kernel's io_uring workers
# (io-wq: operations that cannot complete without blocking, a durable
# write among them), the rest).
thread_breakdown() { # pid ticks-before iops process-cpu-us-before
  thread_ticks "$1" > "$work/ticks-after"
  python3 - "$2" "$work/ticks-after" "$3" "$RUNTIME" "$(getconf CLK_TCK)" "host-$k" \
    "$4" "$(cpu_us "$1")" <<'PY'
import collections, sys
before_file, after_file, iops, runtime, hz, owner, cpu0, cpu1 = sys.argv[1:]
ios = max(1.0, float(iops) * float(runtime))
def kind(name):
    if name == owner: return "owner's host"
    if name.startswith("host-"): return "other hosts"
    if name.startswith("iou-wrk"): return "io_uring workers"
    if name.startswith("store-"): return name
    return "other"
def load(lines):
    c = collections.Counter()
    for line in lines:
        name, _, ticks = line.rstrip("\n").rpartition(" ")
        if name: c[kind(name)] += int(ticks)
    return c
after, before = load(open(after_file)), load(open(before_file))
us = {k: (after[k] - before[k]) * 1e6 / int(hz) / ios for k in after}
# The process's own count includes threads that ended during the run (the
# kernel's io_uring workers end when idle).
us["threads that ended"] = (int(cpu1) - int(cpu0)) / ios - sum(us.values())
parts = [f"{k} {v:.0f}" for k, v in sorted(us.items(), key=lambda kv: -kv[1]) if v >= 0.5]
print("  cpu/io by thread (us): " + ", ".join(parts))
PY
}
# Reads are compared on data that every server holds in the same state of
# the host's page cache. nbdkit's writes go through the page cache, so its
# file is all there after the fill; Tessera's large writes are placed past
# it and destaged blocks too, so its first reads of them go to the device.
# Before the first read profile each target is therefore read once end to
# end (sequential 1 MiB reads), after printing what a QD 1 read costs each
# of Tessera and nbdkit before that pass.
reads_warmed=0
warm_reads() {
  read -r _ cold_t _ <<<"$(run_fio "$tessera_uri" qd1read)"
  read -r _ cold_n _ <<<"$(run_fio "$nbdkit_uri" qd1read)"
  echo "qd1read   before the read pass: tessera $cold_t us, nbdkit $cold_n us, ratio $(ratio "$cold_t" "$cold_n")"
  for uri in "$tessera_uri" "$nbdkit_uri" "$nbdkit_fua_uri" "$nbdkit_dev_uri"; do
    fio --name=warm --ioengine=nbd --uri="$uri" --rw=read --bs=1m --iodepth=8 --size="$SIZE" \
        --output-format=terse >/dev/null
  done
  reads_warmed=1
}
for profile in $PROFILES; do
  if [ "$reads_warmed" = 0 ] && { [ "$profile" = qd1read ] || [ "$profile" = randread ]; }; then
    warm_reads
  fi
  cpu_before=$(cpu_us "$up_pid")
  thread_ticks "$up_pid" > "$work/ticks"
  read -r t_iops t_lat t_bw <<<"$(run_fio "$tessera_uri" "$profile")"
  cpu_per_io=$(cpu_per_io "$up_pid" "$cpu_before" "$t_iops")
  breakdown=$(thread_breakdown "$up_pid" "$work/ticks" "$t_iops" "$cpu_before")
  read -r n_iops n_lat n_bw <<<"$(run_fio "$nbdkit_uri" "$profile")"
  cpu_before=$(cpu_us "$nbdkit_fua_pid")
  read -r f_iops f_lat f_bw <<<"$(run_fio "$nbdkit_fua_uri" "$profile")"
  fua_cpu=$(cpu_per_io "$nbdkit_fua_pid" "$cpu_before" "$f_iops")
  cpu_before=$(cpu_us "$nbdkit_dev_pid")
  read -r d_iops d_lat d_bw <<<"$(run_fio "$nbdkit_dev_uri" "$profile")"
  dev_cpu=$(cpu_per_io "$nbdkit_dev_pid" "$cpu_before" "$d_iops")
  read -r r_iops r_lat r_bw <<<"$(run_raw "$profile")"
  case $profile in
    qd1write|qd1read) t=$t_lat n=$n_lat f=$f_lat d=$d_lat r=$r_lat unit=us ;;
    seqwrite) t=$t_bw n=$n_bw f=$f_bw d=$d_bw r=$r_bw unit=KiB/s ;;
    *) t=$t_iops n=$n_iops f=$f_iops d=$d_iops r=$r_iops unit=IOPS ;;
  esac
  case $profile in
    mixed) target=">= 1.2 of nbdkit-fua" ;;
    qd1write) target="<= 1.3 of nbdkit-fua (latency)" ;;
    qd1read) target="<= 1.1 of nbdkit (latency)" ;;
    randwrite) target="cpu/io <= 15 us" ;;
    randread) target="cpu/io <= 8 us" ;;
    seqwrite) target=">= 0.6 of nbdkit-fua" ;;
  esac
  printf "%-9s %8s %-5s %8s %-5s %8s %-5s %8s %-5s %8s %-5s %6s %6s %6s %6s %8s %8s %8s %s\n" "$profile" \
    "$t" "$unit" "$n" "$unit" "$f" "$unit" "$d" "$unit" "$r" "$unit" \
    "$(ratio "$t" "$n")" "$(ratio "$t" "$f")" "$(ratio "$t" "$d")" "$(ratio "$t" "$r")" \
    "$cpu_per_io" "$fua_cpu" "$dev_cpu" "$target"
  echo "$breakdown"
  if [ "$profile" = qd1write ]; then
    read -r two one rtt <<<"$(qd1_write_bound)"
    python3 - "$t_lat" "$f_lat" "$two" "$one" "$rtt" <<'PY'
import sys
t, f, two, one, rtt = map(float, sys.argv[1:])
bound, fua_bound = two + 2 * rtt, one + rtt
print(f"qd1write  bound: two durable 8 KiB writes at once {two:.1f} us + 2 x loopback round trip {rtt:.1f} us"
      f" = {bound:.1f} us; tessera / bound {t / bound:.2f}, above it {t - bound:.1f} us"
      f" ({(t - bound) / t:.0%} of its latency);"
      f" nbdkit-fua / its bound ({one:.1f} + {rtt:.1f} us) {f / fua_bound:.2f};"
      f" at best tessera / nbdkit-fua = {bound / f:.2f}")
PY
  fi
  if [ "$profile" = seqwrite ]; then
    two=$(run_raw_two_copies)
    echo "seqwrite  raw x2: $two KiB/s per copy with two copies at once on this disk; tessera / that: $(ratio "$t_bw" "$two"); at best tessera / nbdkit-fua = $(ratio "$two" "$f_bw")"
  fi
  if [ "$profile" = randwrite ] || [ "$profile" = randread ]; then
    read -r floor_iops floor_cpu <<<"$(null_floor "$profile")"
    if [ "$profile" = randwrite ]; then
      beyond="a mirrored write also pays a host-to-host round trip and two copies' device writes"
    else
      beyond="a read of a region assigned to the other copy also pays a host-to-host round trip"
    fi
    echo "$profile floor: nbdkit null (keeps nothing) spends $floor_cpu per I/O at $floor_iops IOPS: the NBD protocol over loopback alone; $beyond"
  fi
done

if [ "$MEMORY_WRITE" != "0" ]; then
  "$tessera" --api "$api" volume create memory --size 4G >/dev/null
  sleep 2
  memory_uri="nbd://$owner_ip:$nbd_port/memory"
  fio --name=fill --ioengine=nbd --uri="$memory_uri" --rw=write --bs=1m --iodepth=8 \
      --size=4G --io_size="$MEMORY_WRITE" --output-format=terse >/dev/null
  echo "tessera up resident memory: idle $((idle_rss / 1024)) MiB, after writing $MEMORY_WRITE $(( $(rss_kib "$up_pid") / 1024 )) MiB"
fi
