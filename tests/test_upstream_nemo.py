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

from jobgen import api, payloads
from jobgen.payloads.neuron_nemo import hydra_string

ROOT = Path(__file__).resolve().parents[1]
FACTS = json.loads((ROOT / "jobgen" / "payloads" / "upstream" / "neuron_nemo.json").read_text())
CONFIG = FACTS["config_name"]
KEYS: dict[str, str] = FACTS["config_keys"][CONFIG]
# A value of each recorded kind ("missing" is OmegaConf's ??? : the command line must set it).
PLACEHOLDER = {"int": 1, "float": 0.5, "str": "x", "bool": False, "null": None, "list": [],
               "interpolation": None, "missing": "???"}
PYTHON = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "list": (list,),
          "mapping": (dict,), "null": (object,), "interpolation": (object,), "missing": ()}


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
    (conf / f"{CONFIG}.yaml").write_text(yaml.safe_dump(config_from_facts()))
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        cfg = hydra_compose(config_name=CONFIG, overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=False)


def value_at(tree: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        tree = tree[part]
    return tree


def allowed_kinds(key: str) -> tuple[type, ...]:
    kinds = [KEYS[key], *FACTS["also_accepts"].get(key, [])]
    return tuple(t for kind in kinds for t in PYTHON[kind])


CASES = [("neox20b", 4, "trn1-pcluster"), ("neox20b", 16, "trn1-pcluster"),
         ("neox20b", 4, "local"), ("pythia6.9b", 1, "trn1-pcluster"),
         ("pythia6.9b", 4, "trn1-pcluster"), ("pythia6.9b", 2, "local"),
         # SageMaker's read-only FSx channel: the index files go to the run folder.
         ("neox20b", 4, "sagemaker:sagemaker")]


@pytest.mark.parametrize("recipe,nodes,site", CASES)
@pytest.mark.parametrize("which", ["compile", "train"])
def test_hydra_accepts_every_rendered_override(tmp_path: Path, recipe: str, nodes: int,
                                               site: str, which: str) -> None:
    site, _, backend = site.partition(":")
    lau = payloads.for_spec(api.job_spec(recipe, nodes, site=site, backend=backend or "slurm"))
    head, *overrides = lau.compile_args if which == "compile" else lau.train_args
    assert head == f"--config-name={CONFIG}"
    assert CONFIG in FACTS["configs"]
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
        allowed = allowed_kinds(key)
        if value is None and KEYS[key] != "missing":
            continue                               # null: "not set", which every key takes
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            wrong.append(f"{item}: arrives as {type(value).__name__} {value!r}, the config "
                         f"has {KEYS[key]}")
    assert wrong == []
    mandatory = [k for k, kind in KEYS.items() if kind == "missing"]
    assert [k for k in mandatory if value_at(cfg, k) == "???"] == []   # every ??? is set


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
    assert set(FACTS["config_keys"]) == {"megatron_neox_config", "megatron_gpt_config"}
    for revision in FACTS["other_revisions"].values():     # 2.19 and 2.21 read the same keys
        assert all(not (d["added"] or d["removed"] or d["retyped"]) for d in revision.values())


def test_the_launcher_resume_override_reaches_the_config(tmp_path: Path) -> None:
    """payload/neuron_nemo/launch.sh adds model.resume_from_checkpoint=<quoted path>: Hydra
    takes it without `+` (the key exists) and OmegaConf reads the path back unchanged."""
    from omegaconf import OmegaConf
    path = "runs/it's \\ ${x}/nemo/checkpoints/megatron_neox--step=4-consumed_samples=8.0-last.ckpt"
    cfg = compose(tmp_path, [f"model.resume_from_checkpoint={hydra_string(path)}"])
    resolved = OmegaConf.to_container(OmegaConf.create(cfg), resolve=False)
    assert OmegaConf.create(resolved).model.resume_from_checkpoint == path
    # The same path for exp_manager (ExpManagerConfig.explicit_ckpt_path, d22aabf
    # nemo/utils/exp_manager.py L135; the config file lacks it: `+`), and the top k the launcher
    # puts in place of the rendered one.
    cfg = compose(tmp_path, [f"+exp_manager.explicit_ckpt_path={hydra_string(path)}",
                             "exp_manager.checkpoint_callback_params.save_top_k=2"])
    resolved = OmegaConf.to_container(OmegaConf.create(cfg), resolve=False)
    assert OmegaConf.create(resolved).exp_manager.explicit_ckpt_path == path
    assert resolved["exp_manager"]["checkpoint_callback_params"]["save_top_k"] == 2


@pytest.mark.parametrize("override", ["model.optim.eps=1e-8", "+model.optim.lr=0.1",
                                      "model.optim.epsilon=1"])
def test_hydra_refuses_what_the_config_does_not_have(tmp_path: Path, override: str) -> None:
    """The check above has teeth: Hydra refuses a missing key without `+` and a present key
    with it, exactly as it would on the cluster."""
    pytest.importorskip("hydra")
    from hydra.errors import ConfigCompositionException
    with pytest.raises(ConfigCompositionException):
        compose(tmp_path, [override])
