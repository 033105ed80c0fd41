"""What a run folder is: the marks a run leaves, and a bounded walk for its event files (a
folder that is not a run, like / or /proc, is refused or walked only so far)."""
from __future__ import annotations

import os
from pathlib import Path

RUN_MARKERS = ("logs", "train", "nemo", "jobgen-run.json")
MAX_ENTRIES = 200_000    # a run folder's walk for event files stops here (not a run: / or /proc)


def is_run(folder: Path) -> bool:
    """Whether `folder` holds what a run writes (its logs, train or nemo folder, its record)."""
    return any((folder / m).exists() for m in RUN_MARKERS)


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
