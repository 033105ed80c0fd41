"""The package layout holds (fast tier, no import of jobgen: the source is read): jobgen's imports
run down the layers benchmarks/import_graph.py names, with no circle, counting the imports
inside functions and under TYPE_CHECKING; every module sits in a layer; every package says what
it holds."""
from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def graph() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph",
                                                  ROOT / "benchmarks" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["import_graph"] = module
    spec.loader.exec_module(module)
    return module


def test_imports_run_down_the_layers_without_circles(graph: ModuleType,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    status = graph.main(["--all"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert " 0 import circles, 0 up the layers" in out, out


def test_the_registry_sits_below_what_it_describes(graph: ModuleType) -> None:
    known = graph.modules(ROOT)
    rank = {name: graph.layer(name, known) for name in (
        "jobgen.plumbing.errors", "jobgen.backends", "jobgen.backends.slurm",
        "jobgen.inputs.site", "jobgen.job.spec", "jobgen.runs.runrecord",
        "jobgen.backends.slurm.backend", "jobgen.cli.app")}
    assert (rank["jobgen.plumbing.errors"] < rank["jobgen.backends"]
            == rank["jobgen.backends.slurm"] < rank["jobgen.inputs.site"]
            < rank["jobgen.job.spec"] < rank["jobgen.runs.runrecord"]
            < rank["jobgen.backends.slurm.backend"] < rank["jobgen.cli.app"]), rank


def test_an_upward_import_is_found(graph: ModuleType, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The check can fail: the registry importing the run record is reported."""
    for rel in ("jobgen/__init__.py", "jobgen/backends/__init__.py", "jobgen/runs/__init__.py",
                "jobgen/runs/ledger.py", "jobgen/plumbing/__init__.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text('"""x"""\n')
    (tmp_path / "jobgen/backends/__init__.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..runs.ledger import Run\n")
    monkeypatch.setattr(graph, "ROOT", tmp_path)
    assert graph.main([]) == 1
    out = capsys.readouterr().out
    assert "up: jobgen/backends/__init__.py:3: jobgen.backends (registry) imports " \
           "jobgen.runs.ledger (runs, typing)" in out, out


def test_every_package_says_what_it_holds() -> None:
    missing = []
    for init in sorted((ROOT / "jobgen").rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        if not doc.strip():
            missing.append(str(init.relative_to(ROOT)))
    assert missing == []
