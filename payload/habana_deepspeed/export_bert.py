"""Export a pretrain_bert.py checkpoint (DeepSpeed ZeRO) as a Hugging Face BertForPreTraining
folder, and prove it.

Takes the trainer's own flags (they describe the model and its data) and the export's
(common/export_hf.py). DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint`` merges the
ranks' fp32 partitions of the sealed step (by its tag: the trainer saves with
``save_latest=False``); the names are BertForPreTraining's own, so the export loads them strictly
into the model the flags build and saves it with the tokenizer. The proof recomputes the next
step's loss on the run's own hdf5 rows (common/export_check.py).

bert1.5b's LayerNorm placement (``--layer-norm-large-model``, bert_topology.py) keeps stock
BERT's parameter names but computes another function, and no BertConfig setting reproduces it:
such a checkpoint is refused in one line rather than exported as a model that loads and is wrong.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent), str(_HERE)]

import bert_flags as flags
from common import export_check, export_hf
from common.runtime import PayloadError

PROG = "bert-export"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = flags.parser(PROG, __doc__.splitlines()[0])
    export_hf.add_flags(p)
    return p.parse_args(argv)


def merged_state(root: Path, tag: str) -> dict[str, Any]:
    """The full fp32 state dict of one tagged ZeRO checkpoint, DeepSpeed's own merge."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")   # a conversion: no device needed
    # DeepSpeed's notices and progress lines are kept out of this program's one line of outcome.
    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
            state: dict[str, Any] = get_fp32_state_dict_from_zero_checkpoint(str(root), tag=tag)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise PayloadError(f"{root / tag}: not a DeepSpeed ZeRO checkpoint this program "
                           f"wrote ({type(exc).__name__}: {exc})") from None
    return state


def convert(args: argparse.Namespace, root: Path, tag: str) -> Any:
    """The HF model holding the checkpoint's weights, wired as stock BertForPreTraining."""
    from pretrain_bert import build_model

    model = build_model(argparse.Namespace(**dict(vars(args), layer_norm_large_model=False)))
    export_hf.load_weights(model, merged_state(root, tag), root / tag)
    return model


def export(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    flags.validate(args)
    if args.layer_norm_large_model:
        raise PayloadError("--layer-norm-large-model: this LayerNorm placement (bert1.5b's) has "
                           "no Hugging Face BertConfig; stock BertForPreTraining would load the "
                           "weights and compute another function, so it is not exported")
    from bert_data import ShardedSamples, find_training_files

    root = args.output_dir / "checkpoints"
    ckpt = export_hf.sealed_step(root, args.step, args.output_dir / "metrics.jsonl", PROG)
    tok = export_hf.run_tokenizer(args, wordpiece=True)
    model = convert(args, root, ckpt.tag)
    data = ShardedSamples(find_training_files(args.input_dir), args.seq_length,
                          args.max_predictions, args.seed)

    def rows(positions: list[int]) -> dict[str, Any]:
        import torch
        return {k: torch.from_numpy(v) for k, v in data.batch(positions).items()}

    batches, total = export_hf.next_step_batches(ckpt.info, args.micro_batch_size,
                                                 args.gradient_accumulation, rows,
                                                 args.micro_batches)
    try:
        logged = export_check.logged_loss(args.output_dir / "metrics.jsonl", ckpt.step + 1)
    except export_check.Unproven:
        logged = None
    return export_hf.publish(model, tok, args.export_root, ckpt, batches, total, logged,
                             args.precision, {"trainer": "habana_deepspeed",
                                              "model_class": type(model).__name__,
                                              "zero_stage": args.zero_stage})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_sealed:   # the steps export() chooses from: the same seals, the same folder
        return export_hf.list_sealed(
            lambda: export_hf.sealed_steps(args.output_dir / "checkpoints"), PROG, args.on_node)
    return export_hf.run(lambda: export(args), PROG, args.on_node)


if __name__ == "__main__":
    sys.exit(main())
