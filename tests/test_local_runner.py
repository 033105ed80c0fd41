"""The local runner's stop (jobgen run, Ctrl-C or a node outliving the main one): after the
grace, nothing of a node is left, torchrun-style workers in sessions of their own included."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from jobgen.backends.local import runner as local_runner


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")      # a zombie waits for a reaper, it runs nothing


def test_stop_kills_a_node_and_its_workers_in_other_sessions(tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"
    # A node that ignores SIGTERM and a worker in a session of its own that ignores it too.
    node = subprocess.Popen(
        ["bash", "-c", "trap '' TERM; setsid bash -c 'trap \"\" TERM; echo $$ > \"$0\"; "
         "exec sleep 300' \"$1\" & wait", "node", str(pid_file)],
        start_new_session=True)
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.05)
    worker = int(pid_file.read_text())
    assert _alive(worker) and os.getsid(worker) != os.getsid(node.pid)
    assert worker in local_runner._tree(node.pid)
    local_runner._stop(node, grace_s=0.5)
    assert node.poll() is not None
    for _ in range(50):
        if not _alive(worker):
            break
        time.sleep(0.05)
    assert not _alive(worker)


def test_stop_kills_the_workers_a_node_leaves_behind(tmp_path: Path) -> None:
    """A node that ends at once on SIGTERM but leaves a worker (in a session of its own, which
    ignores SIGTERM) behind: Ctrl-C stops that worker too."""
    pid_file = tmp_path / "worker.pid"
    node = subprocess.Popen(
        ["bash", "-c", "setsid bash -c 'trap \"\" TERM; echo $$ > \"$0\"; exec sleep 300' "
         "\"$1\" & wait", "node", str(pid_file)], start_new_session=True)
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.05)
    worker = int(pid_file.read_text())
    local_runner._stop(node, grace_s=5)
    assert node.poll() is not None
    for _ in range(50):
        if not _alive(worker):
            break
        time.sleep(0.05)
    assert not _alive(worker)


def test_a_taken_master_port_is_moved_or_refused() -> None:
    """A port something listens on (any address) is taken; the rehearsal moves to a free one,
    or (where its nodes' port cannot be moved) refuses in one line naming the --set."""
    import socket
    from types import SimpleNamespace

    import pytest

    from jobgen.backends.local import rehearsal
    from jobgen.plumbing.errors import ConfigError
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        spec = SimpleNamespace(recipe=SimpleNamespace(job=SimpleNamespace(master_port=port)))
        assert rehearsal.port_taken(port)
        moved = rehearsal.master_port(spec)  # type: ignore[arg-type]
        assert moved is not None and moved != port and not rehearsal.port_taken(moved)
        with pytest.raises(ConfigError) as refused:
            rehearsal.master_port(spec, movable=False)  # type: ignore[arg-type]
        assert str(refused.value) == (
            f"port {port} (the recipe's job.master_port) is in use on this machine: stop what "
            "holds it, or pass --set job.master_port=N with a free port N")
    assert not rehearsal.port_taken(port)
    assert rehearsal.master_port(spec) is None  # type: ignore[arg-type]


def test_every_node_is_stopped_at_once(tmp_path: Path) -> None:
    """Ctrl-C reaches every node together: a node that takes its grace to stop does not hold
    back the others' SIGTERM (one after the other, the second node went on to its next pass)."""
    nodes = []
    for rank in range(2):
        mark = tmp_path / f"term-{rank}"
        nodes.append(subprocess.Popen(
            ["bash", "-c", 'trap \'date +%s.%N > "$0"; sleep 1.5; exit 143\' TERM; '
             'while :; do sleep 0.05; done', str(mark)], start_new_session=True))
    time.sleep(0.3)
    local_runner._stop_all(nodes, grace_s=10)
    assert [node.returncode for node in nodes] == [143, 143]
    first, second = (float((tmp_path / f"term-{rank}").read_text()) for rank in range(2))
    assert abs(second - first) < 1.0, (first, second)


FLOW = Path(__file__).resolve().parent.parent / "payload" / "common" / "job_flow.sh"
# Records each pass it is asked for; the compile pass ends at once, as node_launch.sh records it.
RECORDING_LAUNCHER = """#!/usr/bin/env bash
echo "$1" >> "$RECORD"
mkdir -p "$JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK"
echo 0 > "$JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK/$1.status"
"""


def _flow_env(tmp_path: Path) -> dict[str, str]:
    payload = tmp_path / "payload"
    (payload / "fake").mkdir(parents=True)
    (payload / "fake" / "launch.sh").write_text(RECORDING_LAUNCHER)
    return {"PATH": "/usr/bin:/bin", "MASTER_PORT": "29500", "MASTER_ADDR": "127.0.0.1",
            "JOBGEN_RUN_DIR": str(tmp_path), "JOBGEN_PAYLOAD_DIR": str(payload),
            "JOBGEN_LAUNCHER": "fake/launch.sh", "JOBGEN_WORKERS_PER_NODE": "1",
            "JOBGEN_WORKDIR": str(tmp_path), "JOBGEN_PROGRAM": "train.py",
            "JOBGEN_COMPILE_CACHE": str(tmp_path / "cache"), "JOBGEN_COMPILE_KEY": "k",
            "JOBGEN_CACHE_VAR": "NEURON_COMPILE_CACHE_URL", "JOBGEN_SHARED_FS": "1",
            "JOBGEN_SETUP_ON": "main", "JOBGEN_NODE_RANK": "0", "JOBGEN_NNODES": "2",
            "JOBGEN_IS_MAIN": "1", "JOBGEN_LOG_DIR": str(tmp_path / "logs"),
            "JOBGEN_STOP_SIGNAL": "USR1", "RECORD": str(tmp_path / "calls")}


def test_a_stop_between_the_passes_starts_no_training_pass(tmp_path: Path) -> None:
    """The main node's flow, its compile pass done, waits for node 1's (which never comes);
    a SIGTERM there (jobgen run's Ctrl-C) ends it at once: no training pass starts, and the
    node records that it was stopped (143), not a failure."""
    env = _flow_env(tmp_path)
    flow = subprocess.Popen(["bash", str(FLOW), "node", "0"], env=env, text=True,
                            stderr=subprocess.PIPE, start_new_session=True)
    calls = tmp_path / "calls"
    for _ in range(200):
        if calls.exists() and calls.read_text():
            break
        time.sleep(0.05)
    time.sleep(0.5)                         # in the wait for the other node's compile pass
    started = time.monotonic()
    os.killpg(flow.pid, 15)
    _, err = flow.communicate(timeout=30)
    assert time.monotonic() - started < 5, err
    assert flow.returncode == 143, err
    assert calls.read_text().split() == ["compile"], err
    assert "stopped (SIGTERM) while waiting for the nodes' compile pass" in err
    assert (tmp_path / "logs" / "node-0" / "job.status").read_text() == "143 compile\n"
    assert not (tmp_path / "cache" / ".jobgen" / "k.done").exists()


def test_a_pass_asked_for_after_a_stop_does_not_start(tmp_path: Path) -> None:
    """flow_node_pass itself refuses once a stop came (whatever stage the flow was in)."""
    env = _flow_env(tmp_path)
    script = ('source "$0" && flow_init && FLOW_STOPPING=TERM && '
              'flow_node_pass train --x; echo "status $?"')
    proc = subprocess.run(["bash", "-c", script, str(FLOW)], env=env, capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.stdout == "status 143\n", proc.stderr
    assert "stopped (SIGTERM) before the train pass; it does not start" in proc.stderr
    assert not (tmp_path / "calls").exists()


def test_the_rehearsal_folder_leaves_nothing_unignored(tmp_path: Path, monkeypatch) -> None:
    """The emulations' folder (.jobgen-rehearsal/) ignores itself, as a venv does: in a git
    checkout, nothing the SageMaker or EKS emulation leaves behind shows as untracked."""
    import shutil

    import pytest
    if shutil.which("git") is None:
        pytest.skip("no git here")
    monkeypatch.chdir(tmp_path)
    subprocess.run(["git", "init", "-q", "."], check=True)
    folder = local_runner.rehearsal_folder()
    (folder / "local-1-2" / "algo-1").mkdir(parents=True)
    (folder / "local-1-2" / "algo-1" / "resourceconfig.json").write_text("{}")
    shown = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                           capture_output=True, text=True, check=True).stdout
    assert shown == "", shown
    ignored = subprocess.run(["git", "status", "--porcelain", "--ignored"],
                             capture_output=True, text=True, check=True).stdout
    assert ignored == "!! .jobgen-rehearsal/\n"
    assert local_runner.rehearsal_folder(False) == folder


def test_the_sagemaker_emulation_names_the_folder_that_exists(tmp_path: Path,
                                                              monkeypatch) -> None:
    """Its run folder is the first instance's /opt/ml under the rehearsal folder, which is
    what the closing line names (not /opt/ml/checkpoints/..., which is not there)."""
    from jobgen import payloads
    from jobgen.backends.local import rehearsal
    from jobgen.inputs import recipe
    from jobgen.inputs import site as sites
    monkeypatch.chdir(tmp_path)
    rec, source = recipe.load("llama2-7b", [], "sagemaker")
    spec = payloads.resolved(rec, source, sites.load("sagemaker"), 2, backend="sagemaker",
                             smoke=True)
    assert spec.run_dir.startswith("/opt/ml/")
    folder = rehearsal.run_folder(spec, "local-1-2")
    assert folder == (f".jobgen-rehearsal/local-1-2/algo-1/opt/ml/"
                      f"{spec.run_dir[len('/opt/ml/'):]}")
    # Where the emulated instance's flow is told to keep it.
    (argv, env), _ = local_runner.commands(spec, "local-1-2", write=False)
    assert any(str(tmp_path / folder) in value for value in env.values()), env
