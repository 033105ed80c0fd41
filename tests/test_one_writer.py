"""Fast tier: no module of jobgen/ writes a file around the one writer (jobgen/plumbing/fsio.py).
The check parses every module with ast and fails on a write it finds elsewhere: `open` (and
`os.fdopen`, `Path.open`) for writing, `write_text`/`write_bytes`, `os.replace`/`os.rename`
(and a path's one-argument `replace`/`rename`), `mkstemp`/`NamedTemporaryFile`, `shutil`'s
copies and moves, and a library's `savefig`. A write that must stay where it is goes on the
allow-list below with its reason (issue 41: two rounds in a row, a new command wrote around
fsio)."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent / "jobgen"
WRITER = "plumbing/fsio.py"

# (module, what) -> why it may write there itself. Keep it short; every entry has a reason.
ALLOWED = {
    ("job/plan.py", "mkstemp"):
        "render's writer stages all of a job's files (mkstemp, fsync) and renames them together "
        "while SIGINT/SIGTERM are held, after fsio.refuse_special checked every target",
    ("job/plan.py", "open"):
        "the same staged files, written through the descriptor mkstemp returned",
    ("job/plan.py", "os.replace"):
        "the same staged files, renamed over their targets together",
    ("plumbing/extras.py", "savefig"):
        "write_png renders into a BytesIO; the bytes then go through fsio.write_or_refuse",
    ("cli/render_cmds.py", "shutil.copytree"):
        "image-context copies jobgen's own env/containers tree into a folder it just created "
        "(refused if it exists); a tree, not one file",
    ("images/snapshot.py", "shutil.copyfile"):
        "the payload snapshot copies jobgen's own payload files into its private temporary "
        "tree, renamed into place as a whole",
    ("images/snapshot.py", "write_text"):
        "the snapshot's marker, written inside the private temporary tree before its rename",
    ("images/snapshot.py", "os.rename"):
        "publishes the finished snapshot tree by renaming the folder (atomic; fsio writes "
        "files, not trees)",
    ("backends/local/runner.py", "os.rename"):
        "publishes the rehearsal's stand-in image tree by renaming the folder it built",
    ("backends/local/runner.py", "write_text"):
        "stand-in files inside the rehearsal's private temporary tree, before its rename",
    ("backends/sagemaker/rehearsal.py", "shutil.copy2"):
        "the export rehearsal's channel: the emulated S3 prefix's regular files (checkpoints, "
        "too large for fsio's bounded reader) copied into the emulated instance's own folder",
    ("watching/actions.py", "os.rename"):
        "a rollback moves checkpoint folders aside within the run's checkpoint folder "
        "(a folder, kept whole; a symlink moves as itself)",
    ("watching/actions.py", "shutil.move"):
        "the same rollback for NeMo's checkpoints (files or folders), moved aside within "
        "the run's checkpoint folder",
}

COPIES = {"copy", "copy2", "copyfile", "copytree", "move", "copyfileobj"}


def _mode(call: ast.Call, position: int) -> str:
    """The mode string of an open-like call, or "r"."""
    if len(call.args) > position and isinstance(call.args[position], ast.Constant):
        return str(call.args[position].value)
    for kw in call.keywords:
        if kw.arg == "mode" and isinstance(kw.value, ast.Constant):
            return str(kw.value.value)
        if kw.arg == "mode":
            return "w?"   # not a constant: assume it writes
    return "r" if len(call.args) <= position else "w?"


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def writes(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, what) for every file write in `tree`."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = _dotted(func)
        attr = func.attr if isinstance(func, ast.Attribute) else name
        writing = False
        if name == "open" or name == "io.open":
            writing = any(c in _mode(node, 1) for c in "wax+?")
        elif name == "os.fdopen" or (attr == "open" and isinstance(func, ast.Attribute)
                                     and name not in ("os.open", "tarfile.open", "gzip.open")):
            writing = any(c in _mode(node, 1 if name == "os.fdopen" else 0) for c in "wax+?")
            attr = "open"
        elif attr in ("write_text", "write_bytes", "savefig", "mkstemp", "NamedTemporaryFile"):
            writing = True
        elif name in ("os.replace", "os.rename", "os.renames"):
            writing, attr = True, name
        elif attr in ("replace", "rename") and len(node.args) == 1 and not node.keywords \
                and name not in ("dataclasses.replace",):
            writing = True      # a path's replace/rename (str.replace takes two arguments)
        elif name.startswith("shutil.") and attr in COPIES:
            writing, attr = True, name
        if writing:
            yield node.lineno, attr


def test_every_write_goes_through_the_one_writer() -> None:
    found = []
    used = set()
    for path in sorted(ROOT.rglob("*.py")):
        module = path.relative_to(ROOT).as_posix()
        if module == WRITER:
            continue
        for line, what in writes(ast.parse(path.read_text(encoding="utf-8"))):
            if (module, what) in ALLOWED:
                used.add((module, what))
            else:
                found.append(f"jobgen/{module}:{line}: {what}")
    assert not found, ("writes around jobgen/plumbing/fsio.py (route them through "
                       "fsio.write_file, or add an allow-list entry with its reason):\n"
                       + "\n".join(found))
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"allow-list entries that no longer match a write: {stale}"


@pytest.mark.parametrize("source", [
    "open(p, 'w')", "open(p, mode='ab')", "p.open('w')", "os.fdopen(fd, 'wb')",
    "p.write_text('x')", "p.write_bytes(b'')", "os.replace(a, b)", "os.rename(a, b)",
    "tmp.replace(path)", "tempfile.mkstemp()", "tempfile.NamedTemporaryFile()",
    "shutil.copy(a, b)", "shutil.move(a, b)", "fig.savefig('x.png')",
])
def test_the_check_sees_each_kind_of_write(source: str) -> None:
    assert list(writes(ast.parse(f"import os\n{source}\n")))


@pytest.mark.parametrize("source", [
    "open(p)", "open(p, 'rb')", "p.open()", "text.replace('a', 'b')",
    "dataclasses.replace(x, a=1)", "os.open(p, os.O_RDONLY)",
])
def test_the_check_lets_reads_be(source: str) -> None:
    assert not list(writes(ast.parse(source)))
