"""Helpers for the AWS Batch entrypoint (env/containers/entrypoint.sh) that are easier in Python.

usage: batch_setup.py write-files RUN_DIR   write the files in $JOBGEN_FILES_JSON under RUN_DIR
                                            (prints each path written, one a line)
       batch_setup.py argv VAR              print the JSON list of strings in $VAR, NUL-separated

``write-files``: JOBGEN_FILES_JSON is a JSON object {relative path under the run dir: content}.
Every node of a Batch job writes them (node filesystems are separate), and nodes that share a
filesystem may write the same file at the same moment, so each file is written to a private
temporary name beside its target and renamed into place: a reader sees the old file or the whole
new one. Paths must stay inside the run directory.

Exit status 0 on success, 2 on bad input (with one line on stderr).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

PROG = "batch_setup"


class InputError(Exception):
    pass


def _from_env(var: str) -> Any:
    text = os.environ.get(var, "")
    if not text.strip():
        raise InputError(f"${var} is empty or not set")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"${var} is not valid JSON: {exc}") from None


def safe_relative(path: str) -> PurePosixPath:
    """A relative path that cannot leave the directory it is joined to."""
    rel = PurePosixPath(path)
    if not path or rel.is_absolute() or ".." in rel.parts or rel == PurePosixPath("."):
        raise InputError(f"file path {path!r} must be relative to the run directory, "
                         "without '..'")
    return rel


def write_atomic(target: Path, content: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_files(run_dir: Path) -> list[Path]:
    files = _from_env("JOBGEN_FILES_JSON")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise InputError("$JOBGEN_FILES_JSON must be a JSON object of {path: text}")
    targets = [(run_dir / safe_relative(path), content) for path, content in files.items()]
    for target, content in targets:
        write_atomic(target, content)
    return [target for target, _ in targets]


def argv(var: str) -> list[str]:
    value = _from_env(var)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise InputError(f"${var} must be a non-empty JSON list of strings")
    if any("\0" in v for v in value):
        raise InputError(f"${var}: arguments cannot contain NUL characters")
    return value


def main(args: list[str]) -> int:
    try:
        if len(args) == 2 and args[0] == "write-files":
            for path in write_files(Path(args[1])):
                print(path)
            return 0
        if len(args) == 2 and args[0] == "argv":
            sys.stdout.write("".join(item + "\0" for item in argv(args[1])))
            return 0
        raise InputError("usage: batch_setup.py write-files RUN_DIR | argv VAR")
    except (InputError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
