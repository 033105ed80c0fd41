"""A plain-torch LAMB optimizer for the CPU and CUDA paths (HPU uses Habana's fused kernel).

LAMB is Adam whose update is rescaled per tensor by the trust ratio ||w|| / ||update||, which is
what lets BERT train with very large batches. Weight decay is decoupled (added to the update, as
in AdamW) so it also enters the trust ratio.

As in the reference's NVLAMB (Model-References run_pretraining.py ``--optimizer=nvlamb``, which
leaves its ``use_nvlamb`` off) and apex's FusedLAMB by default, parameter groups without weight
decay (biases and LayerNorm gains) take a plain Adam step: the trust ratio is 1 for them unless
``adapt_undecayed`` is set.

Note: under DeepSpeed ZeRO the optimizer sees each rank's flattened fp32 partition of a parameter
group rather than individual layers, so the "per tensor" ratio becomes a per-partition ratio. The
reference Gaudi recipe runs LAMB under ZeRO-1 the same way (``zero_allow_untested_optimizer``).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


class Lamb(torch.optim.Optimizer):
    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, bias_correction: bool = True,
                 adapt_undecayed: bool = False) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"bad LAMB hyper-parameters lr={lr} betas={betas} eps={eps} "
                             f"weight_decay={weight_decay}")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "bias_correction": bias_correction, "adapt_undecayed": adapt_undecayed}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(  # type: ignore[override]  # torch types step() with overloads
            self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group)
        return loss

    def _update(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        assert param.grad is not None  # step() skips parameters without a gradient
        beta1, beta2 = group["betas"]
        state = self.state[param]
        # Moments and arithmetic in at least fp32, whatever the parameter's own precision.
        dtype = torch.promote_types(param.dtype, torch.float32)
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(param, dtype=dtype)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=dtype)
        state["step"] += 1
        grad = param.grad.to(dtype)
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        mean, var = exp_avg, exp_avg_sq
        if group["bias_correction"]:
            mean = exp_avg / (1 - beta1 ** state["step"])
            var = exp_avg_sq / (1 - beta2 ** state["step"])
        update = mean / (var.sqrt() + group["eps"])
        weights = param.to(dtype)
        if group["weight_decay"]:
            update.add_(weights, alpha=group["weight_decay"])
        # .get: optimizer states saved before the option existed lack the key.
        if not (group["weight_decay"] or group.get("adapt_undecayed", False)):
            param.add_((update * -group["lr"]).to(param.dtype))
            return
        w_norm, u_norm = weights.norm(), update.norm()
        # Fall back to a ratio of 1 for zero tensors (fresh biases), where the ratio is undefined;
        # torch.where keeps the choice on the device instead of syncing to the host.
        trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
        param.add_((update * trust * -group["lr"]).to(param.dtype))
