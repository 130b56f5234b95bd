# shellcheck shell=bash
# Fake cluster hosts out of Linux network namespaces, for testing multi-host launches (mpirun over
# an rsh agent, Slurm) on one machine. Source it as root; see README.md beside it.
#   cluster_up PREFIX N         namespaces PREFIX1..N on bridge PREFIX-br (10.77.X.1/24, host i at
#                               10.77.X.(10+i)), names in /etc/hosts
#   cluster_down PREFIX         undo everything (also slurm_down); idempotent, trap-safe
#   cluster_link_down/up PREFIX I   take host I's link down / up
#   cluster_kill PREFIX I       SIGKILL every process on host I (in its namespace), as when the
#                               host dies: ranks, MPI daemons, tier-0 holder
#   cluster_link_rate PREFIX I RATE  limit host I's link to RATE (tc's units: 1gbit, 200mbit)
#                               each way, a token bucket on both ends of its veth; RATE "off"
#                               lifts it. CLUSTER_RATE set at cluster_up limits every host's.
#   cluster_hostfile PREFIX FILE [SLOTS [N]]   an OpenMPI hostfile of hosts 1..N (default all)
#   cluster_mpi_env PREFIX      export OMPI_* so that a plain mpirun (from the root namespace)
#                               launches its daemons in the namespaces over TCP
#   cluster_exec PREFIX I CMD...    run CMD on host I (its namespace and hostname), in a fresh
#                               environment as ssh would (NS_RSH_KEEP_ENV=1: the caller's)
#   slurm_up PREFIX / slurm_down PREFIX   munged + slurmctld (root namespace) + slurmd per host;
#                               slurm_up exports SLURM_CONF (slurm_env PREFIX does it elsewhere)
# State (slurm.conf, logs, spool) lives in $CLUSTER_STATE/PREFIX (default /tmp/keel-cluster).
# CLUSTER_SLOTS (default 2): the slots per host in hostfiles and the CPUs of each Slurm node.

CLUSTER_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CLUSTER_STATE=${CLUSTER_STATE:-/tmp/keel-cluster}

# The third octet: from the prefix, so that two harnesses with different prefixes get different
# subnets (CLUSTER_NET overrides).
cluster_net() {
  local sum
  sum=$(printf %s "$1" | cksum)
  echo "${CLUSTER_NET:-$((${sum%% *} % 200 + 20))}"
}

cluster_n() { cat "$CLUSTER_STATE/$1/n" 2>/dev/null || echo 0; }

# The names must resolve in the root namespace (mpirun, srun) and in every host; all share one
# filesystem, so /etc/hosts serves all. It may be bind-mounted (containers): rewrite it in place,
# never replace it; flock it because two harnesses may edit it at once.
# shellcheck disable=SC2094 # the file is read whole before it is written
_cluster_hosts_edit() { # PREFIX [LINES]: drop PREFIX's tagged lines, then append LINES
  local tag="# keel-cluster:$1" kept
  (
    flock 9
    kept=$(grep -vF -- "$tag" /etc/hosts || true)
    printf '%s\n%s' "$kept" "${2:+$2$'\n'}" >/etc/hosts
  ) 9</etc/hosts
}

