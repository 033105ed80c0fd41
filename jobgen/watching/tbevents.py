"""Scalars out of TensorBoard event files, read with the `tensorboard` package's own loader
(`pip install 'jobgen[tensorboard]'`): only for runs that write no JSON events, as a run jobgen
did not start may. The package is imported on the first read, never by a render.

The loader leaves a record still being written for the next read, and stops at a damaged one
(it cannot tell the two apart); what is not a regular file is never opened (a FIFO would block).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .observations import plausible_time

NEEDS = "reading TensorBoard event files needs the tensorboard package: " \
        "pip install 'jobgen[tensorboard]'"


@dataclass(frozen=True, slots=True)
class Scalar:
    tag: str
    step: int
    wall_time: float
    value: float


class EventFile:
    """Reads an event file incrementally: each `read` returns the scalars of the records
    completed since the last one. `damaged` says, once, why the file is no longer read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.damaged: Optional[str] = None
        self._loader: Any = None

    def read(self) -> list[Scalar]:
        if self.damaged:
            return []
        try:
            if not stat.S_ISREG(os.lstat(self.path).st_mode):
                self.damaged = f"{self.path}: not a regular file; not read"
                return []
        except OSError:
            return []                   # not there (yet)
        try:
            from tensorboard.backend.event_processing import event_file_loader
            from tensorboard.util import tensor_util
        except ImportError:
            self.damaged = NEEDS
            return []
        out: list[Scalar] = []
        try:
            if self._loader is None:
                self._loader = event_file_loader.EventFileLoader(str(self.path))
            for event in self._loader.Load():
                if not plausible_time(event.wall_time):
                    continue
                for value in event.summary.value:
                    if value.metadata.plugin_data.plugin_name != "scalars":
                        continue
                    number = tensor_util.make_ndarray(value.tensor)
                    if number.size == 1:
                        out.append(Scalar(value.tag, event.step, event.wall_time,
                                          float(number.item())))
        except Exception as exc:        # noqa: BLE001  a record tensorboard cannot decode
            self.damaged = f"{self.path}: not read past a damaged record ({type(exc).__name__})"
        return out
