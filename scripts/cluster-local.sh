#!/usr/bin/env bash
# cluster-local.sh start [N]|stop|nodes|env|status|sshd|cpu NODE PCT|heal — a multi-node SLURM on one machine.
#
# Each node is a network namespace plus a UTS namespace named after its SLURM node (mln1..mlnN,
# N = 1..8, default 4) with its own hostname and address 10.213.0.K on the bridge mlnbr0. The host
# itself is the head node (slurmctld, clients such as srun/sbatch) at 10.213.0.254 on that bridge:
# no route, forwarding or NAT leads anywhere else, so traffic stays on addresses this script made.
# One slurmd runs inside each namespace (all on the same port, as on a real cluster), munged is
# shared (its socket is a file). Every slurmd sits in its own cpu cgroup, so its job steps do too.
#
# Faults, injected from outside:
#   ip netns exec mln3 tc qdisc add dev eth0 root tbf rate 50mbit burst 32kbit latency 400ms
#   ip netns exec mln3 tc qdisc add dev eth0 root netem delay 100ms     (kernels with sch_netem)
#   cluster-local.sh cpu mln2 20          (20% of one CPU for everything on mln2; 0 lifts it)
#   kill "$(cat $CLUSTER_LOCAL_DIR/run/slurmd-mln2.pid)"
#   cluster-local.sh heal [NODE...]       (undo all three, resume or restart slurmd, wait until idle)
#
# sshd (the SSH transport's tests): `cluster-local.sh sshd` starts one sshd per node, in the node's
# namespaces and cpu cgroup, listening only on 10.213.0.K:22, with keys made for this cluster under
# $CLUSTER_LOCAL_DIR/ssh (0700): a host key per node, one client key, the known_hosts and an
# ssh_config naming every node (export MLENG_SSH_CONFIG=$CLUSTER_LOCAL_DIR/ssh/config). Stop it with
# kill "$(cat $CLUSTER_LOCAL_DIR/run/sshd-mln2.pid)" (a dead node); heal and stop handle it.
#
# Debian 12 (SLURM 22.05), root. Packages as scripts/slurm-local.sh (installed when missing).
# Instances: MLN_CLUSTER_INSTANCE=I (0..9, default 0) runs a second cluster beside the first (parallel
# test workers). Instance 0 has the names above; instance I>0 puts node K in the namespace i<I>mln<K>
# on the bridge mlnbr<I> at 10.213.<I>.K, its cgroups under cpu/i<I>mln, its folder /tmp/i<I>mln-cluster
# (no name of instance 0 is a prefix of one of its names), its ports at 7817+10*I (so its job ids start
# elsewhere too, see FirstJobId) and its own session lock. The SLURM node names and hostnames stay
# mln1..mlnN in every instance. tools/evals/drills/cluster.py holds the same names for Python (tests,
# drills); change them in both.
# Knobs: CLUSTER_LOCAL_DIR (default the instance's folder), PORT_BASE (slurmctld P, slurmd P+1 inside each
# namespace; default 7817, so this runs beside slurm-local.sh's 6817), CPUS per node (default 2).
# start/stop/heal refuse while another session holds the instance's session lock
# (/tmp/mln-cluster.session.lock for instance 0; see with_cluster_lock), and hold $CLUSTER_LOCAL_DIR.op.lock.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The caller's knobs, before slurm-local.sh gives them its own defaults (6817, nproc): by hand, every
# instance started on 6817 (job ids from 6817000, beside a one-node slurm-local.sh's) with nproc CPUs a node.
CALLER_PORT_BASE=${PORT_BASE:-}; CALLER_CPUS=${CPUS:-}
# shellcheck source=slurm-local.sh
. "$HERE/slurm-local.sh"                   # install_pkgs, start_munge, alive, wait_gone, ...
INSTANCE=${MLN_CLUSTER_INSTANCE:-0}
[[ "$INSTANCE" =~ ^[0-9]$ ]] || { echo "cluster-local: MLN_CLUSTER_INSTANCE must be 0..9, got '$INSTANCE'" >&2; exit 2; }
if [ "$INSTANCE" = 0 ]; then
  D=${CLUSTER_LOCAL_DIR:-/tmp/mln-cluster}; NS_PREFIX=mln
else
  D=${CLUSTER_LOCAL_DIR:-/tmp/i${INSTANCE}mln-cluster}; NS_PREFIX=i${INSTANCE}mln
