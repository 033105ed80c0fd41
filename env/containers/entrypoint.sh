#!/usr/bin/env bash
# jobgen's AWS Batch entrypoint: runs on every node of a multi-node parallel job.
#
# usage (the job definition's command, rendered by jobgen):
#   entrypoint.sh LAUNCHER COMPILE_ARGC COMPILE_ARG... TRAIN_ARG...
# LAUNCHER is a script under $JOBGEN_PAYLOAD_DIR (e.g. habana_deepspeed/launch.sh); the first
# COMPILE_ARGC arguments after it are the compile pass's trainer flags, the rest the training
# pass's.
#
# What it does, on each node:
#   1. finds its place in the job: AWS_BATCH_JOB_NODE_INDEX, AWS_BATCH_JOB_MAIN_NODE_INDEX and
#      AWS_BATCH_JOB_NUM_NODES (all required). The main node's address is its own (interface
#      $JOBGEN_NET_IFACE, default eth0), because Batch sets AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS
#      on the child nodes only; a child takes it from that variable.
#   2. writes the files of $JOBGEN_FILES_JSON under the run directory and runs the prepare command
#      of $JOBGEN_PREPARE_JSON. Every node does both: Batch nodes do not share a filesystem
#      unless the site mounts one.
#   3. runs the compile pass (JOBGEN_COMPILE_MODE: always | never | auto = unless the marker
#      $JOBGEN_COMPILE_CACHE/.jobgen/$JOBGEN_COMPILE_KEY.done exists; the main node writes the
#      marker after a successful pass), then the training pass, each as
#      `bash $JOBGEN_PAYLOAD_DIR/LAUNCHER compile|train ARGS...` (one torchrun per node; the
#      main node is torchrun's node rank 0, so with mainNode 0 the rank is the node index).
#      Nodes wait for each other at most $JOBGEN_RDZV_TIMEOUT seconds.
#   4. exits with the status of the last pass it ran: on the main node that ends the Batch job
#      (Batch then stops the children); a failed compile pass skips the training pass.
# SIGTERM/SIGINT are passed on to the running pass. A job whose node count differs from the one
# the definition was rendered for ($JOBGEN_NODES) is refused.
#
# Everything the script itself says is on stderr, prefixed "jobgen[batch node N]:".
set -uo pipefail

node_index=${AWS_BATCH_JOB_NODE_INDEX:-}
say() { printf 'jobgen[batch node %s]: %s\n' "${node_index:-?}" "$*" >&2; }
fail() {
  say "$1"
  exit "${2:-1}"
}
is_count() { case $1 in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac; }

# ---- the node's place in the job -------------------------------------------------------------
for var in AWS_BATCH_JOB_NODE_INDEX AWS_BATCH_JOB_MAIN_NODE_INDEX AWS_BATCH_JOB_NUM_NODES; do
  if [ -z "${!var:-}" ]; then
    fail "$var is not set: this entrypoint runs as a node of an AWS Batch multi-node parallel job (type multinode); for a local rehearsal set AWS_BATCH_JOB_NODE_INDEX, AWS_BATCH_JOB_MAIN_NODE_INDEX and AWS_BATCH_JOB_NUM_NODES yourself"
  fi
  is_count "${!var}" || fail "$var='${!var}' is not a non-negative integer"
