"""The plan: the rendered files of a job and the exact command that submits them.

`backend.plan(spec)` is pure (same inputs, byte-identical plan). Printing the plan is the dry run;
writing it puts the files in a folder atomically; submitting runs exactly what was printed.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator, Optional

from ..plumbing.errors import JobgenError
from ..plumbing.record import record


@record
class PlannedFile:
    name: str
    content: str
    executable: bool = False


@record
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
        name first and is renamed into place only when all of them were written. Modes follow
        the umask (the executable bits for scripts only). SIGINT or SIGTERM while writing
        removes the temporaries, then ends as the signal would (KeyboardInterrupt, exit 143)."""
        import tempfile  # here: rendering to stdout never needs it

        from ..plumbing.fsio import current_umask, refuse_special
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise JobgenError(f"{directory}: cannot create: {exc.strerror}") from None
        staged: list[tuple[str, Path]] = []
        umask = current_umask()
        try:
            for f in self.files:   # a device, FIFO, folder or symlink there: nothing written
                refuse_special(directory / f.name)
            with _Interruptible().active() as signals:
                for f in self.files:
                    with signals.held():   # no temporary file left unrecorded
                        fd, tmp = tempfile.mkstemp(prefix=f".{f.name}.", dir=directory)
                        staged.append((tmp, directory / f.name))
                    with os.fdopen(fd, "w", encoding="utf-8") as out:
                        out.write(f.content)
                        out.flush()
                        os.fsync(out.fileno())
                    os.chmod(tmp, (0o777 if is_script(f) else 0o666) & ~umask)
                for _, final in staged:  # again: the moment before the renames
                    refuse_special(final)
                with signals.held():
                    for tmp, final in staged:
                        os.replace(tmp, final)
                    staged.clear()
        except OSError as exc:
            raise JobgenError(f"{directory}: cannot write: {exc.strerror}") from None
        except _Signalled as sig:
            if sig.signum == 2:     # SIGINT (the signal module is imported only to write)
                raise KeyboardInterrupt from None
            raise SystemExit(128 + sig.signum) from None
        finally:
            for tmp, _ in staged:   # whatever is left was not renamed into place
                Path(tmp).unlink(missing_ok=True)
        return [directory / f.name for f in self.files]

    def argv(self, primary_path: Path) -> list[str]:
        return [a.replace("{primary}", str(primary_path)) for a in self.submit_argv]


def is_script(f: PlannedFile) -> bool:
    """Files that get the executable bits: marked so, shell scripts, or with a shebang."""
    return f.executable or f.name.endswith((".sh", ".sbatch")) or f.content.startswith("#!")


class _Signalled(BaseException):
    """SIGINT or SIGTERM arrived while files were being written."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Interruptible:
    """While active, SIGINT and SIGTERM raise _Signalled (main thread only: elsewhere Python
    cannot install handlers); inside `held()` they wait until its end, so that the renames
    into place happen all together or not at all. A signal ignored before stays ignored."""

    def __init__(self) -> None:
        self.holding = False
        self.pending: Optional[int] = None

    def _handler(self, signum: int, _frame: Any) -> None:
        if self.holding:
            self.pending = signum
            return
        raise _Signalled(signum)

    @contextlib.contextmanager
    def active(self) -> Iterator["_Interruptible"]:
        import signal
        import threading

        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    previous[signum] = signal.signal(signum, self._handler)
        try:
            yield self
        finally:
            for restored, old in previous.items():
                signal.signal(restored, old)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.pending is not None:
            raise _Signalled(self.pending)
