# shellcheck shell=bash
# The status rules: each node records how its flow ended (job.status: STATUS WHAT), and the
# controller picks the status that explains the job (a configuration error or a bad node, else
# the first real exit, else a signal, else success). Needs base.sh.

# flow_node_end STATUS PASS: record how this node's flow ended (for the controller), return STATUS.
flow_node_end() {
  printf '%s %s\n' "$1" "$2" >"$JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK/job.status" 2>/dev/null ||
    flow_say "cannot record the node's status in $JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK"
  return "$1"
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
