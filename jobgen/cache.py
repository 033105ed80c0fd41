"""jobgen's private cache ($XDG_CACHE_HOME/jobgen, else ~/.cache/jobgen): compiled templates
and parsed recipe and site files, so that `jobgen render` does not compile or parse what it
already did. Nothing here is trusted blindly: a folder is used only if it is this user's alone,
and an entry only if it is a regular file of this user's that nobody else can write, with the
SHA-256 of its content stored in front of it. Anything else is ignored (and rewritten). A cache
that cannot be written is never a reason to fail."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import stat
import tempfile
from typing import Optional

DIGEST = 32                 # bytes of SHA-256 in front of each entry
MAX_ENTRY = 16 << 20


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
    """The cache folder for `kind` ("templates", "parsed"), or None where it is not private."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "jobgen", kind)
    return path if _private_folder(path) else None


def read(path: str) -> Optional[bytes]:
    """An entry's content if it passes the checks, else None."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
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
    if len(digest) != DIGEST or hashlib.sha256(payload).digest() != digest:
        return None
    return payload


def write(path: str, payload: bytes) -> None:
    """Write an entry atomically (a temporary file of mode 0600, renamed into place)."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
