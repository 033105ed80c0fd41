# Sourced by the CI scripts: reading the pid files of the daemons they start.
# shellcheck shell=bash

# pid_of PIDFILE NAME: print the pid in PIDFILE if it is a live (not zombie) process named NAME.
# Checking the name guards against a stale pid file whose pid was reused by something else.
# (cat, not $(<file): a daemon deletes its pid file as it exits, and a failed $(<file) ends a
# set -e script even inside if/while.)
pid_of() {
    local pid stat
    [[ -r $1 ]] || return 1
    pid=$(cat "$1" 2>/dev/null) || return 1
    pid=${pid//[!0-9]/}
    [[ -n $pid && -r /proc/$pid/stat ]] || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$2" ]] || return 1
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]] || return 1
    echo "$pid"
}

# alive PIDFILE NAME: the same test, quietly.
alive() { pid_of "$@" >/dev/null; }
