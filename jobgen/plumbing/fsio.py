"""The one reader and the one writer for what jobgen reads from and writes to disk.

Reading: regular files only, opened without blocking (a FIFO or a device answers at once instead
of hanging), bounded in size and line length; JSON-line records parsed strictly (strict_json.py),
checked against their schema by the caller, bad lines skipped and counted. Writing: creates or
atomically replaces a regular file in the folder it is given; a target that is not a regular file
(a device, a FIFO, a folder, a symlink, wherever it points) is refused before anything is written.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar, Union

from .errors import ConfigError
from .strict_json import loads as loads  # re-exported: callers read with fsio, then parse

T = TypeVar("T")
MAX_BYTES = 64 << 20     # a record, a run's jsonl, a config: far above any real one
MAX_LINE = 1 << 20       # one JSON line (an event, a run): far above any real one
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


class NotRegularFile(ConfigError):
    """A path jobgen reads or writes is something other than a regular file."""


class TooLarge(ConfigError):
    """A file is larger than jobgen reads of it."""


def kind(mode: int) -> str:
    """What a file of this mode is, in words ("a FIFO")."""
    for test, words in _KINDS:
        if test(mode):
            return words
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


# --- reading --------------------------------------------------------------------------------

def open_regular(path: Union[str, Path]) -> int:
    """A read-only descriptor of `path`, which must be a regular file. Opened with O_NONBLOCK
    so that a FIFO without a writer does not block the open; fstat then refuses it.
    FileNotFoundError and other OSErrors pass to the caller."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:    # a socket (or a device without its driver)
            raise NotRegularFile(f"{path}: is {kind(os.stat(path).st_mode)}, not a regular "
                                 "file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(f"{path}: is {kind(mode)}, not a regular file")
    return fd


def read_bytes(path: Union[str, Path], limit: int = MAX_BYTES, offset: int = 0,
               partial: bool = False) -> bytes:
    """What the regular file `path` holds from `offset` on: at most `limit` bytes. Over the
    limit, `partial` returns the first `limit` bytes (a growing log is read on in the next
    call); otherwise TooLarge."""
    fd = open_regular(path)
    try:
        if offset:
            os.lseek(fd, offset, os.SEEK_SET)
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        if not partial:
            raise TooLarge(f"{path}: more than {limit:,} bytes; not read")
        data = data[:limit]
    return data


def read_text(path: Union[str, Path], limit: int = MAX_BYTES) -> str:
    """The regular file `path` as text (undecodable bytes replaced), at most `limit` bytes."""
    return read_bytes(path, limit).decode("utf-8", "replace")


def read_records(path: Union[str, Path], check: Callable[[dict[str, Any]], Optional[T]],
                 limit: int = MAX_BYTES, max_line: int = MAX_LINE) -> tuple[list[T], int]:
    """The JSON-object lines of `path` that `check` accepts (it returns the record, or None or
    raises ValueError/TypeError/KeyError for one it refuses), and how many non-blank lines were
    skipped. A missing file is ([], 0); a file over `limit` is read to the limit."""
    try:
        data = read_bytes(path, limit, partial=True)
    except FileNotFoundError:
        return [], 0
    out: list[T] = []
    skipped = 0
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        found = None
        if len(raw) <= max_line:
            try:
                value = loads(raw.decode("utf-8", "replace"))
                found = check(value) if isinstance(value, dict) else None
            except (ValueError, TypeError, KeyError, AttributeError):
                found = None
        if found is None:
            skipped += 1
        else:
            out.append(found)
    return out, skipped


# --- writing --------------------------------------------------------------------------------

def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)   # elsewhere: set and restore (not thread-safe, but brief)
    os.umask(mask)
    return mask


def refuse_special(path: Union[str, Path], dir_fd: Optional[int] = None) -> None:
    """NotRegularFile unless `path` is missing or a regular file (a symlink is refused, not
    followed: replacing it would put the file somewhere else than the folder asked for)."""
    try:
        mode = os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise NotRegularFile(f"{path}: is {kind(mode)}; jobgen writes only regular files "
                             "(give another path)")


