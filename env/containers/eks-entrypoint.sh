#!/usr/bin/env bash
# jobgen's Kubernetes entrypoint: the command of every pod of a JobSet rendered by
# `jobgen render --backend eks` (one pod per node).
#
# usage: eks-entrypoint.sh LAUNCHER COMPILE_ARGC COMPILE_ARG... TRAIN_ARG...
#
# On each pod:
#   1. finds its place in the job: JOB_COMPLETION_INDEX (Kubernetes sets it from the pod's
#      completion index in the child Job); the node count is the one rendered (JOBGEN_NNODES);
#      the main node is pod 0, reached by its host name under JobSet's headless Service
#      (JOBGEN_MAIN_HOST);
#   2. takes its attempt from the engine: JOBGEN_RESTART_ATTEMPT is JobSet's restart-attempt
#      label (the downward API), the same on every pod of one attempt, so all of them log to
#      logs/$JOBGEN_K8S_JOB/attempt-N (N = the label + 1) and the health gate meets there, even
#      where a pod of an earlier attempt never ran. Past JOBGEN_RESTART_LIMIT (job.max_restarts
#      and the site's eks.max_disruptions) the pod ends the job (78): uncounted restarts are
#      bounded;
#   3. runs the two-pass flow (payload/common/job_flow.sh): on a shared FSx claim the main pod
#      writes the run's files; the training pass reads the compile cache from the node's own
#      disk (JOBGEN_LOCAL_COMPILE_CACHE, a hostPath). JobSet restarts every pod when one fails;
#   4. exits with the last pass's status.
# shellcheck source-path=SCRIPTDIR source-path=SCRIPTDIR/../../payload/common  # -x follows the flow
set -uo pipefail

# The two-pass flow (payload/common/job_flow.sh); its helpers (flow_say, flow_fail) are this
# script's too.
index=${JOB_COMPLETION_INDEX:-}
FLOW_WHO="jobgen[eks pod ${index:-?}]" FLOW_CONTRACT_FROM="the pod's environment"
flow=${JOBGEN_PAYLOAD_DIR:-}/common/job_flow.sh
if [ ! -f "$flow" ]; then
  printf '%s: no %s (is payload/ in the image at JOBGEN_PAYLOAD_DIR?)\n' "$FLOW_WHO" "$flow" >&2
  exit 1
fi
# shellcheck source=../../payload/common/job_flow.sh
source "$flow"

flow_is_count "$index" || flow_fail "JOB_COMPLETION_INDEX is not a pod index: '$index'" "$FLOW_CONFIG_ERROR"
attempt=${JOBGEN_RESTART_ATTEMPT:-}
flow_is_count "$attempt" ||
  flow_fail "JOBGEN_RESTART_ATTEMPT is not a restart attempt: '$attempt' (the pod's label jobset.sigs.k8s.io/restart-attempt: is this pod a JobSet's?)" "$FLOW_CONFIG_ERROR"
limit=${JOBGEN_RESTART_LIMIT:-}
flow_is_count "$limit" || flow_fail "JOBGEN_RESTART_LIMIT is not a count: '$limit'" "$FLOW_CONFIG_ERROR"
if [ "$attempt" -gt "$limit" ]; then
  flow_fail "restart attempt $attempt is past the job's $limit (job.max_restarts and the site's eks.max_disruptions): the JobSet restarted that often, drains and evictions included; ending the job" "$FLOW_CONFIG_ERROR"
fi
[ $# -ge 2 ] || flow_fail "usage: eks-entrypoint.sh LAUNCHER COMPILE_ARGC COMPILE_ARG... TRAIN_ARG..."
export JOBGEN_LAUNCHER=$1
shift
flow_init || exit "$?"
num_nodes=${JOBGEN_NODES:?}
[ "$index" -lt "$num_nodes" ] || flow_fail "pod index $index is not below the job's $num_nodes nodes"
main=${JOBGEN_MAIN_HOST:-}
[ -n "$main" ] || flow_fail "JOBGEN_MAIN_HOST does not name the main pod"
export MASTER_ADDR=$main MASTER_PORT
export JOBGEN_NODE_RANK=$index JOBGEN_NNODES=$num_nodes
# The attempt every pod of this restart shares; the health gate counts only its reports.
export JOBGEN_ATTEMPT=$((attempt + 1))
export JOBGEN_LOG_DIR=$JOBGEN_RUN_DIR/logs/${JOBGEN_K8S_JOB:-no-job-name}/attempt-$JOBGEN_ATTEMPT
is_main=0
[ "$index" -eq 0 ] && is_main=1
export JOBGEN_IS_MAIN=$is_main
[ -n "${JOBGEN_SETUP_ON:-}" ] || export JOBGEN_SETUP_ON=every
flow_say "pod ${HOSTNAME:-?}: node $index of $num_nodes, attempt $JOBGEN_ATTEMPT (restart attempt $attempt), main node $MASTER_ADDR:$MASTER_PORT, logs in $JOBGEN_LOG_DIR"
flow_node "$@"
exit "$?"
