"""How long the nodes were held, measured outside the trainers: a rehearsal's own clock (`jobgen
run` holds this machine from the command's start to its end: ``logs/JOB/held.json``) and each
pass's launch and exit as the node's flow recorded them (``node-K/PASS.times``, written by
payload/common/job_flow.sh). `jobgen report` takes an allocation's span and its compile pass
from these where the run has them."""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..plumbing import fsio
from ..plumbing.errors import ConfigError

FILE = "held.json"
SMALL = 1 << 16
# A time further than this past the reader's clock is a clock that is wrong, not a record.
AHEAD_S = 60.0


@dataclass(frozen=True, slots=True)
class Held:
    start: float
    end: Optional[float]        # None: the command has not ended (in progress, or killed)
    nodes: int
    by: str
    pid: int = 0                # the command's process, on `host`
    host: str = ""


def _time(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    found = float(value)
    return found if math.isfinite(found) and 0 < found < 1e11 else None


def process_start() -> float:
    """When this process started (Linux: /proc), else now: the rehearsal holds the machine from
    the command's start, its own start-up included."""
    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
        # Its start in clock ticks since boot, against the boot clock now (/proc/stat's boot
        # time is whole seconds: too coarse for a short rehearsal).
        since = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()
    now = time.time()
    return now - since if 0 <= since < 3600 else now


def write(folder: Path, held: Held) -> None:
    """Record the span (best effort: a rehearsal is not stopped for its report's record)."""
    data = {"by": held.by, "nodes": held.nodes, "start": held.start, "end": held.end,
            "pid": held.pid, "host": held.host}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fsio.write_file(folder / FILE, _as_json(data))
    except (OSError, ConfigError):
        pass


def _as_json(data: dict[str, Any]) -> str:
    import json
    return json.dumps(data, sort_keys=True) + "\n"


def read(folder: Path) -> Optional[Held]:
    """The span recorded in a job's log folder, or None (none, unreadable, or nonsense)."""
    try:
        data = fsio.loads(fsio.read_text(folder / FILE, SMALL))
    except (OSError, ConfigError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    start, end = _time(data.get("start")), _time(data.get("end"))
    nodes = data.get("nodes")
    if start is None or (end is not None and end < start):
        return None
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 0 < nodes < 100_000:
        nodes = 0
    pid = data.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 1 << 31:
        pid = 0
    return Held(start, end, nodes, str(data.get("by") or "")[:40], pid,
                str(data.get("host") or "")[:200])


def gone(held: Held) -> bool:
    """Whether the command that holds the nodes is known to have ended without recording its
    end (killed): its process is no longer there on this host. Elsewhere: not known."""
    import socket
    if held.end is not None or not held.pid or held.host != socket.gethostname():
        return False
    try:
        os.kill(held.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def times(path: Path) -> tuple[Optional[float], Optional[float]]:
    """A pass's last launch and the exit after it (``PASS.times``), or None for either."""
    try:
        lines = fsio.read_text(path, SMALL).splitlines()
    except (OSError, ConfigError):
        return None, None
    launch: Optional[float] = None
    exited: Optional[float] = None
    for line in lines:
        words = line.split()
        if len(words) < 2 or words[0] not in ("launch", "exit"):
            continue
        try:
            when = _time(float(words[1]))
        except (ValueError, OverflowError):
            continue
        if when is None:
            continue
        if words[0] == "launch":
            launch, exited = when, None
        elif launch is not None and when >= launch:
            exited = when
    return launch, exited


def pass_span(folder: Path, nodes: list[int], name: str) -> tuple[Optional[float], Optional[float]]:
    """When the main node launched pass `name` in this allocation's `folder`, and when the last
    node's pass exited (the flow's PASS.times; else the exit status each node's launcher wrote)."""
    launch, _ = times(folder / "node-0" / f"{name}.times")
    exits = []
    for node in nodes:
        began, ended = times(folder / f"node-{node}" / f"{name}.times")
        if ended is None and began is None:
            try:   # a flow older than PASS.times: the launcher's status, written at its exit
                ended = (folder / f"node-{node}" / f"{name}.status").stat().st_mtime
            except OSError:
                ended = None
        if ended is not None:
            exits.append(ended)
    return launch, max(exits) if exits else None
