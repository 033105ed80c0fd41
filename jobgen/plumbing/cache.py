"""jobgen's private cache ($XDG_CACHE_HOME/jobgen, else ~/.cache/jobgen): compiled templates,
parsed recipe and site files, rendered scripts and the payload's digest, so that `jobgen render`
does not compile, parse, render or hash what it already did. Nothing here is trusted blindly:
a folder is used only if it is this user's alone, and an entry only if it is a regular file of
this user's that nobody else can write, with the SHA-256 of its content stored in front of it.
Anything else is ignored (and rewritten). A cache that cannot be written is never a reason to
fail. JOBGEN_CACHE=off turns it off."""
from __future__ import annotations

import contextlib
import functools
import os
import stat
from typing import Any, Optional

DIGEST = 32                 # bytes of SHA-256 in front of each entry
MAX_ENTRY = 16 << 20


def _sha256_type() -> Any:
    """SHA-256 from CPython's own module where it has one (hashlib's import loads OpenSSL, a
    noticeable part of a render's start-up), else hashlib's."""
    for module in ("_sha2", "_sha256"):     # Python 3.12+, 3.11
        try:
            return __import__(module).sha256
        except (ImportError, AttributeError):
            continue
    import hashlib
    return hashlib.sha256


sha256 = _sha256_type()


def enabled() -> bool:
    """JOBGEN_CACHE=off turns the whole cache off (every run compiles, parses and renders)."""
    return os.environ.get("JOBGEN_CACHE", "").strip().lower() not in ("off", "0", "no", "false")


def _private_folder(path: str) -> bool:
    """Whether `path` is a real folder owned by this user that nobody else can write to
    (creating it so if missing). A folder another user controls could hold planted entries."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and not st.st_mode & 0o022 and os.access(path, os.W_OK))


@functools.lru_cache(maxsize=None)
def folder(kind: str) -> Optional[str]:
    """The cache folder for `kind` ("templates", "parsed", ...), or None where it is not private
    or the cache is turned off."""
    if not enabled():
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "jobgen", kind)
    return path if _private_folder(path) else None


def read(path: str) -> Optional[bytes]:
    """An entry's content if it passes the checks, else None."""
    try:
        # O_NONBLOCK: a FIFO in the cache is opened at once (and refused below), not waited on
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid()
                or st.st_mode & 0o022 or st.st_size > MAX_ENTRY):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
    except OSError:
        return None
    finally:
        os.close(fd)
    digest, payload = data[:DIGEST], data[DIGEST:]
    if len(digest) != DIGEST or sha256(payload).digest() != digest:
        return None
    return payload


def write(path: str, payload: bytes) -> None:
    """Write an entry atomically (a regular file of mode 0600, renamed into place; a device,
    FIFO or symlink in its place is left alone and the entry not written)."""
    from . import fsio
    from .errors import JobgenError
    with contextlib.suppress(OSError, JobgenError):
        fsio.write_file(path, sha256(payload).digest() + payload, mode=0o600)


def stamp(package: str) -> Optional[list[object]]:
    """Which installed copy of `package` this is, without importing it: its file's path, size
    and modification time (an upgrade changes them). Part of the key of anything the package's
    code decided; None where it is not installed."""
    import importlib.util
    try:
        found = importlib.util.find_spec(package)
        if found is None or not found.origin:
            return None
        st = os.stat(found.origin)
    except (ImportError, ValueError, OSError):
        return None
    return [found.origin, st.st_size, st.st_mtime_ns]


def prune(folder: str, keep: int) -> None:
    """Bound a folder whose entries have unbounded keys (rendered scripts): once it holds more
    than `keep` entries, only the `keep // 2` most recently written stay. Called after a write,
    so the folder never exceeds `keep` and a scan happens rarely in effect."""
    try:
        with os.scandir(folder) as it:
            entries = [(e.stat(follow_symlinks=False).st_mtime_ns, e.path)
                       for e in it if e.is_file(follow_symlinks=False)]
    except OSError:
        return
    if len(entries) <= keep:
        return
    entries.sort()
    for _, path in entries[:len(entries) - keep // 2]:
        with contextlib.suppress(OSError):
            os.unlink(path)
