"""payload/neuronx_distributed/train_llama.py: jobgen's Llama program on NeuronX Distributed.

What runs only on Trainium (torch_xla, neuronx_distributed) cannot run here; what can is tested:
its flags and their validation, that every upstream name it uses exists at the pinned release
(the recorded facts of jobgen/payloads/upstream/neuronx_distributed.json), that a plain
checkout's modules become importable, and the shared loop code it runs on (schedule, parameter
groups, scaled initialisation, data position), which the smoke trainer also runs for real in
test_payload_smoke.py."""
from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "payload" / "neuronx_distributed" / "train_llama.py"
FACTS = json.loads((ROOT / "jobgen" / "payloads" / "upstream" /
                    "neuronx_distributed.json").read_text())
UPSTREAM_ROOTS = ("modeling_llama_nxd", "training_utils", "neuronx_distributed")
for entry in (str(ROOT / "payload"), str(PROGRAM.parent)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import llama_model  # noqa: E402
import llama_setup  # noqa: E402
import train_llama  # noqa: E402
from common.init import scale_output_projections, scaled_std  # noqa: E402
from common.optim import parameter_groups  # noqa: E402
from common.runtime import PayloadError  # noqa: E402
from common.schedule import learning_rate  # noqa: E402
from common.stream import RankStream  # noqa: E402


def program_tree() -> ast.Module:
    """The program's modules (train_llama.py and the llama_*.py beside it) as one tree."""
    files = [PROGRAM, *sorted(PROGRAM.parent.glob("llama_*.py"))]
    return ast.Module(body=[node for f in files for node in ast.parse(f.read_text()).body],
                      type_ignores=[])


def upstream_uses() -> set[tuple[str, str]]:
    """(module, name) for every upstream name the program imports or reads off `nxd` /
    `parallel_state`."""
    tree = program_tree()
    aliases = {"nxd": "neuronx_distributed",
               "parallel_state": "neuronx_distributed.parallel_layers.parallel_state"}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.split(".")[0] in UPSTREAM_ROOTS:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in ("neuronx_distributed.parallel_layers.parallel_state",):
                    continue          # a module, its names are read below
                found.add((node.module, alias.name))
        if isinstance(node, ast.Attribute):
            base = node.value
            name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)
            if name in aliases:
                found.add((aliases[name], node.attr))
    return found


def test_every_upstream_name_exists_at_the_pinned_release() -> None:
    symbols = FACTS["symbols_used_by_train_llama"]
    pinned = "2.20"
    assert FACTS["commit"] == "4f95471" and FACTS["release"] == "Neuron SDK 2.20"
    uses = upstream_uses()
    assert ("modeling_llama_nxd", "LlamaForCausalLM") in uses     # the walk sees the imports
    assert ("neuronx_distributed", "save_checkpoint") in uses
    missing = [f"{m}.{n}" for m, n in sorted(uses)
               if pinned not in symbols.get(m, {}).get(n, {}).get("present_at", [])]
    assert missing == [], f"not recorded at NxD {pinned}: {missing}"


def upstream_calls() -> list[tuple[str, str, set[str]]]:
    """(module, name, keyword names) of every call of an upstream function or class."""
    tree = program_tree()
    imported = {alias.asname or alias.name: node.module for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module
                and node.module.split(".")[0] in UPSTREAM_ROOTS for alias in node.names}
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in imported:
            calls.append((imported[func.id], func.id, {k.arg for k in node.keywords if k.arg}))
        elif isinstance(func, ast.Attribute) and "nxd" in (getattr(func.value, "attr", None),
                                                           getattr(func.value, "id", None)):
            calls.append(("neuronx_distributed", func.attr,
                          {k.arg for k in node.keywords if k.arg}))
    return calls


def test_every_call_uses_parameters_the_pinned_release_has() -> None:
    """Keyword arguments are checked against the recorded signatures at NxD 2.20; those that
    initialize_parallel_optimizer passes on (**defaults) against the optimizer class's."""
    symbols = FACTS["symbols_used_by_train_llama"]
    calls = upstream_calls()
    called = {name for _, name, _ in calls}
    assert {"save_checkpoint", "load_checkpoint", "neuronx_distributed_config",
            "initialize_parallel_optimizer", "get_mixed_precision_config"} <= called
    optimizer = symbols["neuronx_distributed.utils.adamw_fp32_optim_params"][
        "AdamW_FP32OptimParams"]["parameters"]
    for module, name, keywords in calls:
        parameters = symbols[module][name]["parameters"] or []
        if any(p.startswith("**") for p in parameters):
            extra = keywords - set(parameters)
            if name == "initialize_parallel_optimizer":
                assert extra <= set(optimizer), (name, extra - set(optimizer))
            continue
        assert keywords <= set(parameters), (name, keywords - set(parameters))


