"""Export a NeMo (neuronx-nemo-megatron) GPT-NeoX checkpoint as a Hugging Face GPTNeoXForCausalLM
folder, and prove it on the next step's batch.

Takes the training pass's Hydra overrides (they size the model, its parallelism and its data) and
the export's flags (common/export_hf.py). The checkpoint is resume.py's newest complete one (or
--step). Each rank's file is read with NeMo's own xser loader where it imports (the Neuron image),
else with torch.load and its tensors folder; ranks are merged as upstream's converter merges them
(jobgen/payloads/upstream/export.json). The batch is read through NeMo's own index-map files
beside the data, blended and sampled as NeMo does; the proof is common/export_check.py's.
"""
from __future__ import annotations

import argparse
import math
import os
import pickle
import re
import sys
import types
from pathlib import Path
from typing import Any, Callable

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent), str(_HERE)]

import resume  # noqa: E402
from common import checkpoints, data_check, export_check, export_hf  # noqa: E402
from common.runtime import PayloadError  # noqa: E402

PROG = "nemo-export"
CONSUMED = re.compile(r"-consumed_samples=(\d+)(?:\.0*)?(?:-last)?\.ckpt$")
LAYER = re.compile(r"^model\.language_model\.encoder\.layers\.(\d+)\.(.+)$")
# NeMo's names -> GPTNeoXForCausalLM's, and how the TP ranks' slices join: 0 or 1, concatenated
# in TP rank order on that dim (column- / row-parallel weights); None, TP rank 0's (replicated).
IN_LAYER = {
    "input_layernorm.weight": ("input_layernorm.weight", None),
    "input_layernorm.bias": ("input_layernorm.bias", None),
    "post_attention_layernorm.weight": ("post_attention_layernorm.weight", None),
    "post_attention_layernorm.bias": ("post_attention_layernorm.bias", None),
    "self_attention.query_key_value.weight": ("attention.query_key_value.weight", 0),
    "self_attention.query_key_value.bias": ("attention.query_key_value.bias", 0),
    "self_attention.dense.weight": ("attention.dense.weight", 1),
    "self_attention.dense.bias": ("attention.dense.bias", None),
    "mlp.dense_h_to_4h.weight": ("mlp.dense_h_to_4h.weight", 0),
    "mlp.dense_h_to_4h.bias": ("mlp.dense_h_to_4h.bias", 0),
    "mlp.dense_4h_to_h.weight": ("mlp.dense_4h_to_h.weight", 1),
    "mlp.dense_4h_to_h.bias": ("mlp.dense_4h_to_h.bias", None),
}
OUTSIDE = {
    "model.language_model.embedding.word_embeddings.weight": ("gpt_neox.embed_in.weight", 0),
    "model.language_model.encoder.final_layernorm.weight": ("gpt_neox.final_layer_norm.weight",
                                                            None),
    "model.language_model.encoder.final_layernorm.bias": ("gpt_neox.final_layer_norm.bias", None),
    "model.language_model.output_layer.weight": ("output_layer.weight", 0),
}
OUTPUT = "output_layer.weight"   # GPTNeoXForCausalLM's own name for it, once the model is built
ROTARY = "self_attention.core_attention.rotary_emb.inv_freq"   # a buffer: checked, not exported
BLOCKS = {"gpt_j": True, "pre_ln": False}   # NeMo's block type -> HF use_parallel_residual
# Read at d22aabf (upstream/export.json): NeMo's RotaryEmbedding with rotary_percentage < 1 pairs
# head dim i with i + head_dim/2 and leaves the partner unrotated (not a rotation); GPT-NeoX
# rotates the first rotary_pct of each head in pairs (i, i + rotary_dims/2). No GPTNeoXConfig
# computes NeMo's function, so such a checkpoint is refused before the merge.
PARTIAL_ROTARY = ("neuronx-nemo-megatron's partial rotary embedding (rotary_percentage < 1) is "
                  "not GPT-NeoX's, and no Hugging Face config computes it: an export would load "
                  "and compute another model (jobgen/payloads/upstream/export.json); a model "
                  "trained with model.rotary_percentage 1.0 exports")


