"""Payload snapshots: a job runs the payload it was rendered with, never the live copy.

The digest of a payload folder is the SHA-256 of its files (relative path, executable bit and
content, in path order; __pycache__ and the like left out). A shared file system gets a copy under
the site's snapshot folder, named by the digest's first 16 hex digits, written once and
atomically, read-only, with the full digest in `.jobgen-digest`; the job's script points at it.
Images carry the same file, and every node's flow compares it with the rendered digest first.
"""
from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import shutil
import stat
import uuid
from pathlib import Path
from typing import Callable, Optional

from ..plumbing import fsio
from ..plumbing.errors import ConfigError, JobgenError

MARKER = ".jobgen-digest"
ID_LENGTH = 16
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
_SKIP_SUFFIXES = (".pyc", ".pyo")


def _files(root: Path) -> list[tuple[str, Path]]:
    """(path relative to root, path) of every file of the payload, in a stable order."""
    out: list[tuple[str, Path]] = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in names:
            if name == MARKER or name.endswith(_SKIP_SUFFIXES):
                continue
            path = Path(folder, name)
            out.append((path.relative_to(root).as_posix(), path))
    return sorted(out)


_memo: dict[tuple[object, ...], str] = {}   # in-process: `jobgen check` renders many jobs


def digest(root: Optional[Path] = None) -> str:
    """The payload's digest (64 hex digits); `root` defaults to jobgen's own payload."""
    if root is None:
        from ..plumbing import resources
        root = resources.folder("payload")
    files = _files(root)
    key: tuple[object, ...] = (str(root), *((rel, s.st_mtime_ns, s.st_size, s.st_mode)
                                            for rel, s in ((rel, p.stat()) for rel, p in files)))
    if key in _memo:
        return _memo[key]
    h = hashlib.sha256()
    for rel, path in files:
        mode = path.stat().st_mode
        h.update(rel.encode() + b"\0" + (b"x" if mode & stat.S_IXUSR else b"-") + b"\0")
        data = fsio.read_bytes(path)   # a FIFO or device in a snapshot: refused, not read
        h.update(str(len(data)).encode() + b"\0" + data)
    _memo[key] = h.hexdigest()
    return _memo[key]


def short(full: str) -> str:
    """The id a snapshot folder and an image tag carry."""
    return full[:ID_LENGTH]


def folder(root: str, full: str) -> str:
    """Where the snapshot of digest `full` lives under the snapshot folder `root`."""
    return posixpath.join(root, short(full))


def _mount_missing(root: str) -> Optional[str]:
    """The top folder of an absolute `root` when it does not exist here (/fsx on a laptop): the
    site's shared storage is not mounted on this machine."""
    if not root.startswith("/"):
        return None
    top = "/" + root.strip("/").split("/")[0]
    return None if os.path.isdir(top) else top


def _copy(source: Path, target: Path) -> None:
    for rel, path in _files(source):
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
        executable = path.stat().st_mode & stat.S_IXUSR
        os.chmod(dest, 0o555 if executable else 0o444)


def _verify(target: Path, full: str) -> None:
    """`target` holds exactly the payload of digest `full`."""
    try:
        recorded = fsio.read_text(target / MARKER, 4096).strip()
        same = recorded == full and digest(target) == full
    except (OSError, JobgenError):   # a file that cannot be read, or is not a regular file
        same = False
    if not same:
        raise ConfigError(f"payload snapshot {target} does not hold payload {short(full)} (it "
                          f"was changed after it was written): move it aside (mv {target} "
                          f"{target}.bad) and render or submit again")


def place(root: str, full: str, source: Optional[Path] = None, *,
          strict: bool = True, say: Optional[Callable[[str], None]] = None) -> Optional[Path]:
    """Put the snapshot of digest `full` (a copy of `source`, default jobgen's payload) under
    `root` unless it is there; verify it if it is. Returns its folder. Where `root` is on
    storage this machine does not have (its top folder is missing), `strict` raises and
    otherwise `say` is told and None returned: the job checks the snapshot when it starts."""
    if source is None:
        from ..plumbing import resources
        source = resources.folder("payload")
    target = Path(folder(root, full))
    missing = _mount_missing(root)
    if missing is not None:
        message = (f"payload snapshot not placed: {missing} does not exist on this machine (the "
                   f"site keeps snapshots in {root}); render or submit on a machine that "
                   "mounts it")
        if strict:
            raise ConfigError(message)
        if say is not None:
            say(f"warning: {message}, or the job will stop at its start")
        return None
    if target.is_dir():
        _verify(target, full)
        return target
    if digest(source) != full:
        raise ConfigError(f"payload {short(full)} is not this jobgen's payload "
                          f"({short(digest(source))}), and {target} does not exist: install the "
                          "jobgen that rendered it, or submit the run again with --amend")
    parent = target.parent
    tmp = parent / f".tmp-{short(full)}-{uuid.uuid4().hex[:8]}"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        _copy(source, tmp)
        (tmp / MARKER).write_text(full + "\n", encoding="utf-8")
        os.chmod(tmp / MARKER, 0o444)
        try:
            os.rename(tmp, target)
        except OSError as exc:   # another submission placed the same snapshot first
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            _remove(tmp)
    except OSError as exc:
        _remove(tmp)
        where = exc.filename or parent
        raise ConfigError(f"cannot write the payload snapshot to {parent}: {where}: "
                          f"{exc.strerror}; make it writable, or point the site's "
                          "paths.payload_dir at a shared folder you can write") from None
    _verify(target, full)
    return target


def _remove(path: Path) -> None:
    """Remove a (partial) snapshot copy, read-only files and all."""
    def writable(func: Callable[..., object], p: str, _exc: object) -> None:
        os.chmod(os.path.dirname(p), 0o755)
        os.chmod(p, 0o755)
        func(p)
    if path.exists():
        import shutil
        shutil.rmtree(path, onerror=writable)


def export(target: Path, full: Optional[str] = None) -> Path:
    """Write jobgen's payload with its digest file to `target` (an image's build context)."""
    from ..plumbing import resources
    source = resources.folder("payload")
    full = full or digest(source)
    if target.exists():
        raise ConfigError(f"{target}: exists; give a new folder")
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        tmp.mkdir(parents=True)
        _copy(source, tmp)
        copied = digest(tmp)     # what was copied is what the digest file will say
        if copied == full:
            (tmp / MARKER).write_text(full + "\n", encoding="utf-8")
            os.rename(tmp, target)
    except OSError as exc:
        _remove(tmp)
        raise ConfigError(f"cannot write {target}: {exc.strerror}") from None
    if copied != full:
        _remove(tmp)
        raise ConfigError(f"payload {short(full)} is not this jobgen's payload ({short(copied)}): "
                          "install the jobgen that rendered it, or render the job again")
    return target
