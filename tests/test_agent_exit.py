"""The end of a 2-node torchrun job on one host: node 0's agent, the store's host, leaves last.

Two real torchrun agents (static rendezvous, node ranks 0 and 1) and one gloo worker each, as
a rehearsal's nodes run them. Node 1's worker leaves 0.3 s after node 0's, so without
common/agent_exit.py node 1's agent would be the last in torchrun's exit barrier, the order in
which node 0's agent can close the store under its wait (pytorch#69520).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PAYLOAD = Path(__file__).resolve().parents[1] / "payload"
if str(PAYLOAD) not in sys.path:
    sys.path.insert(0, str(PAYLOAD))

from common.agent_exit import wait_for_peer_agents  # noqa: E402
from common.runtime import free_port  # noqa: E402

WORKER = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import torch.distributed as dist
from common.agent_exit import wait_for_peer_agents
dist.init_process_group("gloo")
dist.barrier()
if os.environ["GROUP_RANK"] == "1":
    time.sleep(0.3)
if os.environ["GROUP_RANK"] == "0":
    os.write(1, f"peer agents in: {wait_for_peer_agents(timeout_s=60)}\\n".encode())
os._exit(0)
"""


@pytest.mark.slow   # two torchrun agents: several seconds, more on a loaded machine
def test_node_0_leaves_after_the_other_agents_are_in_the_exit_barrier(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "GROUP_"))}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--nnodes", "2",
         "--node_rank", str(node), "--master_addr", "127.0.0.1", "--master_port", str(port),
         str(script), str(PAYLOAD)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for node in (0, 1)]
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert "peer agents in: True" in outputs[0], outputs[0]
    for output in outputs:
        assert "exit barrier" not in output and "DistNetworkError" not in output, output


def test_only_node_0s_first_worker_under_torchrun_waits() -> None:
    agent = {"GROUP_RANK": "0", "LOCAL_RANK": "0", "GROUP_WORLD_SIZE": "2",
             "TORCHELASTIC_USE_AGENT_STORE": "True"}
    # Each returns before touching a store (none is listening here).
    assert not wait_for_peer_agents({**agent, "GROUP_RANK": "1"})
    assert not wait_for_peer_agents({**agent, "LOCAL_RANK": "1"})
    assert not wait_for_peer_agents({**agent, "GROUP_WORLD_SIZE": "1"})
    assert not wait_for_peer_agents({**agent, "TORCHELASTIC_USE_AGENT_STORE": "False"})
    assert not wait_for_peer_agents({})


def test_a_store_that_is_gone_ends_the_wait_and_not_the_job() -> None:
    """The work is done when this runs: a store no one answers on is no failure."""
    env = {"GROUP_RANK": "0", "LOCAL_RANK": "0", "GROUP_WORLD_SIZE": "2",
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "jobgen-train",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    assert wait_for_peer_agents(env, timeout_s=1.0) is False
