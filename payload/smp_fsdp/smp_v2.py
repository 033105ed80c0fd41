"""SageMaker's model-parallel library v2 (``torch.sagemaker``) as train_fsdp.py uses it.

The program follows SageMaker's own SMP v2 example (amazon-sagemaker-examples,
``model_parallel_v2/shared-scripts``: train_lib.py, fsdp_utils.py, checkpoints.py): ``tsm.init``
with the job's configuration, ``tsm.transform`` on the Hugging Face model, FSDP wrapped around
SMP's own transformer layer class, SMP's gradient clip, and checkpoints written per
tensor-parallel rank. SMP exists only in SageMaker's training images; the tests use a stand-in
written from its documentation (tests/stand_ins/torch_sagemaker).
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any

from common.runtime import PayloadError

SMP_ENV = "SM_HP_MP_PARAMETERS"   # SageMaker: the mp_parameters hyperparameter, as JSON


def config(args: argparse.Namespace) -> dict[str, Any]:
    """SMP v2's core configuration for this run: SageMaker's mp_parameters where the job has
    them (they win, as in SageMaker's own launcher), else the flags. The example calls
    ``tsm.init()`` with no argument and SMP reads the job's configuration itself; this program
    passes it because on EKS there is no SageMaker job to read it from."""
    mine = {"tensor_parallel_degree": args.tensor_parallel,
            "hybrid_shard_degree": args.hybrid_shard,
            "sm_activation_offloading": args.activation_offloading,
            "activation_loading_horizon": args.activation_loading_horizon,
            "random_seed": args.seed}
    given = os.environ.get(SMP_ENV)
    if given:
        try:
            mine.update(json.loads(given))
        except ValueError:
            raise PayloadError(f"{SMP_ENV} is not JSON: {given[:80]!r}") from None
    return mine


def load() -> Any:
    """torch.sagemaker where the image has it (SageMaker's PyTorch training images), else None."""
    try:
        import torch.sagemaker as tsm  # type: ignore[import-not-found]
    except ImportError:
        return None
    return tsm


def layer_class() -> type:
    """SMP's transformer layer class, which ``tsm.transform`` puts in place of the Hugging Face
    decoder layers: FSDP's wrap policy and activation checkpointing must name it (the example's
    fsdp_utils.get_transformer_layer, torch 2.2 and later)."""
    from torch.sagemaker.tensor_parallel.transformer import (  # type: ignore[import-not-found]
        TransformerLayer,
    )
    return TransformerLayer


def clip(model: Any, max_norm: float) -> float:
    """SMP's gradient clip: one norm over every FSDP shard and every tensor-parallel slice."""
    from torch.sagemaker.grad_norm import clip_grad_norm_  # type: ignore[import-not-found]
    return float(clip_grad_norm_(model, max_norm))


def tp_coords(tsm: Any) -> tuple[int, int]:
    """(tp_rank, tp_size) as SMP decided them (mp_parameters may differ from the flags)."""
    return int(tsm.state.tp_rank), int(tsm.state.tp_size)


def replica_rank(tsm: Any, rank: int) -> int:
    """Which copy of its sharding group ``rank`` is in, as SMP laid the groups out (the
    example's is_action_rank: replica 0 writes the sharded checkpoint)."""
    return int(tsm.state.ranker.get_rep_rank(rank))


def checkpoint_folder(tsm: Any) -> str:
    """Where this rank's part of a checkpoint goes inside the step's folder. Tensor-parallel
    slices share parameter names and offsets, so one torch.distributed.checkpoint over the whole
    world would keep one slice per name: the example saves each TP rank's model in its own
    ``tp{degree}-{tp_rank}`` folder instead ("" without TP)."""
    tp_rank, tp_size = tp_coords(tsm)
    return f"tp{tp_size}-{tp_rank}" if tp_size > 1 else ""
