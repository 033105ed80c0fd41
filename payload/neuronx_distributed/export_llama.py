"""Export a train_llama.py checkpoint (NeuronX Distributed) as a Hugging Face LlamaForCausalLM
folder, and prove it.

Takes the trainer's own flags (they describe the model and its data) and the export's
(common/export_hf.py). NxD seals a save with its ``done`` file; the step's ``user_content.pt``
holds the samples consumed. NxD's own converter (the example checkout's convert_checkpoints.py,
``--convert_to_full_state``) merges the tensor-parallel ranks into one ``checkpoint.pt`` in
Hugging Face Llama names; LlamaForCausalLM, built from the recipe's config, loads it strictly.
The proof recomputes the next step's loss on the run's own blocks (common/export_check.py).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent), str(_HERE)]

import llama_setup as setup
from common import checkpoints, export_check, export_hf
from common.runtime import PayloadError
from common.stream import dataset_rows

PROG = "llama-export"
CONVERTER = "convert_checkpoints.py"   # in the example folder's parent (examples/training/llama)
DONE = "done"                          # NxD's seal of a step, written once every rank wrote
USER_CONTENT = "user_content.pt"       # train_llama.py's global_step and consumed_samples
OUTPUT = "checkpoint.pt"               # what --convert_to_full_state writes into --output_dir
COLUMNS = ("input_ids", "attention_mask", "labels")   # what the trainer feeds its model
# The attributes train_llama.py's model config adds for NxD's model: not Hugging Face's.
NXD_ONLY = ("sequence_parallel_enabled", "selective_checkpoint_enabled", "kv_shared_group_size",
            "qkv_linear", "use_flash_attention", "move_model_to_device", "fuse_qkv",
            "transpose_nki_inputs", "separate_qkv")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = setup.parser(PROG, __doc__.splitlines()[0])
    export_hf.add_flags(p)
    return p.parse_args(argv)


def nxd_tag(step: int) -> str:
    """train_llama.py's tag for a step (NxD's folder name): not zero-padded."""
    return f"step_{step}"


def sealed(root: Path) -> list[checkpoints.Checkpoint]:
    """The steps NxD sealed (``done``), oldest first, with what the trainer recorded in each."""
    found = []
    for entry in sorted(root.iterdir()) if root.is_dir() else ():
        step = checkpoints.step_of(entry.name)
        if step is None or not entry.is_dir() or not (entry / DONE).is_file():
            continue
        found.append(checkpoints.Checkpoint(entry, step, {"step": step}))
    return sorted(found, key=lambda c: c.step)


def recorded(ckpt: checkpoints.Checkpoint) -> dict[str, Any]:
    """The step's user content (global_step, consumed_samples), checked against its folder."""
    import torch

    path = ckpt.path / USER_CONTENT
    try:
        content = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:   # torch's unpickler raises several types
        raise PayloadError(f"{path}: unreadable ({type(exc).__name__}): not a save of "
                           "train_llama.py") from None
    if (not isinstance(content, dict) or content.get("global_step") != ckpt.step
            or not isinstance(content.get("consumed_samples"), int)):
        raise PayloadError(f"{path}: no global_step {ckpt.step} and consumed_samples: not a "
                           "save of train_llama.py")
    return {"step": ckpt.step, "consumed_samples": content["consumed_samples"]}


def run_shape(metrics: Path, step_after: int) -> dict[str, int] | None:
    """The data-parallel size and global batch of the attempt that logged ``step_after`` (its
    ``start`` event), else of the last attempt that started; None where nothing says."""
    last = chosen = None
    try:
        with open(metrics, encoding="utf-8", errors="replace") as handle:
            lines = [line for line in handle if len(line) <= export_check.MAX_METRICS_LINE]
    except OSError:
        return None
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict) or event.get("phase") != "train":
            continue
        if event.get("event") == "start" and isinstance(event.get("data_parallel"), int):
            last = {"world_size": event["data_parallel"],
                    "global_batch_size": event.get("global_batch_size")}
        elif event.get("event") == "step" and event.get("step") == step_after and last:
            chosen = last
    return chosen or last


def converter_argv(converter: Path, model_dir: Path, out: Path, config: Path,
                   tp: int) -> list[str]:
    """NxD's converter, as REFERENCE.md and export.json say: the absolute ``model`` folder of the
    step, xser loading on (its ``type=bool`` flags take any value as true: the ones meant off
    are left out, --qkv_linear among them: this model's fused qkv_proj is not QKVLinear's)."""
    return [sys.executable, str(converter), "--convert_to_full_state",
            "--input_dir", str(model_dir.resolve()), "--output_dir", str(out),
            "--config", str(config), "--tp_size", str(tp), "--pp_size", "1", "--load_xser", "1"]


