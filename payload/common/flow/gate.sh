# shellcheck shell=bash
# The health gate (payload/common/health.py runs the checks; jobgen/job/health.py decides what is
# checked): on each node before the compile pass, or once per allocation by the Slurm controller,
# which requeues without a bad node (requeue.sh). Needs base.sh and requeue.sh.

# flow_health_gate IS_MAIN SHARED: this node's checks before the compile pass. On shared storage
# every node then waits for the others' reports, so that none starts a compile pass that waits
# for a node that is not coming; the main node runs the collective test, when there is one.
# Returns 0, 75 (a bad node), 78 (every node failed alike: a setting) or 1.
flow_health_gate() {
  [ -n "${JOBGEN_HEALTH:-}" ] && [ "${JOBGEN_HEALTH_DONE:-}" != 1 ] || return 0
  local health="$JOBGEN_PAYLOAD_DIR/common/health.py" status
  FLOW_WHO=$FLOW_WHO "$FLOW_PYTHON" "$health" node
  status=$?
  if [ "$2" = 1 ]; then
    FLOW_WHO=$FLOW_WHO "$FLOW_PYTHON" "$health" wait
    status=$?
  fi
  [ "$status" -eq 0 ] || return "$status"
  if [ "$1" = 1 ]; then FLOW_WHO=$FLOW_WHO "$FLOW_PYTHON" "$health" collective || return 1; fi
  return 0
}

# flow_slurm_health FILE: the Slurm controller's gate: one step of the node checks on every node,
# then the verdict. Bad nodes: requeue without them (FILE counts these requeues, which are not
# failures) and end this script. Returns 0 (go on) or the status to end the job with.
flow_slurm_health() {
  [ -n "${JOBGEN_HEALTH:-}" ] || return 0
  local file=$1 requeues bad status health="$JOBGEN_PAYLOAD_DIR/common/health.py"
  requeues=$(flow_count "$file")
  flow_say "health gate on $SLURM_JOB_NUM_NODES nodes ($SLURM_JOB_NODELIST)"
  # shellcheck disable=SC2016  # expanded by the node's bash, not here
  srun --kill-on-bad-exit=0 --ntasks-per-node=1 bash -c \
    'trap "" USR1; export JOBGEN_NODE_RANK=$SLURM_NODEID JOBGEN_NNODES=$SLURM_NNODES JOBGEN_IS_MAIN=$((SLURM_NODEID == 0)) FLOW_WHO="jobgen[node $SLURM_NODEID]"; exec bash "$0" health' \
    "$JOBGEN_PAYLOAD_DIR/common/job_flow.sh"
  bad=$(JOBGEN_NNODES=$SLURM_JOB_NUM_NODES "$FLOW_PYTHON" "$health" verdict --requeues "$requeues")
  status=$?
  case $status in
    0)
      JOBGEN_NNODES=$SLURM_JOB_NUM_NODES "$FLOW_PYTHON" "$health" collective || return 1
      # Bad nodes that spare nodes cover (job.spare_nodes): the controller's step leaves them out.
      # shellcheck disable=SC2034  # read by flow_spare_step (slurm.sh)
      FLOW_LEFT_OUT=$bad
      flow_say "health gate passed${bad:+ without $bad (the spare nodes cover it)}" ;;
    "$FLOW_UNHEALTHY")
      printf '%s\n' "$((requeues + 1))" >"$file" || flow_say "cannot count the requeue for health in $file"
      flow_say "requeueing without $bad (requeue for health $((requeues + 1)); not counted against the ${JOBGEN_MAX_RESTARTS:-0} restarts for failures)"
      flow_requeue_excluding "$bad" || return "$FLOW_UNHEALTHY"
      exit 0 ;;
    76) return "$FLOW_UNHEALTHY" ;;
    *) return "$status" ;;
  esac
  return 0
}
