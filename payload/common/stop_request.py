"""A request to save a checkpoint and stop early (the step/checkpoint contract's stop: loop.py's
run_steps asks it at every step boundary, run_invocation reports it): the signal the job names,
the records the flow writes before it signals, and rank 0's record that training stopped.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from common import checkpoints

STOP_SIGNAL_ENV = "JOBGEN_STOP_SIGNAL"   # set by the job where the trainer may be asked to stop
STOPPED_FILE = "stopped.json"           # written by rank 0 in JOBGEN_LOG_DIR when it did
# What the flow writes in JOBGEN_LOG_DIR before it sends the stop signal (job_flow.sh): the
# Slurm controller's time-limit record, and a node's own request (its SIGTERM, forwarded).
TIME_LIMIT_FILE = "time-limit"
NODE_STOP_FILE = "stop-requested"       # in node-<JOBGEN_NODE_RANK>/


def stop_files(env: Any) -> list[Path]:
    folder = str(env.get("JOBGEN_LOG_DIR", "") or "")
    if not folder:
        return []
    node = str(env.get("JOBGEN_NODE_RANK", "") or "")
    files = [Path(folder) / TIME_LIMIT_FILE]
    if node.isdigit():
        files.append(Path(folder) / f"node-{node}" / NODE_STOP_FILE)
    return files


class StopRequest:
    """A request to save a checkpoint and stop early: the signal named by JOBGEN_STOP_SIGNAL
    (USR1: the Slurm job's controller forwards its time-limit warning to every process of the
    job step). Ranks get the signal at slightly different moments, so they agree at every step
    boundary, with one all-reduce of a flag over a CPU (gloo) group that never enters the
    accelerator's graphs: every rank then saves the same step and stops.

    A request made while the trainer was still starting (importing torch, loading a checkpoint:
    tens of seconds on a loaded node) found the signal ignored, as the flow's shells leave it;
    the flow writes each request down before it signals (stop_files), so the trainer reads the
    record once its handler is in place, and the training loop asks before its first step."""

    def __init__(self, env: Any = None) -> None:
        import os
        import signal

        env = os.environ if env is None else env
        self.requested = False
        name = str(env.get(STOP_SIGNAL_ENV, "")).strip().upper()
        self.name = name[3:] if name.startswith("SIG") else name
        self.active = bool(self.name)
        self._group: Any = None
        if self.active:
            signum = getattr(signal, "SIG" + self.name, None)
            if not isinstance(signum, signal.Signals):
                raise ValueError(f"{STOP_SIGNAL_ENV}={self.name!r} is not a signal name")
            signal.signal(signum, self._handler)
            # After the handler: a request sent from now on is caught; one sent before was
            # written down first.
            self.requested = any(p.is_file() for p in stop_files(env))

    def _handler(self, signum: int, frame: Any) -> None:
        self.requested = True

    def agreed(self) -> bool:
        """Whether any rank was asked to stop (a collective call: every rank makes it)."""
        if not self.active:
            return False
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            return self.requested
        if self._group is None:   # made once, by every rank at the same step
            self._group = (dist.group.WORLD if dist.get_backend() == "gloo"
                           else dist.new_group(backend="gloo"))
        flag = torch.tensor([int(self.requested)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return bool(flag.item())


def record_stop(step: int, signal_name: str, rank: int, env: Any = None) -> None:
    """Rank 0 tells the job's controller that training stopped on request, not at its end."""
    import json
    import os

    env = os.environ if env is None else env
    folder = env.get("JOBGEN_LOG_DIR")
    if rank != 0 or not folder:
        return
    checkpoints.write_atomic(Path(folder) / STOPPED_FILE,
                             json.dumps({"step": step, "signal": signal_name}) + "\n")
