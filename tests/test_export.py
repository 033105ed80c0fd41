"""The export programs (payload/smoke/export_smoke.py, payload/habana_deepspeed/export_bert.py)
and their proof (payload/common/export_check.py), on checkpoints the real trainers wrote."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import need

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = ROOT / "payload"
SMOKE_TRAIN = PAYLOAD / "smoke" / "train.py"
SMOKE_EXPORT = PAYLOAD / "smoke" / "export_smoke.py"
CHECK = PAYLOAD / "common" / "export_check.py"

SMOKE = ["--max-steps", "12", "--checkpoint-every", "4", "--sync-save", "--seed", "3"]


def run(program: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A payload program as the job runs it: the job's interpreter, by path, in its folder."""
    return subprocess.run([sys.executable, str(program), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, check=False)


def byte_level_tokenizer(folder: Path) -> Path:
    """A GPT-2-style byte-level BPE trained here (no hub), saved as transformers saves one."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([f"the quick brown fox jumps over the lazy dog {i}"
                             for i in range(200)], vocab_size=300,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>").save_pretrained(
        str(folder))
    return folder


def smoke_run(folder: Path, family: str) -> Path:
    need("torch", "transformers", "tokenizers", "safetensors")
    out = folder / "run"
    result = run(SMOKE_TRAIN, "--family", family, *SMOKE, "--output-dir", str(out), cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    byte_level_tokenizer(folder / "tokenizer")
    return folder


@pytest.fixture(scope="module")
def neox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return smoke_run(tmp_path_factory.mktemp("neox"), "gpt_neox")


def export(folder: Path, *extra: str, family: str = "gpt_neox",
           root: str = "export") -> subprocess.CompletedProcess[str]:
    return run(SMOKE_EXPORT, "--family", family, *SMOKE, "--output-dir", str(folder / "run"),
               "--tokenizer", str(folder / "tokenizer"), "--export-root", str(folder / root),
               *extra, cwd=folder)


def record(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "jobgen-export.json").read_text())


def logged(metrics: Path, step: int) -> float:
    return [e["loss"] for e in map(json.loads, metrics.read_text().splitlines())
            if e["event"] == "step" and e["step"] == step][-1]


LOAD_ALONE = """
import sys, torch, transformers
folder = sys.argv[1]
model = transformers.AutoModelForCausalLM.from_pretrained(folder)
tok = transformers.AutoTokenizer.from_pretrained(folder)
ids = torch.tensor([tok("the quick brown fox")["input_ids"]])
print(type(model).__name__, tuple(model(input_ids=ids).logits.shape))
print(sorted(m for m in sys.modules if m.split(".")[0] in ("jobgen", "common", "smoke")))
"""


@pytest.mark.slow   # trains a smoke run first (the neox fixture): the full tier runs it
def test_a_smoke_step_exports_loads_with_transformers_alone_and_is_proven(neox: Path) -> None:
    import torch
    from transformers import GPTNeoXForCausalLM

    result = export(neox, "--step", "8", root="proven")
    assert result.returncode == 0, result.stderr
    folder = neox / "proven" / "step-8"
    # The last line: DeepSpeed, imported by transformers where accelerate is installed, may
    # print its accelerator warning on stdout first.
    assert result.stdout.splitlines()[-1].startswith(
        f"smoke-export: {folder}: exported and proven: loss ")
    assert sorted(p.name for p in (neox / "proven").iterdir()) == ["step-8"]   # no temporary
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "jobgen-export.json",
            "heldout-batch.safetensors"} <= names
    umask = os.umask(0)
    os.umask(umask)
    assert {(p.stat().st_mode & 0o777) for p in folder.iterdir()} == {0o666 & ~umask}
    # The weights are the checkpoint's, bit for bit, as transformers loads them back.
    state = torch.load(neox / "run/checkpoints/step_00000008/state.pt", weights_only=True)
    loaded = GPTNeoXForCausalLM.from_pretrained(str(folder)).state_dict()
    assert loaded.keys() == state["model"].keys()
    assert all(torch.equal(loaded[k], state["model"][k]) for k in loaded)
    # The proof: the loss of step 9, which the trainer computed from step 8's weights.
    proof = record(folder)["proof"]
    assert proof["ok"] is True and proof["precision"] == "fp32"
    assert proof["logged_loss"] == logged(neox / "run" / "metrics.jsonl", 9)
    assert abs(proof["measured_loss"] - proof["logged_loss"]) <= 1e-4 * proof["logged_loss"]
    assert (record(folder)["step"], record(folder)["consumed_samples"]) == (8, 32)
    # Anyone can load it: an isolated interpreter, transformers only.
    alone = subprocess.run([sys.executable, "-I", "-c", LOAD_ALONE, str(folder)], cwd=neox,
                           capture_output=True, text=True, timeout=300, check=False)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.splitlines()[-2:] == ["GPTNeoXForCausalLM (1, 4, 512)", "[]"]
    # Re-proven from the folder alone.
    again = run(CHECK, "cli", str(folder), cwd=neox)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"export_check: {folder}: loss ")


@pytest.mark.slow   # trains a smoke run first (the neox fixture): the full tier runs it
def test_the_newest_step_is_published_unproven_when_no_later_step_was_logged(
        neox: Path) -> None:
    result = export(neox, "--step", "12", root="newest")   # named: the default is provable
    folder = neox / "newest" / "step-12"
    assert (result.returncode, result.stderr) == (3, "")
    # (the last line: accelerate, where installed, has DeepSpeed print its accelerator first)
    assert result.stdout.splitlines()[-1] == (f"smoke-export: {folder}: exported, unproven: the "
                                              "trainer logged no step 13, the step trained from "
                                              "these weights")
    assert record(folder)["proof"]["ok"] is None


def _broken(source: Path, target: Path, how: str) -> None:
    """A copy of an exported folder whose weights were mapped wrong in one way."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    weights = load_file(str(target / "model.safetensors"))
    if how == "swap layers":
        for key in [k for k in weights if k.startswith("gpt_neox.layers.0.")]:
            other = key.replace("layers.0.", "layers.1.")
            weights[key], weights[other] = weights[other], weights[key]
    else:   # one square matrix transposed
        key = "gpt_neox.layers.1.attention.dense.weight"
        weights[key] = weights[key].t().contiguous()
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.slow   # trains a smoke run first (the neox fixture): the full tier runs it
@pytest.mark.parametrize("how", ["swap layers", "transpose"])
def test_a_broken_mapping_fails_the_proof_with_both_numbers(neox: Path, tmp_path: Path,
                                                            how: str) -> None:
    good = neox / "proven" / "step-8"
    if not good.is_dir():
        assert export(neox, "--step", "8", root="proven").returncode == 0
    broken = tmp_path / "broken"
    _broken(good, broken, how)
    proof = record(good)["proof"]
    for mode, code in (("cli", 2), ("node", 78)):
        result = run(CHECK, mode, str(broken), cwd=tmp_path)
        assert (result.returncode, result.stdout) == (code, ""), result.stderr
        line = result.stderr.strip()
        assert "\n" not in line
        assert line.startswith(f"export_check: {broken}: the exported model's loss ")
        assert f"from the trainer's {proof['logged_loss']:.6g} at that step by more than" in line
        measured = float(line.split("loss ")[1].split()[0])
        print(f"{how}: {measured} against {proof['logged_loss']} (allowed "
              f"{proof['allowed']:.3g})")
        assert abs(measured - proof["logged_loss"]) > 3 * proof["allowed"]


def _no_checkpoint(folder: Path) -> tuple[list[str], str]:
    (folder / "empty").mkdir()
    return (["--output-dir", str(folder / "empty")],
            f"{folder / 'empty' / 'checkpoints'}: no complete checkpoint (none sealed with "
            "COMPLETE and every node's part)")


def _unsealed(folder: Path) -> tuple[list[str], str]:
    run_dir = folder / "unsealed"
    shutil.copytree(folder / "run", run_dir)
    (run_dir / "checkpoints" / "step_00000008" / "COMPLETE").unlink()   # still being written
    return (["--output-dir", str(run_dir), "--step", "8"],
            f"{run_dir / 'checkpoints' / 'step_00000008'}: step 8 is not complete (not sealed: "
            "being written, or its save failed); complete: 4, 12")


def _other_family(folder: Path) -> tuple[list[str], str]:
    return (["--family", "llama"],
            f"{folder / 'run/checkpoints/step_00000008/state.pt'}: holds another model: a "
            "gpt_neox model, the flags say --family llama")


def _other_shape(folder: Path) -> tuple[list[str], str]:
    return (["--num-layers", "3"],
            f"{folder / 'run/checkpoints/step_00000008/state.pt'}: holds another model than the "
            "flags describe (missing gpt_neox.layers.2.attention.dense.bias, "
            "gpt_neox.layers.2.attention.dense.weight, "
            "gpt_neox.layers.2.attention.query_key_value.bias ...)")


def _missing_tokenizer(folder: Path) -> tuple[list[str], str]:
    return (["--tokenizer", str(folder / "nowhere")], f"--tokenizer {folder / 'nowhere'}: "
            "no such folder")


def _not_a_tokenizer(folder: Path) -> tuple[list[str], str]:
    (folder / "notok").mkdir(exist_ok=True)
    (folder / "notok" / "README").write_text("no tokenizer here\n")
    return (["--tokenizer", str(folder / "notok")], f"--tokenizer {folder / 'notok'}: not a "
            "tokenizer transformers loads (")


def _bigger_tokenizer(folder: Path) -> tuple[list[str], str]:
    big = bert_tokenizer(folder / "bigtok", size=700)
    return (["--tokenizer", str(big)], f"--tokenizer {big}: 700 tokens, more than the "
            "model's vocabulary of 512: another model's tokenizer")


@pytest.mark.parametrize("case", [_no_checkpoint, _unsealed, _other_family, _other_shape,
                                  _missing_tokenizer, _not_a_tokenizer, _bigger_tokenizer])
@pytest.mark.slow   # trains a smoke run first (the neox fixture): the full tier runs it
def test_bad_input_is_one_line_exit_2_and_nothing_written(neox: Path, case: Any) -> None:
    extra, message = case(neox)
    root = f"bad-{case.__name__}"
    result = export(neox, *extra, root=root)   # a flag given again: the last one counts
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"smoke-export: error: {message}")
    assert not (neox / root).exists() or not any((neox / root).iterdir())


