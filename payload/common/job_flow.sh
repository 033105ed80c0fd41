#!/usr/bin/env bash
# jobgen's job lifecycle on the nodes: the one two-pass flow that every executor runs.
#
#   health gate -> compile marker -> compile pass -> marker -> node-local cache copy -> training pass
#   -> the job's status (a configuration error, 78, wins) -> restart accounting
#
# Who calls it (each only wires its scheduler's facts into the node contract):
#   sbatch script        sources it and calls `flow_slurm_job` (the job's controller: decides the
#                        compile pass once, then one `srun` of `job_flow.sh node` on every node)
#   AWS Batch entrypoint sources it and calls `flow_node` on every node
#   submitit, jobgen run `bash job_flow.sh node COMPILE_ARGC COMPILE_ARG... TRAIN_ARG...`
#
# The node contract (the variables read here) is defined once, in jobgen/node.py, which also
# documents each one. Job-wide: MASTER_PORT JOBGEN_RUN_DIR JOBGEN_PAYLOAD_DIR
# JOBGEN_PAYLOAD_DIGEST JOBGEN_LAUNCHER
# JOBGEN_WORKERS_PER_NODE JOBGEN_WORKDIR JOBGEN_PROGRAM JOBGEN_COMPILE_WRAPPER JOBGEN_PASSES
# JOBGEN_COMPILE_MODE JOBGEN_COMPILE_CACHE JOBGEN_LOCAL_COMPILE_CACHE JOBGEN_COMPILE_KEY
# JOBGEN_CACHE_VAR JOBGEN_CACHE_SUFFIX JOBGEN_NODES JOBGEN_MAX_RESTARTS JOBGEN_RESTARTS_IN_PLACE
# JOBGEN_RDZV_TIMEOUT
# JOBGEN_SHARED_FS JOBGEN_SETUP_ON JOBGEN_FILES_JSON JOBGEN_PREPARE_JSON JOBGEN_ACTIVATE
# JOBGEN_HEALTH (and JOBGEN_HEALTH_DONE, set by a controller that ran the gate itself).
# Per node (the executor's facts): MASTER_ADDR JOBGEN_NODE_RANK JOBGEN_NNODES JOBGEN_IS_MAIN
# JOBGEN_LOG_DIR, and JOBGEN_RUN_COMPILE where a controller has decided the compile pass.
#
# Exit statuses: the trainer's; 78 (EX_CONFIG) for a failure that no restart can cure (the
# launcher classifies it: a missing command or trainer, an import error, refused arguments); 75
# (EX_TEMPFAIL) for a node the health gate found bad (the job could run elsewhere, not here).
# Works on bash 4.2 (Amazon Linux 2): no mapfile -d, empty arrays as ${a[@]+"${a[@]}"}.

FLOW_CONFIG_ERROR=78
FLOW_WHO=${FLOW_WHO:-jobgen}

flow_say() { printf '%s: %s\n' "$FLOW_WHO" "$*" >&2; }
# flow_now: the time as epoch seconds, with nanoseconds where date has them (GNU date).
flow_now() {
  local t
  t=$(date +%s.%N 2>/dev/null)
  case $t in '' | *[!0-9.]*) date +%s ;; *) printf '%s\n' "$t" ;; esac
}
flow_is_count() { case $1 in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac; }
# flow_next_attempt ROOT NODE: the folder of this node's next attempt under ROOT
# (ROOT/attempt-N, N counting the attempts this node already logged there), for services that
# restart a job's containers without telling them how often (SageMaker retries, EKS pods).
flow_next_attempt() {
  local n=1
  while [ -e "$1/attempt-$n/node-$2" ]; do n=$((n + 1)); done
  printf '%s/attempt-%s\n' "$1" "$n"
}
flow_absolute() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s/%s\n' "$PWD" "$1" ;; esac; }

