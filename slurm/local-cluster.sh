#!/usr/bin/env bash
# A real single-node SLURM cluster on localhost, for tests and for trying the launcher on a laptop:
# munge, slurmctld, slurmd, and slurmdbd with MariaDB (submitit needs sacct). Debian/Ubuntu, as root.
#
#   slurm/local-cluster.sh install   # Debian packages (idempotent)
#   slurm/local-cluster.sh start     # write configs, start the daemons, wait until the node is idle
#   slurm/local-cluster.sh start --nodes 2   # two slurmd "nodes" n1, n2, each in a network namespace
#   slurm/local-cluster.sh stop      # stop the daemons by their pid files (and remove the namespaces)
#   slurm/local-cluster.sh status
#
# Several nodes: each slurmd runs in a network namespace of its own (marl-n<i>, address
# 10.77.0.1<i> on a private bridge marl-br0 at 10.77.0.1, where slurmctld listens; nothing leaves
# this machine), so a job's steps on two nodes see two hosts with two addresses, as Ray and
# verl would on a real site. The filesystem is shared (one machine), like a site's shared home.
# slurmd is entered with `nsenter --net` (not `ip netns exec`, which remounts /sys without its
# cgroup mount and slurmd then refuses to start). Switching between one and several nodes
# restarts slurmctld and the slurmds with the new node list; accounting keeps running.
#
# Facts this relies on (measured): no systemd and no cgroups here, so proctrack/linuxproc and
# task/none; DefMemPerCPU so jobs share the node; RealMemory below the real memory or the node
# drains; EnforcePartLimits=ALL so an impossible request fails at submit; KillWait=5 because
# submitit ignores SIGTERM; AuthInfo=cred_expire=30 because a requeued job waits that long before
# it may start again (default 120 s: a preempted cell idled 2 minutes); daemons are stopped by pid
# file, never by name.
set -euo pipefail

STATE=${SLURM_LOCAL_STATE:-/var/lib/marl-slurm}
RUN=$STATE/run
LOGS=$STATE/log
CPUS=${SLURM_LOCAL_CPUS:-8}           # advertised CPUs: more 1-CPU cells at once than cores
DB_PASS=${SLURM_LOCAL_DB_PASS:-marl-slurm}
HOST=$(hostname -s)
NODES=1                                # start --nodes N (or SLURM_LOCAL_NODES)
BRIDGE=marl-br0
SUBNET=10.77.0                         # the bridge is .1, node i is .1<i>
HOSTS_TAG="# marl-local-cluster"
MARIADB_PID=/run/mysqld/mariadbd.pid   # mariadbd runs as mysql: its pid file lives in its own run dir
PACKAGES="munge slurmctld slurmd slurm-client slurmdbd mariadb-server"

log() { echo "[local-cluster] $*"; }

install() {
  if dpkg -s $PACKAGES >/dev/null 2>&1; then log "packages present"; return; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q $PACKAGES
}

