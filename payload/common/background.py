"""Saves that do not stop training: a checkpoint written in the background, sealed once complete.

A payload's ``write`` (see ``loop.sealed_save``) may return a future instead of writing in place:
the state it saves has been staged (copied off the live tensors) before it returns, and the
future resolves once every byte of this rank's part is on disk. The training loop goes on; this
module then seals the step (each node's seal, then the marker, as a synchronous save does)
only when every rank's future resolved without error, which the ranks agree on over a CPU (gloo)
group of their own, at a step boundary. So:

- no seal before the last byte: the marker is written after every rank's write finished;
- at most one save in flight: a save waits for the previous one (and seals it) before it starts,
  and the end of a pass waits for the last one;
- a background write that fails on any rank leaves its step unsealed on every rank (resume then
  picks the previous step), and the pass fails as a synchronous save's error would; a process
  killed mid-write leaves it unsealed too.

Each save's ``checkpoint`` event carries ``stall_s`` (how long the training loop waited for it:
staging, waiting for its write, sealing) apart from ``write_s`` (from the start of the save to
its last byte), and ``async``. ``wait_s`` is the part of ``stall_s`` spent waiting for the write
itself because the next save came before its last byte: saves closer together than a write
takes stall the loop for the rest of the write whatever the staging costs (so a benchmark of
the staging must space its saves wider than a write). The wait at the end of a pass for its
last save is in ``stall_s`` only: every pass ends that way. torch is imported lazily, as in the
rest of ``common``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from common.events import EventLog


@dataclass
class Pending:
    """The save in flight: what its seal needs, its future, and the time it cost so far."""

    root: Path
    step: int
    future: Any                      # concurrent.futures.Future of this rank's write
    seal: Callable[[], Any]          # the collective sealing (loop's): (event, path) on rank 0
    log: EventLog
    started: float                   # time.monotonic() when the save began
    stall: float                     # seconds the loop has waited for it so far
    waited: float = 0.0              # of which, for its write to finish (the next save came)
    written: list[float] = field(default_factory=list)   # when the future resolved

    def __post_init__(self) -> None:
        self.future.add_done_callback(lambda _: self.written.append(time.monotonic()))


_pending: Optional[Pending] = None
_groups: dict[Any, Any] = {}


def pending() -> Optional[Pending]:
    return _pending


def start(save: Pending) -> None:
    """Hand over a save whose write runs in the background (call ``finish(wait=True)`` first)."""
    global _pending
    if _pending is not None:
        raise RuntimeError(f"a save of step {_pending.step} is still in flight")
    _pending = save


def gloo_group(key: str, group: Any = None) -> Any:
    """A gloo group over the ranks of ``group`` (None: the world), made once per ``key``: the
    agreement here runs on the main thread while DCP's background thread runs its own
    collectives, so each gets a group of its own. Every rank calls this at the same point, since
    making a group is collective over the world; for a sub-group, every rank's group is made."""
    import torch.distributed as dist

    cached = _groups.get((key, group))
    if cached is not None:
        return cached
    if group is None:
        made = dist.new_group(backend="gloo")
    else:
        views: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(views, sorted(dist.get_process_group_ranks(group)))
        made = None
        for ranks in sorted({tuple(v) for v in views}):
            twin = dist.new_group(ranks=list(ranks), backend="gloo")
            if dist.get_rank() in ranks:
                made = twin
    _groups[(key, group)] = made
    return made


def _all(flag: bool) -> bool:
    """Whether ``flag`` holds on every rank (one all-reduce on this module's gloo group)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return flag
    value = torch.tensor([int(flag)], dtype=torch.int32)
    dist.all_reduce(value, op=dist.ReduceOp.MIN, group=gloo_group("agree"))
    return bool(value.item())


class SaveFailed(RuntimeError):
    """A background save failed on some rank: its step stays unsealed everywhere."""


def finish(wait: bool, next_save: bool = False) -> None:
    """Seal the save in flight once every rank's write is complete. ``wait``: block until it is
    (before the next save, at the end of a pass); else only if all ranks are done already (a
    collective: every rank calls it at the same step boundary while a save is in flight).
    ``next_save``: the wait is for the next save (reported as the save's ``wait_s``)."""
    global _pending
    save = _pending
    if save is None:
        return
    began = time.monotonic()
    if not wait and not _all(save.future.done()):
        save.stall += time.monotonic() - began
        return
    error: Optional[BaseException] = None
    try:
        save.future.result()
    except Exception as exc:   # this rank's write failed; the others learn it below
        error = exc
    ok = _all(error is None)   # also waits for the other ranks' writes
    if next_save:              # the next save came before this one's last byte
        save.waited += time.monotonic() - began
    _pending = None
    written = (save.written[0] if save.written else time.monotonic()) - save.started
    if not ok:
        reason = f"{type(error).__name__}: {error}" if error else "another rank's write failed"
        save.log.emit("checkpoint_failed", step=save.step, error=reason,
                      write_s=round(written, 3))
        raise SaveFailed(f"the background save of step {save.step} failed ({reason}); "
                         "it was not sealed, so a resume takes the previous checkpoint")
    sealed = save.seal()
    save.stall += time.monotonic() - began
    if sealed is not None:
        event, path = sealed
        save.log.emit(event, step=save.step, path=str(path), **{"async": True},
                      stall_s=round(save.stall, 3), write_s=round(written, 3),
                      wait_s=round(save.waited, 3))
