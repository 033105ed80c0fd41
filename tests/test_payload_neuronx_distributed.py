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

import train_llama  # noqa: E402
from common.init import scale_output_projections, scaled_std  # noqa: E402
from common.optim import parameter_groups  # noqa: E402
from common.runtime import PayloadError, batch_positions  # noqa: E402
from common.schedule import learning_rate  # noqa: E402


def upstream_uses() -> set[tuple[str, str]]:
    """(module, name) for every upstream name the program imports or reads off `nxd` /
    `parallel_state`."""
    tree = ast.parse(PROGRAM.read_text())
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


def test_checkpoint_calls_use_parameters_the_release_has() -> None:
    nxd = FACTS["symbols_used_by_train_llama"]["neuronx_distributed"]
    tree = ast.parse(PROGRAM.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("save_checkpoint", "load_checkpoint"):
            allowed = nxd[node.func.attr]["parameters"]
            assert {k.arg for k in node.keywords} <= set(allowed), node.func.attr


def args(*extra: str, tmp: Path) -> Any:
    config = tmp / "config.json"
    config.write_text("{}")
    return train_llama.parse_args([
        "--example-dir", str(tmp / "example"), "--model-config", str(config),
        "--data-dir", str(tmp / "data"), "--output-dir", str(tmp / "out"),
        "--checkpoint-dir", str(tmp / "ckpt"), "--max-steps", "500000", "--lr", "3e-4",
        "--min-lr", "3e-5", "--warmup-steps", "2000", "--decay-steps", "480000", *extra])


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
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = torch.nn.Linear(256, 256)
            self.o_proj = torch.nn.Linear(256, 256)
            self.down_proj = torch.nn.Linear(256, 256)

    model = torch.nn.Sequential(*[Block() for _ in range(4)])
    torch.nn.init.normal_(model[0].q_proj.weight, 0, 0.021)
    names = scale_output_projections(model, train_llama.OUTPUT_PROJECTIONS, 0.021, 32,
                                     torch.Generator().manual_seed(0))
    assert len(names) == 8 and all("q_proj" not in n for n in names)
    expected = scaled_std(0.021, 32)
    assert expected == pytest.approx(0.021 / 8)
    measured = torch.cat([model[i].o_proj.weight.flatten() for i in range(4)]).std().item()
    assert measured == pytest.approx(expected, rel=0.02)
    assert model[0].q_proj.weight.std().item() == pytest.approx(0.021, rel=0.03)


def test_resume_continues_the_data_stream() -> None:
    """Positions are a function of the consumed-sample count: after a resume at step k a rank
    reads exactly what an uninterrupted run reads at step k (the upstream example restarted the
    epoch), wrapping round the dataset epoch after epoch."""
    micro, accumulation, dp, rows = 1, 2, 4, 21
    per_step = micro * accumulation * dp

    def positions(step: int, rank: int) -> list[int]:
        return [r for mb in batch_positions(step * per_step, micro, accumulation, dp, rank)
                for r in train_llama.sample_rows(mb, rows)]

    uninterrupted = [positions(s, 1) for s in range(6)]
    resumed = [positions(s, 1) for s in range(3, 6)]
    assert resumed == uninterrupted[3:]
    everything = sorted(r for s in range(6) for rank in range(dp) for r in positions(s, rank))
    assert everything[:rows] == sorted(range(rows)) or len(set(everything)) == rows


def test_precision_environment_matches_the_example() -> None:
    assert train_llama.precision_environment("bf16_sr") == {
        "XLA_USE_BF16": "1", "NEURON_RT_STOCHASTIC_ROUNDING_EN": "1"}
    assert train_llama.precision_environment("fp32")["XLA_USE_BF16"] == "0"
    assert train_llama.precision_environment("bf16")["NEURON_RT_STOCHASTIC_ROUNDING_EN"] == "0"