alive() {  # alive PIDFILE: the process runs and is not a zombie
  local pid
  [ -f "$1" ] || return 1
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
  [ "$(awk '{print $3}' "/proc/$pid/stat")" != "Z" ]
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  for _ in $(seq $((limit * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  log "timed out waiting for $what"; return 1
}

node_names() { if [ "$NODES" -eq 1 ]; then echo "$HOST"; else seq -f "n%g" 1 "$NODES"; fi; }
node_suffix() { [ "$NODES" -eq 1 ] || echo "-%n"; }   # one spool, pid and log file per slurmd
controller_host() { if [ "$NODES" -eq 1 ]; then echo "$HOST"; else echo "$HOST($SUBNET.1)"; fi; }

node_lines() {  # node_lines MEM_MB: the NodeName lines and the partition
  local mem_mb=$1 i
  if [ "$NODES" -eq 1 ]; then
    echo "NodeName=$HOST CPUs=$CPUS RealMemory=$mem_mb State=UNKNOWN"
    echo "PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP"
    return
  fi
  for i in $(seq "$NODES"); do
    echo "NodeName=n$i NodeAddr=$SUBNET.1$i CPUs=$CPUS RealMemory=$((mem_mb / NODES)) State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=n[1-$NODES] Default=YES MaxTime=INFINITE State=UP"
}

namespaces_up() {  # a bridge in this namespace, one namespace per node joined to it by a veth pair
  local i
  ip link show "$BRIDGE" >/dev/null 2>&1 || {
    ip link add "$BRIDGE" type bridge && ip addr add "$SUBNET.1/24" dev "$BRIDGE"; }
  ip link set "$BRIDGE" up
  for i in $(seq "$NODES"); do
    if ip netns list | grep -qw "marl-n$i"; then  # kept if whole (a running node), else made again
      ip netns exec "marl-n$i" ip -o addr show 2>/dev/null | grep -q " $SUBNET.1$i/" && continue
      ip netns del "marl-n$i"
    fi
    ip netns add "marl-n$i"
    ip link del "marl-v$i" 2>/dev/null || true  # a pair whose namespace was just deleted may linger a moment
    ip link add "marl-v$i" type veth peer name "marl-v${i}p"
    ip link set "marl-v${i}p" netns "marl-n$i"
    ip link set "marl-v$i" master "$BRIDGE"
    ip link set "marl-v$i" up
    ip netns exec "marl-n$i" ip addr add "$SUBNET.1$i/24" dev "marl-v${i}p"
    ip netns exec "marl-n$i" ip link set "marl-v${i}p" up
    ip netns exec "marl-n$i" ip link set lo up
  done
  sed -i "/$HOSTS_TAG\$/d" /etc/hosts   # node names resolve everywhere (Ray's head is named by host)
  for i in $(seq "$NODES"); do echo "$SUBNET.1$i n$i $HOSTS_TAG" >> /etc/hosts; done
}

namespaces_down() {
  local ns link
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^marl-n[0-9]+$' || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns"
  done
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | grep -oE '^marl-v[0-9]+' || true); do
    ip link del "$link" 2>/dev/null || true  # one end of a pair removes both
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  sed -i "/$HOSTS_TAG\$/d" /etc/hosts
}

slurmd_pidfiles() { ls "$RUN"/slurmd.pid "$RUN"/slurmd-n*.pid 2>/dev/null || true; }

stop_pidfile() {  # stop_pidfile FILE: TERM, then KILL after 5 s
  if alive "$1"; then
    kill "$(cat "$1")" 2>/dev/null || true
    for _ in $(seq 50); do alive "$1" || break; sleep 0.1; done
    alive "$1" && kill -9 "$(cat "$1")" 2>/dev/null || true
  fi
  rm -f "$1"
}

write_configs() {
  mkdir -p "$RUN" "$LOGS" "$STATE/spool/ctld" "$STATE/spool/d" /etc/slurm /run/munge /run/mysqld
  getent hosts "$HOST" >/dev/null || echo "127.0.0.1 $HOST" >> /etc/hosts
  local mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) * 85 / 100 / 1024 ))
  cat > /etc/slurm/slurm.conf <<EOF
ClusterName=marl
SlurmctldHost=$(controller_host)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=30
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d$(node_suffix)
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd$(node_suffix).pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd$(node_suffix).log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
EnforcePartLimits=ALL
KillWait=5
ReturnToService=2
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
$(node_lines "$mem_mb")
EOF
  cat > /etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
  chmod 600 /etc/slurm/slurmdbd.conf
  chown munge:munge /run/munge 2>/dev/null || true
  chown mysql:mysql /run/mysqld 2>/dev/null || true
}

