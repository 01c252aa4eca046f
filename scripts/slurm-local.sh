#!/usr/bin/env bash
# slurm-local.sh start|stop|status|env — a throwaway single-host SLURM cluster for tests and demos.
#
# Debian 12 (SLURM 22.05), run as root. `start` installs the packages when they are missing
# (apt-get, --no-install-recommends), writes a config under $SLURM_LOCAL_DIR (default
# /tmp/slurm-local), starts munged, (slurmdbd + MariaDB,) slurmctld and slurmd, and waits until
# every node is plain "idle". `stop` cancels every job and stops every daemon this script started.
# Clients then need:  export SLURM_CONF=$SLURM_LOCAL_DIR/etc/slurm.conf   (`env` prints that line).
#
# Knobs (environment):
#   NODES=1|2       1: one node named $(hostname -s); 2: two logical nodes n1,n2 (two slurmd here).
#   CPUS=N          CPUs per node as SLURM sees them (default: nproc; more than real is allowed).
#   GPUS=N          fake GPUs per node (char devices under $SLURM_LOCAL_DIR/dev), default 0.
#   ACCOUNTING=0|1  1: slurmdbd + MariaDB so sacct works (installs ~20 more packages). Default 0:
#                   then sacct only has the job-completion file (`sacct -c`), no steps.
#   MINJOBAGE=S     how long finished jobs stay visible to squeue/scontrol (default 300 s).
#   PORT_BASE=P     slurmctld port P, slurmd P+1 (and P+2 for n2), slurmdbd P+3, MariaDB P+4
#                   (default 6817, SLURM's usual). Clusters with different SLURM_LOCAL_DIR and
#                   PORT_BASE run side by side (parallel test sessions); they share one munged.
# Partitions: debug (default) and gpu, both over every node.
set -euo pipefail
D=${SLURM_LOCAL_DIR:-/tmp/slurm-local}
NODES=${NODES:-1}
CPUS=${CPUS:-$(nproc)}
GPUS=${GPUS:-0}
ACCOUNTING=${ACCOUNTING:-0}
MINJOBAGE=${MINJOBAGE:-300}
PORT_BASE=${PORT_BASE:-6817}
DBD_PORT=$((PORT_BASE + 3))
DB_PORT=$((PORT_BASE + 4))
MUNGE_MARK=/run/munge/started-by-slurm-local
# munged is shared by every cluster on this machine (this script's, each cluster-local.sh instance): one's
# stop_munge_if_last must not take it while another is between start_munge and its slurmctld.
MUNGE_LOCK=/tmp/mln-munge.lock
export SLURM_CONF=$D/etc/slurm.conf

say() { echo "slurm-local: $*" >&2; }

apt_install() {
  # Packages are installed only when a command is missing: a second start costs nothing.
  [ "$(id -u)" = 0 ] || { say "must run as root to install $*"; return 1; }
  command -v apt-get >/dev/null || { say "no apt-get: install $* by hand"; return 1; }
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

install_pkgs() {
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
     || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
    apt_install slurmctld slurmd slurm-client munge
  fi
  if [ "$ACCOUNTING" = 1 ] && { ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; }; then
    apt_install slurmdbd mariadb-server
  fi
}

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

# Daemons keep no descriptor of their caller's: one they inherit stays open for their whole life. Our own
# op lock is fd 9, but a caller's session lock comes at any number (`flock FILE cmd` passes it as fd 3),
# and a munged that kept it held the cluster session lock after the session ended (every later session
# waited). So every descriptor above 2 is closed before a daemon is executed: `detached CMD...` for daemons
# that fork away themselves; `( close_inherited_fds; exec CMD... ) &` for one kept in the background (a
# backgrounded `detached` would leave the waiting shell between them holding everything).
close_inherited_fds() {
  local fd n
  for fd in /proc/$BASHPID/fd/*; do
    n=${fd##*/}
    [ "$n" -gt 2 ] && eval "exec $n>&-"
  done
  return 0
}
detached() { ( close_inherited_fds; exec "$@" ); }
with_munge_lock() { { flock -w 120 8 || { say "munged: $MUNGE_LOCK still held after 120 s"; return 1; }; "$@"; } 8>"$MUNGE_LOCK"; }

start_munge() {
  munge_works && return 0                                   # someone else's munged is fine
  [ -s /etc/munge/munge.key ] || mungekey -c -k /etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge           # no systemd: make the socket dir
  detached runuser -u munge -- /usr/sbin/munged
  touch "$MUNGE_MARK"
  for _ in $(seq 50); do munge_works && return 0; sleep 0.1; done
  say "munged did not come up"; return 1
}

