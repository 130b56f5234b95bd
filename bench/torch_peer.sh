# shellcheck shell=bash
# Sourced by the benchmarks that run PyTorch beside keel (train_throughput.sh, attention_bench.sh):
# the peer at its best. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset in its command only
# (keel's runs keep the environment), except where OpenBLAS takes this CPU for a generic one (a VM
# whose CPUID model it does not know: "Core: Prescott", SSE3 kernels, 4x slower on an AVX-512
# Xeon): then OPENBLAS_CORETYPE names the family the CPU's flags say (SKYLAKEX with AVX-512,
# HASWELL with AVX2; PEER_CORETYPE=NAME sets it). OpenBLAS rather than Debian's reference
# libblas.so.3 (PEER_BLAS=openblas-openmp|openblas-pthread|system; the Debian package is fetched
# with `apt-get download` into BUILD/torch-peer when the system BLAS is not OpenBLAS). The
# allocator and OpenMP wait policy matter a lot, so callers run the peer under every combination
# of `mallocs` (PEER_MALLOC, default auto = "tcmalloc_minimal tcmalloc glibc": Debian
# libtcmalloc-minimal4, libgoogle-perftools4, no preload) and `waits` (PEER_WAIT, default auto =
# "PASSIVE ACTIVE") and keep the fastest.
#   needs: build (keel's build folder), py (the python with torch)
#   sets:  lib blas_dir coretype mallocs waits (and its scratch: blas core flags tmp m a);
#          peer_exec MALLOC WAIT COMMAND...
: "${build:?torch_peer.sh needs build}" "${py:?torch_peer.sh needs py}"
lib=/usr/lib/x86_64-linux-gnu

# The peer's BLAS: PyTorch's fp32 matmuls go through libblas.so.3.
blas_dir=
blas=${PEER_BLAS:-openblas-openmp}
if [[ $blas != system ]] && ! readlink -f $lib/libblas.so.3 | grep -q openblas; then
  blas_dir=$build/torch-peer/$blas
  if [[ ! -e $blas_dir/libblas.so.3 ]]; then
    tmp=$(mktemp -d)
    if (cd "$tmp" && apt-get download "libopenblas0-${blas#openblas-}" >/dev/null 2>&1); then
      dpkg -x "$tmp"/*.deb "$tmp/x"
      mkdir -p "$blas_dir" && cp -a "$tmp/x/usr/lib/x86_64-linux-gnu/$blas"/. "$blas_dir"
    else
      echo "warning: could not fetch libopenblas0-${blas#openblas-}; PyTorch fp32 uses $(readlink -f $lib/libblas.so.3)" >&2
      blas_dir=
    fi
    rm -rf "$tmp"
  fi
fi
# Which kernels OpenBLAS picks here by itself (OPENBLAS_VERBOSE=2 prints "Core: NAME").
coretype=${PEER_CORETYPE:-}
if [[ -z $coretype ]]; then
  core=$(env -u OPENBLAS_CORETYPE OPENBLAS_VERBOSE=2 \
    ${blas_dir:+LD_LIBRARY_PATH=$blas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} \
    "$py" -c 'import torch; torch.ones(64, 64) @ torch.ones(64, 64)' 2>&1 | sed -n 's/^Core: //p' | head -1)
  flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
  if [[ $core == Prescott || $core == Nehalem ]]; then
    if [[ " $flags " == *" avx512f "* ]]; then coretype=SKYLAKEX
    elif [[ " $flags " == *" avx2 "* ]]; then coretype=HASWELL; fi
    [[ -n $coretype ]] && echo "peer: OpenBLAS took this CPU for $core; its runs set OPENBLAS_CORETYPE=$coretype"
  fi
fi
mallocs=
for m in ${PEER_MALLOC:-auto}; do
  [[ $m == auto ]] && m="tcmalloc_minimal tcmalloc glibc"
  for a in $m; do
    if [[ $a == glibc || -e $lib/lib$a.so.4 ]]; then
      mallocs+=" $a"
    else
      echo "warning: $lib/lib$a.so.4 missing (apt-get install libtcmalloc-minimal4 libgoogle-perftools4)" >&2
    fi
  done
done
waits=${PEER_WAIT:-auto}
[[ $waits == auto ]] && waits="PASSIVE ACTIVE"

# Runs COMMAND as the peer: 2 OpenMP threads, WAIT policy, MALLOC preloaded, the BLAS above.
peer_exec() {
  local preload='' wait=$2
  [[ $1 != glibc ]] && preload=$lib/lib$1.so.4
  shift 2
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=2 OMP_WAIT_POLICY="$wait" \
    ${coretype:+OPENBLAS_CORETYPE=$coretype} \
    ${preload:+LD_PRELOAD=$preload} \
    ${blas_dir:+LD_LIBRARY_PATH=$blas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} \
    "$@"
}
