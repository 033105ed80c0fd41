"""The trainers (payloads), one module each behind one registry, and the node contract.

The node contract (node.py) is every variable a job's nodes receive: it carries a payload's
launch, so it sits with the payloads, above the job spec. The rule users depend on: a recipe
value either reaches the trainer or is refused, naming the key and the payload. Adding a payload
(a module here, or an entry point in the group ``jobgen.payloads`` of a package of one's own):
docs/extending.md.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Optional, get_args, get_origin

from ..inputs import schema
from ..inputs.platforms import get as platform_of
from ..inputs.recipe import Recipe
from ..job.spec import JobSpec
from ..plumbing.errors import ConfigError
from .base import Launch, Pass, Payload, compile_cache_env

__all__ = ["BUILT_IN", "ENTRY_POINTS", "REGISTRY", "Launch", "Pass", "Payload", "check_recipe",
           "compile_cache_env", "compile_key", "env_block", "for_spec", "key_report"]

ENTRY_POINTS = "jobgen.payloads"
# The built-in payloads' modules (jobgen/payloads/NAME.py, each with its PAYLOAD record).
_MODULES = ("neuron_nemo", "neuronx_distributed", "habana_deepspeed", "smp_fsdp")


class _BuiltIn(dict):  # type: ignore[type-arg]
    """The built-in payloads by name; a payload's module is imported when it is first asked for
    (rendering one recipe loads one trainer's builder)."""

    def __missing__(self, name: str) -> Payload:
        if name not in _MODULES:
            raise KeyError(name)
        import importlib
        payload: Payload = importlib.import_module(f"{__name__}.{name}").PAYLOAD
        self[name] = payload
        return payload

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name: object) -> bool:
        return name in _MODULES or dict.__contains__(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*_MODULES, *dict.keys(self)]))

    def __len__(self) -> int:
        return sum(1 for _ in self)


BUILT_IN: dict[str, Payload] = _BuiltIn()


class _Registry(Mapping[str, Payload]):
    """The built-in payloads, then those registered by installed packages (entry points, looked
    up only when a name is not built in: rendering a built-in recipe reads no package metadata)."""

    def __init__(self) -> None:
        self._plugins: Optional[dict[str, Payload]] = None

    def plugins(self) -> dict[str, Payload]:
        if self._plugins is None:
            from importlib.metadata import entry_points
            found: dict[str, Payload] = {}
            for ep in entry_points(group=ENTRY_POINTS):
                if ep.name in BUILT_IN or ep.name in found:
                    raise ConfigError(f"entry point {ENTRY_POINTS}:{ep.name} ({ep.value}): "
                                      "a payload of that name is already registered")
                try:
                    payload = ep.load()
                except Exception as exc:  # noqa: BLE001  (any import error of someone's package)
                    raise ConfigError(f"entry point {ENTRY_POINTS}:{ep.name} ({ep.value}): "
                                      f"cannot load it: {type(exc).__name__}: {exc}") from None
                if not isinstance(payload, Payload) or payload.name != ep.name:
                    raise ConfigError(f"entry point {ENTRY_POINTS}:{ep.name} ({ep.value}): "
                                      "must name a jobgen.payloads.Payload whose name is "
                                      f"{ep.name!r}")
                found[ep.name] = payload
            self._plugins = found
        return self._plugins

    def __getitem__(self, name: str) -> Payload:
        found = BUILT_IN.get(name)
        return found if found is not None else self.plugins()[name]

    def __contains__(self, name: object) -> bool:
        return name in BUILT_IN or name in self.plugins()

    def __iter__(self) -> Iterator[str]:
        return iter([*BUILT_IN, *self.plugins()])

    def __len__(self) -> int:
        return len(BUILT_IN) + len(self.plugins())

    def clear(self) -> None:
        """Look the entry points up again (a test that installs one)."""
        self._plugins = None


REGISTRY = _Registry()

_MISSING = object()


LATER_KEYS = {"hybrid_shard": 0, "activation_offloading": False, "activation_loading_horizon": 2}


def compile_key(spec: JobSpec, lau: Launch) -> str:
    """Names the graphs a compile pass produces, for the cache marker: what shapes the model and
    the training step (model, parallelism and the derived batch sizes, optimizer, precision, the
    environment, the node count, the trainer). Where a run writes, how long it trains, its
    checkpointing and its name are left out: another run of the same spec finds the graphs."""
    r = spec.recipe
    optim = {k: v for k, v in schema.to_plain(r.optim).items() if k not in ("lr", "lr_scaling")}
    # Keys added after caches were filled count only when set, so existing markers stay valid.
    parallelism = {k: v for k, v in schema.to_plain(r.parallelism).items()
                   if k not in LATER_KEYS or v != LATER_KEYS[k]}
    blob = json.dumps({
        "payload": r.payload, "model": schema.to_plain(r.model),
        "parallelism": parallelism, "precision": r.precision, "optim": optim,
        "sizes": [spec.nodes, spec.workers_per_node, spec.data_parallel,
                  spec.gradient_accumulation, spec.global_batch_size],
        "env": env_block(spec), "launcher": lau.launcher, "program": lau.program,
        "compile_steps": r.compile.steps, "smoke": spec.smoke,
    }, sort_keys=True)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
    return f"{r.name}-{spec.nodes}n{'-smoke' if spec.smoke else ''}-{digest}"




