#!/usr/bin/env bash
# Runs every test: unit and kernel tests, multi-process tests under mpirun, and the PyTorch
# oracle. Builds first if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x build/keel ]] || KEEL_SKIP_APT=${KEEL_SKIP_APT:-0} scripts/setup.sh
ninja -C build -j"$(nproc)" >/dev/null
ctest --test-dir build --output-on-failure -j1 "$@"
