"""The trainer flags jobgen's own training programs share, written from the spec in one place.

``shared(spec, which)`` gives every shared flag's value for a pass (the recipe's, or the
rehearsal's for `--smoke`); a payload module lists, in its own order, the flags its program takes
(``render``). Each program declares the same flags once, in payload/common/args.py, and
tests/test_payload_flags.py holds the two lists equal. A value is a string (``--flag value``), a
tuple (``--flag v1 v2 ...``), True (the switch alone) or False/None (the flag left out).
"""
from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Optional, Union

from ..job.spec import JobSpec
from .base import Pass, number

Value = Union[str, bool, tuple[str, ...], None]

# Every flag ``shared`` can give (payload/common/args.py declares each).
SHARED = (
    "phase", "compile-steps", "max-steps", "seed", "output-dir", "data-dir", "checkpoint-every",
    "keep-checkpoints", "sync-save", "log-every",
    "family", "num-layers", "hidden-size", "num-heads", "intermediate-size", "vocab-size",
    "seq-length", "max-position-embeddings", "init-std", "scaled-init",
    "micro-batch-size", "gradient-accumulation", "lr", "min-lr", "warmup-steps",
    "constant-steps", "decay-steps", "schedule", "beta1", "beta2", "eps", "weight-decay",
    "no-decay", "grad-clip",
)


def shared(spec: JobSpec, which: Pass) -> dict[str, Value]:
    """The shared flags' values for pass `which`. A rehearsal has no data set (its program makes
    its own) and no hold after warmup, so those two flags are absent from it."""
    r = spec.recipe
    m, p, o, s, c = r.model, r.parallelism, r.optim, r.schedule, r.checkpoint
    values: dict[str, Value] = {
        "phase": which,
        "compile-steps": str(r.compile.steps),
        "seed": str(r.seed),
        "output-dir": posixpath.join(spec.run_dir, "train" if which == "train" else "compile"),
        "log-every": str(r.job.log_every_steps),
        "init-std": number(m.init_method_std or 0.02),
        "scaled-init": bool(m.scaled_init),
        "schedule": s.name,
        "beta1": number(o.betas[0]),
        "beta2": number(o.betas[1]),
        "eps": number(o.eps),
        "weight-decay": number(o.weight_decay),
        "grad-clip": number(o.grad_clip),
        "no-decay": tuple(o.no_decay) if o.no_decay is not None else None,
        # Saves run in the background unless the recipe says otherwise (checkpoint.async_save).
        "sync-save": c.async_save is False,
    }
    t = spec.rehearsal
    if t is None:
        values.update({
            "family": m.family,
            "num-layers": str(m.num_layers),
            "hidden-size": str(m.hidden_size),
            "num-heads": str(m.num_attention_heads),
            "intermediate-size": str(m.ffn_hidden_size),
            "vocab-size": str(m.vocab_size),
            "seq-length": str(m.seq_length),
            "max-position-embeddings": str(m.max_position_embeddings),
            "micro-batch-size": str(p.micro_batch_size),
            "gradient-accumulation": str(spec.gradient_accumulation),
            "max-steps": str(s.max_steps),
            "lr": number(spec.lr),
            "min-lr": number(s.min_lr),
            "warmup-steps": str(spec.warmup_steps),
            "constant-steps": str(spec.constant_steps),
            "decay-steps": str(s.decay_steps if s.decay_steps is not None else s.max_steps),
            "data-dir": spec.data_path(r.data.path),
            "checkpoint-every": str(c.every_steps),
            "keep-checkpoints": str(c.keep),
        })
    else:
        values.update({
            "family": t.family,
            "num-layers": str(t.num_layers),
            "hidden-size": str(t.hidden_size),
            "num-heads": str(t.num_heads),
            "intermediate-size": str(t.intermediate_size),
            "vocab-size": str(t.vocab_size),
            "seq-length": str(t.seq_length),
            "max-position-embeddings": str(t.seq_length),
            "micro-batch-size": str(t.micro_batch_size),
            "gradient-accumulation": str(t.gradient_accumulation),
            "max-steps": str(t.max_steps),
            "lr": number(t.lr),
            "min-lr": number(t.min_lr),
            "warmup-steps": str(t.warmup_steps),
            "decay-steps": str(t.decay_steps),
            "checkpoint-every": str(t.checkpoint_every),
            "keep-checkpoints": str(t.keep_checkpoints),
        })
    return values


def render(order: Sequence[str], values: Mapping[str, Value],
           own: Optional[Mapping[str, Value]] = None) -> list[str]:
    """The flags named in `order`, in that order: each a shared one (its value from `values`,
    ``shared``'s answer) or one of the program's `own`; a name may be neither or both."""
    own = own or {}
    both = set(own) & set(SHARED)
    if both:
        raise ValueError(f"shared flags given as a payload's own: {sorted(both)}")
    args: list[str] = []
    for name in order:
        if name in own:
            value = own[name]
        elif name in SHARED:
            if name not in values:
                raise ValueError(f"--{name}: no value for this spec (a rehearsal has none)")
            value = values[name]
        else:
            raise ValueError(f"--{name}: neither a shared flag nor given by the payload")
        if value is None or value is False:
            continue
        if value is True:
            args.append("--" + name)
        elif isinstance(value, tuple):
            args += ["--" + name, *value]
        else:
            args += ["--" + name, value]
    return args
