"""What a rehearsal's nodes import, looked up before anything starts (`jobgen run`).

The programs the nodes run (the trainer, its prepare step, the health gate) are read for the
modules they import, following their own folder's and payload/common's modules as the nodes'
sys.path finds them. Of those, the ones jobgen knows how to install (a requirement of one of
jobgen's extras, or torch's CPU wheel as docs/setup.md installs it) are looked up with
importlib.util.find_spec in the interpreter the nodes use (JOBGEN_PYTHON, else python3 on their
PATH). Any that is missing makes one line naming the command that installs it, and nothing
starts: no traceback from a node, no wait for the others."""
from __future__ import annotations

import ast
import os
import posixpath
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Optional

from ...job.spec import JobSpec
from ...plumbing.errors import ConfigError

# docs/setup.md: the CPU wheel first (PyPI's default torch for Linux is the CUDA build).
CPU_TORCH = "install torch --index-url https://download.pytorch.org/whl/cpu"
_REQUIREMENT = re.compile(r"""^\s*([A-Za-z0-9][A-Za-z0-9._-]*)[^;]*;\s*extra\s*==\s*["']"""
                          r"""([^"']+)["']""")
# A module that a find_spec looks up: a plain dotted name (nothing else reaches the interpreter).
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FIND = ("import importlib.util, sys\n"
         "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")


def _local(name: str, roots: Iterable[Path]) -> Optional[Path]:
    """The file of module `name` (dotted) under one of `roots`, if it is the payload's own."""
    parts = name.split(".")
    for root in roots:
        base = root.joinpath(*parts)
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
    return None


def imported(files: Iterable[Path], roots: Iterable[Path],
             lazily: Optional[dict[str, str]] = None) -> set[str]:
    """The top-level names of every module that `files` import, the payload's own modules
    under `roots` followed (and not counted), relative imports skipped. With `lazily`, the
    modules a program imports only where it needs them, through its own
    `_need(MODULE, PACKAGE)` (the dataset writers and readers), count too, and `lazily` gets
    module -> package (as `installers` names packages) for each."""
    roots = list(roots)
    todo, seen, found = [p for p in files if p.is_file()], set(), set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        except (OSError, SyntaxError, ValueError):
            continue
        names = []
        for item in ast.walk(tree):
            if isinstance(item, ast.Import):
                names += [alias.name for alias in item.names]
            elif isinstance(item, ast.ImportFrom) and item.level == 0 and item.module:
                names.append(item.module)
                names += [f"{item.module}.{alias.name}" for alias in item.names]
            elif lazily is not None and _lazy(item) is not None:
                module, package = _lazy(item) or ("", "")
                names.append(module)
                lazily[module.split(".")[0]] = package.lower().replace("-", "_")
        for name in names:
            own = _local(name, roots)
            if own is not None:
                todo.append(own)
            elif _local(name.split(".")[0], roots) is None:   # not the payload's own package
                found.add(name.split(".")[0])
    found.discard("__future__")
    return found


def _lazy(item: ast.AST) -> Optional[tuple[str, str]]:
    """(module, package) of a call `_need("module", "package")`, else None."""
    if not (isinstance(item, ast.Call) and isinstance(item.func, ast.Name)
            and item.func.id == "_need" and len(item.args) >= 2):
        return None
    words = [a.value for a in item.args[:2] if isinstance(a, ast.Constant)]
    if len(words) != 2 or not all(isinstance(w, str) for w in words):
        return None
    return str(words[0]), str(words[1])


def installers(requirements: Optional[Iterable[str]] = None) -> dict[str, str]:
    """Module -> the extra of jobgen's requirements that installs it (the first extra that
    lists it; a requirement's module is its name, lower case, '-' as '_')."""
    if requirements is None:
        from importlib import metadata
        try:
            requirements = metadata.requires("jobgen") or []
        except metadata.PackageNotFoundError:
            requirements = []
    out: dict[str, str] = {}
    for line in requirements:
        found = _REQUIREMENT.match(line)
        if found and found[2] != "test":      # the test extra is the suite's, not a user's
            out.setdefault(found[1].lower().replace("-", "_"), found[2])
    return out