fi
PORT_BASE=${CALLER_PORT_BASE:-$((7817 + 10 * INSTANCE))}
CPUS=${CALLER_CPUS:-2}
PREFIX=mln                                 # SLURM node names and hostnames, in every instance
BRIDGE=mlnbr$INSTANCE
NET=10.213.$INSTANCE
HEAD_ADDR=$NET.254
CGROUP=/sys/fs/cgroup/cpu/$NS_PREFIX
export SLURM_CONF=$D/etc/slurm.conf

netns() { echo "$NS_PREFIX${1#"$PREFIX"}"; }   # netns NODE: the network namespace of node mlnK
say() { echo "cluster-local: $*" >&2; }

our_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${NS_PREFIX}[0-9]+$" || true; }

make_network() {  # make_network N
  ip link add "$BRIDGE" type bridge
  ip addr add "$HEAD_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for k in $(seq "$1"); do
    local ns=$NS_PREFIX$k
    ip netns add "$ns"
    ip link add "$ns-h" type veth peer name eth0 netns "$ns"
    ip link set "$ns-h" master "$BRIDGE" up
    ip -n "$ns" addr add "$NET.$k/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    write_hosts "$1" "$ns"
  done
}

write_hosts() {  # write_hosts N NS: bound over /etc/hosts on the node (as `ip netns exec` does)
  mkdir -p "/etc/netns/$2"
  { echo "127.0.0.1 localhost"; echo "$HEAD_ADDR $(hostname -s)-head"
    for k in $(seq "$1"); do echo "$NET.$k $PREFIX$k"; done; } > "/etc/netns/$2/hosts"
}

write_conf() {  # write_conf N
  write_conf_head mlncluster "$(hostname -s)($HEAD_ADDR)" "AccountingStorageType=accounting_storage/none"
  for k in $(seq "$1"); do
    echo "NodeName=$PREFIX$k NodeHostname=$PREFIX$k NodeAddr=$NET.$k CPUs=$CPUS RealMemory=2000 State=UNKNOWN"
  done >> "$SLURM_CONF"
  echo "PartitionName=debug Nodes=${PREFIX}[1-$1] Default=YES MaxTime=INFINITE State=UP" >> "$SLURM_CONF"
}

start_slurmd() {  # start_slurmd NODE: in its netns, its own UTS (hostname) and mount namespaces
  # The mount namespace only carries /etc/hosts naming every node (gloo resolves its own hostname);
  # /sys stays the host's, so the cgroup tree joined first is seen by slurmd too.
  mkdir -p "$CGROUP/$1" "$D/spool/$1"
  detached sh -c 'echo $$ > "$1/tasks" && exec nsenter --net="/run/netns/$3" unshare --uts --mount sh -c \
    "mount --bind /etc/netns/$3/hosts /etc/hosts && hostname $2 && exec slurmd -N $2"' \
    sh "$CGROUP/$1" "$1" "$(netns "$1")"
}

wait_idle() {  # wait_idle N [TENTHS]: every node plain "idle" ("idle*" is not responding yet)
  for _ in $(seq "${2:-300}"); do
    [ "$(sinfo -h -N -o '%T' 2>/dev/null | sort -u)" = idle ] \
      && [ "$(sinfo -h -N -o '%N' 2>/dev/null | wc -l)" = "$1" ] && return 0
    sleep 0.1
  done
  say "nodes did not become idle"; sinfo -N -l >&2 || true; tail -n 5 "$D"/log/*.log >&2 || true
  return 1
}

start() {
  local n=$1
  install_pkgs
  stop_cluster                             # a stale earlier run; munged stays for other clusters
  rm -rf "$D"; mkdir -p "$D"/{etc,state,spool,log,run}
  make_network "$n"
  write_conf "$n"
  seq "$n" | sed "s/^/$PREFIX/" > "$D/nodes"
  with_munge_lock start_head                # munged (shared; see MUNGE_LOCK in slurm-local.sh) and slurmctld
  for node in $(cat "$D/nodes"); do start_slurmd "$node"; done
  wait_idle "$n" && print_env
}

stop_processes() {
  if alive "$D/run/slurmctld.pid" slurmctld; then
    # Cancel jobs first: a slurmstepd whose slurmctld is gone ignores SIGTERM and keeps retrying.
    squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null || true
    for _ in $(seq 100); do [ -z "$(squeue -h -t R,CG,PD -o %i 2>/dev/null)" ] && break; sleep 0.1; done
    scontrol shutdown >/dev/null 2>&1 || true
  fi
  wait_gone "$D/run/slurmctld.pid" slurmctld
  for f in "$D"/run/slurmd-*.pid; do wait_gone "$f" slurmd; done
  # A slurmctld of this cluster whose pid file is gone (removed with the folder) still holds our files open.
  for p in $(pgrep -x slurmctld || true); do
    if ls -l "/proc/$p/fd" 2>/dev/null | grep -q -- "$D/"; then kill -9 "$p" 2>/dev/null || true; fi
  done
  # Whatever still runs on a node (steps, tasks, a stopped slurmd) is ours: it lives in our netns.
  for ns in $(our_namespaces); do ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true; done
  for _ in $(seq 50); do
    [ -z "$(for ns in $(our_namespaces); do ip netns pids "$ns" 2>/dev/null; done)" ] && break; sleep 0.1
  done
}

stop() {
  stop_cluster
  with_munge_lock stop_munge_if_last
}

start_head() { start_munge; detached slurmctld; }

stop_cluster() {  # everything but munged (shared with other clusters; start keeps it)
  stop_processes
  # The host end of each veth first: deleting it takes its peer at once, where a deleted namespace's
  # devices go in the kernel's cleanup work later (a loaded host still listed mln1-h after stop returned).
  for ns in $(our_namespaces); do
    ip link del "$ns-h" 2>/dev/null || true; ip netns del "$ns"; rm -rf "/etc/netns/$ns"
  done
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
  for cg in "$CGROUP"/*/; do [ -d "$cg" ] && rmdir "$cg" 2>/dev/null || true; done
  [ -d "$CGROUP" ] && rmdir "$CGROUP" 2>/dev/null || true
  rmdir /etc/netns 2>/dev/null || true      # only when empty: someone else's namespaces keep it
  return 0
}

