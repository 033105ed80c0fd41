"""The NeMo payload's overrides against neuronx-nemo-megatron's config, with Hydra itself.

The key paths and value types of conf/megatron_neox_config.yaml at the pinned release are
recorded in jobgen/payloads/upstream/neuron_nemo.json. Here a config with exactly those keys
(placeholder values of the recorded types) is written to a temporary config folder and Hydra's
own compose applies every override jobgen renders: an override without `+` must name a key the
config has, a `+key` one the config lacks (Hydra refuses either mistake), and every value must
arrive, after Hydra's parsing and OmegaConf's resolution, with a type the key takes."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobgen import api, launch
from jobgen.payloads.neuron_nemo import hydra_string

ROOT = Path(__file__).resolve().parents[1]
FACTS = json.loads((ROOT / "jobgen" / "payloads" / "upstream" / "neuron_nemo.json").read_text())
KEYS: dict[str, str] = FACTS["config_keys"]["megatron_neox_config"]
PLACEHOLDER = {"int": 1, "float": 0.5, "str": "x", "bool": False, "null": None, "list": [],
               "interpolation": None}
COMPATIBLE = {"int": (int, float), "float": (int, float), "str": (str,), "bool": (bool,),
              "list": (list,), "null": (object,), "interpolation": (object,)}


def config_from_facts() -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path, kind in KEYS.items():
        *parents, last = path.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = {} if kind == "mapping" else PLACEHOLDER[kind]
    return tree


def compose(tmp_path: Path, overrides: list[str]) -> Any:
    pytest.importorskip("hydra")
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    conf = tmp_path / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "megatron_neox_config.yaml").write_text(yaml.safe_dump(config_from_facts()))
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        cfg = hydra_compose(config_name="megatron_neox_config", overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=False)


def value_at(tree: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        tree = tree[part]
    return tree


CASES = [("neox20b", 4), ("neox20b", 16), ("pythia6.9b", 1), ("pythia6.9b", 4)]


@pytest.mark.parametrize("recipe,nodes", CASES)
@pytest.mark.parametrize("which", ["compile", "train"])
def test_hydra_accepts_every_rendered_override(tmp_path: Path, recipe: str, nodes: int,
                                               which: str) -> None:
    lau = launch.for_spec(api.job_spec(recipe, nodes, site="trn1-pcluster"))
    head, *overrides = lau.args(which)  # type: ignore[arg-type]
    assert head == "--config-name=megatron_neox_config"
    assert head.split("=", 1)[1] in FACTS["configs"]
    cfg = compose(tmp_path, overrides)
    wrong = []
    for item in overrides:
        key = item.split("=", 1)[0]
        plus = key.startswith("+")
        key = key.lstrip("+")
        assert (key in KEYS) != plus, f"{item}: {'+' if plus else 'no +'} but the key is " \
                                      f"{'present' if key in KEYS else 'absent'}"
        if plus:
            continue
        value = value_at(cfg, key)
        allowed = COMPATIBLE[KEYS[key]]
        if key in FACTS["also_accepts"]:
            allowed = allowed + (list,)
        if value is not None and not isinstance(value, allowed):
            wrong.append(f"{key}: {value!r} is {type(value).__name__}, the config has "
                         f"{KEYS[key]}")
        if KEYS[key] in ("int", "float") and isinstance(value, bool):
            wrong.append(f"{key}: {value!r} arrives as a bool")
    assert wrong == []


@pytest.mark.parametrize("text", ["TRUE", "Null", "nan", "1e5", "inf", "x\\y", "end\\",
                                  "it's", "${HOME}", "\\${x}", "a,b", "[1,2]", "-1", ""])
def test_strings_arrive_as_the_same_strings(tmp_path: Path, text: str) -> None:
    """Values Hydra would read as bool/null/float, and backslashes, quotes and interpolations,
    reach the config unchanged (the issue found TRUE, Null, nan and 1e5 changed, and
    backslashes doubled)."""
    cfg = compose(tmp_path, [f"model.data.splits_string={hydra_string(text)}"])
    from omegaconf import OmegaConf
    resolved = OmegaConf.to_container(OmegaConf.create(cfg), resolve=True)
    assert value_at(resolved, "model.data.splits_string") == text


def test_recorded_facts_name_the_release() -> None:
    assert FACTS["commit"] == "d22aabf" and FACTS["release"] == "Neuron SDK 2.20"
    assert len(KEYS) > 200 and KEYS["model.optim.sched.min_lr"] == "float"
    assert "model.resume_from_checkpoint" in KEYS      # the documented resume path exists


@pytest.mark.parametrize("override", ["model.optim.eps=1e-8", "+model.optim.lr=0.1",
                                      "model.optim.epsilon=1"])
def test_hydra_refuses_what_the_config_does_not_have(tmp_path: Path, override: str) -> None:
    """The check above has teeth: Hydra refuses a missing key without `+` and a present key
    with it, exactly as it would on the cluster."""
    pytest.importorskip("hydra")
    from hydra.errors import ConfigCompositionException
    with pytest.raises(ConfigCompositionException):
        compose(tmp_path, [override])