def node_python(env: Mapping[str, str]) -> Optional[str]:
    """The interpreter the flow runs on a node with environment `env` (contract.sh:
    FLOW_PYTHON, JOBGEN_PYTHON else python3 on the node's PATH), or None if there is none."""
    given = env.get("JOBGEN_PYTHON", "")
    if given:
        return shutil.which(given, path=env.get("PATH")) if "/" not in given else given
    return shutil.which("python3", path=env.get("PATH", ""))


def missing(python: str, modules: Iterable[str], env: Mapping[str, str]) -> list[str]:
    """Which of `modules` `python` cannot find (importlib.util.find_spec: nothing imported)."""
    names = sorted(m for m in set(modules) if _MODULE.match(m))
    if not names:
        return []
    try:
        done = subprocess.run([python, "-c", _FIND, *names], env=dict(env), text=True,
                              capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"the rehearsal's nodes run {python}, which does not start here "
                          f"({exc}): set JOBGEN_PYTHON to a Python 3 with torch") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"the rehearsal's nodes run {python}, which fails to look up "
                          f"modules ({last[:200]}): set JOBGEN_PYTHON to a Python 3 with torch")
    return done.stdout.split()


def _pip(python: str) -> str:
    shown = os.path.relpath(python)
    return f"{python if shown.startswith('..') else shown} -m pip"


def _target(extra: str) -> str:
    """What pip installs `extra` of: this checkout (editable) or the jobgen package."""
    from ...plumbing import resources
    if resources.installed() == "checkout":
        root = str(resources._checkout())
        return f"-e '{'.' if root == os.getcwd() else root}[{extra}]'"
    return f"'jobgen[{extra}]'"


def command(python: str, lacking: Iterable[str], extras: Mapping[str, str]) -> str:
    """The one command line that installs `lacking` into `python` (torch's CPU wheel first)."""
    pip, lacking = _pip(python), set(lacking)
    steps = [f"{pip} {CPU_TORCH}"] if "torch" in lacking else []
    named = list(dict.fromkeys(extras[m] for m in sorted(lacking) if m in extras))
    if named:     # one install of every extra that holds one
        steps.append(f"{pip} install {_target(','.join(named))}")
    return " && ".join(steps)


def program_files(spec: JobSpec, payload_root: Path) -> list[Path]:
    """The files the nodes of `spec` run from the payload: its trainer, its prepare step and
    the health gate (as this machine's payload folder holds them)."""
    from ... import payloads
    launch = payloads.for_spec(spec, "local")
    base = spec.payload_dir
    files = [payload_root / "common" / "health.py"]
    workdir = posixpath.relpath(launch.workdir, base)
    if not workdir.startswith(".."):
        files.append(payload_root / workdir / launch.program)
    if launch.prepare:
        files.append(payload_root / launch.prepare[0])
    return files


def check(spec: JobSpec, env: Mapping[str, str],
          programs: Optional[Iterable[str]] = None) -> None:
    """Refuse (one line) a rehearsal whose nodes' interpreter lacks what its programs import
    (its nodes', or `programs`: a stage's, under the payload folder). A stage's program and a
    rehearsal that reads a prepared dataset need their dataset libraries too (`imported`'s
    `lazily`); the README's rehearsal on made-up batches does not."""
    from ...payloads.data import expectations
    from ...plumbing import resources
    root = resources.folder("payload")
    files = program_files(spec, root) if programs is None else [root / p for p in programs]
    extras = installers()
    lazily: Optional[dict[str, str]] = \
        {} if programs is not None or (spec.smoke and expectations(spec)) else None
    found = imported(files, [root, *{f.parent for f in files}], lazily)
    for module, package in (lazily or {}).items():
        if package in extras:
            extras.setdefault(module, extras[package])
    wanted = {m for m in found if m in extras or m == "torch"}
    python = node_python(env)
    if python is None:
        raise ConfigError("the rehearsal's nodes find no python3 on their PATH (nor "
                          "JOBGEN_PYTHON): run jobgen from a venv, or set JOBGEN_PYTHON")
    lacking = missing(python, wanted, env)
    if lacking:
        names = ", ".join(sorted(lacking, key=lambda m: (m != "torch", m)))
        raise ConfigError(f"the rehearsal's nodes run Python {python}, which lacks {names} "
                          f"(what their programs import): install with: "
                          f"{command(python, lacking, extras)}")