start_accounting() {
  mkdir -p "$D/mysql"
  if [ ! -d "$D/mysql/mysql" ]; then
    mariadb-install-db --user=root --datadir="$D/mysql" --auth-root-authentication-method=socket \
      --skip-test-db >/dev/null
  fi
  ( close_inherited_fds; exec setsid mariadbd --user=root --datadir="$D/mysql" --socket="$D/run/mysqld.sock" \
    --pid-file="$D/run/mysqld.pid" --port="$DB_PORT" --bind-address=127.0.0.1 \
    --innodb-buffer-pool-size=64M --log-error="$D/log/mysqld.err" ) </dev/null >/dev/null 2>&1 &
  for _ in $(seq 100); do mariadb -S "$D/run/mysqld.sock" -e 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
  mariadb -S "$D/run/mysqld.sock" -e "
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
  cat > "$D/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$D/log/slurmdbd.log
PidFile=$D/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$D/etc/slurmdbd.conf"                            # slurmdbd refuses a readable file
  detached slurmdbd
  for _ in $(seq 100); do
    (exec 3<>/dev/tcp/127.0.0.1/$DBD_PORT) 2>/dev/null && return 0; sleep 0.1
  done
  say "slurmdbd did not come up"; tail -5 "$D/log/slurmdbd.log" >&2; return 1
}

node_names() { if [ "$NODES" = 2 ]; then echo n1 n2; else hostname -s; fi; }

write_conf_head() {  # write_conf_head CLUSTER HOST(ADDR) ACCOUNTING-LINES: all but nodes, partitions
  # FirstJobId: each cluster on a machine counts its jobs from its own base (ports differ). The tools find a
  # job's processes on a host by SLURM_JOB_ID; clusters all counting from 1 would read each other's "job 3".
  cat > "$SLURM_CONF" <<EOF
ClusterName=$1
SlurmctldHost=$2
SlurmctldPort=$PORT_BASE
SlurmdPort=$((PORT_BASE + 1))
FirstJobId=$((PORT_BASE * 1000))
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=batch_sched_delay=0
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
KillWait=5
InactiveLimit=0
MinJobAge=$MINJOBAGE
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
$3
GresTypes=gpu
EOF
}

write_conf() {
  local host nodes gres="" acct
  host=$(hostname -s)
  if [ "$NODES" = 2 ]; then nodes="n[1-2]"; else nodes=$host; fi
  rm -f "$D/etc/gres.conf"
  if [ "$GPUS" -gt 0 ]; then
    # slurmd drops a GPU without a device file; character devices under $D are enough.
    mkdir -p "$D/dev"
    for i in $(seq 0 $((GPUS - 1))); do
      [ -e "$D/dev/nvidia$i" ] || mknod "$D/dev/nvidia$i" c 195 "$i"
    done
    printf 'AutoDetect=off\nNodeName=%s Name=gpu File=%s/dev/nvidia[0-%d]\n' \
      "$nodes" "$D" $((GPUS - 1)) > "$D/etc/gres.conf"
    gres=" Gres=gpu:$GPUS"
  fi
  if [ "$ACCOUNTING" = 1 ]; then
    acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT"
  else
    acct="AccountingStorageType=accounting_storage/none"
  fi
  write_conf_head localtest "$host(127.0.0.1)" "$acct"
  if [ "$NODES" = 2 ]; then
    for i in 1 2; do
      echo "NodeName=n$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT_BASE + i)) CPUs=$CPUS RealMemory=4000$gres State=UNKNOWN"
    done >> "$SLURM_CONF"
  else
    echo "NodeName=$host NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=4000$gres State=UNKNOWN" >> "$SLURM_CONF"
  fi
  cat >> "$SLURM_CONF" <<EOF
PartitionName=debug Nodes=$nodes Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$nodes MaxTime=INFINITE State=UP
EOF
}

start_controller() {  # munged (if no other cluster's runs), the conf, accounting, slurmctld
  start_munge
  write_conf
  if [ "$ACCOUNTING" = 1 ]; then start_accounting; fi   # slurmdbd must be up before slurmctld registers
  detached slurmctld
}

