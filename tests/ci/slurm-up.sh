#!/usr/bin/env bash
# Bring up a real local Slurm cluster of NODES emulated nodes (n1..nN, one `slurmd -N nX` each) on
# this host, from nothing and without systemd. Run as root on Debian 12 (slurm-wlm 22.05).
# The NODES form partition `debug` (the default); SIDE more nodes after them form partition `side`,
# so that jobs and checks meet a cluster of several partitions, as real ones are (the time-limit
# rehearsal runs there).
#
#   [NODES=4] [SIDE=2] [CPUS=2] [ACCOUNTING=dbd|none] [SLURM_CI_DIR=/var/tmp/jobgen-slurm] bash tests/ci/slurm-up.sh
#
# Idempotent: if the cluster is already up with the same configuration it says so and exits 0; if
# daemons are stale or half up, or the configuration changed, it stops ours (slurm-down.sh) and
# starts them again. Everything it creates at run time (pid files, logs, Slurm state, the MariaDB
# data directory of the accounting DB) lives under $SLURM_CI_DIR, so slurm-down.sh can stop exactly
# what was started, and `PURGE=1 bash tests/ci/slurm-down.sh` wipes Slurm state and accounting DB
# together (wiping only one of them would let new job IDs collide with old accounting records).
# Outside that directory it writes only /etc/slurm/slurm.conf and slurmdbd.conf (where every Slurm
# client looks for them), one marked line in /etc/hosts, and the munge socket in /run/munge.
set -euo pipefail

NODES=${NODES:-4}
SIDE=${SIDE:-2}                          # nodes of partition `side` (0: none)
CPUS=${CPUS:-2}                          # per emulated node; may exceed the real cores (config_overrides)
MEM_MB=${MEM_MB:-2000}                   # RealMemory per emulated node
ACCOUNTING=${ACCOUNTING:-dbd}            # dbd: slurmdbd + MariaDB (real sacct); none: jobcomp file only
SLURM_CI_DIR=${SLURM_CI_DIR:-/var/tmp/jobgen-slurm}
CLUSTER_NAME=${CLUSTER_NAME:-ci}
SLURMCTLD_PORT=${SLURMCTLD_PORT:-6817}
SLURMDBD_PORT=${SLURMDBD_PORT:-6819}
SLURMD_PORT_BASE=${SLURMD_PORT_BASE:-17000}   # node nI listens on SLURMD_PORT_BASE + I
DB_PORT=${DB_PORT:-13306}                # our private mariadbd, bound to 127.0.0.1 only
UP_TIMEOUT=${UP_TIMEOUT:-90}             # seconds to wait for all nodes to be idle
# Slurm's job credential lifetime (default 120 s), which is also how long a requeued job is held
# (Reason=BeginTime) before it may start again. With 10 s a requeued job runs again ~12 s after
# `scontrol requeue` (or ~1 s if `scontrol update jobid=J StartTime=now` is issued once it is
# PENDING). Much lower risks "credential expired" step launches on a loaded 2-core machine.
CRED_EXPIRE=${CRED_EXPIRE:-10}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CONF_DIR=/etc/slurm
RUN=$SLURM_CI_DIR/run                    # slurm daemons' pid files (root)
LOG=$SLURM_CI_DIR/log                    # slurm daemons' logs, jobcomp.txt (root)
SPOOL=$SLURM_CI_DIR/spool                # spool/ctld = StateSaveLocation, spool/<node> = slurmd spool
MUNGE_DIR=$SLURM_CI_DIR/munge            # munged's pid file and log (owned by munge)
DB_DIR=$SLURM_CI_DIR/mysql               # mariadbd's pid, socket, log (owned by mysql); data in ./data
DB_SOCK=$DB_DIR/mysqld.sock
DB_PASS=jobgen-ci                        # local throwaway DB listening on 127.0.0.1 only
MARK="# jobgen-slurm-ci"                 # marks what this script owns in shared files

log() { printf '[slurm-up] %s\n' "$*"; }
die() { printf '[slurm-up] ERROR: %s\n' "$*" >&2; exit 1; }
# Seconds elapsed since the $EPOCHREALTIME value $1, one decimal.
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# shellcheck source=tests/ci/pidfile.sh
source "$(dirname "${BASH_SOURCE[0]}")/pidfile.sh"

