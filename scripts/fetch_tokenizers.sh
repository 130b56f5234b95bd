#!/usr/bin/env bash
# The vocabularies of `keel data prepare --tokenizer cl100k|o200k|llama3`: tiktoken rank files in
# assets/tokenizers/ (or OUT_DIR), made from pinned npm packages (tiktoken, llama3-tokenizer-js;
# gpt-tokenizer comes along for the exactness test). GPT-2's vocabulary ships in assets/gpt2.
#   scripts/fetch_tokenizers.sh [OUT_DIR]
# Needs node and npm (Debian: apt-get install nodejs npm). The packages go to third_party/npm/
# (ignored by git), where the exactness test and the tokenizer benchmark find them too.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/assets/tokenizers}
npm_dir=$root/third_party/npm
command -v node >/dev/null && command -v npm >/dev/null ||
  { echo "fetch_tokenizers.sh: needs node and npm (apt-get install nodejs npm)" >&2; exit 1; }
if [[ ! -d $npm_dir/node_modules/llama3-tokenizer-js || ! -d $npm_dir/node_modules/gpt-tokenizer ||
      ! -d $npm_dir/node_modules/tiktoken ]]; then
  mkdir -p "$npm_dir"
  npm install --prefix "$npm_dir" --no-save --no-package-lock --no-audit --no-fund --silent \
    tiktoken@1.0.22 gpt-tokenizer@4.0.0 llama3-tokenizer-js@1.2.0
fi
node "$root/scripts/tokenizers_from_npm.mjs" "$npm_dir/node_modules" "$out"
