#!/usr/bin/env bash
# Runs Tessera's whole test suite on a fresh Debian 12 machine with the Rust
# toolchain: installs the real clients and servers the tests drive, then runs
# `cargo xtask ci` (fmt, layers, tidy, clippy, every test).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(etcd-server protobuf-compiler fio libnbd-bin nbdkit qemu-utils libiscsi-bin fuse3 e2fsprogs python3-libnbd)
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

# Tests that drive a real client fail (rather than skip) when it is missing.
export TESSERA_REQUIRE_TOOLS=1
exec cargo xtask ci
