"""The payload registry (jobgen/payloads/): each payload declares the recipe keys it honours, and
a recipe value either reaches the rendered job or is refused, naming the key and the payload."""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Callable, Optional

import pytest

from jobgen import api, payloads
from jobgen.inputs import recipe as recipes
from jobgen.payloads import BUILT_IN, REGISTRY, leaf_keys
from jobgen.plumbing.errors import JobgenError

RECIPES = recipes.recipe_names()
LEAVES = dict(leaf_keys())


def _type_at(path: str) -> Any:
    from jobgen.inputs import schema
    return schema.field_type(recipes.Recipe, path, "test")


def numeric_keys() -> list[str]:
    keys = []
    for path in LEAVES:
        tp = _type_at(path)
        args = typing.get_args(tp)
        base = [a for a in args if a is not type(None)][0] if args and type(None) in args else tp
        if base in (int, float) or (typing.get_origin(base) is tuple and path == "optim.betas"):
            keys.append(path)
    return keys


def candidates(path: str, value: Any) -> list[str]:
    """--set values that differ from the recipe's (two, in case the first is refused for an
    unrelated rule)."""
    tp = _type_at(path)
    is_int = int in typing.get_args(tp) or tp is int
    if path == "optim.betas":
        b1, b2 = value
        return [f"[{b1 / 2},{b2}]", f"[{b1},{(1 + b2) / 2}]"]
    if value is None:
        return ["2", "3"] if is_int else ["0.5", "0.25"]
    if is_int:
        return [str(value * 2), str(value + 1)] if value else ["1", "2"]
    return [repr(value / 2 if value else 0.5), repr(value * 0.75 if value else 0.25)]


def render(recipe: str, overrides: tuple[str, ...] = ()) -> str:
    spec = api.job_spec(recipe, overrides=overrides)
    return api.plan(spec).text


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("key", numeric_keys())
def test_every_numeric_value_reaches_the_job_or_is_refused(recipe: str, key: str) -> None:
    """Changing any number of any recipe changes what is rendered, or is refused with a message
    that names the key: nothing is accepted and then ignored."""
    base_recipe, _ = recipes.load(recipe)
    baseline = render(recipe)
    value = payloads.value_at(base_recipe, key)
    outcomes = []
    for text in candidates(key, value):
        try:
            changed = render(recipe, (f"{key}={text}",))
        except JobgenError as exc:
            outcomes.append(("refused", str(exc)))
            continue
        if changed != baseline:
            return
        outcomes.append(("ignored", text))
    assert all(kind == "refused" for kind, _ in outcomes), (
        f"{recipe}: {key}: accepted and rendered identically: {outcomes}")
    leaf = key.split(".")[-1]
    assert any(leaf in message or key.rsplit(".", 1)[0] in message
               for _, message in outcomes), outcomes


def test_every_declared_key_exists_in_the_recipe_schema() -> None:
    for payload in REGISTRY.values():
        assert payload.honours - set(LEAVES) == set(), payload.name
        assert set(payload.fixed) - set(LEAVES) == set(), payload.name
        assert set(payload.refused_values) - set(LEAVES) == set(), payload.name


def test_every_recipe_names_a_registered_payload_and_passes_its_rules() -> None:
    for name in RECIPES:
        rec, source = recipes.load(name)
        assert rec.payload in REGISTRY
        payloads.check_recipe(rec, source)


