"""The step/checkpoint/resume contract every payload honours, written once.

A payload supplies a ``Runner`` (one optimizer step, save, resume); this module decides how
far an invocation runs, when it saves, what it reports, how a save is sealed across ranks and
which checkpoint a resume loads. torch.distributed is imported lazily so the pure parts stay
cheap to test.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from common import checkpoints
from common.events import EventLog, to_tensorboard


class Runner(Protocol):
    step: int               # optimizer steps completed so far
    consumed: int           # samples of the global stream consumed so far
    log: EventLog
    tensorboard: Any        # a SummaryWriter, or None

    def train_step(self) -> dict[str, Any]:
        """Run one optimizer step, advance ``step``/``consumed``, return the event numbers."""

    def save(self) -> None:
        """Write a checkpoint of the current step (see ``sealed_save``)."""

    def resume(self) -> None:
        """Load the newest complete checkpoint, if any (see ``agreed_newest``)."""


def target_step(phase: str, current: int, max_steps: int, compile_steps: int,
                bound: int) -> int:
    """The step count an invocation stops at.

    Compile: exactly ``compile_steps`` from a fresh model. Train: ``max_steps``, or ``bound``
    more steps than the resumed step when a bound (``--steps N``, N >= 0) is given.
    """
    if phase == "compile":
        return compile_steps
    return max_steps if bound < 0 else min(max_steps, current + bound)


STOP_SIGNAL_ENV = "JOBGEN_STOP_SIGNAL"   # set by the job where the trainer may be asked to stop
STOPPED_FILE = "stopped.json"           # written by rank 0 in JOBGEN_LOG_DIR when it did


class StopRequest:
    """A request to save a checkpoint and stop early: the signal named by JOBGEN_STOP_SIGNAL
    (USR1: the Slurm job's controller forwards its time-limit warning to every process of the
    job step). Ranks get the signal at slightly different moments, so they agree at every step
    boundary, with one all-reduce of a flag over a CPU (gloo) group that never enters the
    accelerator's graphs: every rank then saves the same step and stops."""

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


def run_steps(runner: Runner, *, phase: str, target: int, checkpoint_every: int,
              stop: StopRequest | None = None) -> bool:
    """Step until ``target``, reporting each step; in training save every ``checkpoint_every``
    steps and at the end. With ``stop``, a stop request agreed by all ranks ends training early,
    after saving the step just trained; returns whether that happened."""
    train = phase == "train"
    saved_at = runner.step
    stopped = False
    before_step = getattr(runner, "before_step", None)
    while runner.step < target:
        if before_step is not None:
            before_step()   # a rehearsal's injected fault, before the node says it started
        runner.log.beat(phase, runner.step + 1)
        numbers = runner.train_step()
        runner.log.emit("step", phase=phase, step=runner.step,
                        consumed_samples=runner.consumed, **numbers)
        to_tensorboard(runner.tensorboard, runner.step, numbers)
        if train and runner.step % checkpoint_every == 0:
            runner.save()
            saved_at = runner.step
        if train and stop is not None and runner.step < target and stop.agreed():
            stopped = True
            break
    if train and runner.step != saved_at:
        runner.save()  # a bounded, finished or stopped run keeps what it trained
    return stopped


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


def run_invocation(runner: Runner, args: argparse.Namespace) -> None:
    """One invocation of a payload: resume (train only), step to the target, report ``done``
    (or ``stopped``, when a stop request ended training early: see StopRequest).

    Reads the flags every payload shares: --phase --max-steps --compile-steps --steps
    --checkpoint-every.
    """
    stop = StopRequest() if args.phase == "train" else None
    if args.phase == "train":
        runner.resume()
    target = target_step(args.phase, runner.step, args.max_steps, args.compile_steps,
                         args.steps)
    stopped = run_steps(runner, phase=args.phase, target=target,
                        checkpoint_every=args.checkpoint_every, stop=stop)
    if stopped and stop is not None:
        runner.log.emit("stopped", phase=args.phase, step=runner.step,
                        consumed_samples=runner.consumed, signal=stop.name)
        record_stop(runner.step, stop.name, 0 if runner.log.enabled else 1)
    else:
        runner.log.emit("done", phase=args.phase, step=runner.step,
                        consumed_samples=runner.consumed)
    if runner.tensorboard is not None:
        runner.tensorboard.close()


def agreed_newest(root: Path, rank: int) -> str | None:
    """Tag of the newest complete checkpoint as rank 0 sees it, shared with every rank (a lagging
    network filesystem must not let ranks resume from different steps)."""
    import torch.distributed as dist

    choice: list[str | None] = [None]
    if rank == 0:
        newest = checkpoints.newest_complete(root)
        choice = [newest.tag if newest else None]
    dist.broadcast_object_list(choice, src=0)
    return choice[0]


def sealed_save(root: Path, step: int, state: dict[str, Any], rank: int, keep: int,
                log: EventLog, write: Callable[[Path], None]) -> None:
    """Save one checkpoint: rank 0 clears the directory, every rank runs ``write`` (which decides
    who writes what), and rank 0 seals it with the marker only after all ranks are done."""
    import torch.distributed as dist

    if rank == 0:
        checkpoints.prepare_save_dir(root, step)
    dist.barrier()
    write(root / checkpoints.tag_for(step))
    dist.barrier()
    if rank == 0:
        sealed = checkpoints.mark_complete(root, step, state)
        checkpoints.prune(root, keep)
        log.emit("checkpoint", step=step, path=str(sealed.path))
    # Nobody races ahead (or exits) while rank 0 is still sealing and pruning.
    dist.barrier()
