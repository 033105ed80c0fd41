# shellcheck shell=bash
# The compile decision: whether this node runs the compile pass (the cache marker named by the
# spec's compile key, the compile mode, a controller's decision), the marker once the graphs are
# complete, the cache variable, and the wait for every node's compile pass on shared storage.
# Needs base.sh.

# flow_decide_compile: sets FLOW_RUN_COMPILE (1: run the compile pass) and FLOW_MARKER, the
# file that says this spec's graphs are in the cache (its name is the spec's compile key).
# shellcheck disable=SC2034  # FLOW_RUN_COMPILE: read by node.sh and slurm.sh
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
    # Stopped (signals.sh): the others are being stopped too; waiting longer helps nothing.
    if [ -n "${FLOW_STOPPING:-}" ]; then
      flow_say "stopped (SIG$FLOW_STOPPING) while waiting for the nodes' $pass pass"
      return 143
    fi
    if [ "$waited" -ge "$limit" ]; then
      flow_say "only $arrived of $JOBGEN_NNODES nodes finished the $pass pass within $limit s"
      return 1
    fi
    sleep 2
    waited=$((waited + 2))
  done
}
