"""The NxD Llama export (payload/neuronx_distributed/export_llama.py), issue 51 item 1: run as
the job runs it (its interpreter, by path, the trainer's flags) on a checkpoint folder in NxD's
layout, with NxD's converter played by tests/stand_ins/neuronx_distributed (its output contract:
neuronx_distributed and torch_xla do not install here); the converter's argv against the
upstream facts in jobgen/payloads/upstream/export.json; the export stage's render.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import need

ROOT = Path(__file__).resolve().parents[1]
EXPORT = ROOT / "payload" / "neuronx_distributed" / "export_llama.py"
STAND_IN = ROOT / "tests" / "stand_ins" / "neuronx_distributed" / "examples" / "training" / "llama"
EXAMPLE = STAND_IN / "tp_zero1_llama_hf_pretrain"
CONFIG = EXAMPLE / "tiny_config.json"
FACTS = ROOT / "jobgen" / "payloads" / "upstream" / "export.json"
MICRO, ACCUM, DP, TP, SEQ, ROWS = 2, 2, 2, 2, 16, 20   # step 3 reads rows 16-19, 0-3
GLOBAL = MICRO * ACCUM * DP

LOAD_ALONE = """
import sys, torch, transformers
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])
tok = transformers.AutoTokenizer.from_pretrained(sys.argv[1])
ids = torch.tensor([tok("the quick brown fox")["input_ids"]])
print(type(model).__name__, tuple(model(input_ids=ids).logits.shape))
print(sorted(m for m in sys.modules if m.split(".")[0] in ("jobgen", "common", "export_hf")))
"""


def stand_in() -> Any:
    spec = importlib.util.spec_from_file_location("nxd_stand_in",
                                                  STAND_IN / "convert_checkpoints.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nxd_step(root: Path, step: int, sealed: bool = True) -> None:
    """A train_llama.py save as NxD lays it out: the model's rank files (their content is the
    converter's business), the trainer's user content, NxD's ``checkpoint`` and ``done`` files."""
    import torch

    folder = root / f"step_{step}"
    (folder / "model").mkdir(parents=True)
    (folder / "checkpoint").write_text("1")
    for tp in range(TP):
        (folder / "model" / f"dp_rank_00_tp_rank_{tp:02d}_pp_rank_00.pt").write_bytes(b"xser")
    torch.save({"global_step": step, "consumed_samples": step * GLOBAL},
               str(folder / "user_content.pt"))
    if sealed:
        (folder / "done").write_text("1")


