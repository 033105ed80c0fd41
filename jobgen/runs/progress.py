"""Progress while jobgen waits (submit --wait, resubmit --wait): every state change as a line
on stderr, and on a terminal the newest state with the time waited so far, redrawn in place
every second. Not a terminal (a pipe, a CI log): the lines only, nothing redrawn."""
from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

_STEP = re.compile(r'"event": "step", "step": ([0-9]{1,18})(?![0-9])')


def newest_step(run_dir: str, job_id: str) -> Optional[int]:
    """The newest training step node 0 of a job logged (its payload's JSON events), where the
    run folder is on this machine; None before the first."""
    logs = sorted(Path(run_dir, "logs", job_id).glob("*/node-0/train.log"),
                  key=lambda p: p.stat().st_mtime)
    if not logs:
        return None
    from ..plumbing import fsio
    from ..plumbing.errors import JobgenError
    try:
        with open(fsio.open_regular(logs[-1]), "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
            found = _STEP.findall(f.read(65536).decode("utf-8", "replace"))
    except (OSError, JobgenError):
        return None
    return int(found[-1]) if found else None


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class Ticker:
    def __init__(self, stream: Optional[TextIO] = None, every: float = 1.0,
                 steps: Optional[Callable[[], str]] = None) -> None:
        self.stream = stream or sys.stderr
        self.steps = steps
        self.tty = self.stream.isatty() and os.environ.get("TERM", "") != "dumb"
        self.every, self.state, self.start = every, "waiting", time.monotonic()
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "Ticker":
        if self.tty:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.tty:
            with self._lock:
                self.stream.write("\r\033[K")
                self.stream.flush()

    def say(self, line: str) -> None:
        """A state change: printed as a line (above the redrawn one on a terminal)."""
        line = line.rstrip("\n")
        with self._lock:
            self.stream.write(("\r\033[K" if self.tty else "") + line + "\n")
            self.stream.flush()
            self.state = line

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:   # a progress figure must never end the wait
                steps = self.steps() if self.steps is not None else ""
            except Exception:  # noqa: BLE001
                steps = ""
            with self._lock:
                self.stream.write(f"\r\033[K{self.state} (waited "
                                  f"{_elapsed(time.monotonic() - self.start)}"
                                  f"{', ' + steps if steps else ''})")
                self.stream.flush()
