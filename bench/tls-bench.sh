#!/usr/bin/env bash
# NBD with TLS against NBD without, on the same FTT=1 volume of `tessera up`
# in the same run: fio's nbd engine through the owner's host, plain
# (nbd://) and over TLS 1.3 with the client certificate `tessera up` makes
# (nbds://, the certificate where libnbd looks by default), in turns (plain, TLS,
# plain, TLS, ...), so both see the same machine. Prints each run, the
# median of each, the ratio TLS / plain, the CPU time `tessera up`
# spent per GiB moved (user + system, from /proc/PID/stat) and the
# client's (fio and its jobs, user + system).
#
# With ENCRYPT=1 the TLS path runs on a second `tessera up` whose disk
# groups are encrypted at rest (`--encrypt`), so the ratio is encryption at
# rest and TLS on against both off; each cluster's CPU is counted apart.
#
# With SECOND_BIN=PATH it compares two builds instead: plain NBD to a
# cluster of FIRST_BIN (default: this tree's release build) against plain
# NBD to a cluster of SECOND_BIN, in turns, on the same machine (e.g. a
# change against the commit before it: build both, copy the binaries out).
#
# Profiles (issue target: TLS >= 0.9x of plain):
#   mixed     "Iometer mixed": 4 KiB random, 70% read, 8 jobs x iodepth 8 (IOPS)
#   seqwrite  256 KiB sequential write, 1 job, iodepth 8 (MiB/s)
#   qd1write  4 KiB random write, 1 job, iodepth 1 (IOPS: 1 / latency)
#
# Environment: RUNTIME (seconds per run, default 15), ROUNDS (default 3),
# WARMUP (unmeasured runs of each path before a profile's rounds, default
# 1: the first run after the fill or after the other profile is the slowest
# of both paths, by more than the difference measured),
# SIZE (volume size, default 1G), HOST_CAPACITY (each host's capacity
# device, default 2G), PROFILES (default "mixed seqwrite"),
# ENCRYPT (default 0), NBD_TLS (default 1; with ENCRYPT=1 and NBD_TLS=0 the
# encrypted cluster is reached over plain NBD: encryption at rest alone),
# CARGO_TARGET_DIR (default target).
#
# With ENCRYPT=1 it also measures the physical bound in the same run: the
# speed of AES-256-XTS (4 KiB units) and AES-256-GCM (16 KiB records) on
# this CPU by `openssl speed` (hand-tuned AES-NI assembly), and from them
# the cipher floor of each profile, the CPU no implementation can avoid per
# GiB the client moves: two copies of every write sealed and every read
# opened (both copies live in this one process) and the client's TLS stream
# decrypted or encrypted once. It prints the floor, what the encrypted
# cluster spent over the plain one, and the ratio the encrypted cluster
# would reach if it spent only the floor more, with the CPU as the limit:
# once for the cluster alone, and once with the client's CPU counted too
# (fio and libnbd run on the same cores here, and their own TLS work, what
# they spend more over nbds:// than over nbd://, is the client's, not the
# cluster's: on a real deployment it runs on the hypervisor).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-15}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-1}
SIZE=${SIZE:-1G}
HOST_CAPACITY=${HOST_CAPACITY:-2G}
PROFILES=${PROFILES:-mixed seqwrite}
ENCRYPT=${ENCRYPT:-0}
NBD_TLS=${NBD_TLS:-1}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}

tools="fio python3 nbdinfo"; [ "$ENCRYPT" = 1 ] && tools="$tools openssl"
for tool in $tools; do
  command -v "$tool" >/dev/null || { echo "tls-bench: $tool is required" >&2; exit 1; }
done
if [ -z "${FIRST_BIN:-}" ]; then
  cargo build --release -q -p tessera
fi
tessera=${FIRST_BIN:-$CARGO_TARGET_DIR/release/tessera}
SECOND_BIN=${SECOND_BIN:-}

# Overwrites go to new blocks, so a capacity file grows towards its full
# size as the runs go on: the two hosts holding copies of each cluster's
# volume need room for theirs.
work=$(mktemp -d -p "${BENCH_DIR:-/work}" tessera-tls-bench.XXXXXX)
need_kib=$(( 2 * 2 * ($(numfmt --from=iec "$HOST_CAPACITY") * 9 / 8) / 1024 ))
free_kib=$(df -k --output=avail "$work" | tail -1)
if [ "$free_kib" -lt "$need_kib" ]; then
  echo "tls-bench: $((free_kib / 1048576)) GiB free under $work, $((need_kib / 1048576)) GiB needed (lower HOST_CAPACITY)" >&2
  rmdir "$work"; exit 1
