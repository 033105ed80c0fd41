"""JSON Schemas (draft 2020-12) of recipes and site profiles, generated from the records the
loader builds (jobgen/recipe.py, jobgen/site.py: their field types, defaults and the comments
beside them) and from the value rules both the loader and the schema apply (LIMITS, enforced in
jobgen/rules.py). `jobgen schema recipe|site` prints them; editors read them through a
`# yaml-language-server: $schema=...` line."""
from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import typing
from collections import abc
from typing import Any, Literal, Union, get_args, get_origin

from . import schema

DRAFT = "https://json-schema.org/draft/2020-12/schema"
SEED_MAX = 2**32 - 1
# The range, enum and pattern rules of single values, by dotted key: JSON Schema's own keywords.
# rules.check_limits applies the same table when a recipe or site is loaded.
RECIPE_LIMITS: dict[str, dict[str, Any]] = {
    "name": {"pattern": schema.NAME_RE.pattern},
    "nodes": {"minimum": 1},
    **{f"model.{k}": {"minimum": 1} for k in (
        "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "seq_length",
        "vocab_size", "max_position_embeddings", "num_kv_heads", "max_predictions")},
    "model.transformer_block_type": {"enum": ["pre_ln", "post_ln", "normformer", "gpt_j"]},
    "model.hidden_dropout": {"minimum": 0, "exclusiveMaximum": 1},
    "model.attention_dropout": {"minimum": 0, "exclusiveMaximum": 1},
    "model.rotary_percentage": {"exclusiveMinimum": 0, "maximum": 1},
    "model.layernorm_epsilon": {"exclusiveMinimum": 0},
    "model.init_method_std": {"exclusiveMinimum": 0},
    "model.rope_theta": {"exclusiveMinimum": 0},
    **{f"parallelism.{k}": {"minimum": 1} for k in (
        "micro_batch_size", "tensor", "pipeline", "global_batch_size", "gradient_accumulation",
        "activation_loading_horizon")},
    "parallelism.hybrid_shard": {"minimum": 0},
    "optim.lr": {"exclusiveMinimum": 0},
    "optim.eps": {"exclusiveMinimum": 0},
    "optim.weight_decay": {"minimum": 0},
    "optim.grad_clip": {"exclusiveMinimum": 0},
    "optim.lr_scaling.base_nodes": {"minimum": 1},
    "schedule.max_steps": {"minimum": 1},
    "schedule.warmup_steps": {"minimum": 0},
    "schedule.constant_steps": {"minimum": 0},
    "schedule.decay_steps": {"minimum": 1},
    "schedule.warmup_fraction": {"minimum": 0, "maximum": 1},
    "schedule.constant_fraction": {"minimum": 0, "maximum": 1},
    "schedule.min_lr": {"minimum": 0},
    "data.num_workers": {"minimum": 0},
    "data.path": {"minLength": 1},
    "description": {"minLength": 1},
    "data.splits": {"pattern": r"^\s*(\d+(\.\d*)?|\.\d+)\s*([,/]\s*(\d+(\.\d*)?|\.\d+)\s*){2}$"},
    "checkpoint.every_steps": {"minimum": 1},
    "checkpoint.every_seconds": {"minimum": 1},
    "checkpoint.keep": {"minimum": 1},
    "compile.steps": {"minimum": 1},
    "job.max_restarts": {"minimum": 0, "maximum": 1000},
    "job.master_port": {"minimum": 1024, "maximum": 65535},
    "job.log_every_steps": {"minimum": 1},
    "seed": {"minimum": 0, "maximum": SEED_MAX},
}
SITE_LIMITS: dict[str, dict[str, Any]] = {
    "name": {"pattern": schema.NAME_RE.pattern},
    "slurm.cpus_per_task": {"minimum": 1},
    "slurm.max_nodes": {"minimum": 0},
    "slurm.time_limit_warning_s": {"minimum": 1, "maximum": 65535},
    **{f"slurm.{k}": {"pattern": schema.NAME_RE.pattern}
       for k in ("partition", "account", "qos", "reservation")},
    **{f"paths.{k}": {"minLength": 1} for k in ("work_dir", "data_dir", "compile_cache")},
    "batch.max_nodes": {"minimum": 0},
    "batch.timeout_hours": {"minimum": 1},
    "sagemaker.max_nodes": {"minimum": 0},
    "sagemaker.max_runtime_hours": {"minimum": 1, "maximum": 672},
    "eks.max_nodes": {"minimum": 0},
    "eks.namespace": {"pattern": r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"},
    # The health gate's numbers (platforms.check_health says the same on load).
    **{f"health.{k}": {"minimum": 0} for k in ("local_free_gib", "shared_free_gib",
                                               "clock_max_offset_ms", "collective_floor_gbps",
                                               "cost_s")},
    "health.timeout_s": {"minimum": 1, "maximum": 600},
    "health.max_requeues": {"minimum": 0, "maximum": 20},
    "health.efa_interfaces": {"minimum": 0, "maximum": 32},
}
_DESCRIPTIONS: dict[type, dict[str, str]] = {}


def _comments(cls: type) -> dict[str, str]:
    """The comment beside each field in the record's source: its description."""
    if cls not in _DESCRIPTIONS:
        found: dict[str, str] = {}
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            source = ""
        for line in source.splitlines():
            m = re.match(r"\s+(\w+): [^#]+#\s*(.*)", line)
            if m:
                found[m.group(1)] = m.group(2).strip()
        _DESCRIPTIONS[cls] = found
    return _DESCRIPTIONS[cls]


def _of(tp: Any, path: str, limits: dict[str, dict[str, Any]]) -> dict[str, Any]:
    origin = get_origin(tp)
    if origin is Union:
        inner = [a for a in get_args(tp) if a is not type(None)]
        out = _of(inner[0], path, limits)
        return {"anyOf": [out, {"type": "null"}]} if type(None) in get_args(tp) else out
    if origin is Literal:
        return {"enum": list(get_args(tp))}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer", **limits.get(path, {})}
    if tp is float:
        return {"type": "number", **limits.get(path, {})}
    if tp is str:
        return {"type": "string", **limits.get(path, {})}
    if tp is Any:
        return {}
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _of(args[0], path, limits)}
        return {"type": "array", "prefixItems": [_of(a, path, limits) for a in args],
                "minItems": len(args), "maxItems": len(args)}
    if origin in (dict, abc.Mapping):
        key_tp, val_tp = get_args(tp)
        mapping: dict[str, Any] = {"type": "object",
                                   "additionalProperties": _of(val_tp, f"{path}.*", limits)}
        if path.endswith("env"):
            mapping["propertyNames"] = {"pattern": schema.ENV_NAME_RE.pattern}
        return mapping
    if dataclasses.is_dataclass(tp):
        return record(typing.cast(type, tp), limits, path)
    raise TypeError(f"no JSON Schema for {tp!r}")


