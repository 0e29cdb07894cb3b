#!/usr/bin/env bash
# A real single-node SLURM cluster on localhost, for tests and for trying the launcher on a laptop:
# munge, slurmctld, slurmd, and slurmdbd with MariaDB (submitit needs sacct). Debian/Ubuntu, as root.
#
#   slurm/local-cluster.sh install   # Debian packages (idempotent)
#   slurm/local-cluster.sh start     # write configs, start the daemons, wait until the node is idle
#   slurm/local-cluster.sh stop      # stop the daemons by their pid files
#   slurm/local-cluster.sh status
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

write_configs() {
  mkdir -p "$RUN" "$LOGS" "$STATE/spool/ctld" "$STATE/spool/d" /etc/slurm /run/munge /run/mysqld
  getent hosts "$HOST" >/dev/null || echo "127.0.0.1 $HOST" >> /etc/hosts
  local mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) * 85 / 100 / 1024 ))
  cat > /etc/slurm/slurm.conf <<EOF
ClusterName=marl
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=30
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
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
NodeName=$HOST CPUs=$CPUS RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
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
  alive "$RUN/slurmd.pid" || /usr/sbin/slurmd
  wait_for 60 "node $HOST idle" sh -c "sinfo -h -N -o '%T' | grep -qE '^(idle|mixed|allocated)$'"
  scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
  log "up: $(sinfo -h -N -o '%N %T %c CPUs %m MB')"
}

stop() {
  for name in slurmd slurmctld slurmdbd mariadb; do
    local pidfile="$RUN/$name.pid"
    [ "$name" = mariadb ] && pidfile=$MARIADB_PID
    if alive "$pidfile"; then
      kill "$(cat "$pidfile")" 2>/dev/null || true
      for _ in $(seq 50); do alive "$pidfile" || break; sleep 0.1; done
      alive "$pidfile" && kill -9 "$(cat "$pidfile")" 2>/dev/null || true
    fi
    rm -f "$pidfile"
  done
  if alive /run/munge/munged.pid; then kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true; fi
  log "stopped"
}

status() {
  for name in slurmd slurmctld slurmdbd; do
    if alive "$RUN/$name.pid"; then echo "$name: running"; else echo "$name: stopped"; fi
  done
  alive "$MARIADB_PID" && echo "mariadb: running" || echo "mariadb: stopped"
  alive /run/munge/munged.pid && echo "munged: running" || echo "munged: stopped"
  sinfo -h -N -o '%N %T' 2>/dev/null || true
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
