"""How a recorded run ended, for `jobgen watch --run-dir`: its newest allocation's nodes'
job.status (the pass each node's flow was in, and its exit status). A node that ended with a
status other than 0 is a failure (watch says which pass, which step, which status, and exits 1);
a job a Ctrl-C stopped (its cancelled.json) is a cancel, said as such (it did not complete
either: exit 1, but no failure)."""
from __future__ import annotations

from typing import Optional

from ..runs.ledger import CANCELLED
from .readers import RunReader


def ended(reader: RunReader, last_step: Optional[int]) -> tuple[Optional[str], str]:
    """(the line that says how the run ended where it did not end well, "failed" or
    "cancelled"); (None, "") for a run that ended well or has not ended."""
    if not reader.allocations:
        return None, ""
    alloc = reader.allocations[-1]
    ends = alloc.ends()
    bad = [e for e in ends if e.status not in (None, 0)]
    after = f"after step {last_step}" if last_step is not None else "before its first step"
    where = f"allocation {alloc.index} (job {alloc.job})"
    if (reader.run_dir / "logs" / alloc.job / CANCELLED).exists():   # where `jobgen run` puts it
        return f"the run was cancelled (Ctrl-C) in {where}, {after}", "cancelled"
    if not bad:
        return None, ""
    first = min(bad, key=lambda e: e.at)
    who = f"node {first.node}" + (f" ({first.host})" if first.host else "")
    passed = f"its {first.what} pass" if first.what else "its flow"
    more = f" ({len(bad)} of {len(ends)} nodes failed)" if len(bad) > 1 else ""
    return (f"the run failed: {where}, {who} ended {passed} with status {first.status}, "
            f"{after}{more}"), "failed"
