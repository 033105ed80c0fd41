"""The stand-in's ``torch.sagemaker.tensor_parallel.transformer``: SMP's transformer layer class,
here a wrapper around a Hugging Face decoder layer whose MLP is split over the tensor-parallel
group (column-parallel up/gate projections, row-parallel down projection), Megatron style."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

TP_SPLIT = "_stand_in_tp_split"   # marks a parameter that holds only this rank's TP slice


class _CopyToTp(torch.autograd.Function):
    """Identity forward; backward sums the input gradient over the TP group."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTp(torch.autograd.Function):
    """Sum over the TP group forward; identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad, None


class _SplitMlp(torch.nn.Module):
    """Llama's gated MLP with this rank's slice of the intermediate dimension."""

    def __init__(self, mlp: Any, rank: int, size: int, group: Any) -> None:
        super().__init__()
        self.group, self.act_fn = group, mlp.act_fn
        rows = mlp.gate_proj.weight.shape[0]
        if rows % size:
            raise ValueError(f"intermediate size {rows} is not divisible by TP degree {size}")
        part = slice(rank * rows // size, (rank + 1) * rows // size)
        self.gate_proj = _linear(mlp.gate_proj.weight[part])
        self.up_proj = _linear(mlp.up_proj.weight[part])
        self.down_proj = _linear(mlp.down_proj.weight[:, part])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _CopyToTp.apply(x, self.group)
        out = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return _ReduceFromTp.apply(out, self.group)


def _linear(weight: torch.Tensor) -> torch.nn.Linear:
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    layer.weight = torch.nn.Parameter(weight.detach().clone().contiguous())
    setattr(layer.weight, TP_SPLIT, True)
    return layer


class TransformerLayer(torch.nn.Module):
    """SMP's transformer layer class: what ``transform`` puts where each decoder layer was."""

    def __init__(self, layer: Any, rank: int, size: int, group: Any) -> None:
        super().__init__()
        if size > 1:
            layer.mlp = _SplitMlp(layer.mlp, rank, size, group)
        self.layer = layer

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.layer(*args, **kwargs)


def replace_layers(model: Any, rank: int, size: int, group: Any) -> Any:
    """Llama (``model.layers``) and GPT-NeoX (``gpt_neox.layers``); the MLP split is Llama's."""
    layers = model.model.layers if hasattr(model, "model") else model.gpt_neox.layers
    if size > 1 and not hasattr(layers[0].mlp, "gate_proj"):
        raise NotImplementedError("the stand-in splits Llama's gated MLP only")
    for index in range(len(layers)):
        layers[index] = TransformerLayer(layers[index], rank, size, group)
    return model
