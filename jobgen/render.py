"""The Jinja environment. Templates format, Python decides.

Shell templates (`*.sh.j2`, `*.sbatch.j2`) pass every `{{ value }}` through `shell_quote`, the one
place where jobgen quotes for the shell: a string becomes a single-quoted word, a list becomes
quoted words separated by spaces. Only values already checked against a safe alphabet (`ident`,
`sbatch` filters) are let through as they are. JSON templates encode every value as JSON.
"""
from __future__ import annotations

import functools
import json
import re
import shlex
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


def _bytecode_cache() -> Any:
    """Compiled templates kept between runs (about a tenth of a render's time); keyed by the
    template's path and checksum, so an edited template is recompiled. None (compile every
    time) where the cache folder is not this user's alone. Compiled templates are code: an entry
    is loaded only if it passes jobgen/cache.py's checks (owner, mode, SHA-256)."""
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