@pytest.mark.slow   # trains a smoke run first (the neox fixture): the full tier runs it
def test_on_a_node_a_refusal_exits_78_and_an_existing_export_is_kept(neox: Path) -> None:
    first = export(neox, "--step", "4", root="twice")
    assert first.returncode == 0, first.stderr
    before = (neox / "twice" / "step-4" / "model.safetensors").read_bytes()
    again = export(neox, "--step", "4", "--on-node", root="twice")
    assert again.returncode == 78
    assert again.stderr == (f"smoke-export: error: {neox / 'twice' / 'step-4'}: already exists "
                            "(an earlier export of step 4)\n")
    assert (neox / "twice" / "step-4" / "model.safetensors").read_bytes() == before


@pytest.mark.slow   # a second training run: the full tier runs it
def test_a_llama_step_exports_and_is_proven(tmp_path: Path) -> None:
    folder = smoke_run(tmp_path, "llama")
    result = export(folder, "--step", "4", family="llama")
    assert result.returncode == 0, result.stderr
    out = record(folder / "export" / "step-4")
    assert (out["model_class"], out["proof"]["ok"]) == ("LlamaForCausalLM", True)
    assert json.loads((folder / "export/step-4/config.json").read_text())["architectures"] == [
        "LlamaForCausalLM"]


