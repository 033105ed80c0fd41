"""A background save's stall on the timeline, where the training loop waited for it.

A background save (checkpoint.async_save) stops training twice: after the step it saves, while
the loop copies the state to memory, and at the step boundary where it is sealed. The trainer's
one event, at the seal, carries ``stall_s`` (both waits) apart from ``write_s`` (the write, which
runs beside training). The copy lies inside the next step's segment; here it is cut out and
labelled ``checkpoint``, so the stall shows as the save's and the write stays training time. A
synchronous save (``stall_s`` equal to ``write_s``) is one segment already.
"""
from __future__ import annotations

import dataclasses

from .spans import Allocation, Segment

TRAINING = ("train", "repeat")


def _background(allocations: list[Allocation]) -> dict[int, dict[int, list[float]]]:
    """Each allocation's background saves: step -> their stalls, in order (a step saved again
    after a restart in place has two)."""
    found: dict[int, dict[int, list[float]]] = {}
    for a in allocations:
        for step, stall, write in a.saves:
            if stall is not None and stall > 0 and stall != write:
                found.setdefault(a.index, {}).setdefault(step, []).append(stall)
    return found


def _after(segments: list[Segment], j: int, end: int) -> int:
    """Where a save of the step trained in segment `j` began: after that step and after the
    seal of an earlier save at the same step boundary (the loop seals one whose write is done
    before it starts the next); `end` at most."""
    k = j + 1
    while k < end and segments[k].kind == "checkpoint" and segments[k].step != segments[j].step:
        k += 1
    return k


def split(allocations: list[Allocation], segments: list[Segment]) -> list[Segment]:
    """`segments` (in order within each allocation) with each background save's copy cut out of
    the step trained after the step it saves. One pass to find the cuts, one to make them."""
    background = _background(allocations)
    if not background:
        return list(segments)
    cuts: dict[int, tuple[float, int]] = {}    # segment index -> (seconds, the saved step)
    last: dict[tuple[int, int], int] = {}      # (allocation, step) -> its last training segment
    matched: dict[tuple[int, int], int] = {}
    for i, s in enumerate(segments):
        stalls = background.get(s.allocation, {}).get(s.step) if s.step is not None else None
        if stalls is None:
            continue
        key = (s.allocation, s.step or 0)
        if s.kind in TRAINING:
            last[key] = i
            continue
        if s.kind != "checkpoint" or matched.get(key, 0) >= len(stalls):
            continue
        # The save's seal: the seal's own part is this segment; the rest is the copy, right
        # after the step it saves (unless the seal came right after it: nothing trained).
        left = stalls[matched.get(key, 0)] - (s.end - s.start)
        matched[key] = matched.get(key, 0) + 1
        j = last.get(key)
        k = _after(segments, j, i) if j is not None else i
        if left > 0 and k < i and segments[k].kind in TRAINING:
            cuts[k] = (max(left, cuts.get(k, (0.0, 0))[0]), s.step or 0)
    out: list[Segment] = []
    for i, s in enumerate(segments):
        if i in cuts:
            seconds, step = cuts[i]
            cut = min(s.start + seconds, s.end)
            out.append(Segment("checkpoint", s.start, cut, s.allocation, step))
            s = dataclasses.replace(s, start=cut)
        out.append(s)
    return [s for s in out if s.end > s.start]


def seal_lags(allocations: list[Allocation], segments: list[Segment]) -> list[float]:
    """Each sealed background save's window of exposure, in seconds: from the end of its copy
    (training goes on) to its seal. The trainer seals a save at the first step boundary after
    its last byte (at least one step later), so a failure before the seal resumes from the save
    before it and trains that interval again: this window is a cost per failure that a save in
    place does not have. `segments` as `split` leaves them."""
    background = _background(allocations)
    lags: list[float] = []
    last: dict[tuple[int, int], int] = {}
    for i, s in enumerate(segments):
        if s.step is None or s.step not in background.get(s.allocation, {}):
            continue
        key = (s.allocation, s.step)
        if s.kind in TRAINING:
            last[key] = i
            continue
        j = last.get(key)
        if s.kind != "checkpoint" or j is None:
            continue
        first = _after(segments, j, i)   # the copy, if it took any time, else the next step
        if first < i and segments[first].kind == "checkpoint" and segments[first].step == s.step:
            first += 1
        # A seal after steps trained beside the write (not the copy itself, nor a seal at the
        # pass's end right after the step).
        if any(x.kind in TRAINING for x in segments[first:i]):
            lags.append(s.end - segments[first].start)
            del last[key]
    return lags
