#!/usr/bin/env bash
# Builds the fuzz targets (build-fuzz/: clang, libFuzzer, ASan + UBSan) and runs each on its seed
# corpus (fuzz/corpus/TARGET). See docs/PERFORMANCE.md, "Fuzzing".
#
#   fuzz/run.sh                       short run, for CI: 10 s per target
#   fuzz/run.sh --long                10^6 executions per target (at most 10 minutes each)
#   fuzz/run.sh [--long] config ...   only the named targets (fuzz_NAME.cc)
#
# KEEL_FUZZ_JOBS: ninja's -j (1). KEEL_FUZZ_SECONDS: the short run's time per target (10).
# KEEL_FUZZ_LONG_SECONDS: the long run's cap per target (600).
# New inputs the fuzzer finds go to build-fuzz/corpus/TARGET (the seeds stay untouched); a finding
# is saved as build-fuzz/findings/TARGET/crash-* (or leak-, timeout-, oom-), and the script exits
# non-zero. Each target's libFuzzer output is in build-fuzz/logs/MODE/TARGET.log. Reproduce a
# finding with: build-fuzz/fuzz_TARGET build-fuzz/findings/TARGET/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."

mode=short
targets=()
for arg in "$@"; do
  case "$arg" in
    --long) mode=long ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) targets+=("$arg") ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  targets=(config dataset_meta dataset manifest safetensors tokenizer_files tokenizer_encode
           prepare_jsonl dashboard_http hf_llama)
fi

CC=clang CXX=clang++ cmake -G Ninja -S . -B build-fuzz -DKEEL_FUZZ=ON -DKEEL_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
  -DKEEL_BUILD_TESTS=OFF -DKEEL_BUILD_BENCH=OFF >/dev/null
ninja -C build-fuzz -j "${KEEL_FUZZ_JOBS:-1}" $(printf 'fuzz_%s ' "${targets[@]}")

if [ "$mode" = long ]; then
  limits=(-runs=1000000 -max_total_time="${KEEL_FUZZ_LONG_SECONDS:-600}")
else
  limits=(-max_total_time="${KEEL_FUZZ_SECONDS:-10}")
fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export OMP_NUM_THREADS=1

failed=()
summary=()
for t in "${targets[@]}"; do
  corpus=build-fuzz/corpus/$t findings=build-fuzz/findings/$t log=build-fuzz/logs/$mode/$t.log
  mkdir -p "$corpus" "$findings" "$(dirname "$log")"
  echo "== fuzz_$t ($mode)"
  # -timeout: an input that takes 10 s is a hang. The first corpus folder is the writable one.
  if build-fuzz/fuzz_"$t" "${limits[@]}" -timeout=10 -print_final_stats=1 \
      -artifact_prefix="$findings/" "$corpus" "fuzz/corpus/$t" >"$log" 2>&1; then
    status=ok
  else
    status=FINDING
    failed+=("$t")
    tail -n 40 "$log"
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 || true)
  summary+=("$(printf '%-18s %-8s %10s execs %8s exec/s  %s' "$t" "$status" "${runs:-?}" "${rate:-?}" "$cov")")
done

echo
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "findings in: ${failed[*]} (see build-fuzz/findings/ and build-fuzz/logs/)" >&2
  exit 1
fi
