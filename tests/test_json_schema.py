"""`jobgen schema recipe|site`: JSON Schemas (draft 2020-12) generated from the records and value
rules the loader uses. The shipped copies are what the command prints; every built-in recipe and
site validates; values the loader refuses for type, enum or range, the schema refuses too."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from jobgen.inputs import json_schema
from jobgen.inputs import recipe as recipes
from jobgen.inputs import site as sites
from jobgen.inputs.yaml12 import loads
from jobgen.plumbing.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
JOBGEN = Path(sys.executable).parent / "jobgen"
RECIPE = json_schema.recipe_schema()
SITE = json_schema.site_schema()


@pytest.mark.parametrize(("what", "shipped"), [("recipe", "recipes/recipe.schema.json"),
                                               ("site", "env/sites/site.schema.json")])
def test_the_shipped_schemas_are_what_the_command_prints(what: str, shipped: str) -> None:
    proc = subprocess.run([str(JOBGEN), "schema", what], capture_output=True, text=True,
                          timeout=60, check=True)
    assert json.loads(proc.stdout) == json.loads((ROOT / shipped).read_text()), \
        f"regenerate: jobgen schema {what} > {shipped}"
    jsonschema.Draft202012Validator.check_schema(json.loads(proc.stdout))


def test_every_built_in_recipe_and_site_validates_and_names_its_schema() -> None:
    for pattern, body, line in (("recipes/*.yaml", RECIPE, "recipe.schema.json"),
                                ("env/sites/*.yaml", SITE, "site.schema.json")):
        for path in sorted(ROOT.glob(pattern)):
            text = path.read_text()
            assert text.startswith(f"# yaml-language-server: $schema={line}\n"), path
            errors = [e.message for e in jsonschema.Draft202012Validator(body).iter_errors(
                loads(text))]
            assert errors == [], (path, errors)


def _set(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return data


BAD_RECIPE_VALUES = [
    ("nodes", 0), ("nodes", "four"), ("seed", -1), ("seed", 2**32), ("job.master_port", 80),
    ("job.log_every_steps", 0), ("job.max_restarts", 5000), ("model.hidden_dropout", 1.0),
    ("model.transformer_block_type", "foo"), ("model.transformer_block_type", True),
    ("model.position_embedding_type", "alibi"), ("precision", "fp16"),
    ("parallelism.tensor", 0), ("parallelism.tensor", "eight"), ("data.splits", "abc"),
    ("data.splits", "99,1"), ("data.num_workers", -3), ("optim.lr", 0), ("optim.name", "sgd"),
    ("schedule.max_steps", 0), ("schedule.warmup_fraction", 1.5), ("checkpoint.keep", 0),
    ("model.num_layers", 0), ("unknown_key", 1), ("model.unknown", 1), ("env.1BAD", "x"),
    ("name", "a b"), ("data.path", ""), ("description", ""),
    ("eval.tasks.mmlu", 65), ("eval.tasks.mmlu", -1), ("eval.tasks.mmlu", "five"),
    ("eval.tasks.a b", 0), ("eval.shots", 5),
]


@pytest.mark.parametrize(("key", "value"), BAD_RECIPE_VALUES)
def test_what_the_loader_refuses_the_schema_refuses(tmp_path: Path, key: str,
                                                    value: Any) -> None:
    base = loads((ROOT / "recipes" / "pythia6.9b.yaml").read_text())
    bad = _set(base, key, value)
    assert list(jsonschema.Draft202012Validator(RECIPE).iter_errors(bad)), (key, value)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError):
        from jobgen import api
        api.job_spec(str(path), 4)


BAD_SITE_VALUES = [("slurm.cpus_per_task", 0), ("slurm.max_nodes", -1),
                   ("slurm.time_limit_warning_s", 70000), ("slurm.partition", "a b"),
                   ("slurm.master_resolver", "dig"), ("batch.timeout_hours", 0),
                   ("eks.namespace", "Bad_Name"), ("sagemaker.max_runtime_hours", 700),
                   ("paths.nope", "x"), ("paths.work_dir", "")]


@pytest.mark.parametrize(("key", "value"), BAD_SITE_VALUES)
def test_what_the_site_loader_refuses_the_site_schema_refuses(tmp_path: Path, key: str,
                                                              value: Any) -> None:
    base = loads((ROOT / "env" / "sites" / "local.yaml").read_text())
    bad = _set(base, key, value)
    assert list(jsonschema.Draft202012Validator(SITE).iter_errors(bad)), (key, value)
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError):
        sites.load(str(path))


def test_descriptions_come_from_the_records() -> None:
    model = RECIPE["properties"]["model"]["properties"]
    assert "masked-LM predictions per sequence" in model["max_predictions"]["description"]
    assert RECIPE["properties"]["seed"]["maximum"] == 2**32 - 1
    assert RECIPE["required"][:3] == ["name", "description", "payload"]
    assert recipes.recipe_names()   # the loader and the schema read the same folder
