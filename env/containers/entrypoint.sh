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
#   2. runs the job's two-pass flow on this node (payload/common/job_flow.sh, the same flow every
#      executor runs): files and prepare command (every node: Batch nodes do not share a
#      filesystem unless the site mounts one), the compile pass unless the cache marker says it
#      is done (the main node writes the marker), then the training pass, each as one torchrun
#      per node (the main node is torchrun's node rank 0; with mainNode 0 the rank is the node
#      index). Nodes wait for each other at most $JOBGEN_RDZV_TIMEOUT seconds.
#   3. exits with the status of the last pass it ran: on the main node that ends the Batch job
#      (Batch then stops the children); a failed compile pass skips the training pass.
#   4. on the main node, watches the children (payload/common/node_watch.py): a child lost
#      mid-job ends the attempt with status 69, which the definition's retry strategy retries
#      (Batch itself acts only on the main node's exit).
# SIGTERM/SIGINT are passed on to the running pass; during training SIGTERM (Batch's terminate or
# time-out, SIGKILL 30 s later) becomes the trainers' stop signal: they save and stop. A job whose
# node count differs from the one the definition was rendered for ($JOBGEN_NODES) is refused.
#
# Everything the script itself says is on stderr, prefixed "jobgen[batch node N]:".
# shellcheck source-path=SCRIPTDIR source-path=SCRIPTDIR/../../payload/common  # -x follows the flow
set -uo pipefail

# The two-pass flow itself is payload/common/job_flow.sh, shared with every other executor; its
# helpers (flow_say, flow_fail, flow_is_count) are this script's too.
FLOW_WHO="jobgen[batch node ${AWS_BATCH_JOB_NODE_INDEX:-?}]"
flow=${JOBGEN_PAYLOAD_DIR:-}/common/job_flow.sh
if [ ! -f "$flow" ]; then
  printf '%s: no %s (is payload/ in the image at JOBGEN_PAYLOAD_DIR?)\n' "$FLOW_WHO" "$flow" >&2
  exit 1
fi
# shellcheck source=../../payload/common/job_flow.sh
source "$flow"

# ---- the node's place in the job -------------------------------------------------------------
for var in AWS_BATCH_JOB_NODE_INDEX AWS_BATCH_JOB_MAIN_NODE_INDEX AWS_BATCH_JOB_NUM_NODES; do
  if [ -z "${!var:-}" ]; then
    flow_fail "$var is not set: this entrypoint runs as a node of an AWS Batch multi-node parallel job (type multinode); for a local rehearsal set AWS_BATCH_JOB_NODE_INDEX, AWS_BATCH_JOB_MAIN_NODE_INDEX and AWS_BATCH_JOB_NUM_NODES yourself"
  fi
  flow_is_count "${!var}" || flow_fail "$var='${!var}' is not a non-negative integer"
