"""Readers: what a run writes, turned into `Observation`s, read incrementally while it runs.

- the payloads' JSON-line events (payload/common/events.py): rank 0's in node 0's log of each
  allocation, every node's ``beat`` in its own log, or ``RUN_DIR/train/metrics.jsonl`` where
  there are no node logs (the log folders: docs/watching.md);
- TensorBoard event files, through the tensorboard package's own reader (tbevents.py), only
  where the run writes no JSON events (a run jobgen did not start);
- the per-node logs themselves: when each last grew, and how each node's pass ended.
"""
from __future__ import annotations

import os
import stat
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..plumbing import fsio
from ..plumbing.errors import JobgenError
from .events import parse_lines, same_allocation
from .observations import Observation
from .runfolder import allocation_folders, event_files
from .runfolder import mtime as _mtime
from .tbevents import EventFile

MAX_LINE = fsio.MAX_LINE
CHUNK = 16 << 20   # read of a growing file per call: memory stays bounded, the rest comes next
# TensorBoard tags, first match wins: NeMo's (neuronx-nemo-megatron logs these names), then the
# ``train/<key>`` form jobgen's payloads write, then common spellings.
TAGS = {
    "loss": ("reduced_train_loss", "train/loss", "train_loss", "loss"),
    "grad_norm": ("gradient_norm", "train/grad_norm", "grad_norm"),
    "param_norm": ("parameter_norm", "train/param_norm", "param_norm"),
    "lr": ("lr", "train/lr", "learning_rate"),
    "consumed": ("consumed_samples", "train/consumed_samples"),
    "samples_per_s": ("throughput", "train/samples_per_s", "samples_per_s"),
}


def read_from(path: Path, offset: int) -> bytes:
    """What a growing regular file holds from `offset` on, at most CHUNK bytes (nothing when it
    cannot be read now, or is not a regular file: a FIFO or device is never waited on)."""
    try:
        return fsio.read_bytes(path, CHUNK, offset=offset, partial=True)
    except (OSError, JobgenError):
        return b""


