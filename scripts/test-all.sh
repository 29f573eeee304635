#!/usr/bin/env bash
# Runs Tessera's whole test suite on a fresh Debian 12 machine with the Rust
# toolchain: installs the real clients and servers the tests drive, then runs
# `cargo xtask ci` (fmt, layers, tidy, clippy, every test).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(etcd-server protobuf-compiler fio libnbd-bin nbdkit qemu-utils libiscsi-bin fuse3 e2fsprogs python3-libnbd libiscsi-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# qemu-img reaches iscsi:// through the block module of qemu-block-extra, which
# must be the exact version of the installed qemu-utils (a backport on some
# machines: then the backports suite must be enabled to find it).
if ! dpkg-query -W -f='${Status}' qemu-block-extra 2>/dev/null | grep -q "install ok installed"; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  qemu_version=$(dpkg-query -W -f='${Version}' qemu-utils)
  if [[ "$qemu_version" == *bpo12* ]] && ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d; then
    echo "deb http://deb.debian.org/debian bookworm-backports main" | $SUDO tee /etc/apt/sources.list.d/tessera-backports.list >/dev/null
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "qemu-block-extra=$qemu_version"
fi

# Tests that drive a real client fail (rather than skip) when it is missing.
export TESSERA_REQUIRE_TOOLS=1
exec cargo xtask ci
