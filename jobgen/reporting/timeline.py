"""A run's timeline: each allocation cut into contiguous segments (start-up, health gate,
compile, training steps, checkpoint writes, the failure, idle at the end) and the gaps between
allocations, every boundary a time the run itself wrote: the payloads' events (rank 0 in node 0's
logs), each node's health.json and job.status, and the scheduler's start and end where sacct
answers."""
from __future__ import annotations

import dataclasses
import math
import re
import statistics
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from ..plumbing import fsio
from ..plumbing.errors import ConfigError
from ..runs import runrecord
from ..runs.ledger import CANCELLED
from ..watching.events import parse_lines
from ..watching.observations import Observation
from ..watching.runfolder import NODE, allocation_folders
from . import bounds, held, sacct, saves
from .spans import KINDS, Allocation, NodeInfo, Segment, Timeline  # noqa: F401 (re-exported)

SMALL = 1 << 16          # a host, a job.status, a health.json: far below this
STATUS = re.compile(r"[0-9]{1,3}")


def _read(path: Path, limit: int = fsio.MAX_BYTES) -> Optional[str]:
    """A run file's text through the one reader (a FIFO, a device or a file past `limit` is
    not read), or None."""
    try:
        return fsio.read_text(path, limit)
    except (OSError, ConfigError):
        return None


def _mtime(path: Path) -> Optional[float]:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _events(path: Path, allocation: int) -> list[Observation]:
    text = _read(path)
    if text is None:
        return []
    return [o for o in parse_lines(text.splitlines(), "events", allocation, 0) if o.kind != "beat"]