class LineReader:
    """A growing text file read line by line: each `read` returns the complete lines added since
    the last one (a line still being written waits), and notes when the file last grew."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.grew_at: Optional[float] = None
        self.skipped = 0           # lines over MAX_LINE, or events that are not JSON objects
        self.not_regular = False   # the path is there but not a regular file: never read

    def read(self, now: float) -> list[str]:
        data = read_from(self.path, self.offset)
        if not data:
            if not self.not_regular:
                try:
                    self.not_regular = not stat.S_ISREG(os.lstat(self.path).st_mode)
                except OSError:
                    pass           # not there (yet)
            return []
        self.offset += len(data)
        self.grew_at = now
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > MAX_LINE:   # no line is this long: drop it, memory stays bounded
            self.partial, self.skipped = b"", self.skipped + 1
        kept = [line for line in lines if len(line) <= MAX_LINE]
        self.skipped += len(lines) - len(kept)
        return [line.decode("utf-8", "replace") for line in kept]


@dataclass
class NodeEnd:
    """How one node's flow ended in one allocation (job.status and the node's host)."""
    node: int
    host: str
    status: Optional[int]
    what: str
    at: float = 0.0          # when the node recorded it (the status file's modification time)


@dataclass
class Allocation:
    """One allocation of the job (a restart-N or attempt-N folder, or the job folder of a
    `jobgen run` command)."""
    index: int
    job: str
    folder: Path
    logs: dict[int, LineReader] = field(default_factory=dict)

    def nodes(self) -> list[int]:
        found = []
        for entry in self.folder.glob("node-*"):
            text = entry.name[5:]
            if text.isascii() and text.isdigit() and len(text) <= 6:   # not node-²
                found.append(int(text))
        return sorted(found)

    def host(self, node: int) -> str:
        try:
            return fsio.read_text(self.folder / f"node-{node}" / "host", 4096).strip()
        except (OSError, JobgenError):
            return ""

    def ends(self) -> list[NodeEnd]:
        out = []
        for node in self.nodes():
            status, what, at = None, "", 0.0
            path = self.folder / f"node-{node}" / "job.status"
            try:
                text = fsio.read_text(path, 4096).strip()
                code, _, what = text.partition(" ")
                status = int(code) if code.isascii() and code.isdigit() and len(code) < 4 \
                    else None
                at = path.stat().st_mtime
            except (OSError, JobgenError):
                pass
            out.append(NodeEnd(node, self.host(node), status, what, at))
        return out


class RunReader:
    """Everything a run folder holds, read incrementally. ``jobs`` gives the job ids whose log
    folders belong to the run being watched (None: every job folder, oldest first)."""

    def __init__(self, run_dir: Path, jobs: Optional[Callable[[], list[str]]] = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.run_dir = run_dir
        self.jobs = jobs
        self.clock = clock
        self.allocations: list[Allocation] = []
        self.metrics: Optional[LineReader] = None
        self.metrics_restart = -1
        self.metrics_start: Optional[Observation] = None
        self.tensorboard: dict[Path, EventFile] = {}
        self.json_seen = False
        self.notes: list[str] = []

    def skipped_notes(self) -> list[str]:
        """What was left unread, said once at the end: lines skipped, files that are not
        regular files."""
        readers = [r for a in self.allocations for r in a.logs.values()]
        readers += [self.metrics] if self.metrics is not None else []
        lines = sum(r.skipped for r in readers)
        notes = [f"{lines} line(s) of the run's logs skipped (over {MAX_LINE} bytes, or events "
                 "that are not JSON objects)"] if lines else []
        return notes + [f"{r.path}: not a regular file; not read" for r in readers
                        if r.not_regular]

    # --- discovery ------------------------------------------------------------------------------

    def _job_folders(self) -> list[Path]:
        root = self.run_dir / "logs"
        if self.jobs is not None:
            return [root / job for job in self.jobs() if (root / job).is_dir()]
        if not root.is_dir():
            return []
        folders = [p for p in root.iterdir() if p.is_dir()]
        return sorted(folders, key=lambda p: (p.stat().st_mtime, p.name))

    def _discover(self) -> None:
        known = {a.folder for a in self.allocations}
        for job_folder in self._job_folders():
            for _, folder in allocation_folders(job_folder):
                if folder not in known:
                    self.allocations.append(Allocation(len(self.allocations), job_folder.name,
                                                       folder))

    # --- reading --------------------------------------------------------------------------------

    def read(self) -> list[Observation]:
        """The observations added since the last read, in order within each source."""
        now = self.clock()
        self._discover()
        out: list[Observation] = []
        for alloc in self.allocations:
            for node in alloc.nodes():
                reader = alloc.logs.get(node)
                if reader is None:
                    reader = alloc.logs[node] = LineReader(alloc.folder / f"node-{node}" /
                                                           "train.log")
                lines = reader.read(now)
                found = parse_lines(lines, "events", alloc.index, node, reader)
                # Rank 0 speaks for the job from node 0; every node speaks for itself in beats.
                out += [o for o in found if o.kind == "beat" or node == 0]
        if not self.allocations:
            out += self._read_metrics(now)
        if any(o.kind != "beat" for o in out):
            self.json_seen = True
        if not self.json_seen and not (self.run_dir / "train" / "metrics.jsonl").exists():
            out += self._read_tensorboard()
        out.sort(key=lambda o: (o.restart, o.time))
        return out

    def _read_metrics(self, now: float) -> list[Observation]:
        path = self.run_dir / "train" / "metrics.jsonl"
        if self.metrics is None:
            if not path.exists():
                return []
            self.metrics = LineReader(path)
        out = []
        for found in parse_lines(self.metrics.read(now), "events", max(self.metrics_restart, 0),
                                 tally=self.metrics):
            # Each invocation of the training pass starts with one; one in the allocation of the
            # start before it is a restart in place (the same allocation).
            if found.kind == "start" and not same_allocation(found, self.metrics_start):
                self.metrics_restart += 1
                found = _with_restart(found, self.metrics_restart)
            elif self.metrics_restart > 0:
                found = _with_restart(found, self.metrics_restart)
            if found.kind == "start":
                self.metrics_start = found
            out.append(found)
        return out

    def _read_tensorboard(self) -> list[Observation]:
        files = sorted(event_files(self.run_dir), key=lambda p: (_mtime(p), p.name))
        out: list[Observation] = []
        for path in files:
            reader = self.tensorboard.get(path)
            if reader is None:
                reader = self.tensorboard[path] = EventFile(path)
                if len(self.tensorboard) > 1:   # a new writer: the trainer started again
                    out.append(Observation("start", _mtime(path), "tensorboard",
                                           restart=len(self.tensorboard) - 1))
            restart = list(self.tensorboard).index(path)
            by_step: dict[int, dict[str, float]] = defaultdict(dict)
            times: dict[int, float] = {}
            for scalar in reader.read():
                by_step[scalar.step][scalar.tag] = scalar.value
                times[scalar.step] = max(times.get(scalar.step, 0.0), scalar.wall_time)
            if reader.damaged and reader.damaged not in self.notes:
                self.notes.append(reader.damaged)
            for step in sorted(by_step):
                values = by_step[step]
                picked = {key: next((values[t] for t in tags if t in values), None)
                          for key, tags in TAGS.items()}
                if all(v is None for v in picked.values()):
                    continue
                consumed = picked["consumed"]
                out.append(Observation(
                    "step", times[step], "tensorboard", restart=restart, step=step,
                    loss=picked["loss"], grad_norm=picked["grad_norm"],
                    param_norm=picked["param_norm"], lr=picked["lr"],
                    samples_per_s=picked["samples_per_s"],
                    consumed=int(consumed) if consumed is not None and consumed == consumed
                    else None))
        return out

    # --- what the nodes say about themselves ----------------------------------------------------

    def silence(self, now: float) -> dict[int, float]:
        """Seconds since each node's log of the newest allocation last grew."""
        if not self.allocations:
            return {}
        alloc = self.allocations[-1]
        return {node: now - reader.grew_at for node, reader in alloc.logs.items()
                if reader.grew_at is not None}

    def hosts(self, restart: int) -> dict[int, str]:
        if 0 <= restart < len(self.allocations):
            alloc = self.allocations[restart]
            return {node: alloc.host(node) for node in alloc.nodes()}
        return {}


def _with_restart(found: Observation, restart: int) -> Observation:
    from dataclasses import replace
    return replace(found, restart=restart)