# flow_init: check the job-wide contract and make its paths absolute (relative ones are taken
# from the current directory: the submission directory, or the container's working directory).
flow_init() {
  local var missing=()
  for var in MASTER_PORT JOBGEN_RUN_DIR JOBGEN_PAYLOAD_DIR JOBGEN_LAUNCHER \
    JOBGEN_WORKERS_PER_NODE JOBGEN_WORKDIR JOBGEN_PROGRAM JOBGEN_COMPILE_CACHE \
    JOBGEN_COMPILE_KEY JOBGEN_CACHE_VAR; do
    [ -n "${!var:-}" ] || missing+=("$var")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    flow_say "not set by ${FLOW_CONTRACT_FROM:-the job}: ${missing[*]} (run a job rendered by jobgen)"
    return 1
  fi
  flow_is_count "$MASTER_PORT" || { flow_say "MASTER_PORT='$MASTER_PORT' is not a port number"; return 1; }
  case ${JOBGEN_COMPILE_MODE:=auto} in
    auto | always | never) ;;
    *) flow_say "JOBGEN_COMPILE_MODE='$JOBGEN_COMPILE_MODE' must be auto, always or never"; return 1 ;;
  esac
  case ${JOBGEN_PASSES:=both} in
    both | compile | train) ;;
    *) flow_say "JOBGEN_PASSES='$JOBGEN_PASSES' must be both, compile or train"; return 1 ;;
  esac
  case $JOBGEN_CACHE_VAR in
    [A-Za-z_]*[!A-Za-z0-9_]* | [!A-Za-z_]*) flow_say "JOBGEN_CACHE_VAR='$JOBGEN_CACHE_VAR' is not a variable name"; return 1 ;;
  esac
  if [ -n "${JOBGEN_RDZV_TIMEOUT:-}" ]; then
    { flow_is_count "$JOBGEN_RDZV_TIMEOUT" && [ "$JOBGEN_RDZV_TIMEOUT" -gt 0 ]; } || {
      flow_say "JOBGEN_RDZV_TIMEOUT='$JOBGEN_RDZV_TIMEOUT' must be a positive number of seconds"
      return 1
    }
  fi
  JOBGEN_RUN_DIR=$(flow_absolute "$JOBGEN_RUN_DIR")
  JOBGEN_PAYLOAD_DIR=$(flow_absolute "$JOBGEN_PAYLOAD_DIR")
  JOBGEN_WORKDIR=$(flow_absolute "$JOBGEN_WORKDIR")
  JOBGEN_COMPILE_CACHE=$(flow_absolute "$JOBGEN_COMPILE_CACHE")
  export JOBGEN_RUN_DIR JOBGEN_PAYLOAD_DIR JOBGEN_WORKDIR JOBGEN_COMPILE_CACHE JOBGEN_COMPILE_MODE \
    JOBGEN_PASSES MASTER_PORT
  FLOW_PYTHON=${JOBGEN_PYTHON:-python3}
  # The payload's launcher: under payload/, or an absolute path (a payload of another package).
  case $JOBGEN_LAUNCHER in
    /*) FLOW_LAUNCHER=$JOBGEN_LAUNCHER ;;
    *) FLOW_LAUNCHER=$JOBGEN_PAYLOAD_DIR/$JOBGEN_LAUNCHER ;;
  esac
  if [ ! -f "$FLOW_LAUNCHER" ]; then
    flow_say "no launcher $FLOW_LAUNCHER (is payload/ at JOBGEN_PAYLOAD_DIR?)"
    return "$FLOW_CONFIG_ERROR"
  fi
  flow_check_payload || return "$FLOW_CONFIG_ERROR"
}

# flow_check_payload: the payload folder holds the payload the job was rendered with (its
# .jobgen-digest, written with the snapshot or into the image, names JOBGEN_PAYLOAD_DIGEST).
flow_check_payload() {
  [ -n "${JOBGEN_PAYLOAD_DIGEST:-}" ] || return 0
  local held=""
  [ -r "$JOBGEN_PAYLOAD_DIR/.jobgen-digest" ] && read -r held <"$JOBGEN_PAYLOAD_DIR/.jobgen-digest"
  [ "$held" = "$JOBGEN_PAYLOAD_DIGEST" ] && return 0
  flow_say "payload ${JOBGEN_PAYLOAD_DIR} holds payload '${held:0:16}', not ${JOBGEN_PAYLOAD_DIGEST:0:16} that this job was rendered with: rebuild the image with \`jobgen image-context\` (containers) or render the job again"
  return 1
}

# flow_activate: the site's environment (setup.activate), where it has one.
flow_activate() {
  [ -n "${JOBGEN_ACTIVATE:-}" ] || return 0
  # shellcheck disable=SC1090
  source "$JOBGEN_ACTIVATE" || { flow_say "cannot source $JOBGEN_ACTIVATE"; return 1; }
}

# flow_setup: write the job's files under the run directory and run its prepare command.
flow_setup() {
  local written item status argv_file
  local -a prepare=()
  if [ -n "${JOBGEN_FILES_JSON:-}" ]; then
    written=$("$FLOW_PYTHON" "$JOBGEN_PAYLOAD_DIR/common/batch_setup.py" write-files "$JOBGEN_RUN_DIR") || {
      flow_say "could not write the job's files under $JOBGEN_RUN_DIR (JOBGEN_FILES_JSON)"
      return 1
    }
    while IFS= read -r item; do [ -z "$item" ] || flow_say "wrote $item"; done <<<"$written"
  fi
  [ -n "${JOBGEN_PREPARE_JSON:-}" ] || return 0
  argv_file=$(mktemp) || { flow_say "cannot create a temporary file"; return 1; }
  if ! "$FLOW_PYTHON" "$JOBGEN_PAYLOAD_DIR/common/batch_setup.py" argv JOBGEN_PREPARE_JSON >"$argv_file"; then
    rm -f "$argv_file"
    flow_say "JOBGEN_PREPARE_JSON is not a JSON list of strings"
    return 1
  fi
  while IFS= read -r -d '' item; do prepare+=("$item"); done <"$argv_file"
  rm -f "$argv_file"
  flow_say "preparing: ${prepare[*]}"
  "$FLOW_PYTHON" "$JOBGEN_PAYLOAD_DIR/${prepare[0]}" "${prepare[@]:1}"
  status=$?
  [ "$status" -eq 0 ] || flow_say "the prepare step failed with status $status; no pass started"
  return "$status"
}

# flow_lustre_client: the FSx for Lustre client's dirty-data cap the site asks for
# (slurm.lustre_max_dirty_mb; upstream neuronx-nemo-megatron train_setup.sh sets 64 "to avoid
# OODs"), on this node, where lctl exists. Best effort: the passes run either way.
flow_lustre_client() {
  local mb=${JOBGEN_LUSTRE_MAX_DIRTY_MB:-}
  [ -n "$mb" ] || return 0
  flow_is_count "$mb" || { flow_say "JOBGEN_LUSTRE_MAX_DIRTY_MB '$mb' is not a count; ignored"; return 0; }
  if ! command -v lctl >/dev/null 2>&1; then
    flow_say "no lctl on this node: the FSx client's osc.*.max_dirty_mb is left as it is"
  elif sudo -n lctl set_param "osc.*.max_dirty_mb=$mb" >/dev/null 2>&1 \
       || lctl set_param "osc.*.max_dirty_mb=$mb" >/dev/null 2>&1; then
    flow_say "FSx client: osc.*.max_dirty_mb=$mb"
  else
    flow_say "could not set the FSx client's osc.*.max_dirty_mb=$mb (no privilege); continuing"
  fi
}

# flow_decide_compile: sets FLOW_RUN_COMPILE (1: run the compile pass) and FLOW_MARKER, the
# file that says this spec's graphs are in the cache (its name is the spec's compile key).
flow_decide_compile() {
  FLOW_MARKER="$JOBGEN_COMPILE_CACHE/.jobgen/$JOBGEN_COMPILE_KEY.done"
  if [ "$JOBGEN_PASSES" = train ]; then
    FLOW_RUN_COMPILE=0
  elif [ -n "${JOBGEN_RUN_COMPILE:-}" ]; then
    FLOW_RUN_COMPILE=$JOBGEN_RUN_COMPILE   # decided once for the whole job by its controller
  else
    case $JOBGEN_COMPILE_MODE in
      always) FLOW_RUN_COMPILE=1 ;;
      never) FLOW_RUN_COMPILE=0 ;;
      *) if [ -e "$FLOW_MARKER" ]; then FLOW_RUN_COMPILE=0; else FLOW_RUN_COMPILE=1; fi ;;
    esac
  fi
}

# flow_mark_compiled: the marker, written under a private name and renamed, so that no node ever
# sees half of it.
flow_mark_compiled() {
  local tmp="$FLOW_MARKER.$$.tmp"
  if mkdir -p "${FLOW_MARKER%/*}" && date -u +%FT%TZ >"$tmp" && mv -f "$tmp" "$FLOW_MARKER"; then
    flow_say "compile cache marker written: $FLOW_MARKER"
  else
    rm -f "$tmp"
    flow_say "could not write the compile cache marker $FLOW_MARKER; the next job compiles again"
  fi
}

# flow_use_cache DIR: point the accelerator's cache variable at DIR (Neuron's cache URL, or
# Habana's recipe cache with its options after the directory).
flow_use_cache() { export "$JOBGEN_CACHE_VAR=$1${JOBGEN_CACHE_SUFFIX:-}"; }

# flow_wait_for_nodes PASS: on a shared filesystem, wait until every node has recorded the end of
# PASS in the job's log directory; fails if one failed or they do not all arrive in time.
flow_wait_for_nodes() {
  local pass=$1 waited=0 limit=${JOBGEN_RDZV_TIMEOUT:-900} node code
  while :; do
    local arrived=0
    for ((node = 0; node < JOBGEN_NNODES; node++)); do
      code=""
      [ -f "$JOBGEN_LOG_DIR/node-$node/$pass.status" ] && read -r code <"$JOBGEN_LOG_DIR/node-$node/$pass.status"
      [ -n "$code" ] || continue
      if [ "$code" != 0 ]; then
        flow_say "node $node's $pass pass failed with status $code"
        return 1
      fi
      arrived=$((arrived + 1))
    done
    [ "$arrived" -lt "$JOBGEN_NNODES" ] || return 0
    if [ "$waited" -ge "$limit" ]; then
      flow_say "only $arrived of $JOBGEN_NNODES nodes finished the $pass pass within $limit s"
      return 1
    fi
    sleep 2
    waited=$((waited + 2))
  done
}

# flow_node_pass PASS ARG...: this node's launcher for one pass, in a session of its own so that
# a stop request (flow_on_signal) reaches torchrun and its workers too; returns its status.
FLOW_PASS_PID=""
FLOW_PASS=""
FLOW_STOPPING=""
flow_node_pass() {
  local pass=$1 status log before=0 times
  shift
  FLOW_PASS=$pass
  log="$JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK/$pass.log"
  [ -f "$log" ] && before=$(wc -c <"$log")
  # When the pass was launched and when it exited: the nodes were held for it in between
  # (`jobgen report` reads it; the trainer's own events start later and end sooner).
  times="$JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK/$pass.times"
  printf 'launch %s\n' "$(flow_now)" >>"$times" 2>/dev/null || true
  if command -v setsid >/dev/null 2>&1; then
    setsid -w bash "$FLOW_LAUNCHER" "$pass" "$@" &
  else
    bash "$FLOW_LAUNCHER" "$pass" "$@" &
  fi
  FLOW_PASS_PID=$!
  wait "$FLOW_PASS_PID"
  status=$?
  # A trapped signal interrupts `wait`; wait again for the pass's own status.
  while kill -0 "$FLOW_PASS_PID" 2>/dev/null; do
    wait "$FLOW_PASS_PID"
    status=$?
  done
  FLOW_PASS_PID=""
  printf 'exit %s %s\n' "$(flow_now)" "$status" >>"$times" 2>/dev/null || true
  # grep reads to the end (no -q): under pipefail, a grep that stops at the first match leaves
  # tail writing into a closed pipe, and tail's SIGPIPE would read as "no match".
  if [ "$status" -ne 0 ] && [ -f "$log" ] &&
    tail -c "+$((before + 1))" "$log" |
    grep -E 'waiting for clients|client socket has timed out|torchelastic/(role_info|assigned_ranks)' >/dev/null; then
    flow_say "the $pass pass could not bring the $JOBGEN_NNODES nodes together within ${JOBGEN_RDZV_TIMEOUT:-torch default} s at $MASTER_ADDR:$MASTER_PORT: a node never started, died, or cannot reach that address (security group, interface), or the nodes disagree about the compile pass"
  fi
  return "$status"
}

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

# shellcheck disable=SC2329  # invoked through the traps of flow_node
# A container's SIGTERM (SageMaker at MaxRuntime, then SIGKILL 120 s later; Kubernetes at the
# Job's activeDeadlineSeconds or a drain, then SIGKILL after terminationGracePeriodSeconds) reaches
# this shell only (PID 1). During training it becomes the trainers' stop request
# (JOBGEN_STOP_SIGNAL, which everything else in the pass ignores): they save the step just
# trained and stop, and the next attempt resumes from it. Otherwise the pass is stopped.
flow_on_signal() {
  FLOW_STOPPING=$1
  if [ "$1" = TERM ] && [ "$FLOW_PASS" = train ] && [ -n "${JOBGEN_STOP_SIGNAL:-}" ] &&
    [ -n "$FLOW_PASS_PID" ]; then
    flow_say "received SIGTERM; asking the trainers to save a checkpoint and stop (SIG$JOBGEN_STOP_SIGNAL)"
    # Written down first: a trainer still starting ignores the signal and reads this instead
    # (payload/common/loop.py StopRequest).
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

# flow_node_end STATUS PASS: record how this node's flow ended (for the controller), return STATUS.
flow_node_end() {
  printf '%s %s\n' "$1" "$2" >"$JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK/job.status" 2>/dev/null ||
    flow_say "cannot record the node's status in $JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK"
  return "$1"
}

# --- the health gate (payload/common/health.py; jobgen/health.py decides what is checked) -----
FLOW_UNHEALTHY=75

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

# flow_slurm_health FILE: the Slurm controller's gate: one step of the node checks on every node,
# then the verdict. Bad nodes: requeue without them (FILE counts these requeues, which are not
# failures) and end this script. Returns 0 (go on) or the status to end the job with.
flow_slurm_health() {
  [ -n "${JOBGEN_HEALTH:-}" ] || return 0
  local file=$1 requeues=0 bad status health="$JOBGEN_PAYLOAD_DIR/common/health.py"
  [ -f "$file" ] && read -r requeues <"$file"
  flow_is_count "${requeues:-}" || requeues=0
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
      flow_say "health gate passed" ;;
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

# flow_node COMPILE_ARGC COMPILE_ARG... TRAIN_ARG...: the two passes on this node.
flow_node() {
  local compile_argc=${1:-} status
  shift || true
  if ! flow_is_count "$compile_argc" || [ "$compile_argc" -gt $# ]; then
    flow_say "COMPILE_ARGC '$compile_argc' is not a count of the $# trainer arguments that follow it"
    return 2
  fi
  local -a compile_args=("${@:1:compile_argc}") train_args=("${@:compile_argc+1}")
  : "${JOBGEN_NODE_RANK:?}" "${JOBGEN_NNODES:?}" "${JOBGEN_LOG_DIR:?}" "${MASTER_ADDR:?}"
  export JOBGEN_NODE_RANK JOBGEN_NNODES JOBGEN_LOG_DIR MASTER_ADDR
  local is_main=${JOBGEN_IS_MAIN:-0} shared=${JOBGEN_SHARED_FS:-0}
  # The trainers' checkpoint sealing reads it (payload/common/loop.py node_place).
  export JOBGEN_SHARED_FS=$shared
  mkdir -p "$JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK" "$JOBGEN_COMPILE_CACHE" || {
    flow_say "cannot create $JOBGEN_LOG_DIR and $JOBGEN_COMPILE_CACHE"
    return 1
  }
  # A stop request of an earlier attempt that shared this log folder is not this one's.
  rm -f "$JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK/stop-requested"
  trap 'flow_on_signal TERM' TERM
  trap 'flow_on_signal INT' INT
  # The time-limit stop request (JOBGEN_STOP_SIGNAL, USR1) reaches every process of a Slurm job
  # step: this shell, the launcher, torchrun and tee ignore it (children inherit that), and only
  # the trainers act on it (payload/common/loop.py: save, then stop).
  trap '' USR1
  flow_lustre_client

  # Files and the prepare command: on every node (separate filesystems), on the main node only
  # (a shared filesystem: the others' trainers start once the main node is at the rendezvous),
  # or already done by the job's controller.
  case ${JOBGEN_SETUP_ON:-every} in
    every) flow_setup || return "$?" ;;
    main) if [ "$is_main" = 1 ]; then flow_setup || return "$?"; fi ;;
  esac
  if [ -n "$FLOW_STOPPING" ]; then flow_say "stopped (SIG$FLOW_STOPPING) before the compile pass"; return 143; fi
  flow_health_gate "$is_main" "$shared"
  status=$?
  if [ "$status" -ne 0 ]; then
    flow_node_end "$status" health
    return
  fi

  flow_decide_compile
  flow_use_cache "$JOBGEN_COMPILE_CACHE"
  if [ "$FLOW_RUN_COMPILE" = 1 ]; then
    flow_say "compile pass (${#compile_args[@]} trainer arguments) on $JOBGEN_NNODES nodes"
    flow_node_pass compile ${compile_args[@]+"${compile_args[@]}"}
    status=$?
    if [ "$status" -ne 0 ]; then
      flow_say "compile pass failed with status $status; the training pass is skipped"
      flow_node_end "$status" compile
      return
    fi
    if [ -n "$FLOW_STOPPING" ]; then flow_say "stopped (SIG$FLOW_STOPPING) after the compile pass"; return 143; fi
    # The graphs are complete once every node's compile pass has ended (each compiles its own):
    # on a shared filesystem the main node waits for the others before it writes the marker.
    if [ "$is_main" = 1 ]; then
      if [ "$shared" != 1 ] || flow_wait_for_nodes compile; then
        flow_mark_compiled
      else
        # Another node's compile pass failed or never ended: training would wait for it.
        flow_say "not every node finished the compile pass; the training pass is skipped"
        flow_node_end 1 compile
        return
      fi
    fi
  elif [ "$JOBGEN_PASSES" != train ] && [ -z "${JOBGEN_RUN_COMPILE:-}" ]; then
    flow_say "compile pass skipped (compile mode $JOBGEN_COMPILE_MODE; cache marker ${FLOW_MARKER##*/})"
  fi
  if [ "$JOBGEN_PASSES" = compile ]; then
    flow_say "compile-only job done"
    flow_node_end 0 compile
    return
  fi

  if [ -n "${JOBGEN_LOCAL_COMPILE_CACHE:-}" ] && [ "$JOBGEN_COMPILE_MODE" != never ]; then
    # Training reads a node-local copy of the cache: a shared cache read by every worker of a
    # large job is slow and can time out. Every node's graphs must be in it first.
    if [ "$FLOW_RUN_COMPILE" = 1 ] && [ "$shared" = 1 ] && ! flow_wait_for_nodes compile; then
      flow_node_end 1 "compile cache copy"
      return
    fi
    bash "$JOBGEN_PAYLOAD_DIR/common/sync_cache.sh" "$JOBGEN_COMPILE_CACHE" "$JOBGEN_LOCAL_COMPILE_CACHE"
    status=$?
    if [ "$status" -ne 0 ]; then
      flow_node_end "$status" "compile cache copy"
      return
    fi
    flow_use_cache "$JOBGEN_LOCAL_COMPILE_CACHE"
  fi

  flow_say "training pass on $JOBGEN_NNODES nodes"
  flow_node_pass train ${train_args[@]+"${train_args[@]}"}
  status=$?
  if [ "$status" -eq 0 ] && [ -n "$FLOW_STOPPING" ]; then
    # Stopped by the service: not a finished job (an EKS pod that exits 0 is done for good).
    flow_say "training pass saved and stopped on SIG$FLOW_STOPPING; exiting 143 so that the service counts this attempt as stopped"
    status=143
  elif [ "$status" -eq 0 ] && [ -f "$JOBGEN_LOG_DIR/stopped.json" ]; then
    flow_say "training pass stopped on request, its last step saved (or none trained): $(cat "$JOBGEN_LOG_DIR/stopped.json" 2>/dev/null)"
  elif [ "$status" -eq 0 ]; then
    flow_say "training pass finished"
  else
    flow_say "training pass failed with status $status"
  fi
  flow_node_end "$status" train
}

