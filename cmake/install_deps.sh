#!/usr/bin/env bash
# Installs libllm's build and test dependencies from Debian packages
# (cmake/debian-packages.txt). Run as root (or through sudo). Safe to run
# again: apt skips what is there.
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
  exec sudo "$0" "$@"
fi
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2046  # one word per package
apt-get install -y -qq --no-install-recommends $(sed 's/#.*//' cmake/debian-packages.txt) >/dev/null
# The Rust binding needs cargo; Debian's is enough when none is installed.
if ! command -v cargo >/dev/null 2>&1; then
  apt-get install -y -qq --no-install-recommends cargo rustc >/dev/null
fi
echo "libllm: dependencies installed"
