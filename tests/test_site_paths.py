"""The site-path preflight (jobgen/job/site_paths.py): before a Slurm job is queued (and in `jobgen
check --paths`), every site path the job's nodes open or jobgen makes is looked for on the
submitting host, and each one missing is named in one line (site file, key, path), exit 2,
nothing written or queued. Paths the site lists in node_only_paths are not looked for. The
example sites' paths are cited to the AWS samples they follow."""
from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from jobgen.inputs import recipe as recipes
from jobgen.inputs import site as sites
from jobgen.job import site_paths
from jobgen.plumbing.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
JOBGEN = Path(sys.executable).parent / "jobgen"

SBATCH = r"""#!/bin/sh
# sbatch stand-in: keeps the script from stdin, prints a job id (--parsable).
cat >"$(dirname "$0")/queued.sbatch"
echo 4242
"""
# sinfo stand-in: the cluster the site describes (its partition compute1, 16 nodes), whether or
# not a real Slurm is installed on this machine (the full tier's local cluster has other ones).
SINFO = r"""#!/bin/sh
echo 'compute1* 16'
"""


def keys(needs: list[site_paths.SitePath]) -> list[str]:
    return [n.key for n in needs]


def test_what_each_job_needs_on_the_submitting_host() -> None:
    site = sites.load("trn1-pcluster")
    neox, _ = recipes.load("neox20b")
    llama, _ = recipes.load("llama2-7b")
    made = ["paths.work_dir", "paths.payload_dir", "paths.compile_cache"]
    assert keys(site_paths.host_paths(site, [neox])) == [
        "setup.activate", "paths.nemo_dir", "paths.data_dir", *made]
    assert keys(site_paths.host_paths(site, [llama])) == [
        "setup.activate", "paths.nxd_llama_dir", "paths.data_dir", *made]
    # A --smoke rehearsal runs jobgen's trainer on made-up data: no checkout, no data.
    assert keys(site_paths.host_paths(site, [neox], smoke=True)) == ["setup.activate", *made]
    # The node-local compile cache is each node's own disk: never looked for here.
    assert "paths.local_compile_cache" not in keys(site_paths.host_paths(site, [neox, llama]))


def test_node_only_paths_are_skipped(write_site: Callable) -> None:
    path = write_site("trn1-pcluster", {"node_only_paths": ["setup.activate", "paths.data_dir"]})
    site = sites.load(str(path))
    neox, _ = recipes.load("neox20b")
    assert keys(site_paths.host_paths(site, [neox])) == [
        "paths.nemo_dir", "paths.work_dir", "paths.payload_dir", "paths.compile_cache"]


def test_node_only_paths_takes_only_the_keys_it_can_skip(write_site: Callable) -> None:
    """The payload snapshots are placed from the submitting host: they cannot be the nodes'."""
    path = write_site("trn1-pcluster", {"node_only_paths": ["paths.payload_dir"]})
    with pytest.raises(ConfigError, match=r"node_only_paths\[0\]: expected one of "
                                          r"setup.activate, .*got 'paths.payload_dir'"):
        sites.load(str(path))


def _tree(root: Path) -> dict[str, str]:
    """A site's paths under `root`: an activate script, a checkout, data, and a file in the
    way of the compile cache."""
    (root / "venv" / "bin").mkdir(parents=True)
    (root / "venv" / "bin" / "activate").write_text("# stand-in\n")
    (root / "nemo").mkdir()
    (root / "data").mkdir()
    (root / "blocked").write_text("a file, not a folder\n")
    return {"setup.activate": str(root / "venv" / "bin" / "activate"),
            "paths.nemo_dir": str(root / "nemo"), "paths.data_dir": str(root / "data"),
            "paths.work_dir": str(root / "shared" / "runs"),   # made: under a folder here
            "paths.payload_dir": str(root / "shared" / "payload"),
            "paths.compile_cache": str(root / "shared" / "cache")}


def test_one_line_per_missing_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = _tree(tmp_path)
    needs = [site_paths.SitePath(k, v, f"the {k}", "made" if "shared" in v else
                                 "file" if k == "setup.activate" else "folder")
             for k, v in values.items()]
    assert site_paths.missing("s.yaml", needs) == []
    (tmp_path / "venv" / "bin" / "activate").unlink()
    (tmp_path / "data").rmdir()
    needs.append(site_paths.SitePath("paths.compile_cache", str(tmp_path / "blocked" / "c"),
                                     "the cache", "made"))
    needs.append(site_paths.SitePath("paths.work_dir", "/no-such-mount-jobgen/runs", "the runs",
                                     "made"))
    needs.append(site_paths.SitePath("paths.nemo_dir", "rel/nemo", "the checkout", "folder"))
    assert site_paths.missing("s.yaml", needs, cwd=tmp_path) == [
        f"s.yaml: setup.activate: the setup.activate, {tmp_path}/venv/bin/activate, is not on "
        "this host",
        f"s.yaml: paths.data_dir: the paths.data_dir, {tmp_path}/data, is not on this host",
        f"s.yaml: paths.compile_cache: the cache, {tmp_path}/blocked/c, cannot be made: "
        f"{tmp_path}/blocked is not a folder",
        "s.yaml: paths.work_dir: the runs, /no-such-mount-jobgen/runs, cannot be made: "
        "/no-such-mount-jobgen does not exist here",
        "s.yaml: paths.nemo_dir: the checkout, rel/nemo (under the submission directory), is "
        "not on this host"]
    # A folder jobgen would make under one this user cannot write in (root writes anywhere:
    # the permission is asked of os.access).
    monkeypatch.setattr(site_paths.os, "access", lambda path, mode: False)
    assert site_paths.missing("s.yaml", needs[3:4]) == [
        f"s.yaml: paths.work_dir: the paths.work_dir, {tmp_path}/shared/runs, cannot be made: "
        f"{tmp_path} is not writable by this user"]