# flow_job_status SRUN_STATUS: "STATUS WHAT" for a job whose nodes ran flow_node under srun. srun
# reports the highest status of the nodes, and once one node fails it stops the others (143):
# each node records its own, and a configuration error (78) or else the first real exit (below
# 128) wins.
flow_job_status() {
  local file code what rank best=-1 found="" found_what=""
  for file in "$JOBGEN_LOG_DIR"/node-*/job.status; do
    [ -f "$file" ] || continue
    read -r code what <"$file" || continue
    flow_is_count "$code" || continue
    # What explains the job best: a configuration error, a real exit, a signal, success.
    if [ "$code" -eq "$FLOW_CONFIG_ERROR" ] || [ "$code" -eq "$FLOW_UNHEALTHY" ]; then rank=3
    elif [ "$code" -gt 0 ] && [ "$code" -lt 128 ]; then rank=2
    elif [ "$code" -ne 0 ]; then rank=1
    else rank=0
    fi
    if [ "$rank" -gt "$best" ]; then best=$rank found=$code found_what=$what; fi
  done
  # No node said why (srun could not start them, or they died unrecorded): srun's own status.
  if [ "$1" -ne 0 ] && [ "$best" -le 0 ]; then found=$1 found_what="job step"; fi
  [ -n "$found" ] || found=$1
  case $found_what in
    compile) found_what="compile pass" ;;
    health) found_what="health gate" ;;
    train | "") found_what="training pass" ;;
  esac
  printf '%s %s\n' "$found" "$found_what"
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

