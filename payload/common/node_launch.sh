#!/usr/bin/env bash
# Per-node launch shared by the payload launchers: node setup, rank, logs, one torchrun.
# Sourced by payload/<payload>/launch.sh, which calls: node_launch PASS TRAINER_ARG...
#
# Reads: MASTER_ADDR MASTER_PORT JOBGEN_WORKERS_PER_NODE JOBGEN_LOG_DIR JOBGEN_RUN_DIR JOBGEN_WORKDIR
#        JOBGEN_PROGRAM JOBGEN_COMPILE_WRAPPER, and the node's place in the job from
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
  local -a rdzv=(--rdzv_id "jobgen-$pass")
  if [ -n "${JOBGEN_RDZV_TIMEOUT:-}" ]; then
    rdzv+=(--rdzv_conf "timeout=$JOBGEN_RDZV_TIMEOUT")
  fi
  node_say "$pass pass: node $node_rank of $nnodes, master $MASTER_ADDR:$MASTER_PORT, log $log_dir/$pass.log"
  # pipefail: the status is torchrun's, not tee's. ${a[@]+"${a[@]}"}: an empty array expands to
  # nothing under `set -u` on bash 4.2 too (Amazon Linux 2), where "${a[@]}" is an error.
  set -o pipefail
  ${wrapper[@]+"${wrapper[@]}"} torchrun \
    --nproc_per_node "${JOBGEN_WORKERS_PER_NODE:?}" --nnodes "$nnodes" --node_rank "$node_rank" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" ${rdzv[@]+"${rdzv[@]}"} \
    "$program" "$@" 2>&1 | tee -a "$log_dir/$pass.log"
  local status=$?
  [ "$status" -eq 0 ] || status=$(classify_failure "$status" "$log_dir/$pass.log")
  # For the Slurm job script (pass_status): srun reports the highest status of all nodes, which
  # after one node fails is the SIGTERM of the nodes srun stopped, not the failed trainer's.
  printf '%s\n' "$status" > "$log_dir/$pass.status" || node_say "cannot write $log_dir/$pass.status"
  node_say "$pass pass ended with status $status"
  return "$status"
}