REFUSALS: list[tuple[str, tuple[str, ...], str]] = [
    ("neox20b", ("optim.no_decay=[bias]",),
     "recipes/neox20b.yaml: optim.no_decay: payload neuron_nemo does not use this key, so "
     "('bias',) would be silently ignored (remove it or leave it unset)"),
    ("neox20b", ("model.num_kv_heads=8",),
     "recipes/neox20b.yaml: model.num_kv_heads: payload neuron_nemo does not use this key, so 8 "
     "would be silently ignored (remove it or leave it unset)"),
    ("neox20b", ("model.vocab_size=50304",),
     "recipes/neox20b.yaml: model.vocab_size: payload neuron_nemo accepts only 50257 (NeMo "
     "takes the vocabulary from the GPT-2 BPE tokenizer files (data.vocab_file, "
     "data.merge_file) and pads it to a multiple of parallelism.tensor), got 50304"),
    ("neox20b", ("optim.name=lamb",),
     "recipes/neox20b.yaml: optim.name: payload neuron_nemo cannot use 'lamb': the NeMo payload "
     "trains with adamw (NeMo's LAMB is apex's CUDA kernel)"),
    ("neox20b", ("launch.config_nam=x",),
     "recipes/neox20b.yaml: launch.config_nam: not a launch setting of payload neuron_nemo "
     "(known: config_name)"),
    ("llama2-7b", ("parallelism.pipeline=4",),
     "recipes/llama2-7b.yaml: parallelism.pipeline: payload neuronx_distributed accepts only 1 "
     "(the NxD Llama TP + ZeRO-1 program has no pipeline parallelism (PP > 1 would only "
     "multiply the global batch)), got 4"),
    ("llama2-7b", ("model.hidden_dropout=0.1",),
     "recipes/llama2-7b.yaml: model.hidden_dropout: payload neuronx_distributed does not use "
     "this key, so 0.1 would be silently ignored (remove it or leave it 0.0)"),
    ("llama2-7b", ("launch.config_name=x",),
     "recipes/llama2-7b.yaml: launch.config_name: not a launch setting of payload "
     "neuronx_distributed (known: none)"),
    ("llama2-7b", ("model.family=gpt_neox",),
     "recipes/llama2-7b.yaml: model.family: payload neuronx_distributed trains llama, not "
     "gpt_neox"),
    ("bert1.5b", ("precision=bf16_sr",),
     "recipes/bert1.5b.yaml: precision: payload habana_deepspeed cannot use 'bf16_sr': Gaudi's "
     "bf16 has no stochastic-rounding switch in this program; use bf16"),
    ("bert1.5b", ("platform=trn1.32xlarge",),
     "recipes/bert1.5b.yaml: platform: payload habana_deepspeed runs on hpu platforms, not on "
     "trn1.32xlarge (neuron)"),
]


@pytest.mark.parametrize("recipe,overrides,message", REFUSALS,
                         ids=[f"{r}:{o[0]}" for r, o, _ in REFUSALS])
def test_refusals_name_the_key_and_the_payload(jobgen: Callable, recipe: str,
                                               overrides: tuple[str, ...], message: str) -> None:
    args = ["render", recipe]
    for item in overrides:
        args += ["--set", item]
    result = jobgen(*args)
    assert result.exit_code == 2
    assert result.stderr == f"error: {message}\n"
    assert result.stdout == ""


def test_show_marks_which_values_reach_the_trainer(jobgen: Callable) -> None:
    import yaml
    result = jobgen("show", "llama2-7b", "--nodes", "4")
    assert result.exit_code == 0, result.stderr
    report = yaml.safe_load(result.stdout)["payload_keys"]
    assert report["name"] == "neuronx_distributed"
    assert {"optim.eps", "schedule.decay_steps", "schedule.min_lr",
            "model.scaled_init"} <= set(report["reaches_the_job"])
    assert "model.hidden_dropout" in report["not_used (must stay at the default)"]
    assert set(report["fixed_by_the_trainer"]) == {"parallelism.pipeline",
                                                   "model.position_embedding_type",
                                                   "model.rotary_percentage"}


def test_a_new_payload_is_one_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registering a payload is all it takes for the key rules to apply to it."""
    base = REGISTRY["neuron_nemo"]
    extra = dataclasses.replace(base, name="neuron_nemo", honours=base.honours - {"optim.eps"})
    monkeypatch.setitem(BUILT_IN, "neuron_nemo", extra)
    with pytest.raises(JobgenError, match=r"optim\.eps: payload neuron_nemo does not use"):
        api.job_spec("neox20b", overrides=("optim.eps=1e-6",))
    _: Optional[int] = None


def test_neuron_image_pins_the_releases_the_payloads_were_checked_against() -> None:
    """The image's checkouts are the upstream commits the facts were read from, and a
    coherent pair with its base image (finding 8 of issue 7: SDK 2.20 base, current examples)."""
    import json
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    dockerfile = (root / "env" / "containers" / "neuron.Dockerfile").read_text()
    arg = {m.group(1): m.group(2) for m in re.finditer(r"^ARG (\w+)=(\S+)$", dockerfile, re.M)}
    upstream = root / "jobgen" / "payloads" / "upstream"
    assert arg["NXD_REF"] == json.loads((upstream / "neuronx_distributed.json").read_text())[
        "commit"]
    assert arg["NEMO_REF"] == json.loads((upstream / "neuron_nemo.json").read_text())["commit"]
    assert "sdk2.20" in arg["BASE_IMAGE"]
    # NeMo's torch pin is checked: the build compares the base's torch with the declared one.
    from jobgen.images import catalog as images
    assert images.declared().images["trn1-nemo"].torch == "1.13.1"
    assert "python3 /tmp/jobgen-build-check.py base" in dockerfile
