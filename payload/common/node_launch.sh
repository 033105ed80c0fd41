#!/usr/bin/env bash
# Per-node launch shared by the payload launchers: node setup, rank, logs, one torchrun.
# Sourced by payload/<payload>/launch.sh, which calls: node_launch PASS TRAINER_ARG...
#
# Reads: MASTER_ADDR MASTER_PORT JOBGEN_WORKERS_PER_NODE JOBGEN_LOG_DIR JOBGEN_RUN_DIR JOBGEN_WORKDIR
#        JOBGEN_PROGRAM JOBGEN_COMPILE_WRAPPER JOBGEN_RESTARTS_IN_PLACE, and the node's place in the job from
#        JOBGEN_NODE_RANK/JOBGEN_NNODES (AWS Batch entrypoint) or SLURM_NODEID/SLURM_NNODES (srun).

node_say() { printf 'jobgen[node %s]: %s\n' "${node_rank:-?}" "$*" >&2; }

# Exit status of a failure that no restart can cure (sysexits' EX_CONFIG): the job scripts stop
# instead of requeueing. Everything else (a crash, a lost node, a hang) keeps its own status.
JOBGEN_CONFIG_ERROR=78
# What a trainer prints when it was started wrongly: an import that fails, arguments its parser
# refuses, a file that is not there. Matched in the pass's log after a failure.
JOBGEN_CONFIG_PATTERNS='ModuleNotFoundError|ImportError: |error: unrecognized arguments|error: argument |error: the following arguments are required|No module named|can.t open file'

# classify_failure STATUS LOG: the status to report for a failed pass.
classify_failure() {
  local status=$1 log=$2
  if [ "$status" -eq 127 ] || [ "$status" -eq 126 ]; then
    node_say "a command of the $pass pass was not found or not executable (status $status: torchrun${JOBGEN_COMPILE_WRAPPER:+ or $JOBGEN_COMPILE_WRAPPER}); check the site's setup.activate; not retried"
    status=$JOBGEN_CONFIG_ERROR
  elif [ "$status" -ne 0 ] && [ "$status" -lt 128 ] && grep -Eq "$JOBGEN_CONFIG_PATTERNS" "$log" 2>/dev/null; then
    node_say "the trainer was started wrongly ($(grep -Eo "$JOBGEN_CONFIG_PATTERNS" "$log" | head -n 1)...; see $log); not retried"
    status=$JOBGEN_CONFIG_ERROR
  fi
  printf '%s\n' "$status"
}

# What torchrun's agent logs (at its default level) when a worker of this node fails (torch 2.x),
# and what rank 0 (on the main node) prints each time the training pass's workers start.
NODE_WORKER_FAILED='failed \(exitcode: -?[0-9]+\)'
NODE_TRAIN_START='^\{"event": "start", "phase": "train"'

# node_watch_failures LOG FROM PIDFILE RECORD: while torchrun restarts workers in place, a worker
# failure that no restart can cure (status 78, or the trainer started wrongly: classify_failure's
# patterns in the log since the previous failure) is recorded in RECORD and ends torchrun (its
# process id in PIDFILE) instead of being restarted; the flow then stops the job with 78.
node_watch_failures() {
  local log=$1 from=$2 pidfile=$3 record=$4 seen=$2 size pid codes code permanent
  set +o pipefail
  while sleep 1; do
    [ -f "$log" ] || continue
    size=$(wc -c <"$log")
    [ "$size" -gt "$seen" ] || continue
    codes=$(tail -c "+$((seen + 1))" "$log" | grep -oE "$NODE_WORKER_FAILED" | grep -oE -- '-?[0-9]+')
    if [ -n "$codes" ]; then
      # As classify_failure judges a pass: 78 itself, or a worker's own exit (not a signal: a
      # negative code) after the trainer said it was started wrongly.
      permanent=""
      for code in $codes; do
        if [ "$code" -eq "$JOBGEN_CONFIG_ERROR" ] || { [ "$code" -gt 0 ] && [ "$code" -lt 128 ] &&
          tail -c "+$((from + 1))" "$log" | grep -E "$JOBGEN_CONFIG_PATTERNS" >/dev/null; }; then
          permanent=1
        fi
      done
      if [ -n "$permanent" ]; then
        printf '%s\n' "$JOBGEN_CONFIG_ERROR" >"$record"
        node_say "a worker failed in a way no restart cures (status $JOBGEN_CONFIG_ERROR or a trainer started wrongly; see $log); not restarted in place"
        read -r pid <"$pidfile" 2>/dev/null && kill -TERM "$pid" 2>/dev/null
        return 0
      fi
      from=$size
    fi
    seen=$size
  done
}