start() {
  install
  local running
  running=$(cat "$STATE/nodes" 2>/dev/null || echo 1)
  if [ "$running" != "$NODES" ] && alive "$RUN/slurmctld.pid"; then  # another node list: restart the SLURM daemons
    log "switching from $running to $NODES node(s)"
    for pidfile in $(slurmd_pidfiles) "$RUN/slurmctld.pid"; do stop_pidfile "$pidfile"; done
  fi
  if [ "$NODES" -eq 1 ]; then namespaces_down; else namespaces_up; fi
  write_configs
  [ -f /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null;
                                   chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  if ! alive /run/munge/munged.pid; then
    su -s /bin/sh munge -c "/usr/sbin/munged --pid-file=/run/munge/munged.pid" || /usr/sbin/munged --force
    wait_for 10 munge munge -n
  fi
  if ! alive "$MARIADB_PID"; then
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql >/dev/null
    (setsid /usr/sbin/mariadbd --user=mysql --bind-address=127.0.0.1 --pid-file="$MARIADB_PID" \
       --socket=/run/mysqld/mysqld.sock >"$LOGS/mariadb.log" 2>&1 &)
    wait_for 30 mariadb mariadb -e "select 1"
  fi
  mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db; CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
              CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
              GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  alive "$RUN/slurmdbd.pid" || { /usr/sbin/slurmdbd; wait_for 30 slurmdbd sacctmgr -n list cluster; }
  sacctmgr -i -n list cluster format=cluster | grep -qw marl || sacctmgr -i add cluster marl >/dev/null
  alive "$RUN/slurmctld.pid" || { /usr/sbin/slurmctld; wait_for 30 slurmctld scontrol ping; }
  local node
  if [ "$NODES" -eq 1 ]; then
    alive "$RUN/slurmd.pid" || /usr/sbin/slurmd
  else
    for node in $(node_names); do
      mkdir -p "$STATE/spool/d-$node"
      alive "$RUN/slurmd-$node.pid" || nsenter --net="/var/run/netns/marl-$node" /usr/sbin/slurmd -N "$node"
    done
  fi
  wait_for 60 "$NODES node(s) idle" sh -c \
    "[ \$(sinfo -h -N -o '%T' | grep -cE '^(idle|mixed|allocated)$') -ge $NODES ]"
  for node in $(node_names); do scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true; done
  echo "$NODES" > "$STATE/nodes"
  log "up: $(sinfo -h -N -o '%N %T %c CPUs %m MB' | tr '\n' ';' | sed 's/;$//')"
}

stop() {
  for pidfile in $(slurmd_pidfiles) "$RUN/slurmctld.pid" "$RUN/slurmdbd.pid" "$MARIADB_PID"; do
    stop_pidfile "$pidfile"
  done
  namespaces_down
  rm -f "$STATE/nodes"
  if alive /run/munge/munged.pid; then kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true; fi
  log "stopped"
}

status() {
  local pidfile
  for pidfile in $(slurmd_pidfiles); do
    if alive "$pidfile"; then echo "$(basename "$pidfile" .pid): running"; else echo "$(basename "$pidfile" .pid): stopped"; fi
  done
  for name in slurmctld slurmdbd; do
    if alive "$RUN/$name.pid"; then echo "$name: running"; else echo "$name: stopped"; fi
  done
  alive "$MARIADB_PID" && echo "mariadb: running" || echo "mariadb: stopped"
  alive /run/munge/munged.pid && echo "munged: running" || echo "munged: stopped"
  sinfo -h -N -o '%N %T' 2>/dev/null || true
}

command=${1:-}
[ $# -gt 0 ] && shift
NODES=${SLURM_LOCAL_NODES:-1}
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=${2:-}; shift 2 || true ;;
    --nodes=*) NODES=${1#--nodes=}; shift ;;
    *) echo "error: unknown option '$1' (valid: --nodes N)" >&2; exit 2 ;;
  esac
done
case "$NODES" in ''|*[!0-9]*|0) echo "error: --nodes takes a whole number from 1 to 9, got '$NODES'" >&2; exit 2 ;; esac
[ "$NODES" -le 9 ] || { echo "error: --nodes takes a whole number from 1 to 9, got '$NODES'" >&2; exit 2; }

case "$command" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 install|start [--nodes N]|stop|status" >&2; exit 2 ;;
esac
