#!/usr/bin/env bash
# Runs Tessera's whole test suite on a fresh Debian 12 machine with the Rust
# toolchain: installs the real clients and servers the tests drive, then runs
# `cargo xtask ci` (fmt, layers, tidy, clippy, the fresh-machine start, every
# test). `scripts/test-all.sh --packages` installs the packages and stops.
#
# The build itself needs no package: the etcd client's protobuf code is
# compiled with the protoc shipped in a crate (see `.cargo/config.toml`).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

packages=(etcd-server fio libnbd-bin nbdkit qemu-utils libiscsi-bin fuse3 e2fsprogs python3-libnbd libiscsi-dev postgresql python3-jsonschema)
missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
# promtool checks the /metrics text; it comes with the Prometheus server,
# whose recommended exporters the tests do not need.
if ! installed prometheus; then
  echo "installing: prometheus (for promtool)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus
fi
# The dashboard is tested in Debian's headless chromium, through
# chromedriver; neither needs what it recommends (fonts, desktop helpers).
browser_missing=()
for p in chromium chromium-driver; do
  installed "$p" || browser_missing+=("$p")
done
if [ "${#browser_missing[@]}" -gt 0 ]; then
  echo "installing: ${browser_missing[*]} (for the dashboard's browser test)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${browser_missing[@]}"
fi

# Prints a bookworm-backports source made from the first configured, enabled
# `deb` source of the suite bookworm (its URI, options and keyring), in the
# format of the file it came from, and the extension that format needs:
# "list" then the one-line entry, or "sources" then the deb822 stanza.
# Prints nothing when no such source is configured. The apt configuration
# directory is $1 (default /etc/apt).
backports_source() {
  local etc=${1:-/etc/apt} file
  for file in "$etc/sources.list" "$etc"/sources.list.d/*.list; do
    [ -f "$file" ] || continue
    # deb [options] URI SUITE COMPONENT...; the options may hold spaces.
    if awk '
      $1 == "deb" {
        i = 2
        if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
        if ($(i + 1) == "bookworm") {
          $(i + 1) = "bookworm-backports"
          print "list"; print; found = 1; exit
        }
      }
      END { exit !found }' "$file"; then
      return 0
    fi
  done
  for file in "$etc"/sources.list.d/*.sources; do
    [ -f "$file" ] || continue
    # deb822: stanzas separated by blank lines; fields may continue on
    # lines that start with a space; lines starting with # are comments.
    if awk '
      BEGIN { RS = ""; FS = "\n" }
      {
        types = ""; suites = ""; enabled = "yes"
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^[Tt]ypes:/) types = " " substr($i, 7) " "
          if ($i ~ /^[Ss]uites:/) suites = " " substr($i, 8) " "
          if ($i ~ /^[Ee]nabled:/) enabled = substr($i, 9)
        }
        gsub(/[ \t]+/, " ", types); gsub(/[ \t]+/, " ", suites); gsub(/[ \t]/, "", enabled)
        if (types ~ / deb / && suites ~ / bookworm / && enabled != "no") {
          print "sources"
          for (i = 1; i <= NF; i++) {
            if ($i ~ /^#/) continue
            if ($i ~ /^[Tt]ypes:/) { print "Types: deb"; continue }
            if ($i ~ /^[Ss]uites:/) { print "Suites: bookworm-backports"; continue }
            print $i
          }
          found = 1; exit
        }
      }
      END { exit !found }' "$file"; then
      return 0
    fi
  done
}

# Whether apt has a bookworm-backports source configured (apt reads both
# formats and knows which entries are disabled).
have_backports() {
  apt-get indextargets --format '$(RELEASE)' 2>/dev/null | grep -qx bookworm-backports
}

# qemu-img reaches iscsi:// through the block module of qemu-block-extra, which
# must be the exact version of the installed qemu-utils (a backport on some
# machines: then the backports suite must be enabled to find it).
if ! installed qemu-block-extra; then
  qemu_version=$(dpkg-query -W -f='${Version}' qemu-utils)
  if [[ "$qemu_version" == *bpo12* ]] && ! have_backports; then
    entry=$(backports_source)
    if [ -z "$entry" ]; then
      echo "qemu-utils $qemu_version is a backport, but no Debian bookworm source is configured to derive bookworm-backports from; add one and run again" >&2
      exit 1
    fi
    format=${entry%%$'\n'*}
    target=/etc/apt/sources.list.d/tessera-backports.$format
    echo "adding bookworm-backports (for qemu-block-extra $qemu_version) as $target"
    printf '%s\n' "${entry#*$'\n'}" | $SUDO tee "$target" >/dev/null
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "qemu-block-extra=$qemu_version"
fi

[ "${1:-}" = "--packages" ] && exit 0

# Tests that drive a real client fail (rather than skip) when it is missing.
export TESSERA_REQUIRE_TOOLS=1
# A clean checkout gains nothing from incremental compilation, and its
# caches would take gigabytes of the build machine's disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
echo "free disk before the build: $(df -h --output=avail . | tail -1 | tr -d ' ')"
exec cargo xtask ci
