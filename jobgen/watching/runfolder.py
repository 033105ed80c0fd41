"""What a run folder is: the marks a run leaves, and a bounded walk for its event files (a
folder that is not a run, like / or /proc, is refused or walked only so far)."""
from __future__ import annotations

import os
import re
from pathlib import Path

RUN_MARKERS = ("logs", "train", "nemo", "jobgen-run.json")
MAX_ENTRIES = 200_000    # a run folder's walk for event files stops here (not a run: / or /proc)
ALLOCATION = re.compile(r"^(restart|attempt)-([0-9]{1,9})$")   # ASCII digits (not -²)
NODE = re.compile(r"node-([0-9]{1,6})")      # ASCII digits only (not node-²)


def is_run(folder: Path) -> bool:
    """Whether `folder` holds what a run writes (its logs, train or nemo folder, its record)."""
    return any((folder / m).exists() for m in RUN_MARKERS)


def allocation_folders(job: Path) -> list[tuple[int, Path]]:
    """A job's allocations in `RUN/logs/JOB/`, oldest first: its ``restart-N`` (Slurm) or
    ``attempt-N`` (Batch) folders, else the job folder itself where its nodes' folders lie
    directly in it (`jobgen run`: one allocation per command)."""
    try:
        entries = [e for e in job.iterdir() if e.is_dir()]
    except OSError:
        return []
    found = [(int(m.group(2)), e) for e in entries if (m := ALLOCATION.match(e.name))]
    if not found and any(NODE.fullmatch(e.name) for e in entries):
        found = [(0, job)]
    return sorted(found)


def event_files(run_dir: Path) -> list[Path]:
    """The TensorBoard event files under `run_dir` outside checkpoints: symlinks not followed,
    unreadable folders skipped, and the walk bounded."""
    out, seen = [], 0
    for top, dirs, files in os.walk(run_dir, onerror=lambda _exc: None):
        seen += len(dirs) + len(files)
        if seen > MAX_ENTRIES:
            break
        dirs[:] = [d for d in dirs if d != "checkpoints"]
        out += [Path(top, f) for f in files if f.startswith("events.out.tfevents.")]
    return out


def mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
