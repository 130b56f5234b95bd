#!/usr/bin/env bash
# The backend seam holds: the model, optimizer, step and checkpoint staging make no raw
# host-memory calls (memset, memcpy, memmove, aligned_alloc, malloc, std::fill_n, std::copy_n) on
# their buffers — those go through kernels::Backend / keel::Memory, so that the same code runs on a
# GPU — and model/ and optim/ call kernels only through the backend (no kernels/cpu/ includes).
# A call on memory that is host memory by design (token ids, a host name, the staging buffer)
# carries a "host:" comment on its line or up to three lines above, saying why.
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
if grep -n '#include "keel/kernels/cpu/' -r "$src/model" "$src/optim"; then
  echo "model/ and optim/ call kernels through kernels::Backend, not kernels/cpu/"
  bad=1
fi
if ((bad)); then
  echo "seam_check: raw host-memory calls above (route them through the backend, or mark host:)"
  exit 1
fi
echo "seam_check: $(echo "$files" | wc -l) files clean"