def env_block(spec: JobSpec) -> list[tuple[str, str]]:
    """The exported environment, in order: the platform's (network), the payload's (compiler,
    precision), then the recipe's own."""
    recipe = spec.recipe
    env: dict[str, str] = dict(spec.platform.env)
    payload = REGISTRY[recipe.payload]
    if payload.environment is not None:
        env.update(payload.environment(recipe))
    env.update(recipe.env)
    if spec.smoke:
        # The rehearsal keeps the whole environment above and runs on CPU processes.
        env.update({"JOBGEN_SMOKE": "1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})
    return list(env.items())


def _dataclass_of(tp: Any) -> Optional[type]:
    if get_origin(tp) is typing.Union:
        inner = [a for a in get_args(tp) if a is not type(None)]
        tp = inner[0] if len(inner) == 1 else tp
    return tp if dataclasses.is_dataclass(tp) and isinstance(tp, type) else None


def leaf_keys(cls: type = Recipe, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every key path of the recipe schema with its default (``_MISSING`` when required).
    A nested optional record (optim.lr_scaling) is a key itself and so are its fields."""
    hints = schema.type_hints(cls)
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = _MISSING
        inner = _dataclass_of(hints[f.name])
        if inner is None:
            yield path, default
            continue
        if default is None:  # an optional record: set or not
            yield path, None
        for sub, sub_default in leaf_keys(inner, path + "."):
            yield sub, sub_default


def value_at(recipe: Recipe, path: str) -> Any:
    node: Any = recipe
    for part in path.split("."):
        if node is None:
            return None
        node = getattr(node, part)
    return node


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return dict(a or {}) == dict(b or {})
    return bool(a == b)


# Sections no trainer reads, so no payload declares them: the environment and launch knobs
# (checked on their own), and the eval stage's tasks (payload/common/eval_lm.py).
NOT_THE_TRAINERS = ("env", "launch", "eval")


def check_recipe(recipe: Recipe, source: str) -> None:
    """Refuse what the recipe's payload cannot do or would silently ignore."""
    payload = REGISTRY.get(recipe.payload)
    if payload is None:
        raise ConfigError(f"{source}: payload: unknown payload {recipe.payload!r} "
                          f"(known: {', '.join(REGISTRY)})")
    name = payload.name
    platform = platform_of(recipe.platform, source)
    if platform.accelerator != payload.accelerator:
        raise ConfigError(f"{source}: platform: payload {name} runs on "
                          f"{payload.accelerator} platforms, not on {platform.name} "
                          f"({platform.accelerator})")
    if recipe.model.family not in payload.families:
        raise ConfigError(f"{source}: model.family: payload {name} trains "
                          f"{', '.join(payload.families)}, not {recipe.model.family}")
    for key in recipe.launch:
        if key not in payload.launch_keys:
            known = ", ".join(payload.launch_keys) or "none"
            raise ConfigError(f"{source}: launch.{key}: not a launch setting of payload {name} "
                              f"(known: {known})")
    for path, default in leaf_keys():
        value = value_at(recipe, path)
        fixed = payload.fixed.get(path)
        if fixed is not None:
            if value is not None and not _same(value, fixed.value):
                raise ConfigError(f"{source}: {path}: payload {name} accepts only "
                                  f"{schema.describe(fixed.value)} ({fixed.why}), got "
                                  f"{schema.describe(value)}")
        elif path not in payload.honours and path.split(".")[0] not in NOT_THE_TRAINERS:
            if default is _MISSING or not _same(value, default):
                shown = "unset" if default in (None, _MISSING) else schema.describe(default)
                raise ConfigError(f"{source}: {path}: payload {name} does not use this key, so "
                                  f"{schema.describe(value)} would be silently ignored (remove "
                                  f"it or leave it {shown})")
        reasons = payload.refused_values.get(path, {})
        if isinstance(value, typing.Hashable) and value in reasons:
            raise ConfigError(f"{source}: {path}: payload {name} cannot use "
                              f"{schema.describe(value)}: {reasons[value]}")


def key_report(recipe: Recipe) -> dict[str, Any]:
    """For `jobgen show`: which recipe values reach the job, which are fixed by the trainer and
    which the payload does not use (those are at their defaults, or the recipe is refused)."""
    payload = REGISTRY[recipe.payload]
    used: list[str] = []
    unused: list[str] = []
    for path, _default in leaf_keys():
        if path in payload.fixed or path.split(".")[0] == "eval":
            continue
        (used if path in payload.honours else unused).append(path)
    return {"name": payload.name, "reaches_the_job": used,
            "fixed_by_the_trainer": {k: f"{schema.describe(f.value)}: {f.why}"
                                     for k, f in payload.fixed.items()},
            "not_used (must stay at the default)": unused}


def for_spec(spec: JobSpec, backend: Optional[str] = None) -> Launch:
    """The launch of this spec: the smoke stand-in for a rehearsal, else the payload's own."""
    payload = REGISTRY.get(spec.recipe.payload)
    if spec.smoke:
        # A program that runs on CPU rehearses itself (its record says); the others have the
        # smoke trainer (the BERT program's rehearsal included: jobgen/payloads/smoke.py).
        if payload is not None and payload.rehearses_itself:
            return payload.build(spec)
        from . import smoke
        return smoke.build(spec, payload.data if payload is not None else ())
    if payload is None:
        raise ConfigError(f"{spec.source}: payload: {spec.recipe.payload} cannot run on "
                          f"{backend or spec.backend} yet")
    return payload.build(spec)


def resolved(rec: Any, source: str, profile: Any, nodes: Optional[int] = None,
             **options: Any) -> JobSpec:
    """A recipe resolved on a site (jobgen/job/spec.py) and checked against its payload (the keys
    it honours, its own rules): every caller that makes a spec comes through here."""
    from ..job.spec import resolve
    spec = resolve(rec, source, profile, nodes, **options)
    check_recipe(rec, source)
    return spec
