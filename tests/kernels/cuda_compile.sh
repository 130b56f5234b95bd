#!/usr/bin/env bash
# The CUDA backend and the NCCL communicator compile (they run only on a GPU: scripts/gpu_check.sh):
# a second build folder with -DKEEL_CUDA=ON builds the keel_cuda and keel_parallel libraries,
# every .cu file and comm_nccl.cc. Skipped (exit 77, with the reason) where no nvcc is installed.
#   tests/kernels/cuda_compile.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 out=$2
if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "cuda_compile: no nvcc (CUDA toolkit) on this machine: the CUDA backend is not compiled"
  exit 77
fi
cmake -S "$src" -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKEEL_CUDA=ON \
  -DKEEL_BUILD_TESTS=OFF -DKEEL_BUILD_BENCH=OFF >"$out.log" 2>&1 || { cat "$out.log"; exit 1; }
ninja -C "$out" keel_cuda keel_parallel keel_kernels
echo "cuda_compile: keel_cuda (every .cu), keel_kernels with the CUDA backend, keel_parallel with NCCL built"
