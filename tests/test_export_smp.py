"""payload/smp_fsdp/export_smp.py: a sealed step of the SMP program, trained with tensor parallel
2 x hybrid shard 2 on four CPU ranks (the torch.sagemaker stand-in, tests/test_smp_fsdp.py),
merged by torch's DCP reader, exported as LlamaForCausalLM and proven against the logged loss;
a TP slice left out fails the proof."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from tests.test_smp_fsdp import ROOT, STAND_INS, TINY  # noqa: E402

EXPORT = ROOT / "payload" / "smp_fsdp" / "export_smp.py"
# The stand-in's MLP is split over TP ranks (the rest replicated); the byte-level BPE tokenizer
# of --tokenizer-seed needs more than 256 ids.
FLAGS = [*TINY, "--vocab-size", "512", "--gradient-accumulation", "2", "--max-steps", "5",
         "--checkpoint-every", "2", "--precision", "fp32", "--tensor-parallel", "2",
         "--hybrid-shard", "2"]
LOAD_ALONE = """
import sys, torch, transformers
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])
tok = transformers.AutoTokenizer.from_pretrained(sys.argv[1])
ids = torch.tensor([tok("the quick brown fox")["input_ids"]])
print(type(model).__name__, tuple(model.model.layers[0].mlp.gate_proj.weight.shape),
      model(input_ids=ids).logits.shape[-1])
print(sorted(m for m in sys.modules if m.split(".")[0] in ("jobgen", "common", "smp_fsdp")))
"""


@pytest.mark.slow   # four torchrun ranks train, then two exports with their proofs
def test_a_tp2_step_exports_loads_alone_is_proven_and_a_missing_slice_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    trained = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
         str(STAND_INS / "smp_scenarios.py"), "run", str(tmp_path), *FLAGS,
         "--output-dir", str(run)],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=600, check=False)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert {p.name for p in (run / "checkpoints" / "step_00000004").iterdir()} >= {
        "tp2-0", "tp2-1"}

    own = ["--output-dir", str(run), "--tokenizer-seed", "3"]
    done = subprocess.run([sys.executable, str(EXPORT), *FLAGS, *own,
                           "--export-root", str(tmp_path / "export")],
                          capture_output=True, text=True, timeout=300, check=False)
    folder = tmp_path / "export" / "step-4"   # 5 is the newest: no step 6 to prove it with
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith(
        f"smp-export: {folder}: exported and proven: loss ")
    record = json.loads((folder / "jobgen-export.json").read_text())
    assert (record["tensor_parallel"], record["smp"], record["model_class"]) == (
        2, True, "LlamaForCausalLM")
    assert record["proof"]["ok"] and record["proof"]["micro_batches_in_step"] == 4
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
              if '"event": "step"' in line]
    assert record["proof"]["logged_loss"] == next(e["loss"] for e in logged if e["step"] == 5)

    alone = subprocess.run([sys.executable, "-I", "-c", LOAD_ALONE, str(folder)],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           check=False)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.splitlines()[-2:] == ["LlamaForCausalLM (128, 64) 512", "[]"]

    # The same export with one TP slice left out: TP rank 1's part of a layer's down projection
    # replaced by rank 0's (the shapes still fit), in process, so the merge can be broken.
    monkeypatch.syspath_prepend(str(ROOT / "payload" / "smp_fsdp"))
    import export_smp
    from common import export_check

    joined = export_smp.join_slices

    def left_out(parts: list[dict[str, Any]], shapes: Any, source: Path) -> Any:
        name = "model.layers.1.mlp.down_proj.weight"
        parts[1] = dict(parts[1], **{name: parts[0][name]})
        return joined(parts, shapes, source)

    monkeypatch.setattr(export_smp, "join_slices", left_out)
    args = export_smp.parse_args([*FLAGS, *own, "--export-root", str(tmp_path / "broken"),
                                  "--step", "4"])
    with pytest.raises(export_check.Mismatch) as failed:
        export_smp.export(args)
    assert "the exported model's loss " in str(failed.value)
    assert f"differs from the trainer's {record['proof']['logged_loss']:.6g} " in str(failed.value)
    assert not (tmp_path / "broken").exists() or not any((tmp_path / "broken").iterdir())
