# shellcheck shell=bash
# The Slurm job's controller (the sbatch script calls flow_slurm_job): the allocation's logs and
# restart count, the master's address, the gate once for every node, one compile decision, one
# srun of `job_flow.sh node` on every node, the time-limit requeue, the job's status and its
# requeue. Needs every stage file.

# flow_resolve_master NODE RESOLVER: the node's IPv4 address. nslookup asks DNS (trn1's
# /etc/hosts can map a host to the wrong interface); getent also reads /etc/hosts. Never falls
# back to localhost: the other nodes would wait for a master that does not exist.
flow_resolve_master() {
  case $2 in
    nslookup) nslookup "$1" 2>/dev/null | awk '/^Address: / { print $2; exit }' ;;
    *) getent ahostsv4 "$1" | awk '{ print $1; exit }' ;;
  esac
}

# flow_spare_step FIRST_NODE: the srun options of the job step (FLOW_STEP). With spare nodes
# (job.spare_nodes; the allocation has JOBGEN_NODES + JOBGEN_SPARE_NODES, sbatch --no-kill) the
# step runs on the first JOBGEN_NODES nodes the gate kept, in the allocation's order; the others
# wait outside it (FLOW_SPARES) for flow_spare_relaunch. MASTER_ADDR moves if the gate left out
# the first node.
flow_spare_step() {
  FLOW_STEP=(--kill-on-bad-exit=1) FLOW_SPARES="" FLOW_STEP_NODES=""
  flow_is_count "${JOBGEN_SPARE_NODES:-}" && [ "$JOBGEN_SPARE_NODES" -gt 0 ] || return 0
  local host kept="" count=0 first=""
  for host in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
    case ",${FLOW_LEFT_OUT:-}," in *",$host,"*) continue ;; esac
    [ -n "$first" ] || first=$host
    if [ "$count" -lt "$JOBGEN_NODES" ]; then
      kept+=${kept:+,}$host count=$((count + 1))
    else
      FLOW_SPARES+=${FLOW_SPARES:+,}$host
    fi
  done
  FLOW_STEP=(--kill-on-bad-exit=1 --nodes="$count" --ntasks="$count" --nodelist="$kept") FLOW_STEP_NODES=$kept
  flow_say "spare nodes: ${FLOW_SPARES:-none} (of $JOBGEN_SPARE_NODES) wait to take a lost node's place; $kept train"
  [ "$first" != "$1" ] || return 0
  MASTER_ADDR=$(flow_resolve_master "$first" "${JOBGEN_MASTER_RESOLVER:-nslookup}")
  [ -n "$MASTER_ADDR" ] || { flow_say "cannot resolve '$first' to an IPv4 address"; return 1; }
  flow_say "master $first = $MASTER_ADDR:$MASTER_PORT (the gate left out $1)"
}

# flow_spare_relaunch: after the job step failed, whether it lost a node that a spare can replace
# (0: FLOW_STEP names the new nodes). Slurm removes a lost node from a --no-kill job (squeue's
# node list no longer holds it); the step runs again on the nodes left and a spare, in the same
# allocation: no requeue, gate or compile pass (the marker is there), and the trainers resume
# from the newest complete checkpoint. The main node (this script's host) is never lost alone.
flow_spare_relaunch() {
  [ -n "${FLOW_SPARES:-}" ] || return 1
  local now host kept="" count=0 lost="" spares=""
  now=",$(scontrol show hostnames "$(squeue -h -j "$SLURM_JOB_ID" -o %N 2>/dev/null)" 2>/dev/null | tr '\n' ','),"
  for host in ${FLOW_STEP_NODES//,/ }; do
    case $now in
      *",$host,"*) kept+=${kept:+,}$host count=$((count + 1)) ;;
      *) lost+=${lost:+,}$host ;;
    esac
  done
  [ -n "$lost" ] || return 1
  for host in ${FLOW_SPARES//,/ }; do
    case $now in *",$host,"*) ;; *) continue ;; esac
    if [ "$count" -lt "$JOBGEN_NODES" ]; then
      kept+=,$host count=$((count + 1))
    else
      spares+=${spares:+,}$host
    fi
  done
  FLOW_SPARES=$spares
  if [ "$count" -lt "$JOBGEN_NODES" ]; then
    flow_say "the job step lost $lost and no spare is left to take its place"
    return 1
  fi
  FLOW_STEP=(--kill-on-bad-exit=1 --nodes="$count" --ntasks="$count" --nodelist="$kept") FLOW_STEP_NODES=$kept
  printf '%s %s\n' "$(flow_now)" "$lost" >>"$JOBGEN_LOG_DIR/spares-used" 2>/dev/null || true
  flow_decide_compile
  export JOBGEN_RUN_COMPILE=$FLOW_RUN_COMPILE
  flow_say "the job step lost $lost: a spare takes its place; the step runs again on $kept in this allocation (spares left: ${spares:-none})"
}

