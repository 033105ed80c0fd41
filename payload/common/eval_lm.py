"""Score an exported step (``EXPORT_ROOT/step-N/``, export_hf.py) with lm-evaluation-harness.

Offline: the hub's variables are set before lm-eval, datasets or transformers load (unless
``--allow-hub``), so tasks read their data from the datasets cache the site names (``--hf-home``)
or from local files (``--tasks-dir``, lm-eval's include path). lm-eval's own code does the work:
its Hugging Face model class on the folder, ``simple_evaluate`` once per few-shot count. Writes
``--output`` (RUN/eval/step-N.json) as lm-eval's results JSON plus a ``jobgen`` entry with the
step and tokens from ``jobgen-export.json``, under a temporary name then renamed. Bad input is one
line, exit 2 (78 with ``--on-node``), nothing written.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

PROG = "eval-lm"
RECORD = "jobgen-export.json"
BATCH_FILE = "heldout-batch.safetensors"
PERMANENT_ON_NODE = 78
OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
CAUSAL_CLASSES = ("ForCausalLM", "LMHeadModel")
MAX_SHOTS = 64   # the recipe's eval.tasks.* limit says the same (jobgen/inputs/limits.py)


class EvalError(Exception):
    """Input the user can fix: the one line printed, exit 2 (78 on a node)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True, help="an exported step's folder")
    p.add_argument("--tasks", required=True,
                   help="lm-eval task, group or tag names, comma-separated; NAME=K gives NAME "
                        "K few-shot examples (default: --shots)")
    p.add_argument("--shots", type=int, default=None,
                   help="few-shot examples where a task names none (default: the task's own)")
    p.add_argument("--output", type=Path, required=True,
                   help="the results file (RUN/eval/step-N.json)")
    p.add_argument("--tasks-dir", type=Path, default=None,
                   help="a folder of task YAMLs (lm-eval's include path): the site's own tasks")
    p.add_argument("--hf-home", type=Path, default=None,
                   help="HF_HOME for this run: where the datasets cache the tasks read lies")
    p.add_argument("--allow-hub", action="store_true",
                   help="leave the hub's offline variables as they are (the site allows access)")
    p.add_argument("--batch-size", default="1", help="lm-eval's batch size (a number, or auto)")
    p.add_argument("--device", default=None, help="default: cuda where there is one, else cpu")
    p.add_argument("--dtype", default="auto", help="the weights' dtype in memory (auto: config's)")
    p.add_argument("--limit", type=int, default=None,
                   help="score only the first N documents of each task (a rehearsal)")
    p.add_argument("--seed", type=int, default=1234, help="lm-eval's few-shot and sampling seed")
    p.add_argument("--on-node", action="store_true",
                   help="a permanent failure exits 78 (a node's code: no retry cures it)")
    return p.parse_args(argv)


def task_shots(text: str, default: int | None) -> dict[str, int | None]:
    """``a=5,b,c=0`` as {task: shots}; a name without ``=K`` takes ``default``."""
    out: dict[str, int | None] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, count = item.partition("=")
        shots: int | None = default
        if sep:
            try:
                shots = int(count)
            except ValueError:
                raise EvalError(f"--tasks: {item}: the few-shot count must be a whole "
                                "number") from None
        if shots is not None and not 0 <= shots <= MAX_SHOTS:
            raise EvalError(f"--tasks: {name}: {shots} few-shot examples; must lie in "
                            f"[0, {MAX_SHOTS}]")
        out[name.strip()] = shots
    if not out:
        raise EvalError("--tasks: names no task")
    return out


def exported(model: Path) -> dict[str, Any]:
    """What the folder holds: its config's model type, and the step and tokens from its record;
    refused in one line where it is not an export, or not a causal language model."""
    if not model.is_dir():
        raise EvalError(f"--model {model}: no such folder")
    try:
        config = json.loads((model / "config.json").read_text(encoding="utf-8"))
        model_type = str(config["model_type"])
    except (OSError, ValueError, KeyError, TypeError):
        raise EvalError(f"{model / 'config.json'}: missing or unreadable: not a Hugging Face "
                        "model folder") from None
    try:
        record = json.loads((model / RECORD).read_text(encoding="utf-8"))
        step, consumed = int(record["step"]), int(record["consumed_samples"])
    except (OSError, ValueError, KeyError, TypeError):
        raise EvalError(f"{model / RECORD}: missing or unreadable (no step and consumed "
                        "samples): not a folder jobgen's export wrote") from None
    # The class the export saved, named as transformers names its causal heads (the model type
    # alone does not tell: a BERT config also has a causal class, BertLMHeadModel).
    classes = [str(a) for a in config.get("architectures") or []]
    if not any(c.endswith(CAUSAL_CLASSES) for c in classes):
        arch = ", ".join(classes) or "no architectures in its config"
        raise EvalError(f"{model}: a {model_type} model ({arch}), not a causal language model: "
                        "lm-eval's tasks score a continuation's log-likelihood given its "
                        "context, which an encoder does not compute; not evaluated (its "
                        f"masked-LM loss on the run's data is the proof in {RECORD})")
    tokens = record.get("tokens")
    if tokens is None:
        tokens = consumed * _sequence_length(model)
    proof = record.get("proof") or {}
    return {"step": step, "consumed_samples": consumed, "tokens": int(tokens),
            "model": str(model.resolve()), "model_type": model_type,
            "model_class": record.get("model_class"), "trainer": record.get("trainer"),
            "proven": proof.get("ok")}


