"""A background save's stall on the timeline, where the training loop waited for it.

A save written in the background (checkpoint.async_save) stops training twice: right after the
step it saves, while the loop copies the state into memory and hands it to the writer; and at
the step boundary where it is sealed (a poll, or a wait for the write when the next save comes
before the write ends). The trainer logs one event, at the seal, carrying ``stall_s`` (both
waits together) apart from ``write_s`` (the write, which goes on beside training). The seal's
part is the checkpoint segment before that event already; the copy lies inside the next step's
segment, since no event marks its end. Here that copy is cut out of the step and labelled
``checkpoint``: the stall shows as the save's, and the write stays training time (it is neither
lost nor a stall). A synchronous save (``stall_s`` equal to ``write_s``) is one segment already.
"""
from __future__ import annotations

import dataclasses

from .spans import Allocation, Segment

TRAINING = ("train", "repeat")


def split(allocations: list[Allocation], segments: list[Segment]) -> list[Segment]:
    """`segments` (in order within each allocation) with each background save's copy cut out of
    the step trained after the step it saves."""
    out = list(segments)
    for a in allocations:
        saves = [(step, stall) for step, stall, write in a.saves
                 if stall is not None and stall > 0 and stall != write]
        if not saves:
            continue
        mine = [i for i, s in enumerate(out) if s.allocation == a.index]
        taken: set[int] = set()
        for step, stall in saves:
            # The save's seal: its checkpoint segment (the first of this step not yet matched).
            seal = next((i for i in mine if i not in taken and out[i].kind == "checkpoint"
                         and out[i].step == step), None)
            if seal is None:
                continue
            taken.add(seal)
            left = stall - (out[seal].end - out[seal].start)
            # The step it saves, the last trained before the seal, and the segment after it.
            saved = [i for i in mine if i < seal and out[i].kind in TRAINING
                     and out[i].step == step]
            if left <= 0 or not saved:
                continue
            after = next((i for i in mine if i > saved[-1]), None)
            if after is None or after >= seal or out[after].kind not in TRAINING:
                continue
            s = out[after]
            cut = min(s.start + left, s.end)
            out[after] = dataclasses.replace(s, start=cut)
            out.insert(after, Segment("checkpoint", s.start, cut, a.index, step))
            mine = [i for i, x in enumerate(out) if x.allocation == a.index]
            taken = {i + 1 if i >= after else i for i in taken}
    return [s for s in out if s.end > s.start]


def seal_lags(allocations: list[Allocation], segments: list[Segment]) -> list[float]:
    """Each sealed background save's window of exposure, in seconds: from the end of its copy
    (training goes on) to its seal. The trainer seals a save at the first step boundary after
    its last byte (at least one step later), so a failure before the seal resumes from the save
    before it and trains that interval again: this window is a cost per failure that a save in
    place does not have. `segments` as `split` leaves them."""
    lags: list[float] = []
    for a in allocations:
        background = {step for step, stall, write in a.saves
                      if stall is not None and stall > 0 and stall != write}
        mine = [s for s in segments if s.allocation == a.index]
        for i, s in enumerate(mine):
            if s.kind != "checkpoint" or s.step not in background:
                continue
            # The seal: the last checkpoint segment of this step before it is trained again.
            later = next((x for x in mine[i + 1:] if x.step == s.step), None)
            if later is not None and later.kind == "checkpoint":
                continue
            saved = [j for j in range(i) if mine[j].kind in TRAINING and mine[j].step == s.step]
            if not saved:
                continue
            first = saved[-1] + 1        # the copy, if it took any time, else the next step
            if mine[first].kind == "checkpoint" and mine[first].step == s.step:
                first += 1
            # Sealed at the pass's end, right after it was saved: no step trained meanwhile.
            if any(x.kind in TRAINING for x in mine[first:i]):
                lags.append(s.end - mine[first].start)
    return lags
