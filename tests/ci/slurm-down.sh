#!/usr/bin/env bash
# Stop the local Slurm cluster that tests/ci/slurm-up.sh started: cancel its jobs, then stop each
# daemon through its pid file under $SLURM_CI_DIR (slurmd per node, slurmctld, slurmdbd, mariadbd,
# munged) and wait for it to exit. Nothing is killed by name: a pid whose process is not the
# expected daemon (stale file, reused pid) is left alone and only its pid file removed.
#
#   [SLURM_CI_DIR=/var/tmp/jobgen-slurm] [PURGE=1] bash tests/ci/slurm-down.sh
#
# PURGE=1 also deletes $SLURM_CI_DIR: Slurm state, accounting DB and logs together, so the next
# slurm-up starts from nothing (job IDs restart at 1 with an empty DB).
set -euo pipefail

SLURM_CI_DIR=${SLURM_CI_DIR:-/var/tmp/jobgen-slurm}
STOP_TIMEOUT=${STOP_TIMEOUT:-30}         # seconds per daemon before SIGKILL
RUN=$SLURM_CI_DIR/run
MUNGE_DIR=$SLURM_CI_DIR/munge
DB_DIR=$SLURM_CI_DIR/mysql

log() { printf '[slurm-down] %s\n' "$*"; }

# shellcheck source=tests/ci/pidfile.sh
source "$(dirname "${BASH_SOURCE[0]}")/pidfile.sh"

# stop PIDFILE NAME: SIGTERM, wait up to STOP_TIMEOUT s, then SIGKILL; remove the pid file.
stop() {
    local file=$1 name=$2 pid
    [[ -e $file ]] || return 0
    if pid=$(pid_of "$file" "$name"); then
        kill -TERM "$pid" 2>/dev/null || true
        local deadline=$((SECONDS + STOP_TIMEOUT))
        while pid_of "$file" "$name" >/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
        if pid_of "$file" "$name" >/dev/null; then
            log "$name (pid $pid) still running after ${STOP_TIMEOUT}s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            deadline=$((SECONDS + 10))
            while pid_of "$file" "$name" >/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
        fi
        log "stopped $name (pid $pid)"
    else
        log "stale pid file removed: $file"
    fi
    rm -f "$file"
}

[[ $EUID -eq 0 ]] || { echo "[slurm-down] ERROR: must run as root" >&2; exit 1; }

# Cancel the cluster's jobs first, so no job keeps running (its slurmstepd would outlive slurmd).
if pid_of "$RUN/slurmctld.pid" slurmctld >/dev/null && command -v squeue >/dev/null; then
    jobs=$(squeue -h -o %A 2>/dev/null | sort -u | paste -sd' ' -) || jobs=
    if [[ -n $jobs ]]; then
        log "cancelling jobs: $jobs"
        # shellcheck disable=SC2086  # word splitting of the job list is intended
        scancel $jobs 2>/dev/null || true
        deadline=$((SECONDS + 30))
        while [[ -n $(squeue -h -o %A 2>/dev/null) ]] && ((SECONDS < deadline)); do sleep 0.2; done
    fi
fi

shopt -s nullglob
for f in "$RUN"/slurmd-*.pid; do stop "$f" slurmd; done
stop "$RUN/slurmctld.pid" slurmctld
stop "$RUN/slurmdbd.pid" slurmdbd
stop "$DB_DIR/mysqld.pid" mariadbd
stop "$MUNGE_DIR/munged.pid" munged

if [[ ${PURGE:-0} == 1 ]]; then
    case $SLURM_CI_DIR in
        "" | / | /var | /var/tmp | /tmp) echo "[slurm-down] ERROR: refusing to purge '$SLURM_CI_DIR'" >&2; exit 1 ;;
    esac
    rm -rf "$SLURM_CI_DIR"
    log "purged $SLURM_CI_DIR"
fi
log "down"
