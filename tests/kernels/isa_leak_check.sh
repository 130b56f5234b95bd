#!/usr/bin/env bash
# Fails when a function of BINARY outside keel's per-ISA kernel namespaces (kernels/cpu/isa.h)
# holds AVX2 or AVX-512 instructions: the linker keeps one copy of each inline function, and a
# wide copy kept for baseline callers stops keel with SIGILL on an older CPU. Functions that
# check the CPU before they run (the peak probe's loops, libraries' own dispatch) are listed.
# It also fails when the AVX-512 copy has no zmm code or the AVX2 copy's GELU/SwiGLU loops are scalar.
#   isa_leak_check.sh build/keel
set -euo pipefail
bin=${1:?usage: isa_leak_check.sh BINARY}
command -v objdump >/dev/null || { echo "isa_leak_check: objdump (binutils) is missing" >&2; exit 1; }
# Probe loops run only after CPUID says yes (monitor/machine_probe.cc), and so does the VZEROUPPER
# after a checkpoint hash (ckpt/manifest.cc).
allowed='FmaLoop|FmaLoop256|DpbfLoop|AmxLoop|Sink|ZeroUpper'
objdump -d --no-show-raw-insn -C "$bin" | awk -v allowed="$allowed" '
  /^[0-9a-f]+ <.*>:$/ { fn = substr($0, index($0, "<") + 1); sub(/>:$/, "", fn); next }
  # The other half of the check: the AVX-512 copy really is (its #pragma took).
  /%zmm[0-9]/ && fn ~ /::isa_avx512::/ && !(fn in wide) { wide[fn] = 1; n512++ }
  # And the AVX2 copy of the elementwise loops with a select in them (the exponential) is vector
  # code: GCC 12 leaves them scalar there unless the kernels build with -fno-trapping-math.
  /%ymm[0-9]/ && fn ~ /::isa_avx2::(Gelu|Swiglu)(Forward|Backward)<float>.*_omp_fn/ { vec2[fn] = 1 }
  # VEX/EVEX instructions (x86-64-v2 has none), BMI/MOVBE, wide or opmask registers.
  $2 ~ /^(v[a-z].*|shlx|shrx|sarx|rorx|andn|bzhi|pdep|pext|mulx|movbe|lzcnt)$/ ||
  /%[yz]mm[0-9]|%k[0-7]|%xmm(1[6-9]|2[0-9]|3[01])/ {
    if (fn ~ /::isa_avx2::|::isa_avx512::/) next
    if (fn ~ ("(" allowed ")")) next
    if (!(fn in seen)) { seen[fn] = $0; n++ }
  }
  END {
    for (f in seen) printf "isa_leak_check: %s: %s\n", f, seen[f]
    if (!n512) { print "isa_leak_check: no zmm instruction in keel::kernels::cpu::isa_avx512"; exit 1 }
    nv = 0
    for (f in vec2) nv++
    if (nv < 4) {
      printf "isa_leak_check: %d of the AVX2 copy'"'"'s 4 GELU/SwiGLU fp32 loops use ymm (the rest are scalar)\n", nv
      exit 1
    }
    if (n) { printf "isa_leak_check: %d functions outside the ISA namespaces use AVX2/AVX-512\n", n; exit 1 }
    printf "isa_leak_check: no AVX2/AVX-512 instructions outside the per-ISA kernels; %d AVX-512 kernel functions use zmm\n", n512
  }'
