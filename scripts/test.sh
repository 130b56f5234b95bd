#!/usr/bin/env bash
# Runs every test: unit and kernel tests, multi-process tests under mpirun, and the PyTorch
# oracle. Builds first if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests' own packages (PyTorch, Chromium, Slurm ...) and build; quick when already there.
KEEL_SETUP_TESTS=1 scripts/setup.sh
ctest --test-dir build --output-on-failure -j1 "$@"
