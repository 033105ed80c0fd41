"""The rehearsal (`--smoke`): the same job on CPU with a tiny model of the recipe's family. The
Trainium recipes run payload/smoke/train.py (a tiny GPT-NeoX or Llama under torch DDP); the BERT
recipes run the real BERT program with a generated shard. Where a dataset was prepared at the
recipe's paths (`--stage prepare`), both read it instead, after the data check. The recipe's
optimizer and schedule shape are kept so that the shared loop code (payload/common) runs as the
real job would."""
from __future__ import annotations

import posixpath

from ..job.smoke_spec import Rehearsal
from ..job.spec import JobSpec
from . import data_want, flags, neuron_nemo
from .base import STOP_SIGNAL, Launch, Pass, number


def _rehearsal(spec: JobSpec) -> Rehearsal:
    assert spec.rehearsal is not None, "the smoke launch is for --smoke specs"
    return spec.rehearsal


# The flags of both rehearsal programs (shared ones, flags.py), in the order they are written.
COMMON = (
    "num-layers", "hidden-size", "num-heads", "intermediate-size", "seq-length", "vocab-size",
    "micro-batch-size", "gradient-accumulation", "max-steps", "checkpoint-every",
    "keep-checkpoints", "grad-clip", "weight-decay", "seed", "phase", "compile-steps",
    "output-dir",
)
# Then the BERT program's (pretrain_bert.py) and the GPT one's (smoke/train.py).
BERT = (
    "input-dir", "max-predictions", "max-position-embeddings", "lr", "warmup", "constant",
    "optimizer", "zero-stage", "precision", "accelerator",
)
GPT = (
    "family", "lr", "min-lr", "warmup-steps", "decay", "decay-steps", "beta1", "beta2", "eps",
    "init-std", "no-decay", "scaled-init", "sync-save",
)
DATA = ("data-format", "data-prefix", "data-dir")   # smoke/train.py on a prepared dataset


def build(spec: JobSpec, declared: tuple[str, ...] = ()) -> Launch:
    """The rehearsal of `spec`, whose trainer reads a dataset of the format `declared` (its
    payload record's `data`)."""
    r, t = spec.recipe, _rehearsal(spec)
    # A dataset prepared at the recipe's paths (payload/smoke/prepare_data.py) is trained on,
    # after the node flow's data check (JOBGEN_DATA, the same expectations); else made-up data.
    prepared = data_want.wanted(spec, declared)
    if t.family == "bert":
        data = prepared["path"] if prepared else posixpath.join(spec.run_dir, "smoke-data")

        def bert(which: Pass) -> tuple[str, ...]:
            return tuple(flags.render(COMMON + BERT, flags.shared(spec, which), {
                "input-dir": data, "max-predictions": str(t.max_predictions),
                "warmup": number(t.warmup_fraction), "constant": number(t.constant_fraction),
                "optimizer": r.optim.name, "zero-stage": "1" if r.parallelism.zero1 else "0",
                "precision": "fp32" if r.precision == "fp32" else "bf16",
                "accelerator": t.device}))

        return Launch(stop_signal=STOP_SIGNAL, launcher="habana_deepspeed/launch.sh",
                      workdir=posixpath.join(spec.payload_dir, "habana_deepspeed"),
                      program="pretrain_bert.py", compile_wrapper="",
                      compile_args=bert("compile"), train_args=bert("train"),
                      prepare=() if prepared else (
                          "habana_deepspeed/make_tiny_shard.py", "--out", data,
                          "--samples", str(t.samples), "--seq-length", str(t.seq_length),
                          "--max-predictions", str(t.max_predictions),
                          "--vocab-size", str(t.vocab_size), "--seed", str(r.seed)))

    def gpt(which: Pass) -> tuple[str, ...]:
        # The recipe's optimizer and schedule shape on the smoke run's scale (its decay ends
        # where the recipe's does, as a fraction of the run), so the shared loop code
        # (payload/common: schedule, parameter groups, scaled initialisation) runs as on the
        # real job.
        # --decay: the program's name for the shared --schedule. --index-dir: a NeMo recipe's
        # rehearsal builds and reads a sample index file where NeMo would (rank 0 writes, every
        # rank reads), where NeMo is told a folder: not beside the data.
        index_dir = neuron_nemo.index_dir(spec) if r.payload == "neuron_nemo" else None
        want = prepared or {}
        fmt = want.get("format")
        values = flags.shared(spec, which)
        values["data-dir"] = want["path"] if fmt == "hf_blocks" else None
        return tuple(flags.render(COMMON + GPT + ("index-dir",) + DATA, values, {
            "decay": r.schedule.name, "index-dir": index_dir, "data-format": fmt,
            "data-prefix": tuple(want["prefixes"]) if fmt == "megatron" else None}))

    return Launch(launcher="smoke/launch.sh", workdir=posixpath.join(spec.payload_dir, "smoke"),
                  program="train.py", compile_wrapper="", compile_args=gpt("compile"),
                  train_args=gpt("train"), stop_signal=STOP_SIGNAL)