cpu_limit() {  # cpu_limit NODE PCT: PCT% of one CPU for every process on NODE (0: no limit)
  # A name, not a path: "../x" once passed the -d test and wrote another cgroup's quota (review 2026-12-02, R4).
  { grep -qxF -- "$1" "$D/nodes" && [ -d "$CGROUP/$1" ]; } || { say "cpu: unknown node '$1' (nodes: $(tr '\n' ' ' < "$D/nodes"))"; return 2; }
  [[ "$2" =~ ^[0-9]+$ ]] || { say "cpu: PCT must be a whole number, got '$2'"; return 2; }
  local quota=-1
  [ "$2" -gt 0 ] && quota=$(( $2 * 1000 ))
  echo 100000 > "$CGROUP/$1/cpu.cfs_period_us"
  echo "$quota" > "$CGROUP/$1/cpu.cfs_quota_us"
}

heal() {  # heal [NODE...]: lift injected faults (qdisc, CPU limit, stopped or dead slurmd); wait for idle
  local nodes n
  nodes=${*:-$(cat "$D/nodes")}
  for node in $nodes; do
    grep -qx "$node" "$D/nodes" || { say "heal: unknown node '$node'"; return 2; }
    ip netns exec "$(netns "$node")" tc qdisc del dev eth0 root 2>/dev/null || true
    cpu_limit "$node" 0
    # A SIGSTOPped slurmd is "alive" but answers nothing: resume it before asking.
    pkill -CONT -F "$D/run/slurmd-$node.pid" slurmd 2>/dev/null || true
    alive "$D/run/slurmd-$node.pid" slurmd || start_slurmd "$node"
    # sshd only where `sshd` started one: its config is left behind in the cluster's folder.
    [ ! -f "$SSH_DIR/sshd-$node.conf" ] || alive "$D/run/sshd-$node.pid" sshd || start_sshd "$node"
  done
  n=$(wc -l < "$D/nodes")
  scontrol update nodename="$(paste -sd, "$D/nodes")" state=resume >/dev/null 2>&1 || true
  # A job that ran on a node whose slurmd was killed stays "completing" until the new slurmd reports.
  wait_idle "$n" 1200
}

SSH_DIR=$D/ssh

sshd_conf() {  # sshd_conf NODE ADDR: public keys only, nothing forwarded, logs in $D/log
  cat <<EOF
ListenAddress $2
Port 22
HostKey $SSH_DIR/host-$1
PidFile $D/run/sshd-$1.pid
AuthorizedKeysFile $SSH_DIR/authorized_keys
# /tmp above the key folder is world-writable, which StrictModes refuses; the folder itself is 0700.
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AllowAgentForwarding no
AllowTcpForwarding no
X11Forwarding no
PermitTunnel no
PermitUserEnvironment no
PrintMotd no
MaxStartups 200
EOF
}

