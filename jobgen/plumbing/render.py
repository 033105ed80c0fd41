"""The Jinja environment. Templates format, Python decides.

Shell templates (`*.sh.j2`, `*.sbatch.j2`) pass every `{{ value }}` through `shell_quote`, the one
place where jobgen quotes for the shell: a string becomes a single-quoted word, a list becomes
quoted words separated by spaces. Only values already checked against a safe alphabet (`ident`,
`sbatch` filters) are let through as they are. JSON templates encode every value as JSON.
"""
from __future__ import annotations

import functools
import json
import os
import re
import shlex
from typing import Any, Optional

from . import resources
from .errors import RenderError

_SAFE_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
# What sbatch reads on an #SBATCH line without quotes (a constraint's & | ( ) * ! included).
_SBATCH_VALUE = re.compile(r"^[A-Za-z0-9_@%+=:,./\[\]&|()*!-]{1,200}$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


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
    if _CONTROL.search(text):
        # A control character (ESC, NUL, a line break) is never printed raw: bash's $'...'
        # form writes each as an escape, so the word pastes as it stands and means the same.
        return "$'" + "".join(_ansi_c(c) for c in text) + "'"
    # Plain words stay bare for readability; everything else is single-quoted by shlex.
    return text if _SAFE_WORD.fullmatch(text) else shlex.quote(text)


def _ansi_c(char: str) -> str:
    if char in "\\'":
        return "\\" + char
    if not _CONTROL.fullmatch(char):
        return char
    return f"\\x{ord(char):02x}" if ord(char) < 0x80 else f"\\u{ord(char):04x}"


def shell_path(value: Any) -> str:
    """A path as one shell word for a printed command: quoted as shell_quote does, and a
    relative path that starts with "-" written as ./-name, so no command takes it for an
    option."""
    text = str(value)
    if text.startswith("-"):
        text = "./" + text
    return shell_quote(text)


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


def _bytecode_cache() -> Any:
    """Compiled templates kept between runs (about a tenth of a render's time); keyed by the
    template's path and checksum, so an edited template is recompiled. None (compile every
    time) where the cache folder is not this user's alone. Compiled templates are code: an entry
    is loaded only if it passes jobgen/plumbing/cache.py's checks (owner, mode, SHA-256)."""
    import jinja2

    from . import cache

    class CheckedCache(jinja2.FileSystemBytecodeCache):
        def load_bytecode(self, bucket: Any) -> None:
            payload = cache.read(self._get_cache_filename(bucket))
            if payload is None:
                return
            try:
                bucket.bytecode_from_string(payload)
            except Exception:   # noqa: BLE001  any unreadable entry: compile instead
                bucket.reset()

        def dump_bytecode(self, bucket: Any) -> None:
            cache.write(self._get_cache_filename(bucket), bucket.bytecode_to_string())

    path = cache.folder("templates")
    return CheckedCache(path) if path else None


@functools.lru_cache(maxsize=None)
def _environment() -> Any:
    """The templates are shell scripts: every value goes through `shell_quote` (Batch job
    definitions are built as data in Python and serialised by json)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.folder("templates"))),
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


class _Uncacheable(Exception):
    """A context value whose rendering the cache key cannot capture (rendered without cache)."""


def _canonical(value: Any) -> Any:
    """A context value as JSON that keeps every distinction a template or `shell_quote` makes:
    Verbatim from str, bool from int, tuple from list, the order of a mapping."""
    if isinstance(value, Verbatim):
        return ["v", str(value)]
    if isinstance(value, str):
        return ["s", value] if type(value) is str else _refuse(value)
    if isinstance(value, bool):
        return ["b", value]
    if isinstance(value, int):
        return ["i", value] if type(value) is int else _refuse(value)
    if isinstance(value, float):
        return ["f", repr(value)]
    if value is None:
        return ["n"]
    if type(value) in (list, tuple):
        return ["l" if type(value) is list else "t", [_canonical(v) for v in value]]
    if type(value) is dict and all(type(k) is str for k in value):
        return ["d", [[k, _canonical(v)] for k, v in value.items()]]
    return _refuse(value)


def _refuse(value: Any) -> Any:
    raise _Uncacheable(type(value).__name__)


_KEEP_RENDERED = 256


def _rendered_entry(template: str, context: dict[str, Any]) -> Optional[str]:
    """Where the output of this template with exactly this context is kept: keyed by the
    context, every template's text, this module's code (the filters) and the installed Jinja.
    None where the cache is off or a value cannot be keyed."""
    from . import cache
    folder = cache.folder("rendered")
    jinja = cache.stamp("jinja2")
    if folder is None or jinja is None:
        return None
    digest = cache.sha256()
    try:
        digest.update(json.dumps([template, jinja, _canonical(context)]).encode())
        templates = resources.folder("templates")
        for name in sorted(str(p.relative_to(templates)) for p in templates.rglob("*")
                           if p.is_file()):
            digest.update(b"\0" + name.encode() + b"\0" + (templates / name).read_bytes())
        with open(__file__, "rb") as f:
            digest.update(b"\0" + f.read())
    except (_Uncacheable, OSError, ValueError):
        return None
    return os.path.join(folder, digest.hexdigest())


def render(template: str, **context: Any) -> str:
    """Render a template by name; errors name the template and line. A rendering done before
    with the same inputs is read from jobgen's private cache (no Jinja import at all); errors
    are never cached."""
    from . import cache

    entry = _rendered_entry(template, context)
    if entry is not None:
        kept = cache.read(entry)
        if kept is not None:
            try:
                return kept.decode("utf-8")
            except UnicodeDecodeError:
                pass
    text = _render(template, context)
    if entry is not None:
        cache.write(entry, text.encode("utf-8"))
        cache.prune(os.path.dirname(entry), _KEEP_RENDERED)
    return text


def _render(template: str, context: dict[str, Any]) -> str:
    import jinja2

    try:
        return str(_environment().get_template(template).render(**context))
    except jinja2.UndefinedError as exc:
        raise RenderError(f"templates/{template}: {exc.message}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise RenderError(f"templates/{template}:{exc.lineno}: {exc.message}") from None
    except jinja2.TemplateNotFound as exc:
        raise RenderError(f"templates/{exc.name}: template not found") from None
