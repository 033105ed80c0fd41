"""Runs NeMo's pretraining script (argv[1], then its arguments) with its GPT dataset's index
files made on every node, for nodes that share no disk (launch.sh uses it where
JOBGEN_SHARED_FS=0 and NeMo is given a model.data.index_mapping_dir; the design and why:
payload/common/node_indices.py).

Before the script runs: on each node's local rank 0, index files built in advance beside the
data prefixes are linked into the index folder; then NeMo's gpt_dataset module is made to build
the missing ones on each node's local rank 0 (its own rendezvous then waits for all builders).
"""
from __future__ import annotations

import os
import re
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import node_indices  # noqa: E402

# neuronx-nemo-megatron's module that builds the index files (d22aabf): _build_index_mappings.
DATASET_MODULE = "nemo.collections.nlp.data.language_modeling.megatron.gpt_dataset"


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def override(args: list[str], key: str) -> str | None:
    """The last value given to Hydra override ``key`` (``key=...`` or ``+key=...``)."""
    found = None
    for arg in args:
        name, sep, value = arg.partition("=")
        if sep and name.lstrip("+") == key:
            found = value
    return found


def data_prefixes(value: str | None) -> list[str]:
    """The paths of ``model.data.data_prefix=[w1,path1,w2,path2,...]`` (weights dropped)."""
    if not value:
        return []
    items = [_unquote(item) for item in re.split(r",", value.strip().strip("[]")) if item.strip()]
    return [item for item in items[1::2] if item]


def prepare(args: list[str], env: dict[str, str] | None = None) -> bool:
    """Link what was built in advance and install the per-node build; whether it did."""
    env = dict(os.environ) if env is None else env
    index_dir = override(args, "model.data.index_mapping_dir")
    if not node_indices.per_node(env) or not index_dir or index_dir == "null":
        return False
    index_dir = _unquote(index_dir)
    if str(env.get("LOCAL_RANK", "0") or "0") == "0":
        Path(index_dir).mkdir(parents=True, exist_ok=True)
        linked = node_indices.seed_prebuilt(
            data_prefixes(override(args, "model.data.data_prefix")), index_dir)
        if linked:
            print(f"jobgen: {len(linked)} index file(s) built in advance beside the data, "
                  f"linked into {index_dir}", file=sys.stderr, flush=True)
    import importlib
    node_indices.install(importlib.import_module(DATASET_MODULE), env)
    return True


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: per_node_indices.py PROGRAM [ARG...]")
    program, args = sys.argv[1], sys.argv[2:]
    prepare(args)
    sys.argv = [program, *args]
    runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
    main()
