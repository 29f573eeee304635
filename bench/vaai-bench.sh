#!/usr/bin/env bash
# VAAI offload benchmark on `tessera up` (four hosts in one process, FTT=1
# volumes), the way ESXi uses the offloads:
#   clone   EXTENDED COPY of a whole thin volume holding DATA of data into
#           another (xcopy_bench from ../shared/tools: LID1, NAA descriptors,
#           16 MiB block-to-block segments), then qemu-img compare;
#   zero    WRITE SAME of zeros over ZERO bytes (qemu-io "write -z");
#   unmap   UNMAP of the whole source volume (qemu-io "discard");
#   intra   INTRA bytes of random data written at the start of a volume,
#           then one EXTENDED COPY of them to another range of the same
#           volume through its owner's portal (ESXi cloning a VM inside one
#           VMFS datastore: the copy shares the stored blocks), and as the
#           reference the same copy to a third range through a host that
#           does not own the volume (the data moves); qemu-img compare of
#           both ranges against the data.
# Prints each operation's duration and the volumes' used bytes before and
# after (from `tessera volume list --json`), the disk groups' physical bytes
# around the intra-volume copies (`tessera host list --json`, once the write
# logs have drained to the capacity tier), and the offload counters.
#
# Environment: SIZE (volume size, default 1G), DATA (bytes written into the
# source first, default 64M), ZERO (default 512M), INTRA (default 1G),
# XCOPY_MIB (EXTENDED COPY command size of the intra case, default 16, as
# ESXi's MaxHWTransferSize), TESSERA (a built binary; default: build the
# release binary), CARGO_TARGET_DIR (default target).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=${SIZE:-1G}
DATA=${DATA:-64M}
ZERO=${ZERO:-512M}
INTRA=${INTRA:-1G}
XCOPY_MIB=${XCOPY_MIB:-16}
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
gcc -O2 -o "$work/xcopy_range" crates/tessera-node/tests/tools/xcopy_range.c -liscsi

ports=$(python3 -c 'import socket
ps=[]
for _ in range(4):
    s=socket.socket(); s.bind(("127.0.0.1",0)); ps.append(s.getsockname()[1])
print(*ps)')
read -r api nbd transport iscsi <<<"$ports"
bind=127.77.0.1
# The CLI presents the admin token `tessera up` writes there.
export TESSERA_TOKEN_FILE="$work/data/admin.token"
"$TESSERA" up --data-dir "$work/data" --bind "$bind" --api-port "$api" --nbd-port "$nbd" \
  --transport-port "$transport" --iscsi-port "$iscsi" --host-capacity 8G \
  >"$work/up.log" 2>&1 &
pid=$!
t() { "$TESSERA" --api "https://$bind:$api" "$@"; }
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

# Intra-volume copy: the owner's portal shares blocks, another host's
# portal copies the data (the reference).
intra=$(numfmt --from=iec "$INTRA")
t volume create vmfs --size $((3 * intra)) >/dev/null
owner_of() {
  t volume list --json | python3 -c 'import json,sys
print(next(v["owner"] or "" for v in json.load(sys.stdin) if v["name"] == sys.argv[1]))' "$1"
}
portal_of() {
  t host list --json | python3 -c 'import json,sys
hosts = json.load(sys.stdin)
pick = [h for h in hosts if (h["id"] == sys.argv[1]) == (sys.argv[2] == "is")]
print(pick[0]["iscsi_addr"])' "$1" "$2"
}
for _ in $(seq 100); do [ -n "$(owner_of vmfs)" ] && break; sleep 0.2; done
owner=$(owner_of vmfs)
on() { echo "iscsi://$1/iqn.2026-11.io.tessera:vmfs/0"; }
owner_url=$(on "$(portal_of "$owner" is)")
other_url=$(on "$(portal_of "$owner" not)")
for u in "$owner_url" "$other_url"; do
  for _ in $(seq 100); do iscsi-inq "$u" >/dev/null 2>&1 && break; sleep 0.2; done
done
physical() {
  t host list --json | python3 -c 'import json,sys
print(sum(g.get("physical_bytes") or 0 for h in json.load(sys.stdin) for g in h["disk_groups"]))'
}
# Physical bytes once they stop changing: data still in a write log is not
# on the capacity devices yet.
settled_physical() {
  local last now same=0
  last=$(physical)
  for _ in $(seq 600); do
    sleep 0.5
    now=$(physical)
    if [ "$now" = "$last" ]; then same=$((same + 1)); else same=0; fi
    [ "$same" -ge 4 ] && break
    last=$now
  done
  echo "$now"
}
matches() {
  local portal=${1#iscsi://}; portal=${portal%%/*}
  qemu-img compare -q -f raw "$work/intra.raw" \
    "json:{\"driver\":\"raw\",\"offset\":$2,\"size\":$intra,\"file\":{\"driver\":\"iscsi\",\"transport\":\"tcp\",\"portal\":\"$portal\",\"target\":\"iqn.2026-11.io.tessera:vmfs\",\"lun\":0}}" \
    && echo "copy identical" || echo "COPY DIFFERS"
}
blocks=$((intra / 512))
command_blocks=$((XCOPY_MIB << 11))
head -c "$INTRA" /dev/urandom >"$work/intra.raw"
qemu-img convert -n -f raw -O raw "$work/intra.raw" "$owner_url"
p0=$(settled_physical)
echo "intra:       $INTRA of random data in volume vmfs (owner $owner); physical $p0 bytes"
shared=$("$work/xcopy_range" "$owner_url" "$blocks" "$owner_url" 0 "$blocks" "$command_blocks")
echo "intra:       shared copy through $owner: $shared; $(matches "$owner_url" "$intra")"
p1=$(settled_physical)
echo "intra:       physical $p0 -> $p1 bytes (+$((p1 - p0)) for $intra copied)"
moved=$("$work/xcopy_range" "$other_url" $((2 * blocks)) "$other_url" 0 "$blocks" "$command_blocks")
echo "intra:       data copy through another host (reference): $moved; $(matches "$owner_url" $((2 * intra)))"
p2=$(settled_physical)
echo "intra:       physical $p1 -> $p2 bytes (+$((p2 - p1)) for $intra copied)"
python3 -c 'import re,sys
s = float(re.search(r"in ([0-9.]+) s", sys.argv[1]).group(1))
d = float(re.search(r"in ([0-9.]+) s", sys.argv[2]).group(1))
print(f"intra:       shared copy {s:.3f} s, data copy {d:.3f} s: {d / s:.1f}x faster")' "$shared" "$moved"
echo "vmfs $(t object show vmfs | grep '^offloads')"