# --- the training pass's overrides ------------------------------------------------------------

class Overrides:
    """Hydra's ``key=value`` list as the trainer got it (the last one given wins)."""

    def __init__(self, items: list[str]) -> None:
        self.items = items
        self.values: dict[str, str] = {}
        for item in items:
            key, sep, value = item.partition("=")
            if sep:
                self.values[key.lstrip("+")] = value.strip()

    def text(self, key: str, default: str | None = None) -> str:
        if key in self.values:
            return _unquote(self.values[key])
        if default is None:
            raise PayloadError(f"the training pass's override {key} is missing (give the "
                               "training pass's own overrides)")
        return default

    def number(self, key: str, kind: Callable[[str], Any] = int, default: Any = None) -> Any:
        raw = self.text(key, None if default is None else str(default))
        try:
            return kind(raw)
        except ValueError:
            raise PayloadError(f"override {key}={raw}: not a number") from None

    def flag(self, key: str) -> bool:
        return self.text(key, "false").lower() == "true"

    def listed(self, key: str) -> list[str]:
        raw = self.text(key)
        inner = raw[1:-1] if raw.startswith("[") and raw.endswith("]") else raw
        parts, current, quote = [], "", ""
        for ch in inner:
            if quote:
                quote = "" if ch == quote else quote
                current += ch
            elif ch in "\"'":
                quote = ch
                current += ch
            elif ch == ",":
                parts.append(current)
                current = ""
            else:
                current += ch
        parts.append(current)
        return [_unquote(p.strip()) for p in parts if p.strip()]


