"""Each image's Python environment works with the torch and Python of its base image
(env/containers/images.yaml): its `packages` are resolved with pip's resolver for the base's
Python, with the base's torch held fixed, without installing anything, and no resolved package
may need another torch, nor turn its PyTorch support off on this one.

The base's torch is held by a stand-in wheel (its name and version, no files): pip takes it as
the one torch there is, so a package that needs another makes the resolution fail, and nothing
of torch's own (800 MB for 2.4.1 on Python 3.11, and its CUDA wheels) is downloaded.

A package that runs with or without torch says which torch it runs on in its `torch` extra
(transformers 5.24: `torch>=2.6; extra == "torch"`, and its import turns PyTorch off on 2.4.1
with "Disabling PyTorch because PyTorch >= 2.6 is required"; 5.15 already needs 2.5). That
requirement is checked for every resolved package, whether or not the image asks for the extra:
it is how a package that would disable itself on this torch is found, from its own metadata.

These tests need a package index (PyPI or the one pip is configured with): without one they
skip, and fail under JOBGEN_REQUIRE_ALL=1 (CI). The rehearsal at the end, which installs the
SMP image's torch and packages into a venv and imports the payload, runs only when
JOBGEN_TEST_BASE_TORCH=1 (env/containers/README.md)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from conftest import Require

from jobgen.images import catalog as images

ROOT = Path(__file__).resolve().parent.parent
# The oldest C library of the bases (Ubuntu 20.04's glibc 2.31) and every manylinux tag below
# it (pip 23 takes --platform literally).
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(31, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def _standin_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel that is only `name` `version`'s metadata: what the base has installed."""
    info = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: jobgen-tests\n"
                              "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as whl:
        for name_in, text in files.items():
            whl.writestr(name_in, text)
    return path


def _from_index(requirement: str) -> bool:
    """A requirement pip resolves from an index (a direct URL, e.g. git+https, is not: the
    build fetches it, this test cannot)."""
    return "://" not in requirement


def _environment(python: str, extra: str) -> dict[str, str]:
    """Marker values of the base (Linux x86_64, CPython `python`)."""
    return {"python_version": python, "python_full_version": f"{python}.0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "os_name": "posix", "sys_platform": "linux", "platform_system": "Linux",
            "platform_machine": "x86_64", "extra": extra}


def needs_another_torch(report: dict[str, Any], python: str, torch: str) -> list[str]:
    """Every resolved package whose requirements (its own, those of the extras asked of it, or
    those of its `torch` extra) want a torch other than the base's."""
    from packaging.requirements import Requirement
    found = []
    for item in report["install"]:
        meta = item["metadata"]
        extras = {"", "torch", *item.get("requested_extras", [])}
        for text in meta.get("requires_dist", []):
            req = Requirement(text)
            if req.name.lower() != "torch":
                continue
            applies = req.marker is None or any(
                req.marker.evaluate(_environment(python, e)) for e in extras)
            if applies and not req.specifier.contains(torch, prereleases=True):
                found.append(f"{meta['name']} {meta['version']} requires {text} (the base "
                             f"has torch {torch})")
    return found


def resolve(packages: list[str], python: str, torch: str, tmp: Path,
            deps: bool = True) -> tuple[int, str, dict[str, Any]]:
    """pip's resolution of `packages` for CPython `python` on Linux with torch `torch` held
    fixed (`deps`: with their dependencies): (pip's status, its stderr, its report)."""
    wheels = tmp / "standin"
    wheels.mkdir(exist_ok=True)
    report = tmp / "report.json"
    argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
            "--quiet", "--disable-pip-version-check", "--report", str(report),
            "--target", str(tmp / "target"), "--python-version", python,
            "--implementation", "cp", *(f"--platform={p}" for p in PLATFORMS),
            "--only-binary=:all:",
            *([] if deps else ["--no-deps"]), str(_standin_wheel(wheels, "torch", torch)),
            *packages]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    data = json.loads(report.read_text(encoding="utf-8")) if proc.returncode == 0 else {}
    return proc.returncode, proc.stderr, data


