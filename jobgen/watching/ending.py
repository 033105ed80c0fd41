"""How a recorded run ended, for `jobgen watch --run-dir`: its newest allocation's nodes'
job.status (the pass each node's flow was in, and its exit status). A node that ended with a
status other than 0 is a failure (watch says which pass, which step, which status, and exits 1);
a job a Ctrl-C stopped (its cancelled.json) is a cancel, said as such."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..runs.ledger import CANCELLED
from .readers import Allocation, RunReader


def _newest(reader: RunReader) -> Optional[Allocation]:
    """The run's newest allocation: the reader's (restart-N, attempt-N), else the newest job
    folder whose node folders lie directly in it (`jobgen run`)."""
    if reader.allocations:
        return reader.allocations[-1]
    try:
        jobs = [p for p in (reader.run_dir / "logs").iterdir() if p.is_dir()]
    except OSError:
        return None
    local = [p for p in jobs if any(c.name.startswith("node-") for c in p.iterdir())]
    if not local:
        return None
    newest = max(local, key=lambda p: p.stat().st_mtime)
    return Allocation(0, newest.name, newest)


def ended(reader: RunReader, last_step: Optional[int]) -> tuple[Optional[str], bool]:
    """(the line that says how the run ended where it did not end well, whether that is a
    failure); (None, False) for a run that ended well or has not ended."""
    alloc = _newest(reader)
    if alloc is None:
        return None, False
    ends = alloc.ends()
    bad = [e for e in ends if e.status not in (None, 0)]
    after = f"after step {last_step}" if last_step is not None else "before its first step"
    where = f"allocation {alloc.index} (job {alloc.job})"
    if any((folder / CANCELLED).exists() for folder in (alloc.folder, Path(alloc.folder).parent)):
        return f"the run was cancelled (Ctrl-C) in {where}, {after}", False
    if not bad:
        return None, False
    first = min(bad, key=lambda e: e.at)
    who = f"node {first.node}" + (f" ({first.host})" if first.host else "")
    passed = f"its {first.what} pass" if first.what else "its flow"
    more = f" ({len(bad)} of {len(ends)} nodes failed)" if len(bad) > 1 else ""
    return (f"the run failed: {where}, {who} ended {passed} with status {first.status}, "
            f"{after}{more}"), True
