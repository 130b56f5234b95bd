#!/bin/sh
# An ssh stand-in for the fake hosts of netns.sh: `ns_rsh.sh [-opts] HOST CMD...` runs CMD in the
# network namespace named HOST, in a UTS namespace of its own whose hostname is HOST (OpenMPI
# tells hosts apart by hostname). Like ssh, it joins the words of CMD and runs them with a shell
# (OpenMPI quotes orted's command line for a remote shell), and CMD gets a fresh login-like
# environment, not the caller's: a launcher that forgets `mpirun -x VAR` fails here as it would on
# a real cluster. NS_RSH_KEEP_ENV=1 passes the caller's environment instead.
# Used as OpenMPI's rsh agent (OMPI_MCA_plm_rsh_agent); netns.sh starts slurmd with it too.
# nsenter rather than `ip netns exec`: the latter remounts /sys, which hides /sys/fs/cgroup
# (slurmd will not start without it).
while [ $# -gt 0 ]; do
  case $1 in -*) shift ;; *) break ;; esac # ssh-style options (e.g. -x) mean nothing here
done
host=${1:?usage: ns_rsh.sh HOST CMD...}
shift
# shellcheck disable=SC2016 # $0 and $* are for the inner shell
set -- nsenter --net="/run/netns/$host" unshare --uts \
  sh -c 'hostname "$0" && exec sh -c "$*"' "$host" "$@"
[ "${NS_RSH_KEEP_ENV:-}" = 1 ] && exec "$@"
user=$(id -un)
exec env -i HOME="${HOME:-/}" USER="$user" LOGNAME="$user" SHELL=/bin/sh \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
