"""Our payloads' JSON-line events (payload/common/events.py) as `Observation`s: which kinds the
watch uses, which fields it keeps, and whether a start is a restart in place. Parsing only; the
lines come from the readers (readers.py) or a report's log walk.
"""
from __future__ import annotations

import json
from typing import Any, Optional, Protocol

from .observations import Observation, number, parse_time

LIFECYCLE = ("start", "resume", "checkpoint", "done", "stopped")


def observation(event: dict[str, Any], source: str, restart: int,
                node: Optional[int] = None) -> Optional[Observation]:
    """One of our payloads' events as an Observation (None for kinds the watch does not use)."""
    kind = event.get("event")
    when = parse_time(event.get("time"))
    if when is None or kind not in ("step", "beat", *LIFECYCLE):
        return None
    step = event.get("step")
    step = step if isinstance(step, int) and not isinstance(step, bool) else None
    consumed = event.get("consumed_samples")
    node_field = event.get("node")
    return Observation(
        kind=kind, time=when, source=source, restart=restart,
        phase=str(event.get("phase", "train")), step=step,
        node=node_field if isinstance(node_field, int) else node,
        loss=number(event.get("loss"), "loss" in event),
        grad_norm=number(event.get("grad_norm"), "grad_norm" in event),
        param_norm=number(event.get("param_norm"), "param_norm" in event),
        lr=number(event.get("lr"), "lr" in event),
        consumed=consumed if isinstance(consumed, int) and not isinstance(consumed, bool)
        else None,
        samples_per_s=number(event.get("samples_per_s"), "samples_per_s" in event),
        extra={k: v for k, v in event.items() if k in ("max_steps", "world_size", "checkpoint",
                                                       "allocation", "restart_in_place",
                                                       "restarts_in_place_max",
                                                       "collective_timeout_s",
                                                       "signal", "global_batch_size",
                                                       "stall_s", "write_s", "wait_s")})


class Tally(Protocol):
    skipped: int


def parse_lines(lines: list[str], source: str, restart: int, node: Optional[int] = None,
                tally: Optional[Tally] = None) -> list[Observation]:
    """Our payloads' events among `lines`; an event line that is not a JSON object is skipped
    and counted in `tally`'s `skipped`."""
    out = []
    for line in lines:
        line = line.strip()
        if not line.startswith('{"event"'):
            continue
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):    # cut short, or nested past the stack
            event = None
        if not isinstance(event, dict):
            if tally is not None:
                tally.skipped += 1
            continue
        found = observation(event, source, restart, node)
        if found is not None:
            out.append(found)
    return out


def same_allocation(found: Observation, before: Optional[Observation]) -> bool:
    """Whether start event `found` is in the allocation of start `before` (the flow's log folder
    its trainer names): a restart in place, not a new allocation."""
    label = found.extra.get("allocation")
    return before is not None and label is not None and label == before.extra.get("allocation")
