"""The CPU-only install for rehearsals (docs/setup.md): torch's CPU wheel first, then
`pip install -e '.[payload]'`, which must keep that torch (no CUDA build, no nvidia-* wheels)."""
from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_rehearsal_torch_is_the_cpu_build() -> None:
    torch = pytest.importorskip("torch")
    assert torch.version.cuda is None, torch.__version__
    nvidia = sorted(d.metadata["Name"] for d in distributions()
                    if (d.metadata["Name"] or "").lower().startswith("nvidia-"))
    assert nvidia == []


@pytest.mark.slow
def test_installing_the_payload_extra_keeps_the_cpu_torch(tmp_path: Path) -> None:
    """pip's own resolver, asked what `pip install -e '.[payload]'` would do in this venv."""
    pytest.importorskip("torch")
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
                           "--report", str(report), "-e", f"{ROOT}[payload]"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    would = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert "torch" not in would and not [n for n in would if n.startswith("nvidia-")], would


def test_the_docs_show_the_cpu_only_install() -> None:
    setup = (ROOT / "docs" / "setup.md").read_text(encoding="utf-8")
    assert ("pip install torch --index-url https://download.pytorch.org/whl/cpu" in setup
            and "pip install -e '.[payload]'" in setup)


def test_every_jobgen_package_is_in_the_wheel() -> None:
    """setup.cfg lists the packages a wheel carries: a package folder under jobgen/ missing there
    is missing from every installed jobgen (jobgen.reporting was: `jobgen run` and `report`
    failed from the wheel with ModuleNotFoundError)."""
    import configparser
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    listed = set(config["options"]["packages"].split())
    on_disk = {".".join(p.parent.relative_to(ROOT).parts)
               for p in (ROOT / "jobgen").rglob("__init__.py")}
    assert on_disk - listed == set()
