"""jobgen as a tool: built into a wheel and an sdist, each installed into a fresh virtualenv and
run from a folder that is not the checkout.

- the wheel carries the recipes, templates, payloads, sites, platforms and container files as
  package data (jobgen.data.*), and no caches; the sdist carries them, the tests, the README
  and the docs;
- from either install: --version, list, show, render for all four backends, check, plan,
  run --smoke --dry-run and submit --dry-run work, find their files in the installed package,
  and print nothing of the checkout's paths;
- on the local Slurm: a smoke rehearsal submitted from the wheel install trains to the end.

The fresh venvs see the test venv's third-party packages (jinja2, click, torch, ...) through a
.pth file, so nothing is downloaded; jobgen itself is the installed artifact, which comes first on
sys.path (checked).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path
from typing import Callable

import pytest

import jobgen

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
RECIPES = ["bert-large", "bert1.5b", "llama2-7b", "neox20b", "pythia6.9b"]


def checkout_paths(text: str) -> list[str]:
    """Paths into the checkout's own code or data in `text` (the test venv may live inside the
    checkout: its packages are not jobgen's files)."""
    return [str(ROOT / part) for part in ("jobgen", "payload", "recipes", "templates", "env")
            if str(ROOT / part) in text]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheel and the sdist, built once from the checkout (no build isolation: the test
    venv's setuptools, offline)."""
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                           str(out), str(ROOT)], capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("jobgen-*.whl")
    (sdist,) = out.glob("jobgen-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_the_wheel_carries_jobgens_files_and_no_caches(dist: dict[str, Path]) -> None:
    names = zipfile.ZipFile(dist["wheel"]).namelist()
    for needed in ("jobgen/data/recipes/neox20b.yaml", "jobgen/data/recipes/SOURCES.md",
                   "jobgen/data/recipes/measurements/published.yaml",
                   "jobgen/data/templates/slurm/job.sbatch.j2",
                   "jobgen/data/payload/common/job_flow.sh",
                   "jobgen/data/payload/smoke/train.py",
                   "jobgen/data/sites/local.yaml", "jobgen/data/platforms/p4d.24xlarge.yaml",
                   "jobgen/data/containers/entrypoint.sh",
                   "jobgen/data/containers/neuron.Dockerfile",
                   "jobgen/payloads/upstream/neuron_nemo.json"):
        assert needed in names, needed
    recipes = sorted(Path(n).stem for n in names
                     if re.fullmatch(r"jobgen/data/recipes/[^/]+\.yaml", n))
    assert recipes == RECIPES
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pyo"))]
    # Every file of the checkout's payload is in the wheel, so the digests agree.
    payload = sorted(str(p.relative_to(ROOT / "payload")) for p in (ROOT / "payload").rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    assert payload == sorted(n[len("jobgen/data/payload/"):] for n in names
                             if n.startswith("jobgen/data/payload/"))


def test_the_sdist_carries_the_tests_and_the_readme(dist: dict[str, Path]) -> None:
    with tarfile.open(dist["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in ("README.md", "mkdocs.yml", "docs/index.md", "docs/chaos-rehearsal.png",
                   "setup.cfg", "MANIFEST.in", "tests/conftest.py",
                   "tests/test_tool_install.py", "tests/golden/slurm/neox20b-4n.sbatch",
                   "recipes/llama2-7b.yaml", "payload/common/job_flow.sh",
                   "env/sites/local.yaml", "env/containers/entrypoint.sh",
                   "jobgen/data/__init__.py"):
        assert needed in names, needed
    assert not [n for n in names if "__pycache__" in n]


@pytest.fixture(scope="module", params=["wheel", "sdist"])
def installed(request: pytest.FixtureRequest, dist: dict[str, Path],
              tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with jobgen installed from the wheel or the sdist; its bin folder."""
    return install(request.param, dist, tmp_path_factory)


@pytest.fixture(scope="module")
def wheel_installed(dist: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install("wheel", dist, tmp_path_factory)


def install(kind: str, dist: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp(f"venv-{kind}")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # The test venv's packages (jinja2, click, PyYAML, torch, ...), after the venv's own.
    Path(purelib, "zz-test-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = subprocess.run([str(python), "-m", "pip", "install", "--no-deps",
                           "--no-build-isolation", "--no-cache-dir", str(dist[kind])],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    where = subprocess.run([str(python), "-c", "import jobgen, jobgen.plumbing.resources as r; "
                            "print(jobgen.__file__); print(r.installed())"],
                           capture_output=True, text=True, check=True, cwd=venv).stdout.split()
    assert where[0].startswith(str(venv)) and where[1] == "package", where
    return venv / "bin"


@pytest.fixture
def tool(installed: Path, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the installed `jobgen` from an empty folder outside the checkout."""
    return runner(installed, tmp_path)


def runner(installed: Path, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JOBGEN_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(HOME=str(home), JOBGEN_STATE_DIR=str(tmp_path / "state"),
               XDG_CACHE_HOME=str(tmp_path / "cache"),
               PATH=f"{installed}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}")

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(installed / "jobgen"), *args], cwd=work, env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        if check:
            assert proc.returncode == 0, f"jobgen {' '.join(args)}: {proc.stderr[-2000:]}"
            assert not checkout_paths(proc.stdout + proc.stderr), "the checkout leaked"
        return proc

    run.work = work  # type: ignore[attr-defined]
    return run


Tool = Callable[..., "subprocess.CompletedProcess[str]"]


def test_installed_jobgen_renders_every_backend(tool: Tool) -> None:
    work: Path = tool.work  # type: ignore[attr-defined]
    assert tool("--version").stdout.strip().endswith(jobgen.__version__)
    listed = tool("list").stdout.splitlines()
    assert sorted(line.split()[0] for line in listed) == RECIPES
    assert "run_name: pythia6.9b-2n\n" in tool("show", "pythia6.9b", "--nodes", "2").stdout

    script = tool("render", "pythia6.9b", "--nodes", "2").stdout
    assert script.startswith("#!/bin/bash")
    (folder,) = re.findall(
        r"^export JOBGEN_PAYLOAD_DIR=(jobgen-runs/\.jobgen/payload/[0-9a-f]{16})$", script, re.M)
    digest = re.search(r"^export JOBGEN_PAYLOAD_DIGEST=([0-9a-f]{64})$", script, re.M)
    assert digest and (work / folder / ".jobgen-digest").read_text().strip() == digest.group(1)
    assert (work / folder / "common" / "job_flow.sh").is_file()

    definition = json.loads(tool("render", "bert1.5b", "--backend", "batch").stdout)
    assert definition["type"] == "multinode" and definition["nodeProperties"]["numNodes"] == 16
    assert definition["nodeProperties"]["nodeRangeProperties"][0]["container"]["image"] \
        .endswith(":dl1-deepspeed-" + digest.group(1)[:16])   # images.yaml's name, payload id
    request = json.loads(tool("render", "llama2-7b", "--backend", "sagemaker",
                              "--nodes", "16").stdout)
    assert request["ResourceConfig"]["InstanceCount"] == 16
    manifests = tool("render", "llama2-7b", "--backend", "eks", "--nodes", "2").stdout
    # The local site's cluster has JobSet (eks.gang: jobset): one JobSet, whose controller makes
    # the child Jobs and the headless Service.
    assert "apiVersion: jobset.x-k8s.io/v1alpha2" in manifests and "kind: JobSet" in manifests

    check = tool("check", "--no-shellcheck", "--max-nodes", "4")
    assert re.search(r"^\d+ ok, \d+ skipped, 0 failed$", check.stdout, re.M), check.stdout
    plan = tool("plan", "llama2-7b", "--nodes", "16,32")
    assert "16" in plan.stdout and "32" in plan.stdout

    nodes = json.loads(tool("run", "neox20b", "--nodes", "2", "--smoke", "--dry-run").stdout)
    flow = nodes["nodes"][0]["argv"][1]
    assert flow.startswith(str(work / "jobgen-runs" / ".jobgen" / "payload")), flow
    dry = tool("submit", "neox20b", "--nodes", "2", "--smoke", "--dry-run").stdout
    assert dry.startswith("#!/bin/bash") and "sbatch --parsable" in dry


@pytest.mark.slurm
def test_a_smoke_rehearsal_submitted_from_the_wheel_trains(
        slurm_cluster: int, wheel_installed: Path, tmp_path: Path) -> None:
    """From the installed jobgen (outside the checkout), a 2-node smoke job on the local Slurm:
    its nodes run the snapshot placed in the submission folder, and it trains to the end."""
    tool = runner(wheel_installed, tmp_path)
    work: Path = tool.work  # type: ignore[attr-defined]
    import random
    port = random.randint(33000, 34000)
    proc = tool("submit", "llama2-7b", "--nodes", "2", "--smoke", "--wait", "--poll", "1",
                "--run-name", "wheel-smoke", "--set", f"job.master_port={port}", check=False)
    out = "".join(p.read_text(errors="replace") for p in work.glob("*.out"))
    assert proc.returncode == 0, proc.stderr[-2000:] + out[-3000:]
    run_dir = work / "jobgen-runs" / "wheel-smoke"
    assert (run_dir / "train" / "checkpoints" / "step_00000024" / "COMPLETE").is_file(), \
        out[-3000:]
    (snapshot,) = (work / "jobgen-runs" / ".jobgen" / "payload").iterdir()
    record = json.loads((run_dir / "jobgen-run.json").read_text())
    assert record["submissions"][0]["payload_digest"][:16] == snapshot.name
    assert not checkout_paths(out)


def test_pipx_installs_the_wheel_as_a_tool(dist: dict[str, Path], tmp_path: Path) -> None:
    """`pipx install` of the wheel (its own venv, dependencies from the package index): the
    tool lists the recipes and renders from an empty folder."""
    pipx = Path(sys.executable).parent / "pipx"
    if not pipx.exists():
        pytest.skip("pipx is not installed in the test venv (the [test] extra has it)")
    env = dict(os.environ, PIPX_HOME=str(tmp_path / "pipx"), PIPX_BIN_DIR=str(tmp_path / "bin"),
               PIPX_MAN_DIR=str(tmp_path / "man"), HOME=str(tmp_path),
               JOBGEN_STATE_DIR=str(tmp_path / "state"))
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run([str(pipx), "install", str(dist["wheel"])], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    exe = tmp_path / "bin" / "jobgen"
    work = tmp_path / "work"
    work.mkdir()
    listed = subprocess.run([str(exe), "list"], cwd=work, env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert listed.returncode == 0, listed.stderr
    assert sorted(line.split()[0] for line in listed.stdout.splitlines()) == RECIPES
    script = subprocess.run([str(exe), "render", "llama2-7b", "--nodes", "4"], cwd=work,
                            env=env, capture_output=True, text=True, timeout=120, check=False)
    assert script.returncode == 0, script.stderr
    assert "#SBATCH --nodes=4" in script.stdout and not checkout_paths(script.stdout)
    assert len(list((work / "jobgen-runs" / ".jobgen" / "payload").iterdir())) == 1


def test_a_local_rehearsal_from_the_wheel_trains(wheel_installed: Path, tmp_path: Path) -> None:
    """`jobgen run --smoke` from the installed tool, BERT 1.5B (DeepSpeed ZeRO-1 on CPU) on two
    emulated nodes: they run the snapshot placed under the run folders of the current folder,
    compile 3 steps and train to the end, and the run is recorded like a submission (`runs`
    lists it, `status` reads what its nodes wrote)."""
    import random
    if str(ROOT / "payload") not in sys.path:
        sys.path.insert(0, str(ROOT / "payload"))
    from common.events import read_events  # the test reads the events as the checkout parses

    tool = runner(wheel_installed, tmp_path)
    work: Path = tool.work  # type: ignore[attr-defined]
    proc = tool("run", "bert1.5b", "--nodes", "2", "--smoke", "--run-name", "wheel-local",
                "--set", f"job.master_port={random.randint(34000, 35000)}", check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    run_dir = work / "jobgen-runs" / "wheel-local"
    assert (run_dir / "train" / "checkpoints" / "step_00000024" / "COMPLETE").is_file()
    (snapshot,) = (work / "jobgen-runs" / ".jobgen" / "payload").iterdir()
    assert (snapshot / ".jobgen-digest").is_file()
    assert not checkout_paths(proc.stdout)
    by_node: dict[int, list[str]] = {0: [], 1: []}
    for line in proc.stdout.splitlines():
        found = re.match(r"\[node (\d)\] (.*)", line)
        if found:
            by_node[int(found.group(1))].append(found.group(2))
    events = read_events("\n".join(by_node[0]))
    steps = {phase: [e["step"] for e in events if e["event"] == "step" and e["phase"] == phase]
             for phase in ("compile", "train")}
    assert steps == {"compile": [1, 2, 3], "train": list(range(1, 25))}, proc.stdout[-3000:]
    assert [e["world_size"] for e in events if e["event"] == "start"] == [2, 2]
    for node in (0, 1):
        assert f"jobgen[node {node}]: train pass ended with status 0" in by_node[node]
    mine = [r for r in json.loads(tool("runs", "--json").stdout) if r["name"] == "wheel-local"]
    assert [(r["backend"], r["state"]) for r in mine] == [("local", "COMPLETED")], mine
    status = json.loads(tool("status", "wheel-local", "--json").stdout)
    assert status["state"] == "COMPLETED"
    assert status["nodes"] == {"0": "0 train", "1": "0 train"}
