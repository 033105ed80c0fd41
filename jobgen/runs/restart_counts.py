"""How often a run restarted, by kind, from what its nodes recorded: the training pass's restarts
inside an allocation (torchrun's, job.restarts_in_place: the main node's ``train.restarts``,
written by payload/common/node_launch.sh when the pass ends) apart from the requeues and retries
(allocations after the first: the flow's ``logs/JOB/restart-N`` and ``attempt-N`` folders).
`jobgen runs RUN` shows them; `jobgen report` and `jobgen watch` count the same restarts from the
trainer's start events, while the run goes on too."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..plumbing import fsio
from ..plumbing.errors import JobgenError

ALLOCATION = re.compile(r"^(restart|attempt)-[0-9]{1,9}$")


def allocation_folders(run_dir: Path) -> list[Path]:
    """Every allocation's log folder: logs/JOB/restart-N, attempt-N, or logs/JOB itself (a
    `jobgen run`, which has one allocation per job)."""
    out: list[Path] = []
    for job in sorted((run_dir / "logs").glob("*")):
        if not job.is_dir():
            continue
        inner = sorted(p for p in job.iterdir() if p.is_dir() and ALLOCATION.match(p.name))
        out += inner or ([job] if (job / "node-0").is_dir() else [])
    return out


def counts(run_dir: Path) -> dict[str, Any]:
    """{"restarts_in_place": N, "requeues": M, "by_allocation": {folder: N}}."""
    folders = allocation_folders(run_dir)
    by: dict[str, int] = {}
    for folder in folders:
        try:
            text = fsio.read_text(folder / "node-0" / "train.restarts", 64).strip()
        except (OSError, JobgenError):
            continue
        if text.isascii() and text.isdigit():   # not "²" (a digit to isdigit, not to int)
            by[str(folder.relative_to(run_dir / "logs"))] = int(text)
    return {"restarts_in_place": sum(by.values()), "requeues": max(0, len(folders) - 1),
            "by_allocation": by}
