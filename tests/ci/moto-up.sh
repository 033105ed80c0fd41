#!/usr/bin/env bash
# Start moto's server on 127.0.0.1:$MOTO_PORT in the background as the AWS Batch endpoint for the
# tests, wait until it answers, and switch its Batch backend to "no Docker": jobs are accepted and
# go straight to SUCCEEDED, as no container runs (this machine has no Docker daemon).
#
#   [MOTO_PORT=5055] [MOTO_CI_DIR=/var/tmp/jobgen-moto] [VENV=.venv] bash tests/ci/moto-up.sh
#
# moto_server is taken from PATH, else from the project's venv ($VENV, default .venv).
# Idempotent: if our server is already up it only re-applies the config. Stop: moto-down.sh.
set -euo pipefail

MOTO_PORT=${MOTO_PORT:-5055}
MOTO_CI_DIR=${MOTO_CI_DIR:-/var/tmp/jobgen-moto}
UP_TIMEOUT=${UP_TIMEOUT:-60}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VENV=${VENV:-.venv}
[[ $VENV == /* ]] || VENV=$REPO/$VENV
PIDFILE=$MOTO_CI_DIR/moto_server-$MOTO_PORT.pid
LOGFILE=$MOTO_CI_DIR/moto_server-$MOTO_PORT.log
URL=http://127.0.0.1:$MOTO_PORT

log() { printf '[moto-up] %s\n' "$*"; }
die() { printf '[moto-up] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $MOTO_PORT =~ ^[0-9]+$ ]] || die "MOTO_PORT must be a port number, got '$MOTO_PORT'"

moto_server=$(command -v moto_server || true)
[[ -n $moto_server ]] || moto_server=$VENV/bin/moto_server
[[ -x $moto_server ]] || die "moto_server not found on PATH nor in $VENV (pip install 'moto[server,batch]')"
# The Python next to moto_server has the standard library we need for the HTTP calls below.
py=$(dirname "$moto_server")/python
[[ -x $py ]] || py=python3

# ours_alive: the pid file names a live moto_server process (not a reused pid, not a zombie).
# (cat, not $(<file): a daemon deletes its pid file as it exits, and a failed $(<file) ends a
# set -e script even inside if/while.)
ours_alive() {
    local pid stat
    [[ -r $PIDFILE ]] || return 1
    pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
    pid=${pid//[!0-9]/}
    [[ -n $pid && -r /proc/$pid/cmdline ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep moto_server >/dev/null || return 1
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

# http METHOD PATH [JSON]: one request to the server; fails unless it answers 2xx.
http() {
    "$py" - "$1" "$URL$2" "${3:-}" <<'EOF'
import sys, urllib.request
method, url, body = sys.argv[1], sys.argv[2], sys.argv[3]
req = urllib.request.Request(url, method=method, data=body.encode() if body else None,
                             headers={"Content-Type": "application/json"} if body else {})
with urllib.request.urlopen(req, timeout=5) as r:
    sys.stdout.write(r.read().decode())
EOF
}

configure() {
    http POST /moto-api/config '{"batch": {"use_docker": false}}' >/dev/null ||
        die "could not configure moto at $URL"
    log "Batch backend set to use_docker=false"
}

t0=$EPOCHREALTIME
if ours_alive && http GET /moto-api/config >/dev/null 2>&1; then
    log "already up at $URL (pid $(cat "$PIDFILE"))"
    configure
    exit 0
fi
if [[ -e $PIDFILE ]] && ! ours_alive; then rm -f "$PIDFILE"; fi
if ours_alive; then
    log "our moto_server (pid $(cat "$PIDFILE")) does not answer: restarting it"
    MOTO_PORT=$MOTO_PORT MOTO_CI_DIR=$MOTO_CI_DIR bash "$HERE/moto-down.sh"
fi
# Something else on the port would answer our requests instead of our server.
if (exec 3<>"/dev/tcp/127.0.0.1/$MOTO_PORT") 2>/dev/null; then
    die "port $MOTO_PORT is already in use by another process (set MOTO_PORT)"
fi

mkdir -p "$MOTO_CI_DIR"
# nohup + no stdio: the server outlives this script and holds no pipe of its caller open.
nohup "$moto_server" -H 127.0.0.1 -p "$MOTO_PORT" </dev/null >>"$LOGFILE" 2>&1 &
echo $! >"$PIDFILE"

deadline=$((SECONDS + UP_TIMEOUT))
until http GET /moto-api/config >/dev/null 2>&1; do
    if ! ours_alive || ((SECONDS >= deadline)); then
        tail -n 30 "$LOGFILE" >&2 || true
        die "moto_server did not answer at $URL"
    fi
    sleep 0.2
done
configure
log "up at $URL (pid $(cat "$PIDFILE")) in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s; log $LOGFILE"
