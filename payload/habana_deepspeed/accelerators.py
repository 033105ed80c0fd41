"""Pick the accelerator at run time (HPU, else CUDA, else CPU) and the optimizer that fits it.

Must run before ``import deepspeed``: DeepSpeed reads ``DS_ACCELERATOR`` once, at import.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from common.optim import parameter_groups
from common.runtime import PayloadError

CHOICES = ("auto", "hpu", "cuda", "cpu")


def _no_op() -> None:
    """Eager devices need no graph flush between phases of a step."""


@dataclass(frozen=True)
class Accelerator:
    name: str             # hpu | cuda | cpu (also the DS_ACCELERATOR value)
    device: torch.device
    backend: str          # torch.distributed backend
    # Habana lazy mode builds a graph until told to run it; called after backward and step.
    mark_step: Callable[[], None] = field(default=_no_op)


def _habana_available() -> bool:
    try:
        importlib.import_module("habana_frameworks.torch")
    except ImportError:
        return False
    return True


def _resolve(request: str) -> str:
    """Which accelerator a request means here; an explicit one that is missing is an error."""
    if request == "auto":
        # An explicit DS_ACCELERATOR (as the CPU tests set) wins over detection.
        forced = os.environ.get("DS_ACCELERATOR", "")
        if forced in ("hpu", "cuda", "cpu"):
            return _resolve(forced)
        if _habana_available():
            return "hpu"
        return "cuda" if torch.cuda.is_available() else "cpu"
    if request == "hpu" and not _habana_available():
        raise PayloadError("--accelerator hpu, but habana_frameworks.torch cannot be imported")
    if request == "cuda" and not torch.cuda.is_available():
        raise PayloadError("--accelerator cuda, but torch sees no CUDA device")
    return request


def choose_accelerator(request: str, local_rank: int) -> Accelerator:
    name = _resolve(request)
    os.environ["DS_ACCELERATOR"] = name
    if name == "hpu":
        core = importlib.import_module("habana_frameworks.torch.core")
        # Importing this module registers the "hccl" backend with torch.distributed.
        importlib.import_module("habana_frameworks.torch.distributed.hccl")
        return Accelerator("hpu", torch.device("hpu"), "hccl", core.mark_step)
    if name == "cuda":
        torch.cuda.set_device(local_rank)
        return Accelerator("cuda", torch.device("cuda", local_rank), "nccl")
    return Accelerator("cpu", torch.device("cpu"), "gloo")


# The reference's exclusion list (Model-References deepspeed-bert run_pretraining.py): on Hugging
# Face's BERT it selects exactly the 1-D parameters (biases and LayerNorm gains), the rule this
# program used before --no-decay existed; used when the flag is absent.
REFERENCE_NO_DECAY = ("bias", "gamma", "beta", "LayerNorm")


def build_optimizer(kind: str, model: torch.nn.Module, accel: Accelerator, lr: float,
                    weight_decay: float, betas: tuple[float, float] = (0.9, 0.999),
                    eps: float = 1e-6, no_decay: Sequence[str] | None = None,
                    ) -> tuple[torch.optim.Optimizer, str]:
    """The optimizer object handed to deepspeed.initialize, and a name for the start line.

    A client optimizer (not DeepSpeed's config one) avoids DeepSpeed JIT-building its fused ops.
    """
    groups = parameter_groups(model.named_parameters(), weight_decay,
                              REFERENCE_NO_DECAY if no_decay is None else no_decay)
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps), "torch.AdamW"
    if accel.name == "hpu":
        fused = importlib.import_module("habana_frameworks.torch.hpex.optimizers")
        return fused.FusedLamb(groups, lr=lr, betas=betas, eps=eps), "habana.FusedLamb"
    from lamb import Lamb  # the script's own directory is on sys.path

    return Lamb(groups, lr=lr, betas=betas, eps=eps), "payload.Lamb"


SHM_OP = "deepspeed_shm_comm"   # the op DeepSpeed's communication builds on a CPU accelerator


def shm_op_to_build() -> bool:
    """Whether DeepSpeed will compile its shared-memory op when communication starts on CPU: it
    is neither in the installed wheel (DS_BUILD_SHM_COMM=1) nor in torch's extension cache. The
    build takes about 2 minutes on one core, once, and prints nothing until it ends."""
    try:
        from deepspeed.git_version_info import installed_ops
    except ImportError:
        return False
    if installed_ops.get(SHM_OP):
        return False
    from torch.utils.cpp_extension import get_default_build_root
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    import glob
    return not glob.glob(os.path.join(root, "*", SHM_OP, f"{SHM_OP}*.so"))


@contextlib.contextmanager
def communication_start(accel: Accelerator, rank: int) -> Iterator[None]:
    """Around deepspeed.init_distributed: one line before a silent first build of the CPU op and
    one when it is built (rank 0 only: the other ranks wait on its lock); DeepSpeed's own "built
    successfully", which every rank prints in every pass, even for a cached op, is left out."""
    building = accel.name == "cpu" and rank == 0 and shm_op_to_build()
    if building:
        print("building DeepSpeed's CPU communication op (first run only, about 2 minutes "
              "on one core)...", flush=True)
    started = time.monotonic()
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            yield
    finally:
        for line in printed.getvalue().splitlines():
            if not (line.startswith("DeepSpeed ") and line.endswith(" built successfully")):
                print(line)
    if building:
        print(f"built DeepSpeed's CPU communication op in {time.monotonic() - started:.0f} s",
              flush=True)
