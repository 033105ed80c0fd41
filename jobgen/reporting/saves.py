"""A save event's figures (stall_s, write_s, wait_s) held to what a save can have taken: a
number of seconds, at least 0 and at most the allocation it ran in. A figure outside that is
left out of the account and counted (a stall of -5 s printed a -77 % model figure, one of 1e308
s drew the failure model forever)."""
from __future__ import annotations

import math
from typing import Any, Optional


def figures(events: list[Any], held_s: float) -> tuple[tuple[int, Optional[float],
                                                        Optional[float]], ...]:
    """Each save's (step, stall_s, write_s), a figure outside its domain None (see stat)."""
    return tuple((o.step, stat(o.extra.get("stall_s"), held_s),
                  stat(o.extra.get("write_s"), held_s))
                 for o in events if o.kind == "checkpoint" and o.step is not None)


def bad(events: list[Any], held_s: float) -> int:
    """Save events whose stall_s or write_s is there but no duration the save can have had."""
    return sum(1 for o in events if o.kind == "checkpoint" and o.step is not None
               and any(key in o.extra and stat(o.extra[key], held_s) is None
                       for key in ("stall_s", "write_s")))


def waits(events: list[Any], held_s: float) -> tuple[tuple[int, float], ...]:
    """Each save's wait for its own write (its event's wait_s), where it is a part of the
    save's stall as the trainer reports it: above 0 and at most stall_s (anything else is
    not a wait the loop could have had, and is left out)."""
    found = []
    for o in events:
        if o.kind != "checkpoint" or o.step is None:
            continue
        wait = stat(o.extra.get("wait_s"), held_s)
        stall = stat(o.extra.get("stall_s"), held_s)
        if wait is not None and stall is not None and 0 < wait <= stall:
            found.append((o.step, wait))
    return tuple(found)


def stat(value: Any, held_s: float) -> Optional[float]:
    """A checkpoint event's figure in seconds, or None: absent, not a number, or outside what a
    save can have taken (below 0, or longer than the allocation it ran in)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) > 1 << 53:   # a 400-digit integer: no duration
        return None
    found = float(value)
    return found if math.isfinite(found) and 0 <= found <= max(held_s, 0.0) else None
