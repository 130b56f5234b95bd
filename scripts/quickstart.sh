#!/usr/bin/env bash
# The quickstart: set up, prepare the bundled Brown corpus, train a small GPT on it for a few
# hundred steps (a few minutes on 2 cores), and sample from it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

corpus=assets/brown/brown.jsonl
if [[ ! -f data/brown/train/meta.json ]]; then
  build/keel data prepare "$corpus" --out data/brown --val-fraction 0.05 --workers "$(nproc)"
fi
if [[ -d runs/quickstart ]]; then
  # The sample run starts over each time (a real run would continue: --resume auto).
  echo "quickstart: replacing the previous runs/quickstart"
  rm -rf runs/quickstart
fi
build/keel train configs/quickstart.toml "$@"
build/keel generate --run runs/quickstart --prompt "The jury said" --max-tokens 40 --count 2
