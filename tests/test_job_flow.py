"""Functions of the one two-pass flow (payload/common/job_flow.sh), run in bash: which status
explains a job, what a failure leads to, and the wait for every node's compile pass. The whole
flow runs under every executor in test_hostile.py (sbatch script, stand-in srun),
test_entrypoint.py (Batch entrypoint) and test_slurm_e2e.py (real Slurm, submitit, jobgen run)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

FLOW = Path(__file__).resolve().parent.parent / "payload" / "common" / "job_flow.sh"


def call(*words: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", 'source "$0" && "$@"', str(FLOW), *words],
                          env={"PATH": "/usr/bin:/bin", **(env or {})}, capture_output=True,
                          text=True, timeout=30, check=False)


@pytest.mark.parametrize("nodes,srun,expected", [
    ({0: "0 train", 1: "0 train"}, 0, "0 training pass"),
    # srun stopped node 0 (143) after node 1's trainer exited with 7: the 7 explains the job.
    ({0: "143 train", 1: "7 train"}, 143, "7 training pass"),
    # A configuration error on any node explains everything else.
    ({0: "1 compile", 1: "78 compile"}, 1, "78 compile pass"),
    ({0: "143 compile", 1: "143 compile"}, 143, "143 compile pass"),
    # No node recorded anything: srun's own status.
    ({}, 127, "127 job step"),
    ({0: "0 train"}, 9, "9 job step"),
])
def test_the_job_status_is_the_one_that_explains_it(tmp_path: Path, nodes: dict[int, str],
                                                    srun: int, expected: str) -> None:
    for rank, line in nodes.items():
        (tmp_path / f"node-{rank}").mkdir()
        (tmp_path / f"node-{rank}" / "job.status").write_text(line + "\n")
    proc = call("flow_job_status", str(srun), env={"JOBGEN_LOG_DIR": str(tmp_path)})
    assert proc.stdout == expected + "\n", proc.stderr


@pytest.mark.parametrize("status,restart,limit,decision", [
    (78, 0, 10, "stop"), (7, 0, 10, "requeue"), (7, 9, 10, "requeue"), (7, 10, 10, "give-up"),
    (143, 0, 0, "give-up")])
def test_restart_decision(status: int, restart: int, limit: int, decision: str) -> None:
    proc = call("flow_restart_decision", str(status), str(restart),
                env={"JOBGEN_MAX_RESTARTS": str(limit)})
    assert proc.stdout == decision + "\n"


def test_requeue_runs_the_scheduler_command_and_keeps_the_status(tmp_path: Path) -> None:
    marker = tmp_path / "requeued"
    proc = call("flow_finish", "7", "training pass", "2", "touch", str(marker),
                env={"JOBGEN_MAX_RESTARTS": "3"})
    assert proc.returncode == 7 and marker.exists()
    assert "training pass failed with status 7; requeueing (restart 3 of 3)" in proc.stderr


def test_wait_for_nodes_needs_every_node_and_stops_at_a_failure(tmp_path: Path) -> None:
    env = {"JOBGEN_LOG_DIR": str(tmp_path), "JOBGEN_NNODES": "2", "JOBGEN_RDZV_TIMEOUT": "2"}
    (tmp_path / "node-0").mkdir()
    (tmp_path / "node-0" / "compile.status").write_text("0\n")
    proc = call("flow_wait_for_nodes", "compile", env=env)
    assert proc.returncode == 1
    assert "only 1 of 2 nodes finished the compile pass within 2 s" in proc.stderr
    (tmp_path / "node-1").mkdir()
    (tmp_path / "node-1" / "compile.status").write_text("0\n")
    assert call("flow_wait_for_nodes", "compile", env=env).returncode == 0
    (tmp_path / "node-1" / "compile.status").write_text("9\n")
    proc = call("flow_wait_for_nodes", "compile", env=env)
    assert proc.returncode == 1 and "node 1's compile pass failed with status 9" in proc.stderr


def test_script_use_needs_the_node_command() -> None:
    proc = subprocess.run(["bash", str(FLOW)], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "usage: job_flow.sh node" in proc.stderr


FAKE_LAUNCHER = """#!/usr/bin/env bash
# Records the pass it was asked for and ends it with status 0, as node_launch.sh would record.
echo "$1" >> "$RECORD"
mkdir -p "$JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK"
echo 0 > "$JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK/$1.status"
"""


def test_main_node_does_not_train_when_another_node_failed_to_compile(tmp_path: Path) -> None:
    """On a shared filesystem without a controller (submitit), the main node waits for every
    node's compile pass: a failed one means no marker and no training pass."""
    payload = tmp_path / "payload"
    (payload / "fake").mkdir(parents=True)
    (payload / "fake" / "launch.sh").write_text(FAKE_LAUNCHER)
    logs = tmp_path / "logs"
    (logs / "node-1").mkdir(parents=True)
    (logs / "node-1" / "compile.status").write_text("9\n")
    env = {"MASTER_PORT": "29500", "MASTER_ADDR": "127.0.0.1", "JOBGEN_RUN_DIR": str(tmp_path),
           "JOBGEN_PAYLOAD_DIR": str(payload), "JOBGEN_LAUNCHER": "fake/launch.sh",
           "JOBGEN_WORKERS_PER_NODE": "1", "JOBGEN_WORKDIR": str(tmp_path),
           "JOBGEN_PROGRAM": "train.py", "JOBGEN_COMPILE_CACHE": str(tmp_path / "cache"),
           "JOBGEN_COMPILE_KEY": "k", "JOBGEN_CACHE_VAR": "NEURON_COMPILE_CACHE_URL",
           "JOBGEN_SHARED_FS": "1", "JOBGEN_SETUP_ON": "main", "JOBGEN_NODE_RANK": "0",
           "JOBGEN_NNODES": "2", "JOBGEN_IS_MAIN": "1", "JOBGEN_LOG_DIR": str(logs),
           "RECORD": str(tmp_path / "calls")}
    proc = subprocess.run(["bash", str(FLOW), "node", "0"], env={"PATH": "/usr/bin:/bin", **env},
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr
    assert (tmp_path / "calls").read_text().split() == ["compile"]
    assert "node 1's compile pass failed with status 9" in proc.stderr
    assert not (tmp_path / "cache" / ".jobgen" / "k.done").exists()
    assert (logs / "node-0" / "job.status").read_text() == "1 compile\n"


def test_no_node_of_a_shared_disk_starts_its_launcher_on_data_the_check_refuses(
        tmp_path: Path) -> None:
    """Two nodes of a shared disk (as `jobgen run --nodes 2` starts them): the main node's data
    check refuses the dataset and publishes its verdict, the other node waits for it: neither
    starts its launcher, both end with 78 at the data check."""
    import json
    import sys
    payload = tmp_path / "payload"
    (payload / "fake").mkdir(parents=True)
    (payload / "fake" / "launch.sh").write_text(FAKE_LAUNCHER)
    (payload / "common").symlink_to(FLOW.parent)
    logs = tmp_path / "logs"
    data = json.dumps({"format": "megatron", "recipe": "recipes/neox20b.yaml", "key": "data.path",
                       "seq_length": 8, "prefixes": [str(tmp_path / "gpt2" / "doc")]})
    env = {"PATH": "/usr/bin:/bin", "MASTER_PORT": "29500", "MASTER_ADDR": "127.0.0.1",
           "JOBGEN_RUN_DIR": str(tmp_path), "JOBGEN_PAYLOAD_DIR": str(payload),
           "JOBGEN_LAUNCHER": "fake/launch.sh", "JOBGEN_WORKERS_PER_NODE": "1",
           "JOBGEN_WORKDIR": str(tmp_path), "JOBGEN_PROGRAM": "train.py",
           "JOBGEN_COMPILE_CACHE": str(tmp_path / "cache"), "JOBGEN_COMPILE_KEY": "k",
           "JOBGEN_CACHE_VAR": "NEURON_COMPILE_CACHE_URL", "JOBGEN_SHARED_FS": "1",
           "JOBGEN_SETUP_ON": "main", "JOBGEN_NNODES": "2", "JOBGEN_LOG_DIR": str(logs),
           "JOBGEN_DATA": data, "JOBGEN_PYTHON": sys.executable, "JOBGEN_RDZV_TIMEOUT": "30",
           "RECORD": str(tmp_path / "calls")}
    nodes = [subprocess.Popen(["bash", str(FLOW), "node", "0"], text=True,
                              stderr=subprocess.PIPE, env={**env, "JOBGEN_NODE_RANK": str(rank),
                                                           "JOBGEN_IS_MAIN": str(int(rank == 0))})
             for rank in (1, 0)]
    said = [node.communicate(timeout=60)[1] for node in nodes]
    assert [node.returncode for node in nodes] == [78, 78], said
    assert not (tmp_path / "calls").exists()          # no launcher started, on either node
    assert "gpt2/doc.idx: missing" in said[1]
    assert "the main node's data check failed" in said[0]
    for rank in (0, 1):
        assert (logs / f"node-{rank}" / "job.status").read_text() == "78 data\n"


def test_the_fsx_client_setting_is_applied_where_the_site_asks_and_lctl_exists(
        tmp_path: Path) -> None:
    """slurm.lustre_max_dirty_mb (JOBGEN_LUSTRE_MAX_DIRTY_MB): lctl set_param on the node, as
    upstream train_setup.sh does it; without lctl, or without the setting, nothing is run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, body in (("lctl", 'echo "$*" >> "$CALLS"'), ("sudo", 'shift; "$@"')):
        (bin_dir / tool).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    calls = tmp_path / "calls"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(calls)}
    proc = call("flow_lustre_client", env={**env, "JOBGEN_LUSTRE_MAX_DIRTY_MB": "64"})
    assert proc.returncode == 0 and "osc.*.max_dirty_mb=64" in proc.stderr
    assert calls.read_text() == "set_param osc.*.max_dirty_mb=64\n"
    calls.unlink()
    assert call("flow_lustre_client", env=env).stderr == ""         # the site does not ask
    (bin_dir / "lctl").unlink()
    proc = call("flow_lustre_client", env={**env, "JOBGEN_LUSTRE_MAX_DIRTY_MB": "64"})
    assert proc.returncode == 0 and "no lctl on this node" in proc.stderr
    assert not calls.exists()