def convert(args: argparse.Namespace, ckpt: checkpoints.Checkpoint, config: Any,
            work: Path) -> Path:
    """Run NxD's converter on the step into ``work``; the full state's file, or one line."""
    converter = args.example_dir.resolve().parent / CONVERTER
    if not converter.is_file():
        raise PayloadError(f"--example-dir {args.example_dir}: its parent has no {CONVERTER} "
                           "(NxD's checkpoint converter of the example checkout)")
    model_dir = ckpt.path / "model"
    if not model_dir.is_dir():
        raise PayloadError(f"{model_dir}: no such folder: the step holds no model of NxD's")
    config_file = work / "config.json"   # the converter reads the head counts from it
    config.to_json_file(str(config_file))
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_USE_BF16", "XLA_DOWNCAST_BF16")}   # keep tensors as saved
    done = subprocess.run(converter_argv(converter, model_dir, work, config_file,
                                         args.tensor_parallel_size),
                          cwd=str(work), env=env, capture_output=True, text=True, check=False)
    out = work / OUTPUT
    if done.returncode != 0:
        tail = ((done.stderr or done.stdout).strip().splitlines() or ["no output"])[-1]
        raise PayloadError(f"{converter}: failed on {model_dir} (exit {done.returncode}): "
                           f"{tail[:300]}")
    if not out.is_file():
        raise PayloadError(f"{converter}: wrote no {OUTPUT} from {model_dir}")
    return out


def hf_config(args: argparse.Namespace) -> Any:
    """The recipe's LlamaConfig as train_llama.py reads it, without NxD's own attributes."""
    import transformers

    try:
        config = transformers.LlamaConfig.from_json_file(str(args.model_config))
    except (OSError, ValueError, TypeError) as exc:
        raise PayloadError(f"--model-config {args.model_config}: not a LlamaConfig "
                           f"({type(exc).__name__})") from None
    config.max_position_embeddings = max(config.max_position_embeddings, args.seq_length)
    for name in NXD_ONLY:
        if hasattr(config, name):
            delattr(config, name)
    return config


def load_model(config: Any, state_file: Path, source: Path) -> Any:
    """LlamaForCausalLM from the config, loading the converter's file strictly (a refusal
    names ``source``, the step's model folder: the file is a temporary one)."""
    import torch
    import transformers

    try:
        state = torch.load(str(state_file), map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:   # torch's unpickler raises several types
        raise PayloadError(f"{source}: the converter's {OUTPUT} is unreadable "
                           f"({type(exc).__name__})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor)
                                              for v in state.values()):
        raise PayloadError(f"{source}: the converter's {OUTPUT} is not a state dict of tensors")
    model = transformers.LlamaForCausalLM(config)
    export_hf.load_weights(model, state, source)
    return model


def export(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    setup.validate(args)
    import datasets
    import torch

    root = args.checkpoint_dir
    metrics = args.output_dir / "metrics.jsonl"
    ckpt = export_hf.sealed_step(root, args.step, metrics, PROG, complete=sealed(root),
                                 seal=f"NxD's {DONE} file", tag=nxd_tag)
    ckpt = checkpoints.Checkpoint(ckpt.path, ckpt.step, recorded(ckpt))
    config = hf_config(args)
    args.vocab_size = config.vocab_size
    tok = export_hf.run_tokenizer(args, wordpiece=False)
    data = datasets.load_from_disk(str(args.data_dir))
    missing = [c for c in ("input_ids", "labels") if c not in data.column_names]
    if missing:
        raise PayloadError(f"--data-dir {args.data_dir}: no {', '.join(missing)} column: not "
                           "the NxD example's tokenized blocks")
    shape = run_shape(metrics, ckpt.step + 1)
    consumed = ckpt.info["consumed_samples"]
    if shape is None and ckpt.step > 0 and consumed % ckpt.step == 0:
        per_rank = args.micro_batch_size * args.gradient_accumulation
        shape = {"world_size": consumed // ckpt.step // per_rank,
                 "global_batch_size": consumed // ckpt.step}
    if shape is None:
        raise PayloadError(f"{metrics}: no start event of the training pass says its "
                           "data-parallel size, and the checkpoint alone does not")
    columns = [c for c in COLUMNS if c in data.column_names]

    def rows(positions: list[int]) -> dict[str, Any]:
        picked = data[dataset_rows(positions, len(data))]
        return {c: torch.tensor(picked[c], dtype=torch.long) for c in columns}

    batches, total = export_hf.next_step_batches(dict(ckpt.info, **shape), args.micro_batch_size,
                                                 args.gradient_accumulation, rows,
                                                 args.micro_batches)
    try:
        logged = export_check.logged_loss(metrics, ckpt.step + 1)
    except export_check.Unproven:
        logged = None
    # The converter's full state goes beside the export (a 7B one is tens of GB), and goes.
    created = not args.export_root.exists()
    work = args.export_root / f".convert-step-{ckpt.step}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    published = False
    try:
        model = load_model(config, convert(args, ckpt, config, work), ckpt.path / "model")
        answer = export_hf.publish(model, tok, args.export_root, ckpt, batches, total, logged,
                                   "fp32" if args.precision == "fp32" else "bf16",
                                   {"trainer": "neuronx_distributed",
                                    "model_class": type(model).__name__,
                                    "trainer_precision": args.precision,
                                    "tensor_parallel_size": args.tensor_parallel_size,
                                    "converter": CONVERTER})
        published = True
        return answer
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if created and not published:
            try:
                args.export_root.rmdir()   # only where this export made it and left it empty
            except OSError:
                pass


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_sealed:   # the steps export() chooses from: NxD's done files
        return export_hf.list_sealed(lambda: sealed(args.checkpoint_dir), PROG, args.on_node)
    return export_hf.run(lambda: export(args), PROG, args.on_node)


if __name__ == "__main__":
    sys.exit(main())
