#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs the Debian packages hotkv builds and tests with (--runtime: only
# what building and running the cluster needs; --fuzz: also clang for the
# libFuzzer harnesses). Used by run.sh and test.sh.
# As root it runs apt-get; otherwise it prints the exact command.
set -euo pipefail
# Building and running the cluster (./run.sh, ./deps.sh --runtime):
KV_PACKAGES=(build-essential cmake pkg-config libnng-dev libprotobuf-c-dev protobuf-c-compiler
  liburing-dev liburcu-dev libxxhash-dev libinih-dev liblz4-dev libzstd-dev libmbedtls-dev)
# (LZ4 and zstd: the LSM's block compression, also slowfs's compression model;
# mbedTLS: HMAC-SHA256 of signed cluster maps, the library nng's TLS uses)
# and the tests and benchmarks (./test.sh): Criterion, the slow-volume
# emulator (FUSE), RocksDB
# for the tier benchmark, docker-compose to check
# the compose file, openssl to make the TLS tests' CA and certificates,
# Prometheus' Python client (its text-format parser checks /metrics) and
# Chromium (the dashboard test loads the page headless).
if [ "${1:-}" != --runtime ]; then
  KV_PACKAGES+=(libcriterion-dev libfuse3-dev fuse3 librocksdb-dev
    docker-compose openssl python3-prometheus-client chromium)
fi
# ./test.sh --fuzz: clang and its runtimes (libFuzzer, ASan, UBSan).
if [ "${1:-}" = --fuzz ]; then
  KV_PACKAGES+=(clang libclang-rt-14-dev)
fi
missing=()
for p in "${KV_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "hotkv needs these packages: ${missing[*]}" >&2
  echo "run: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
