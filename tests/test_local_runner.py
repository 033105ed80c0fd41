"""The local runner's stop (jobgen run, Ctrl-C or a node outliving the main one): after the
grace, nothing of a node is left, torchrun-style workers in sessions of their own included."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from jobgen import local_runner


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