def step_loss(data: Any, step: int) -> float:
    """What the trainer logs for ``step``: the mean loss of its micro-batches (the samples from
    (step - 1) x GLOBAL on), computed here with transformers alone on the stand-in's weights."""
    import torch
    import transformers

    config = {k: v for k, v in json.loads(CONFIG.read_text()).items()
              if k not in ("sequence_parallel_enabled", "selective_checkpoint_enabled",
                           "move_model_to_device")}
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    model.load_state_dict(stand_in().weights(config, 0))
    start = (step - 1) * GLOBAL
    losses = []
    with torch.no_grad():
        for first in range(start, start + GLOBAL, MICRO):
            rows = data[[(first + k) % ROWS for k in range(MICRO)]]
            losses.append(float(model(**{c: torch.tensor(rows[c]) for c in rows}).loss))
    return sum(losses) / len(losses)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder: steps 2 and 3 sealed, step 4 being written; the trainer logged steps 1-3
    (step 3 read past the end of the blocks: the stream wraps round, as the trainer's does)."""
    need("torch", "transformers", "tokenizers", "datasets", "safetensors")
    import datasets
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("nxd")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([f"the quick brown fox jumps over the lazy dog {i}"
                             for i in range(200)], vocab_size=300,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>").save_pretrained(
        str(folder / "data"))   # prepare saves the tokenizer beside the blocks
    ids = torch.randint(0, 300, (ROWS, SEQ), generator=torch.Generator().manual_seed(7))
    data = datasets.Dataset.from_dict({"input_ids": ids.tolist(),
                                       "attention_mask": [[1] * SEQ] * ROWS,
                                       "labels": ids.tolist()})
    data.save_to_disk(str(folder / "data"))
    for step in (2, 3):
        nxd_step(folder / "checkpoints", step)
    nxd_step(folder / "checkpoints", 4, sealed=False)
    events = [{"event": "start", "phase": "train", "data_parallel": DP,
               "global_batch_size": GLOBAL}]
    events += [{"event": "step", "phase": "train", "step": s, "loss": 6.0} for s in (1, 2)]
    events += [{"event": "step", "phase": "train", "step": 3, "loss": step_loss(data, 3)}]
    (folder / "train").mkdir()
    (folder / "train" / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return folder


def trainer_flags(run: Path) -> list[str]:
    """The training pass's flags, as the export stage passes them (tiny sizes)."""
    return ["--example-dir", str(EXAMPLE), "--model-config", str(CONFIG),
            "--data-dir", str(run / "data"), "--output-dir", str(run / "train"),
            "--phase", "train", "--max-steps", "10", "--checkpoint-dir", str(run / "checkpoints"),
            "--tensor-parallel-size", str(TP), "--micro-batch-size", str(MICRO),
            "--gradient-accumulation", str(ACCUM), "--seq-length", str(SEQ), "--lr", "1e-4",
            "--precision", "fp32"]


def export(run: Path, root: str, *extra: str, broken: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, JOBGEN_STAND_IN_BREAK=broken)
    return subprocess.run([sys.executable, str(EXPORT), *trainer_flags(run),
                           "--tokenizer", str(run / "data"), "--export-root", str(run / root),
                           "--on-node", *extra], cwd=run, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def exported(run: Path) -> subprocess.CompletedProcess[str]:
    return export(run, "export")


@pytest.mark.slow   # the run fixture: a converter run and an export (about 30 s)
def test_a_step_exports_through_nxds_converter_and_is_proven(
        run: Path, exported: subprocess.CompletedProcess[str]) -> None:
    done, folder = exported, run / "export" / "step-2"
    assert done.returncode == 0, done.stderr
    assert done.stderr == ("llama-export: step 2, the newest sealed step that can be proven: the "
                           "trainer logged no step 4 after the newest, 3 (--step 3 exports it "
                           "unproven)\n")
    assert done.stdout.splitlines()[-1].startswith(
        f"llama-export: {folder}: exported and proven: loss ")
    assert sorted(p.name for p in (run / "export").iterdir()) == ["step-2"]   # no converter tmp
    record = json.loads((folder / "jobgen-export.json").read_text())
    assert record["consumed_samples"] == 2 * GLOBAL and record["proof"]["ok"] is True
    assert record["proof"]["micro_batches"] == DP * ACCUM
    assert record["checkpoint"] == str((run / "checkpoints" / "step_2").resolve())
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "sequence_parallel_enabled" not in config   # NxD's attributes stay behind


@pytest.mark.slow   # the run fixture: a converter run and an export (about 30 s)
def test_the_export_loads_with_transformers_alone(
        run: Path, exported: subprocess.CompletedProcess[str]) -> None:
    folder = run / "export" / "step-2"
    assert exported.returncode == 0, exported.stderr
    alone = subprocess.run([sys.executable, "-I", "-c", LOAD_ALONE, str(folder)], cwd=run,
                           capture_output=True, text=True, timeout=300, check=False)
    assert alone.returncode == 0, alone.stderr
    shape, ours = alone.stdout.splitlines()[-2:]
    assert shape.startswith("LlamaForCausalLM (1, ") and shape.endswith(", 320)")
    assert ours == "[]"   # no module of jobgen's was loaded


@pytest.mark.slow   # an export each (10-20 s)
@pytest.mark.parametrize("broken,says", [
    ("rename", "checkpoints/step_2/model: holds another model than the flags describe (missing "
               "model.layers.0.mlp.gate_proj.weight; unexpected model.layers.0.mlp.gate.weight)"),
    ("transpose", "/step-2: the exported model's loss "),
    ("fail", "convert_checkpoints.py: failed on "),
])
def test_a_broken_conversion_is_one_line_and_leaves_nothing(run: Path, broken: str,
                                                            says: str) -> None:
    done = export(run, f"broken-{broken}", "--step", "2", broken=broken)
    assert done.returncode == 78, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("llama-export: error: ") and says in lines[0]
    if broken == "fail":
        assert lines[0].endswith("(exit 1): RuntimeError: stand-in told to fail")
    assert not (run / f"broken-{broken}").exists()


@pytest.mark.slow   # the run fixture: a converter run and an export (about 30 s)
def test_a_step_nxd_has_not_sealed_is_refused(run: Path, tmp_path: Path) -> None:
    done = export(run, "unsealed", "--step", "4")
    assert (done.returncode, done.stdout) == (78, "")
    assert done.stderr == (f"llama-export: error: {run / 'checkpoints' / 'step_4'}: step 4 is "
                           "not complete (not sealed: being written, or its save failed); "
                           "complete: 2, 3\n")
    flags = trainer_flags(run)
    flags[flags.index("--checkpoint-dir") + 1] = str(tmp_path)
    none = subprocess.run([sys.executable, str(EXPORT), *flags, "--tokenizer", str(run / "data"),
                           "--export-root", str(run / "none")], cwd=run, capture_output=True,
                          text=True, timeout=120, check=False)
    assert (none.returncode, none.stderr) == (2, f"llama-export: error: {tmp_path}: no complete "
                                                 "checkpoint (none sealed with NxD's done file)\n")
    assert not (run / "unsealed").exists() and not (run / "none").exists()


# --- the converter's argv against what was read upstream --------------------------------------

def check_argv(argv: list[str], facts: dict[str, Any]) -> None:
    """Every flag is one upstream's argparse defines (its parse_known_args drops others
    silently), --qkv_linear is absent, each type=bool flag given is one meant on, with a value
    (any value reads as true), and --input_dir is absolute."""
    parser = facts["argparse"]
    flags = [a for a in argv if a.startswith("--")]
    assert set(flags) <= set(parser["flags"]), set(flags) - set(parser["flags"])
    assert "--qkv_linear" not in flags
    for flag in flags:
        kind = parser["flags"][flag]
        value = argv[argv.index(flag) + 1] if argv.index(flag) + 1 < len(argv) else None
        if kind == "store_true":
            assert value is None or value.startswith("--"), flag
        elif kind == "bool":
            assert flag in facts["bool_flags_passed"] and value not in (None, "", "0", "False")
    assert Path(argv[argv.index("--input_dir") + 1]).is_absolute()


def test_the_converter_is_called_as_upstream_reads(tmp_path: Path) -> None:
    sys.path.insert(0, str(EXPORT.parent))
    import export_llama

    facts = json.loads(FACTS.read_text())["programs"]["payload/neuronx_distributed/export_llama.py"]
    assert facts["file"] == "examples/training/llama/" + export_llama.CONVERTER
    assert facts["output"].startswith(export_llama.OUTPUT)
    os.chdir(tmp_path)
    argv = export_llama.converter_argv(STAND_IN / export_llama.CONVERTER, Path("step_2/model"),
                                       tmp_path / "out", tmp_path / "config.json", 8)
    check_argv(argv[2:], facts)
    assert argv[2:4] == ["--convert_to_full_state", "--input_dir"]
    # The check can fail: each mistake the facts warn of is caught.
    for bad in (argv[2:] + ["--qkv_linear", "1"], argv[2:] + ["--fuse_qkv", "False"],
                argv[2:] + ["--tp-size", "8"],
                [a if a != str((tmp_path / "step_2" / "model")) else "step_2/model"
                 for a in argv[2:]]):
        with pytest.raises(AssertionError):
            check_argv(bad, facts)


# --- the stage -----------------------------------------------------------------------------------

def stage_args(text: str) -> list[str]:
    block = text.split("\nARGS=(\n", 1)[1].split("\n)\n", 1)[0]
    return shlex.split(block)


def test_the_export_stage_runs_it_on_a_training_node(jobgen: Any, write_site: Any) -> None:
    site = write_site("trn1-pcluster", {"slurm.prepare_partition": "cpu1"})
    done = jobgen("render", "llama2-7b", "--site", str(site), "--stage", "export", "--step", "4000")
    assert done.exit_code == 0, done.output
    assert "PROGRAM=neuronx_distributed/export_llama.py\n" in done.output
    assert "#SBATCH --partition=compute1\n" in done.output   # the converter needs torch_xla
    args = stage_args(done.output)
    sys.path.insert(0, str(EXPORT.parent))
    import export_llama
    parsed = export_llama.parse_args(args)
    assert (parsed.step, parsed.on_node, parsed.micro_batches) == (4000, True, 8)
    assert parsed.tokenizer == parsed.data_dir   # prepare saved the tokenizer beside the blocks
    assert parsed.checkpoint_dir.name == "checkpoints" and parsed.tensor_parallel_size == 8
    every = jobgen("submit", "llama2-7b", "--site", str(site), "--stages", "train,export",
                   "--every", "4", "--dry-run")
    assert every.exit_code == 0, every.output
    follower = every.output[every.output.index("PROGRAM=common/follow_steps.py\n"):]
    script = every.output[every.output.index("#SBATCH --job-name=llama2-7b-follow\n"):]
    assert "#SBATCH --partition=compute1\n" in script   # as the export: NxD's converter
    words = stage_args(follower)
    own, rest = words[:words.index("+export")], words[words.index("+export") + 1:]
    assert rest[0] == "neuronx_distributed/export_llama.py" and "--step" not in rest
    listed = export_llama.parse_args(rest[1:])   # the words it lists the sealed steps with
    assert listed.checkpoint_dir == parsed.checkpoint_dir
    assert own[own.index("--metrics") + 1] == str(listed.output_dir / "metrics.jsonl")
    assert own[own.index("--every") + 1] == "4" and "--checkpoints" not in own
