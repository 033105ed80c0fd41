"""`jobgen run`: the job on this machine, no scheduler. Each emulated node is its own process
group running the one two-pass flow (payload/common/job_flow.sh) with the node contract and the
facts a scheduler would give it, so the rehearsal exercises the same two passes, rendezvous, node
ranks, checkpoints and exit-status rules as a real multi-node job; the main node's status is the
job's."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional, TextIO

from . import launch, node
from .spec import JobSpec

# How long the emulated nodes wait for each other (Batch's default).
RDZV_TIMEOUT_S = 900


def node_commands(spec: JobSpec, job_id: str) -> list[tuple[list[str], dict[str, str]]]:
    """(argv, environment) for each emulated node; node 0 is the main node."""
    lau = launch.for_spec(spec, "local")
    contract = node.contract(spec, lau, "local", rdzv_timeout_s=RDZV_TIMEOUT_S)
    base = node.environment(spec, lau, contract)
    # The nodes share this machine's folders: the main node writes the files, once.
    base["JOBGEN_SETUP_ON"] = "main"
    flow = Path.cwd() / contract.JOBGEN_PAYLOAD_DIR / "common" / "job_flow.sh"
    argv = ["bash", str(flow), "node", *node.flow_args(lau)]
    log_dir = Path.cwd() / contract.JOBGEN_RUN_DIR / "logs" / job_id
    out = []
    for index in range(spec.nodes):
        env = dict(base)
        env.update({"MASTER_ADDR": "127.0.0.1", "JOBGEN_NODE_RANK": str(index),
                    "JOBGEN_NNODES": str(spec.nodes), "JOBGEN_IS_MAIN": str(int(index == 0)),
                    "JOBGEN_LOG_DIR": str(log_dir), "FLOW_WHO": f"jobgen[local node {index}]"})
        out.append((argv, env))
    return out


def _pump(stream: TextIO, prefix: str, emit: Callable[[str], None]) -> None:
    for line in stream:
        emit(prefix + line.rstrip("\n"))


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the node's process group, then SIGKILL what is still there after `grace_s`."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def run(spec: JobSpec, emit: Callable[[str], None] = print, job_id: Optional[str] = None,
        grace_s: float = 30.0) -> int:
    """Start every node, stream their output with a node prefix, return the main node's status.
    When the main node ends, the others get `grace_s` to finish (Batch stops them too)."""
    job_id = job_id or f"local-{int(time.time())}"
    procs, pumps = [], []
    for index, (argv, env) in enumerate(node_commands(spec, job_id)):
        full_env = dict(os.environ)
        full_env.update(env)
        # The nodes use the interpreter (and torchrun) of the environment jobgen runs in.
        full_env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable),
                                            full_env.get("PATH", "")])
        proc = subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        procs.append(proc)
        assert proc.stdout is not None
        pump = threading.Thread(target=_pump, args=(proc.stdout, f"[node {index}] ", emit),
                                daemon=True)
        pump.start()
        pumps.append(pump)
    try:
        status = procs[0].wait()
        deadline = time.monotonic() + grace_s
        for proc in procs[1:]:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _stop(proc)
    except KeyboardInterrupt:
        for proc in procs:
            _stop(proc)
        status = 130
    for pump in pumps:
        pump.join(timeout=5)
    return status