def _unquote(value: str) -> str:
    """A Hydra value as the trainer read it (jobgen quotes strings as neuron_nemo.hydra_string)."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        inner = value[1:-1]
        inner = re.sub(r"(\\+)(?=[\"']|$)", lambda m: m.group(1)[:len(m.group(1)) // 2], inner)
        return inner.replace("\\${", "${")
    return value


def model_dims(o: Overrides) -> dict[str, Any]:
    """The model as the overrides size it, in GPTNeoXConfig's terms (with NeMo's padded vocab)."""
    kind = o.text("model.position_embedding_type", "learned_absolute")
    if kind != "rope":
        raise PayloadError(f"override model.position_embedding_type={kind}: GPT-NeoX has rotary "
                           "position embeddings only (rope)")
    block = o.text("model.transformer_block_type", "pre_ln")
    if block not in BLOCKS:
        raise PayloadError(f"override model.transformer_block_type={block}: GPT-NeoX computes "
                           f"{' or '.join(BLOCKS)} blocks only")
    hidden, heads = o.number("model.hidden_size"), o.number("model.num_attention_heads")
    layers = o.number("model.num_layers")
    pp = o.number("model.pipeline_model_parallel_size", int, 1)
    if hidden % heads or layers % pp:
        raise PayloadError(f"overrides: hidden {hidden} over {heads} heads, {layers} layers over "
                           f"{pp} pipeline stages do not divide")
    return {"hidden_size": hidden, "num_attention_heads": heads, "num_hidden_layers": layers,
            "intermediate_size": o.number("model.ffn_hidden_size"),
            "rotary_pct": o.number("model.rotary_percentage", float, 1.0),
            "max_position_embeddings": o.number("model.max_position_embeddings"),
            "layer_norm_eps": o.number("model.layernorm_epsilon", float, 1e-5),
            "use_parallel_residual": BLOCKS[block],
            "hidden_dropout": o.number("model.hidden_dropout", float, 0.0),
            "attention_dropout": o.number("model.attention_dropout", float, 0.0)}


def padded_vocab(tokens: int, o: Overrides) -> int:
    """NeMo's padding (_vocab_size_with_padding): up to make_vocab_size_divisible_by x TP."""
    multiple = o.number("model.make_vocab_size_divisible_by", int, 128) * \
        o.number("model.tensor_model_parallel_size", int, 1)
    return -(-tokens // multiple) * multiple


# --- the checkpoint -----------------------------------------------------------------------------

def placed(o: Overrides) -> tuple[resume.Layout, Path, Path]:
    """The run's rank layout, its checkpoint folder and the trainer's metrics.jsonl (relayed to
    RUN/train beside NeMo's RUN/nemo), as the overrides place them."""
    root = Path(o.text("exp_manager.checkpoint_callback_params.dirpath"))
    metrics = Path(o.text("exp_manager.explicit_log_dir")).parent / "train" / "metrics.jsonl"
    return resume.Layout.of(o.items), root, metrics


def complete(root: Path, layout: resume.Layout) -> tuple[
        list[checkpoints.Checkpoint], dict[int, resume.Unit], list[resume.Unit]]:
    """The complete checkpoints (resume.py's notion), oldest first, their units, and every unit
    found: what an export chooses from (and --list-sealed prints)."""
    found = resume.units(root, layout)
    done: dict[int, resume.Unit] = {}
    for unit in found:
        if unit.step not in done and resume.complete(unit, layout):
            done[unit.step] = unit
    listed = []
    for s in sorted(done):
        consumed = CONSUMED.search(done[s].name)
        if consumed is None:
            raise PayloadError(f"{root / done[s].name}: no consumed_samples= in its name (not "
                               "a NeMo checkpoint callback's file)")
        listed.append(checkpoints.Checkpoint(root / done[s].name, s,
                                             {"consumed_samples": int(consumed.group(1))}))
    return listed, done, found


def sealed(root: Path, layout: resume.Layout, step: int | None,
           metrics: Path) -> tuple[checkpoints.Checkpoint, resume.Unit]:
    """The complete checkpoint to export (resume.py's notion of complete): ``step``, or the
    newest the trainer logged a step after, as export_hf.sealed_step chooses."""
    listed, done, found = complete(root, layout)
    names = {u.step: u.name for u in reversed(found)}
    ckpt = export_hf.sealed_step(
        root, step, metrics, PROG, complete=listed,
        seal="every rank folder's megatron_neox--step=N-...ckpt whole, with xser its tensors",
        tag=lambda s: names.get(s, f"megatron_neox--step={s}-*.ckpt"))
    return ckpt, done[ckpt.step]


class _Reference:
    """NeMo's TensorReference (tid, shape, dtype), read without NeMo."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


class _Unpickler(pickle.Unpickler):
    """torch.load's unpickler for a NeMo ``.ckpt``: torch's tensor classes, plain containers,
    placeholders for TensorReference and for anything else (nothing of theirs runs)."""

    PLAIN = {("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
             ("builtins", "slice"), ("builtins", "complex"), ("builtins", "bytearray")}

    def find_class(self, module: str, name: str) -> Any:
        import torch
        if name == "TensorReference":
            return _Reference
        if (module, name) in self.PLAIN:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module.split(".")[0] == "torch" and (
                name.startswith("_rebuild") or name.endswith("Storage")
                or name in ("Size", "device", "_load_from_bytes")):
            return super().find_class(module, name)
        if module == "copyreg" and name == "_reconstructor":
            return lambda cls, base, state: cls()
        return type(name, (resume.Stub,), {})   # inert: nothing of theirs runs


_PICKLE = types.ModuleType("nemo_checkpoint_pickle")
_PICKLE.Unpickler = _Unpickler  # type: ignore[attr-defined]
_PICKLE.load = lambda handle, **kw: _Unpickler(handle, **kw).load()  # type: ignore[attr-defined]
_PICKLE.__dict__.update(dumps=pickle.dumps, Pickler=pickle.Pickler)


def _nemo_loader() -> Callable[[str], Any] | None:
    """NeMo's own xser loader (nemo.collections.nlp.parts.serialization), where it imports."""
    try:
        from nemo.collections.nlp.parts import serialization
    except Exception:   # noqa: BLE001  (no NeMo, no torch_xla: a CPU node)
        return None
    return lambda path: serialization.load(path, cpu_only=True)


def read_rank(path: Path, xser: bool, nemo_load: Callable[[str], Any] | None) -> dict[str, Any]:
    """One rank's ``state_dict``: every tensor, on the CPU."""
    import torch
    try:
        if xser and nemo_load is not None:
            state = nemo_load(str(path))["state_dict"]
        else:
            whole = torch.load(str(path), map_location="cpu", pickle_module=_PICKLE,
                               weights_only=False)
            state = whole.get("state_dict") if isinstance(whole, dict) else None
            if not isinstance(state, dict):
                raise PayloadError(f"{path}: no state_dict (not a NeMo checkpoint)")
            folder = path.with_name(path.name + ".tensors")
            state = {k: _resolve(v, folder, path) for k, v in state.items()}
    except PayloadError:
        raise
    except Exception as exc:   # noqa: BLE001  (zip, pickle and torch errors alike)
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise PayloadError(f"{path}: cannot be read as a NeMo checkpoint ({first})") from None
    bad = sorted(k for k, v in state.items() if not isinstance(v, torch.Tensor))
    if bad:
        raise PayloadError(f"{path}: {bad[0]} is not a tensor (saved with xser? the overrides "
                           f"say model.save_xser={'True' if xser else 'False'})")
    return state


def _resolve(value: Any, folder: Path, path: Path) -> Any:
    """A TensorReference's tensor: ``tensor_<tid>.pt`` in the tensors folder (one torch.save)."""
    import torch
    if not isinstance(value, _Reference):
        return value
    tid = getattr(value, "tid", None)
    if not isinstance(tid, int):
        raise PayloadError(f"{path}: a TensorReference without its tensor id")
    tensor = torch.load(str(folder / f"tensor_{tid}.pt"), map_location="cpu", weights_only=True)
    shape = getattr(value, "shape", None)
    if shape is not None and tuple(tensor.shape) != tuple(shape):
        raise PayloadError(f"{folder}/tensor_{tid}.pt: shape {list(tensor.shape)}, the "
                           f"checkpoint references {list(shape)}")
    return tensor


def join(name: str, slices: list[Any], dim: int | None) -> Any:
    """One tensor from the TP ranks' slices (in TP rank order)."""
    import torch
    return slices[0] if dim is None else torch.cat(slices, dim=dim)


def merge(parts: dict[tuple[int, int], dict[str, Any]], tp: int, pp: int,
          dims: dict[str, Any], source: Path) -> dict[str, Any]:
    """GPTNeoXForCausalLM's state dict from every (tp, pp) rank's NeMo state dict."""
    import torch
    per_stage = dims["num_hidden_layers"] // pp
    head = dims["hidden_size"] // dims["num_attention_heads"]
    rot = int(head * dims["rotary_pct"]) if dims["rotary_pct"] < 1 else head
    want_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    out: dict[str, Any] = {}
    for p in range(pp):
        names = set(parts[(0, p)])
        for t in range(1, tp):
            if set(parts[(t, p)]) != names:
                raise PayloadError(f"{source}: TP ranks 0 and {t} of pipeline stage {p} hold "
                                   "different parameters")
        for name in sorted(names):
            slices = [parts[(t, p)][name] for t in range(tp)]
            layer = LAYER.match(name)
            if layer and layer.group(2) == ROTARY:
                freq = slices[0].float()
                if tuple(freq.shape) != tuple(want_freq.shape) or not torch.allclose(
                        freq, want_freq, rtol=1e-4):
                    raise PayloadError(f"{source}: {name}: rotary frequencies of "
                                       f"{2 * freq.numel()} dims, the overrides' "
                                       f"model.rotary_percentage gives {rot}: another model's "
                                       "checkpoint")
                continue
            if layer and layer.group(2) in IN_LAYER and int(layer.group(1)) < per_stage:
                hf, dim = IN_LAYER[layer.group(2)]
                hf = f"gpt_neox.layers.{int(layer.group(1)) + p * per_stage}.{hf}"
            elif name in OUTSIDE:
                hf, dim = OUTSIDE[name]
            else:
                raise PayloadError(f"{source}: {name} (pipeline stage {p}) is not a parameter of "
                                   "the GPT-NeoX model the overrides describe: another model's "
                                   "checkpoint")
            if hf in out:
                raise PayloadError(f"{source}: {hf} is held by two pipeline stages")
            out[hf] = join(hf, slices, dim)
    return out


# --- the next step's batch, as NeMo's GPT dataset reads it --------------------------------------

class Indexed:
    """Megatron's mmap indexed dataset (``PREFIX.idx``/``.bin``), read with numpy."""

    def __init__(self, prefix: str) -> None:
        import numpy as np
        try:
            shape = data_check.megatron_shard(prefix, 0)
        except data_check.Problem as exc:
            raise PayloadError(f"model.data.data_prefix: {exc}") from None
        idx = np.memmap(prefix + ".idx", dtype=np.uint8, mode="r")
        header = data_check.IDX_HEADER
        _, _, _, count, _ = header.unpack(bytes(idx[:header.size]))
        self.sizes = np.frombuffer(idx, np.int32, count, header.size)
        self.pointers = np.frombuffer(idx, np.int64, count, header.size + 4 * count)
        self.tokens = np.memmap(prefix + ".bin", dtype=np.dtype(shape["dtype"]), mode="r")

    def get(self, seq: int, offset: int = 0, length: int | None = None) -> Any:
        start = int(self.pointers[seq]) // self.tokens.itemsize + offset
        n = int(self.sizes[seq]) - offset if length is None else length
        return self.tokens[start:start + n]


class TrainSet:
    """One prefix's train split through the index maps NeMo's GPTDataset saved
    (_build_index_mappings' names; _get_text's reading)."""

    def __init__(self, prefix: str, index_dir: str | None, samples: int, seq: int,
                 seed: int) -> None:
        import numpy as np
        base = os.path.join(index_dir, os.path.basename(prefix)) if index_dir else prefix
        stem = f"{base}_train_indexmap_{samples}ns_{seq}sl_{seed}s"
        maps = []
        for part in ("doc", "sample", "shuffle"):
            path = Path(f"{stem}_{part}_idx.npy")
            try:
                maps.append(np.load(path, mmap_mode="r", allow_pickle=False))
            except (OSError, ValueError):
                raise PayloadError(f"{path}: NeMo's index map of the training pass cannot be read "
                                   "(the step's batch is read through it)") from None
        self.doc_idx, self.sample_idx, self.shuffle_idx = maps
        self.data, self.seq = Indexed(prefix), seq

    def __len__(self) -> int:
        return int(self.sample_idx.shape[0]) - 1

    def text(self, idx: int) -> Any:
        import numpy as np
        idx = int(self.shuffle_idx[idx])
        (doc_f, off_f), (doc_l, off_l) = (map(int, self.sample_idx[idx]),
                                          map(int, self.sample_idx[idx + 1]))
        if doc_f == doc_l:
            pieces = [self.data.get(int(self.doc_idx[doc_f]), off_f, off_l - off_f + 1)]
        else:
            pieces = [self.data.get(int(self.doc_idx[doc_f]), off_f)]
            pieces += [self.data.get(int(self.doc_idx[d])) for d in range(doc_f + 1, doc_l)]
            pieces.append(self.data.get(int(self.doc_idx[doc_l]), 0, off_l + 1))
        sample = np.concatenate(pieces).astype(np.int64)
        if len(sample) < self.seq + 1:    # NeMo pads with -1 (loss masked there)
            sample = np.pad(sample, (0, self.seq + 1 - len(sample)), constant_values=-1)
        return sample


def blend_index(weights: list[float], lengths: list[int], size: int,
                bins: int = 100) -> Callable[[int], tuple[int, int]]:
    """MemoryEfficientBlendableDataset.get_ds_sample_idx: a blended index's dataset and sample."""
    import numpy as np
    bins = min(bins, size)
    norm = np.array(weights, dtype=np.float64)
    norm /= np.sum(norm)
    ds_index: list[int] = []
    ds_bias: list[int] = []
    for i, w in enumerate(norm):
        n = int(w * bins)
        ds_index.extend([i] * n)
        ds_bias.extend(range(n))
    rest = bins - len(ds_index)
    ds_index.extend([len(weights) - 1] * rest)
    ds_bias.extend(range(ds_bias[-1], ds_bias[-1] + rest))
    counts = [ds_index.count(i) for i in range(len(weights))]
    if min(counts) == 0:
        raise PayloadError("model.data.data_prefix: a weight too small for NeMo's 100 blending "
                           "bins (NeMo itself refuses it)")

    def where(idx: int) -> tuple[int, int]:
        b = idx % bins
        ds = ds_index[b]
        return ds, (ds_bias[b] + (idx // bins) * counts[ds]) % lengths[ds]
    return where


def step_rows(o: Overrides, consumed: int,
              limit: int | None) -> tuple[list[dict[str, Any]], int]:
    """The micro-batches of the step after the checkpoint's, every data-parallel rank's (rank
    order), as NeMo's MegatronPretrainingBatchSampler deals them; the first ``limit`` only."""
    import torch
    listed = o.listed("model.data.data_prefix")
    if len(listed) % 2 or not listed:
        raise PayloadError("override model.data.data_prefix: not NeMo's [weight, prefix, ...] list")
    weights = [float(w) for w in listed[0::2]]
    prefixes = listed[1::2]
    gbs, mbs = o.number("model.global_batch_size"), o.number("model.micro_batch_size")
    seq = o.number("model.data.seq_length", int, o.number("model.encoder_seq_length"))
    world = o.number("trainer.devices") * o.number("trainer.num_nodes", int, 1)
    dp = world // (o.number("model.tensor_model_parallel_size", int, 1)
                   * o.number("model.pipeline_model_parallel_size", int, 1))
    if gbs % (mbs * dp):
        raise PayloadError(f"overrides: global batch {gbs} is not micro-batch {mbs} x {dp} "
                           "data-parallel ranks x an accumulation")
    samples = o.number("trainer.max_steps") * gbs
    index_dir = o.values.get("model.data.index_mapping_dir")
    index_dir = None if index_dir in (None, "null") else _unquote(index_dir)
    # get_datasets_weights_and_num_samples: normalised weights, 0.5 % more samples each
    norm = [w / sum(weights) for w in weights]
    each = [int(math.ceil(samples * w * 1.005)) for w in norm]
    seed = o.number("model.seed")
    sets = [TrainSet(p, index_dir, n, seq, seed) for p, n in zip(prefixes, each)]
    where = blend_index(norm, [len(s) for s in sets], sum(each))
    total, start = sum(each), consumed % sum(each)
    if start + gbs > total:
        raise PayloadError(f"the step after consumed sample {consumed} runs past NeMo's "
                           f"{total} training samples")
    batch = list(range(start, start + gbs))
    micro = [chunk[k:k + mbs] for r in range(dp) for chunk in [batch[r::dp]]
             for k in range(0, len(chunk), mbs)]
    if limit is not None and not 2 <= limit <= len(micro):
        raise PayloadError(f"--micro-batches must lie in [2, {len(micro)}] (the step's "
                           "micro-batches)")

    def rows(indices: list[int]) -> dict[str, Any]:
        import numpy as np
        text = torch.from_numpy(np.stack([sets[d].text(i) for d, i in map(where, indices)]))
        return {"input_ids": text.clamp(min=0), "labels": text.masked_fill(text < 0, -100)}
    return [rows(m) for m in micro[:limit or len(micro)]], len(micro)


# --- the export ---------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="the training pass's Hydra overrides, as jobgen renders them")
    p.add_argument("--config-name", help="the training pass's (not read: the overrides say all)")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                   help="what the trainer computed its loss in (the proof's tolerance)")
    export_hf.add_flags(p)
    return p.parse_intermixed_args(argv)


def export(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    import torch
    import transformers

    o = Overrides(args.overrides)
    dims = model_dims(o)
    if dims["rotary_pct"] < 1:
        raise PayloadError(f"model.rotary_percentage={dims['rotary_pct']:g}: {PARTIAL_ROTARY}")
    layout, root, metrics = placed(o)
    ckpt, unit = sealed(root, layout, args.step, metrics)
    # The batch first: reading it is cheap, and a missing index map should not wait for the load.
    batches, total = step_rows(o, ckpt.info["consumed_samples"], args.micro_batches)
    nemo_load = _nemo_loader() if layout.xser else None
    folders = unit.folders
    tp, pp = layout.tp, layout.pp
    parts = {(t, p): read_rank(folders[t * pp + p if len(folders) > 1 else 0] / unit.name,
                               layout.xser, nemo_load)
             for t in range(tp) for p in range(pp)}
    state = merge(parts, tp, pp, dims, ckpt.path)
    del parts
    embed = state.get("gpt_neox.embed_in.weight")
    if embed is None:
        raise PayloadError(f"{ckpt.path}: no word embeddings in pipeline stage 0")
    args.vocab_size = int(embed.shape[0])
    tok = export_hf.run_tokenizer(args, wordpiece=False)
    if padded_vocab(len(tok), o) != args.vocab_size:
        raise PayloadError(f"{ckpt.path}: a vocabulary of {args.vocab_size}, where NeMo pads the "
                           f"tokenizer's {len(tok)} to {padded_vocab(len(tok), o)}: another "
                           "model's checkpoint or tokenizer")
    # NeMo's defaults where jobgen sets nothing: GELU, biases, untied output, rotary base 10000.
    config = transformers.GPTNeoXConfig(
        vocab_size=args.vocab_size, hidden_act="gelu", tie_word_embeddings=False,
        attention_bias=True, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
        **dims)
    read = (getattr(config, "rope_parameters", None) or {}).get(
        "partial_rotary_factor", getattr(config, "rotary_pct", None))
    if read is None or abs(float(read) - dims["rotary_pct"]) > 1e-9:
        raise PayloadError(f"transformers {transformers.__version__}: its GPTNeoXConfig did not "
                           f"take rotary_pct={dims['rotary_pct']:g}")
    torch.manual_seed(0)
    model = transformers.GPTNeoXForCausalLM(config)
    if OUTPUT in state:   # transformers 5 names the output layer lm_head, 4.x embed_out
        own = "lm_head.weight" if "lm_head.weight" in model.state_dict() else "embed_out.weight"
        state[own] = state.pop(OUTPUT)
    export_hf.load_weights(model, state, ckpt.path)
    del state
    try:
        logged = export_check.logged_loss(metrics, ckpt.step + 1)
    except export_check.Unproven:
        logged = None
    record = {"trainer": "neuron_nemo", "family": "gpt_neox", "model_class": type(model).__name__,
              "tensor_parallel": tp, "pipeline_parallel": pp, "xser": layout.xser,
              "reader": "nemo serialization.load" if nemo_load else "torch.load"}
    return export_hf.publish(model, tok, args.export_root, ckpt, batches, total, logged,
                             args.precision, record)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_sealed:   # the steps export() chooses from: resume.py's complete ones

        def listed() -> list[checkpoints.Checkpoint]:
            layout, root, _ = placed(Overrides(args.overrides))
            return complete(root, layout)[0]
        return export_hf.list_sealed(listed, PROG, args.on_node)
    return export_hf.run(lambda: export(args), PROG, args.on_node)


if __name__ == "__main__":
    sys.exit(main())
