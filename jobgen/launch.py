"""Compatibility facade: the launch of a job now lives in `jobgen.payloads` (one module per
payload behind a registry). Kept so that code importing `jobgen.launch` keeps working."""
from __future__ import annotations

from .payloads import (  # noqa: F401  (re-exported)
    Launch,
    Pass,
    compile_cache_env,
    compile_key,
    env_block,
    for_spec,
)
from .payloads.neuron_nemo import hydra_value  # noqa: F401
from .payloads.neuronx_distributed import llama_config  # noqa: F401
from .spec import SMOKE  # noqa: F401
