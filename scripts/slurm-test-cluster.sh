#!/usr/bin/env bash
# =============================================================================
# slurm-test-cluster.sh -- a REAL, throw-away SLURM cluster on loopback for
# dsorch's tests (Debian 12 packages: SLURM 22.05, MariaDB 10.11, MUNGE 0.5).
#
# Usage:
#   scripts/slurm-test-cluster.sh start          # idempotent; prints export lines
#   scripts/slurm-test-cluster.sh stop [--purge] # stop daemons (--purge: rm state dir)
#   scripts/slurm-test-cluster.sh status         # exit 0 only if the cluster is up
#   scripts/slurm-test-cluster.sh env            # prints: export SLURM_CONF=...
#
#   eval "$(scripts/slurm-test-cluster.sh env)"; sbatch ...; sacct ...
#
# What `start` does (must run as root; no systemd needed):
#   * installs, only when missing, munge slurmctld slurmd slurm-client slurmdbd
#     mariadb-server, and openssh-server openssh-client for tests/system/test_ssh.py
#     (its own sshd in front of this cluster; nothing here starts one) (apt-get
#     update first, noninteractive, no recommends; openssh-server took 10 s);
#   * writes everything under the state dir ${DSORCH_SLURM_DIR:-/tmp/dsorch-slurm}:
#       etc/   slurm.conf, slurmdbd.conf (0600), plugstack.conf, secrets
#       log/   one log per daemon (printed when start fails)
#       run/   pid files written by us (<daemon>.pid) and by the daemons
#       spool/ slurmctld state, per-node slurmd spool dirs
#       munge/ key, seed; munge/sock/ = socket dir (mode 0755, see below)
#       mysql/ MariaDB datadir + socket
#   * starts, each with setsid in its own session, in this order:
#       munged -F, mariadbd (own datadir, TCP on 127.0.0.1), slurmdbd -D,
#       slurmctld -D, slurmd -D -N node1, slurmd -D -N node2
#     and waits until sacctmgr works and sinfo shows node1+node2 idle;
#   * registers cluster "dsorch", account "dsorch" and user root in accounting.
#
# Topology: 2 nodes (node1, node2), both slurmd's on this host (Debian's SLURM
# supports several slurmd per host via distinct Port= and `slurmd -N`), each
# CPUs=4 RealMemory=4000 (SlurmdParameters=config_overrides lets both claim
# the same real cores/memory), one partition `debug` (default, no time limit).
# Ports (all on 127.0.0.1, base = ${DSORCH_SLURM_PORT_BASE:-6817}):
#   slurmctld base, node1 base+1, slurmdbd base+2, node2 base+3, mariadb base+4
# A port already taken by something else makes `start` fail with a clear error;
# pick another base then (the base is remembered in the state dir; a new
# DSORCH_SLURM_PORT_BASE is adopted by `start` only while nothing runs).
#
# Facts this relies on (found by trying it on Debian 12):
#   * submitit reads job states with `sacct`, which needs accounting through
#     slurmdbd (+MariaDB); without it every state stays UNKNOWN.
#   * munged refuses a socket directory that is not world-executable: the
#     socket dir must be 0755. All daemons/clients find it via
#     AuthInfo=socket=..., and slurmctld's link to slurmdbd additionally needs
#     AccountingStoragePass=<munge socket>.
#   * slurmdbd has no -f: it reads slurmdbd.conf (mode 0600, owned by
#     SlurmUser) from the directory of $SLURM_CONF.
#   * A requeued job (scontrol requeue, JobRequeue=1) only starts again after
#     cred_expire (10 s here) plus a scheduler pass (sched_interval=5), i.e.
#     ~10-20 s. A fresh job normally starts within a second or two.
#   * `srun -N2` gives SLURM_JOB_NODELIST=node[1-2]. Those names do NOT
#     resolve (no /etc/hosts entries); get a node's address with
#     `scontrol show node node1` -> NodeAddr=127.0.0.1 (all nodes are
#     127.0.0.1, so MASTER_ADDR=127.0.0.1 and distinct ports per job).
#
# How tests use it:
#   scripts/slurm-test-cluster.sh start        (session fixture; safe to repeat,
#                                               serialised by a lock file)
#   eval "$(scripts/slurm-test-cluster.sh env)"   or set SLURM_CONF yourself
#   ... submit with sbatch/submitit; the job runs as the submitting user on
#   this very host, with the same filesystem (use shared tmp dirs).
#   scripts/slurm-test-cluster.sh stop         (optional; cancels all jobs)
# SLURM_CONF must be in the environment of every SLURM client (sbatch, sacct,
# scontrol, submitit); without it they use /etc/slurm/slurm.conf (absent).
# =============================================================================
set -euo pipefail