start_sshd() {  # start_sshd NODE: like slurmd, in the node's namespaces and cgroup (CPU caps apply)
  detached sh -c 'echo $$ > "$1/tasks" && exec nsenter --net="/run/netns/$5" unshare --uts --mount sh -c \
    "mount --bind /etc/netns/$5/hosts /etc/hosts && hostname $2 && exec /usr/sbin/sshd -f $3 -E $4"' \
    sh "$CGROUP/$1" "$1" "$SSH_DIR/sshd-$1.conf" "$D/log/sshd-$1.log" "$(netns "$1")"
  for _ in $(seq 50); do alive "$D/run/sshd-$1.pid" sshd && return 0; sleep 0.1; done
  say "sshd on $1 did not start"; tail -n 5 "$D/log/sshd-$1.log" >&2 || true; return 1
}

sshd_all() {  # keys made here for this cluster only; known_hosts and ssh_config written by us
  command -v /usr/sbin/sshd >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends openssh-server >/dev/null
  mkdir -p /run/sshd                       # sshd's privilege-separation folder (Debian's default path)
  install -d -m 0700 "$SSH_DIR"
  [ -f "$SSH_DIR/client" ] || ssh-keygen -q -t ed25519 -N '' -C mln-client -f "$SSH_DIR/client"
  install -m 0600 "$SSH_DIR/client.pub" "$SSH_DIR/authorized_keys"
  : > "$SSH_DIR/known_hosts"; : > "$SSH_DIR/config"
  local node addr
  for node in $(cat "$D/nodes"); do
    addr=$NET.${node#"$PREFIX"}
    [ -f "$SSH_DIR/host-$node" ] || ssh-keygen -q -t ed25519 -N '' -C "$node" -f "$SSH_DIR/host-$node"
    echo "$node,$addr $(cut -d' ' -f1,2 "$SSH_DIR/host-$node.pub")" >> "$SSH_DIR/known_hosts"
    printf 'Host %s\n  HostName %s\n  User root\n  IdentityFile %s\n  IdentitiesOnly yes\n  UserKnownHostsFile %s\n' \
      "$node" "$addr" "$SSH_DIR/client" "$SSH_DIR/known_hosts" >> "$SSH_DIR/config"
    sshd_conf "$node" "$addr" > "$SSH_DIR/sshd-$node.conf"
    alive "$D/run/sshd-$node.pid" sshd || start_sshd "$node"
  done
  echo "export MLENG_SSH_CONFIG=$SSH_DIR/config"
}

print_env() { echo "export SLURM_CONF=$SLURM_CONF"; echo "export MLN_CLUSTER_NODES=$(paste -sd, "$D/nodes")"; }

SESSION_LOCK=${MLN_SESSION_LOCK:-$D.session.lock}      # /tmp/mln-cluster.session.lock for instance 0

with_cluster_lock() {
  # A test session (tests/multinode_cluster.py) holds the session lock while it uses the cluster and
  # says so with MLN_CLUSTER_SESSION=held; anyone else may not start, stop or heal it under them.
  # Manual runs: flock -w 900 /tmp/mln-cluster.session.lock env MLN_CLUSTER_SESSION=held <this script> ...
  # (instance I>0: its own lock, /tmp/i<I>mln-cluster.session.lock, and MLN_CLUSTER_INSTANCE=I)
  if [ "${MLN_CLUSTER_SESSION:-}" != held ] && ! flock -n "$SESSION_LOCK" true; then
    say "a session holds $SESSION_LOCK (a test run uses the cluster); wait for it, or run under:"
    say "  flock -w 900 $SESSION_LOCK env MLN_CLUSTER_SESSION=held $0 $*"
    return 1
  fi
  mkdir -p "$(dirname "$D")"
  exec 9>"$D.op.lock"; flock -w 300 9 || { say "another start/stop is still running"; return 1; }; "$@"
}

case "${1:-}" in
  start) [[ "${2:-4}" =~ ^[1-8]$ ]] || { say "start N: N (node count) must be 1..8, got '$2'"; exit 2; }
         with_cluster_lock start "${2:-4}" ;;
  stop) with_cluster_lock stop ;;
  nodes) cat "$D/nodes" ;;
  env) print_env ;;
  status) sinfo -N -l ;;
  sshd) with_cluster_lock sshd_all ;;
  cpu) cpu_limit "${2:?cpu NODE PCT}" "${3:?cpu NODE PCT}" ;;
  heal) shift; with_cluster_lock heal "$@" ;;
  *) echo "usage: $0 start [N]|stop|nodes|env|status|sshd|cpu NODE PCT|heal [NODE...]" >&2; exit 2 ;;
esac
