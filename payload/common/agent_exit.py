"""The end of a job under torchrun: the node whose agent hosts the store leaves last.

Once its workers have ended, each node's torchrun agent meets the others once more (the exit
barrier: ``_exit_barrier`` in torch's elastic/agent/server/api.py) in the store that node 0's
agent hosts. The barrier (``barrier`` in elastic/utils/store.py, as torch 2.13 has it) adds one
to a counter; the agent that brings it to the number of nodes sets a key, then every agent
waits for that key. Where the last to arrive is another node's agent, node 0's agent wakes on
its set and exits, closing the store, while the other's wait is still on its way: that agent
logs ``Error waiting on exit barrier`` with a C++ backtrace and ``DistNetworkError: Failed to
recv, got 0 bytes ... Did the remote server shutdown or crash?``, and still ends with status 0
(pytorch#69520, open).

So node 0's first worker leaves only once every other node's agent has counted itself in, and
a second later: node 0's agent then arrives last, and the others are already waiting when it
sets the key.
"""
from __future__ import annotations

import datetime
import os
import time
from collections.abc import Mapping

# A peer's agent counts itself in within its monitor interval (torchrun's --monitor_interval)
# of its workers' exit; this bounds the wait where a peer never does.
PEER_AGENTS_TIMEOUT_S = 30.0
# A counted agent sends its wait right after its count: the time a loaded machine may take to
# run those few lines, before this worker exits and its agent arrives.
GRACE_S = 1.0


def wait_for_peer_agents(env: Mapping[str, str] | None = None,
                         timeout_s: float = PEER_AGENTS_TIMEOUT_S,
                         poll_s: float = 0.05, grace_s: float = GRACE_S) -> bool:
    """On node 0's first worker under torchrun, wait until every other node's agent is in the
    exit barrier. True once they are; False where there is nothing to wait for (another
    worker, one node, no agent store, a torch whose barrier counts otherwise) or on timeout."""
    env = os.environ if env is None else env
    if env.get("GROUP_RANK") != "0" or env.get("LOCAL_RANK") != "0":
        return False
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return False
    nodes = int(env.get("GROUP_WORLD_SIZE", "1"))
    if nodes < 2:
        return False
    try:
        from torch.distributed import PrefixStore, TCPStore
        from torch.distributed.elastic.agent.server.api import _TERMINAL_STATE_SYNC_ID
        from torch.distributed.elastic.utils.store import _NUM_MEMBERS
    except ImportError:
        return False
    counter = _TERMINAL_STATE_SYNC_ID + _NUM_MEMBERS
    deadline = time.monotonic() + timeout_s
    try:
        # The agent's own view of the store: the rendezvous' run id is its prefix.
        store = PrefixStore(env["TORCHELASTIC_RUN_ID"],
                            TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]),
                                     is_master=False,
                                     timeout=datetime.timedelta(seconds=timeout_s)))
        while store.add(counter, 0) < nodes - 1:   # adding 0 reads the count
            if time.monotonic() > deadline:
                return False
            time.sleep(poll_s)
    except (KeyError, ValueError, RuntimeError):   # torch's store errors are RuntimeErrors
        return False   # the job's work is done: its end is left as torch makes it
    time.sleep(grace_s)
    return True
