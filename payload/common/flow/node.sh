# shellcheck shell=bash
# The flow on one node, stage by stage: setup, health gate, data check, compile decision and pass, marker,
# node-local cache copy, training pass, and the record of how it ended. Needs every stage file.

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
  flow_stopped "after the health gate" health && return 143
  flow_data_check "$is_main" "$shared"
  status=$?
  if [ "$status" -ne 0 ]; then
    flow_node_end "$status" data
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
    flow_stopped "after the compile pass" compile && return 143
    # The graphs are complete once every node's compile pass has ended (each compiles its own):
    # on a shared filesystem the main node waits for the others before it writes the marker.
    if [ "$is_main" = 1 ]; then
      if [ "$shared" != 1 ] || flow_wait_for_nodes compile; then
        flow_mark_compiled
      else
        flow_stopped "while the nodes' compile passes ended" compile && return 143
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
      flow_stopped "before the compile cache copy" "compile cache copy" && return 143
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

  flow_stopped "before the training pass" train && return 143
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

# flow_stopped WHERE STAGE: whether a SIGTERM/SIGINT came (FLOW_STOPPING); if so, say so, record
# the node's end (143, STAGE) and let the caller return: no pass starts after a stop.
flow_stopped() {
  [ -n "$FLOW_STOPPING" ] || return 1
  flow_say "stopped (SIG$FLOW_STOPPING) $1; no pass starts after it"
  flow_node_end 143 "$2"
  return 0
}
