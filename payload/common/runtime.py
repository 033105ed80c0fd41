"""Process-level plumbing shared by the payloads: launch environment, data order, exit codes."""
from __future__ import annotations

import os
import socket
import sys
import traceback
from collections.abc import Callable
from typing import Any

# Variables that tell us some launcher (torchrun, deepspeed, mpirun, srun) set up the ranks.
_LAUNCHER_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


class PayloadError(Exception):
    """A problem the user can fix (bad flag, missing data): reported in one line, exit code 2."""


def require_positive(args: Any, names: tuple[str, ...]) -> None:
    """Every flag named must be at least 1 (the one message all the programs give)."""
    for name in names:
        if getattr(args, name) < 1:
            raise PayloadError(f"--{name.replace('_', '-')} must be at least 1")


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ensure_process_env() -> str:
    """Make sure torch's env:// rendezvous finds RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*.

    Returns where the ranks came from: ``launcher`` (torchrun, deepspeed, mpirun set them),
    ``slurm`` (one srun task per rank, no launcher: taken from SLURM_PROCID/NTASKS/LOCALID) or
    ``single`` (no launcher at all: a 1-process world on 127.0.0.1). Without these variables
    DeepSpeed falls back to MPI discovery and dies importing mpi4py.
    """
    env = os.environ
    if any(name in env for name in _LAUNCHER_VARS):
        return "launcher"
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
            raise PayloadError(f"started as one of {env['SLURM_NTASKS']} srun tasks without a "
                               "launcher: export MASTER_ADDR and MASTER_PORT (or use torchrun)")
        env.update(RANK=env["SLURM_PROCID"], WORLD_SIZE=env["SLURM_NTASKS"],
                   LOCAL_RANK=env.get("SLURM_LOCALID", "0"))
        return "slurm"
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    env.setdefault("LOCAL_WORLD_SIZE", "1")
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", str(free_port()))
    return "single"


def dist_coords() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) as the launcher published them."""
    return (int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("LOCAL_RANK", "0")))


def batch_positions(consumed: int, micro: int, accumulation: int, world: int,
                    rank: int) -> list[list[int]]:
    """Positions in the global sample stream that ``rank`` trains on in the next optimizer step.

    The step covers stream positions ``[consumed, consumed + micro·accumulation·world)``; each rank
    takes one contiguous block of it, split into ``accumulation`` micro-batches. The order is thus
    a function of the consumed-sample count alone: a resumed run continues with exactly the
    samples an uninterrupted one would have seen, and skipping costs nothing.
    """
    per_rank = micro * accumulation
    start = consumed + rank * per_rank
    return [list(range(start + m * micro, start + (m + 1) * micro)) for m in range(accumulation)]


def step_seed(seed: int, step: int, rank: int) -> int:
    """RNG seed for one optimizer step on one rank (dropout), so resuming is reproducible."""
    return (seed * 1_000_003 + step * 7_919 + rank * 104_729) % (2**63 - 1)


def say_line(text: str) -> None:
    """One line on stderr in a single write: every rank of a node shares the launcher's stderr
    pipe, and print() writes the text and its newline separately (two writes where stderr is
    unbuffered), so two ranks failing at once could run their lines together."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def run_main(main: Callable[[], int], prog: str) -> None:
    """Run ``main`` and exit with a status the launcher can see.

    A ``PayloadError`` prints one line (exit 2); any other exception prints its traceback and a
    closing one-line summary (exit 1). Either way torchrun/deepspeed see the failure and stop.
    """
    try:
        code = main()
    except PayloadError as exc:
        say_line(f"{prog}: error: {exc}")
        code = 2
    except KeyboardInterrupt:
        code = 130
    # Any other crash still has to become an exit status the launcher sees.
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        say_line(f"{prog}: error: {type(exc).__name__}: {exc}")
        code = 1
    sys.exit(code)


def finish_distributed(dist: Any) -> None:
    """End this rank's part once training is done and saved: wait for every rank, then leave.

    On gloo the process group is not torn down: its teardown races with a peer that has already
    left (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT, after
    every step and checkpoint was done), and a failed exit would make the job count a failure and
    requeue. The process exits at once instead, its output flushed; the kernel closes its
    sockets. Other backends (HCCL on Gaudi) tear down as usual.

    Under torchrun, node 0's first worker leaves only once every other node's agent is in
    torchrun's exit barrier (common/agent_exit.py): the agent hosting the store leaves last.
    """
    from common.agent_exit import wait_for_peer_agents

    dist.barrier()
    wait_for_peer_agents()
    if dist.get_backend() != "gloo":
        dist.destroy_process_group()
        return
    import logging
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)
