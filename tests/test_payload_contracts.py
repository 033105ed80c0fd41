"""The arguments jobgen renders for its own training programs are parsed by those programs' real
parsers (payload/habana_deepspeed/pretrain_bert.py, payload/neuronx_distributed/train_llama.py,
payload/smoke/train.py), and every value arrives as the spec says. A flag the program does not
know, or a value it reads differently, fails here instead of on a reservation.

(The upstream trainers are checked against their recorded interfaces in test_upstream_*.py.)"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from jobgen import api, payloads
from jobgen.inputs import recipe as recipes

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = {"habana_deepspeed": "habana_deepspeed/pretrain_bert.py",
            "neuronx_distributed": "neuronx_distributed/train_llama.py"}


def program(relative: str) -> ModuleType:
    path = ROOT / "payload" / relative
    if not path.exists():
        pytest.fail(f"payload/{relative} does not exist")
    name = "contract_" + relative.replace("/", "_").removesuffix(".py")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def own_program_recipes() -> list[str]:
    return [n for n in recipes.recipe_names() if recipes.load(n)[0].payload in PROGRAMS]


def parsed(relative: str, args: tuple[str, ...]) -> Any:
    module = program(relative)
    try:
        return module.parse_args(list(args))
    except SystemExit as exc:          # argparse refused: show what it said
        pytest.fail(f"payload/{relative} refuses the rendered arguments (exit {exc.code}): "
                    f"{' '.join(args)}")


@pytest.mark.parametrize("recipe", own_program_recipes())
@pytest.mark.parametrize("which", ["compile", "train"])
def test_rendered_arguments_parse_and_carry_the_spec(recipe: str, which: str) -> None:
    spec = api.job_spec(recipe, site="trn1-pcluster" if "llama" in recipe else "local")
    lau = payloads.for_spec(spec)
    args = parsed(PROGRAMS[spec.recipe.payload], lau.args(which))  # type: ignore[arg-type]
    r = spec.recipe
    assert args.phase == which
    assert args.compile_steps == r.compile.steps
    assert args.max_steps == r.schedule.max_steps
    assert args.micro_batch_size == r.parallelism.micro_batch_size
    assert args.gradient_accumulation == spec.gradient_accumulation
    assert args.lr == spec.lr
    assert args.min_lr == r.schedule.min_lr
    assert args.decay_steps == (r.schedule.decay_steps or r.schedule.max_steps)
    assert (args.beta1, args.beta2) == r.optim.betas
    assert args.eps == r.optim.eps
    assert args.weight_decay == r.optim.weight_decay
    assert args.grad_clip == r.optim.grad_clip
    assert args.seed == r.seed
    if r.optim.no_decay is not None:
        assert list(args.no_decay) == list(r.optim.no_decay)
    if r.payload == "habana_deepspeed":
        m = r.model
        assert (args.hidden_dropout, args.attention_dropout) == (m.hidden_dropout,
                                                                 m.attention_dropout)
        assert args.layer_norm_eps == m.layernorm_epsilon
        assert args.layer_norm_large_model == m.layer_norm_large_model
    else:
        assert args.warmup_steps == spec.warmup_steps
        assert args.scaled_init == r.model.scaled_init
        assert args.tensor_parallel_size == r.parallelism.tensor
        assert args.seq_length == r.model.seq_length


@pytest.mark.parametrize("recipe", recipes.recipe_names())
def test_smoke_arguments_parse(recipe: str) -> None:
    spec = api.job_spec(recipe, 2, smoke=True)
    lau = payloads.for_spec(spec)
    relative = lau.launcher.split("/")[0] + "/" + lau.program
    for which in ("compile", "train"):
        assert parsed(relative, lau.args(which)).phase == which  # type: ignore[arg-type]
