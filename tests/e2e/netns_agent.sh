#!/bin/sh
# Open MPI's rsh launcher agent (--mca plm_rsh_agent) for "hosts" that are network
# namespaces of this machine: called as `agent [ssh options] HOST COMMAND...`, it runs
# COMMAND (an orted line meant for a remote shell) inside HOST's namespace, as ssh
# would run it in HOST's login shell. The environment passes through (ssh would drop
# it): OMPI_ALLOW_RUN_AS_ROOT* reach the orted that way.
#   DDP_NETNS_HOSTS="ADDR=NAMESPACE ..."  which namespace each host name or address is
#   DDP_NETNS_LOG=FILE (optional)         one line per launch, for the test to check
set -eu
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh-only flags, e.g. -x
host=${1:?usage: netns_agent.sh [options] HOST COMMAND...}
shift
ns=""
for pair in ${DDP_NETNS_HOSTS:-}; do
  if [ "${pair%%=*}" = "$host" ]; then ns=${pair#*=}; fi
done
if [ -z "$ns" ]; then
  echo "netns_agent.sh: host '$host' is not in DDP_NETNS_HOSTS='${DDP_NETNS_HOSTS:-}'" >&2
  exit 255  # what ssh returns when it cannot reach the host
fi
if [ -n "${DDP_NETNS_LOG:-}" ]; then
  echo "launch host=$host netns=$ns: $*" >>"$DDP_NETNS_LOG"
fi
exec ip netns exec "$ns" /bin/sh -c "$*"
