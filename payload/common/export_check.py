"""The proof of an export: the exported model's loss on the run's own data against the trainer's.

A checkpoint of step N holds the weights the trainer computed step N+1's loss with, on the
batch of step N+1 (every rank's micro-batches; positions from the consumed-sample count). So the
exported folder's mean loss over those micro-batches, computed in a fresh process with
``transformers`` alone (export_loss.py), must equal the ``step`` event the trainer logged for
step N+1 (metrics.jsonl), up to the arithmetic the two computations do not share:

- fp32: relative 1e-4. Same weights, same inputs, same kernels' formulas; what differs is the
  order of reductions (ranks and micro-batches summed in another order, another thread count):
  float32's epsilon is 1.2e-7 and a loss is a mean over ~1e3-1e6 terms, so reordering moves it by
  ~1e-6 relative. 1e-4 leaves two orders of headroom; a swapped layer or a transposed matrix
  moves a trained model's loss by percents or more (tests/test_export.py measures it).
- bf16: relative 2e-2. The trainer ran its forward in bfloat16 (8 bits of mantissa: a rounding
  step of 2^-8 = 0.4 % relative), and logged a bf16 loss (a value of 4-8 is rounded to 1/32);
  the proof runs the fp32 master weights in fp32. Five rounding steps of headroom.

With ``--micro-batches M`` (a run whose whole step is too large to recompute where the export
runs), only the first M micro-batches are used, and the tolerance adds a sampling term: three
standard errors of their mean as an estimate of all T (``3 s / sqrt(M) * sqrt(1 - M/T)``, s the
spread of the M losses measured).

``export_check.py node|cli MODEL_DIR`` re-proves a folder an export wrote (its record
``jobgen-export.json`` and its held-out batch): exit 0 when it matches, 2 at the command line and
78 on a node when it does not (with both numbers) or the folder holds no export's record.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}
RECORD = "jobgen-export.json"
BATCH_FILE = "heldout-batch.safetensors"
LOSS_PROGRAM = Path(__file__).resolve().with_name("export_loss.py")
MAX_METRICS_LINE = 1 << 20


class Mismatch(Exception):
    """The exported model does not compute the trainer's loss: the line the user reads."""


class Unproven(Exception):
    """Nothing to compare with (no logged step after the checkpoint's): the line to read."""


def logged_loss(metrics: Path, step: int) -> float:
    """The loss the trainer logged for ``step`` of the training pass (the last such event: a
    step trained again after a restart from the same checkpoint logs the same number)."""
    found: float | None = None
    try:
        with open(metrics, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if len(line) > MAX_METRICS_LINE or not line.startswith('{"event": "step"'):
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                loss = event.get("loss")
                if (event.get("phase") == "train" and event.get("step") == step
                        and isinstance(loss, (int, float)) and math.isfinite(loss)):
                    found = float(loss)
    except OSError as exc:
        raise Unproven(f"{metrics}: the trainer's events cannot be read ({exc.strerror})") from None
    if found is None:
        raise Unproven(f"{metrics}: no loss logged for step {step} (the step after the "
                       "checkpoint's, trained from its weights): nothing to compare with")
    return found


def logged_steps(metrics: Path) -> set[int]:
    """The training pass's steps with a finite loss logged (those an export's proof can use:
    a checkpoint of step N is provable where N+1 is one); none where the file is unreadable."""
    try:
        with open(metrics, encoding="utf-8", errors="replace") as handle:
            lines = [line for line in handle if len(line) <= MAX_METRICS_LINE
                     and line.startswith('{"event": "step"')]
    except OSError:
        return set()
    found = set()
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        loss, step = event.get("loss"), event.get("step")
        if (event.get("phase") == "train" and isinstance(step, int)
                and isinstance(loss, (int, float)) and math.isfinite(loss)):
            found.add(step)
    return found


def write_batches(path: Path, batches: list[dict[str, Any]]) -> None:
    """The held-out micro-batches, as export_loss.py reads them."""
    from safetensors.torch import save_file

    flat = {f"{index}.{name}": tensor.contiguous().clone()
            for index, batch in enumerate(batches) for name, tensor in batch.items()}
    save_file(flat, str(path))


def measure(model_dir: Path, batches: Path) -> dict[str, Any]:
    """export_loss.py's answer, run isolated in a fresh interpreter (the job's own)."""
    result = subprocess.run([sys.executable, "-I", str(LOSS_PROGRAM), str(model_dir),
                             str(batches)], capture_output=True, text=True, check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise Mismatch(f"{model_dir}: transformers cannot load or run it: {tail}")
    answer: dict[str, Any] = json.loads(lines[-1])
    if answer["ours_loaded"]:
        raise Mismatch(f"{model_dir}: loading it imported jobgen's own modules "
                       f"({', '.join(answer['ours_loaded'])})")
    return answer


def judge(losses: list[float], total: int, logged: float, precision: str) -> dict[str, Any]:
    """The verdict: the measured mean against the logged loss, within the stated tolerance."""
    used = len(losses)
    measured = sum(losses) / used
    allowed = TOLERANCE[precision] * abs(logged)
    if used < total:
        spread = math.sqrt(sum((x - measured) ** 2 for x in losses) / max(1, used - 1))
        allowed += 3 * spread / math.sqrt(used) * math.sqrt(1 - used / total)
    verdict = {"logged_loss": logged, "measured_loss": measured, "precision": precision,
               "relative_tolerance": TOLERANCE[precision], "allowed": allowed,
               "micro_batches": used, "micro_batches_in_step": total,
               "ok": abs(measured - logged) <= allowed}
    return verdict


def prove(model_dir: Path, logged: float, precision: str, total: int,
          shown: Path | None = None) -> dict[str, Any]:
    """Measure the folder (its held-out batch) and judge; raises Mismatch with both numbers,
    naming the folder as ``shown`` (a folder still under its temporary name: its final one)."""
    try:
        answer = measure(model_dir, model_dir / BATCH_FILE)
    except Mismatch as exc:
        raise Mismatch(str(exc).replace(str(model_dir), str(shown or model_dir), 1)) from None
    verdict = judge(answer["losses"], total, logged, precision)
    verdict["model_class"] = answer["class"]
    if not verdict["ok"]:
        raise Mismatch(f"{shown or model_dir}: the exported model's loss "
                       f"{verdict['measured_loss']:.6g} differs from the trainer's {logged:.6g} "
                       f"at that step by more than {verdict['allowed']:.3g} ({precision})")
    return verdict


def main(argv: list[str]) -> int:
    mode = argv[1] if len(argv) > 1 else ""
    if mode not in ("node", "cli") or len(argv) != 3:
        print("usage: export_check.py node|cli MODEL_DIR", file=sys.stderr)
        return 2
    folder = Path(argv[2])
    try:
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
        proof = record["proof"]
        logged, precision = float(proof["logged_loss"]), str(proof["precision"])
        total = int(proof["micro_batches_in_step"])
    except (OSError, ValueError, KeyError, TypeError):
        print(f"export_check: {folder / RECORD}: not an export's record with a proof "
              "(proof.logged_loss, proof.precision)", file=sys.stderr)
        return 78 if mode == "node" else 2
    try:
        verdict = prove(folder, logged, precision, total)
    except Mismatch as exc:
        print(f"export_check: {exc}", file=sys.stderr)
        return 78 if mode == "node" else 2
    print(f"export_check: {folder}: loss {verdict['measured_loss']:.6g} against the trainer's "
          f"{logged:.6g} ({precision}, within {verdict['allowed']:.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