def _sequence_length(model: Path) -> int:
    """The trained sequence length: the held-out batch's rows (the run's own micro-batches)."""
    from safetensors import safe_open

    path = model / BATCH_FILE
    try:
        with safe_open(str(path), framework="pt") as batch:
            shapes = [batch.get_slice(k).get_shape() for k in batch.keys()
                      if k.endswith(".input_ids")]
    except (OSError, ValueError, RuntimeError):
        shapes = []
    if not shapes or len(shapes[0]) != 2:
        raise EvalError(f"{path}: missing or unreadable: the tokens trained cannot be told "
                        f"(consumed samples x sequence length; {RECORD} has no tokens)")
    return int(shapes[0][1])


def task_manager(tasks_dir: Path | None, names: list[str]) -> Any:
    """lm-eval's index of its tasks and the site's; every name must be one of them."""
    from lm_eval.tasks import TaskManager

    if tasks_dir is not None and not tasks_dir.is_dir():
        raise EvalError(f"--tasks-dir {tasks_dir}: no such folder")
    if tasks_dir is not None:   # the site's tasks alone first: indexing lm-eval's takes ~10 s
        manager = TaskManager(include_path=str(tasks_dir), include_defaults=False)
        if set(names) <= set(manager.all_tasks):
            return manager
    manager = TaskManager(include_path=str(tasks_dir) if tasks_dir else None)
    known = set(manager.all_tasks)
    missing = [n for n in names if n not in known]
    if missing:
        import importlib.metadata

        where = f" or in --tasks-dir {tasks_dir}" if tasks_dir else ""
        raise EvalError(f"--tasks: {', '.join(missing)}: no such task, group or tag in lm-eval "
                        f"{importlib.metadata.version('lm_eval')}'s tasks{where}")
    return manager


MERGED = ("results", "groups", "group_subtasks", "configs", "versions", "n-shot",
          "higher_is_better", "n-samples")


def evaluate(args: argparse.Namespace, shots: dict[str, int | None],
             info: dict[str, Any]) -> dict[str, Any]:
    """lm-eval on the folder: one model, one simple_evaluate per few-shot count, merged."""
    import lm_eval
    import torch
    from lm_eval.models.huggingface import HFLM

    manager = task_manager(args.tasks_dir, list(shots))
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    batch = args.batch_size if args.batch_size == "auto" else int(args.batch_size)
    lm = HFLM(pretrained=str(args.model), backend="causal", device=device, dtype=args.dtype,
              batch_size=batch, trust_remote_code=False)
    groups: dict[int | None, list[str]] = {}
    for name, count in shots.items():
        groups.setdefault(count, []).append(name)
    merged: dict[str, Any] = {}
    started = time.monotonic()
    for count in sorted(groups, key=lambda c: -1 if c is None else c):
        try:
            out = lm_eval.simple_evaluate(
                model=lm, tasks=groups[count], num_fewshot=count, task_manager=manager,
                limit=args.limit, log_samples=False, random_seed=args.seed,
                numpy_random_seed=args.seed, torch_random_seed=args.seed,
                fewshot_random_seed=args.seed)
        except (OSError, ValueError, KeyError) as exc:   # data not in the cache, offline
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise EvalError(f"lm-eval on {', '.join(groups[count])}: {first}") from None
        if out is None:
            raise EvalError("lm-eval returned no results (not the first rank?)")
        out.pop("samples", None)
        for key, value in out.items():
            if key in MERGED and isinstance(value, dict):
                merged.setdefault(key, {}).update(value)
            else:
                merged.setdefault(key, value)
    merged["jobgen"] = dict(info, tasks=shots, device=device, limit=args.limit,
                            evaluation_seconds=round(time.monotonic() - started, 3))
    return merged


def write(output: Path, body: dict[str, Any]) -> None:
    """The results file, whole or not at all: a temporary name beside it, then renamed."""
    from lm_eval.utils import handle_non_serializable

    text = json.dumps(body, indent=2, default=handle_non_serializable, ensure_ascii=False)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, output)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def summary(body: dict[str, Any]) -> str:
    """The headline numbers: each task's first metric."""
    parts = []
    for task, metrics in sorted(body.get("results", {}).items()):
        for key, value in metrics.items():
            if "," in key and "stderr" not in key and isinstance(value, (int, float)):
                parts.append(f"{task} {key.split(',')[0]} {value:.4g}")
                break
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    failed = PERMANENT_ON_NODE if args.on_node else 2
    if not args.allow_hub:
        os.environ.update({name: "1" for name in OFFLINE})
    if args.hf_home is not None:
        os.environ["HF_HOME"] = str(args.hf_home)
    try:
        shots = task_shots(args.tasks, args.shots)
        if args.shots is not None and not 0 <= args.shots <= MAX_SHOTS:
            raise EvalError(f"--shots must lie in [0, {MAX_SHOTS}]")
        if args.batch_size != "auto" and not (args.batch_size.isdigit()
                                              and int(args.batch_size) >= 1):
            raise EvalError(f"--batch-size {args.batch_size}: a number of at least 1, or auto")
        if args.limit is not None and args.limit < 1:
            raise EvalError("--limit must be at least 1")
        if args.output.is_dir():
            raise EvalError(f"--output {args.output}: is a folder; name the results file")
        info = exported(args.model)
        body = evaluate(args, shots, info)
        write(args.output, body)
    except EvalError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return failed
    except OSError as exc:
        print(f"{PROG}: error: {exc.filename or args.output}: {exc.strerror or exc}",
              file=sys.stderr)
        return failed
    print(f"{PROG}: {args.output}: step {info['step']}, {info['tokens']} tokens: "
          f"{summary(body)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