def write_file(path: Union[str, Path], data: Union[bytes, str], mode: Optional[int] = None,
               sync: bool = False) -> None:
    """Create or atomically replace the regular file `path` (a temporary file in the same
    folder, renamed over it). `mode` defaults to 0666 less the umask, as any file the user
    writes. OSError passes to the caller, which knows what the file is for."""
    path = Path(path)
    name = path.name
    if name in ("", ".", ".."):
        raise NotRegularFile(f"{path}: is not a file name")
    if isinstance(data, str):
        data = data.encode("utf-8")
    if mode is None:
        mode = 0o666 & ~current_umask()
    folder = os.open(path.parent if str(path.parent) else ".",
                     os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    tmp = f".{name[:200]}.{os.urandom(6).hex()}.tmp"
    try:
        refuse_special(name, folder)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     0o600, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                if sync:
                    os.fsync(out.fileno())
                os.fchmod(out.fileno(), mode)
            refuse_special(name, folder)   # again: the moment before the rename
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=folder)
            except OSError:
                pass
            raise
    except NotRegularFile as exc:
        raise NotRegularFile(str(exc).replace(f"{name}:", f"{path}:", 1)) from None
    finally:
        os.close(folder)


def write_or_refuse(path: Union[str, Path], data: Union[bytes, str], option: str,
                    mode: Optional[int] = None) -> None:
    """write_file for a path the user named with `option` (--html, --plot): any refusal or
    OSError becomes one line naming the option and the path (ConfigError, exit 2)."""
    try:
        write_file(path, data, mode)
    except NotRegularFile as exc:
        raise ConfigError(f"{option} {exc}") from None
    except OSError as exc:
        raise _cannot(path, option, exc) from None


def check_target(path: Union[str, Path], option: str) -> None:
    """What write_or_refuse would refuse about `path` before anything is written, found before
    the work that makes its content (a picture takes seconds): a missing folder, a part of the
    path that is a file, a name over 255 bytes, a target that is not a regular file."""
    path = Path(path)
    try:
        if path.name in ("", ".", "..") or len(os.fsencode(path.name)) > 255:
            raise OSError(errno.ENAMETOOLONG if path.name else errno.EISDIR,
                          os.strerror(errno.ENAMETOOLONG if path.name else errno.EISDIR))
        folder = os.open(path.parent if str(path.parent) else ".",
                         os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            refuse_special(path.name, folder)
        finally:
            os.close(folder)
    except NotRegularFile as exc:
        raise ConfigError(f"{option} {str(exc).replace(f'{path.name}:', f'{path}:', 1)}") \
            from None
    except OSError as exc:
        raise _cannot(path, option, exc) from None


def _cannot(path: Union[str, Path], option: str, exc: OSError) -> ConfigError:
    reason = exc.strerror or type(exc).__name__
    if exc.errno == errno.ENAMETOOLONG:
        reason += " (a file name holds at most 255 bytes)"
    elif exc.errno == errno.ENOTDIR:
        reason += " (a part of the path is a file, not a folder)"
    return ConfigError(f"{option} {path}: cannot write: {reason}")


def append(path: Union[str, Path], data: Union[bytes, str], mode: int = 0o644) -> None:
    """Append `data` to the regular file `path` in one write (concurrent writers of whole
    lines do not interleave), creating it with `mode`. A FIFO is not waited on (O_NONBLOCK),
    a symlink is not followed (O_NOFOLLOW), and anything but a regular file is refused."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK
             | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # a symlink, a FIFO, a folder
            refuse_special(path)
        raise
    try:
        file_mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(file_mode):
            raise NotRegularFile(f"{path}: is {kind(file_mode)}; jobgen writes only regular "
                                 "files (give another path)")
        os.write(fd, data)
    finally:
        os.close(fd)


def inside(folder: Path, path: Path) -> bool:
    """Whether `path`, symlinks resolved, lies in `folder` (symlinks resolved) or is it."""
    top = os.path.realpath(folder)
    real = os.path.realpath(path)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)
