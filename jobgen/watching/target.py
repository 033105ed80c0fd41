"""What `jobgen watch` follows, as a backend provides it (its package's watch.py): a controller
that acts on the job, and a reader of what the job writes: the run folder where this machine
reaches it (`RunReader`), else the nodes' logs as the service keeps them (`StreamReader`:
CloudWatch for SageMaker, the pods' logs for EKS)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from .events import parse_lines, same_allocation
from .observations import Observation
from .readers import Allocation


@dataclass
class Target:
    controller: Any                # actions.Controller
    reader: Any                    # RunReader or StreamReader
    run_dir_here: bool = True      # a rollback needs the run folder on this machine


@dataclass
class StreamReader:
    """The nodes' logs as a service returns them: `fetch()` gives, for each node index, the lines
    added since the last call. Rank 0 speaks for the job from node 0 (its JSON events); every
    node speaks for itself in beats. Each `start` event of node 0's training pass begins a new
    allocation (a restart), as a run folder's restart-N folders do."""
    fetch: Callable[[], dict[int, list[str]]]
    run_dir: Path
    clock: Callable[[], float] = time.time
    allocations: list[Allocation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    restart: int = 0
    started: bool = False
    start: Optional[Observation] = None   # node 0's newest start of the training pass
    grew: dict[int, float] = field(default_factory=dict)
    skipped: int = 0               # event lines that are not JSON objects

    def skipped_notes(self) -> list[str]:
        return [f"{self.skipped} line(s) of the nodes' logs skipped (events that are not JSON "
                "objects)"] if self.skipped else []

    def read(self) -> list[Observation]:
        now = self.clock()
        out: list[Observation] = []
        for node, lines in sorted(self.fetch().items()):
            if lines:
                self.grew[node] = now
            for found in parse_lines(lines, "events", self.restart, node, self):
                if found.kind == "start" and node == 0 and found.phase == "train":
                    if self.started and not same_allocation(found, self.start):
                        self.restart += 1
                    self.started, self.start = True, found
                if found.kind == "beat" or node == 0:
                    out.append(found if found.restart == self.restart
                               else _at(found, self.restart))
        out.sort(key=lambda o: (o.restart, o.time))
        return out

    def silence(self, now: float) -> dict[int, float]:
        return {node: now - at for node, at in self.grew.items()}

    def hosts(self, restart: int) -> dict[int, str]:
        return {}


def _at(found: Observation, restart: int) -> Observation:
    from dataclasses import replace
    return replace(found, restart=restart)


def lines_after(text: str, seen: int) -> tuple[list[str], int]:
    """The complete lines of `text` after the first `seen` (a log re-read whole each time)."""
    lines = text.split("\n")
    complete = lines[:-1]          # the last piece is a line still being written
    return complete[seen:], max(seen, len(complete))