done
node_index=$((10#$AWS_BATCH_JOB_NODE_INDEX))
FLOW_WHO="jobgen[batch node $node_index]" FLOW_CONTRACT_FROM="the job definition"
main_index=$((10#$AWS_BATCH_JOB_MAIN_NODE_INDEX))
num_nodes=$((10#$AWS_BATCH_JOB_NUM_NODES))
if [ "$num_nodes" -lt 1 ] || [ "$node_index" -ge "$num_nodes" ] || [ "$main_index" -ge "$num_nodes" ]; then
  flow_fail "inconsistent AWS Batch variables: node $node_index, main node $main_index, $num_nodes nodes"
fi
is_main=0
[ "$node_index" -eq "$main_index" ] && is_main=1
# torchrun's node rank 0 hosts the rendezvous at MASTER_ADDR, so the main node gets rank 0. With
# mainNode 0 (what jobgen renders) the rank is the node index.
node_rank=$(((node_index - main_index + num_nodes) % num_nodes))

# ---- the job's settings (the node contract, from the job definition's environment) -------------
[ $# -ge 2 ] || flow_fail "usage: entrypoint.sh LAUNCHER COMPILE_ARGC COMPILE_ARG... TRAIN_ARG..."
export JOBGEN_LAUNCHER=$1
shift
flow_init || exit "$?"
if [ -n "${JOBGEN_NODES:-}" ] && [ "$JOBGEN_NODES" != "$num_nodes" ]; then
  # The trainer's flags (data-parallel degree, batch arithmetic, Neuron graphs) were computed for
  # JOBGEN_NODES nodes; a different count would train something else or hang.
  flow_fail "this job definition was rendered for $JOBGEN_NODES nodes but the job has $num_nodes (a numNodes override?); render it again with --nodes $num_nodes"
fi
compile_argc=${1:-}
if ! flow_is_count "$compile_argc" || [ "$compile_argc" -gt $(($# - 1)) ]; then
  flow_fail "COMPILE_ARGC '$compile_argc' is not a count of the $(($# - 1)) trainer arguments that follow it"
fi

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
  found=$(own_address) || flow_fail "cannot find this node's own IPv4 address (no IPv4 address on interface ${JOBGEN_NET_IFACE:-eth0}, nothing from 'hostname -i'); set JOBGEN_NET_IFACE to the interface the other nodes reach"
  MASTER_ADDR=${found%% *}
  role="main node, address $MASTER_ADDR (${found#* })"
else
  MASTER_ADDR=${AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS:-}
  [ -n "$MASTER_ADDR" ] || flow_fail "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is not set or empty: a child node (index $node_index, main $main_index) cannot find the main node"
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
  flow_say "AWS_BATCH_JOB_ID is not set; logs go under logs/$job_id"
fi
attempt=${AWS_BATCH_JOB_ATTEMPT:-1}
flow_is_count "$attempt" || attempt=1
export JOBGEN_LOG_DIR="$JOBGEN_RUN_DIR/logs/$job_id/attempt-$attempt"
# When this attempt began on the main node (`jobgen report` starts the allocation there).
if [ "$is_main" -eq 1 ] && mkdir -p "$JOBGEN_LOG_DIR" 2>/dev/null; then
  printf 'launch %s\n' "$(flow_now)" >>"$JOBGEN_LOG_DIR/allocation.times" 2>/dev/null || true
fi
flow_say "job $job_id attempt $attempt: node $node_index of $num_nodes (torchrun node rank $node_rank), $role, port $MASTER_PORT, rendezvous timeout ${JOBGEN_RDZV_TIMEOUT:-torch default} s, logs in $JOBGEN_LOG_DIR"

# ---- the two passes ---------------------------------------------------------------------------
# On every node: files and prepare (each container has its own root), the compile pass
# unless the marker says it is done (the main node writes the marker), then the training pass.
# JOBGEN_SHARED_FS comes from the job definition: 1 where the site's run folder is on the volume
# every node mounts (one rank then seals each checkpoint), else each node keeps its own disk.
[ "${JOBGEN_SHARED_FS:-}" = 1 ] || JOBGEN_SHARED_FS=0
export JOBGEN_IS_MAIN=$is_main JOBGEN_SETUP_ON=every JOBGEN_SHARED_FS

# ---- the children's liveness (payload/common/node_watch.py) -----------------------------------
# Batch ends the job only when the main node exits: a child that dies ends nothing by itself, and
# the main node's ranks would wait in their collectives. Each child tells the main node's watcher
# (port MASTER_PORT + 1) that it lives; a child that goes silent for JOBGEN_NODE_SILENCE seconds,
# or whose container goes without a goodbye, is lost: the main node stops its pass and exits with
# status 69, which the job definition's retry strategy retries (an infrastructure failure, not
# the training's). A child whose flow fails ends the main node's attempt with the child's status.
node_lost_status=69
watch_port=$((MASTER_PORT + 1))
watch_record="$JOBGEN_LOG_DIR/node-lost"
watch_tool="$JOBGEN_PAYLOAD_DIR/common/node_watch.py"
watch_pid=""
lost=""
# shellcheck disable=SC2329  # invoked through the USR2 trap
on_node_lost() {
  [ -z "$lost" ] || return 0
  { read -r lost <"$watch_record"; } 2>/dev/null || lost="? lost 0 (no record)"
  case $FLOW_STOPPING in
    TERM | INT)   # this node is saving and stopping on the service's signal: let it finish
      flow_say "the watcher reported node ${lost%% *}, but this node is stopping on SIG$FLOW_STOPPING; letting it save"
      return 0 ;;
  esac
  FLOW_STOPPING=USR2    # the flow starts no further pass
  if [ -n "${FLOW_PASS_PID:-}" ]; then
    flow_say "stopping the $FLOW_PASS pass: its ranks cannot go on without node ${lost%% *}"
    # shellcheck disable=SC2046  # a list of process ids
    kill -KILL $(flow_tree "$FLOW_PASS_PID") 2>/dev/null
  fi
}
if [ -n "${JOBGEN_NODE_SILENCE:-}" ] && [ "$num_nodes" -gt 1 ]; then
  if [ "$is_main" -eq 1 ]; then
    rm -f "$watch_record"
    trap on_node_lost USR2
    "$FLOW_PYTHON" "$watch_tool" serve "$watch_port" "$num_nodes" "$JOBGEN_NODE_SILENCE" "$$" "$watch_record" &
  else
    "$FLOW_PYTHON" "$watch_tool" beat "$MASTER_ADDR" "$watch_port" "$node_rank" &
  fi
  watch_pid=$!
fi

flow_node "$@"
status=$?
stopping=0   # on the service's signal (a terminate, a time-out): this node's own status stands
case $FLOW_STOPPING in TERM | INT) stopping=1 ;; esac
if [ -n "$watch_pid" ] && [ "$is_main" -eq 0 ]; then
  "$FLOW_PYTHON" "$watch_tool" bye "$MASTER_ADDR" "$watch_port" "$node_rank" "$status"
elif [ -n "$watch_pid" ] && [ "$status" -ne 0 ] && [ -z "$lost" ] && [ "$stopping" -eq 0 ]; then
  # A peer's death often reaches this node's ranks (a reset connection) a moment before the
  # watcher hears of it: give the watcher a few seconds to say which it was.
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    if [ -n "$lost" ] || [ -s "$watch_record" ] || ! kill -0 "$watch_pid" 2>/dev/null; then break; fi
    sleep 0.5
  done
  [ -n "$lost" ] || { read -r lost <"$watch_record"; } 2>/dev/null || lost=""
fi
[ -z "$watch_pid" ] || kill "$watch_pid" 2>/dev/null
if [ -n "$lost" ] && [ "$status" -ne 0 ] && [ "$stopping" -eq 0 ]; then
  read -r lost_node lost_kind lost_status _ <<<"$lost"
  if [ "$lost_kind" = failed ] && flow_is_count "$lost_status"; then
    flow_say "node $lost_node's flow failed with status $lost_status; this attempt ends with it"
    status=$lost_status
  else
    flow_say "node $lost_node was lost; this attempt ends with status $node_lost_status, which the job's retry strategy retries"
    status=$node_lost_status
  fi
fi
exit "$status"
