"""Status tells the truth: with the Slurm controller down, `jobgen status` says so at once,
naming the command that failed (not that the job is unknown); `jobgen runs` shows why a state
is `?`. The controller is made unreachable for jobgen alone: a copy of the cluster's slurm.conf
that names another port."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

JOBGEN = Path(sys.executable).parent / "jobgen"
pytestmark = pytest.mark.slurm


@pytest.fixture
def controller_down(slurm_cluster: int, tmp_path: Path) -> dict[str, str]:
    conf = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    text = conf.read_text()
    lines = [line for line in text.splitlines() if not line.startswith("SlurmctldPort=")]
    (tmp_path / "slurm.conf").write_text("\n".join(lines + ["SlurmctldPort=6899"]) + "\n")
    for other in conf.parent.glob("*.conf"):
        if other.name != "slurm.conf":
            (tmp_path / other.name).write_text(other.read_text())
    return dict(os.environ, SLURM_CONF=str(tmp_path / "slurm.conf"))


def test_status_says_the_controller_is_down(controller_down: dict[str, str],
                                            tmp_path: Path) -> None:
    proc = subprocess.run([str(JOBGEN), "status", "12345"], env=controller_down, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.startswith("error: the Slurm controller does not answer (`scontrol "
                                  "ping`: "), proc.stderr
    assert "unknown to the controller" not in proc.stderr and proc.stderr.count("\n") == 1


def test_runs_shows_why_a_state_is_unknown(controller_down: dict[str, str],
                                           tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "runs.jsonl").write_text(json.dumps({
        "name": "r1", "backend": "slurm", "job_id": "12345", "recipe": "neox20b", "nodes": 2,
        "site": "", "run_dir": str(tmp_path), "submitted": "2026-11-24T00:00:00Z"}) + "\n")
    env = dict(controller_down, JOBGEN_STATE_DIR=str(state))
    proc = subprocess.run([str(JOBGEN), "runs"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].split()[:6] == ["r1", "slurm", "12345", "neox20b", "2", "?"]
    assert lines[-1].startswith("?: the Slurm controller does not answer (`scontrol ping`")