cluster_up() {
  local p=$1 n=$2 net i lines
  ((${#p} <= 8)) || { echo "cluster_up: prefix '$p' too long (interface names)" >&2; return 1; }
  net=$(cluster_net "$p")
  if ip -4 route show | grep -q "^10\.77\.$net\."; then
    echo "cluster_up: 10.77.$net.0/24 already in use (cluster_down $p, or set CLUSTER_NET)" >&2
    return 1
  fi
  mkdir -p "$CLUSTER_STATE/$p" && echo "$n" >"$CLUSTER_STATE/$p/n"
  ip link add "$p-br" type bridge
  ip addr add "10.77.$net.1/24" dev "$p-br"
  ip link set "$p-br" up
  lines="10.77.$net.1 $p-ctl # keel-cluster:$p" # the root namespace's side, for slurmctld
  for ((i = 1; i <= n; i++)); do
    ip netns add "$p$i"
    ip link add "$p$i-h" type veth peer name eth0 netns "$p$i"
    ip link set "$p$i-h" master "$p-br" up
    ip -n "$p$i" link set lo up
    ip -n "$p$i" addr add "10.77.$net.$((10 + i))/24" dev eth0
    ip -n "$p$i" link set eth0 up
    lines+=$'\n'"10.77.$net.$((10 + i)) $p$i # keel-cluster:$p"
    [[ -z ${CLUSTER_RATE:-} ]] || cluster_link_rate "$p" "$i" "$CLUSTER_RATE"
  done
  _cluster_hosts_edit "$p" "$lines"
}

cluster_down() {
  local p=$1 ns pids
  slurm_down "$p"
  for ns in $(ip netns list | awk -v re="^${p}[0-9]+\$" '$1 ~ re {print $1}'); do
    pids=$(ip netns pids "$ns")
    # shellcheck disable=SC2086 # a list of pids
    [[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
    ip netns del "$ns" || true # also deletes its veth pair
  done
  ip link del "$p-br" 2>/dev/null || true
  _cluster_hosts_edit "$p"
  rm -rf "${CLUSTER_STATE:?}/$p"
}

# Its veth peer loses carrier too, so the bridge drops the host's packets both ways.
cluster_link_down() { ip -n "$1$2" link set eth0 down; }
cluster_link_up() { ip -n "$1$2" link set eth0 up; }

cluster_kill() {
  local pids
  pids=$(ip netns pids "$1$2")
  # shellcheck disable=SC2086 # a list of pids
  [[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
}

# A token bucket (tbf) on the host's eth0 shapes what it sends, one on the bridge's end what it
# receives. The bucket holds 1 ms at the rate (at least 64 KiB, above a TSO segment), and up to
# 50 ms of packets queue behind it, as a switch's buffer would, rather than being dropped at once.
# No added latency: these VMs' kernels are built without netem.
cluster_link_rate() {
  local p=$1 i=$2 rate=$3 bits burst dev ns
  for dev in "eth0 $p$i" "$p$i-h"; do
    read -r dev ns <<<"$dev"
    tc ${ns:+-n "$ns"} qdisc del dev "$dev" root 2>/dev/null || true
  done
  [[ $rate == off ]] && return 0
  bits=$(_cluster_rate_bits "$rate") || { echo "cluster_link_rate: '$rate': expected e.g. 1gbit, 200mbit" >&2; return 1; }
  burst=$((bits / 8 / 1000 > 65536 ? bits / 8 / 1000 : 65536))
  tc -n "$p$i" qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms &&
    tc qdisc add dev "$p$i-h" root tbf rate "$rate" burst "$burst" latency 50ms
}

_cluster_rate_bits() { # 1gbit, 200mbit, 500kbit, 1000000bit -> bits/s
  local r=${1,,} n unit
  [[ $r =~ ^([0-9]+)(gbit|mbit|kbit|bit)$ ]] || return 1
  n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]}
  case $unit in
    gbit) echo $((n * 1000000000)) ;;
    mbit) echo $((n * 1000000)) ;;
    kbit) echo $((n * 1000)) ;;
    bit) echo "$n" ;;
  esac
}

cluster_exec() {
  local p=$1 i=$2
  shift 2
  "$CLUSTER_LIB_DIR/ns_rsh.sh" "$p$i" "$(printf '%q ' "$@")"
}

cluster_hostfile() {
  local p=$1 f=$2 slots=${3:-${CLUSTER_SLOTS:-2}} n=${4:-$(cluster_n "$1")} i
  : >"$f"
  for ((i = 1; i <= n; i++)); do echo "$p$i slots=$slots" >>"$f"; done
}

cluster_mpi_env() {
  local cidr
  cidr="10.77.$(cluster_net "$1").0/24"
  export OMPI_MCA_plm_rsh_agent="$CLUSTER_LIB_DIR/ns_rsh.sh"
  # orted started by orted would need the agent inside a namespace: keep all launches in mpirun.
  export OMPI_MCA_plm_rsh_no_tree_spawn=1
  # Only the bridge: eth0 of the root namespace is not reachable from the namespaces.
  export OMPI_MCA_oob_tcp_if_include="$cidr" OMPI_MCA_btl_tcp_if_include="$cidr"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # The namespaces share this machine's cores: bound, every host's daemon would put its first
  # rank on core 0 (mpirun binds to a core when it starts two ranks or fewer).
  export OMPI_MCA_hwloc_base_binding_policy=${OMPI_MCA_hwloc_base_binding_policy:-none}
  # TCP keepalive on the mpirun<->orted links (answered by the kernel, so a busy host is not
  # "lost"), so that mpirun notices a host whose link is gone: about time + intvl * probes after
  # the loss it prints "ORTE has lost communication with a remote daemon" and exits 205, and the
  # cut-off orted kills its ranks. Without it (default 300 s idle) mpirun hangs once the job aborts.
  # Keep it shorter than a rank's own exit on a lost peer (2 x [parallel] comm_timeout_s): once
  # mpirun has queued the abort to the lost host, only TCP retransmission (~15 min) frees it.
  export OMPI_MCA_oob_tcp_keepalive_time=${OMPI_MCA_oob_tcp_keepalive_time:-2}
  export OMPI_MCA_oob_tcp_keepalive_intvl=${OMPI_MCA_oob_tcp_keepalive_intvl:-1}
  export OMPI_MCA_oob_tcp_keepalive_probes=${OMPI_MCA_oob_tcp_keepalive_probes:-3}
}

# --- Slurm -------------------------------------------------------------------------------------

slurm_up() {
  local p=$1 d net n i nodes
  d=$CLUSTER_STATE/$p
  net=$(cluster_net "$p")
  n=$(cluster_n "$p")
  ((n > 0)) || { echo "slurm_up: cluster_up $p first" >&2; return 1; }
  rm -rf "$d/ctld" "$d/spool" "$d/tmp" # no state from an earlier slurm_up: nodes must register anew
  mkdir -p "$d/munge" "$d/ctld" "$d/log"
  chmod 755 "$d/munge" # else munged warns that clients cannot reach the socket
  # Our own munged on its own socket (a file path, so one serves every namespace), and key; --force
  # because it runs as root from /tmp, which its ownership checks refuse.
  [[ -f $d/munge/key ]] || head -c 1024 /dev/urandom >"$d/munge/key"
  chmod 400 "$d/munge/key"
  munged --force --key-file="$d/munge/key" --socket="$d/munge/sock" \
    --pid-file="$d/munge/pid" --log-file="$d/log/munged.log" --seed-file="$d/munge/seed"
  nodes=""
  for ((i = 1; i <= n; i++)); do
    nodes+="NodeName=$p$i NodeAddr=10.77.$net.$((10 + i)) CPUs=${CLUSTER_SLOTS:-2}"$'\n'
  done
  cat >"$d/slurm.conf" <<EOF
ClusterName=$p
SlurmctldHost=$p-ctl(10.77.$net.1)
# slurmctld listens in the root namespace: a port of its own per harness (slurmd's 6818 is per
# namespace).
SlurmctldPort=$((17000 + net))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$d/munge/sock
CredType=cred/munge
StateSaveLocation=$d/ctld
SlurmctldPidFile=$d/ctld/slurmctld.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdSpoolDir=$d/spool/%n
SlurmdPidFile=$d/spool/slurmd.%n.pid
SlurmdLogFile=$d/log/slurmd.%n.log
# Each node's own TmpFS: mpi/pmix makes its client dir there, named only by job and step, so
# two nodes on one filesystem would clash in /tmp.
TmpFS=$d/tmp/%n
# The hosts' "hardware" is the machine's: trust the CPUs above rather than drain the nodes.
SlurmdParameters=config_overrides
# No cgroups (slurmd shares the machine's; cgroup plugins would fight over them).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
$nodes
PartitionName=debug Nodes=${p}[1-$n] Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$d/slurm.conf
  # slurmctld checks its own hostname against SlurmctldHost: give it a UTS namespace.
  # shellcheck disable=SC2016 # $0 is for the inner shell
  unshare --uts sh -c 'hostname "$0" && exec slurmctld' "$p-ctl"
  for ((i = 1; i <= n; i++)); do
    mkdir -p "$d/spool/$p$i" "$d/tmp/$p$i"
    cluster_exec "$p" "$i" slurmd -f "$d/slurm.conf" -N "$p$i"
  done
  # Ready when every node has registered (idle); a few tenths of a second.
  for ((i = 0; i < 300; i++)); do
    [[ $(sinfo -h -N -t idle -o %N 2>/dev/null | wc -l) -eq $n ]] && return 0
    sleep 0.1
  done
  echo "slurm_up: nodes not idle after 30 s:" >&2
  sinfo -N >&2 || true
  return 1
}

# Running and not a zombie (pid 1 here may reap daemons late, and kill -0 counts zombies).
_cluster_alive() { grep -qs '^State:.*[^Z] (' "/proc/$1/status"; }

slurm_env() { export SLURM_CONF=$CLUSTER_STATE/$1/slurm.conf; }

slurm_down() {
  local d=$CLUSTER_STATE/$1 f pids=() i
  for f in "$d"/spool/slurmd.*.pid "$d/ctld/slurmctld.pid" "$d/munge/pid"; do
    [[ -f $f ]] && pids+=("$(cat "$f")") && rm -f "$f"
  done
  ((${#pids[@]})) || return 0
  kill "${pids[@]}" 2>/dev/null || true
  # Wait, so that a slurm_up right after finds the ports free; SIGKILL what lingers.
  for ((i = 0; i < 100; i++)); do
    for f in "${pids[@]}"; do _cluster_alive "$f" && sleep 0.1 && continue 2; done
    return 0
  done
  kill -9 "${pids[@]}" 2>/dev/null || true
}