def test_the_pinned_example_imports_on_the_pinned_library() -> None:
    """The example's own modules at 2.20 need nothing the NxD library of 2.20 lacks (from 2.22
    on they do: the checkout and the installed library must be paired)."""
    imports_on = FACTS["example_modules_need_nxd_library"]["imports_on"]
    assert "2.20" in imports_on["2.20"] and "2.20" not in imports_on["2.29"]
    assert set(FACTS["releases_checked"]) == {"2.19", "2.20", "2.21", "2.22", "2.23", "2.24",
                                              "2.29"}
    for module in FACTS["symbols_used_by_train_llama"].values():
        for entry in module.values():
            assert set(entry["present_at"]) <= set(FACTS["releases_checked"])


def fake_checkout(tmp: Path) -> Path:
    """A folder laid out as a checkout of the example (the modules' contents do not matter to
    validation)."""
    llama = tmp / "examples" / "training" / "llama"
    example = llama / "tp_zero1_llama_hf_pretrain"
    example.mkdir(parents=True, exist_ok=True)
    for name in llama_setup.UPSTREAM_MODULES:
        (llama / name).write_text("")
    return example


def args(*extra: str, tmp: Path) -> Any:
    config = tmp / "config.json"
    config.write_text("{}")
    (tmp / "data").mkdir(exist_ok=True)
    return train_llama.parse_args([
        "--example-dir", str(fake_checkout(tmp)), "--model-config", str(config),
        "--data-dir", str(tmp / "data"), "--output-dir", str(tmp / "out"),
        "--checkpoint-dir", str(tmp / "ckpt"), "--max-steps", "500000", "--lr", "3e-4",
        "--min-lr", "3e-5", "--warmup-steps", "2000", "--decay-steps", "480000", "--zero1",
        *extra])


def test_the_hlat_flags_validate(tmp_path: Path) -> None:
    parsed = args("--beta2", "0.95", "--eps", "1e-5", "--weight-decay", "0.1", "--no-decay",
                  "--scaled-init", "--init-std", "0.021", "--schedule", "cosine",
                  "--precision", "bf16_sr", tmp=tmp_path)
    train_llama.validate(parsed)
    assert parsed.no_decay == [] and parsed.decay_steps == 480_000 and parsed.steps == -1
    assert train_llama.parse_args(["--example-dir", "e", "--model-config", "c", "--data-dir",
                                   "d", "--output-dir", "o", "--max-steps", "5", "--lr", "1"]
                                  ).no_decay is None   # absent: the example's rule


@pytest.mark.parametrize("extra,message", [
    (("--decay-steps", "1000"), "--decay-steps must lie between the end of warmup and hold"),
    (("--min-lr", "1e-3"), "--min-lr must lie between 0 and --lr"),
    (("--eps", "0"), "--eps must be positive"),
    (("--beta2", "1.0"), "--beta1 and --beta2 must lie in [0, 1)"),
    (("--micro-batch-size", "0"), "--micro-batch-size must be at least 1"),
])
def test_bad_flags_are_one_line_errors(tmp_path: Path, extra: tuple[str, ...],
                                       message: str) -> None:
    with pytest.raises(PayloadError, match=re.escape(message)):
        train_llama.validate(args(*extra, tmp=tmp_path))


def test_bf16_needs_zero1_and_folders_must_exist(tmp_path: Path) -> None:
    parsed = args("--precision", "bf16", tmp=tmp_path)
    train_llama.validate(parsed)
    parsed.zero1 = False
    with pytest.raises(PayloadError, match=r"--precision bf16 keeps FP32 master weights, which "
                                           r"NxD holds only in its ZeRO-1 optimizer"):
        train_llama.validate(parsed)
    parsed = args(tmp=tmp_path)
    parsed.data_dir = tmp_path / "nowhere"
    with pytest.raises(PayloadError, match=r"--data-dir .*nowhere: no such folder"):
        train_llama.validate(parsed)
    parsed = args(tmp=tmp_path)
    parsed.example_dir = tmp_path / "data"
    with pytest.raises(PayloadError, match="not the NxD Llama example folder of a checkout"):
        train_llama.validate(parsed)


