#!/usr/bin/env bash
# Self-test of netns.sh (as root): fake hosts, mpirun across them, a lost link, Slurm, clean-up.
#   tests/cluster/netns_selftest.sh [KEEL_BINARY]
# The keel checks (4-rank trainings of a few seconds, OMP_NUM_THREADS=1) are skipped without a
# keel binary; the Slurm checks without slurmctld. Prints one line per check, then
# "N passed, N failed"; exits 1 if any failed. PREFIX (default kst) names the hosts.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=netns.sh
source "$here/netns.sh"
P=${PREFIX:-kst}
keel=${1:-}
if [[ -z $keel ]]; then
  for k in "$src/build/keel" "$src/build/src/keel/cli/keel"; do [[ -x $k ]] && keel=$k && break; done
fi
tmp=$(mktemp -d)
trap 'cluster_down "$P"; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM # so that the EXIT trap cleans up then too
pass=0 fail=0
ok() { echo "ok: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
check() { # DESCRIPTION CMD...: passes if CMD succeeds
  local what=$1
  shift
  if "$@" >"$tmp/check.log" 2>&1; then ok "$what"; else bad "$what"; sed 's/^/    /' "$tmp/check.log"; fi
}
now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}'; }

export OMP_NUM_THREADS=1
cluster_down "$P" # a run killed before its trap may have left hosts behind
t=$(now)
cluster_up "$P" 3
ok "cluster_up $P 3 in $(since "$t") s"
net=$(cluster_net "$P")
host2() { [[ $(cluster_exec "$P" 2 sh -c 'hostname; ip -br -4 addr show eth0') == *"${P}2"*"10.77.$net.12/24"* ]]; }
check "host 2 is named ${P}2 and has 10.77.$net.12" host2
names() { getent hosts "${P}3" | grep -q "10.77.$net.13" && cluster_exec "$P" 1 getent hosts "${P}3"; }
check "names resolve in the root namespace and in a host" names
quoting() { [[ $(cluster_exec "$P" 1 printf '%s|' 'a b' "c'd") == "a b|c'd|" ]]; }
check "cluster_exec keeps its words as they are" quoting

cluster_mpi_env "$P"
cluster_hostfile "$P" "$tmp/hosts3"
cluster_hostfile "$P" "$tmp/hosts2" 2 2
mpi_hosts() {
  [[ $(timeout 60 mpirun --hostfile "$tmp/hosts3" -np 6 hostname | sort | tr '\n' ' ') == \
     "${P}1 ${P}1 ${P}2 ${P}2 ${P}3 ${P}3 " ]]
}
check "mpirun -np 6 hostname runs 2 ranks on each of 3 hosts" mpi_hosts
# shellcheck disable=SC2016 # $FOO is for the ranks
ssh_env() { # like ssh, the agent passes no environment: only mpirun -x does
  [[ $(FOO=bar timeout 60 mpirun --hostfile "$tmp/hosts2" -np 2 --map-by node sh -c 'echo "<$FOO>"') == \
     $'<>\n<>' && $(FOO=bar timeout 60 mpirun --hostfile "$tmp/hosts2" -np 1 -x FOO sh -c 'echo "$FOO"') == bar ]]
}
check "remote ranks get only the environment mpirun -x passes" ssh_env

train() { # NAME NP-LAUNCHER...: a tiny keel run of 4 ranks, 2 per host
  local name=$1
  shift
  "$@" "$keel" train "$src/configs/test-tiny.toml" --set data.train="$tmp/tokens.u16" \
    --set train.out_dir="$tmp" --set train.batch_size=8 --set train.name="$name" "${extra[@]}"
}
four_ranks() { # LOG: one rank 0 that saw 4 ranks, and a run that finished
  [[ $(grep -c 'rank(s) ×' "$1") == 1 ]] && grep -q ' 4 rank(s) × ' "$1" && grep -q '^run .*: 3 steps' "$1"
}
if [[ -n $keel ]]; then
  head -c 400000 "${SHARED_DATA:-/work/shared/data}/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
  extra=(--set train.steps=3)
  mpirun_train() {
    train mpi4 timeout 120 mpirun --hostfile "$tmp/hosts2" -np 4 -x OMP_NUM_THREADS=1 \
      >"$tmp/mpi4.log" 2>&1 && four_ranks "$tmp/mpi4.log" && return
    cat "$tmp/mpi4.log"
    return 1
  }
  check "mpirun keel train: 4 ranks over 2 hosts x 2 slots" mpirun_train

  # A rate-limited link (cluster_link_rate): TCP between hosts 1 and 2 runs at the limit each
  # way; keel preflight's all-reduce between a rank on each host runs under it (Open MPI's
  # 2-rank all-reduce reaches half of it: its steps do not send both ways at once), and lifting
  # the limit gives the link its speed back.
  cat >"$tmp/tcp.py" <<'PY'
import socket, sys, time
if sys.argv[1] == "rx":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 5555))
    s.listen(1)
    c, _ = s.accept()
    n, t = 0, time.time()
    while b := c.recv(1 << 20):
        n += len(b)
    print(round(n / (time.time() - t) / 1e6, 1))
else:
    c = socket.create_connection((sys.argv[2], 5555))
    for _ in range(16):
        c.sendall(b"x" * (1 << 20))
