#!/usr/bin/env bash
# jobgen's Kubernetes entrypoint: the command of every pod of a job rendered by
# `jobgen render --backend eks` (one pod per node).
#
# usage: eks-entrypoint.sh LAUNCHER COMPILE_ARGC COMPILE_ARG... TRAIN_ARG...
#
# On each pod:
#   1. finds its place in the job: JOB_COMPLETION_INDEX (an Indexed Job: Kubernetes sets it from
#      the pod's completion index) or RANK (a Kubeflow PyTorchJob: the training operator sets it,
#      0 on the master); the node count is the one rendered (JOBGEN_NNODES). The main node is
#      pod 0, reached by its stable name through the headless Service (JOBGEN_MAIN_HOST), or the
#      operator's MASTER_ADDR;
#   2. runs the two-pass flow (payload/common/job_flow.sh): on a shared FSx claim the main pod
#      writes the run's files; the training pass reads the compile cache from the node's own
#      disk (JOBGEN_LOCAL_COMPILE_CACHE, a hostPath); logs go to the run folder's
#      logs/$JOBGEN_K8S_JOB/attempt-N, N counting this pod's restarts;
#   3. exits with the last pass's status. A failed pod is restarted in place (restartPolicy
#      OnFailure) within the job's backoffLimit, and every pod then resumes from the newest
#      checkpoint.
set -uo pipefail

index=${JOB_COMPLETION_INDEX:-${RANK:-}}
who="jobgen[eks pod ${index:-?}]"
say() { printf '%s: %s\n' "$who" "$*" >&2; }
fail() {
  say "$1"
  exit "${2:-1}"
}
case $index in
  '' | *[!0-9]*) fail "neither JOB_COMPLETION_INDEX (an Indexed Job) nor RANK (a PyTorchJob) is a pod index: '$index'" ;;
esac
[ $# -ge 2 ] || fail "usage: eks-entrypoint.sh LAUNCHER COMPILE_ARGC COMPILE_ARG... TRAIN_ARG..."
export JOBGEN_LAUNCHER=$1
shift
flow=${JOBGEN_PAYLOAD_DIR:-}/common/job_flow.sh
[ -f "$flow" ] || fail "no $flow (is payload/ in the image at JOBGEN_PAYLOAD_DIR?)"
# shellcheck disable=SC1090  # payload/common/job_flow.sh, checked on its own
source "$flow"
# shellcheck disable=SC2034  # both read by job_flow.sh
FLOW_WHO=$who FLOW_CONTRACT_FROM="the pod's environment"
flow_init || exit "$?"
num_nodes=${JOBGEN_NODES:?}
[ "$index" -lt "$num_nodes" ] || fail "pod index $index is not below the job's $num_nodes nodes"
main=${JOBGEN_MAIN_HOST:-${MASTER_ADDR:-}}
[ -n "$main" ] || fail "neither JOBGEN_MAIN_HOST nor MASTER_ADDR names the main pod"
export MASTER_ADDR=$main MASTER_PORT
export JOBGEN_NODE_RANK=$index JOBGEN_NNODES=$num_nodes
JOBGEN_LOG_DIR=$(flow_next_attempt "$JOBGEN_RUN_DIR/logs/${JOBGEN_K8S_JOB:-no-job-name}" "$index")
export JOBGEN_LOG_DIR
is_main=0
[ "$index" -eq 0 ] && is_main=1
export JOBGEN_IS_MAIN=$is_main
[ -n "${JOBGEN_SETUP_ON:-}" ] || export JOBGEN_SETUP_ON=every
say "pod ${HOSTNAME:-?}: node $index of $num_nodes, main node $MASTER_ADDR:$MASTER_PORT, logs in $JOBGEN_LOG_DIR"
flow_node "$@"
exit "$?"
