"""What a NeMo GPT-NeoX training pass leaves on disk, written here from upstream's descriptions
(neuronx-nemo-megatron d22aabf; jobgen/payloads/upstream/export.json) for the export's tests:

- ``rank_states``: a GPTNeoXForCausalLM's weights as each (TP, PP) rank of NeMo's GPT model
  holds them, in NeMo's names (model.language_model...; layers numbered per pipeline stage;
  column-parallel weights split on dim 0, row-parallel on dim 1, norms and row-parallel biases
  whole on every TP rank; each layer's rotary inv_freq buffer);
- ``save``: a checkpoint file as NeMo's XLACheckpointIO writes it, plain (torch.save) or xser
  (parts/serialization.py: every tensor replaced by a TensorReference(tid, shape, dtype) pickled
  under NeMo's module name, each tensor one torch.save in ``<file>.tensors/tensor_<tid>.pt``);
- ``index_maps``: the doc/sample/shuffle index files NeMo's GPTDataset saves beside a prefix.
"""
from __future__ import annotations

import contextlib
import sys
import types
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

XSER_MODULE = "nemo.collections.nlp.parts.serialization"


class TensorReference:
    def __init__(self, tid: int, shape: Any, dtype: Any) -> None:
        self.tid, self.shape, self.dtype = tid, shape, dtype


TensorReference.__module__ = XSER_MODULE


def rank_states(hf: dict[str, torch.Tensor], tp: int, pp: int, layers: int,
                rotary_dims: int) -> dict[tuple[int, int], dict[str, torch.Tensor]]:
    per = layers // pp
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dims, 2).float() / rotary_dims))
    split = {"attention.query_key_value.weight": ("self_attention.query_key_value.weight", 0),
             "attention.query_key_value.bias": ("self_attention.query_key_value.bias", 0),
             "attention.dense.weight": ("self_attention.dense.weight", 1),
             "attention.dense.bias": ("self_attention.dense.bias", None),
             "mlp.dense_h_to_4h.weight": ("mlp.dense_h_to_4h.weight", 0),
             "mlp.dense_h_to_4h.bias": ("mlp.dense_h_to_4h.bias", 0),
             "mlp.dense_4h_to_h.weight": ("mlp.dense_4h_to_h.weight", 1),
             "mlp.dense_4h_to_h.bias": ("mlp.dense_4h_to_h.bias", None)}
    for norm in ("input_layernorm", "post_attention_layernorm"):
        for kind in ("weight", "bias"):
            split[f"{norm}.{kind}"] = (f"{norm}.{kind}", None)

    def piece(tensor: torch.Tensor, dim: Any, t: int) -> torch.Tensor:
        return tensor.clone() if dim is None else tensor.chunk(tp, dim=dim)[t].clone()

    out: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    output = hf.get("lm_head.weight", hf.get("embed_out.weight"))
    for t in range(tp):
        for p in range(pp):
            state: dict[str, torch.Tensor] = {}
            if p == 0:
                state["model.language_model.embedding.word_embeddings.weight"] = piece(
                    hf["gpt_neox.embed_in.weight"], 0, t)
            for local in range(per):
                layer = local + p * per
                prefix = f"model.language_model.encoder.layers.{local}."
                for ours, (theirs, dim) in split.items():
                    state[prefix + theirs] = piece(hf[f"gpt_neox.layers.{layer}.{ours}"], dim, t)
                state[prefix + "self_attention.core_attention.rotary_emb.inv_freq"] = \
                    inv_freq.clone()
            if p == pp - 1:
                for kind in ("weight", "bias"):
                    state[f"model.language_model.encoder.final_layernorm.{kind}"] = \
                        hf[f"gpt_neox.final_layer_norm.{kind}"].clone()
                state["model.language_model.output_layer.weight"] = piece(output, 0, t)
            out[(t, p)] = state
    return out


def lightning(state: dict[str, torch.Tensor], step: int) -> dict[str, Any]:
    """A Lightning checkpoint's dict around the model's state (what NeMo saves besides)."""
    first = next(iter(state.values()))
    return {"epoch": 0, "global_step": step, "pytorch-lightning_version": "1.8.6",
            "state_dict": state,
            "optimizer_states": [{"state": {0: {"exp_avg": torch.zeros_like(first)}},
                                  "param_groups": [{"lr": 1e-4, "params": [0]}]}],
            "hyper_parameters": {"cfg": types.SimpleNamespace(precision=32)}}


@contextlib.contextmanager
def _xser_module() -> Iterator[None]:
    """NeMo's module name importable while pickling (pickle finds the class by it)."""
    names = XSER_MODULE.split(".")
    added = []
    for k in range(1, len(names) + 1):
        name = ".".join(names[:k])
        if name not in sys.modules:
            sys.modules[name] = types.ModuleType(name)
            added.append(name)
    sys.modules[XSER_MODULE].TensorReference = TensorReference  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for name in added:
            del sys.modules[name]


def save(data: dict[str, Any], path: Path, xser: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not xser:
        torch.save(data, path)
        return
    folder = path.with_name(path.name + ".tensors")
    folder.mkdir()
    count = [0]

    def swap(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            tid = count[0]
            count[0] += 1
            torch.save(value, folder / f"tensor_{tid}.pt")
            return TensorReference(tid, value.shape, value.dtype)
        if isinstance(value, dict):
            return type(value)((k, swap(v)) for k, v in value.items())
        if isinstance(value, (list, tuple)):
            return type(value)(swap(v) for v in value)
        return value

    refs = swap(data)
    with _xser_module():
        torch.save(refs, path)


def index_maps(stem: str, sizes: list[int], samples: int, seq: int, seed: int) -> None:
    """``{stem}_doc_idx.npy`` (documents over enough epochs, shuffled), ``_sample_idx.npy``
    ([position in doc_idx, offset] of each sample's first token; sample k spans seq + 1 tokens
    from row k to row k + 1's position, the last shared with the next) and ``_shuffle_idx.npy``."""
    rng = np.random.RandomState(seed)
    per_epoch = sum(sizes)
    epochs = 1
    while (epochs * per_epoch - 1) // seq < samples:
        epochs += 1
    doc_idx = np.tile(np.arange(len(sizes), dtype=np.int32), epochs)
    rng.shuffle(doc_idx)
    count = (epochs * per_epoch - 1) // seq
    starts = np.cumsum([0] + [sizes[d] for d in doc_idx])
    rows = []
    for k in range(count + 1):
        at = k * seq
        j = int(np.searchsorted(starts, at, side="right")) - 1
        j = min(j, len(doc_idx) - 1)
        rows.append((j, at - int(starts[j])))
    shuffle = np.arange(count, dtype=np.uint32)
    rng.shuffle(shuffle)
    np.save(f"{stem}_doc_idx.npy", doc_idx, allow_pickle=True)
    np.save(f"{stem}_sample_idx.npy", np.array(rows, dtype=np.int32), allow_pickle=True)
    np.save(f"{stem}_shuffle_idx.npy", shuffle, allow_pickle=True)