def test_a_plain_checkout_is_importable_without_symlinks(tmp_path: Path) -> None:
    """The example imports modeling_llama_nxd and training_utils from its parent folder; the
    program puts both folders on sys.path itself (the upstream tutorial symlinks them)."""
    llama = tmp_path / "examples" / "training" / "llama"
    example = llama / "tp_zero1_llama_hf_pretrain"
    example.mkdir(parents=True)
    with pytest.raises(PayloadError, match="lacks modeling_llama_nxd.py, training_utils.py"):
        train_llama.use_example(example)
    (llama / "modeling_llama_nxd.py").write_text("MARK = 'model'\n")
    (llama / "training_utils.py").write_text("MARK = 'data'\n")
    train_llama.use_example(example)
    import importlib
    try:
        assert importlib.import_module("modeling_llama_nxd").MARK == "model"
        assert importlib.import_module("training_utils").MARK == "data"
    finally:
        for name in ("modeling_llama_nxd", "training_utils"):
            sys.modules.pop(name, None)
        for path in (str(example.resolve()), str(llama.resolve())):
            sys.path.remove(path)


def test_hlat_schedule_values() -> None:
    """cosine from 3e-4 to 3e-5, reaching it at step 480,000 after 2,000 warmup steps."""
    def lr(step: int) -> float:
        return learning_rate(step, peak_lr=3e-4, max_steps=500_000, warmup_steps=2000,
                             min_lr=3e-5, decay="cosine", decay_steps=480_000)
    assert lr(0) == pytest.approx(3e-4 / 2000)
    assert lr(1999) == pytest.approx(3e-4)
    assert lr(2000) == pytest.approx(3e-4)
    assert lr(241_000) == pytest.approx((3e-4 + 3e-5) / 2)     # the cosine's midpoint
    assert lr(480_000) == lr(499_999) == pytest.approx(3e-5)


def test_weight_decay_on_every_parameter_when_the_recipe_says_so() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    (only,) = parameter_groups(model.named_parameters(), 0.1, [])
    assert len(only["params"]) == 4 and only["weight_decay"] == 0.1
    decayed, plain = parameter_groups(model.named_parameters(), 0.1,
                                      train_llama.EXAMPLE_NO_DECAY)
    assert len(decayed["params"]) == 2 and len(plain["params"]) == 2   # '1.bias' and 'bias'


