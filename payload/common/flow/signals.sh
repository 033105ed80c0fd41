# shellcheck shell=bash
# Signals and stop records. A container's SIGTERM/SIGINT (flow_on_signal, trapped by flow_node)
# becomes the trainers' stop request, written down first in the node's stop-requested file; Slurm's
# time-limit warning (USR1 on the batch shell, flow_on_time_limit) is forwarded to the job step
# and recorded in the attempt's time-limit file; flow_wait_step waits for the step until the
# requeue deadline. Needs base.sh and pass.sh's state.

# flow_tree PID: PID and every process below it (read from /proc: no procps in slim images).
flow_tree() {
  local stat line pid ppid
  local -a children=() queue=("$1")
  for stat in /proc/[0-9]*/stat; do
    { read -r line <"$stat"; } 2>/dev/null || continue
    pid=${stat#/proc/} pid=${pid%/stat}
    line=${line##*) }           # after the command name, which may hold spaces
    ppid=${line#* } ppid=${ppid%% *}
    flow_is_count "$ppid" && children[ppid]+=" $pid"
  done
  while [ "${#queue[@]}" -gt 0 ]; do
    pid=${queue[0]}
    queue=("${queue[@]:1}")
    printf '%s\n' "$pid"
    # shellcheck disable=SC2206  # a list of process ids
    [ -z "${children[pid]:-}" ] || queue+=(${children[pid]})
  done
}

# shellcheck disable=SC2329,SC2034  # invoked through the traps of flow_node; FLOW_STOPPING: node.sh
# A container's SIGTERM (SageMaker at MaxRuntime, then SIGKILL 120 s later; Kubernetes at the
# Job's activeDeadlineSeconds or a drain, then SIGKILL after terminationGracePeriodSeconds) reaches
# this shell only (PID 1). During training it becomes the trainers' stop request
# (JOBGEN_STOP_SIGNAL, which everything else in the pass ignores): they save the step just
# trained and stop, and the next attempt resumes from it. Otherwise the pass is stopped.
flow_on_signal() {
  FLOW_STOPPING=$1 FLOW_STOPPED_PID=$FLOW_PASS_PID
  if [ "$1" = TERM ] && [ "$FLOW_PASS" = train ] && [ -n "${JOBGEN_STOP_SIGNAL:-}" ] &&
    [ -n "$FLOW_PASS_PID" ]; then
    flow_say "received SIGTERM; asking the trainers to save a checkpoint and stop (SIG$JOBGEN_STOP_SIGNAL)"
    # Written down first: a trainer still starting ignores the signal and reads this instead
    # (payload/common/stop_request.py StopRequest).
    # (Replaced, never written through: whatever stands there goes first.)
    rm -f "$JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK/stop-requested" 2>/dev/null
    : >"$JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK/stop-requested" 2>/dev/null || true
    # To every process of the pass: torchrun starts its workers in sessions of their own.
    # shellcheck disable=SC2046  # a list of process ids
    kill -s "$JOBGEN_STOP_SIGNAL" $(flow_tree "$FLOW_PASS_PID") 2>/dev/null
    return 0
  fi
  flow_say "received SIG$1; stopping the running pass"
  if [ -n "$FLOW_PASS_PID" ]; then
    kill -TERM -- "-$FLOW_PASS_PID" 2>/dev/null || kill -TERM "$FLOW_PASS_PID" 2>/dev/null
  fi
}

# --- Slurm's time limit ----------------------------------------------------------------------
# The job asks for USR1 on the batch shell some time before its limit (#SBATCH --signal=B:USR1@S).
# The controller then forwards it to the job step (trainers that can save and stop: payload/
# common/loop.py), waits for the step until shortly before the limit, and requeues the job
# itself: Slurm would end a job that reaches its limit for good. Not counted as a failure.
FLOW_TIME_LIMIT=""
FLOW_DEADLINE=""

# flow_seconds TEXT: squeue's time left (%L: D-HH:MM:SS, HH:MM:SS, MM:SS or SS) in seconds;
# nothing for anything else (UNLIMITED, NOT_SET, INVALID).
flow_seconds() {
  local text=$1 days=0 total=0 part
  local -a parts
  case $text in *-*) days=${text%%-*} text=${text#*-} ;; esac
  flow_is_count "$days" || return 0
  IFS=: read -ra parts <<<"$text"
  [ "${#parts[@]}" -ge 1 ] && [ "${#parts[@]}" -le 3 ] || return 0
  for part in ${parts[@]+"${parts[@]}"}; do
    flow_is_count "$part" || return 0
    total=$((total * 60 + 10#$part))
  done
  printf '%s\n' "$((10#$days * 86400 + total))"
}

# shellcheck disable=SC2329  # invoked through the USR1 trap of flow_slurm_job
flow_on_time_limit() {
  [ -z "$FLOW_TIME_LIMIT" ] || return 0
  local now left margin
  now=$(date +%s)
  FLOW_TIME_LIMIT=$now
  left=$(flow_seconds "$(squeue -h -j "$SLURM_JOB_ID" -o %L 2>/dev/null | head -n 1)")
  [ -n "$left" ] || left=60
  # Requeue with time to spare: a quarter of what is left, at least 10 s, at most 60 s.
  margin=$((left / 4))
  [ "$margin" -ge 10 ] || margin=10
  [ "$margin" -le 60 ] || margin=60
  FLOW_DEADLINE=$((now + left - margin))
  printf '%s %s\n' "$now" "$left" >"$JOBGEN_LOG_DIR/time-limit" 2>/dev/null || true
  if [ -n "${JOBGEN_STOP_SIGNAL:-}" ]; then
    flow_say "time-limit warning (${left} s left): asking the trainers to save a checkpoint and stop (SIG$JOBGEN_STOP_SIGNAL); requeueing within $((left - margin)) s"
    scancel --signal="$JOBGEN_STOP_SIGNAL" "$SLURM_JOB_ID" 2>/dev/null ||
      flow_say "scancel --signal=$JOBGEN_STOP_SIGNAL failed: the job resumes from its last periodic checkpoint"
  else
    flow_say "time-limit warning (${left} s left): this payload's trainer cannot save on request; it trains until $margin s before the limit, then the job is requeued and resumes from its last periodic checkpoint"
  fi
}

# flow_wait_step PID: the job step's status; 124 when the time-limit deadline came first.
flow_wait_step() {
  local pid=$1 status
  while :; do
    if [ -z "$FLOW_TIME_LIMIT" ]; then
      wait "$pid"
      status=$?
      kill -0 "$pid" 2>/dev/null || return "$status"   # ended; else a trapped signal woke us
    else
      if ! kill -0 "$pid" 2>/dev/null; then
        wait "$pid"
        return
      fi
      [ "$(date +%s)" -lt "$FLOW_DEADLINE" ] || return 124
      sleep 1
    fi
  done
}
