"""A timeline's allocations held to the clock that measured them: a rehearsal's own span
(``logs/JOB/held.json``: the nodes were held from the command's start to its end, before the
first record a node wrote and after its last), every segment kept within its allocation (a
node's clock ahead of this machine's cannot make an allocation train longer than it lasted),
a step trained again labelled so on every allocation where it was, and a background save's
copy into memory labelled as its stall (stalls.py): the account, the timeline, the page and the
PNG all read these labels."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from . import held, stalls
from .spans import Allocation, NodeInfo, Segment

# How an allocation's last stretch is labelled when the command outlived its nodes' last record.
TAIL = {"done": "idle", "stopped": "stop", "failed": "failure", "unhealthy": "gate",
        "cancelled": "idle"}


def relabel(segments: list[Segment]) -> list[Segment]:
    """A step trained again later (after a restart resumed before it) counts only in its last
    training; its earlier runs are `repeat`."""
    last: dict[int, int] = {}
    for i, s in enumerate(segments):
        if s.kind in ("train", "repeat") and s.step is not None:
            last[s.step] = i
    return [dataclasses.replace(s, kind="repeat")
            if s.kind == "train" and s.step is not None and last[s.step] != i else s
            for i, s in enumerate(segments)]


def _held(run_dir: Path, allocations: list[Allocation], segments: list[Segment],
          now: float, notes: list[str]) -> tuple[list[Allocation], list[Segment]]:
    allocs, segs = list(allocations), list(segments)
    for job in dict.fromkeys(a.job for a in allocs):
        mine = [i for i, a in enumerate(allocs) if a.job == job]
        if any(allocs[i].from_scheduler for i in mine):
            continue
        span = held.read(run_dir / "logs" / job)
        if span is None:
            continue
        notes.append(f"job {job}: nodes held from the command's start to its end, as "
                     f"{span.by or 'it'} measured them (logs/{job}/{held.FILE})")
        first, last = allocs[mine[0]], allocs[mine[-1]]
        if span.start < first.start:
            segs.append(Segment("startup", span.start, first.start, first.index))
        allocs[mine[0]] = first = dataclasses.replace(first, start=span.start)
        if last.index == first.index:
            last = first
        killed = held.gone(span)
        if killed:   # counted to its nodes' last record (where the fill to now begins)
            tail = [s for s in segs if s.allocation == last.index and s.end >= last.end]
            last = dataclasses.replace(last, end=min((s.start for s in tail), default=last.end))
        end = span.end if span.end is not None else last.end if killed else max(last.end, now)
        ending = last.ending
        if (span.end is not None or killed) and ending == "running":
            ending = "ended"     # the command ended before every node recorded how it ended
        if end > last.end:
            segs.append(Segment(TAIL.get(ending, "startup" if span.end is None else "idle"),
                                last.end, end, last.index))
        allocs[mine[-1]] = dataclasses.replace(last, end=end, ending=ending)
        for i in mine:   # nodes whose folders are on their own disks (SageMaker's instances)
            seen = {n.node for n in allocs[i].nodes}
            if span.nodes > len(seen):
                extra = [NodeInfo(n, "", None, None) for n in range(span.nodes) if n not in seen]
                allocs[i] = dataclasses.replace(allocs[i], nodes=tuple(
                    sorted(allocs[i].nodes + tuple(extra), key=lambda n: n.node)))
    return allocs, segs


def _clip(s: Segment, lo: float, hi: float) -> Optional[Segment]:
    start, end = max(s.start, lo), min(s.end, hi)
    return dataclasses.replace(s, start=start, end=end) if end > start else None


def apply(run_dir: Path, allocations: list[Allocation], segments: list[Segment],
          now: float) -> tuple[list[Allocation], list[Segment], list[str]]:
    """The allocations and segments bounded as above, and notes for the reader."""
    notes: list[str] = []
    allocs, segs = _held(run_dir, allocations, segments, now, notes)
    allocs = [a if a.end >= a.start else dataclasses.replace(a, end=a.start) for a in allocs]
    ahead = max((s.end for s in segs), default=0.0) - now
    if ahead > held.AHEAD_S:
        notes.append(f"the run's records reach {ahead:,.0f} s past this machine's clock; "
                     "each is counted only within its allocation")
    out = []
    for s in segs:
        if s.kind == "gap":
            lo = allocs[s.allocation - 1].end if s.allocation >= 1 else s.start
            hi = allocs[s.allocation].start if s.allocation < len(allocs) else s.end
        else:
            a = allocs[s.allocation]
            lo, hi = a.start, a.end
        clipped = _clip(s, lo, hi)
        if clipped is not None:
            out.append(clipped)
    out.sort(key=lambda s: (s.allocation, s.start))
    out = stalls.split(allocs, out)   # a background save's copy is its stall, not training
    if any(a.ending == "running" for a in allocs):
        notes.append("the run is in progress: its last allocation is counted to now")
    return allocs, relabel(out), notes
