"""A site's `repository:` (batch, sagemaker, eks) as Docker reads an image reference: the grammar
of distribution/reference, declared here once (limits.py gives the same pattern to the site
schema; site.py refuses a value that does not match, before any service tries to pull it). A site
writes a name only, `[REGISTRY[:PORT]/]PATH`: jobgen appends each image's tag
(jobgen/images/catalog.py), so a tag or a digest in the site is refused.

    name       := [domain '/'] component ('/' component)*
    domain     := host [':' port]          host: DNS labels joined by '.', or [IPv6]
    component  := [a-z0-9]+ (separator [a-z0-9]+)*
    separator  := '.' | '_' | '__' | '-'+      at most 255 characters in all
"""
from __future__ import annotations

import re
from typing import Optional

from ..plumbing.errors import ConfigError

_ALNUM = "[a-z0-9]+"
_SEPARATOR = "(?:[._]|__|-+)"
_COMPONENT = f"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_LABEL = "(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[a-fA-F0-9:]+\])"
_DOMAIN = f"{_HOST}(?::[0-9]+)?"
NAME = f"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*"
# The one declaration of the rule: the loader (below) and the schema (limits.py) use it.
REPOSITORY_PATTERN = f"^{NAME}$"
NAME_MAX = 255
# The anchored text, compiled once: the site's limits check (rules.check_limits) matches the
# same text and finds it in re's cache (the grammar takes about 1 ms to compile).
_NAME_RE = re.compile(REPOSITORY_PATTERN)


def unseen(value: str) -> Optional[str]:
    """What `value` holds that a terminal or a shell acts on, or that shows as nothing (a
    control character, a line or paragraph separator, a format character like U+202E), as a
    phrase; None when every character shows as itself."""
    for char in value:
        if char == " " or char.isprintable():
            continue
        code = ord(char)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            return "holds a control character"
        return f"holds an invisible character (U+{code:04X})"
    return None


def problem(value: str) -> Optional[str]:
    """What keeps `value` from being a repository an image can be pushed to and pulled from
    under a tag jobgen appends; None when it is one."""
    hidden = unseen(value)
    if hidden is not None:   # said before the grammar: the message would not show it
        return hidden
    if len(value) > NAME_MAX:
        return f"is {len(value)} characters, more than an image name's {NAME_MAX}"
    if _NAME_RE.fullmatch(value):
        return None
    if "@" in value:
        return ("has a digest: jobgen names each image by the tag it appends; write "
                "REGISTRY/REPOSITORY alone")
    head, _, last = value.rpartition("/")
    if ":" in last and _NAME_RE.fullmatch(f"{head}/{last.split(':')[0]}" if head
                                           else last.split(":")[0]):
        return ("has a tag: jobgen appends its own (:PLATFORM-TRAINER-PAYLOADID); write "
                "REGISTRY/REPOSITORY without one")
    path = value.split("/", 1)[1] if "/" in value else value
    if path != path.lower() and _NAME_RE.fullmatch(value.lower()):
        return "has upper-case letters in its path: Docker takes lower case only"
    return ("is not an image repository in Docker's reference grammar: "
            "[REGISTRY[:PORT]/]PATH, path components of a-z and 0-9 joined by '.', '_', "
            "'__' or '-', separated by '/'")


def check_repository(value: str, where: str) -> None:
    """ConfigError (`where`: file and key) unless `value` is a repository name."""
    from .schema import describe
    said = problem(value)
    if said is not None:
        raise ConfigError(f"{where}: {describe(value)} {said}")