def record(cls: type, limits: dict[str, dict[str, Any]], path: str = "") -> dict[str, Any]:
    """The schema of one record: every field, required where the record has no default."""
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    notes = _comments(cls)
    properties: dict[str, Any] = {}
    required = []
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = f"{path}.{field.name}" if path else field.name
        prop = _of(hints[field.name], key, limits)
        if "anyOf" in prop:   # an Optional: the limits belong to the non-null branch
            prop["anyOf"][0].update(limits.get(key, {}))
        if field.name in notes:
            prop["description"] = notes[field.name]
        if field.default is not dataclasses.MISSING and isinstance(
                field.default, (str, int, float, bool)):
            prop["default"] = field.default
        if (field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING):
            required.append(field.name)
        properties[field.name] = prop
    out: dict[str, Any] = {"type": "object", "properties": properties,
                           "additionalProperties": False}
    if required:
        out["required"] = required
    return out


def recipe_schema() -> dict[str, Any]:
    from .recipe import OVERLAY_BACKENDS, Recipe
    body = record(Recipe, RECIPE_LIMITS)
    # A recipe may carry per-backend overlays of its own values (jobgen/recipe.py).
    body["properties"]["backends"] = {
        "type": "object", "description": "values that replace the recipe's for one backend",
        "propertyNames": {"enum": list(OVERLAY_BACKENDS)},
        "additionalProperties": {"type": "object"}}
    return {"$schema": DRAFT, "$id": "https://jobgen.invalid/schema/recipe.json",
            "title": "jobgen recipe", **body}


def site_schema() -> dict[str, Any]:
    from .site import Site
    return {"$schema": DRAFT, "$id": "https://jobgen.invalid/schema/site.json",
            "title": "jobgen site profile", **record(Site, SITE_LIMITS)}