# ---------------------------------------------------------------------------------- DeepSpeed

BERT_EXPORT = PAYLOAD / "habana_deepspeed" / "export_bert.py"
BERT = ["--num-layers", "2", "--hidden-size", "64", "--num-heads", "4",
        "--intermediate-size", "256", "--vocab-size", "1000", "--seq-length", "32",
        "--max-predictions", "5", "--micro-batch-size", "2", "--gradient-accumulation", "2",
        "--lr", "1e-3", "--max-steps", "6", "--optimizer", "adamw", "--zero-stage", "1",
        "--seed", "5", "--checkpoint-every", "2", "--keep-checkpoints", "3",
        "--hidden-dropout", "0", "--attention-dropout", "0"]


def bert_tokenizer(folder: Path, size: int = 1000) -> Path:
    """A WordPiece vocabulary of ``size`` ids ([PAD] [CLS] [SEP] [MASK] first, as the tiny
    shards number them)."""
    from transformers import BertTokenizer

    folder.mkdir()
    words = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"] + [f"w{i}" for i in range(size - 5)]
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    # transformers 5 reads the file given as ``vocab`` (``vocab_file`` is ignored there).
    tok = BertTokenizer(vocab=str(folder / "vocab.txt"))
    assert len(tok) == size and tok("w0 w1")["input_ids"] == [1, 5, 6, 2]
    tok.save_pretrained(str(folder))
    return folder


