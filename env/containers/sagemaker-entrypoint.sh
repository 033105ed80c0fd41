#!/usr/bin/env bash
# jobgen's SageMaker training-job entrypoint: runs on every instance of the job (the request's
# AlgorithmSpecification.ContainerEntrypoint, rendered by `jobgen render --backend sagemaker`).
#
# usage: sagemaker-entrypoint.sh LAUNCHER
# The flow's arguments (COMPILE_ARGC COMPILE_ARG... TRAIN_ARG...) are hyperparameters: a
# training job takes at most 100 container arguments of 256 characters.
#
# On each instance:
#   1. finds its place in the job as SageMaker describes it: the hosts and this host from
#      SM_HOSTS / SM_CURRENT_HOST where a SageMaker toolkit set them, else from
#      $SM_INPUT_CONFIG_DIR/resourceconfig.json (default /opt/ml/input/config, written by
#      SageMaker on every instance). Node rank = this host's place among the sorted host names
#      (algo-1, algo-2, ...); the main node is the first, reached by its host name.
#   2. reads the flow's arguments and the long environment values from the hyperparameters, and
#      exports SMP v2's configuration (mp_parameters) as SM_HP_MP_PARAMETERS, as SageMaker's own
#      launchers do, where it is not set already;
#   3. runs the two-pass flow (payload/common/job_flow.sh) with files and prepare on every
#      instance (their disks are their own), logs under the run folder's
#      logs/$TRAINING_JOB_NAME/attempt-N (N: this instance's attempt; SageMaker restores the run
#      folder with the checkpoints on a retry), and exits with the last pass's status. SageMaker
#      ends the job when any instance's container exits non-zero; it succeeds when all exit 0.
# shellcheck source-path=SCRIPTDIR source-path=SCRIPTDIR/../../payload/common  # -x follows the flow
set -uo pipefail

# The two-pass flow (payload/common/job_flow.sh); its helpers (flow_say, flow_fail) are this
# script's too.
FLOW_WHO="jobgen[sagemaker ${SM_CURRENT_HOST:-?}]"
flow=${JOBGEN_PAYLOAD_DIR:-}/common/job_flow.sh
if [ ! -f "$flow" ]; then
  printf '%s: no %s (is payload/ in the image at JOBGEN_PAYLOAD_DIR?)\n' "$FLOW_WHO" "$flow" >&2
  exit 1
fi
# shellcheck source=../../payload/common/job_flow.sh
source "$flow"

