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
#   3. under JobSet (eks.gang: jobset, the recommended form) does nothing more: JobSet restarts
#      every pod when one fails (the pod's status and conditions tell it why), and
#      JOBGEN_GANG_EXIT is not set. Elsewhere (an Indexed Job or a PyTorchJob, whose engines
#      replace only the failed pod) restarts with its gang (JOBGEN_GANG_EXIT set, on the shared
#      claim): the pod beats a file in the attempt's gang/ folder every JOBGEN_GANG_BEAT_S and
#      watches its peers'. When a peer
#      fails (its gang/node-K.failed) or stops beating for JOBGEN_GANG_STALE_S (its node is
#      gone), this pod kills its pass (a collective with a dead peer would only time out) and
#      exits with JOBGEN_GANG_EXIT, which the pod failure policy does not count; of the pods that
#      fail by themselves, the first one's status is the job's one counted failure
#      (gang/first-failure), the others exit with JOBGEN_GANG_EXIT too, unless their status is
#      one that ends the job (75, 78). A pod that is itself stopping on SIGTERM (a time limit,
#      an eviction) is not killed and keeps its status: its pass may be saving with its peers.
#      Kubernetes then replaces every pod (restartPolicy Never,
#      or in place under a PyTorchJob's OnFailure) and the new gang resumes from the newest
#      checkpoint. What this cannot do: a drain signals only the evicted pod, whose peers save
#      with it and end as done (render says so; JobSet restarts them);
#   4. otherwise exits with the last pass's status.
# shellcheck source-path=SCRIPTDIR source-path=SCRIPTDIR/../../payload/common  # -x follows the flow
set -uo pipefail

# The two-pass flow (payload/common/job_flow.sh); its helpers (flow_say, flow_fail) are this
# script's too.
index=${JOB_COMPLETION_INDEX:-${RANK:-}}
FLOW_WHO="jobgen[eks pod ${index:-?}]" FLOW_CONTRACT_FROM="the pod's environment"
flow=${JOBGEN_PAYLOAD_DIR:-}/common/job_flow.sh
if [ ! -f "$flow" ]; then
  printf '%s: no %s (is payload/ in the image at JOBGEN_PAYLOAD_DIR?)\n' "$FLOW_WHO" "$flow" >&2
  exit 1
fi
# shellcheck source=../../payload/common/job_flow.sh
source "$flow"