# node_count_restarts LOG FROM FILE: on the main node, where rank 0 says when the workers start,
# how often the training pass restarted in place (its starts in LOG after byte FROM, less the
# first), recorded in FILE for `jobgen report` and `jobgen runs`.
node_count_restarts() {
  local starts
  starts=$(tail -c "+$(($2 + 1))" "$1" 2>/dev/null | grep -cE "$NODE_TRAIN_START")
  [ "${starts:-0}" -gt 0 ] || return 0
  printf '%s\n' "$((starts - 1))" >"$3" 2>/dev/null || true
  [ "$starts" -eq 1 ] || node_say "the training pass restarted in place $((starts - 1)) time(s)"
}

node_setup() {
  # 32 workers per node open many files; "Too many open files" shows up as RX timeouts. The soft
  # limit goes as high as the hard one allows (at most 65535); a line says so only where what is
  # left is short of about 1,024 files per worker (a CPU rehearsal's few workers need no more).
  local hard need=$(( ${JOBGEN_WORKERS_PER_NODE:-32} * 1024 ))
  hard=$(ulimit -Hn)
  if [ "$hard" = unlimited ] || [ "$hard" -gt 65535 ]; then hard=65535; fi
  ulimit -Sn "$hard" 2>/dev/null || true
  if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ] && [ "$(ulimit -n)" -lt 65535 ]; then
    node_say "open-file limit $(ulimit -n) (the hard limit) is short of about $need for ${JOBGEN_WORKERS_PER_NODE:-32} workers: raise it (limits.conf, the container's ulimits) if the pass fails with 'Too many open files'"
  fi
  # Keep the rendezvous port out of the ephemeral range. Needs privileges that a container or a
  # user job may not have, so it is best effort. Said once per allocation, by node 0 (the port is
  # bound on its host) in its first pass: not by every node in every pass.
  if ! { sudo -n sysctl -w "net.ipv4.ip_local_reserved_ports=$MASTER_PORT" \
         || sysctl -w "net.ipv4.ip_local_reserved_ports=$MASTER_PORT"; } >/dev/null 2>&1 \
     && [ "${node_rank:-0}" = 0 ] \
     && { [ "${pass:-}" != train ] || [ ! -f "${log_dir:-}/compile.log" ]; }; then
    node_say "could not reserve port $MASTER_PORT (no privilege); continuing"
  fi
}

