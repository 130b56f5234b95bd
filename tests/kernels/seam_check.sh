#!/usr/bin/env bash
# The backend seam holds:
# - the model, optimizer, step and checkpoint staging make no raw host-memory calls (memset,
#   memcpy, memmove, aligned_alloc, malloc, std::fill_n, std::copy_n) on their buffers — those go
#   through kernels::Backend / keel::Memory, so that the same code runs on a GPU. A call on memory
#   that is host memory by design (token ids, a host name, the staging buffer) carries a "host:"
#   comment on its line or up to three lines above, saying why.
# - nothing outside kernels/ includes kernels/cpu/ or names the CPU kernels (kernels::cpu, cpu::):
#   it reaches them through kernels::Backend, kernels::Cpu() where it wants the CPU whatever the
#   run's device. A line that must name them (a function only the CPU has) carries a "cpu:" comment
#   on its line or up to three lines above, saying why.
#   tests/kernels/seam_check.sh [SRC_ROOT]   (default src/keel)
set -euo pipefail
src=${1:-$(dirname "$0")/../../src/keel}
bad=0
files=$(find "$src/model" "$src/optim" "$src/train" -name '*.cc' -o -name '*.h'; echo "$src/ckpt/writer.cc")
for f in $files; do
  out=$(awk '
    /host:/ { last = NR }
    /(std::)?(memset|memcpy|memmove|aligned_alloc|malloc|fill_n|copy_n)\(/ {
      if (!(last && NR - last <= 3)) printf "%s:%d: %s\n", FILENAME, NR, $0
    }' "$f")
  if [[ -n $out ]]; then
    echo "$out"
    bad=1
  fi
done
if ((bad)); then
  echo "seam_check: raw host-memory calls above (route them through the backend, or mark host:)"
fi
above=$(find "$src" -path "$src/kernels" -prune -o \
  \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print)
cpu_bad=0
for f in $above; do
  # The mark is a comment's "cpu:" (not the "cpu::" of a name); a name is looked for in the code,
  # not in comments (which may name files under kernels/cpu/).
  out=$(awk '
    /\/\/.*(^|[^A-Za-z0-9_:])cpu:([^:]|$)/ { last = NR }
    {
      code = $0
      sub(/\/\/.*/, "", code)
      if (code ~ /#include "keel\/kernels\/cpu\// || code ~ /(^|[^A-Za-z0-9_:])cpu::/ ||
          code ~ /kernels::cpu([^A-Za-z0-9_]|$)/)
        if (!(last && NR - last <= 3)) printf "%s:%d: %s\n", FILENAME, NR, $0
    }' "$f")
  if [[ -n $out ]]; then
    echo "$out"
    cpu_bad=1
  fi
done
if ((cpu_bad)); then
  echo "seam_check: CPU kernels named outside kernels/ above (call them through kernels::Backend," \
    "kernels::Cpu() for the CPU, or mark cpu: with the reason)"
  bad=1
fi
if ((bad)); then exit 1; fi
echo "seam_check: $(echo "$files" | wc -l) files clean of raw host-memory calls," \
  "$(echo "$above" | wc -l) outside kernels/ clean of CPU kernel names"
