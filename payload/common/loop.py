"""The step/checkpoint/resume contract every payload honours, written once.

A payload supplies a ``Runner`` (one optimizer step, save, resume); this module decides how
far an invocation runs, when it saves, what it reports, how a save is sealed across ranks and
which checkpoint a resume loads (a request to save and stop early: stop_request.py).
torch.distributed is imported lazily so the pure parts stay cheap to test.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from common import background, checkpoints
from common.events import EventLog, to_tensorboard
from common.stop_request import StopRequest, record_stop


class Runner(Protocol):
    step: int               # optimizer steps completed so far
    consumed: int           # samples of the global stream consumed so far
    log: EventLog
    tensorboard: Any        # a SummaryWriter, or None
    ckpt_root: Path         # its checkpoint folder (the training pass resumes from it)

    def train_step(self) -> dict[str, Any]:
        """Run one optimizer step, advance ``step``/``consumed``, return the event numbers."""

    def save(self, root: Path | None = None) -> None:
        """Write a checkpoint of the current step (see ``sealed_save``) into its checkpoint
        folder, or into ``root`` (the compile pass's scratch save: see ``compile_save``)."""

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


COMPILE_SAVE = "compile-save"   # beside checkpoints/: where the compile pass saves, then removes
NODE_SCRATCH_ENV = "JOBGEN_NODE_SCRATCH"   # a node's unsynced scratch folder, where a job has one

def run_steps(runner: Runner, *, phase: str, target: int, checkpoint_every: int,
              stop: StopRequest | None = None) -> bool:
    """Step until ``target``, reporting each step; in training save every ``checkpoint_every``
    steps and at the end. With ``stop``, a stop request agreed by all ranks ends training early,
    after saving the step just trained; returns whether that happened."""
    train = phase == "train"
    saved_at = runner.step
    stopped = False
    before_step = getattr(runner, "before_step", None)
    if train and stop is not None and runner.step < target and stop.agreed():
        stopped = True      # asked before the first step: nothing new to train or save
    while not stopped and runner.step < target:
        if before_step is not None:
            before_step()   # a rehearsal's injected fault, before the node says it started
        runner.log.beat(phase, runner.step + 1)
        numbers = runner.train_step()
        runner.log.emit("step", phase=phase, step=runner.step,
                        consumed_samples=runner.consumed, **numbers)
        to_tensorboard(runner.tensorboard, runner.step, numbers)
        background.finish(wait=False)   # seal a background save whose write is complete
        if train and runner.step % checkpoint_every == 0:
            runner.save()
            saved_at = runner.step
        if train and stop is not None and runner.step < target and stop.agreed():
            stopped = True
            break
    if train and runner.step != saved_at:
        runner.save()  # a bounded, finished or stopped run keeps what it trained
    background.finish(wait=True)   # a pass ends with its last save sealed
    settle = getattr(runner, "settle_saves", None)
    if settle is not None:
        settle()   # a library's own background saves (NxD's)
    return stopped


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
    if args.phase == "compile":
        compile_save(runner)
    if stopped and stop is not None:
        runner.log.emit("stopped", phase=args.phase, step=runner.step,
                        consumed_samples=runner.consumed, signal=stop.name)
        record_stop(runner.step, stop.name, 0 if runner.log.enabled else 1)
    else:
        runner.log.emit("done", phase=args.phase, step=runner.step,
                        consumed_samples=runner.consumed)
    if runner.tensorboard is not None:
        runner.tensorboard.close()


def node_place(env: Any = None) -> tuple[int, int, bool, bool]:
    """(this node's index, the job's nodes, whether this process leads its node (local rank 0),
    whether the node keeps its checkpoints on a disk of its own): torchrun's variables, and the
    flow's JOBGEN_SHARED_FS (0 on SageMaker's instances; unset, as for a trainer started by hand:
    one shared folder)."""
    import os

    from common.events import node_index

    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE", "1") or 1)
    per_node = int(env.get("LOCAL_WORLD_SIZE", "1") or 1)
    leader = str(env.get("LOCAL_RANK", "0") or "0") == "0"
    return (node_index(env), max(1, world // per_node), leader,
            str(env.get("JOBGEN_SHARED_FS", "1")).strip() == "0")


def compile_save(runner: Runner) -> None:
    """The compile pass runs the save path once (as HLAT's compile pass saves at step 3), so that
    the graphs a save traces are compiled with the rest and the first real save does not compile
    mid-run; it saves into COMPILE_SAVE beside the checkpoint folder, which the training pass
    never reads, and removes it (rank 0, and each node's leader on a disk of its own, after the
    save's last barrier: nobody writes there any more), with the folder around it if the save
    made that: the compile pass leaves no trace. Where the job names a node scratch folder
    (JOBGEN_NODE_SCRATCH: SageMaker, whose run folder every instance syncs to S3), it saves
    there instead: a whole checkpoint never uploaded, and never left in the S3 prefix (so
    restored by every retry) when an attempt dies in it."""
    import os
    import shutil

    scratch = Path(runner.ckpt_root).parent / COMPILE_SAVE
    node_scratch, run_dir = os.environ.get(NODE_SCRATCH_ENV), os.environ.get("JOBGEN_RUN_DIR")
    if node_scratch and run_dir:
        scratch = Path(node_scratch) / Path(run_dir).name / COMPILE_SAVE
    made = not scratch.parent.exists()
    runner.save(root=scratch)
    background.finish(wait=True)
    _, _, leader, own_disk = node_place()
    if runner.log.enabled or (own_disk and leader):
        shutil.rmtree(scratch.parent if made else scratch, ignore_errors=True)


def agreed_newest(root: Path, rank: int) -> str | None:
    """Tag of the newest checkpoint that is complete as every reader sees it, shared with every
    rank: rank 0 on one shared folder, each node's leader where nodes keep their own disks (after
    a restore from S3 each holds what arrived). Ranks never resume from different steps, and a
    lagging network filesystem or an upload that never arrived makes them agree on an older step
    that all of them have, never a newer one that some lack. Chosen by step number, not by time."""
    import torch.distributed as dist

    _, _, leader, own_disk = node_place()
    view: list[int] | None = None
    if rank == 0 or (own_disk and leader):
        view = [ckpt.step for ckpt in checkpoints.list_checkpoints(root)[0]]
    views: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(views, view)
    seen = [set(v) for v in views if v is not None]
    common = set.intersection(*seen) if seen else set()
    return checkpoints.tag_for(max(common)) if common else None


def sealed_save(root: Path, step: int, state: dict[str, Any], rank: int, keep: int,
                log: EventLog, write: Callable[[Path], Any]) -> None:
    """Save one checkpoint: the directory is cleared (by rank 0, or by each node's leader on a
    disk of its own), every rank runs ``write`` (which decides who writes what), each node's
    leader seals its node's part, and rank 0 seals the whole with the marker, naming the node
    count, only after all nodes are done. Each node's leader prunes its own disk.

    ``write`` may instead return a future of a background write (its state staged first): the
    seal then waits for every rank's write to be complete (common/background.py), and training
    goes on meanwhile. A save in flight is sealed before the next one starts."""
    import time

    import torch.distributed as dist

    background.finish(wait=True, next_save=True)   # at most one save in flight
    began = time.monotonic()
    node, nodes, leader, own_disk = node_place()
    if rank == 0 or (own_disk and leader):
        # On a disk of its own, a node clears only its own keys (others' restored files stay).
        checkpoints.prepare_save_dir(root, step, node if own_disk else None)
    dist.barrier()
    future = write(root / checkpoints.tag_for(step))

    def seal() -> tuple[str, Path] | None:
        return _seal(root, step, state, rank, keep, (node, nodes, leader, own_disk))

    if future is None:
        sealed = seal()
        if sealed is not None:
            spent = round(time.monotonic() - began, 3)
            log.emit(sealed[0], step=step, path=str(sealed[1]), **{"async": False},
                     stall_s=spent, write_s=spent)
        return
    background.start(background.Pending(root, step, future, seal, log, began,
                                        time.monotonic() - began))


def _seal(root: Path, step: int, state: dict[str, Any], rank: int, keep: int,
          place: tuple[int, int, bool, bool]) -> tuple[str, Path] | None:
    """Seal a step every rank has written (a collective): each node's leader its node's part,
    rank 0 the whole; then prune. Returns rank 0's (event, path)."""
    import torch.distributed as dist

    node, nodes, leader, own_disk = place
    dist.barrier()
    if leader:
        checkpoints.seal_node(root, step, node)
    dist.barrier()
    done: tuple[str, Path] | None = None
    if rank == 0:
        sealed = checkpoints.mark_complete(root, step, dict(state, nodes=nodes))
        done = ("compile_save" if root.name == COMPILE_SAVE else "checkpoint", sealed.path)
    if own_disk and leader:
        checkpoints.prune(root, keep, node)   # this disk's steps, by this node's seals
    elif rank == 0:
        checkpoints.prune(root, keep)
    # Nobody races ahead (or exits) while the leaders are still sealing and pruning.
    dist.barrier()
    return done