start() {
  install_pkgs
  stop                                   # leftovers of an earlier run; no-op when there are none
  rm -rf "$D/state" "$D/spool" "$D/log" "$D/mysql"
  mkdir -p "$D"/{etc,state,spool,log,run}
  with_munge_lock start_controller
  for n in $(node_names); do detached slurmd -N "$n"; done
  for _ in $(seq 300); do                # "idle*" means not responding yet: wait for plain idle
    if [ "$(sinfo -h -N -o '%T' 2>/dev/null | sort -u)" = idle ]; then
      echo "export SLURM_CONF=$SLURM_CONF"; return 0
    fi
    sleep 0.1
  done
  say "nodes did not become idle"; sinfo -N -l >&2 || true; tail -20 "$D"/log/*.log >&2 || true
  return 1
}

alive() {  # alive PIDFILE NAME: the pid in the file runs and is that daemon (not a reused pid)
  local p
  p=$(cat "$1" 2>/dev/null) || return 1    # the daemon may remove its pid file as we look
  # A killed daemon stays a zombie where PID 1 does not reap: its comm still matches, its state is Z.
  [ -n "$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ] \
    && ! awk '{exit ($3 == "Z") ? 0 : 1}' "/proc/$p/stat" 2>/dev/null
}

wait_gone() {  # wait_gone PIDFILE NAME: wait up to 5 s for that daemon to exit, then TERM it, then KILL it
  local p
  alive "$1" "$2" || return 0
  p=$(cat "$1" 2>/dev/null) || return 0
  for _ in $(seq 50); do alive "$1" "$2" || return 0; sleep 0.1; done
  kill "$p" 2>/dev/null || true
  # A TERM is not an end: a slurmctld that outlived its cluster's stop kept the port, and the next start
  # died on "Address already in use" (a clean-clone run, 2026-12-02).
  for _ in $(seq 50); do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ] || return 0; sleep 0.1; done
  kill -9 "$p" 2>/dev/null || true
}

stop() {
  [ -f "$SLURM_CONF" ] || return 0
  # Only ask slurmctld when it runs: against a dead controller every squeue retries for ~9 s.
  if alive "$D/run/slurmctld.pid" slurmctld; then
    # Cancel jobs first: a slurmstepd whose slurmctld is gone ignores SIGTERM and keeps retrying.
    squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null || true
    for _ in $(seq 150); do [ -z "$(squeue -h -t R,CG,PD -o %i 2>/dev/null)" ] && break; sleep 0.1; done
    scontrol shutdown >/dev/null 2>&1 || true        # slurmctld and every slurmd
  fi
  wait_gone "$D/run/slurmctld.pid" slurmctld
  for f in "$D"/run/slurmd-*.pid; do wait_gone "$f" slurmd; done
  # Leftover slurmstepd of THIS cluster only (they hold its spool or log files open).
  for p in $(pgrep -x slurmstepd || true); do
    if ls -l "/proc/$p/fd" 2>/dev/null | grep -q -- "$D/"; then kill -9 "$p" 2>/dev/null || true; fi
  done
  if alive "$D/run/slurmdbd.pid" slurmdbd; then
    kill "$(cat "$D/run/slurmdbd.pid" 2>/dev/null)" 2>/dev/null || true; wait_gone "$D/run/slurmdbd.pid" slurmdbd
  fi
  rm -f "$D/run/slurmdbd.pid"
  if alive "$D/run/mysqld.pid" mariadbd; then
    mariadb-admin -S "$D/run/mysqld.sock" shutdown 2>/dev/null || kill "$(cat "$D/run/mysqld.pid" 2>/dev/null)" 2>/dev/null || true
    wait_gone "$D/run/mysqld.pid" mariadbd
  fi
  rm -f "$D/run/mysqld.pid"
  with_munge_lock stop_munge_if_last
  return 0
}

stop_munge_if_last() {
  # munged is shared: stop it only if one of these scripts started it and no other cluster runs.
  # (Zombie slurmctld entries, left when PID 1 does not reap, do not count: hence ps, not pgrep.)
  if [ -f "$MUNGE_MARK" ] && [ -f /run/munge/munged.pid ] && ! ps -C slurmctld -o stat= | grep -qv '^Z'; then
    local p
    p=$(cat /run/munge/munged.pid 2>/dev/null) || p=
    [ -n "$p" ] && kill "$p" 2>/dev/null || true
    rm -f "$MUNGE_MARK"
    # Wait until it is gone: a start right after must not find a munged that is still exiting.
    for _ in $(seq 50); do [ -n "$p" ] && [ -d "/proc/$p" ] && ! awk '{exit ($3 == "Z") ? 0 : 1}' "/proc/$p/stat" 2>/dev/null || break; sleep 0.1; done
  fi
}

# One start/stop at a time on this machine (test sessions also hold /tmp/slurm-local.lock for their
# whole run, see tests/slurm_cluster.py). Daemons are started through `detached`, which closes fd 9
# among every other inherited descriptor: a daemon that kept it would hold the lock for its whole life.
with_lock() { exec 9>"$D.op.lock"; flock -w 300 9 || { say "another start/stop is still running"; return 1; }; "$@"; }

# Sourced (scripts/cluster-local.sh reuses the functions above): define, do not run.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0
case "${1:-}" in
  start) with_lock start ;;
  stop) with_lock stop ;;
  status) sinfo -N -l ;;
  env) echo "export SLURM_CONF=$SLURM_CONF" ;;
  *) echo "usage: $0 start|stop|status|env   (knobs: NODES CPUS GPUS ACCOUNTING MINJOBAGE)" >&2; exit 2 ;;
esac
