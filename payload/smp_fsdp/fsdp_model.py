"""The model as train_fsdp.py trains it: sharded, checkpointed (activations), offloaded, and its
optimizer's weight-decay groups and gradient clip, for both of its paths.

With SMP v2 the steps and their order are those of SageMaker's SMP v2 example (train_lib.py):
FSDP (``FullyShardedDataParallel``) wraps each of SMP's transformer layers (auto-wrap policy on
that class) with no process group and no device mesh (SMP's patch of FSDP gives it the groups
its ``hybrid_shard_degree`` makes), keeps the original parameters (``use_orig_params``, which
the example forces with SMP) and buffers in fp32 ("some models hard-code buffers to fp32");
activation checkpointing is then applied to those layers, and the whole model is wrapped for
activation offloading when SMP's configuration asks for it. Without SMP: FSDP2 (``fully_shard``)
on each decoder layer and the root, over an explicit (replicate, shard) device mesh, with the
same checkpointing and offloading.

Where the SMP path still differs from the example, and why:
- Reduction in fp32 (``reduce_dtype``), where the example reduces in bf16: this project's
  ``bf16`` means BF16 compute with FP32 gradient reduction, on every trainer.
- Weight decay by shape (1-D tensors: norm weights and biases), decided before FSDP; the example
  decides by module class (``LayerNorm``, ``LlamaRMSNorm``) and the name ``bias``, on the
  wrapped model. Both leave norms and biases undecayed on the Hugging Face model; the shape rule
  also holds for a norm SMP fuses into another module, whose class is neither.
- The full model is built on every rank, in fp32, with the recipe's seeded initialisation; the
  example's delayed parameter initialisation (``delayed_param``, SMP's own initialiser on meta
  tensors) would replace that initialisation, so it is not used.
"""
from __future__ import annotations

import functools
from typing import Any

from common.optim import excluded
from common.runtime import PayloadError

DECODER_LAYERS = {"llama": "LlamaDecoderLayer", "gpt_neox": "GPTNeoXLayer"}
WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def hf_layer_class(model: Any, family: str) -> type:
    """The Hugging Face decoder layer class of ``model`` (the unit of sharding without SMP)."""
    for module in model.modules():
        if type(module).__name__ == DECODER_LAYERS[family]:
            return type(module)
    raise PayloadError(f"the {family} model has no {DECODER_LAYERS[family]} layers")


def device_mesh(device_type: str, world: int, shard: int) -> Any:
    """(replicate, shard) over the world, for plain FSDP only: consecutive ranks share a shard
    group (a node's, by default). With SMP, SMP makes the groups."""
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh(device_type, (world // shard, shard),
                            mesh_dim_names=("replicate", "shard"))


def clean_name(name: str) -> str:
    """A parameter's name without the prefixes FSDP and the activation wrappers add."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def decay_plan(model: Any, weight_decay: float, no_decay: list[str] | None) -> dict[str, float]:
    """Weight decay per parameter name, decided on the model as FSDP receives it (full shapes):
    FSDP's flat or sharded views are 1-D, so a rule on dimensions must not look at them.
    ``no_decay`` name fragments when the recipe gives them, else the SMP example's rule in
    effect: biases and normalisation weights (LayerNorm, RMSNorm), the 1-D tensors, are not
    decayed; matrices and embeddings are."""
    return {clean_name(name): (0.0 if (excluded(name, no_decay) if no_decay is not None
                                       else p.ndim < 2) else weight_decay)
            for name, p in model.named_parameters() if p.requires_grad}


def param_groups(model: Any, plan: dict[str, float]) -> list[dict[str, Any]]:
    """Optimizer groups of the sharded model's parameters, by the plan made before sharding."""
    groups: dict[float, list[Any]] = {}
    for name, p in model.named_parameters():
        key = clean_name(name)
        if key not in plan:
            raise PayloadError(f"parameter {key} appeared in sharding: no weight decay decided")
        groups.setdefault(plan[key], []).append(p)
    return [{"params": params, "weight_decay": decay}
            for decay, params in sorted(groups.items(), reverse=True)]


def checkpoint_layers(model: Any, layer: type, mode: str, reentrant: bool) -> None:
    """Activation checkpointing on the transformer layers (``full``: every one; ``selective``:
    every second one, SMP v2's documented partial form), by class: PyTorch's
    ``apply_activation_checkpointing``, which works on any model, SMP's layers included."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )
    if mode == "none":
        return
    chosen = [m for m in model.modules() if isinstance(m, layer)][::2 if mode == "selective"
                                                                    else 1]
    ids = {id(m) for m in chosen}
    impl = CheckpointImpl.REENTRANT if reentrant else CheckpointImpl.NO_REENTRANT
    apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=impl),
        check_fn=lambda m: id(m) in ids)


def offload(model: Any) -> Any:
    """Activation offloading: the checkpointed layers' inputs wait in host memory (PyTorch's
    ``offload_wrapper`` around the whole model, as the example does; SMP schedules the copies
    with its activation_loading_horizon)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import offload_wrapper
    return offload_wrapper(model)


def shard_smp(model: Any, layer: type, bf16: bool, device: Any) -> Any:
    """FSDP with SMP v2, as in the example: hybrid sharding, one unit per SMP transformer
    layer, no process group or device mesh (SMP chooses them: passing either beside SMP's
    would make FSDP refuse both), the example's prefetching (backward_pre, forward prefetch,
    limited all-gathers), original parameters kept, buffers in fp32. Gradients are reduced in
    fp32 (this project's bf16: BF16 compute, FP32 reduction), where the example reduces in
    bf16."""
    import torch
    from torch.distributed.fsdp import (
        BackwardPrefetch,
        FullyShardedDataParallel,
        MixedPrecision,
        ShardingStrategy,
    )
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    precision = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                               buffer_dtype=torch.float32) if bf16 else None
    return FullyShardedDataParallel(
        model, auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                                  transformer_layer_cls={layer}),
        sharding_strategy=ShardingStrategy.HYBRID_SHARD, mixed_precision=precision,
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=True,
        limit_all_gathers=True, use_orig_params=True, device_id=device)


def shard_plain(model: Any, mesh: Any, layer: type, bf16: bool) -> Any:
    """FSDP2 without SMP: ``fully_shard`` on each decoder layer (or its checkpoint wrapper) and
    on the root; FSDP2 casts parameters only, so buffers stay fp32."""
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if bf16 else MixedPrecisionPolicy()
    units: list[Any] = []
    for module in model.modules():
        if isinstance(module, CheckpointWrapper) and isinstance(
                module._checkpoint_wrapped_module, layer):
            units.append(module)
        elif isinstance(module, layer) and not any(
                getattr(u, "_checkpoint_wrapped_module", None) is module for u in units):
            units.append(module)
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def clip_plain(model: Any, max_norm: float) -> float:
    """FSDP2's clip: ``clip_grad_norm_`` over DTensor gradients reduces the norm over every
    shard and replica (the result is a DTensor: its full value is the global norm)."""
    import torch
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
