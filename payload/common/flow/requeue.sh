# shellcheck shell=bash
# Requeue accounting: how many restarts after failures an allocation has used (Slurm's count
# less the requeues at the time limit and for a bad node, which are not failures), what a failure
# leads to (stop, requeue, give up), and the requeues themselves. Needs base.sh.

# flow_count FILE: the count FILE holds; 0 when it is missing or holds anything else.
flow_count() {
  local n=""
  [ -f "$1" ] && read -r n <"$1"
  flow_is_count "${n:-}" || n=0
  printf '%s\n' "$n"
}

# flow_failure_restarts DIR ALLOCATION: the restarts after failures of the job whose logs are in
# DIR, at its allocation ALLOCATION (SLURM_RESTART_COUNT: Slurm's count of requeues, ours and its
# own after a node failure), less the requeues at the time limit and those that left out a node
# the health gate found bad (counted in DIR/time-limit-requeues and DIR/health-requeues).
flow_failure_restarts() {
  local restart
  restart=$(($2 - $(flow_count "$1/time-limit-requeues") - $(flow_count "$1/health-requeues")))
  [ "$restart" -ge 0 ] || restart=0
  printf '%s\n' "$restart"
}

# flow_requeue_excluding HOSTS: requeue this Slurm job so that its next allocation leaves HOSTS
# out. Slurm takes a job's ExcNodeList only while it is pending, and a requeued job stays in
# completing until this script ends: requeue, then set the list before leaving.
flow_requeue_excluding() {
  local bad=$1 current tries=0
  current=$(scontrol show job "$SLURM_JOB_ID" -o 2>/dev/null | tr ' ' '\n' | sed -n 's/^ExcNodeList=//p' | head -n 1)
  case $current in '' | '(null)') current="" ;; esac
  trap '' TERM   # the requeue stops this script: the exclusion must be in place first
  if ! scontrol requeue "$SLURM_JOB_ID"; then
    flow_say "scontrol requeue $SLURM_JOB_ID failed; the job ends here: resubmit with --exclude $bad"
    return 1
  fi
  until scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="${current:+$current,}$bad" 2>/dev/null; do
    tries=$((tries + 1))
    if [ "$tries" -ge 40 ]; then
      flow_say "could not leave $bad out (scontrol update ExcNodeList): the requeued job may land on it again"
      return 1
    fi
    sleep 0.25
  done
  flow_say "the next allocation leaves out ${current:+$current,}$bad"
}

# flow_restart_decision STATUS FAILURES: what to do after a failure (FAILURES: the requeues for
# failures so far): prints "stop" (a configuration error: a fresh allocation would fail the same
# way), "requeue" or "give-up".
flow_restart_decision() {
  if [ "$1" -eq "$FLOW_CONFIG_ERROR" ] || [ "$1" -eq "$FLOW_UNHEALTHY" ]; then
    echo stop
  elif [ "$2" -lt "${JOBGEN_MAX_RESTARTS:-0}" ]; then
    echo requeue
  else
    echo give-up
  fi
}

# flow_finish STATUS WHAT FAILURES REQUEUE_COMMAND...: restart accounting, then exit with
# STATUS. The requeue command is the scheduler's (`scontrol requeue JOBID`).
flow_finish() {
  local status=$1 what=$2 restart=$3
  shift 3
  if [ "$status" -ne 0 ]; then
    case $(flow_restart_decision "$status" "$restart") in
      stop)
        if [ "$status" -eq "$FLOW_UNHEALTHY" ]; then
          flow_say "$what: a node is unhealthy (status 75, see the node lines above); not requeueing onto the same nodes: resubmit without it"
        else
          flow_say "$what failed with a configuration error (status 78, see the node lines above); not requeueing: fix it and resubmit"
        fi ;;
      requeue)
        flow_say "$what failed with status $status; requeueing (restart $((restart + 1)) of $JOBGEN_MAX_RESTARTS)"
        "$@" || flow_say "$1 $2 failed" ;;
      *) flow_say "$what failed with status $status and the job has used all $JOBGEN_MAX_RESTARTS restarts; giving up" ;;
    esac
  fi
  exit "$status"
}
