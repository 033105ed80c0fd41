"""What a run's timeline is made of: its segments, its nodes, its allocations and the whole
(built by timeline.py, held to their clocks by bounds.py, read by the account and the pictures)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# Segment kinds, in the account's order; `gap` lies between allocations.
KINDS = ("startup", "gate", "compile", "train", "repeat", "checkpoint", "failure", "stop",
         "idle", "gap")


@dataclass(frozen=True, slots=True)
class Segment:
    kind: str
    start: float
    end: float
    allocation: int
    step: Optional[int] = None


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node: int
    host: str
    status: Optional[int]       # the node's flow exit status (None: not recorded yet)
    ended_at: Optional[float]
    gate: Optional[tuple[float, float]] = None   # this node's own health gate (start, end)


@dataclass(frozen=True, slots=True)
class Allocation:
    index: int
    job: str
    start: float
    end: float
    ending: str                 # done, failed, stopped (time limit), unhealthy, running
    nodes: tuple[NodeInfo, ...]
    failed_node: Optional[int] = None
    failed_host: str = ""
    failure_at: Optional[float] = None
    excluded: tuple[str, ...] = ()   # hosts the health gate left out after this allocation
    from_scheduler: bool = False
    resumed_from: Optional[int] = None
    last_step: Optional[int] = None
    training_at: Optional[float] = None   # when its first training step began
    load_s: Optional[float] = None        # trainer start to checkpoint loaded (a resume)
    # Each save's (step, stall_s, write_s) as its checkpoint event says: the training loop's
    # wait apart from the write (a background save's write goes on beside training).
    saves: tuple[tuple[int, Optional[float], Optional[float]], ...] = ()
    # Each background save's wait for its own write where the next save came before its last
    # byte (its event's wait_s, part of its stall): (step, seconds), where the event says.
    save_waits: tuple[tuple[int, float], ...] = ()
    # Its training pass's restarts inside it (torchrun's, job.restarts_in_place): rank 0's starts
    # of the training pass after the first.
    restarts_in_place: int = 0
    # Save events whose stall_s or write_s lies outside what a save can take (left out).
    bad_saves: int = 0


@dataclass(frozen=True, slots=True)
class Timeline:
    run_dir: str
    waiting_s: float            # submission to the first allocation (not allocated)
    allocations: tuple[Allocation, ...]
    segments: tuple[Segment, ...]
    node_count: int
    notes: tuple[str, ...] = ()
