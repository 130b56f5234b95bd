#!/usr/bin/env bash
# The CUDA backend as a plugin (core/plugin.h), on a machine with the CUDA toolkit and no GPU:
#  1. the default build contains libkeel_cuda.so and libkeel_nccl.so beside keel, and keel links
#     no CUDA library (readelf: no libcudart, libcublas, libnccl or libcuda among its NEEDED);
#  2. every symbol the plugin needs resolves: keel loads it (dlopen RTLD_NOW) when a run asks for
#     train.device = "cuda", and with no driver or no GPU here stops with one line and exit 2;
#  3. the plugin is looked for where documented: KEEL_PLUGIN_DIR pointing at a folder without it
#     still finds the build's; a copy of keel in a folder of its own is refused with one line
#     naming the file and where it was looked for;
#  4. a plugin from other sources (another interface hash) is refused with one line, exit 2.
# Where no nvcc is installed the build has no plugin: exit 77, saying so. Where a GPU is visible,
# step 2 expects the run to train instead.
#   tests/kernels/cuda_plugin.sh KEEL_BINARY SOURCE_DIR SHARED_DATA HAVE_CUDA
set -euo pipefail
keel=$1 src=$2 shared=$3 have_cuda=$4
if [[ $have_cuda != ON ]]; then
  if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
    echo "cuda_plugin: nvcc is installed but the build has no CUDA plugin (KEEL_CUDA=$have_cuda?)"
    exit 1
  fi
  echo "cuda_plugin: no nvcc (CUDA toolkit) on this machine: the CUDA plugin is not built"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for name in cuda nccl; do
  plugin=$(dirname "$keel")/libkeel_$name.so
  [[ -f $plugin ]] || { echo "cuda_plugin: no $plugin in the build"; exit 1; }
  echo "cuda_plugin: $plugin present, $(du -k "$plugin" | cut -f1) KiB"
done
if readelf -d "$keel" | grep -E 'NEEDED.*(libcudart|libcublas|libnccl|libcuda\.)'; then
  echo "cuda_plugin: keel links CUDA libraries itself (above): a CPU run would load them"
  exit 1
fi
echo "cuda_plugin: keel links no CUDA library"

head -c 100000 "$shared/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
common=(--set data.train="$tmp/tokens.u16" --set train.out_dir="$tmp" --set train.steps=2
        --set train.batch_size=2)
gpu=0
command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU && gpu=1
# expect NAME RC TEXT CMD...: CMD exits RC with TEXT in one line of its output.
expect() {
  local name=$1 want_rc=$2 text=$3 rc=0
  shift 3
  OMP_NUM_THREADS=1 "$@" >"$tmp/$name.log" 2>&1 || rc=$?
  if ((rc != want_rc)) || ! grep -q -- "$text" "$tmp/$name.log"; then
    echo "cuda_plugin: $name: exit $rc (expected $want_rc), expected \"$text\" in:"
    cat "$tmp/$name.log"
    exit 1
  fi
  echo "cuda_plugin: $name: exit $rc: $(grep -m1 -- "$text" "$tmp/$name.log")"
}
run=(train "$src/configs/test-tiny.toml" "${common[@]}" --set train.device=cuda)
if ((gpu)); then
  expect gpu_run 0 "step" "$keel" "${run[@]}" --set train.name=gpu
else
  expect no_gpu 2 'device = "cuda": no' "$keel" "${run[@]}" --set train.name=no_gpu
  lines=$(grep -c 'device = "cuda"' "$tmp/no_gpu.log")
  ((lines == 1)) || { echo "cuda_plugin: no_gpu: $lines lines name the key, expected 1"; exit 1; }
fi
# Looked for in KEEL_PLUGIN_DIR first: a plugin there that needs a library this machine lacks
# names the library; one built from other sources names both interface hashes.
mkdir "$tmp/needs" "$tmp/other" "$tmp/bin"
echo 'int keel_missing_dep(void) { return 1; }' >"$tmp/dep.c"
gcc -shared -fPIC -o "$tmp/libkeel_missing_dep.so" "$tmp/dep.c"
echo 'int keel_missing_dep(void); int f(void) { return keel_missing_dep(); }' >"$tmp/needs.c"
gcc -shared -fPIC -o "$tmp/needs/libkeel_cuda.so" "$tmp/needs.c" -L"$tmp" -lkeel_missing_dep
rm "$tmp/libkeel_missing_dep.so"
expect missing_library 2 "cannot load $tmp/needs/libkeel_cuda.so: libkeel_missing_dep.so" \
  env KEEL_PLUGIN_DIR="$tmp/needs" "$keel" "${run[@]}" --set train.name=needs
echo 'const char* keel_plugin_interface(void) { return "0123456789abcdef"; }' >"$tmp/other.c"
gcc -shared -fPIC -o "$tmp/other/libkeel_cuda.so" "$tmp/other.c"
expect other_sources 2 "built from other keel sources (interface 0123456789abcdef" \
  env KEEL_PLUGIN_DIR="$tmp/other" "$keel" "${run[@]}" --set train.name=other
# A keel with no plugin beside it (copied alone): refused when the config is read.
cp "$keel" "$tmp/bin/keel"
expect no_plugin 2 "libkeel_cuda.so" "$tmp/bin/keel" "${run[@]}" --set train.name=alone
