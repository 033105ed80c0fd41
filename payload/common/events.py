"""One JSON object per line on stdout: the contract the job scripts and tests read.

Only rank 0 speaks, so a multi-node log has each event once. Each line is flushed at once because
Slurm and Batch buffer a child's stdout and a killed job would otherwise lose its last steps.
Every emitted event ends with ``"time"``: when it was emitted, ISO 8601 in UTC with milliseconds
(e.g. ``2026-11-21T15:03:18.123+00:00``), so a log tells how long a start, a step or a resume took.
"""
from __future__ import annotations

import json
import math
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO


def _clean(value: Any) -> Any:
    """Make a value JSON-safe: NaN/inf become null (json.dumps would write bare NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return value


def format_event(event: str, **fields: Any) -> str:
    """The one-line text of an event; ``event`` always comes first for readability."""
    record = {"event": event}
    record.update({key: _clean(value) for key, value in fields.items()})
    return json.dumps(record, separators=(", ", ": "))


def now_iso() -> str:
    """The current time as events carry it: ISO 8601, UTC, milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class EventLog:
    """Writes events for rank 0: to stdout always, to ``metrics_path`` when one is given."""

    def __init__(self, rank: int, metrics_path: Path | None = None,
                 stream: TextIO | None = None, env: Any = None) -> None:
        import os

        env = os.environ if env is None else env
        self.enabled = rank == 0
        self.metrics_path = metrics_path
        self.stream = stream
        # One process per node (its local rank 0) also says when the node starts each step: a
        # node that stops saying so while the others go on is the one that hangs (jobgen watch).
        self.node = node_index(env)
        self.beats = str(env.get("LOCAL_RANK", "0")) == "0"
        self.attempt = attempt_fields(env)

    def emit(self, event: str, **fields: Any) -> None:
        if not self.enabled:
            return
        if event == "start":   # which allocation, and which start in it (restarts in place)
            fields = {**fields, **self.attempt}
        line = format_event(event, **fields, time=now_iso())
        out = self.stream or sys.stdout
        out.write(line + "\n")
        out.flush()
        if self.metrics_path is not None:
            # Append and close each time: the file stays valid JSONL however the job ends.
            with open(self.metrics_path, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")


    def beat(self, phase: str, step: int) -> None:
        """``beat``: this node is starting optimizer step ``step`` (stdout only: the node's log)."""
        if not self.beats:
            return
        out = self.stream or sys.stdout
        out.write(format_event("beat", phase=phase, node=self.node, step=step,
                               time=now_iso()) + "\n")
        out.flush()


def attempt_fields(env: Any) -> dict[str, Any]:
    """What a ``start`` event says of the attempt: ``allocation``, the flow's log folder of this
    allocation (``JOB/restart-N``, ``attempt-N``), and ``restart_in_place``, torchrun's count of
    this node's restarts inside it (TORCHELASTIC_RESTART_COUNT; a node restarted for a peer's
    failure keeps its count). `jobgen report` counts an allocation's starts."""
    out: dict[str, Any] = {}
    folder = str(env.get("JOBGEN_LOG_DIR", "") or "").rstrip("/")
    if folder:
        out["allocation"] = "/".join(Path(folder).parts[-2:])
    count = str(env.get("TORCHELASTIC_RESTART_COUNT", "")).strip()
    if count.isdigit():
        out["restart_in_place"] = int(count)
    # What ends a hang in this attempt (jobgen watch waits for it before acting): torchrun's
    # budget of restarts in place (its TORCHELASTIC_MAX_RESTARTS) and the collective timeout the
    # process group was made with (JOBGEN_COLLECTIVE_TIMEOUT), after which a hung rank's peers
    # fail and torchrun restarts them while the budget lasts.
    budget = str(env.get("TORCHELASTIC_MAX_RESTARTS", "")).strip()
    if budget.isdigit():
        out["restarts_in_place_max"] = int(budget)
    timeout = str(env.get("JOBGEN_COLLECTIVE_TIMEOUT", "")).strip()
    if timeout.isdigit() and int(timeout) > 0:
        out["collective_timeout_s"] = int(timeout)
    return out


def node_index(env: Any) -> int:
    """This node's index in the job: torchrun's GROUP_RANK, else the job's node rank."""
    for name in ("GROUP_RANK", "JOBGEN_NODE_RANK", "SLURM_NODEID"):
        text = str(env.get(name, "")).strip()
        if text.isdigit():
            return int(text)
    return 0


def read_events(text: str) -> list[dict[str, Any]]:
    """Pick the event lines out of a mixed log (library warnings share the stream)."""
    events = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith('{"event"'):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def open_tensorboard(directory: Path, log: EventLog) -> Any:
    """A TensorBoard writer for rank 0, or None (with a one-line notice) when tensorboard is not
    installed: metrics.jsonl carries the same numbers, so training goes on without it."""
    if not log.enabled:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        log.emit("notice", message="tensorboard is not installed; TensorBoard logging is off")
        return None
    return SummaryWriter(str(directory))


def to_tensorboard(writer: Any, step: int, numbers: dict[str, Any]) -> None:
    if writer is None:
        return
    for key, value in numbers.items():
        if isinstance(value, (int, float)):
            writer.add_scalar(f"train/{key}", value, step)
