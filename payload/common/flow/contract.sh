# shellcheck shell=bash
# The node contract on this node (jobgen/payloads/node.py defines it): checked and made absolute
# (flow_init), the payload's digest, the site's environment, the job's files and prepare
# command, and the FSx client's setting. Needs base.sh.

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

# flow_data_check IS_MAIN SHARED: the dataset judged by its headers before any compile step
# (common/data_check.py reads what to expect from JOBGEN_DATA): on the main node where the nodes
# share a disk, which publishes its verdict for the others (flow_data_verdict), else on every node
# (each reads its own copy). A dataset that cannot be trained on is a configuration error (78): no
# retry cures it, and no node starts its launcher.
flow_data_check() {
  [ -n "${JOBGEN_DATA:-}" ] || return 0
  local status
  if [ "$2" = 1 ] && [ "$1" != 1 ]; then
    flow_wait_data_verdict
    return
  fi
  "$FLOW_PYTHON" "$JOBGEN_PAYLOAD_DIR/common/data_check.py" node
  status=$?
  [ "$2" != 1 ] || flow_data_verdict "$status"
  case $status in
    0) return 0 ;;
    "$FLOW_CONFIG_ERROR") flow_say "the data check failed; no pass started"; return "$FLOW_CONFIG_ERROR" ;;
    *) flow_say "the data check could not run; no pass started"; return 1 ;;
  esac
}

# The main node's verdict in the attempt's log folder: "STATUS ATTEMPT", written under a private
# name and renamed (as the compile marker is); ATTEMPT tells this attempt's from an earlier one's
# where a folder outlives one (the service's attempt label, Slurm's job step).
flow_data_attempt() { printf '%s/%s\n' "${JOBGEN_ATTEMPT:-}" "${SLURM_STEP_ID:-}"; }
flow_data_verdict() {
  local file="$JOBGEN_LOG_DIR/data.verdict" tmp="$JOBGEN_LOG_DIR/.data.verdict.$$"
  { printf '%s %s\n' "$1" "$(flow_data_attempt)" >"$tmp" && mv -f "$tmp" "$file"; } 2>/dev/null || {
    rm -f "$tmp"
    flow_say "cannot publish the data check's verdict in $file; the other nodes wait for it in vain"
  }
}

# flow_wait_data_verdict: the other nodes of a shared disk wait for the main node's verdict
# (JOBGEN_RDZV_TIMEOUT, default 900 s), then stop as it did: 78 on data that cannot be trained on.
flow_wait_data_verdict() {
  local file="$JOBGEN_LOG_DIR/data.verdict" limit=${JOBGEN_RDZV_TIMEOUT:-900} waited=0 code attempt
  local want
  want=$(flow_data_attempt)
  while :; do
    code="" attempt=""
    [ -f "$file" ] && read -r code attempt <"$file"
    if [ -n "$code" ] && [ "$attempt" = "$want" ]; then
      case $code in
        0) return 0 ;;
        "$FLOW_CONFIG_ERROR") flow_say "the main node's data check failed (its log says why); no pass started"; return "$FLOW_CONFIG_ERROR" ;;
        *) flow_say "the main node's data check could not run (status $code); no pass started"; return 1 ;;
      esac
    fi
    if [ -n "${FLOW_STOPPING:-}" ]; then
      flow_say "stopped (SIG$FLOW_STOPPING) while waiting for the main node's data check"
      return 143
    fi
    if [ "$waited" -ge "$limit" ]; then
      flow_say "no verdict of the main node's data check in $file within $limit s; no pass started"
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
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
