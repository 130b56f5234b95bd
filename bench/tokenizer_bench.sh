#!/usr/bin/env bash
# GPT-2 tokenizer throughput, single thread: keel vs the npm tiktoken package (WASM), on the
# texts of the Brown corpus, in one invocation; prints both figures and their ratio.
#
#   bench/tokenizer_bench.sh [BUILD_DIR] [SECONDS_PER_SIDE]
#
# Builds the tokenizer_bench target in BUILD_DIR (default: build) if it is missing, and installs
# tiktoken into bench/node_modules with npm if it is missing (ignored by git).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
secs=${2:-3}
data=${KEEL_SHARED_DATA:-$root/../shared/data}/brown/brown.jsonl

if [[ ! -x $build/tokenizer_bench ]]; then
  cmake -S "$root" -B "$build" -G Ninja >/dev/null
  ninja -C "$build" -j2 tokenizer_bench >/dev/null
fi
if [[ ! -d $root/bench/node_modules/tiktoken ]]; then
  npm install --prefix "$root/bench" --no-save --no-package-lock --silent tiktoken
fi

keel=$("$build/tokenizer_bench" "$root/assets/gpt2" "$data" "$secs")
peer=$(node "$root/bench/tokenizer_bench.js" "$data" "$secs")
echo "$keel"
echo "$peer"
keel_tokens=$(awk '{print $7}' <<<"$keel")
peer_tokens=$(awk '{print $5}' <<<"$peer")
if [[ $keel_tokens != "$peer_tokens" ]]; then
  echo "token counts differ: keel $keel_tokens, tiktoken $peer_tokens" >&2
  exit 1
fi
awk -v k="$(awk '{print $5}' <<<"$keel")" -v kc="$(awk '{print $3}' <<<"$keel")" \
  -v t="$(awk '{print $3}' <<<"$peer")" \
  'BEGIN { printf "ratio keel/tiktoken: %.1fx warm, %.1fx cold (keel first pass vs tiktoken warm)\n", k / t, kc / t }'
