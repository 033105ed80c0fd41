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

# ---- the job's settings (the node contract, from the job definition's environment) -------------
# The two-pass flow itself is payload/common/job_flow.sh, shared with every other executor.
[ $# -ge 2 ] || fail "usage: entrypoint.sh LAUNCHER COMPILE_ARGC COMPILE_ARG... TRAIN_ARG..."
export JOBGEN_LAUNCHER=$1
shift
flow=${JOBGEN_PAYLOAD_DIR:-}/common/job_flow.sh
[ -f "$flow" ] || fail "no $flow (is payload/ in the image at JOBGEN_PAYLOAD_DIR?)"
# shellcheck disable=SC1090  # payload/common/job_flow.sh, checked on its own
source "$flow"
# shellcheck disable=SC2034  # both read by job_flow.sh
FLOW_WHO="jobgen[batch node $node_index]" FLOW_CONTRACT_FROM="the job definition"
flow_init || exit "$?"
if [ -n "${JOBGEN_NODES:-}" ] && [ "$JOBGEN_NODES" != "$num_nodes" ]; then
  # The trainer's flags (data-parallel degree, batch arithmetic, Neuron graphs) were computed for
  # JOBGEN_NODES nodes; a different count would train something else or hang.
  fail "this job definition was rendered for $JOBGEN_NODES nodes but the job has $num_nodes (a numNodes override?); render it again with --nodes $num_nodes"
fi
compile_argc=${1:-}
if ! flow_is_count "$compile_argc" || [ "$compile_argc" -gt $(($# - 1)) ]; then
  fail "COMPILE_ARGC '$compile_argc' is not a count of the $(($# - 1)) trainer arguments that follow it"
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
export JOBGEN_LOG_DIR="$JOBGEN_RUN_DIR/logs/$job_id/attempt-$attempt"
say "job $job_id attempt $attempt: node $node_index of $num_nodes (torchrun node rank $node_rank), $role, port $MASTER_PORT, rendezvous timeout ${JOBGEN_RDZV_TIMEOUT:-torch default} s, logs in $JOBGEN_LOG_DIR"

# ---- the two passes ---------------------------------------------------------------------------
# On every node: files and prepare (each container has its own root), the compile pass
# unless the marker says it is done (the main node writes the marker), then the training pass.
# JOBGEN_SHARED_FS comes from the job definition: 1 where the site's run folder is on the volume
# every node mounts (one rank then seals each checkpoint), else each node keeps its own disk.
[ "${JOBGEN_SHARED_FS:-}" = 1 ] || JOBGEN_SHARED_FS=0
export JOBGEN_IS_MAIN=$is_main JOBGEN_SETUP_ON=every JOBGEN_SHARED_FS
flow_node "$@"
exit "$?"
