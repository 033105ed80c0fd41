"""A dataset's index files on nodes that share no disk (SageMaker's instances).

NeMo's GPT dataset (neuronx-nemo-megatron, gpt_dataset.py ``_build_index_mappings``) builds its
sample index files (``<prefix>_<split>_indexmap_<N>ns_<L>sl_<S>s_{doc,sample,shuffle}_idx.npy``)
on global rank 0 only, waits at a rendezvous of every rank, then every rank loads them. That
holds where all ranks see one folder: beside the data on a shared file system, or a
``model.data.index_mapping_dir`` there. Where each node has a disk of its own (an FSx channel
mounted read-only, or an S3 channel, which SageMaker mounts read-only with FastFile, and a run
folder per instance), the files exist only on rank 0's node and every rank of the other nodes
fails to load them.

The design jobgen uses there, in this order:

1. Index files built in advance beside the data are used: before the trainer starts, each node
   links every ``<prefix>_*_indexmap_*`` file found beside the data into its own index folder
   (``seed_prebuilt``), where the trainer looks first and, finding them, builds nothing.
2. Otherwise each node builds its own copy: the builder is the same upstream function, run by
   each node's local rank 0 instead of global rank 0 (``install``). Inside the dataset module
   only, ``torch.distributed.get_rank()`` answers 0 on a local rank 0; nothing else changes.
   The rendezvous after the build takes every rank, so every rank loads only once every
   node's builder is done, from its own node's disk. The files are the same on every node
   (same data, seed and sample counts), built in parallel: the job takes no longer than with
   one builder.

Not used: sharing rank 0's files through the checkpoint folder's S3 sync (SageMaker copies S3
to an instance only when it starts, so nodes 2..N would see them on the next attempt only), and
a separate index build before training (it would have to recompute NeMo's sample counts: one
more copy of upstream logic that could drift, where the file names must match exactly).

The index folder is node-local scratch outside the checkpoint folder (``/tmp``, SageMaker's
documented scratch space, never synced): no two instances write the same S3 key, and a retry,
on fresh instances, builds again (minutes of CPU on every node at once) instead of restoring N
copies.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# Set to 0 by the SageMaker entrypoint: this node keeps its run folder on a disk of its own.
SHARED_FS_ENV = "JOBGEN_SHARED_FS"


def per_node(env: Any = None) -> bool:
    """Whether index files must be built on every node (its disk is its own)."""
    env = os.environ if env is None else env
    return str(env.get(SHARED_FS_ENV, "1")).strip() == "0"


class _Delegate:
    """An object that answers ``overrides`` itself and everything else from ``real``."""

    def __init__(self, real: Any, overrides: dict[str, Any]) -> None:
        self._real, self._overrides = real, overrides

    def __getattr__(self, name: str) -> Any:
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._real, name)


def install(module: Any, env: Any = None) -> bool:
    """Make ``module``'s rank-0-only index build run on each node's local rank 0: the module's
    own ``torch`` global is replaced by a view of torch in which ``distributed.get_rank()``
    answers 0 on a local rank 0 (its true rank elsewhere). No other module sees a change.
    Returns whether it installed (only on nodes with disks of their own)."""
    env = os.environ if env is None else env
    if not per_node(env) or isinstance(getattr(module, "torch", None), _Delegate):
        return False
    torch = module.torch
    real_rank = torch.distributed.get_rank
    local_leader = str(env.get("LOCAL_RANK", "0") or "0") == "0"

    def get_rank(*args: Any, **kwargs: Any) -> int:
        return 0 if local_leader else int(real_rank(*args, **kwargs))

    distributed = _Delegate(torch.distributed, {"get_rank": get_rank})
    module.torch = _Delegate(torch, {"distributed": distributed})
    return True


def seed_prebuilt(prefixes: list[str], index_dir: str) -> list[Path]:
    """Link the index files built in advance beside each data prefix into ``index_dir`` (under
    the names the trainer looks for there: the same base name), leaving files already there
    alone. Returns the links made."""
    folder = Path(index_dir)
    made: list[Path] = []
    for prefix in prefixes:
        source = Path(prefix)
        if not source.parent.is_dir():
            continue
        for found in sorted(source.parent.glob(f"{source.name}_*_indexmap_*")):
            target = folder / found.name
            if target.exists() or target.is_symlink():
                continue
            folder.mkdir(parents=True, exist_ok=True)
            target.symlink_to(found)
            made.append(target)
    return made
