#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh runs, for a GPU machine that has the CUDA toolkit but not keel's
# Debian packages and no network (the device tool's image): keel, kernels_test, model_test and
# dump_model
# built here with the CUDA backend (for any x86-64-v3 CPU, not -march=native), and the shared
# libraries they load, less the C/C++ runtime and CUDA's own (cuBLASLt, NCCL: large, and there),
# gzipped into build-gpu/keel-gpu-bundle.tgz (the device tool carries up to 64 MiB).
#
#   scripts/gpu_bundle.sh        # then run gpu_check.sh there, carrying build-gpu/keel-gpu-bundle.tgz
set -euo pipefail
cd "$(dirname "$0")/.."
b=build-gpu
cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKEEL_CUDA=ON \
  -DCMAKE_CXX_FLAGS="-march=x86-64-v3" -DKEEL_BUILD_TESTS=ON -DKEEL_BUILD_BENCH=OFF >/dev/null
ninja -C "$b" keel kernels_test model_test dump_model
out=$b/bundle
tgz=$b/keel-gpu-bundle.tgz
rm -rf "$out" "$tgz"
mkdir -p "$out/lib"
# The CUDA backend and NCCL are plugins (core/plugin.h), found beside the executables.
bins=("$out/keel" "$out/kernels_test" "$out/model_test" "$out/dump_model" "$out/libkeel_cuda.so"
      "$out/libkeel_nccl.so")
cp "$b/keel" "$b/kernels_test" "$b/model_test" "$b/dump_model" "$b/libkeel_cuda.so" \
  "$b/libkeel_nccl.so" "$out/"
strip --strip-unneeded "${bins[@]}"
for lib in $(ldd "${bins[@]}" | awk '/=> \// {print $3}' | sort -u); do
  case $(basename "$lib") in
    libc.so* | libm.so* | libpthread* | libdl.so* | librt.so* | ld-linux* | libstdc++* | libgcc_s*) ;;
    libcuda.so* | libcublas* | libnccl*) ;;
    *) cp -L "$lib" "$out/lib/" ;;
  esac
done
tar czf "$tgz" -C "$b" bundle
echo "gpu_bundle: $tgz, $(du -m "$tgz" | cut -f1) MB ($(ls "$out/lib" | wc -l) libraries)"