# gang_watch DIR ME NODES: (in the background) beat DIR/node-ME.alive and watch the peers; on a
# peer's failure or silence, write why to DIR/node-ME.stopped and signal the pod (USR2).
gang_watch() {
  local dir=$1 me=$2 nodes=$3 peer now last why=""
  local beat=${JOBGEN_GANG_BEAT_S:-2} stale=${JOBGEN_GANG_STALE_S:-30}
  while kill -0 "$GANG_POD" 2>/dev/null; do
    touch "$dir/node-$me.alive" || true
    # The claim's clock, read off this pod's own beat: pods' clocks need not agree.
    now=$(stat -c %Y "$dir/node-$me.alive" 2>/dev/null) || now=$(date +%s)
    for ((peer = 0; peer < nodes; peer++)); do
      [ "$peer" != "$me" ] && [ ! -e "$dir/node-$peer.done" ] || continue
      if [ -e "$dir/node-$peer.failed" ]; then
        why="node $peer failed ($(cat "$dir/node-$peer.failed" 2>/dev/null))"
      elif last=$(stat -c %Y "$dir/node-$peer.alive" 2>/dev/null) && [ $((now - last)) -gt "$stale" ]; then
        why="node $peer has not beaten for $((now - last)) s (more than $stale s: its pod or node is gone)"
      fi
      if [ -n "$why" ]; then
        printf '%s\n' "$why" >"$dir/node-$me.stopped"
        kill -USR2 "$GANG_POD" 2>/dev/null
        return 0
      fi
    done
    sleep "$beat"
  done
}
# shellcheck disable=SC2329  # invoked through the USR2 trap
gang_stop() {
  # Asked to stop already (a time limit, an eviction): the pass is saving a checkpoint with its
  # peers, which a kill would lose; the pod ends when the save does.
  if [ -n "${FLOW_STOPPING:-}" ]; then
    flow_say "a peer ended while this pod stops on SIG$FLOW_STOPPING: $(cat "$gang/node-$index.stopped" 2>/dev/null)"
    return
  fi
  flow_say "stopping this pod so that the whole gang restarts: $(cat "$gang/node-$index.stopped" 2>/dev/null)"
  if [ -n "${FLOW_PASS_PID:-}" ]; then
    kill -KILL -- "-$FLOW_PASS_PID" 2>/dev/null || kill -KILL "$FLOW_PASS_PID" 2>/dev/null
  fi
  printf '%s gang\n' "$JOBGEN_GANG_EXIT" >"$JOBGEN_LOG_DIR/node-$index/job.status" 2>/dev/null
  exit "$JOBGEN_GANG_EXIT"
}
gang_start() {
  GANG_POD=$$
  trap gang_stop USR2
  gang_watch "$@" &
  GANG_WATCHER=$!
}
# gang_end DIR ME STATUS: stop watching; say how this pod ended, and make STATUS the gang's one
# counted failure if no peer failed first (else the status the failure policy ignores).
gang_end() {
  trap '' USR2
  kill "$GANG_WATCHER" 2>/dev/null
  wait "$GANG_WATCHER" 2>/dev/null
  if [ "$3" -eq 0 ]; then
    : >"$1/node-$2.done"
    return
  fi
  printf 'status %s at %s\n' "$3" "$(date -u +%FT%TZ)" >"$1/node-$2.failed"
  # (A pod told to stop keeps its status: Kubernetes ends it, not a peer's failure.)
  if ! mkdir "$1/first-failure" 2>/dev/null && [ -z "${FLOW_STOPPING:-}" ] &&
    [ "$3" != "$FLOW_UNHEALTHY" ] && [ "$3" != "$FLOW_CONFIG_ERROR" ]; then
    flow_say "failed with status $3 after a peer's failure: exiting with $JOBGEN_GANG_EXIT (not counted)"
    status=$JOBGEN_GANG_EXIT
  fi
}

case $index in
  '' | *[!0-9]*) flow_fail "neither JOB_COMPLETION_INDEX (an Indexed Job) nor RANK (a PyTorchJob) is a pod index: '$index'" ;;
esac
[ $# -ge 2 ] || flow_fail "usage: eks-entrypoint.sh LAUNCHER COMPILE_ARGC COMPILE_ARG... TRAIN_ARG..."
export JOBGEN_LAUNCHER=$1
shift
flow_init || exit "$?"
num_nodes=${JOBGEN_NODES:?}
[ "$index" -lt "$num_nodes" ] || flow_fail "pod index $index is not below the job's $num_nodes nodes"
main=${JOBGEN_MAIN_HOST:-${MASTER_ADDR:-}}
[ -n "$main" ] || flow_fail "neither JOBGEN_MAIN_HOST nor MASTER_ADDR names the main pod"
export MASTER_ADDR=$main MASTER_PORT
export JOBGEN_NODE_RANK=$index JOBGEN_NNODES=$num_nodes
JOBGEN_LOG_DIR=$(flow_next_attempt "$JOBGEN_RUN_DIR/logs/${JOBGEN_K8S_JOB:-no-job-name}" "$index")
export JOBGEN_LOG_DIR
is_main=0
[ "$index" -eq 0 ] && is_main=1
export JOBGEN_IS_MAIN=$is_main
[ -n "${JOBGEN_SETUP_ON:-}" ] || export JOBGEN_SETUP_ON=every
flow_say "pod ${HOSTNAME:-?}: node $index of $num_nodes, main node $MASTER_ADDR:$MASTER_PORT, logs in $JOBGEN_LOG_DIR"
gang=""
if [ -n "${JOBGEN_GANG_EXIT:-}" ] && [ "${JOBGEN_SHARED_FS:-}" = 1 ]; then
  gang=$JOBGEN_LOG_DIR/gang
  mkdir -p "$gang" || flow_fail "cannot create $gang on the shared claim"
  gang_start "$gang" "$index" "$num_nodes"
fi
flow_node "$@"
status=$?
[ -z "$gang" ] || gang_end "$gang" "$index" "$status"
exit "$status"
