"""The stand-in trainer's checkpoints (train.py's SmokeTrainer takes them from Checkpoints): each
rank writes its slice of the optimizer state as ZeRO-1 shards it, rank 0 the weights, through
common/loop.py's sealed_save; in the background unless --sync-save (the tensors staged first),
slowed or failed mid-write by the save knobs of smoke_faults.py.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from common.loop import agreed_newest, sealed_save
from smoke_faults import SAVE_DELAY_ENV, SAVE_FAIL_ENV

STATE_FILE = "state.pt"
SHARD_FILE = "optim-rank-{rank:05d}.pt"


def _staged(value: Any, torch: Any) -> Any:
    """A copy of ``value`` whose tensors are detached clones (dicts and lists copied alike)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _staged(item, torch) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_staged(item, torch) for item in value)
    return value


class Checkpoints:
    """Save and resume for SmokeTrainer, which sets what they read (and schedule_params)."""

    torch: Any
    args: Any
    model: Any
    optimizer: Any
    log: Any
    ckpt_root: Path
    rank: int
    world: int
    global_batch: int
    step: int
    consumed: int

    def resume(self) -> None:
        tag = agreed_newest(self.ckpt_root, self.rank)
        if tag is None:
            return
        directory = self.ckpt_root / tag
        state = self.torch.load(directory / STATE_FILE, map_location="cpu", weights_only=False)
        self.model.load_state_dict(state["model"])
        optimizer = state["optimizer"]
        if not optimizer["state"]:   # sharded: every rank of the saving job wrote its slice
            for rank in range(int(state["world_size"])):
                optimizer["state"].update(self.torch.load(
                    directory / SHARD_FILE.format(rank=rank), map_location="cpu",
                    weights_only=False))
        self.optimizer.load_state_dict(optimizer)
        self.step, self.consumed = int(state["step"]), int(state["consumed_samples"])
        self.log.emit("resume", step=self.step, consumed_samples=self.consumed,
                      checkpoint=str(self.ckpt_root / tag),
                      global_batch_changed=state["global_batch_size"] != self.global_batch)

    def _save_file(self, value: Any, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        self.torch.save(value, tmp)
        os.replace(tmp, path)

    def _write_files(self, files: list[tuple[Any, Path]], step: int) -> None:
        """Write a save's files (on the caller's thread or the background one); the fault knobs
        slow it or fail it after its first file."""
        delay = float(os.environ.get(SAVE_DELAY_ENV, "0") or 0)
        for index, (value, path) in enumerate(files):
            self._save_file(value, path)
            if delay > 0:
                time.sleep(delay / len(files))
            if index == 0 and os.environ.get(SAVE_FAIL_ENV, "").strip() == str(step):
                raise OSError(f"{SAVE_FAIL_ENV}={step}: the save failed mid-write")

    def save(self, root: Path | None = None) -> None:
        info = {"step": self.step, "consumed_samples": self.consumed, "seed": self.args.seed,
                "world_size": self.world, "global_batch_size": self.global_batch,
                "family": self.args.family}
        step = self.step

        def write(directory: Path) -> Any:
            # Sharded as ZeRO-1 shards it (NxD's and DeepSpeed's optimizers): each rank writes
            # its slice of the optimizer state, rank 0 the weights, so a checkpoint needs every
            # node's part (on SageMaker, each instance's own files).
            optimizer = self.optimizer.state_dict()
            mine = {i: v for i, v in optimizer["state"].items() if i % self.world == self.rank}
            files: list[tuple[Any, Path]] = [(mine, directory / SHARD_FILE.format(rank=self.rank))]
            if self.rank == 0:
                state = dict(info, model=self.model.state_dict(),
                             optimizer={"state": {}, "param_groups": optimizer["param_groups"]},
                             schedule=self.schedule_params())
                files.append((state, directory / STATE_FILE))
            if self.args.sync_save:
                self._write_files(files, step)
                return None
            # Staged: a copy of every tensor, so the next optimizer step cannot change what the
            # background thread writes (as DCP's async_save stages to CPU memory first).
            staged = [(_staged(value, self.torch), path) for value, path in files]
            return self._writer().submit(self._write_files, staged, step)

        sealed_save(root or self.ckpt_root, self.step, info, self.rank, self.args.keep_checkpoints,
                    self.log, write)

    def _writer(self) -> Any:
        if getattr(self, "_pool", None) is None:
            from concurrent.futures import ThreadPoolExecutor
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="save")
        return self._pool