PY
  tcp_mb_s() { # FROM TO: MB/s of 16 MiB sent from host FROM to host TO
    cluster_exec "$P" "$2" /usr/bin/python3 "$tmp/tcp.py" rx >"$tmp/rx.out" &
    local rx=$!
    sleep 0.5
    cluster_exec "$P" "$1" /usr/bin/python3 "$tmp/tcp.py" tx "10.77.$net.$((10 + $2))"
    wait "$rx"
    cat "$tmp/rx.out"
  }
  bus_mb_s() {
    timeout 120 mpirun --hostfile "$tmp/hosts2" -np 2 --map-by node -x OMP_NUM_THREADS=1 \
      "$keel" preflight --quick --json 2>"$tmp/preflight.err" |
      /usr/bin/python3 -c 'import json, sys
rows = json.load(sys.stdin)["rows"]
print(round([r for r in rows if r["check"] == "all-reduce"][0]["data"]["bus_bytes_per_s"] / 1e6))'
  }
  rate_limit() {
    local up down limited free
    cluster_link_rate "$P" 2 200mbit
    if ! { up=$(tcp_mb_s 2 1) && down=$(tcp_mb_s 1 2) && limited=$(bus_mb_s); }; then
      cat "$tmp/preflight.err"
      return 1
    fi
    cluster_link_rate "$P" 2 off
    free=$(bus_mb_s) || { cat "$tmp/preflight.err"; return 1; }
    echo "200 Mbit/s (25 MB/s): TCP $up MB/s up, $down MB/s down; all-reduce bus bandwidth" \
      "$limited MB/s, $free MB/s unlimited"
    awk -v u="$up" -v d="$down" 'BEGIN { exit !(u >= 20 && u <= 25.5 && d >= 20 && d <= 25.5) }' &&
      ((limited >= 8 && limited <= 26 && free > 2 * limited))
  }
  check "a 200 Mbit/s link: TCP and the all-reduce run under it, and faster without it" rate_limit
  sed -n 's/^200 Mbit/    &/p' "$tmp/check.log"

  # A lost link: host 2 goes down mid-run. With cluster_mpi_env's keepalive mpirun notices the
  # lost daemon (exit 205) before the ranks' own comm_timeout_s (exit 75) and returns.
  extra=(--set train.steps=100000 --set parallel.comm_timeout_s=10)
  train lost timeout 120 mpirun --hostfile "$tmp/hosts2" -np 4 -x OMP_NUM_THREADS=1 \
    >"$tmp/lost.log" 2>&1 &
  job=$!
  for ((i = 0; i < 300; i++)); do
    grep -qs '^step ' "$tmp/lost.log" || ! kill -0 "$job" 2>/dev/null && break
    sleep 0.1
  done
  t=$(now)
  cluster_link_down "$P" 2
  rc=0
  wait "$job" || rc=$?
  took=$(since "$t")
  if ((rc == 205 || rc == 75)); then
    ok "link down: mpirun exited $rc after $took s ($(grep -m1 -o 'lost communication with a remote daemon\|comm_timeout_s' "$tmp/lost.log"))"
  else
    bad "link down: mpirun exited $rc after $took s (want 205 or 75)"
    sed 's/^/    /' "$tmp/lost.log" | grep -v '^    step' | tail -30
  fi
  # The cut-off orted notices the lost mpirun by keepalive too, and kills its ranks.
  for ((i = 0; i < 100; i++)); do [[ -z $(ip netns pids "${P}2") ]] && break; sleep 0.1; done
  check "nothing left running on the cut-off host" test -z "$(ip netns pids "${P}2")"
  cluster_link_up "$P" 2
  check "mpirun across all hosts again after cluster_link_up" mpi_hosts
else
  echo "skip: keel checks (no keel binary; pass one as the first argument)"
fi

if command -v slurmctld >/dev/null; then
  t=$(now)
  check "slurm_up" slurm_up "$P"
  echo "    (slurm_up took $(since "$t") s)"
  srun_hosts() { [[ $(timeout 60 srun -N2 -n4 hostname | sort | tr '\n' ' ') == "${P}1 ${P}1 ${P}2 ${P}2 " ]]; }
  check "srun -N2 -n4 hostname" srun_hosts
  if [[ -n $keel ]]; then
    extra=(--set train.steps=3)
    srun_train() {
      train srun4 timeout 120 srun -N2 -n4 --mpi=pmix >"$tmp/srun4.log" 2>&1 &&
        four_ranks "$tmp/srun4.log" && return
      cat "$tmp/srun4.log"
      return 1
    }
    check "srun --mpi=pmix keel train: 4 ranks over 2 hosts" srun_train
  fi
  printf '#!/bin/sh\nhostname\nsrun hostname\n' >"$tmp/job.sh"
  sbatch_job() {
    local id i
    id=$(sbatch --parsable -N2 -n2 -o "$tmp/job.out" "$tmp/job.sh")
    for ((i = 0; i < 300; i++)); do squeue -h -j "$id" | grep -q . || break; sleep 0.1; done
    cat "$tmp/job.out"
    [[ $(sort "$tmp/job.out" | tr '\n' ' ') == "${P}1 ${P}1 ${P}2 " ]]
  }
  check "sbatch: the script on ${P}1, its srun on ${P}1 and ${P}2" sbatch_job
else
  echo "skip: Slurm checks (apt-get install -y slurm-wlm munge)"
fi

ctl=$(cat "$CLUSTER_STATE/$P/ctld/slurmctld.pid" 2>/dev/null || true)
cluster_down "$P"
cluster_down "$P" # idempotent
left() {
  ! ip netns list | grep -q "^${P}[0-9]" && ! ip link show "$P-br" 2>/dev/null &&
    ! grep -q "keel-cluster:$P\$" /etc/hosts && [[ ! -e $CLUSTER_STATE/$P ]] &&
    { [[ -z $ctl ]] || ! _cluster_alive "$ctl"; }
}
check "cluster_down (twice) left no namespace, bridge, /etc/hosts line, state or slurmctld" left

echo "$pass passed, $fail failed"
((fail == 0))
