"""The Jinja environment. Templates format, Python decides.

Shell templates (`*.sh.j2`, `*.sbatch.j2`) pass every `{{ value }}` through `shell_quote`, the one
place where jobgen quotes for the shell: a string becomes a single-quoted word, a list becomes
quoted words separated by spaces. Only values already checked against a safe alphabet (`ident`,
`sbatch` filters) are let through as they are. JSON templates encode every value as JSON.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shlex
import stat
import tempfile
from typing import Any

from .errors import RenderError
from .resources import TEMPLATES_DIR

_SAFE_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
_SBATCH_VALUE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]{1,200}$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Verbatim(str):
    """Text that has been checked against a safe alphabet and goes into a script as it is."""


def shell_quote(value: Any) -> str:
    """Quote one value (or a list of values) as shell words. The single choke point."""
    if isinstance(value, Verbatim):
        return str(value)
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return repr(value)
    if value is None:
        return "''"
    if isinstance(value, (list, tuple)):
        return " ".join(shell_quote(v) for v in value)
    text = str(value)
    # Plain words stay bare for readability; everything else is single-quoted by shlex.
    return text if _SAFE_WORD.fullmatch(text) else shlex.quote(text)


def ident(value: str) -> Verbatim:
    """A variable name, checked (used for `export NAME=...`)."""
    if not _IDENT.fullmatch(value):
        raise RenderError(f"refusing to render {value!r} as a variable name")
    return Verbatim(value)


def sbatch_value(value: Any) -> Verbatim:
    """A value on an #SBATCH line: a comment to bash, parsed by sbatch, so no quoting can help;
    only a safe alphabet is accepted (names are validated earlier with a clearer message)."""
    text = str(value)
    if not _SBATCH_VALUE.fullmatch(text):
        raise RenderError(f"refusing to put {text!r} on an #SBATCH line")
    return Verbatim(text)


_DIGEST = 32   # bytes of SHA-256 in front of each cached entry


def _private_folder(path: str) -> bool:
    """Whether `path` is a real folder owned by this user that nobody else can write to
    (creating it so if missing). A folder another user controls could hold planted code."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and not st.st_mode & 0o022 and os.access(path, os.W_OK))


def _bytecode_cache() -> Any:
    """Compiled templates kept between runs (about a tenth of a render's time); keyed by the
    template's path and checksum, so an edited template is recompiled. None (compile every
    time) where the folder is not this user's alone.

    Compiled templates are code: each entry is loaded only if it is a regular file owned by this
    user, not writable by others, and its SHA-256 (stored in front of it) matches; anything else
    (a corrupt, truncated or planted entry) is ignored and rewritten."""
    import jinja2

    class CheckedCache(jinja2.FileSystemBytecodeCache):
        def load_bytecode(self, bucket: Any) -> None:
            name = self._get_cache_filename(bucket)
            try:
                fd = os.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except OSError:
                return
            try:
                st = os.fstat(fd)
                if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid()
                        or st.st_mode & 0o022 or st.st_size > 16 << 20):
                    return
                with os.fdopen(fd, "rb", closefd=False) as f:
                    data = f.read()
            except OSError:
                return
            finally:
                os.close(fd)
            digest, payload = data[:_DIGEST], data[_DIGEST:]
            if len(digest) != _DIGEST or hashlib.sha256(payload).digest() != digest:
                return
            try:
                bucket.bytecode_from_string(payload)
            except Exception:   # noqa: BLE001  any unreadable entry: compile instead
                bucket.reset()

        def dump_bytecode(self, bucket: Any) -> None:
            payload = bucket.bytecode_to_string()
            name = self._get_cache_filename(bucket)
            tmp = None
            try:
                fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
                with os.fdopen(fd, "wb") as f:   # mkstemp: mode 0600, this user's
                    f.write(hashlib.sha256(payload).digest() + payload)
                os.replace(tmp, name)
            except OSError:   # a cache that cannot be written is no reason to fail a render
                if tmp is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "jobgen", "templates")
    return CheckedCache(path) if _private_folder(path) else None


@functools.lru_cache(maxsize=None)
def _environment() -> Any:
    """The templates are shell scripts: every value goes through `shell_quote` (Batch job
    definitions are built as data in Python and serialised by json)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        bytecode_cache=_bytecode_cache(),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        finalize=shell_quote,
    )
    env.filters["ident"] = ident
    env.filters["sbatch"] = sbatch_value
    env.filters["verbatim_json"] = lambda v: Verbatim(json.dumps(v, indent=2, sort_keys=True))
    return env


def render(template: str, **context: Any) -> str:
    """Render a template by name; errors name the template and line."""
    import jinja2

    try:
        return str(_environment().get_template(template).render(**context))
    except jinja2.UndefinedError as exc:
        raise RenderError(f"templates/{template}: {exc.message}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise RenderError(f"templates/{template}:{exc.lineno}: {exc.message}") from None
    except jinja2.TemplateNotFound as exc:
        raise RenderError(f"templates/{exc.name}: template not found") from None