done
node_index=$((10#$AWS_BATCH_JOB_NODE_INDEX))
main_index=$((10#$AWS_BATCH_JOB_MAIN_NODE_INDEX))
num_nodes=$((10#$AWS_BATCH_JOB_NUM_NODES))
if [ "$num_nodes" -lt 1 ] || [ "$node_index" -ge "$num_nodes" ] || [ "$main_index" -ge "$num_nodes" ]; then
  fail "inconsistent AWS Batch variables: node $node_index, main node $main_index, $num_nodes nodes"
fi
is_main=0
[ "$node_index" -eq "$main_index" ] && is_main=1
# torchrun's node rank 0 hosts the rendezvous at MASTER_ADDR, so the main node gets rank 0. With
# mainNode 0 (what jobgen renders) the rank is the node index.
node_rank=$(((node_index - main_index + num_nodes) % num_nodes))

# ---- the job's settings (from the job definition's environment) --------------------------------
missing=()
for var in MASTER_PORT JOBGEN_RUN_DIR JOBGEN_PAYLOAD_DIR JOBGEN_WORKERS_PER_NODE JOBGEN_WORKDIR \
  JOBGEN_PROGRAM JOBGEN_COMPILE_CACHE JOBGEN_COMPILE_KEY; do
  [ -n "${!var:-}" ] || missing+=("$var")
done
if [ "${#missing[@]}" -gt 0 ]; then
  fail "not set by the job definition: ${missing[*]} (register a definition rendered by jobgen)"
fi
is_count "$MASTER_PORT" || fail "MASTER_PORT='$MASTER_PORT' is not a port number"
compile_mode=${JOBGEN_COMPILE_MODE:-auto}
case $compile_mode in
  auto | always | never) ;;
  *) fail "JOBGEN_COMPILE_MODE='$compile_mode' must be auto, always or never" ;;
esac
if [ -n "${JOBGEN_RDZV_TIMEOUT:-}" ]; then
  { is_count "$JOBGEN_RDZV_TIMEOUT" && [ "$JOBGEN_RDZV_TIMEOUT" -gt 0 ]; } ||
    fail "JOBGEN_RDZV_TIMEOUT='$JOBGEN_RDZV_TIMEOUT' must be a positive number of seconds"
fi
if [ -n "${JOBGEN_NODES:-}" ] && [ "$JOBGEN_NODES" != "$num_nodes" ]; then
  # The trainer's flags (data-parallel degree, batch arithmetic, Neuron graphs) were computed for
  # JOBGEN_NODES nodes; a different count would train something else or hang.
  fail "this job definition was rendered for $JOBGEN_NODES nodes but the job has $num_nodes (a numNodes override?); render it again with --nodes $num_nodes"
fi

# ---- arguments ---------------------------------------------------------------------------------
[ $# -ge 2 ] || fail "usage: entrypoint.sh LAUNCHER COMPILE_ARGC COMPILE_ARG... TRAIN_ARG..."
launcher=$1
compile_argc=$2
shift 2
if ! is_count "$compile_argc" || [ "$compile_argc" -gt $# ]; then
  fail "COMPILE_ARGC '$compile_argc' is not a count of the $# trainer arguments that follow it"
fi
compile_args=("${@:1:compile_argc}")
train_args=("${@:compile_argc+1}")

# Relative paths are taken from the container's working directory.
absolute() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s/%s\n' "$PWD" "$1" ;; esac; }
RUN_DIR=$(absolute "$JOBGEN_RUN_DIR")
PAYLOAD_DIR=$(absolute "$JOBGEN_PAYLOAD_DIR")
COMPILE_CACHE=$(absolute "$JOBGEN_COMPILE_CACHE")
export JOBGEN_RUN_DIR=$RUN_DIR JOBGEN_PAYLOAD_DIR=$PAYLOAD_DIR JOBGEN_COMPILE_CACHE=$COMPILE_CACHE
PYTHON=${JOBGEN_PYTHON:-python3}
[ -f "$PAYLOAD_DIR/$launcher" ] || fail "no launcher $PAYLOAD_DIR/$launcher (is payload/ in the image at JOBGEN_PAYLOAD_DIR?)"

# ---- addresses ---------------------------------------------------------------------------------
own_address() {
  local iface=${JOBGEN_NET_IFACE:-eth0} addr=""
  if command -v ip >/dev/null 2>&1; then
    addr=$(ip -o -4 addr show dev "$iface" 2>/dev/null | awk '{ split($4, a, "/"); print a[1]; exit }')
    [ -n "$addr" ] && { printf '%s %s\n' "$addr" "interface $iface"; return 0; }
  fi
  addr=$(hostname -i 2>/dev/null | awk '{ print $1 }')
  [ -n "$addr" ] && { printf '%s %s\n' "$addr" "hostname -i, no IPv4 address on $iface"; return 0; }
  return 1
}
if [ "$is_main" -eq 1 ]; then
  found=$(own_address) || fail "cannot find this node's own IPv4 address (no IPv4 address on interface ${JOBGEN_NET_IFACE:-eth0}, nothing from 'hostname -i'); set JOBGEN_NET_IFACE to the interface the other nodes reach"
  MASTER_ADDR=${found%% *}
  role="main node, address $MASTER_ADDR (${found#* })"
else
  MASTER_ADDR=${AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS:-}
  [ -n "$MASTER_ADDR" ] || fail "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is not set or empty: a child node (index $node_index, main $main_index) cannot find the main node"
  role="child node, main node at $MASTER_ADDR"
fi
export MASTER_ADDR MASTER_PORT
export JOBGEN_NODE_RANK=$node_rank JOBGEN_NNODES=$num_nodes

# ---- logs --------------------------------------------------------------------------------------
job_id=${AWS_BATCH_JOB_ID:-}
job_id=${job_id%%#*}       # "<id>#<node>" on the nodes of a multi-node job
job_id=${job_id//\//_}
if [ -z "$job_id" ]; then
  job_id=no-job-id
  say "AWS_BATCH_JOB_ID is not set; logs go under logs/$job_id"
fi
attempt=${AWS_BATCH_JOB_ATTEMPT:-1}
is_count "$attempt" || attempt=1
export JOBGEN_LOG_DIR="$RUN_DIR/logs/$job_id/attempt-$attempt"
mkdir -p "$JOBGEN_LOG_DIR" "$COMPILE_CACHE" || fail "cannot create $JOBGEN_LOG_DIR and $COMPILE_CACHE"
say "job $job_id attempt $attempt: node $node_index of $num_nodes (torchrun node rank $node_rank), $role, port $MASTER_PORT, rendezvous timeout ${JOBGEN_RDZV_TIMEOUT:-torch default} s, logs in $JOBGEN_LOG_DIR"

# ---- passes, with TERM/INT forwarded --------------------------------------------------------------
# Each pass runs in a session of its own, so that a stop request (Batch sends SIGTERM on
# terminate, timeout and when the main node has exited) reaches torchrun and its workers too.
pass_pid=""
stopping=""
# shellcheck disable=SC2329  # invoked through the traps below
on_signal() {
  stopping=$1
  say "received SIG$1; stopping the running pass"
  if [ -n "$pass_pid" ]; then
    kill -TERM -- "-$pass_pid" 2>/dev/null || kill -TERM "$pass_pid" 2>/dev/null
  fi
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

# run_pass PASS ARGS...: the launcher for one pass; returns its status.
run_pass() {
  local pass=$1 status
  shift
  local log="$JOBGEN_LOG_DIR/node-$node_rank/$pass.log" before=0
  [ -f "$log" ] && before=$(wc -c <"$log")
  if command -v setsid >/dev/null 2>&1; then
    setsid -w bash "$PAYLOAD_DIR/$launcher" "$pass" "$@" &
  else
    bash "$PAYLOAD_DIR/$launcher" "$pass" "$@" &
  fi
  pass_pid=$!
  wait "$pass_pid"
  status=$?
  # A trapped signal interrupts `wait`; wait again for the pass's own status.
  while kill -0 "$pass_pid" 2>/dev/null; do
    wait "$pass_pid"
    status=$?
  done
  pass_pid=""
  if [ "$status" -ne 0 ] && [ -f "$log" ] &&
    tail -c "+$((before + 1))" "$log" |
    grep -qE 'waiting for clients|client socket has timed out|torchelastic/(role_info|assigned_ranks)'; then
    say "the $pass pass could not bring the $num_nodes nodes together within ${JOBGEN_RDZV_TIMEOUT:-torch default} s at $MASTER_ADDR:$MASTER_PORT: a node never started, died, or cannot reach that address (security group, interface), or the nodes disagree about the compile pass"
  fi
  return "$status"
}

# ---- files and preparation (every node) ----------------------------------------------------------
if [ -n "${JOBGEN_FILES_JSON:-}" ]; then
  written=$("$PYTHON" "$PAYLOAD_DIR/common/batch_setup.py" write-files "$RUN_DIR") ||
    fail "could not write the job's files under $RUN_DIR (JOBGEN_FILES_JSON)"
  while IFS= read -r path; do [ -z "$path" ] || say "wrote $path"; done <<<"$written"
fi
if [ -n "${JOBGEN_PREPARE_JSON:-}" ]; then
  argv_file=$(mktemp) || fail "cannot create a temporary file"
  if ! "$PYTHON" "$PAYLOAD_DIR/common/batch_setup.py" argv JOBGEN_PREPARE_JSON >"$argv_file"; then
    rm -f "$argv_file"
    fail "JOBGEN_PREPARE_JSON is not a JSON list of strings"
  fi
  # NUL-separated; `mapfile -d` needs bash 4.4, this loop works on 4.2 as well.
  prepare=()
  while IFS= read -r -d '' item; do prepare+=("$item"); done <"$argv_file"
  rm -f "$argv_file"
  say "preparing: ${prepare[*]}"
  "$PYTHON" "$PAYLOAD_DIR/${prepare[0]}" "${prepare[@]:1}"
  status=$?
  [ "$status" -eq 0 ] || fail "the prepare step failed with status $status; no pass started" "$status"
fi
[ -z "$stopping" ] || fail "stopped (SIG$stopping) before the compile pass" 143

# ---- compile pass ------------------------------------------------------------------------------
marker="$COMPILE_CACHE/.jobgen/$JOBGEN_COMPILE_KEY.done"
case $compile_mode in
  always) run_compile=1 ;;
  never) run_compile=0 ;;
  *) if [ -e "$marker" ]; then run_compile=0; else run_compile=1; fi ;;
esac
if [ "$run_compile" -eq 1 ]; then
  say "compile pass (${#compile_args[@]} trainer arguments) on $num_nodes nodes"
  run_pass compile ${compile_args[@]+"${compile_args[@]}"}
  status=$?
  if [ "$status" -ne 0 ]; then
    fail "compile pass failed with status $status; the training pass is skipped" "$status"
  fi
  [ -z "$stopping" ] || fail "stopped (SIG$stopping) after the compile pass" 143
  if [ "$is_main" -eq 1 ]; then
    # Written to a private name and renamed, so that no node ever sees half a marker.
    if mkdir -p "${marker%/*}" && date -u +%FT%TZ >"$marker.$$.tmp" && mv -f "$marker.$$.tmp" "$marker"; then
      say "compile cache marker written: $marker"
    else
      rm -f "$marker.$$.tmp"
      say "could not write the compile cache marker $marker; the next job compiles again"
    fi
  fi
else
  say "compile pass skipped (compile mode $compile_mode; cache marker ${marker##*/})"
fi

# ---- training pass -----------------------------------------------------------------------------
say "training pass on $num_nodes nodes"
run_pass train ${train_args[@]+"${train_args[@]}"}
status=$?
if [ "$status" -eq 0 ]; then
  say "training pass finished"
else
  say "training pass failed with status $status"
fi
exit "$status"
