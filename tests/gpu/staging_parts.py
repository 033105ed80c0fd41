"""A prepared check for a lent GPU (not part of CI): where a background save's stall goes in
payload/smp_fsdp/train_fsdp.py on one CUDA device.

benchmarks/async_save_bench.py --cuda found the program's background save stalling about as long
as a synchronous one on an H200, with saves closer together than a write (so most likely the wait
for the previous write, docs/trainers.md), while DCP's async_save with a kept pinned stager
stalls 0.13 s on plain CUDA tensors of the same size. This script leaves the loop out: it trains
the program's own trainer (one rank, FSDP2, bf16) for a few steps, then times each part of a save
apart, twice:

    state         fsdp_checkpoint.state: get_state_dict of the model and optimizer
    default       DCP's default staging (what async_save does with no stager): a CPU copy
    cached        BlockingAsyncStager(cache_staged_state_dict=True).stage, first and second
                  (pinned memory allocated once), and whether the second reused the first's copy
    async_save    dcp.async_save's return (the loop's stall) and its future (the write)

    python tests/gpu/staging_parts.py            # one CUDA device
    python tests/gpu/staging_parts.py --cpu      # the logic on CPU (gloo, tiny sizes, no pinning)

Prints one line per part and the checkpoint's size; exit status 0 unless a part failed.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
PROGRAM_DIR = ROOT / "payload" / "smp_fsdp"
SIZES = {"cuda": ["--num-layers", "12", "--hidden-size", "1536", "--num-heads", "16",
                  "--intermediate-size", "6144", "--seq-length", "1024", "--vocab-size", "32000",
                  "--micro-batch-size", "1", "--precision", "bf16"],
         "cpu": ["--num-layers", "2", "--hidden-size", "64", "--num-heads", "4",
                 "--intermediate-size", "128", "--seq-length", "32", "--vocab-size", "256",
                 "--micro-batch-size", "2", "--precision", "fp32"]}


def timed(what: str, sync: Callable[[], None], work: Callable[[], Any]) -> Any:
    sync()
    began = time.perf_counter()
    out = work()
    sync()
    print(f"{what:32s} {time.perf_counter() - began:8.3f} s", flush=True)
    return out


def tensors(value: Any) -> list[Any]:
    """Every tensor's local data in a (staged) state dict, in order."""
    import torch
    if isinstance(value, dict):
        return [t for item in value.values() for t in tensors(item)]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors(item)]
    local = getattr(value, "_local_tensor", value)
    return [local] if isinstance(local, torch.Tensor) else []


def worker(device: str, out: Path) -> int:
    sys.path.insert(0, str(PROGRAM_DIR))
    sys.path.insert(0, str(ROOT / "payload"))
    import fsdp_checkpoint
    import torch
    import torch.distributed.checkpoint as dcp
    import train_fsdp
    from common.background import gloo_group
    from torch.distributed.checkpoint.staging import BlockingAsyncStager

    args = train_fsdp.parse_args(["--family", "llama", *SIZES[device], "--gradient-accumulation",
                                  "1", "--lr", "1e-4", "--max-steps", "3", "--checkpoint-every",
                                  "100", "--device", device, "--synthetic", "--phase", "train",
                                  "--output-dir", str(out / "run")])
    trainer = train_fsdp.FsdpTrainer(args, train_fsdp.ensure_process_env())
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(3):
        trainer.train_step()
    state = timed("state (get_state_dict)", sync, lambda: fsdp_checkpoint.state(trainer))
    size = sum(t.numel() * t.element_size() for t in tensors(state))
    print(f"{'checkpoint tensors':32s} {size / 1e9:8.2f} GB", flush=True)
    for rep in (1, 2):
        try:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
            stager: Any = DefaultStager(StagingOptions(False, False, False, False))
            timed(f"default staging #{rep}", sync, partial(stager.stage, state))
            stager.close()
        except ImportError:
            print("default staging: this torch has no DefaultStager", flush=True)
    if cuda:
        cached = BlockingAsyncStager(cache_staged_state_dict=True)
        first = timed("cached staging #1", sync, lambda: cached.stage(state))
        trainer.train_step()
        state = fsdp_checkpoint.state(trainer)
        second = timed("cached staging #2", sync, lambda: cached.stage(state))
        same = all(a.data_ptr() == b.data_ptr() for a, b in zip(tensors(first), tensors(second)))
        print(f"{'cached copy reused':32s} {str(same):>8s}", flush=True)
    twin = gloo_group("dcp-save", None)
    for rep in (1, 2):
        trainer.train_step()
        state = fsdp_checkpoint.state(trainer)
        began = time.perf_counter()
        future = timed(f"async_save returns #{rep}", sync,
                       partial(dcp.async_save, state, checkpoint_id=str(out / f"save{rep}"),
                               process_group=twin))
        future.result()
        print(f"{f'async_save written #{rep}':32s} {time.perf_counter() - began:8.3f} s",
              flush=True)
    torch.distributed.destroy_process_group()
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="the logic on CPU")
    p.add_argument("--worker", choices=("cuda", "cpu"), help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a.worker, a.out)
    with tempfile.TemporaryDirectory(prefix="staging-parts-") as tmp:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", "1", str(Path(__file__).resolve()),
                   "--worker", "cpu" if a.cpu else "cuda", "--out", tmp]
        return subprocess.run(command, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