config_dir=${SM_INPUT_CONFIG_DIR:-/opt/ml/input/config}
# "<node index> <host count> <main host> <this host>" from the toolkit's variables or the file.
place=$(SM_CONFIG_DIR=$config_dir python3 - <<'PY'
import json, os, sys
hosts, current = os.environ.get("SM_HOSTS"), os.environ.get("SM_CURRENT_HOST")
if not (hosts and current):
    path = os.path.join(os.environ["SM_CONFIG_DIR"], "resourceconfig.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        sys.exit(f"cannot read {path} ({exc}): this entrypoint runs in a SageMaker training job")
    hosts, current = json.dumps(config["hosts"]), config["current_host"]
hosts = sorted(json.loads(hosts))
if current not in hosts:
    sys.exit(f"this host {current!r} is not among the job's hosts {hosts}")
print(hosts.index(current), len(hosts), hosts[0], current)
PY
) || flow_fail "cannot find this instance's place in the job"
read -r node_index num_nodes main_host current_host <<<"$place"
FLOW_WHO="jobgen[sagemaker $current_host]" FLOW_CONTRACT_FROM="the training job's Environment"

# The hyperparameters jobgen rendered: the flow's arguments (jobgen_args_NN, a JSON list in
# pieces), environment values too long for the request's Environment (jobgen_env_NAME_NN) and
# SMP v2's mp_parameters. Read back NUL-separated: no value is ever parsed by the shell.
hp=$config_dir/hyperparameters.json
[ -f "$hp" ] || flow_fail "no $hp: this entrypoint runs in a SageMaker training job"
spilled=$(mktemp) || flow_fail "cannot create a temporary file"
trap 'rm -f "$spilled"' EXIT
HP=$hp python3 - >"$spilled" <<'PY' || flow_fail "cannot read the job's arguments from $hp"
import json, os, re, sys
with open(os.environ["HP"], encoding="utf-8") as f:
    hp = json.load(f)
def joined(prefix):
    keys = sorted(k for k in hp if re.fullmatch(re.escape(prefix) + r"\d\d", k))
    return "".join(hp[k] for k in keys) if keys else None
args = joined("jobgen_args_")
if args is None:
    sys.exit("no jobgen_args_NN hyperparameters (render the job with jobgen)")
out = []
for name in sorted({m.group(1) for k in hp for m in [re.fullmatch(r"jobgen_env_([A-Za-z_][A-Za-z0-9_]*)_\d\d", k)] if m}):
    out.append(f"{name}={joined(f'jobgen_env_{name}_')}")
if hp.get("mp_parameters") and not os.environ.get("SM_HP_MP_PARAMETERS"):
    out.append(f"SM_HP_MP_PARAMETERS={hp['mp_parameters']}")
sys.stdout.write("".join(v + "\0" for v in out) + "\0" + "".join(a + "\0" for a in json.loads(args)))
PY
exports=() flow_argv=() seen_break=0
while IFS= read -r -d '' item; do
  if [ "$seen_break" = 0 ]; then
    if [ -z "$item" ]; then seen_break=1; else exports+=("$item"); fi
  else
    flow_argv+=("$item")
  fi
done <"$spilled"
for item in ${exports[@]+"${exports[@]}"}; do export "${item?}"; done

[ $# -eq 1 ] || flow_fail "usage: sagemaker-entrypoint.sh LAUNCHER (the flow's arguments are hyperparameters)"
export JOBGEN_LAUNCHER=$1
set -- ${flow_argv[@]+"${flow_argv[@]}"}
flow_init || exit "$?"
if [ -n "${JOBGEN_NODES:-}" ] && [ "$JOBGEN_NODES" != "$num_nodes" ]; then
  flow_fail "this training job was rendered for $JOBGEN_NODES instances but has $num_nodes; render it again with --nodes $num_nodes"
fi

job=${TRAINING_JOB_NAME:-no-job-name}
job=${job//\//_}
export MASTER_ADDR=${JOBGEN_MAIN_HOST:-$main_host} MASTER_PORT
export JOBGEN_NODE_RANK=$node_index JOBGEN_NNODES=$num_nodes
JOBGEN_LOG_DIR=$(flow_next_attempt "$JOBGEN_RUN_DIR/logs/$job" "$node_index")
export JOBGEN_LOG_DIR
is_main=0
[ "$node_index" -eq 0 ] && is_main=1
flow_say "job $job: node $node_index of $num_nodes, main node $MASTER_ADDR:$MASTER_PORT, logs in $JOBGEN_LOG_DIR"
# JOBGEN_SHARED_FS=0: this instance's disk is its own. Its checkpoint folder is synced to the
# one S3 prefix with every other instance's, writes and deletes alike, so each node's leader
# seals, clears and prunes only its own keys (payload/common/checkpoints.py); and NeMo's dataset
# index files are made on each instance (payload/common/node_indices.py).
export JOBGEN_IS_MAIN=$is_main JOBGEN_SETUP_ON=every JOBGEN_SHARED_FS=0
flow_node "$@"
status=$?
if [ "$status" -eq 75 ]; then
  # A bad node: SageMaker shows what /opt/ml/output/failure holds as the job's failure reason.
  output=${config_dir%/input/config}/output
  if ! { mkdir -p "$output" && "${JOBGEN_PYTHON:-python3}" "$JOBGEN_PAYLOAD_DIR/common/health.py" summary >"$output/failure"; }; then
    flow_say "cannot write the failure reason to $output/failure"
  fi
fi
exit "$status"
