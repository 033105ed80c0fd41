"""A recipe's per-backend overlays (`backends:`): values that replace the recipe's own for one
backend, taken out of the raw recipe data and merged in before the recipe is built
(jobgen/inputs/recipe.py). Plain mappings in, a plain mapping out."""
from __future__ import annotations

from typing import Any, Optional

from ..plumbing.errors import ConfigError


def overlay_backends() -> tuple[str, ...]:
    """The backends a recipe may carry an overlay for (`backends:`): where the same model is
    trained with another trainer or instance type (SageMaker's model-parallel library runs on
    GPU instances). Every backend that resolves its own spec (submitit's is Slurm's)."""
    from .. import backends
    return backends.having(lambda d: not d.spec_backend)


# Sections an overlay replaces whole instead of merging key by key: their keys belong to one
# trainer (a Neuron runtime variable means nothing to a GPU trainer).
OVERLAY_REPLACES = ("env", "launch")


def _merged(base: dict[str, Any], overlay: dict[str, Any], top: bool = True) -> dict[str, Any]:
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) \
                and not (top and key in OVERLAY_REPLACES):
            out[key] = _merged(out[key], value, top=False)
        else:
            out[key] = value
    return out


def apply_overlay(data: dict[str, Any], backend: Optional[str], where: str) -> dict[str, Any]:
    """Take the recipe's `backends:` section out of `data` and, for `backend`, apply its overlay
    (values replace the recipe's; mappings merge, except env and launch, which are replaced)."""
    data = dict(data)
    overlays = data.pop("backends", None)
    if overlays is None:
        return data
    if not isinstance(overlays, dict):
        raise ConfigError(f"{where}: backends: must be a mapping of backend name to recipe "
                          "values")
    for name, overlay in overlays.items():
        if name not in overlay_backends():
            raise ConfigError(f"{where}: backends.{name}: not a backend (backends: "
                              f"{', '.join(overlay_backends())})")
        if not isinstance(overlay, dict):
            raise ConfigError(f"{where}: backends.{name}: must be a mapping of recipe values")
        for key in overlay:
            if key in ("name", "backends"):
                raise ConfigError(f"{where}: backends.{name}.{key}: cannot be changed per "
                                  "backend")
    chosen = overlays.get(backend) if backend else None
    return _merged(data, chosen) if chosen else data