tail_logs() {
    local f
    for f in "$LOG"/*.log "$MUNGE_DIR"/munged.log "$DB_DIR"/mariadb.log; do
        [[ -s $f ]] || continue
        printf -- '----- tail %s -----\n' "$f" >&2
        tail -n 25 "$f" >&2
    done
}

[[ $EUID -eq 0 ]] || die "must run as root (installs packages, starts system daemons)"
[[ $NODES =~ ^[1-9][0-9]*$ ]] || die "NODES must be a positive integer, got '$NODES'"
[[ $SIDE =~ ^[0-9]+$ ]] || die "SIDE must be a number of nodes (0 or more), got '$SIDE'"
TOTAL=$((NODES + SIDE))
[[ $CPUS =~ ^[1-9][0-9]*$ ]] || die "CPUS must be a positive integer, got '$CPUS'"
case $ACCOUNTING in dbd | none) ;; *) die "ACCOUNTING must be dbd or none, got '$ACCOUNTING'" ;; esac

t_start=$EPOCHREALTIME

# ---------------------------------------------------------------------------------------------
# 1. Packages (only what is missing; apt-get update only when something is)
# ---------------------------------------------------------------------------------------------
pkgs=(slurmctld slurmd slurm-client munge)
[[ $ACCOUNTING == dbd ]] && pkgs+=(slurmdbd mariadb-server mariadb-client)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep 'install ok installed' >/dev/null || missing+=("$p")
done
if ((${#missing[@]})); then
    log "installing: ${missing[*]}"
    # Packages' postinst scripts would start their daemons through init scripts where no
    # policy-rc.d forbids it; we start (and stop) our own, so forbid it for the install.
    own_policy=
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        own_policy=1
    fi
    apt_rc=0
    {
        DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}"
    } </dev/null || apt_rc=$?
    [[ -n $own_policy ]] && rm -f /usr/sbin/policy-rc.d
    ((apt_rc == 0)) || die "apt-get failed (rc=$apt_rc)"
else
    log "packages already installed: ${pkgs[*]}"
fi
t_install=$(since "$t_start")

# ---------------------------------------------------------------------------------------------
# 2. Names: n1..nN must resolve (torchrun's MASTER_ADDR is the first node name), and so must
#    this host's own name. One marked line in /etc/hosts, replaced in place (it may be a bind
#    mount, so write its content rather than replacing the file).
# ---------------------------------------------------------------------------------------------
HOST=$(uname -n)
HOST=${HOST%%.*}
names=""
for ((i = 1; i <= TOTAL; i++)); do names+=" n$i"; done
if ! grep -v -- "$MARK" /etc/hosts | grep -wF -- "$HOST" >/dev/null; then names+=" $HOST"; fi
hosts_line="127.0.0.1$names $MARK"
if ! grep -qxF -- "$hosts_line" /etc/hosts; then
    hosts_new=$(grep -v -- "$MARK" /etc/hosts || true)
    printf '%s\n%s\n' "$hosts_new" "$hosts_line" >/etc/hosts
    log "/etc/hosts: $hosts_line"
fi

# ---------------------------------------------------------------------------------------------
# 3. The configuration we want
# ---------------------------------------------------------------------------------------------
if [[ $ACCOUNTING == dbd ]]; then
    acct_lines="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$SLURMDBD_PORT
JobAcctGatherType=jobacct_gather/linux"
else
    acct_lines="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi
last_port=$((SLURMD_PORT_BASE + TOTAL))
partitions="PartitionName=debug Nodes=n[1-$NODES] Default=YES MaxTime=INFINITE State=UP"
if ((SIDE)); then
    partitions+="
PartitionName=side Nodes=n[$((NODES + 1))-$TOTAL] Default=NO MaxTime=INFINITE State=UP"
fi
slurm_conf="$MARK: written by tests/ci/slurm-up.sh, rewritten on every bring-up
ClusterName=$CLUSTER_NAME
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$SLURMCTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=$CRED_EXPIRE
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
# No cgroups: works in containers whatever their cgroup setup.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
# Look at pending jobs every 2 s (defaults: 60 s, backfill 30 s) so that a job that becomes
# eligible by time (e.g. after a requeue) starts promptly; cheap on a cluster this small.
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Trust the CPUs/RealMemory below instead of the host's hardware (several slurmd share one host).
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
JobRequeue=1
# Without this, a job whose dependency can never be satisfied stays PENDING forever.
DependencyParameters=kill_invalid_depend
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.txt
$acct_lines
NodeName=n[1-$TOTAL] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[$((SLURMD_PORT_BASE + 1))-$last_port] CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
$partitions"

slurmdbd_conf="$MARK: written by tests/ci/slurm-up.sh
AuthType=auth/munge
DbdHost=localhost
DbdPort=$SLURMDBD_PORT
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log"

# Never overwrite a slurm.conf that some real installation wrote.
for f in "$CONF_DIR/slurm.conf" "$CONF_DIR/slurmdbd.conf"; do
    if [[ -s $f ]] && ! head -n 1 "$f" | grep -F -- "$MARK" >/dev/null; then
        die "$f exists and was not written by this script; refusing to overwrite it"
    fi
done

same_file() { [[ -f $1 ]] && [[ "$(cat "$1")" == "$2" ]]; }
conf_same=1
same_file "$CONF_DIR/slurm.conf" "$slurm_conf" || conf_same=0
if [[ $ACCOUNTING == dbd ]]; then same_file "$CONF_DIR/slurmdbd.conf" "$slurmdbd_conf" || conf_same=0; fi

# ---------------------------------------------------------------------------------------------
# 4. Already up? Otherwise stop whatever of ours is left (stale pid files, half-started cluster).
# ---------------------------------------------------------------------------------------------
munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }
all_alive() {
    munge_ok || return 1
    alive "$RUN/slurmctld.pid" slurmctld || return 1
    local i
    for ((i = 1; i <= TOTAL; i++)); do alive "$RUN/slurmd-n$i.pid" slurmd || return 1; done
    if [[ $ACCOUNTING == dbd ]]; then
        alive "$RUN/slurmdbd.pid" slurmdbd || return 1
        alive "$DB_DIR/mysqld.pid" mariadbd || return 1
    fi
    # No daemon of ours may be left over from a bigger cluster or another accounting mode.
    local f
    for f in "$RUN"/slurmd-*.pid; do
        [[ -e $f ]] || continue
        i=${f##*/slurmd-n}; i=${i%.pid}
        [[ $i =~ ^[0-9]+$ ]] && ((i <= TOTAL)) || return 1
    done
    if [[ $ACCOUNTING == none ]] && alive "$RUN/slurmdbd.pid" slurmdbd; then return 1; fi
    return 0
}
# Node states that count as "up": idle, or busy with jobs (when the cluster was already in use).
nodes_up() {
    local want=$1 states
    states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u) || return 1
    [[ $(grep -cE " ($want)\$" <<<"$states") -eq $TOTAL ]]
}

