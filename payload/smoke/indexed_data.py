"""The rehearsal's stand-in for NeMo's GPT dataset index build (``--index-dir``).

Shaped as upstream's (neuronx-nemo-megatron, gpt_dataset.py): global rank 0 makes the folder and
writes the index file if it is not there, every rank waits at a barrier, then every rank reads
it. On nodes that share no disk it therefore needs what the NeMo payload gets there
(payload/common/node_indices.py): a builder on each node. The file is a shuffle of the sample
positions, which the smoke trainer reads its rows through, so a rank that cannot load it cannot
train.
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import torch


def index_path(folder: Path, samples: int, seq_length: int, seed: int) -> Path:
    """Named as NeMo names its files: the sample count, sequence length and seed."""
    return folder / f"smoke_train_indexmap_{samples}ns_{seq_length}sl_{seed}s_shuffle_idx.json"


def build_or_load(folder: Path, samples: int, seq_length: int, seed: int) -> tuple[list[int],
                                                                                   bool]:
    """The shuffle index (and whether this process built it)."""
    path = index_path(folder, samples, seq_length, seed)
    built = False
    if torch.distributed.get_rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
        if not path.is_file():
            order = list(range(samples))
            random.Random(seed).shuffle(order)
            tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
            tmp.write_text(json.dumps(order), encoding="utf-8")
            os.replace(tmp, path)
            built = True
    torch.distributed.barrier()
    order = json.loads(path.read_text(encoding="utf-8"))
    return order, built