# flow_slurm_job COMPILE_ARGC COMPILE_ARG... TRAIN_ARG...: the sbatch script's controller.
flow_slurm_job() {
  local allocation=${SLURM_RESTART_COUNT:-0} restart=0 job=$SLURM_JOB_ID first_node status_line status what step_pid began
  began=$(flow_now)
  flow_init || exit "$?"
  flow_activate || exit 1
  # A task of a job array (a sweep) is named as squeue and jobgen name it: ARRAYID_TASK.
  if [ -n "${SLURM_ARRAY_JOB_ID:-}" ] && [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
    job=${SLURM_ARRAY_JOB_ID}_$SLURM_ARRAY_TASK_ID
  fi
  export JOBGEN_LOG_DIR="$JOBGEN_RUN_DIR/logs/$job/restart-$allocation"
  mkdir -p "$JOBGEN_LOG_DIR" "$JOBGEN_COMPILE_CACHE" || exit 1
  # When the allocation began (`jobgen report` starts it there where sacct cannot say).
  printf 'launch %s\n' "$began" >>"$JOBGEN_LOG_DIR/allocation.times" 2>/dev/null || true
  # Restarts after failures: Slurm's count less the requeues that were not failures (requeue.sh).
  local limits_file="$JOBGEN_RUN_DIR/logs/$job/time-limit-requeues"
  local health_file="$JOBGEN_RUN_DIR/logs/$job/health-requeues"
  restart=$(flow_failure_restarts "$JOBGEN_RUN_DIR/logs/$job" "$allocation")
  trap flow_on_time_limit USR1
  flow_say "job $job on $SLURM_JOB_NODELIST, allocation $allocation, restarts after failures $restart of at most ${JOBGEN_MAX_RESTARTS:-0}, logs in $JOBGEN_LOG_DIR"
  flow_setup || exit 1
  first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
  MASTER_ADDR=$(flow_resolve_master "$first_node" "${JOBGEN_MASTER_RESOLVER:-nslookup}")
  if [ -z "$MASTER_ADDR" ]; then
    flow_say "cannot resolve the first node '$first_node' to an IPv4 address with ${JOBGEN_MASTER_RESOLVER:-nslookup}; stopping"
    exit 1
  fi
  export MASTER_ADDR
  flow_say "master $first_node = $MASTER_ADDR:$MASTER_PORT"
  # Every node checks itself before anything is compiled; a bad one is left out by a requeue.
  flow_slurm_health "$health_file"
  status=$?
  if [ "$status" -ne 0 ]; then
    flow_finish "$status" "health gate" "$restart" scontrol requeue "$SLURM_JOB_ID"
  fi
  flow_spare_step "$first_node" || exit 1
  # One decision for every node, so that they cannot disagree about the compile pass.
  flow_decide_compile
  export JOBGEN_RUN_COMPILE=$FLOW_RUN_COMPILE JOBGEN_SETUP_ON=none JOBGEN_SHARED_FS=1 JOBGEN_HEALTH_DONE=1
  case $JOBGEN_PASSES in
    train) flow_say "training pass only: the compile pass ran in its own job, which this one depends on" ;;
    *) if [ "$FLOW_RUN_COMPILE" = 1 ]; then
         flow_say "compile pass (${JOBGEN_COMPILE_STEPS:-?} steps) on ${JOBGEN_NODES:-$SLURM_JOB_NUM_NODES} nodes"
       else
         flow_say "compile pass skipped (compile mode $JOBGEN_COMPILE_MODE; cache marker ${FLOW_MARKER##*/})"
       fi ;;
  esac
  # The node's rank and the main node come from srun (SLURM_NODEID; node 0 hosts the rendezvous).
  # shellcheck disable=SC2016  # expanded by the node's bash, not here
  # In the background, so that the time-limit trap runs while the step does.
  # With spare nodes, a step that lost a node runs again on a spare (flow_spare_relaunch).
  while :; do
    srun ${FLOW_STEP[@]+"${FLOW_STEP[@]}"} --ntasks-per-node=1 bash -c \
      'trap "" USR1; export JOBGEN_NODE_RANK=$SLURM_NODEID JOBGEN_NNODES=$SLURM_NNODES JOBGEN_IS_MAIN=$((SLURM_NODEID == 0)) FLOW_WHO="jobgen[node $SLURM_NODEID]"; exec bash "$0" node "$@"' \
      "$JOBGEN_PAYLOAD_DIR/common/job_flow.sh" "$@" &
    step_pid=$!
    flow_wait_step "$step_pid"
    status=$?
    { [ "$status" -ne 0 ] && [ -z "$FLOW_TIME_LIMIT" ] && flow_spare_relaunch; } || break
  done
  if [ -n "$FLOW_TIME_LIMIT" ] && { [ "$status" -ne 0 ] || [ -f "$JOBGEN_LOG_DIR/stopped.json" ]; }; then
    if [ "$status" -eq 124 ]; then
      flow_say "the job step is still running close to the time limit; requeueing now"
    elif [ -f "$JOBGEN_LOG_DIR/stopped.json" ]; then
      flow_say "the trainers stopped on request, their last step saved: $(cat "$JOBGEN_LOG_DIR/stopped.json")"
    fi
    flow_say "requeueing for the time limit (allocation $((allocation + 1)); not counted against the ${JOBGEN_MAX_RESTARTS:-0} restarts for failures)"
    printf '%s\n' "$(($(flow_count "$limits_file") + 1))" >"$limits_file" ||
      flow_say "cannot record the time-limit requeue in $limits_file"
    scontrol requeue "$SLURM_JOB_ID" || flow_say "scontrol requeue $SLURM_JOB_ID failed: resubmit to continue"
    exit 0
  fi
  status_line=$(flow_job_status "$status")
  status=${status_line%% *}
  what=${status_line#* }
  [ "$status" -ne 0 ] || flow_say "job done"
  flow_finish "$status" "$what" "$restart" scontrol requeue "$SLURM_JOB_ID"
}