def test_scaled_initialisation_of_output_projections() -> None:
    """HLAT: std / sqrt(2 x layers) for o_proj and down_proj (0.021 / 8 for 32 layers), drawn
    as NxD draws its parallel layers: the full matrix, then this rank's slice, so that the
    tensor-parallel degree does not change the initial model."""
    torch = pytest.importorskip("torch")
    from common.init import sharded_draw

    class Block(torch.nn.Module):
        def __init__(self, tp: int) -> None:
            super().__init__()
            self.q_proj = torch.nn.Linear(256, 256, bias=False)
            self.o_proj = torch.nn.Linear(256 // tp, 256, bias=False)     # row-parallel shard
            self.down_proj = torch.nn.Linear(512 // tp, 256, bias=False)

    def model(tp: int, rank: int) -> Any:
        blocks = torch.nn.Sequential(*[Block(tp) for _ in range(4)])
        draw = sharded_draw(tp, rank, llama_model.ROW_PARALLEL_DIM,
                            torch.Generator().manual_seed(7))
        names = scale_output_projections(blocks, llama_model.OUTPUT_PROJECTIONS, 0.021, 32,
                                         draw=draw)
        assert len(names) == 8 and all("q_proj" not in n for n in names)
        return blocks

    whole = model(1, 0)
    expected = scaled_std(0.021, 32)
    assert expected == pytest.approx(0.021 / 8)
    measured = torch.cat([p.flatten() for n, p in whole.named_parameters()
                          if "o_proj" in n or "down_proj" in n]).std().item()
    assert measured == pytest.approx(expected, rel=0.02)
    shards = [model(4, rank) for rank in range(4)]
    for i in range(4):
        for name in ("o_proj", "down_proj"):
            joined = torch.cat([getattr(s[i], name).weight for s in shards], dim=1)
            assert torch.equal(joined, getattr(whole[i], name).weight), (i, name)


def test_resume_continues_the_data_stream() -> None:
    """The rows a data-parallel rank reads are a function of the consumed-sample count: after a
    resume at step k it reads exactly what an uninterrupted run reads from step k on (the
    upstream example restarted the epoch), wrapping round the dataset."""
    micro, accumulation, dp, rows = 1, 2, 4, 21
    per_step = micro * accumulation * dp

    def read(consumed: int, rank: int, steps: int) -> list[int]:
        stream = iter(RankStream(consumed, micro, accumulation, dp, rank, rows))
        return [next(stream) for _ in range(steps * micro * accumulation)]

    for rank in range(dp):
        uninterrupted = read(0, rank, 6)
        assert read(3 * per_step, rank, 3) == uninterrupted[3 * micro * accumulation:]
    first_epoch = sorted(r for rank in range(dp) for r in read(0, rank, 2))
    assert first_epoch == list(range(2 * per_step))       # disjoint ranks, nothing skipped
    wrapped = sorted(r for rank in range(dp) for r in read(0, rank, 6))
    assert wrapped == sorted(p % rows for p in range(6 * per_step))   # epoch after epoch
    with pytest.raises(PayloadError, match="the dataset has no rows"):
        RankStream(0, 1, 1, 1, 0, 0)


def test_rank_stream_feeds_a_torch_data_loader() -> None:
    """The program hands the stream to torch's DataLoader as its sampler, as the example hands
    its DistributedSampler: micro-batches come out in stream order."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    data = [{"input_ids": torch.tensor([i])} for i in range(10)]
    stream = RankStream(8, 2, 2, 2, 1, len(data))
    loader = iter(DataLoader(data, batch_size=2, sampler=stream, drop_last=True))
    got = [next(loader)["input_ids"].flatten().tolist() for _ in range(3)]
    assert got == [[2, 3], [4, 5], [0, 1]]      # positions 12..15 then 20, 21 (mod 10)


def test_precision_environment_follows_the_example() -> None:
    env = {"XLA_USE_BF16": "1", "XLA_DOWNCAST_BF16": "1", "NEURON_RT_STOCHASTIC_ROUNDING_EN": "1"}
    train_llama.apply_precision_environment("bf16_sr", env)
    assert env == {"XLA_USE_BF16": "1", "NEURON_RT_STOCHASTIC_ROUNDING_EN": "1"}
    train_llama.apply_precision_environment("bf16", env)
    assert env == {"XLA_DOWNCAST_BF16": "1", "NEURON_RT_STOCHASTIC_ROUNDING_EN": "0"}
    train_llama.apply_precision_environment("fp32", env)
    assert env == {"NEURON_RT_STOCHASTIC_ROUNDING_EN": "0"}   # absent, not "0": NxD tests presence
    assert [train_llama.uses_master_weights(p) for p in ("bf16_sr", "bf16", "fp32")] == [
        False, True, False]


def test_bf16_reports_the_bf16_dtype_to_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    modeling_utils = pytest.importorskip("transformers.modeling_utils")
    original = getattr(modeling_utils, "get_parameter_dtype", None)
    monkeypatch.setattr(modeling_utils, "get_parameter_dtype", original, raising=False)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", torch.cuda.is_bf16_supported)
    train_llama.patch_for_bf16(torch, "fp32")
    assert modeling_utils.get_parameter_dtype is original and torch.cuda.is_bf16_supported()
    train_llama.patch_for_bf16(torch, "bf16_sr")
    assert modeling_utils.get_parameter_dtype(torch.nn.Linear(2, 2)) is torch.bfloat16


def test_help_and_bad_flags_work_without_trainium(tmp_path: Path) -> None:
    """The program starts, prints its help and refuses bad flags in one line (exit 2) on a
    machine without torch_xla or neuronx_distributed: those are imported only to train."""
    import subprocess
    helped = subprocess.run([sys.executable, str(PROGRAM), "--help"], capture_output=True,
                            text=True, timeout=60, check=False)
    assert helped.returncode == 0 and "--no-decay" in helped.stdout
    bad = args(tmp=tmp_path)
    refused = subprocess.run(
        [sys.executable, str(PROGRAM), "--example-dir", str(bad.example_dir), "--model-config",
         str(bad.model_config), "--data-dir", str(bad.data_dir), "--output-dir",
         str(bad.output_dir), "--max-steps", "10", "--lr", "3e-4", "--warmup-steps", "20"],
        capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        "train-llama: error: --warmup-steps + --constant-steps must lie within --max-steps"]
    assert not bad.output_dir.exists()