@pytest.mark.deepspeed
@pytest.mark.slow
def test_a_zero1_bert_step_exports_and_is_proven_and_bert1p5b_wiring_is_caught(
        tmp_path: Path) -> None:
    need("torch", "deepspeed", "transformers", "h5py", "safetensors")
    from test_payload_habana_deepspeed import launch, make_shards

    shards = make_shards(tmp_path / "shards")
    tok = bert_tokenizer(tmp_path / "tokenizer")
    # bf16's tolerance is the fast test_the_tolerance_per_precision_and_the_sampling_term's.
    runs = {"fp32": ["--precision", "fp32"],
            "large": ["--precision", "fp32", "--layer-norm-large-model"]}
    flags = {name: BERT + extra + ["--input-dir", str(shards),
                                   "--output-dir", str(tmp_path / name)]
             for name, extra in runs.items()}
    for name in runs:   # two ranks, ZeRO-1, as the job runs them
        assert launch(flags[name] + ["--phase", "train"], tmp_path).returncode == 0, name

    def export(name: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return run(BERT_EXPORT, *flags[name], "--tokenizer", str(tok), "--export-root",
                   str(tmp_path / f"export-{name}"), "--step", "4", *extra, cwd=tmp_path)

    for name in ("fp32",):
        result = export(name)
        assert result.returncode == 0, result.stderr
        proof = record(tmp_path / f"export-{name}" / "step-4")["proof"]
        assert proof["logged_loss"] == logged(tmp_path / name / "metrics.jsonl", 5)
        assert (proof["ok"], proof["precision"], proof["micro_batches"]) == (True, name, 4)
        print(f"{name}: measured {proof['measured_loss']:.6f} logged {proof['logged_loss']:.6f}")
    # fp32: DeepSpeed's merge of the two ranks' partitions gives the trainer's loss exactly.
    fp32 = record(tmp_path / "export-fp32" / "step-4")["proof"]
    assert abs(fp32["measured_loss"] - fp32["logged_loss"]) <= 1e-6 * fp32["logged_loss"]

    # bert1.5b's wiring: refused in one line ...
    refused = export("large")
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == ("bert-export: error: --layer-norm-large-model: this LayerNorm "
                              "placement (bert1.5b's) has no Hugging Face BertConfig; stock "
                              "BertForPreTraining would load the weights and compute another "
                              "function, so it is not exported\n")
    # ... and exported as stock BERT anyway (the flag left out), the proof catches it.
    flags["large"].remove("--layer-norm-large-model")
    caught = export("large")
    assert (caught.returncode, caught.stdout) == (2, ""), caught.stderr
    line = caught.stderr.strip().splitlines()[-1]
    assert line.startswith(f"bert-export: error: {tmp_path / 'export-large' / 'step-4'}: "
                           "the exported model's loss ")
    assert not (tmp_path / "export-large").exists() or not any(
        (tmp_path / "export-large").iterdir())

    # Another model's checkpoint: one line, nothing written.
    other = export("fp32", "--hidden-size", "32", "--export-root", str(tmp_path / "other"))
    assert (other.returncode, other.stdout) == (2, "")
    assert other.stderr.startswith(f"bert-export: error: {tmp_path / 'fp32/checkpoints'}"
                                   "/step_00000004: holds another model than the flags "
                                   "describe (of another shape ")
    assert not (tmp_path / "other").exists() or not any((tmp_path / "other").iterdir())


# ---------------------------------------------------------------------------------- the judge

def _export_check() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("payload_export_check", CHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_logged_loss_is_the_training_pass_step_after_the_checkpoint(tmp_path: Path) -> None:
    check = _export_check()
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join([
        '{"event": "step", "phase": "compile", "step": 5, "loss": 1.0}',
        '{"event": "step", "phase": "train", "step": 5, "loss": 2.0}',
        '{"event": "step", "phase": "train", "step": 5, "loss": 2.5',        # cut short
        '{"event": "step", "phase": "train", "step": 5, "loss": null}',      # NaN, as logged
        '{"event": "step", "phase": "train", "step": 5, "loss": 3.0}',       # trained again
        '{"event": "step", "phase": "train", "step": 6, "loss": 4.0}']) + "\n")
    assert check.logged_loss(metrics, 5) == 3.0
    with pytest.raises(check.Unproven, match=r"no loss logged for step 7 \(the step after"):
        check.logged_loss(metrics, 7)
    with pytest.raises(check.Unproven, match="the trainer's events cannot be read"):
        check.logged_loss(tmp_path / "absent.jsonl", 5)


def test_the_tolerance_per_precision_and_the_sampling_term() -> None:
    check = _export_check()
    assert check.TOLERANCE == {"fp32": 1e-4, "bf16": 2e-2}
    exact = check.judge([2.0, 2.0002], 2, 2.0, "fp32")
    assert (exact["ok"], exact["allowed"]) == (True, pytest.approx(2e-4))
    assert check.judge([2.0, 2.0006], 2, 2.0, "fp32")["ok"] is False
    assert check.judge([2.0, 2.0006], 2, 2.0, "bf16")["ok"] is True
    # Two of four micro-batches: three standard errors of their mean, finite population.
    part = check.judge([1.9, 2.1], 4, 2.05, "fp32")
    spread = (2 * 0.1 ** 2) ** 0.5
    assert part["allowed"] == pytest.approx(2.05e-4 + 3 * spread / 2 ** 0.5 * 0.5 ** 0.5)
    assert (part["ok"], part["micro_batches"], part["micro_batches_in_step"]) == (True, 2, 4)