# Debian installs the daemons (munged, slurmctld, slurmd, slurmdbd, mariadbd) in /usr/sbin, which
# is not on a non-root login's PATH nor on many CI runners'. Look there too, after the caller's
# own PATH, so that `scripts/test.sh` works from any shell.
for d in /usr/local/sbin /usr/sbin /sbin; do
  case ":$PATH:" in *":$d:"*) ;; *) PATH="$PATH:$d" ;; esac
done
export PATH

STATE_DIR="${DSORCH_SLURM_DIR:-/tmp/dsorch-slurm}"
CLUSTER_NAME="${DSORCH_SLURM_CLUSTER:-dsorch}"
ACCOUNT_NAME="${DSORCH_SLURM_ACCOUNT:-dsorch}"
PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server openssh-server openssh-client)
NODES=(node1 node2)
START_TIMEOUT="${DSORCH_SLURM_START_TIMEOUT:-90}"

ETC="$STATE_DIR/etc"
LOG="$STATE_DIR/log"
RUN="$STATE_DIR/run"
SPOOL="$STATE_DIR/spool"
MUNGE_DIR="$STATE_DIR/munge"
MUNGE_SOCK_DIR="$MUNGE_DIR/sock"
MUNGE_SOCK="$MUNGE_SOCK_DIR/munge.socket.2"
MYSQL_DIR="$STATE_DIR/mysql"
MYSQL_DATA="$MYSQL_DIR/data"
MYSQL_SOCK="$MYSQL_DIR/mysqld.sock"
SLURM_CONF_FILE="$ETC/slurm.conf"
SLURMDBD_CONF_FILE="$ETC/slurmdbd.conf"

export SLURM_CONF="$SLURM_CONF_FILE"

log()  { echo "[slurm-test-cluster] $*" >&2; }
die()  { log "ERROR: $*"; exit 1; }

