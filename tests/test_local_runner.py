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