if ((conf_same)) && all_alive && nodes_up 'idle|mix|alloc|comp'; then
    log "already up: $NODES nodes (partition debug) + $SIDE (partition side), accounting=$ACCOUNTING, state in $SLURM_CI_DIR"
    sinfo -N
    exit 0
fi
leftovers=0
for f in "$RUN"/*.pid "$MUNGE_DIR/munged.pid" "$DB_DIR/mysqld.pid"; do [[ -e $f ]] && leftovers=1; done
if ((leftovers)); then
    if ((conf_same)); then log "stale or partial cluster found: restarting it cleanly"
    else log "configuration changed: restarting the cluster"; fi
    SLURM_CI_DIR=$SLURM_CI_DIR bash "$HERE/slurm-down.sh"
fi

t_daemons=$EPOCHREALTIME
mkdir -p "$RUN" "$LOG" "$SPOOL/ctld" "$CONF_DIR"
for ((i = 1; i <= TOTAL; i++)); do mkdir -p "$SPOOL/n$i"; done

# Slurm state and accounting DB must go together: if the controller's state is gone (first start,
# or someone deleted it) job IDs restart at 1, so an older accounting DB and jobcomp file would
# hold records with the same IDs. Drop them too.
if [[ ! -e $SPOOL/ctld/clustername ]]; then
    if [[ -d $DB_DIR/data || -e $LOG/jobcomp.txt ]]; then
        log "no Slurm state in $SPOOL/ctld: dropping the old accounting DB and jobcomp file with it"
    fi
    rm -rf "$DB_DIR/data" "$LOG/jobcomp.txt"
fi

printf '%s\n' "$slurm_conf" >"$CONF_DIR/slurm.conf"
chmod 644 "$CONF_DIR/slurm.conf"

# ---------------------------------------------------------------------------------------------
# 5. munge. Debian's postinst creates the key; create one if it is missing. munged refuses to
#    run as root, so run it as munge. If a munged (not ours) already answers, use it.
# ---------------------------------------------------------------------------------------------
if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating /etc/munge/munge.key"
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge "$MUNGE_DIR"
chown munge:munge /run/munge "$MUNGE_DIR"
chmod 755 /run/munge
chmod 700 "$MUNGE_DIR"
if munge_ok; then
    log "munged already running (not started by this script; left alone)"
else
    runuser -u munge -- /usr/sbin/munged --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log"
    for _ in $(seq 50); do munge_ok && break; sleep 0.1; done
    munge_ok || { tail_logs; die "munged did not come up"; }
fi

# ---------------------------------------------------------------------------------------------
# 6. Accounting: a private mariadbd (own data dir, socket and port) + slurmdbd
# ---------------------------------------------------------------------------------------------
db() { mariadb --no-defaults --socket="$DB_SOCK" -u root "$@"; }
if [[ $ACCOUNTING == dbd ]]; then
    mkdir -p "$DB_DIR"
    chown mysql:mysql "$DB_DIR"
    chmod 750 "$DB_DIR"
    if [[ ! -d $DB_DIR/data/mysql ]]; then
        rm -rf "$DB_DIR/data"
        t_db=$EPOCHREALTIME
        # root@localhost authenticates by unix socket: only the OS root user gets in.
        mariadb-install-db --no-defaults --user=mysql --datadir="$DB_DIR/data" \
            --auth-root-authentication-method=socket --skip-test-db >"$DB_DIR/install.log" 2>&1 ||
            { cat "$DB_DIR/install.log" >&2; die "mariadb-install-db failed"; }
        log "MariaDB data dir initialised in $(since "$t_db") s"
    fi
    # mariadbd does not daemonize: start it in its own session, detached from our stdio.
    # innodb_lock_wait_timeout and innodb_log_file_size as slurmdbd recommends; its remaining
    # warning about innodb_buffer_pool_size (it wants a share of the host's RAM) is harmless here.
    setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DB_DIR/data" \
        --socket="$DB_SOCK" --pid-file="$DB_DIR/mysqld.pid" --log-error="$DB_DIR/mariadb.log" \
        --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
        --innodb-log-file-size=64M --innodb-lock-wait-timeout=900 \
        </dev/null >/dev/null 2>&1 &
    for _ in $(seq 300); do
        mariadb-admin --no-defaults --socket="$DB_SOCK" -u root ping >/dev/null 2>&1 && break
        sleep 0.1
    done
    mariadb-admin --no-defaults --socket="$DB_SOCK" -u root ping >/dev/null 2>&1 ||
        { tail_logs; die "mariadbd did not come up"; }
    db -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
           CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
           GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"

    # slurmdbd insists on a config readable only by SlurmUser.
    (umask 077 && printf '%s\n' "$slurmdbd_conf" >"$CONF_DIR/slurmdbd.conf")
    chmod 600 "$CONF_DIR/slurmdbd.conf"
    slurmdbd
    for _ in $(seq 100); do
        sacctmgr -n -P show cluster format=cluster >/dev/null 2>&1 && break
        sleep 0.1
    done
    sacctmgr -n -P show cluster format=cluster >/dev/null 2>&1 || { tail_logs; die "slurmdbd did not come up"; }
fi

# ---------------------------------------------------------------------------------------------
# 7. slurmctld and one slurmd per emulated node (all daemonize themselves)
# ---------------------------------------------------------------------------------------------
t_slurmd=$(date +%s)
slurmctld
for ((i = 1; i <= TOTAL; i++)); do slurmd -N "n$i"; done

# slurmctld restores node states from StateSaveLocation, so a node can read "idle" before (or
# without) its slurmd registering: also require every node's SlurmdStartTime to be from now.
nodes_registered() {
    local t n=0
    while read -r t; do
        (($(date -d "$t" +%s 2>/dev/null || echo 0) >= t_slurmd - 1)) && n=$((n + 1))
    done < <(scontrol -o show node 2>/dev/null | grep -o 'SlurmdStartTime=[^ ]*' | cut -d= -f2)
    ((n == TOTAL))
}

# Wait until every node is registered and idle. Nodes that an earlier run left DOWN or DRAINED
# (state is kept in StateSaveLocation) are resumed after a few seconds.
deadline=$((SECONDS + UP_TIMEOUT))
resumed=0
until nodes_registered && nodes_up idle; do
    if ((SECONDS >= deadline)); then
        sinfo -N >&2 || true
        tail_logs
        die "nodes not idle after ${UP_TIMEOUT}s"
    fi
    if ((!resumed && SECONDS + UP_TIMEOUT - deadline >= 5)); then
        bad=$(sinfo -h -N -t drain,drng,down -o '%N' 2>/dev/null | sort -u | paste -sd, -) || bad=
        if [[ -n $bad ]]; then
            log "resuming nodes left down/drained: $bad"
            scontrol update nodename="$bad" state=resume || true
        fi
        resumed=1
    fi
    sleep 0.2
done

if [[ $ACCOUNTING == dbd ]]; then
    # slurmctld registers the cluster with slurmdbd on its own; sacct needs that.
    for _ in $(seq 100); do
        [[ $(sacctmgr -n -P show cluster format=cluster 2>/dev/null) == *"$CLUSTER_NAME"* ]] && break
        sleep 0.1
    done
    [[ $(sacctmgr -n -P show cluster format=cluster 2>/dev/null) == *"$CLUSTER_NAME"* ]] ||
        { tail_logs; die "cluster '$CLUSTER_NAME' did not register with slurmdbd"; }
    sacct -n -X -S now >/dev/null || { tail_logs; die "sacct does not work"; }
fi

sinfo -N
log "up: $NODES nodes (partition debug) + $SIDE (partition side) x $CPUS CPUs, accounting=$ACCOUNTING, state in $SLURM_CI_DIR"
log "timing: install ${t_install} s, daemons $(since "$t_daemons") s, total $(since "$t_start") s"