# flow_resolve_master NODE RESOLVER: the node's IPv4 address. nslookup asks DNS (trn1's
# /etc/hosts can map a host to the wrong interface); getent also reads /etc/hosts. Never falls
# back to localhost: the other nodes would wait for a master that does not exist.
flow_resolve_master() {
  case $2 in
    nslookup) nslookup "$1" 2>/dev/null | awk '/^Address: / { print $2; exit }' ;;
    *) getent ahostsv4 "$1" | awk '{ print $1; exit }' ;;
  esac
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
  # Restarts after failures: Slurm's count of requeues (ours, and its own after a node
  # failure) less the requeues at the time limit, which are not failures (counted in a file).
  local timed_out=0 limits_file="$JOBGEN_RUN_DIR/logs/$job/time-limit-requeues"
  local for_health=0 health_file="$JOBGEN_RUN_DIR/logs/$job/health-requeues"
  [ -f "$limits_file" ] && read -r timed_out <"$limits_file"
  flow_is_count "${timed_out:-}" || timed_out=0
  # ... and less the requeues that left out a node the health gate found bad.
  [ -f "$health_file" ] && read -r for_health <"$health_file"
  flow_is_count "${for_health:-}" || for_health=0
  restart=$((allocation - timed_out - for_health))
  [ "$restart" -ge 0 ] || restart=0
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
  # One decision for every node, so that they cannot disagree about the compile pass.
  flow_decide_compile
  export JOBGEN_RUN_COMPILE=$FLOW_RUN_COMPILE JOBGEN_SETUP_ON=none JOBGEN_SHARED_FS=1 JOBGEN_HEALTH_DONE=1
  case $JOBGEN_PASSES in
    train) flow_say "training pass only: the compile pass ran in its own job, which this one depends on" ;;
    *) if [ "$FLOW_RUN_COMPILE" = 1 ]; then
         flow_say "compile pass (${JOBGEN_COMPILE_STEPS:-?} steps) on $SLURM_JOB_NUM_NODES nodes"
       else
         flow_say "compile pass skipped (compile mode $JOBGEN_COMPILE_MODE; cache marker ${FLOW_MARKER##*/})"
       fi ;;
  esac
  # The node's rank and the main node come from srun (SLURM_NODEID; node 0 hosts the rendezvous).
  # shellcheck disable=SC2016  # expanded by the node's bash, not here
  # In the background, so that the time-limit trap runs while the step does.
  srun --kill-on-bad-exit=1 --ntasks-per-node=1 bash -c \
    'trap "" USR1; export JOBGEN_NODE_RANK=$SLURM_NODEID JOBGEN_NNODES=$SLURM_NNODES JOBGEN_IS_MAIN=$((SLURM_NODEID == 0)) FLOW_WHO="jobgen[node $SLURM_NODEID]"; exec bash "$0" node "$@"' \
    "$JOBGEN_PAYLOAD_DIR/common/job_flow.sh" "$@" &
  step_pid=$!
  flow_wait_step "$step_pid"
  status=$?
  if [ -n "$FLOW_TIME_LIMIT" ] && { [ "$status" -ne 0 ] || [ -f "$JOBGEN_LOG_DIR/stopped.json" ]; }; then
    if [ "$status" -eq 124 ]; then
      flow_say "the job step is still running close to the time limit; requeueing now"
    elif [ -f "$JOBGEN_LOG_DIR/stopped.json" ]; then
      flow_say "the trainers stopped on request, their last step saved: $(cat "$JOBGEN_LOG_DIR/stopped.json")"
    fi
    flow_say "requeueing for the time limit (allocation $((allocation + 1)); not counted against the ${JOBGEN_MAX_RESTARTS:-0} restarts for failures)"
    printf '%s\n' "$((timed_out + 1))" >"$limits_file" || flow_say "cannot record the time-limit requeue in $limits_file"
    scontrol requeue "$SLURM_JOB_ID" || flow_say "scontrol requeue $SLURM_JOB_ID failed: resubmit to continue"
    exit 0
  fi
  status_line=$(flow_job_status "$status")
  status=${status_line%% *}
  what=${status_line#* }
  [ "$status" -ne 0 ] || flow_say "job done"
  flow_finish "$status" "$what" "$restart" scontrol requeue "$SLURM_JOB_ID"
}

# Run as a script: `job_flow.sh node ARGS...` (the node tasks of srun, submitit, jobgen run).
# (`return` works only in a sourced file.)
if ! (return 0 2>/dev/null); then
  set -uo pipefail
  case ${1:-} in
    node)
      shift
      flow_init || exit "$?"
      flow_node "$@"
      exit "$?"
      ;;
    health)   # one node's checks (the Slurm controller's gate step)
      flow_init || exit "$?"
      "$FLOW_PYTHON" "$JOBGEN_PAYLOAD_DIR/common/health.py" node
      exit "$?"
      ;;
    *)
      flow_say "usage: job_flow.sh node COMPILE_ARGC COMPILE_ARG... TRAIN_ARG..."
      exit 2
      ;;
  esac
fi
