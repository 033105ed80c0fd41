"""Rendered scripts against the real local Slurm cluster (tests/ci/slurm-up.sh: 4 emulated
nodes, partition debug): `sbatch --test-only` accepts what fits and refuses what does not, and
`jobgen check --test-only` asks the controller about every combination that fits."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

JOBGEN_EXE = Path(sys.executable).parent / "jobgen"


def render(*args: str) -> str:
    proc = subprocess.run([str(JOBGEN_EXE), "render", *args], capture_output=True, text=True,
                          check=True)
    return proc.stdout


def sbatch_test_only(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The script on stdin, as in `jobgen render ... | sbatch --test-only`."""
    return subprocess.run(["sbatch", "--test-only"], input=script, capture_output=True,
                          text=True, cwd=cwd, timeout=60, check=False)


def test_four_node_job_is_accepted(slurm_cluster: int, tmp_path: Path) -> None:
    assert slurm_cluster >= 4, f"the cluster has {slurm_cluster} nodes; tests/ci wants 4"
    proc = sbatch_test_only(render("neox20b", "--nodes", "4", "--site", "local"), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "to start at" in proc.stderr and "on nodes n[1-4]" in proc.stderr


@pytest.mark.parametrize("recipe", ["pythia6.9b", "llama2-7b"])
def test_other_recipes_are_accepted(slurm_cluster: int, tmp_path: Path, recipe: str) -> None:
    proc = sbatch_test_only(render(recipe, "--nodes", "2", "--site", "local"), tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_more_nodes_than_the_cluster_are_refused(slurm_cluster: int, tmp_path: Path) -> None:
    nodes = slurm_cluster * 2
    proc = sbatch_test_only(render("neox20b", "--nodes", str(nodes), "--site", "local"), tmp_path)
    assert proc.returncode != 0
    assert "Requested node configuration is not available" in proc.stderr


def test_check_against_the_cluster(slurm_cluster: int) -> None:
    proc = subprocess.run([str(JOBGEN_EXE), "check", "--test-only", "--no-shellcheck",
                           "--verbose"],
                          capture_output=True, text=True, timeout=600, check=False,
                          env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    # Partition debug (the default) only: partition side's nodes are not where the jobs go.
    assert f"sbatch --test-only: checked against partition debug ({slurm_cluster} nodes)" in lines
    accepted = [line for line in lines if line.endswith("sbatch --test-only accepted")]
    too_big = [line for line in lines
               if line.endswith("not sent to sbatch --test-only (partition debug has "
                                f"{slurm_cluster} nodes)")]
    assert accepted and too_big
    for line in accepted:
        assert int(line.split()[1]) <= slurm_cluster
    for line in too_big:
        assert int(line.split()[1]) > slurm_cluster
