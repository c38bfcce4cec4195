#!/usr/bin/env bash
# Installs libllm's build and test dependencies from Debian packages.
# Run as root (or through sudo). Safe to run again: apt skips what is there.
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
  exec sudo "$0" "$@"
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  build-essential cmake pkg-config python3 \
  libzstd-dev libmimalloc-dev libxxhash-dev \
  libgtest-dev libgmock-dev googletest libbenchmark-dev nlohmann-json3-dev unicode-data \
  clang libclang-rt-dev ninja-build \
  golang-go mono-mcs mono-runtime binutils \
  >/dev/null
# The Rust binding needs cargo; Debian's is enough when none is installed.
if ! command -v cargo >/dev/null 2>&1; then
  apt-get install -y -qq --no-install-recommends cargo rustc >/dev/null
fi
echo "libllm: dependencies installed"
