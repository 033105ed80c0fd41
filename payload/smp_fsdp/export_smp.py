"""Export train_fsdp.py's checkpoint (SMP v2 or plain FSDP) as a Hugging Face model folder, and
prove it.

Takes the trainer's own flags and the export's (common/export_hf.py). A sealed step's model is a
torch.distributed.checkpoint: one over the world, or one per tensor-parallel rank
(``tp{N}-{r}``, fsdp_checkpoint.py). torch's own DCP reader turns each into full tensors (every
FSDP shard) in this one process; a name's TP slices are then joined in TP rank order along the
one dimension where a slice is smaller than the Hugging Face parameter (a slice of full shape is
replicated: TP rank 0's). The proof recomputes the next step's loss (common/export_check.py).
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent), str(_HERE)]

import fsdp_flags as flags
from common import export_check, export_hf
from common.models import build_model
from common.runtime import PayloadError
from fsdp_model import clean_name

PROG = "smp-export"
# SMP's transformer layer in place of each decoder layer, holding it as ``.layer`` (as
# tests/stand_ins/torch_sagemaker models SMP's documented transform): its prefix is dropped.
SMP_LAYER = re.compile(r"\.layers\.(\d+)\.layer\.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = flags.parser(PROG, __doc__.splitlines()[0])
    export_hf.add_flags(p)
    return p.parse_args(argv)


def hf_name(name: str) -> str:
    """A checkpoint's parameter name as the Hugging Face class names it."""
    return SMP_LAYER.sub(r".layers.\1.", clean_name(name))


def read_model(folder: Path) -> dict[str, Any]:
    """The model's tensors of one DCP checkpoint, every FSDP shard merged by torch's own reader
    (``_load_state_dict_from_keys``; ``dcp_to_torch_save`` on a torch without it, e.g. 2.4)."""
    import torch
    from torch.distributed.checkpoint import state_dict_loader

    if not (folder / ".metadata").is_file():
        raise PayloadError(f"{folder}: no .metadata: not a torch.distributed.checkpoint of "
                           "train_fsdp.py's")
    try:
        with warnings.catch_warnings():   # "assuming ... a single process": it is one
            warnings.simplefilter("ignore")
            if hasattr(state_dict_loader, "_load_state_dict_from_keys"):
                state = state_dict_loader._load_state_dict_from_keys(
                    {"model"}, checkpoint_id=str(folder))
            else:
                from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
                with tempfile.TemporaryDirectory() as scratch:
                    saved = Path(scratch) / "full.pt"
                    dcp_to_torch_save(str(folder), str(saved))
                    state = torch.load(saved, map_location="cpu", weights_only=True)
    except Exception as exc:   # DCP's own error types (CheckpointException, ...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PayloadError(f"{folder}: torch.distributed.checkpoint cannot read it "
                           f"({first[:200]})") from None
    model = state.get("model") if isinstance(state, dict) else None
    if not isinstance(model, dict) or not model:
        raise PayloadError(f"{folder}: holds no model state (the 'model' entry "
                           "fsdp_checkpoint.py writes)")
    return {hf_name(k): v for k, v in model.items() if isinstance(v, torch.Tensor)}


def join_slices(parts: list[dict[str, Any]], shapes: dict[str, tuple[int, ...]],
                source: Path) -> dict[str, Any]:
    """One full tensor per name from each TP rank's part (rank order)."""
    import torch

    names = set().union(*parts)
    merged: dict[str, Any] = {}
    for name in sorted(names):
        slices = [part.get(name) for part in parts]
        if any(s is None for s in slices):
            ranks = [r for r, s in enumerate(slices) if s is not None]
            raise PayloadError(f"{source}: {name} is in TP ranks {ranks} only, not in all "
                               f"{len(parts)}")
        full, first = shapes.get(name), tuple(slices[0].shape)
        if full is None or len(parts) == 1 or first == full:
            merged[name] = slices[0]   # unknown (load_weights says so), or replicated
            continue
        dims = [d for d in range(len(full)) if len(first) == len(full) and first[d] != full[d]]
        if (len(dims) != 1 or any(tuple(s.shape) != first for s in slices)
                or first[dims[0]] * len(parts) != full[dims[0]]):
            raise PayloadError(f"{source}: {name}: TP slices of shape {list(first)} do not "
                               f"make the model's {list(full)} over {len(parts)} ranks")
        merged[name] = torch.cat(slices, dim=dims[0])
    return merged


def export(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    import torch
    from train_fsdp import TokenData

    ckpt = export_hf.sealed_step(args.output_dir / "checkpoints", args.step,
                                 args.output_dir / "metrics.jsonl", PROG)
    info = ckpt.info
    if info.get("family") != args.family:
        raise PayloadError(f"{ckpt.path}: holds another model: a {info.get('family')} model, "
                           f"the flags say --family {args.family}")
    tp = int((info.get("sharding") or {}).get("tensor_parallel", 1))
    folders = [ckpt.path] if tp == 1 else [ckpt.path / f"tp{tp}-{r}" for r in range(tp)]
    tok = export_hf.run_tokenizer(args, wordpiece=False)
    torch.manual_seed(args.seed)
    model = build_model(args)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state = join_slices([read_model(f) for f in folders], shapes, ckpt.path)
    export_hf.load_weights(model, state, ckpt.path)
    # Tensor-parallel peers read the same samples: the step's batch is the data-parallel ranks'.
    data = TokenData(args)

    def rows(positions: list[int]) -> dict[str, Any]:
        tokens = data.batch(torch, positions)
        return {"input_ids": tokens, "labels": tokens}

    batches, total = export_hf.next_step_batches(
        dict(info, world_size=int(info["world_size"]) // tp), args.micro_batch_size,
        args.gradient_accumulation, rows, args.micro_batches)
    try:
        logged = export_check.logged_loss(args.output_dir / "metrics.jsonl", ckpt.step + 1)
    except export_check.Unproven:
        logged = None
    return export_hf.publish(model, tok, args.export_root, ckpt, batches, total, logged,
                             args.precision,
                             {"trainer": "smp_fsdp", "family": args.family,
                              "model_class": type(model).__name__, "tensor_parallel": tp,
                              "smp": "smp" in (info.get("sharding") or {})})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_sealed:   # the steps export() chooses from: the same seals, the same folder
        return export_hf.list_sealed(
            lambda: export_hf.sealed_steps(args.output_dir / "checkpoints"), PROG, args.on_node)
    return export_hf.run(lambda: export(args), PROG, args.on_node)


if __name__ == "__main__":
    sys.exit(main())
