"""The one family of errors jobgen shows to users; the CLI maps them to exit codes in one place."""
import re

# C0 controls (line breaks, ESC, ...), DEL and C1 controls: what a terminal would act on.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every control character written as an escape (\\n, \\r, \\t, \\x1b, ...),
    so that a key or file name cannot break the one-line message or drive the terminal."""
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    return _CONTROL.sub(lambda m: named.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


def printable_lines(text: str) -> str:
    """`text` with every control character but the line break written as an escape: for what
    is printed as lines (a table, a status line) from values read off disk or a scheduler."""
    return "\n".join(printable(line) for line in text.split("\n"))


class JobgenError(Exception):
    """A user-facing problem: the message is printed as one line, the exit status is `exit_code`."""

    exit_code = 2


class ConfigError(JobgenError):
    """A recipe, site profile or --set value is malformed (names the file and the key path)."""


class RuleError(ConfigError):
    """A well-formed value breaks a rule of the platform or the parallelism arithmetic.

    `jobgen check` lists these as skipped combinations, not as failures.
    """


class RenderError(JobgenError):
    """A template could not be rendered (a bug in jobgen or a template), or a value is unsafe."""


class RemoteError(JobgenError):
    """A scheduler or cloud API refused or failed (no credentials, unknown queue, sbatch error)."""

    exit_code = 1
