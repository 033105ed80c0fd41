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


@functools.lru_cache(maxsize=None)
def _environment() -> Any:
    """The templates are shell scripts: every value goes through `shell_quote` (Batch job
    definitions are built as data in Python and serialised by json)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.folder("templates"))),
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