# --- through the CLI ---------------------------------------------------------------------------

def _site(write_site: Callable, root: Path, **node_only: list[str]) -> Path:
    """trn1-pcluster with its paths under `root` (none there yet)."""
    changes: dict[str, object] = {k: str(root / v.lstrip("/")) for k, v in (
        ("setup.activate", "/home/ubuntu/aws_neuron_venv_pytorch/bin/activate"),
        ("paths.nemo_dir", "/home/ubuntu/neuronx-nemo-megatron/nemo/examples/nlp/"
                           "language_modeling"),
        ("paths.data_dir", "/home/ubuntu/examples_datasets"),
        ("paths.work_dir", "/fsx/jobgen/runs"), ("paths.payload_dir", "/fsx/jobgen/payload"),
        ("paths.compile_cache", "/fsx/neuron-compile-cache"))}
    changes.update(node_only)
    return write_site("trn1-pcluster", changes, filename="cluster.yaml")


def _run(cwd: Path, fake: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run([str(JOBGEN), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.fixture
def fake_sbatch(tmp_path: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "sbatch").write_text(SBATCH)
    (folder / "sbatch").chmod(0o755 | stat.S_IXUSR)
    (folder / "sinfo").write_text(SINFO)
    (folder / "sinfo").chmod(0o755 | stat.S_IXUSR)
    return folder


def test_submit_and_check_name_every_missing_path_before_anything(
        tmp_path: Path, write_site: Callable, fake_sbatch: Path) -> None:
    """A fresh cluster where nothing of the site is there yet: submit names every missing path
    (one line each, the site file and key), exit 2, before the payload snapshot is placed or
    sbatch is called; `jobgen check --paths` says the same. Once they are there, the job is
    queued (sbatch's stand-in keeps it)."""
    root = tmp_path / "cluster"
    (root / "fsx").mkdir(parents=True)
    site = _site(write_site, root)
    submit_dir = tmp_path / "submit"
    submit_dir.mkdir()
    shown = str(site)
    expected = [
        f"error: {shown}: setup.activate: the virtualenv's activate script, "
        f"{root}/home/ubuntu/aws_neuron_venv_pytorch/bin/activate, is not on this host",
        f"error: {shown}: paths.nemo_dir: the neuronx-nemo-megatron checkout, "
        f"{root}/home/ubuntu/neuronx-nemo-megatron/nemo/examples/nlp/language_modeling, is not "
        "on this host",
        f"error: {shown}: paths.data_dir: the data folder, {root}/home/ubuntu/examples_datasets, "
        "is not on this host"]
    proc = _run(submit_dir, fake_sbatch, "submit", "neox20b", "--nodes", "4", "--site", shown)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.splitlines() == expected + [
        "error: 3 site paths not on this host: create them or correct the site; a path only "
        "the nodes have goes in node_only_paths; --no-check submits without this check"]
    assert not (fake_sbatch / "queued.sbatch").exists()            # nothing queued
    assert list(submit_dir.iterdir()) == [] and list((root / "fsx").iterdir()) == []

    proc = _run(submit_dir, fake_sbatch, "check", "--site", shown, "--paths", "--recipe",
                "neox20b", "--no-shellcheck", "--max-nodes", "4")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.splitlines() == expected + [
        "error: 3 site paths not on this host: create them or correct the site; a path only "
        "the nodes have goes in node_only_paths"]
    # Without --paths (a CI machine is not the login node) `check --site` names each one and
    # goes on to render.
    proc = _run(submit_dir, fake_sbatch, "check", "--site", shown, "--recipe", "neox20b",
                "--no-shellcheck", "--max-nodes", "4")
    assert proc.returncode == 0, proc.stderr
    named = [line for line in proc.stdout.splitlines() if "site path not on this host" in line]
    assert [line.split("site path not on this host: ", 1)[1] for line in named] == \
        [line[len("error: "):] for line in expected]
    assert "site paths: 3 of 6 not on this host" in proc.stdout

    # What the samples' setup makes (the venv, the clone, the data), then the job is queued.
    activate = root / "home/ubuntu/aws_neuron_venv_pytorch/bin/activate"
    activate.parent.mkdir(parents=True)
    activate.write_text("# stand-in\n")
    workdir = root / "home/ubuntu/neuronx-nemo-megatron/nemo/examples/nlp/language_modeling"
    (workdir / "conf").mkdir(parents=True)
    (workdir / "megatron_gpt_pretraining.py").write_text("# stand-in\n")
    (workdir / "conf" / "megatron_neox_config.yaml").write_text("name: x\n")
    (root / "home/ubuntu/examples_datasets").mkdir()
    proc = _run(submit_dir, fake_sbatch, "check", "--site", shown, "--paths", "--recipe",
                "neox20b", "--no-shellcheck", "--max-nodes", "4")
    assert proc.returncode == 0, proc.stderr
    assert ("site paths: 6 found on this host (setup.activate, paths.nemo_dir, paths.data_dir, "
            "paths.work_dir, paths.payload_dir, paths.compile_cache)") in proc.stdout
    # The data folder is there but holds no dataset yet: the data check refuses (its own tests:
    # tests/test_data_check.py); --no-check submits without the checks.
    proc = _run(submit_dir, fake_sbatch, "submit", "neox20b", "--nodes", "4", "--site", shown)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.strip().endswith("examples_datasets/gpt2/gpt2-vocab.json: missing")
    proc = _run(submit_dir, fake_sbatch, "submit", "neox20b", "--nodes", "4", "--site", shown,
                "--no-check")
    assert (proc.returncode, proc.stdout) == (0, "4242\n"), proc.stderr
    assert f"export JOBGEN_ACTIVATE={activate}" in (fake_sbatch / "queued.sbatch").read_text()


def test_node_only_paths_are_not_looked_for_at_submit(tmp_path: Path, write_site: Callable,
                                                      fake_sbatch: Path) -> None:
    """A venv on each node's own disk, data on a mount the login node lacks: the site says so,
    and the submit goes on (the trainer checks say what they could not look at)."""
    root = tmp_path / "cluster"
    (root / "fsx").mkdir(parents=True)
    site = _site(write_site, root, node_only_paths=["setup.activate", "paths.nemo_dir",
                                                     "paths.data_dir"])
    proc = _run(tmp_path, fake_sbatch, "submit", "neox20b", "--nodes", "4", "--site", str(site))
    assert (proc.returncode, proc.stdout) == (0, "4242\n"), proc.stderr
    assert re.search(r"not checked from this host: trainer, NeMo config \(paths\.nemo_dir, "
                     r"only on the nodes\)", proc.stderr), proc.stderr


def test_container_backends_look_for_no_site_path(jobgen: Callable) -> None:
    """Batch reads the site's paths on its instances (dl1-batch's EFS at /mnt/efs)."""
    result = jobgen("check", "--backend", "batch", "--site", "dl1-batch", "--paths",
                    "--recipe", "bert1.5b", "--max-nodes", "2")
    assert result.exit_code == 0, result.output
    assert ("site paths: not looked for (--backend batch: they are on its instances or in its "
            "images)") in result.output


# --- the example sites follow AWS's samples ---------------------------------------------------

SAMPLES = {
    "trn1-pcluster": ["aws-neuron/aws-neuron-parallelcluster-samples at commit 54075e9",
                      "aws-neuron/aws-neuron-sdk 0c5aca1", "aws-neuron/aws-neuron-sdk 34aafb2"],
    "dl1-batch": ["aws-samples/aws-hpc-tutorials at commit aeaf2c6"],
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_example_path_is_cited(name: str) -> None:
    """Each path key of the example site has a comment above it (or a section comment) that
    names the sample it follows; the samples are named with their commit."""
    text = (ROOT / "env" / "sites" / f"{name}.yaml").read_text()
    for cited in SAMPLES[name]:
        assert cited in text.replace("\n# ", " "), cited
    lines = text.splitlines()
    site = sites.load(name)
    values = {"setup.activate": site.setup.activate,
              **{f"paths.{k}": v for k, v in vars(site.paths).items() if isinstance(v, str)}}
    for key, value in values.items():
        if value is None:
            continue
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(
            key.split(".")[1] + ":"))
        above = lines[max(0, at - 12):at + 1]
        assert any(re.search(r"samples|workshop|jobgen's", line) for line in above), \
            f"{name}: {key} is not cited"


def test_trn1_pcluster_paths_are_where_the_samples_put_them() -> None:
    site = sites.load("trn1-pcluster")
    assert site.setup.activate == "/home/ubuntu/aws_neuron_venv_pytorch/bin/activate"
    assert site.paths.nemo_dir == \
        "/home/ubuntu/neuronx-nemo-megatron/nemo/examples/nlp/language_modeling"
    assert site.paths.data_dir == "/home/ubuntu/examples_datasets"
    assert site.paths.work_dir.startswith("/fsx/") and site.node_only_paths == ()