fi
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  # The clusters' logs outlive the run: ${LOG_DIR:-/tmp}/tls-bench-NAME.log.
  for log in "$work"/*.log; do [ -e "$log" ] && cp "$log" "${LOG_DIR:-/tmp}/tls-bench-$(basename "$log")"; done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
# Starts `tessera up` in $work/NAME with FLAGS and a volume `bench`; sets
# up_pid, plain (nbd://) and tls (nbds://) to the volume through its owner.
start_cluster() { # name flags...
  local name=$1; shift
  local octet third bind api_port nbd_port iscsi_port transport_port owner owner_ip
  octet=$(( (RANDOM % 200) + 20 )); third=$(( RANDOM % 250 ))
  bind="127.$octet.$third.1"
  api_port=$(free_port); nbd_port=$(free_port); iscsi_port=$(free_port); transport_port=$(free_port)
  export TESSERA_TOKEN_FILE="$work/$name/admin.token"
  "$tessera" up --data-dir "$work/$name" --bind "$bind" --api-port "$api_port" \
    --nbd-port "$nbd_port" --iscsi-port "$iscsi_port" --transport-port "$transport_port" \
    --host-capacity "$HOST_CAPACITY" "$@" > "$work/$name.log" 2>&1 &
  up_pid=$!
  pids+=("$up_pid")
  api="https://$bind:$api_port"
  for _ in $(seq 300); do
    "$tessera" --api "$api" status >/dev/null 2>&1 && break
    sleep 0.2
  done
  # Both clusters' volumes get the same shape, an owner that holds one
  # of the copies (a copy on the owner's host is written without a
  # network hop): made again until it has it.
  for _ in $(seq 20); do
    "$tessera" --api "$api" volume create bench --size "$SIZE" >/dev/null
    owner=
    for _ in $(seq 100); do
      owner=$("$tessera" --api "$api" object show bench --json | python3 -c '
import json, sys
o = json.load(sys.stdin)
owner = o.get("owner") or ""
local = any(c["host"] == owner and c["role"] == "data" for c in o["components"])
print(owner if owner and local else ("-" if owner else ""))')
      [ -n "$owner" ] && break
      sleep 0.2
    done
    [ "$owner" != "-" ] && break
    "$tessera" --api "$api" volume delete bench --force >/dev/null
  done
  owner_ip="127.$octet.$third.${owner#host-}"
  plain="nbd://$owner_ip:$nbd_port/bench"
  # fio's nbd engine may not name local files in a URI: libnbd finds the
  # client certificate where it looks by default, $HOME/.pki/libnbd.
  mkdir -p "$work/$name-home/.pki"
  cp -r "$work/$name/tls/client" "$work/$name-home/.pki/libnbd"
  tls="nbds://$owner_ip:$nbd_port/bench"
  HOME="$work/$name-home" nbdinfo --size "$tls" >/dev/null
}
start_cluster off
plain_uri=$plain; plain_pid=$up_pid; plain_home="$work/off-home"
tls_uri=$tls; tls_pid=$up_pid; tls_home=$plain_home
if [ -n "$SECOND_BIN" ]; then
  tessera=$SECOND_BIN
  start_cluster on
  tls_uri=$plain; tls_pid=$up_pid; tls_home="$work/on-home"
elif [ "$ENCRYPT" = 1 ]; then
  start_cluster on --encrypt
  tls_uri=$tls; tls_pid=$up_pid; tls_home="$work/on-home"
  [ "$NBD_TLS" = 1 ] || tls_uri=$plain
  "$tessera" --api "$api" encryption list
fi

profile_args() {
  case $1 in
    mixed) echo --rw=randrw --rwmixread=70 --bs=4k --numjobs=8 --iodepth=8 ;;
    seqwrite) echo --rw=write --bs=256k --numjobs=1 --iodepth=8 ;;
    qd1write) echo --rw=randwrite --bs=4k --numjobs=1 --iodepth=1 ;;
  esac
}
cpu_us() {
  awk -v hz="$(getconf CLK_TCK)" '{print int(($14 + $15) * 1000000 / hz)}' "/proc/$1/stat"
}
# One run: prints "figure cpu_s_per_gib client_cpu_s_per_gib" (the
# client's CPU is fio's and its jobs', user + system, counted by its
# parent when they end).
run() { # uri profile pid home
  local before after
  before=$(cpu_us "$3")
  # shellcheck disable=SC2046
  HOME="$4" python3 -c '
import resource, subprocess, sys
subprocess.run(sys.argv[2:], stdout=open(sys.argv[1], "w"), check=True)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(int((r.ru_utime + r.ru_stime) * 1e6))' "$work/fio.json" \
      fio --name=bench --ioengine=nbd --uri="$1" $(profile_args "$2") \
      --size="$SIZE" --time_based --runtime="$RUNTIME" --group_reporting --output-format=json \
      > "$work/client.us"
  after=$(cpu_us "$3")
  python3 - "$work/fio.json" "$2" "$(( after - before ))" "$(cat "$work/client.us")" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
job = json.loads(text[text.index("{"):])["jobs"][0]
r, w = job["read"], job["write"]
gib = max((r["io_bytes"] + w["io_bytes"]) / 2**30, 1e-9)
figure = (w["bw"] / 1024) if sys.argv[2] == "seqwrite" else r["iops"] + w["iops"]
print(f"{figure:.0f} {int(sys.argv[3]) / 1e6 / gib:.2f} {int(sys.argv[4]) / 1e6 / gib:.2f}")
PY
}
for target in "$plain_uri $plain_home" "$tls_uri $tls_home"; do
  read -r uri home <<<"$target"
  HOME="$home" fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1m --iodepth=8 \
      --size="$SIZE" --output-format=terse >/dev/null
  [ "$ENCRYPT" = 1 ] || [ -n "$SECOND_BIN" ] || break
done
on_label=tls; [ "$ENCRYPT" = 1 ] && on_label=enc+tls; [ "$ENCRYPT$NBD_TLS" = 10 ] && on_label=enc; [ -n "$SECOND_BIN" ] && on_label=second

# Bytes per second of a cipher by `openssl speed` over BYTES-byte buffers.
cipher_speed() { # cipher bytes
  openssl speed -elapsed -seconds 2 -bytes "$2" -evp "$1" 2>/dev/null |
    awk -v c="${1^^}" '$1 == c { v = $2; sub(/k$/, "", v); printf "%.0f\n", v * 1000 }'
}
if [ "$ENCRYPT" = 1 ]; then
  xts_speed=$(cipher_speed aes-256-xts 4096)
  gcm_speed=$(cipher_speed aes-256-gcm 16384)
  echo "cipher speeds (openssl): AES-256-XTS $(( xts_speed / 1000000 )) MB/s, AES-256-GCM $(( gcm_speed / 1000000 )) MB/s"
fi
# CPU seconds per GiB moved that the ciphers cost at least in a profile.
cipher_floor() { # profile
  local read_share=0
  case $1 in mixed) read_share=0.7 ;; esac
  python3 -c "
r, xts, gcm, tls = $read_share, $xts_speed, $gcm_speed, $NBD_TLS
xts_bytes = r * 1 + (1 - r) * 2   # a read opened once, a write sealed per copy
print(f'{2**30 * (xts_bytes / xts + tls / gcm):.2f}')"
}

median() { python3 -c 'import sys, statistics; print(round(statistics.median(float(x) for x in sys.argv[1:]), 3))' "$@"; }
printf '%-9s %-7s %10s %12s %12s\n' profile path figure cpu-s/GiB client-s/GiB
for profile in $PROFILES; do
  unit=IOPS; [ "$profile" = seqwrite ] && unit=MiB/s
  plain_figures=(); tls_figures=(); plain_cpu=(); tls_cpu=(); plain_client=(); tls_client=()
  for _ in $(seq "$WARMUP"); do
    run "$plain_uri" "$profile" "$plain_pid" "$plain_home" >/dev/null
    run "$tls_uri" "$profile" "$tls_pid" "$tls_home" >/dev/null
  done
  for _ in $(seq "$ROUNDS"); do
    read -r f c k <<<"$(run "$plain_uri" "$profile" "$plain_pid" "$plain_home")"
    plain_figures+=("$f"); plain_cpu+=("$c"); plain_client+=("$k")
    printf '%-9s %-7s %10s %12s %12s\n' "$profile" plain "$f $unit" "$c" "$k"
    read -r f c k <<<"$(run "$tls_uri" "$profile" "$tls_pid" "$tls_home")"
    tls_figures+=("$f"); tls_cpu+=("$c"); tls_client+=("$k")
    printf '%-9s %-7s %10s %12s %12s\n' "$profile" "$on_label" "$f $unit" "$c" "$k"
  done
  p=$(median "${plain_figures[@]}"); t=$(median "${tls_figures[@]}")
  pc=$(median "${plain_cpu[@]}"); tc=$(median "${tls_cpu[@]}")
  kp=$(median "${plain_client[@]}"); kt=$(median "${tls_client[@]}")
  printf "%-9s median plain %s, $on_label %s %s: $on_label/plain %s (target >= 0.9); CPU s/GiB plain %s, $on_label %s; client's CPU s/GiB %s, %s\n" \
    "$profile" "$p" "$t" "$unit" "$(python3 -c "print(f'{$t/$p:.3f}')")" "$pc" "$tc" "$kp" "$kt"
  if [ "$ENCRYPT" = 1 ]; then
    floor=$(cipher_floor "$profile")
    printf "%-9s cipher floor %s s/GiB, $on_label spent %s more; bound with the CPU as the limit: %s (the cluster alone), %s (the client's CPU counted)\n" \
      "$profile" "$floor" "$(python3 -c "print(f'{$tc - $pc:.2f}')")" \
      "$(python3 -c "print(f'{$pc / ($pc + $floor):.3f}')")" \
      "$(python3 -c "print(f'{($pc + $kp) / ($pc + $floor + $kt):.3f}')")"
  fi
done