def _json(path: Path) -> Optional[dict[str, Any]]:
    text = _read(path, SMALL)
    try:
        data = fsio.loads(text) if text is not None else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _seconds(value: Any) -> float:
    """A duration a node wrote (health.json's seconds): finite, 0 to a week, else 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return 0.0
    try:
        found = float(value)
    except (ValueError, OverflowError):
        return 0.0
    return found if math.isfinite(found) and 0 <= found <= 7 * 86400 else 0.0


def _nodes(folder: Path) -> list[NodeInfo]:
    out = []
    for entry in sorted(folder.glob("node-*"), key=lambda p: p.name):
        number = NODE.fullmatch(entry.name)
        if number is None:
            continue
        host = _read(entry / "host", SMALL)
        if host is None:   # a node the gate stopped wrote no host file: its report names it
            host = str((_json(entry / "health.json") or {}).get("host") or "")
        code = (_read(entry / "job.status", SMALL) or "").split()
        status = int(code[0]) if code and STATUS.fullmatch(code[0]) else None
        at = _mtime(entry / "job.status") if code else None
        out.append(NodeInfo(int(number.group(1)), host.strip()[:200], status, at))
    return sorted(out, key=lambda n: n.node)


def _health_log(run_dir: Path) -> list[dict[str, Any]]:
    try:
        found, _ = fsio.read_records(run_dir / "jobgen-health.jsonl", lambda item: item)
    except (OSError, ConfigError):   # a FIFO or a device where the log should be
        return []
    return found


def _stage_jobs(run_dir: Path) -> set[str]:
    """The run's jobs of a stage other than training (prepare, export, eval), as its record names
    them: they hold no training nodes and are not allocations of the job."""
    try:
        data = runrecord.read_file(run_dir / runrecord.FILE)
    except ConfigError:
        return set()
    return {job for sub in (data or {}).get("submissions", [])
            for job, stage in zip(sub["job_ids"], sub.get("job_stages") or sub["job_ids"])
            if "job_stages" in sub and stage != "train"}


def _folders(run_dir: Path) -> list[tuple[str, int, Path]]:
    root = run_dir / "logs"
    if not root.is_dir():
        return []
    staged = _stage_jobs(run_dir)
    jobs = sorted((p for p in root.iterdir() if p.is_dir() and p.name not in staged),
                  key=lambda p: p.stat().st_mtime)
    return [(job.name, k, e) for job in jobs for k, e in allocation_folders(job)]


class _Builder:
    """Cuts one allocation into segments: each piece from one boundary the run wrote to the
    next, labelled by what happened in it."""

    def __init__(self, index: int, start: float) -> None:
        self.index, self.at = index, start
        self.segments: list[Segment] = []

    def to(self, when: Optional[float], kind: str, step: Optional[int] = None) -> None:
        if when is None or when <= self.at:
            return
        self.segments.append(Segment(kind, self.at, when, self.index, step))
        self.at = when


def _allocation(index: int, k: int, job: str, folder: Path, span: Optional[sacct.Span],
                health: list[dict[str, Any]], now: float, is_last: bool,
                steps_elsewhere: Sequence[tuple[float, int]]) -> tuple[Allocation, list[Segment]]:
    nodes = _nodes(folder)
    gates = []   # (start, end) of each node's health gate: its report's time less its seconds
    for i, n in enumerate(nodes):
        path = folder / f"node-{n.node}" / "health.json"
        found = _json(path)
        ended = _mtime(path) if found is not None else None
        if found is not None and ended is not None:
            gates.append((ended - _seconds(found.get("seconds")), ended))
            nodes[i] = dataclasses.replace(n, gate=gates[-1])
    gate_starts, gate_ends = [g for g, _ in gates], [e for _, e in gates]
    compile_ev = _events(folder / "node-0" / "compile.log", index)
    train_ev = _events(folder / "node-0" / "train.log", index)
    compile_span = held.pass_span(folder, [n.node for n in nodes], "compile")
    times = [o.time for o in compile_ev + train_ev] + gate_ends + \
        [n.ended_at for n in nodes if n.ended_at] + \
        [t for t in compile_span if t]
    if not train_ev and steps_elsewhere:
        # No JSON events (NeMo): the steps' times from its TensorBoard files, within this
        # allocation (the scheduler's span, else the times of the node folders' files).
        marks = [t for p in folder.glob("node-*/*") if p.is_file() and (t := _mtime(p))]
        lo = span.start if span else min(marks, default=now)
        hi = span.end if span and span.end else (now if is_last else max(marks, default=now))
        train_ev = [Observation("step", t, "tensorboard", index, step=n)
                    for t, n in steps_elsewhere if lo <= t <= hi]
    # A Slurm job's controller records when its allocation began (payload/common/job_flow.sh).
    launched = [t for t in held.times(folder / "allocation.times")[:1] if t is not None]
    start = span.start if span else min(launched + gate_starts + times or [now])
    # The newest allocation runs on until every node has recorded how its flow ended.
    over = not is_last or (nodes and all(n.ended_at for n in nodes))
    end = span.end if span and span.end else (max(times) if times and over else now)
    # An entry that names no host left no one out (a hand-edited or cut log): passed over.
    excluded = tuple(str(h["host"]) for h in health
                     if str(h.get("allocation")) == str(k) and h.get("job") == job
                     and isinstance(h.get("host"), str) and h["host"])
    b = _Builder(index, start)
    if gates:
        b.to(min(gate_starts), "startup")
        b.to(max(gate_ends), "gate")
    # The compile pass held the nodes from its launch to its exit (the trainer's events start
    # after its imports and rendezvous, and end before its shutdown).
    launch, exited = compile_span
    if compile_ev or launch is not None:
        b.to(launch if launch is not None else compile_ev[0].time, "startup")
        b.to(exited if exited is not None else compile_ev[-1].time if compile_ev else None,
             "compile")
    steps = [o for o in train_ev if o.training_step]
    resume = next((o for o in train_ev if o.kind == "resume"), None)
    began = next((o.time for o in train_ev if o.kind == "start"), None)
    load_s = resume.time - began if resume and began is not None else None
    training_at = None
    for o in train_ev:
        if o.kind in ("start", "resume") or (o.kind != "step" and training_at is None):
            b.to(o.time, "startup")
        elif o.kind == "step":
            if training_at is None:
                if began is None and len(steps) > 1:
                    # No start event (TensorBoard): the first step took the median step time.
                    typical = statistics.median(y.time - x.time for x, y in zip(steps, steps[1:]))
                    b.to(o.time - typical, "startup")
                training_at = b.at
            b.to(o.time, "train", o.step)
        elif o.kind == "checkpoint":
            b.to(o.time, "checkpoint", o.step)
        else:   # done / stopped: the final save
            b.to(o.time, "checkpoint")
    kinds = {o.kind for o in train_ev}
    failed = sorted((n for n in nodes if n.status and n.ended_at), key=lambda n: n.ended_at or 0)
    state = span.state if span else ""
    if excluded:
        ending = "unhealthy"
    elif "done" in kinds:
        ending = "done"
    elif "stopped" in kinds or (folder / "time-limit").exists():
        ending = "stopped"
    elif (folder / CANCELLED).exists():
        ending = "cancelled"    # Ctrl-C ended the command: a cancel, not a node's failure
    elif failed or state in ("FAILED", "NODE_FAIL") or not is_last:
        ending = "failed"
    else:
        ending = "running" if not state or state in ("RUNNING", "PENDING") else state.lower()
    first = failed[0] if ending == "failed" and failed else None
    failure_at = None
    if ending == "failed":
        failure_at = first.ended_at if first else b.at
        # The step in progress is lost; a failure before any step cuts a start-up short.
        b.to(min(failure_at or end, end), "repeat" if training_at is not None else "startup")
        b.to(end, "failure")
    else:
        b.to(end, {"done": "idle", "stopped": "stop", "unhealthy": "gate",
                   "cancelled": "idle"}.get(ending, "startup"))
    alloc = Allocation(index, job, start, end, ending, tuple(nodes),
                       first.node if first else None, first.host if first else "", failure_at,
                       excluded, span is not None, resume.step if resume else None,
                       steps[-1].step if steps else None, training_at, load_s,
                       saves.figures(train_ev, end - start),
                       restarts_in_place=max(0, sum(o.kind == "start" for o in train_ev) - 1),
                       save_waits=saves.waits(train_ev, end - start),
                       bad_saves=saves.bad(train_ev, end - start))
    return alloc, b.segments


def build(run_dir: Path, now: Optional[float] = None, use_sacct: bool = True,
          steps_elsewhere: Sequence[tuple[float, int]] = ()) -> Timeline:
    """The timeline of the run in `run_dir` (in progress or finished); `steps_elsewhere`: the
    (time, step) of training steps its TensorBoard files hold, for allocations whose logs carry
    no events."""
    now = time.time() if now is None else now
    folders = _folders(run_dir)
    health = _health_log(run_dir)
    by_job: dict[str, Optional[list[sacct.Span]]] = {}
    notes: list[str] = []
    allocations: list[Allocation] = []
    segments: list[Segment] = []
    for i, (job, k, folder) in enumerate(folders):
        if job not in by_job:
            by_job[job] = sacct.spans(job) if use_sacct else None
            if by_job[job] is None and use_sacct and job.isdigit():
                notes.append(f"job {job}: no scheduler accounting (sacct); allocation times "
                             "are the run's own (its controller's start, else its first "
                             "record, to its last record)")
        spans = by_job[job] or []
        span = spans[k] if k < len(spans) else None
        alloc, segs = _allocation(i, k, job, folder, span, health, now, i == len(folders) - 1,
                                   steps_elsewhere)
        if allocations and alloc.start > allocations[-1].end:
            if allocations[-1].job == job:   # a requeue: its reservation keeps the nodes
                segments.append(Segment("gap", allocations[-1].end, alloc.start, i))
            # Between two jobs (two `jobgen run` commands, a resubmit) nothing is held.
        allocations.append(alloc)
        segments += segs
    bad = sum(a.bad_saves for a in allocations)
    if bad:
        notes.append(f"{bad} save event(s) left out of the checkpoint figures: a stall_s or "
                     "write_s below 0, longer than its allocation, or not a number")
    # Held spans, each segment within its allocation, steps trained again labelled so.
    allocations, segments, more = bounds.apply(run_dir, allocations, segments, now)
    notes += more
    apart = sum(max(0.0, b.start - a.end) for a, b in zip(allocations, allocations[1:])
                if a.job != b.job)
    if apart > 0:
        notes.append(f"{apart:,.1f} s between the run's jobs (one job's end to the next one's "
                     "start) held no nodes: not counted as allocated")
    first = by_job.get(folders[0][0]) if folders else None
    waiting = 0.0
    if first and first[0].submit is not None:
        waiting = max(0.0, first[0].start - first[0].submit)
    count = max((len(a.nodes) for a in allocations), default=0)
    return Timeline(str(run_dir), waiting, tuple(allocations), tuple(segments), count,
                    tuple(notes))
