"""The rehearsal (`--smoke`): the same job on CPU with a tiny model of the recipe's family. The
Trainium recipes run payload/smoke/train.py (a tiny GPT-NeoX or Llama under torch DDP); the BERT
recipes run the real BERT program with a generated shard. The recipe's optimizer and schedule
shape are kept so that the shared loop code (payload/common) runs as the real job would."""
from __future__ import annotations

import posixpath

from ..spec import JobSpec, Rehearsal
from .base import STOP_SIGNAL, Launch, Pass, number


def _rehearsal(spec: JobSpec) -> Rehearsal:
    assert spec.rehearsal is not None, "the smoke launch is for --smoke specs"
    return spec.rehearsal


def _common(spec: JobSpec, which: Pass) -> list[str]:
    r, t = spec.recipe, _rehearsal(spec)
    return [
        "--num-layers", str(t.num_layers),
        "--hidden-size", str(t.hidden_size),
        "--num-heads", str(t.num_heads),
        "--intermediate-size", str(t.intermediate_size),
        "--seq-length", str(t.seq_length),
        "--vocab-size", str(t.vocab_size),
        "--micro-batch-size", str(t.micro_batch_size),
        "--gradient-accumulation", str(t.gradient_accumulation),
        "--max-steps", str(t.max_steps),
        "--checkpoint-every", str(t.checkpoint_every),
        "--keep-checkpoints", str(t.keep_checkpoints),
        "--grad-clip", number(r.optim.grad_clip),
        "--weight-decay", number(r.optim.weight_decay),
        "--seed", str(r.seed),
        "--phase", which,
        "--compile-steps", str(r.compile.steps),
        "--output-dir", posixpath.join(spec.run_dir, "train" if which == "train" else "compile"),
    ]


def build(spec: JobSpec) -> Launch:
    r, t = spec.recipe, _rehearsal(spec)
    if t.family == "bert":
        data = posixpath.join(spec.run_dir, "smoke-data")

        def bert(which: Pass) -> tuple[str, ...]:
            return tuple(_common(spec, which) + [
                "--input-dir", data, "--max-predictions", str(t.max_predictions),
                "--max-position-embeddings", str(t.seq_length),
                "--lr", number(t.lr), "--warmup", number(t.warmup_fraction),
                "--constant", number(t.constant_fraction),
                "--optimizer", r.optim.name, "--zero-stage", "1" if r.parallelism.zero1 else "0",
                "--precision", "fp32" if r.precision == "fp32" else "bf16",
                "--accelerator", t.device])

        return Launch(stop_signal=STOP_SIGNAL, launcher="habana_deepspeed/launch.sh",
                      workdir=posixpath.join(spec.payload_dir, "habana_deepspeed"),
                      program="pretrain_bert.py", compile_wrapper="",
                      compile_args=bert("compile"), train_args=bert("train"),
                      prepare=("habana_deepspeed/make_tiny_shard.py", "--out", data,
                               "--samples", str(t.samples),
                               "--seq-length", str(t.seq_length),
                               "--max-predictions", str(t.max_predictions),
                               "--vocab-size", str(t.vocab_size), "--seed", str(r.seed)))

    def gpt(which: Pass) -> tuple[str, ...]:
        # The recipe's optimizer and schedule shape on the smoke run's scale (its decay ends
        # where the recipe's does, as a fraction of the run), so the shared loop code
        # (payload/common: schedule, parameter groups, scaled initialisation) runs as on the
        # real job.
        o, m = r.optim, r.model
        args = _common(spec, which) + [
            "--family", t.family, "--lr", number(t.lr), "--min-lr", number(t.min_lr),
            "--warmup-steps", str(t.warmup_steps), "--decay", r.schedule.name,
            "--decay-steps", str(t.decay_steps),
            "--beta1", number(o.betas[0]), "--beta2", number(o.betas[1]), "--eps", number(o.eps),
            "--init-std", number(m.init_method_std or 0.02)]
        if o.no_decay is not None:
            args += ["--no-decay", *o.no_decay]
        if m.scaled_init:
            args.append("--scaled-init")
        return tuple(args)

    return Launch(launcher="smoke/launch.sh", workdir=posixpath.join(spec.payload_dir, "smoke"),
                  program="train.py", compile_wrapper="", compile_args=gpt("compile"),
                  train_args=gpt("train"), stop_signal=STOP_SIGNAL)
