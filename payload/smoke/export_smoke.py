"""Export a smoke trainer's checkpoint (train.py) as a Hugging Face model folder, and prove it.

Takes the trainer's own flags (they describe the model and its data) and the export's
(common/export_hf.py): the sealed step's ``state.pt`` holds the model's ``state_dict`` in
Hugging Face names already (the trainer trains ``GPTNeoXForCausalLM`` or ``LlamaForCausalLM``,
payload/common/models.py), so the export builds the same class from the same flags, loads the
weights strictly and saves it with the tokenizer. The proof recomputes the next step's loss on
the trainer's own rows (common/export_check.py).
"""
from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent), str(_HERE)]

import smoke_flags as flags
from common import export_check, export_hf
from common.models import build_model, synthetic_tokens
from common.runtime import PayloadError
from smoke_checkpoint import STATE_FILE

PROG = "smoke-export"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = flags.parser(PROG, __doc__.splitlines()[0])
    export_hf.add_flags(p)
    args = p.parse_args(argv)
    if args.intermediate_size is None:
        args.intermediate_size = 4 * args.hidden_size
    return args


def rows_reader(args: argparse.Namespace, info: dict[str, Any]) -> Any:
    """The rows the trainer reads at stream positions (train.py's ``_micro_batch``): its made-up
    stream or its prepared dataset, through its sample index where it trained with one."""
    import torch

    index: list[int] | None = None
    if args.index_dir is not None:
        import json

        import indexed_data
        samples = args.max_steps * int(info["global_batch_size"])
        path = indexed_data.index_path(args.index_dir, samples, args.seq_length, args.seed)
        try:
            index = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise PayloadError(f"--index-dir: {path}: the training pass's sample index cannot "
                               "be read") from None

    prepared = None
    if getattr(args, "data_format", None) is not None:   # a prepared dataset (prepared_data.py)
        import prepared_data
        prepared = prepared_data.open_rows(args.data_format,
                                           args.data_prefix or [str(args.data_dir)],
                                           args.seq_length)

    def rows(positions: list[int]) -> dict[str, Any]:
        if index is not None:
            n = len(index)
            positions = [index[p % n] + p // n * n for p in positions]
        made = ([prepared.row(p) for p in positions] if prepared is not None else
                [synthetic_tokens(p, args.seq_length, args.vocab_size, args.seed)
                 for p in positions])
        tokens = torch.tensor(made, dtype=torch.long)
        return {"input_ids": tokens, "labels": tokens}

    return rows


def export(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    import torch

    flags.validate(args)
    ckpt = export_hf.sealed_step(args.output_dir / "checkpoints", args.step,
                                 args.output_dir / "metrics.jsonl", PROG)
    source = ckpt.path / STATE_FILE
    try:
        state = torch.load(source, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        raise PayloadError(f"{source}: not a smoke trainer's checkpoint ({exc})") from None
    if state.get("family") != args.family:
        raise PayloadError(f"{source}: holds another model: a {state.get('family')} model, "
                           f"the flags say --family {args.family}")
    tok = export_hf.run_tokenizer(args, wordpiece=False)
    torch.manual_seed(args.seed)
    model = build_model(args)
    export_hf.load_weights(model, state["model"], source)
    batches, total = export_hf.next_step_batches(
        ckpt.info, args.micro_batch_size, args.gradient_accumulation,
        rows_reader(args, ckpt.info), args.micro_batches)
    try:
        logged = export_check.logged_loss(args.output_dir / "metrics.jsonl", ckpt.step + 1)
    except export_check.Unproven:
        logged = None
    return export_hf.publish(model, tok, args.export_root, ckpt, batches, total, logged, "fp32",
                             {"trainer": "smoke", "family": args.family,
                              "model_class": type(model).__name__})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_sealed:   # the steps export() chooses from: the same seals, the same folder
        return export_hf.list_sealed(
            lambda: export_hf.sealed_steps(args.output_dir / "checkpoints"), PROG, args.on_node)
    return export_hf.run(lambda: export(args), PROG, args.on_node)


if __name__ == "__main__":
    sys.exit(main())
