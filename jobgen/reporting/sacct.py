"""The scheduler's account of a Slurm job's allocations: `sacct --duplicates` lists each
requeued allocation with its start, end, state and nodes. Optional: without `sacct` (or with no
accounting), the report falls back on the times the run folder's files carry."""
from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Optional

FIELDS = "JobID,Submit,Start,End,State,NodeList"


@dataclass(frozen=True, slots=True)
class Span:
    """One allocation as the scheduler recorded it (epoch seconds; end None: still running)."""
    submit: Optional[float]
    start: float
    end: Optional[float]
    state: str
    nodes: str


def _epoch(text: str) -> Optional[float]:
    """sacct's local time (2026-11-26T07:40:01), or None for Unknown/None."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def parse(text: str, job: str) -> list[Span]:
    """The allocations of `job` in `sacct -P -n -X -D` output, oldest first (rows that never
    started, like the pending requeue, are left out)."""
    spans = []
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) != 6 or cells[0].split("_")[0] != job:
            continue
        start = _epoch(cells[2])
        if start is None:
            continue
        spans.append(Span(_epoch(cells[1]), start, _epoch(cells[3]),
                          cells[4].split()[0] if cells[4].strip() else "", cells[5]))
    return _resized(sorted(spans, key=lambda s: s.start))


def _resized(spans: list[Span]) -> list[Span]:
    """One allocation per span: a job that lost a node and kept its allocation (sbatch --no-kill,
    job.spare_nodes) is recorded as a RESIZING row up to the loss, then a row for the rest on
    fewer nodes; they are one allocation, held from the first row's start on its nodes."""
    out: list[Span] = []
    for span in spans:
        before = out[-1] if out else None
        if before is not None and before.state == "RESIZING" and before.end is not None \
                and abs(span.start - before.end) <= 2:
            out[-1] = Span(before.submit, before.start, span.end, span.state, before.nodes)
        else:
            out.append(span)
    return out


def spans(job: str) -> Optional[list[Span]]:
    """The scheduler's allocations of a Slurm job, or None when sacct cannot say."""
    if not job.isdigit() or shutil.which("sacct") is None:
        return None
    try:
        done = subprocess.run(["sacct", "-P", "-n", "-X", "-D", "-j", job,
                               f"--format={FIELDS}"], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    found = parse(done.stdout, job)
    return found or None
