"""The plan: the rendered files of a job and the exact command that submits them.

`backend.plan(spec)` is pure (same inputs, byte-identical plan). Printing the plan is the dry run;
writing it puts the files in a folder atomically; submitting runs exactly what was printed.
"""
from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .errors import JobgenError


@dataclass(frozen=True)
class PlannedFile:
    name: str
    content: str
    executable: bool = False


@dataclass(frozen=True)
class Plan:
    backend: str
    files: tuple[PlannedFile, ...]
    primary: str                  # the file printed on stdout by `jobgen render`
    submit_argv: tuple[str, ...]  # how the file is submitted; "{primary}" stands for its path

    def file(self, name: Optional[str] = None) -> PlannedFile:
        name = name or self.primary
        for f in self.files:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def text(self) -> str:
        return self.file().content

    def write(self, directory: Path) -> list[Path]:
        """Write every file into `directory`, all or nothing: each file goes to a temporary
        name first and is renamed into place only when all of them were written."""
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise JobgenError(f"{directory}: cannot create: {exc.strerror}") from None
        staged: list[tuple[str, Path]] = []
        try:
            for f in self.files:
                fd, tmp = tempfile.mkstemp(prefix=f".{f.name}.", dir=directory)
                staged.append((tmp, directory / f.name))
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(f.content)
                    out.flush()
                    os.fsync(out.fileno())
                os.chmod(tmp, 0o755 if f.executable else 0o644)
            for _, final in staged:  # the one thing that would make a rename below fail
                if final.is_dir():
                    raise IsADirectoryError(errno.EISDIR, f"{final.name} is a directory")
            for tmp, final in staged:
                os.replace(tmp, final)
        except OSError as exc:
            for tmp, _ in staged:
                Path(tmp).unlink(missing_ok=True)
            raise JobgenError(f"{directory}: cannot write: {exc.strerror}") from None
        return [final for _, final in staged]

    def argv(self, primary_path: Path) -> list[str]:
        return [a.replace("{primary}", str(primary_path)) for a in self.submit_argv]
