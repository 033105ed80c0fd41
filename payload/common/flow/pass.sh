# shellcheck shell=bash
# One pass (compile or train) on this node: the payload's launcher in a session of its own, the
# times it was launched and exited, and a hint when its nodes never met. The state here
# (FLOW_PASS_PID, FLOW_PASS, FLOW_STOPPING) is what the signal handlers act on (signals.sh).
# Needs base.sh; the contract (flow_init sets FLOW_LAUNCHER).

# flow_node_pass PASS ARG...: this node's launcher for one pass, in a session of its own so that
# a stop request (flow_on_signal) reaches torchrun and its workers too; returns its status.
# (FLOW_PASS and FLOW_STOPPING are read by the signal handlers and node.sh.)
FLOW_PASS_PID=""
# shellcheck disable=SC2034
FLOW_PASS=""
# shellcheck disable=SC2034
FLOW_STOPPING=""
# The pass the signal handler last acted on (signals.sh).
FLOW_STOPPED_PID=""
# shellcheck disable=SC2034
flow_node_pass() {
  local pass=$1 status log before=0 times
  shift
  # A stop that came before this pass (between passes, in a wait): no pass starts after it.
  if [ -n "$FLOW_STOPPING" ]; then
    flow_say "stopped (SIG$FLOW_STOPPING) before the $pass pass; it does not start"
    return 143
  fi
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
  # A signal trapped after the check above but before the pass had an id stopped nothing yet.
  [ -z "$FLOW_STOPPING" ] || [ "$FLOW_STOPPED_PID" = "$FLOW_PASS_PID" ] || flow_on_signal "$FLOW_STOPPING"
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
