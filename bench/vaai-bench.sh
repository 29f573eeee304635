#!/usr/bin/env bash
# VAAI offload benchmark on `tessera up` (four hosts in one process, FTT=1
# volumes), the way ESXi uses the offloads:
#   clone   EXTENDED COPY of a whole thin volume holding DATA of data into
#           another (xcopy_bench from ../shared/tools: LID1, NAA descriptors,
#           16 MiB block-to-block segments), then qemu-img compare;
#   zero    WRITE SAME of zeros over ZERO bytes (qemu-io "write -z");
#   unmap   UNMAP of the whole source volume (qemu-io "discard").
# Prints each operation's duration and the volumes' used bytes before and
# after (from `tessera volume list --json`), and the offload counters.
#
# Environment: SIZE (volume size, default 1G), DATA (bytes written into the
# source first, default 64M), ZERO (default 512M), TESSERA (a built binary;
# default: build the release binary), CARGO_TARGET_DIR (default target).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=${SIZE:-1G}
DATA=${DATA:-64M}
ZERO=${ZERO:-512M}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}

for tool in qemu-img qemu-io gcc python3; do
  command -v "$tool" >/dev/null || { echo "vaai-bench: $tool is required" >&2; exit 1; }
done

if [ -z "${TESSERA:-}" ]; then
  cargo build --release -q -p tessera
  TESSERA="$CARGO_TARGET_DIR/release/tessera"
fi

work=$(mktemp -d -p "${BENCH_DIR:-/work}" tessera-vaai.XXXXXX)
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

xcopy_src=${XCOPY_SOURCE:-../shared/tools/xcopy_bench.c}
[ -f "$xcopy_src" ] || xcopy_src=/work/shared/tools/xcopy_bench.c
gcc -O2 -o "$work/xcopy_bench" "$xcopy_src" -liscsi

ports=$(python3 -c 'import socket
ps=[]
for _ in range(4):
    s=socket.socket(); s.bind(("127.0.0.1",0)); ps.append(s.getsockname()[1])
print(*ps)')
read -r api nbd transport iscsi <<<"$ports"
bind=127.77.0.1
"$TESSERA" up --data-dir "$work/data" --bind "$bind" --api-port "$api" --nbd-port "$nbd" \
  --transport-port "$transport" --iscsi-port "$iscsi" --host-capacity 8G \
  >"$work/up.log" 2>&1 &
pid=$!
t() { "$TESSERA" --api "http://$bind:$api" "$@"; }
for _ in $(seq 300); do t status >/dev/null 2>&1 && break; sleep 0.1; done
t volume create src --size "$SIZE" >/dev/null
t volume create dst --size "$SIZE" >/dev/null
url() { echo "iscsi://$bind:$iscsi/iqn.2026-11.io.tessera:$1/0"; }
for _ in $(seq 100); do iscsi-inq "$(url dst)" >/dev/null 2>&1 && break; sleep 0.2; done

used() {
  t volume list --json | python3 -c 'import json,sys
print(" ".join("%s=%d" % (v["name"], v["used_bytes"]) for v in json.load(sys.stdin)))'
}
seconds() { python3 -c 'import sys,time; print(f"{time.time()-float(sys.argv[1]):.3f}")' "$1"; }

head -c "$DATA" /dev/urandom >"$work/data.raw"
qemu-img convert -n -f raw -O raw "$work/data.raw" "$(url src)"
echo "before:      $(used)"

mib=$(( $(numfmt --from=iec "$SIZE") >> 20 ))
"$work/xcopy_bench" "$(url src)" "$(url dst)" "$mib" | sed 's/^/clone:       /'
qemu-img compare -q -f raw -F raw "$(url src)" "$(url dst)" && echo "clone:       copies identical"
echo "after clone: $(used)"

start=$(date +%s.%N)
qemu-io -f raw -c "write -z 0 $ZERO" "$(url dst)" >/dev/null
echo "zero:        $ZERO in $(seconds "$start") s; $(used)"

start=$(date +%s.%N)
qemu-io -f raw -c "discard 0 $SIZE" "$(url src)" >/dev/null
echo "unmap:       $SIZE in $(seconds "$start") s; $(used)"

for v in src dst; do
  echo "$v $(t object show "$v" | grep '^offloads')"
done
