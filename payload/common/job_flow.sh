#!/usr/bin/env bash
# jobgen's job lifecycle on the nodes: the one two-pass flow that every executor runs.
#
#   health gate -> data check -> compile marker -> compile pass -> marker -> node-local cache copy -> training pass
#   -> the job's status (a configuration error, 78, wins) -> restart accounting
#
# Who calls it (each only wires its scheduler's facts into the node contract):
#   sbatch script        sources it and calls `flow_slurm_job` (the job's controller: decides the
#                        compile pass once, then one `srun` of `job_flow.sh node` on every node)
#   AWS Batch entrypoint sources it and calls `flow_node` on every node
#   submitit, jobgen run `bash job_flow.sh node COMPILE_ARGC COMPILE_ARG... TRAIN_ARG...`
#
# The node contract (the variables read here) is defined once, in jobgen/payloads/node.py, which also
# documents each one. Job-wide: MASTER_PORT JOBGEN_RUN_DIR JOBGEN_PAYLOAD_DIR
# JOBGEN_PAYLOAD_DIGEST JOBGEN_LAUNCHER
# JOBGEN_WORKERS_PER_NODE JOBGEN_WORKDIR JOBGEN_PROGRAM JOBGEN_COMPILE_WRAPPER JOBGEN_PASSES
# JOBGEN_COMPILE_MODE JOBGEN_COMPILE_CACHE JOBGEN_LOCAL_COMPILE_CACHE JOBGEN_COMPILE_KEY
# JOBGEN_CACHE_VAR JOBGEN_CACHE_SUFFIX JOBGEN_NODES JOBGEN_MAX_RESTARTS JOBGEN_RESTARTS_IN_PLACE
# JOBGEN_RDZV_TIMEOUT
# JOBGEN_SHARED_FS JOBGEN_SETUP_ON JOBGEN_FILES_JSON JOBGEN_PREPARE_JSON JOBGEN_ACTIVATE
# JOBGEN_HEALTH JOBGEN_DATA (and JOBGEN_HEALTH_DONE, set by a controller that ran the gate itself).
# Per node (the executor's facts): MASTER_ADDR JOBGEN_NODE_RANK JOBGEN_NNODES JOBGEN_IS_MAIN
# JOBGEN_LOG_DIR, and JOBGEN_RUN_COMPILE where a controller has decided the compile pass.
#
# Exit statuses: the trainer's; 78 (EX_CONFIG) for a failure that no restart can cure (the
# launcher classifies it: a missing command or trainer, an import error, refused arguments); 75
# (EX_TEMPFAIL) for a node the health gate found bad (the job could run elsewhere, not here).
# Works on bash 4.2 (Amazon Linux 2): no mapfile -d, empty arrays as ${a[@]+"${a[@]}"}.
#
# The flow is split by stage, one file each under flow/ next to this script; this file loads
# them and runs the node command. Each stage file can be sourced with base.sh alone and tested:
#   base.sh      exit statuses, messages, small helpers
#   contract.sh  the node contract checked (flow_init), payload digest, setup, prepare, data check,
#                FSx client
#   gate.sh      the health gate (per node; once per allocation under the Slurm controller)
#   compile.sh   the compile decision, the cache marker, the wait for every node's compile pass
#   pass.sh      one pass: the launcher in its own session, its times, the rendezvous hint
#   signals.sh   SIGTERM/SIGINT -> the trainers' stop request; Slurm's time-limit warning
#   requeue.sh   restarts after failures, the restart decision, requeues
#   status.sh    each node's job.status and the status that explains the job
#   node.sh      flow_node: the stages in order on one node
#   slurm.sh     flow_slurm_job: the sbatch script's controller

# The stage files are found next to this file (the payload snapshot the job runs, or the image's
# payload), never in a checkout. (shellcheck -x follows them from here.)
# shellcheck source-path=SCRIPTDIR
case ${BASH_SOURCE[0]} in
  /*) FLOW_LIB=${BASH_SOURCE[0]%/*}/flow ;;
  */*) FLOW_LIB=$PWD/${BASH_SOURCE[0]%/*}/flow ;;
  *) FLOW_LIB=$PWD/flow ;;
esac
flow_loaded=1
# shellcheck source=flow/base.sh
source "$FLOW_LIB/base.sh" || flow_loaded=0
# shellcheck source=flow/contract.sh
source "$FLOW_LIB/contract.sh" || flow_loaded=0
# shellcheck source=flow/gate.sh
source "$FLOW_LIB/gate.sh" || flow_loaded=0
# shellcheck source=flow/compile.sh
source "$FLOW_LIB/compile.sh" || flow_loaded=0
# shellcheck source=flow/pass.sh
source "$FLOW_LIB/pass.sh" || flow_loaded=0
# shellcheck source=flow/signals.sh
source "$FLOW_LIB/signals.sh" || flow_loaded=0
# shellcheck source=flow/requeue.sh
source "$FLOW_LIB/requeue.sh" || flow_loaded=0
# shellcheck source=flow/status.sh
source "$FLOW_LIB/status.sh" || flow_loaded=0
# shellcheck source=flow/node.sh
source "$FLOW_LIB/node.sh" || flow_loaded=0
# shellcheck source=flow/slurm.sh
source "$FLOW_LIB/slurm.sh" || flow_loaded=0
if [ "$flow_loaded" != 1 ]; then
  printf '%s: the flow in %s is incomplete (a stage file is missing): render or build the payload again\n' \
    "${FLOW_WHO:-jobgen}" "$FLOW_LIB" >&2
  return 78 2>/dev/null || exit 78
fi
unset flow_loaded

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