dump_logs() {
  local f
  [ -d "$LOG" ] || return 0
  # *.log: the daemons' own log files; *.out: their stdout/stderr (holds
  # early errors, e.g. config parse failures, before the log file is opened)
  for f in "$LOG"/*.log; do
    [ -e "$f" ] || continue
    echo "----- tail -n 30 $f -----" >&2
    tail -n 30 "$f" >&2 || true
  done
  for f in "$LOG"/*.out; do
    [ -s "$f" ] || continue
    echo "----- tail -n 10 $f -----" >&2
    tail -n 10 "$f" >&2 || true
  done
}

fail() { log "ERROR: $*"; dump_logs; exit 1; }

# --------------------------------------------------------------------------
# ports (persisted so that `status`/`stop`/`env` agree with `start`)
# --------------------------------------------------------------------------
load_ports() {
  local base
  if [ -f "$ETC/port_base" ]; then
    base="$(cat "$ETC/port_base")"
    if [ -n "${DSORCH_SLURM_PORT_BASE:-}" ] && [ "$DSORCH_SLURM_PORT_BASE" != "$base" ]; then
      if [ "${1:-}" = adopt ] && ! any_running; then
        base=$DSORCH_SLURM_PORT_BASE   # nothing running: switch to the new base
        echo "$base" >"$ETC/port_base"
      else
        log "warning: running cluster uses port base $base (ignoring DSORCH_SLURM_PORT_BASE=$DSORCH_SLURM_PORT_BASE; 'stop' first to change it)"
      fi
    fi
  else
    base="${DSORCH_SLURM_PORT_BASE:-6817}"
  fi
  case "$base" in ''|*[!0-9]*) die "bad port base '$base'";; esac
  PORT_BASE=$base
  PORT_CTLD=$((base))
  PORT_NODE1=$((base + 1))
  PORT_DBD=$((base + 2))
  PORT_NODE2=$((base + 3))
  PORT_MYSQL=$((base + 4))
}

port_in_use() {
  # true if something listens on TCP port $1
  local out
  out="$(ss -Hltn "sport = :$1" 2>/dev/null || true)"
  [ -n "$out" ]
}

# --------------------------------------------------------------------------
# packages
# --------------------------------------------------------------------------
pkg_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

ensure_packages() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do pkg_installed "$p" || missing+=("$p"); done
  [ "${#missing[@]}" -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "packages missing (${missing[*]}) and not root"
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  mkdir -p "$STATE_DIR"
  apt-get update -q >"$STATE_DIR/apt.log" 2>&1 || { cat "$STATE_DIR/apt.log" >&2; die "apt-get update failed"; }
  apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$STATE_DIR/apt.log" 2>&1 \
    || { tail -n 40 "$STATE_DIR/apt.log" >&2; die "apt-get install failed"; }
}

# --------------------------------------------------------------------------
# process bookkeeping
# --------------------------------------------------------------------------
# daemon name -> expected executable basename (checked against /proc/PID/exe
# so that a recycled PID is never mistaken for ours)
daemon_exe() {
  case "$1" in
    munged) echo munged ;;
    mariadbd) echo mariadbd ;;
    slurmdbd) echo slurmdbd ;;
    slurmctld) echo slurmctld ;;
    slurmd-*) echo slurmd ;;
    *) return 1 ;;
  esac
}

daemon_pid() {
  # prints the PID of our daemon $1 if it is alive, else returns 1
  local name=$1 pidf="$RUN/$1.pid" pid exe want
  [ -f "$pidf" ] || return 1
  pid="$(cat "$pidf" 2>/dev/null || true)"
  case "$pid" in ''|*[!0-9]*) return 1;; esac
  [ -d "/proc/$pid" ] || return 1
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
  exe="${exe% (deleted)}"
  want="$(daemon_exe "$name")"
  case "$(basename "$exe")" in
    "$want"|"$want"-wlm) ;;  # Debian: slurmd -> slurmd-wlm via alternatives
    *) return 1 ;;
  esac
  # zombies do not count
  if grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then return 1; fi
  echo "$pid"
}

daemon_running() { daemon_pid "$1" >/dev/null; }

spawn() {
  # spawn NAME CMD... : run CMD in its own session, stdout/err -> log/NAME.out
  local name=$1; shift
  log "starting $name"
  setsid "$@" </dev/null >>"$LOG/$name.out" 2>&1 9>&- &
  local pid=$!
  echo "$pid" >"$RUN/$name.pid"
  # until bash's fork has exec'd setsid and setsid has exec'd the daemon,
  # /proc/PID/exe is bash/setsid: wait for the exec so that daemon_running
  # does not report a daemon that is merely starting as dead
  for _ in $(seq 1 50); do
    daemon_running "$name" && return 0
    [ -d "/proc/$pid" ] || break
    sleep 0.1
  done
  daemon_running "$name" || fail "$name exited right after start (see logs below)"
}

wait_for() {
  # wait_for DESCRIPTION TIMEOUT DAEMON-or-"" CMD... : poll CMD until success
  local what=$1 timeout=$2 daemon=$3; shift 3
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if [ -n "$daemon" ] && ! daemon_running "$daemon"; then
      fail "$daemon died while waiting for $what (see logs below)"
    fi
    [ "$SECONDS" -lt "$deadline" ] || fail "timed out after ${timeout}s waiting for $what"
    sleep 0.3
  done
}

check_port_free() {
  # check_port_free PORT DAEMON
  port_in_use "$1" && fail "port $1 needed by $2 is already in use by another process (stop it, or use another DSORCH_SLURM_PORT_BASE)"
  return 0
}

preflight_ports() {
  # fail before starting anything if a port of a not-yet-running daemon is taken
  local d p
  for d in mariadbd:$PORT_MYSQL slurmdbd:$PORT_DBD slurmctld:$PORT_CTLD \
           slurmd-node1:$PORT_NODE1 slurmd-node2:$PORT_NODE2; do
    p=${d#*:}; d=${d%%:*}
    daemon_running "$d" || check_port_free "$p" "$d"
  done
}

# --------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------
secret() {
  # persistent random secret $1 in $ETC
  local f="$ETC/$1"
  if [ ! -s "$f" ]; then
    (umask 077; head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$f")
  fi
  cat "$f"
}

write_if_changed() {
  # write_if_changed FILE MODE < content
  local f=$1 mode=$2 tmp
  tmp="$(mktemp "$f.XXXXXX")"
  cat >"$tmp"
  chmod "$mode" "$tmp"
  if [ -f "$f" ] && cmp -s "$tmp" "$f"; then
    rm -f "$tmp"
  else
    [ -f "$f" ] && CONFIG_CHANGED=1
    mv -f "$tmp" "$f"
  fi
}

write_config() {
  CONFIG_CHANGED=0
  mkdir -p "$ETC" "$LOG" "$RUN" "$SPOOL/ctld" "$MUNGE_DIR" "$MUNGE_SOCK_DIR" "$MYSQL_DIR"
  for n in "${NODES[@]}"; do mkdir -p "$SPOOL/slurmd-$n"; done
  chmod 0755 "$STATE_DIR" "$LOG" "$RUN" "$ETC"
  # munged: the socket dir must be world-executable
  chmod 0711 "$MUNGE_DIR"
  chmod 0755 "$MUNGE_SOCK_DIR"
  [ -f "$ETC/port_base" ] || echo "$PORT_BASE" >"$ETC/port_base"

  if [ ! -s "$MUNGE_DIR/munge.key" ]; then
    (umask 077; head -c 1024 /dev/urandom >"$MUNGE_DIR/munge.key")
  fi
  chmod 0600 "$MUNGE_DIR/munge.key"

  local dbpass; dbpass="$(secret db_password)"
  local ncpu=4 mem=4000
  # a random first job id per state dir: after `stop --purge` job ids do not
  # restart at 1, so stale per-job output (e.g. submitit folders "%j") of an
  # earlier cluster is never mistaken for a new job's
  if [ ! -s "$ETC/first_job_id" ]; then
    echo $(( (RANDOM * 32768 + RANDOM) % 50000000 + 1000 )) >"$ETC/first_job_id"
  fi
  local first_job_id; first_job_id="$(cat "$ETC/first_job_id")"

  write_if_changed "$SLURM_CONF_FILE" 0644 <<EOF
# generated by scripts/slurm-test-cluster.sh -- do not edit
ClusterName=$CLUSTER_NAME
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$PORT_CTLD
SlurmdPort=$PORT_NODE1
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK,cred_expire=10
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/slurmd-%n
SlurmctldPidFile=$RUN/slurmctld.daemon.pid
SlurmdPidFile=$RUN/slurmd-%n.daemon.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$ETC/plugstack.conf
MailProg=/bin/true
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$PORT_DBD
AccountingStoragePass=$MUNGE_SOCK
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5,sched_interval=5
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
FirstJobId=$first_job_id
KillWait=5
MinJobAge=300
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
TmpFS=/tmp
NodeName=node1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$PORT_NODE1 CPUs=$ncpu RealMemory=$mem State=UNKNOWN
NodeName=node2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$PORT_NODE2 CPUs=$ncpu RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
EOF

  write_if_changed "$ETC/plugstack.conf" 0644 </dev/null

  # slurmdbd.conf: read from dirname($SLURM_CONF); must be 0600, owner SlurmUser
  write_if_changed "$SLURMDBD_CONF_FILE" 0600 <<EOF
# generated by scripts/slurm-test-cluster.sh -- do not edit
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$PORT_DBD
SlurmUser=root
DebugLevel=info
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.daemon.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$PORT_MYSQL
StorageUser=slurm
StoragePass=$dbpass
StorageLoc=slurm_acct_db
EOF
  chown root:root "$SLURMDBD_CONF_FILE"

  if [ "$CONFIG_CHANGED" = 1 ] && any_running; then
    log "warning: configuration changed while daemons are running; run 'stop' then 'start' to apply"
  fi
}

any_running() {
  local d
  for d in munged mariadbd slurmdbd slurmctld "${NODES[@]/#/slurmd-}"; do
    daemon_running "$d" && return 0
  done
  return 1
}

# --------------------------------------------------------------------------
# daemons
# --------------------------------------------------------------------------
munge_ok() { munge -n -S "$MUNGE_SOCK" </dev/null | unmunge -S "$MUNGE_SOCK" >/dev/null; }

start_munged() {
  if daemon_running munged && munge_ok >/dev/null 2>&1; then return 0; fi
  daemon_running munged && fail "munged is running but does not answer on $MUNGE_SOCK"
  rm -f "$MUNGE_SOCK" "$MUNGE_SOCK.lock"
  spawn munged munged -F --force \
    --socket="$MUNGE_SOCK" \
    --key-file="$MUNGE_DIR/munge.key" \
    --pid-file="$RUN/munged.daemon.pid" \
    --seed-file="$MUNGE_DIR/munged.seed" \
    --log-file="$LOG/munged.log"
  wait_for "munged socket $MUNGE_SOCK" 20 munged munge_ok
}

mysql_cli() { mariadb --no-defaults --protocol=socket --socket="$MYSQL_SOCK" -uroot; }
mysql_ok() { mariadb-admin --no-defaults --protocol=socket --socket="$MYSQL_SOCK" -uroot ping; }

start_mariadb() {
  if daemon_running mariadbd && mysql_ok >/dev/null 2>&1; then return 0; fi
  daemon_running mariadbd && fail "mariadbd is running but does not answer on $MYSQL_SOCK"
  if [ ! -d "$MYSQL_DATA/mysql" ]; then
    log "initialising MariaDB datadir $MYSQL_DATA"
    rm -rf "$MYSQL_DATA"
    mkdir -p "$MYSQL_DATA"
    mariadb-install-db --no-defaults --user=root --datadir="$MYSQL_DATA" \
      --auth-root-authentication-method=socket --skip-test-db \
      >"$LOG/mariadb-install-db.log" 2>&1 \
      || { rm -rf "$MYSQL_DATA"; fail "mariadb-install-db failed"; }
  fi
  check_port_free "$PORT_MYSQL" mariadbd
  rm -f "$MYSQL_SOCK"
  spawn mariadbd mariadbd --no-defaults --user=root \
    --datadir="$MYSQL_DATA" --socket="$MYSQL_SOCK" \
    --pid-file="$RUN/mariadbd.daemon.pid" \
    --port="$PORT_MYSQL" --bind-address=127.0.0.1 \
    --log-error="$LOG/mariadbd.log" \
    --innodb-buffer-pool-size=128M --innodb-log-file-size=64M \
    --innodb-lock-wait-timeout=900 --innodb-flush-log-at-trx-commit=2 \
    --max-connections=100 --skip-log-bin
  wait_for "mariadbd on $MYSQL_SOCK" 60 mariadbd mysql_ok
  local dbpass; dbpass="$(secret db_password)"
  mysql_cli <<EOF >>"$LOG/mariadb-setup.log" 2>&1 || fail "creating the slurm DB user failed (see $LOG/mariadb-setup.log)"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$dbpass';
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$dbpass';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$dbpass';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$dbpass';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
EOF
}

dbd_ok() { sacctmgr -n -P show cluster format=cluster; }

start_slurmdbd() {
  if daemon_running slurmdbd && dbd_ok >/dev/null 2>&1; then return 0; fi
  if ! daemon_running slurmdbd; then
    check_port_free "$PORT_DBD" slurmdbd
    spawn slurmdbd slurmdbd -D
  fi
  wait_for "slurmdbd on port $PORT_DBD" 60 slurmdbd dbd_ok
}

ensure_accounting() {
  if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER_NAME"; then
    sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null || fail "sacctmgr add cluster failed"
  fi
  if ! sacctmgr -n -P show account format=account | grep -qx "$ACCOUNT_NAME"; then
    sacctmgr -i add account "$ACCOUNT_NAME" Cluster="$CLUSTER_NAME" \
      Description="dsorch tests" Organization=dsorch >/dev/null || fail "sacctmgr add account failed"
  fi
  if ! sacctmgr -n -P show assoc where cluster="$CLUSTER_NAME" user=root account="$ACCOUNT_NAME" format=user | grep -qx root; then
    sacctmgr -i add user root Account="$ACCOUNT_NAME" Cluster="$CLUSTER_NAME" >/dev/null || fail "sacctmgr add user failed"
  fi
}

ctld_ok() { scontrol ping | grep -q 'is UP'; }

start_slurmctld() {
  if daemon_running slurmctld && ctld_ok >/dev/null 2>&1; then return 0; fi
  if ! daemon_running slurmctld; then
    check_port_free "$PORT_CTLD" slurmctld
    spawn slurmctld slurmctld -D
  fi
  wait_for "slurmctld on port $PORT_CTLD" 60 slurmctld ctld_ok
}

start_slurmd() {
  local n=$1 port=$2
  daemon_running "slurmd-$n" && return 0
  check_port_free "$port" "slurmd $n"
  spawn "slurmd-$n" slurmd -D -N "$n"
}

nodes_idle() {
  local n st
  for n in "${NODES[@]}"; do
    st="$(sinfo -h -n "$n" -o '%t' 2>/dev/null | head -n1)"
    case "$st" in idle|mix|alloc) ;; *) return 1 ;; esac
  done
}

wait_nodes() {
  local deadline=$((SECONDS + START_TIMEOUT)) n
  until nodes_idle; do
    for n in "${NODES[@]}"; do
      daemon_running "slurmd-$n" || fail "slurmd for $n died (see logs below)"
    done
    daemon_running slurmctld || fail "slurmctld died (see logs below)"
    if [ "$SECONDS" -ge "$deadline" ]; then
      sinfo -N -l >&2 || true
      fail "timed out after ${START_TIMEOUT}s waiting for nodes to become idle"
    fi
    # nodes left DOWN/DRAIN by an earlier run: ReturnToService=2 normally
    # handles it, but resume explicitly to be sure
    for n in "${NODES[@]}"; do
      case "$(sinfo -h -n "$n" -o '%t' 2>/dev/null | head -n1)" in
        down|down\*|drain|drain\*|drng|fail)
          scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true ;;
      esac
    done
    sleep 0.5
  done
}

print_env() {
  echo "export SLURM_CONF=$SLURM_CONF_FILE"
}

cmd_start() {
  [ "$(id -u)" -eq 0 ] || die "start must run as root"
  ensure_packages
  mkdir -p "$STATE_DIR"
  exec 9>"$STATE_DIR/.lock"
  flock -w 300 9 || die "could not lock $STATE_DIR/.lock"
  load_ports adopt
  write_config
  local t0=$SECONDS
  preflight_ports
  start_munged
  start_mariadb
  start_slurmdbd
  ensure_accounting
  start_slurmctld
  start_slurmd node1 "$PORT_NODE1"
  start_slurmd node2 "$PORT_NODE2"
  wait_nodes
  log "cluster '$CLUSTER_NAME' up ($((SECONDS - t0))s); state dir $STATE_DIR"
  print_env
}

stop_daemon() {
  local name=$1 pid
  if pid="$(daemon_pid "$name")"; then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do   # up to 20 s
      daemon_running "$name" || break
      sleep 0.2
    done
    if daemon_running "$name"; then
      log "$name did not exit, sending KILL"
      kill -KILL "$pid" 2>/dev/null || true
      for _ in $(seq 1 25); do daemon_running "$name" || break; sleep 0.2; done
    fi
  fi
  rm -f "$RUN/$name.pid"
}

kill_stray_stepds() {
  # slurmstepd processes of this cluster hold its slurmd log files open
  local p exe
  for p in /proc/[0-9]*; do
    exe="$(readlink "$p/exe" 2>/dev/null || true)"
    case "$(basename "${exe% (deleted)}")" in slurmstepd|slurmstepd-wlm) ;; *) continue ;; esac
    local fd
    for fd in "$p"/fd/*; do
      case "$(readlink "$fd" 2>/dev/null || true)" in
        "$STATE_DIR"/*)
          log "killing leftover slurmstepd ${p#/proc/}"
          kill -KILL "${p#/proc/}" 2>/dev/null || true
          break ;;
      esac
    done
  done
}

cmd_stop() {
  local purge=0
  [ "${1:-}" = "--purge" ] && purge=1
  if [ -d "$STATE_DIR" ]; then
    exec 9>"$STATE_DIR/.lock"
    flock -w 300 9 || die "could not lock $STATE_DIR/.lock"
    # cancel jobs first so that no job step outlives the cluster
    if daemon_running slurmctld && timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; then
      local jobs
      jobs="$(timeout 10 squeue -h -o '%i' 2>/dev/null | tr '\n' ' ' || true)"
      if [ -n "${jobs// /}" ]; then
        log "cancelling jobs: $jobs"
        # shellcheck disable=SC2086
        timeout 10 scancel $jobs 2>/dev/null || true
        local _
        for _ in $(seq 1 40); do
          [ -z "$(timeout 5 squeue -h -o '%i' 2>/dev/null)" ] && break
          sleep 0.25
        done
      fi
    fi
    local n
    for n in "${NODES[@]}"; do stop_daemon "slurmd-$n"; done
    kill_stray_stepds
    stop_daemon slurmctld
    stop_daemon slurmdbd
    stop_daemon mariadbd
    stop_daemon munged
  fi
  if [ "$purge" = 1 ]; then
    log "removing $STATE_DIR"
    rm -rf "$STATE_DIR"
  fi
  log "stopped"
}

cmd_status() {
  local ok=0 d pid
  if [ ! -d "$STATE_DIR" ]; then echo "no state dir $STATE_DIR: cluster not started"; return 1; fi
  load_ports
  for d in munged mariadbd slurmdbd slurmctld "${NODES[@]/#/slurmd-}"; do
    if pid="$(daemon_pid "$d")"; then
      printf '%-13s running (pid %s)\n' "$d" "$pid"
    else
      printf '%-13s NOT running\n' "$d"; ok=1
    fi
  done
  if [ "$ok" = 0 ]; then
    timeout 15 sinfo -N -l || ok=1
    nodes_idle_or_busy || { echo "nodes not all up"; ok=1; }
  fi
  return "$ok"
}

nodes_idle_or_busy() {
  local n st
  for n in "${NODES[@]}"; do
    st="$(timeout 10 sinfo -h -n "$n" -o '%t' 2>/dev/null | head -n1)"
    case "$st" in idle|mix|alloc|comp) ;; *) return 1 ;; esac
  done
}

usage() {
  sed -n '3,12p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

case "${1:-}" in
  start)  shift; cmd_start "$@" ;;
  stop)   shift; cmd_stop "$@" ;;
  status) shift; cmd_status "$@" ;;
  env)    print_env ;;
  -h|--help|help) usage ;;
  *) usage ;;
esac
