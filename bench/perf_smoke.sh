#!/usr/bin/env bash
# The speed guard CI runs: a few steps of the quickstart's model (gpt2-mini bf16 B=16 T=128) and of
# GPT-2 124M (B=4 T=256, bf16 and fp32), each MFU against this CPU's measured peak, compared with
# the floor bench/perf_floors.txt records for this CPU's class (avx2, avx512, avx512-bf16, amx).
# A CPU with bf16 dot products that keel does not use, because they are slower than its fp32 FMAs
# (kernels/cpu_isa.h: a Xeon whose AMX is hidden), is of class avx512: its bf16 products run in
# fp32 on AVX-512, as on a CPU without them.
# On a CPU wider than AVX2 the quickstart also runs on keel's AVX2 kernels with oneDNN held to
# AVX2 (quickstart-avx2), so that a slowdown of the AVX2 copy is caught on any CI machine; its MFU
# is against the CPU's 256-bit FMA peak (the instructions it may use), not the AMX or AVX-512 one.
# A run below 70% of its floor is tried again, up to 3 times; the best counts. So a 2x slowdown
# (a build flag, a kernel gone scalar) fails and a noisy neighbour does not. A class without
# floors passes, saying so: record them with RECORD=1 on such a machine.
#
#   bench/perf_smoke.sh              # ~60 s on 2 cores (ctest perf_smoke), up to ~170 s on retries
#   RECORD=1 bench/perf_smoke.sh     # prints floor lines for this CPU (its best of 3) to commit
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
floors=$root/bench/perf_floors.txt
bin=$build/bench_train_step
[[ -x $bin ]] || { echo "perf_smoke: $bin is missing (build with -DKEEL_BUILD_BENCH=ON)" >&2; exit 1; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]]; }
if has amx_bf16; then class=amx
elif has avx512_bf16; then class=avx512-bf16
elif has avx512f; then class=avx512
elif has avx2; then class=avx2
else class=other; fi
if [[ $class == avx512-bf16 ]]; then
  probe=$("$bin" gpt2-mini 1 16 bf16 1 0 | tail -1)
  if [[ $(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("products"))' "$probe") == fp32 ]]; then
    echo "perf_smoke: this CPU's bf16 dot products are slower than its fp32 FMAs; keel runs bf16 products in fp32: class avx512"
    class=avx512
  fi
fi
# The kernels keel must choose on this class (kernels/cpu_isa.h): a narrower choice is a slowdown.
case $class in amx | avx512*) want=avx512 ;; avx2) want=avx2 ;; *) want= ;; esac
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "perf_smoke: $cpu, class $class, $OMP_NUM_THREADS threads"

# name model B T dtype steps warmup
runs=("quickstart gpt2-mini 16 128 bf16 4 2" "gpt2-124m-bf16 gpt2 4 256 bf16 2 1"
      "gpt2-124m-fp32 gpt2 4 256 fp32 2 1")
[[ $want == avx512 ]] && runs+=("quickstart-avx2 gpt2-mini 16 128 bf16 3 1")
attempts=3
fail=0
for r in "${runs[@]}"; do
  read -r name model B T dt steps warmup <<<"$r"
  env=() expect=$want
  [[ $name == *-avx2 ]] && env=(KEEL_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2) expect=avx2
  floor=$(awk -v c="$class" -v n="$name" '!/^#/ && $1 == c && $2 == n { print $3 }' "$floors")
  best=0 isa='?' line=
  for ((a = 1; a <= attempts; a++)); do
    line=$(env "${env[@]}" "$bin" "$model" "$B" "$T" "$dt" "$steps" "$warmup" | tail -1)
    read -r mfu tok isa peak <<<"$(/usr/bin/python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(j["mfu"], j["tokens_per_s"], j.get("isa", "?"), round(j["peak_gflops"]))' "$line")"
    printf 'perf_smoke: %-15s try %d: %7.1f tokens/s, MFU %5.1f%% of %s GFLOP/s (kernels %s)\n' \
      "$name" "$a" "$tok" "$(/usr/bin/python3 -c "print(100 * $mfu)")" "$peak" "$isa"
    best=$(/usr/bin/python3 -c "print(max($best, $mfu))")
    [[ ${RECORD:-0} == 1 ]] && continue
    [[ -z $floor ]] && break
    /usr/bin/python3 -c "import sys; sys.exit(0 if $best >= 0.7 * $floor else 1)" && break
  done
  if [[ -n $expect && $isa != "$expect" ]]; then
    echo "perf_smoke: $name: keel chose the $isa kernels on a CPU of class $class (expected $expect)"
    fail=1
  fi
  if [[ ${RECORD:-0} == 1 ]]; then
    printf '%s %s %.4f  # %s, kernels %s, %s\n' "$class" "$name" "$best" "$cpu" "$isa" "$(date +%F)"
  elif [[ -z $floor ]]; then
    echo "perf_smoke: $name: no floor recorded for class $class (bench/perf_floors.txt); not checked"
  elif /usr/bin/python3 -c "import sys; sys.exit(0 if $best >= 0.7 * $floor else 1)"; then
    echo "perf_smoke: $name: best MFU $best >= 70% of the floor $floor: ok"
  else
    echo "perf_smoke: $name: best MFU $best < 70% of the floor $floor for class $class: SLOWER"
    fail=1
  fi
done
exit $fail
