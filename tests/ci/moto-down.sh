#!/usr/bin/env bash
# Stop the moto_server that tests/ci/moto-up.sh started, through its pid file, and wait for it to
# exit. A pid file whose process is not a moto_server (stale, reused pid) is only removed.
#
#   [MOTO_PORT=5055] [MOTO_CI_DIR=/var/tmp/jobgen-moto] bash tests/ci/moto-down.sh
set -euo pipefail

MOTO_PORT=${MOTO_PORT:-5055}
MOTO_CI_DIR=${MOTO_CI_DIR:-/var/tmp/jobgen-moto}
STOP_TIMEOUT=${STOP_TIMEOUT:-15}
PIDFILE=$MOTO_CI_DIR/moto_server-$MOTO_PORT.pid

log() { printf '[moto-down] %s\n' "$*"; }

# pid_alive PID: a live (not zombie) moto_server process.
pid_alive() {
    local stat
    [[ -r /proc/$1/cmdline ]] || return 1
    tr '\0' ' ' <"/proc/$1/cmdline" | grep moto_server >/dev/null || return 1
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

if [[ ! -e $PIDFILE ]]; then
    log "not running (no $PIDFILE)"
    exit 0
fi
pid=$(cat "$PIDFILE" 2>/dev/null) || pid=""
pid=${pid//[!0-9]/}
if [[ -n $pid ]] && pid_alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + STOP_TIMEOUT))
    while pid_alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    if pid_alive "$pid"; then
        log "moto_server (pid $pid) still running after ${STOP_TIMEOUT}s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        deadline=$((SECONDS + 10))
        while pid_alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    fi
    log "stopped moto_server (pid $pid)"
else
    log "stale pid file removed: $PIDFILE"
fi
rm -f "$PIDFILE"