node_launch() {
  local pass=$1
  shift
  case $pass in compile | train) ;; *) node_say "unknown pass '$pass'"; return 2 ;; esac
  node_rank=${JOBGEN_NODE_RANK:-${SLURM_NODEID:?not started by srun or the Batch entrypoint}}
  local nnodes=${JOBGEN_NNODES:-${SLURM_NNODES:?}}
  : "${MASTER_ADDR:?}" "${MASTER_PORT:?}" "${JOBGEN_LOG_DIR:?}" "${JOBGEN_WORKDIR:?}" "${JOBGEN_PROGRAM:?}"
  local log_dir="$JOBGEN_LOG_DIR/node-$node_rank"
  mkdir -p "$log_dir" || return 1
  # Which host this node is (Slurm's node name; the host name elsewhere): `jobgen watch` names a
  # node that hangs or keeps failing by it.
  printf '%s\n' "${SLURMD_NODENAME:-$(hostname 2>/dev/null || uname -n)}" >"$log_dir/host" 2>/dev/null || true
  node_setup
  # The trainer runs by absolute path from the submission directory, so that the job's relative
  # paths keep their meaning.
  local program="$JOBGEN_WORKDIR/$JOBGEN_PROGRAM"
  if [ ! -f "$program" ]; then
    node_say "no trainer at $program (check the site's paths); not retried"
    printf '%s\n' "$JOBGEN_CONFIG_ERROR" > "$log_dir/$pass.status" || true
    return "$JOBGEN_CONFIG_ERROR"
  fi

  # The trainer's files where jobgen's image declares them (env/containers/images.yaml): an
  # image built or laid out otherwise stops here, named, instead of deep inside the trainer.
  local trainer_file
  local -a trainer_files=()
  IFS=: read -r -a trainer_files <<<"${JOBGEN_TRAINER_FILES:-}"
  for trainer_file in ${trainer_files[@]+"${trainer_files[@]}"}; do
    if [ ! -f "$trainer_file" ]; then
      node_say "no $trainer_file: the image does not hold the trainer where env/containers/images.yaml declares it (build it from \`jobgen image-context\`); not retried"
      printf '%s\n' "$JOBGEN_CONFIG_ERROR" > "$log_dir/$pass.status" || true
      return "$JOBGEN_CONFIG_ERROR"
    fi
  done

  local -a wrapper=()
  if [ "$pass" = compile ] && [ -n "${JOBGEN_COMPILE_WRAPPER:-}" ]; then
    wrapper=("$JOBGEN_COMPILE_WRAPPER")
  fi
  # Each pass meets under its own rendezvous id: a node still in (or skipping) the other pass
  # fails the rendezvous instead of joining it. JOBGEN_RDZV_TIMEOUT (the Batch entrypoint sets it)
  # bounds how long torchrun's static rendezvous waits for the other nodes (torch's default: 600 s).
  # Underscore spellings only: torch 1.13 (neuronx-nemo-megatron's pin) has no hyphenated aliases.
  local -a rdzv=()
  local in_place=${JOBGEN_RESTARTS_IN_PLACE:-0}
  case $in_place in '' | *[!0-9]*) in_place=0 ;; esac
  [ "$pass" = train ] || in_place=0
  if [ "$in_place" -gt 0 ]; then
    # Restarts inside the allocation: torchrun's elastic agent with the c10d rendezvous, hosted
    # by the main node's agent. A worker that fails makes every node's agent stop its workers
    # and start them again (they resume from the newest complete checkpoint), at most
    # JOBGEN_RESTARTS_IN_PLACE times per node; nothing else of the flow runs again.
    # The agents rank the nodes by sorting their --local_addr (torch's host name by default):
    # the main node gives its address (where the first-ranked node's workers meet), every other
    # node a label that sorts after any address, by its node rank. So torchrun's node ranks
    # (GROUP_RANK) are the flow's, and rank 0 is on the main node, as without restarts.
    local conf=is_host=0 addr
    addr=$(printf '~jobgen-node-%06d' "$node_rank")
    [ "$node_rank" != 0 ] || conf=is_host=1 addr=$MASTER_ADDR
    [ -z "${JOBGEN_RDZV_TIMEOUT:-}" ] || conf+=",join_timeout=$JOBGEN_RDZV_TIMEOUT"
    # The workers meet in a store of their own each round (on a free port of the main node), not
    # in the agents' store under a prefix named by each node's own restart count: a node
    # restarted for its peer's failure does not count it, and its new workers would read the
    # previous round's addresses there and wait for workers that are gone (pytorch#135712).
    # torch 2.5.0 first shares the agents' store (pytorch#128096), and this variable opts out;
    # 2.1.2, 2.2.2 and 2.4.1 (the shipped images) never share it and ignore the variable. It is
    # for the CPU rehearsals' torch and any image on 2.5 or later.
    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    # How often each agent looks at its workers and at peers waiting for a new round: torch
    # 2.4+'s default, 0.1 s. Older torchrun (2.1.2, the Neuron image's) waits 5 s, twice per
    # restart (the failed node's agent, then its peers'): up to 10 s of a restart in place.
    rdzv=(--rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv_id "jobgen-$pass"
      --rdzv_conf "$conf" --max_restarts "$in_place" --local_addr "$addr" --monitor_interval 0.1)
  else
    rdzv=(--node_rank "$node_rank" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"
      --rdzv_id "jobgen-$pass")
    [ -z "${JOBGEN_RDZV_TIMEOUT:-}" ] || rdzv+=(--rdzv_conf "timeout=$JOBGEN_RDZV_TIMEOUT")
  fi
  local budget=""
  [ "$in_place" -eq 0 ] || budget=", up to $in_place restarts in place"
  node_say "$pass pass: node $node_rank of $nnodes, master $MASTER_ADDR:$MASTER_PORT, log $log_dir/$pass.log$budget"
  local log="$log_dir/$pass.log" before=0 pidfile="$log_dir/$pass.torchrun-pid" watcher=""
  [ -f "$log" ] && before=$(wc -c <"$log")
  rm -f "$log_dir/$pass.permanent" "$pidfile"
  if [ "$in_place" -gt 0 ]; then
    node_watch_failures "$log" "$before" "$pidfile" "$log_dir/$pass.permanent" &
    watcher=$!
  fi
  # pipefail: the status is torchrun's, not tee's. ${a[@]+"${a[@]}"}: an empty array expands to
  # nothing under `set -u` on bash 4.2 too (Amazon Linux 2), where "${a[@]}" is an error.
  set -o pipefail
  {
    printf '%s\n' "$BASHPID" >"$pidfile" 2>/dev/null
    exec ${wrapper[@]+"${wrapper[@]}"} torchrun \
      --nproc_per_node "${JOBGEN_WORKERS_PER_NODE:?}" --nnodes "$nnodes" ${rdzv[@]+"${rdzv[@]}"} \
      "$program" "$@"
  } 2>&1 | tee -a "$log"
  local status=$?
  if [ -n "$watcher" ]; then
    kill "$watcher" 2>/dev/null
    wait "$watcher" 2>/dev/null
    node_count_restarts "$log" "$before" "$log_dir/$pass.restarts"
  fi
  rm -f "$pidfile"
  if [ -f "$log_dir/$pass.permanent" ]; then
    status=$JOBGEN_CONFIG_ERROR
  elif [ "$status" -ne 0 ]; then
    status=$(classify_failure "$status" "$log")
  fi
  # For the Slurm job script (pass_status): srun reports the highest status of all nodes, which
  # after one node fails is the SIGTERM of the nodes srun stopped, not the failed trainer's.
  printf '%s\n' "$status" > "$log_dir/$pass.status" || node_say "cannot write $log_dir/$pass.status"
  node_say "$pass pass ended with status $status"
  return "$status"
}