@pytest.fixture(scope="module")
def index() -> None:
    """A package index answers pip (skip by hand, fail in CI, when none does)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "packaging",
                           "--retries", "0", "--timeout", "15", "--disable-pip-version-check"],
                          capture_output=True, text=True, timeout=120, check=False)
    Require()(proc.returncode == 0, f"no package index answers pip: {proc.stderr.strip()[-300:]}")


RESOLVED = sorted(name for name, image in images.declared().images.items()
                  if any(_from_index(p) for p in image.packages))


@pytest.mark.slow   # pip's resolver against the index: 2-15 s an image
@pytest.mark.parametrize("name", RESOLVED)
def test_the_images_packages_resolve_with_its_bases_torch_and_python(
        index: None, tmp_path: Path, name: str) -> None:
    image = images.declared().images[name]
    packages = [p for p in image.packages if _from_index(p)]
    status, err, report = resolve(packages, image.python, image.torch, tmp_path)
    assert status == 0, (f"{name}: pip cannot resolve {packages} for Python {image.python} "
                         f"with torch {image.torch}:\n{err[-3000:]}")
    picked = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
    assert picked["torch"] == image.torch                # the base's, nothing else
    for requirement in packages:                         # each is part of the environment
        wanted = re.match(r"[A-Za-z0-9._-]+", requirement)
        assert wanted is not None and wanted.group(0).lower().replace("_", "-") in {
            k.replace("_", "-") for k in picked}, requirement
    assert needs_another_torch(report, image.python, image.torch) == []


@pytest.mark.slow
def test_the_smp_images_transformers_keeps_pytorch_on(index: None, tmp_path: Path) -> None:
    """What the issue found: an unpinned transformers on the SMP image's Python is a release
    that turns PyTorch off on its torch 2.4.1. The check names it from the release's metadata;
    with the `torch` extra that images.yaml asks for, pip keeps to a release that runs."""
    smp = images.declared().images["p4d-smp"]
    assert (smp.torch, smp.python) == ("2.4.1", "3.11")
    status, err, report = resolve(["transformers==5.24.0"], smp.python, smp.torch, tmp_path,
                                  deps=False)
    assert status == 0, err[-2000:]
    assert needs_another_torch(report, smp.python, smp.torch) == [
        'transformers 5.24.0 requires torch>=2.6; extra == "torch" (the base has torch 2.4.1)']
    status, err, _ = resolve(["transformers[torch]==5.24.0"], smp.python, smp.torch, tmp_path)
    assert status != 0 and "ResolutionImpossible" in err
    assert any(p.startswith("transformers[torch]") for p in smp.packages)


# --- the rehearsal: the SMP image's Python environment, installed, imports the payload ---------

SMP_REHEARSAL = ROOT / "tests" / "ci" / "image_python.sh"


@pytest.mark.slow
def test_the_smp_payload_imports_on_the_bases_torch(tmp_path: Path) -> None:
    """torch 2.4.1 (PyPI's CUDA build, about 2.5 GB with its CUDA wheels) and the SMP image's
    packages in a Python 3.11 venv: the payload's modules and `LlamaForCausalLM` import, with
    transformers' PyTorch support on. Outside every CI tier: JOBGEN_TEST_BASE_TORCH=1."""
    if os.environ.get("JOBGEN_TEST_BASE_TORCH") != "1":
        pytest.skip("set JOBGEN_TEST_BASE_TORCH=1 (downloads torch 2.4.1 and its CUDA wheels)")
    proc = subprocess.run(["bash", str(SMP_REHEARSAL), str(tmp_path / "venv"), "p4d-smp"],
                          capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "image check: ok: import train_fsdp, fsdp_model, fsdp_checkpoint, smp_v2" \
        in proc.stdout
