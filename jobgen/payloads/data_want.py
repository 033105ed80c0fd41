"""What a job's dataset must be (the data check's input, payload/common/data_check.py): the
format its trainer declares, the recipe's paths, the spec's numbers. It sits below the registry,
so that the rehearsal's builder (smoke.py) decides with the answer the nodes' check gets."""
from __future__ import annotations

import os
from typing import Any, Optional

from ..job.spec import JobSpec


def _train_share(splits: Optional[str]) -> float:
    """The training share of Megatron's splits string ("980,10,10" -> 0.98)."""
    if not splits:
        return 1.0
    parts = [float(p) for p in splits.replace("/", ",").split(",") if p.strip()]
    return parts[0] / sum(parts) if parts and sum(parts) > 0 else 1.0


def _padded(vocab: int, multiple: int) -> int:
    """NeMo's padded vocabulary: the next multiple of make_vocab_size_divisible_by (which
    neuron_nemo.py sets to parallelism.tensor) times the tensor-parallel size."""
    return -(-vocab // multiple) * multiple


def wanted(spec: JobSpec, declared: tuple[str, ...]) -> Optional[dict[str, Any]]:
    """The data check's input for this job, whose trainer declares `declared` (its payload
    record's `data`), or None where it reads no dataset (it declares none; a rehearsal where no
    dataset was prepared at the recipe's paths on this host, nor is by an earlier job of its
    submission, spec.data_prepared: it trains on made-up batches). A
    rehearsal's dataset (payload/smoke/prepare_data.py's) is judged at the rehearsal's sequence
    length, vocabulary and batch."""
    if not declared or (spec.smoke and not (spec.data_prepared
                                            or _prepared_here(spec, declared))):
        return None
    rec, fmt, t = spec.recipe, declared[0], spec.rehearsal
    want: dict[str, Any] = {
        "format": fmt, "recipe": spec.source, "key": "data.path",
        "seq_length": t.seq_length if t else rec.model.seq_length,
        "vocab_size": t.vocab_size if t else rec.model.vocab_size,
        "global_batch": spec.global_batch_size,
        "planned_samples": spec.global_batch_size * (t.max_steps if t else
                                                     rec.schedule.max_steps),
    }
    if t:
        want["vocab_key"] = "the rehearsal vocab_size"   # else model.vocab_size
    if fmt == "megatron":
        if not t:   # NeMo pads it (jobgen/payloads/upstream/neuron_nemo.json: vocab_padding)
            want["vocab_padded"] = _padded(rec.model.vocab_size, rec.parallelism.tensor ** 2)
        want["prefixes"] = spec.data_prefixes()
        want["train_share"] = _train_share(rec.data.splits)
        if rec.data.vocab_file:
            want["vocab_file"] = spec.data_path(rec.data.vocab_file)
    elif fmt == "hf_blocks":
        want["path"] = spec.data_path(rec.data.path)
        want["columns"] = list(declared[1:])
    else:
        want["path"] = spec.data_path(rec.data.path)
        want["max_predictions"] = t.max_predictions if t else rec.model.max_predictions
    return want


def _prepared_here(spec: JobSpec, data: tuple[str, ...]) -> bool:
    """Whether anything of the recipe's dataset is at its paths on this host (a half-written
    one too: the data check then stops the rehearsal before its compile pass)."""
    if data[0] == "megatron":
        return any(os.path.exists(p + ".idx") or os.path.exists(p + ".bin")
                   for p in spec.data_prefixes())
    return os.path.isdir(spec.data_path(spec.recipe.data.path))
