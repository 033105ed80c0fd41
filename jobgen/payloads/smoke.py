"""The rehearsal (`--smoke`): the same job on CPU with a tiny model of the recipe's family. The
Trainium recipes run payload/smoke/train.py (a tiny GPT-NeoX or Llama under torch DDP); the BERT
recipes run the real BERT program with a generated shard. The recipe's optimizer and schedule
shape are kept so that the shared loop code (payload/common) runs as the real job would."""
from __future__ import annotations

import posixpath

from ..spec import SMOKE, JobSpec
from .base import Launch, Pass, number


def _common(spec: JobSpec, which: Pass) -> list[str]:
    r = spec.recipe
    return [
        "--num-layers", str(SMOKE["num_layers"]),
        "--hidden-size", str(SMOKE["hidden_size"]),
        "--num-heads", str(SMOKE["num_heads"]),
        "--intermediate-size", str(SMOKE["intermediate_size"]),
        "--seq-length", str(SMOKE["seq_length"]),
        "--vocab-size", str(SMOKE["vocab_size"]),
        "--micro-batch-size", str(SMOKE["micro_batch_size"]),
        "--gradient-accumulation", "1",
        "--max-steps", str(SMOKE["max_steps"]),
        "--checkpoint-every", str(SMOKE["checkpoint_every"]),
        "--keep-checkpoints", str(min(r.checkpoint.keep, 3)),
        "--grad-clip", number(r.optim.grad_clip),
        "--weight-decay", number(r.optim.weight_decay),
        "--seed", str(r.seed),
        "--phase", which,
        "--compile-steps", str(r.compile.steps),
        "--output-dir", posixpath.join(spec.run_dir, "train" if which == "train" else "compile"),
    ]


def build(spec: JobSpec) -> Launch:
    r = spec.recipe
    if r.model.family == "bert":
        data = posixpath.join(spec.run_dir, "smoke-data")

        def bert(which: Pass) -> tuple[str, ...]:
            return tuple(_common(spec, which) + [
                "--input-dir", data, "--max-predictions", str(SMOKE["max_predictions"]),
                "--max-position-embeddings", str(SMOKE["seq_length"]),
                "--lr", "0.001", "--warmup", "0.1", "--constant", "0.2",
                "--optimizer", r.optim.name, "--zero-stage", "1" if r.parallelism.zero1 else "0",
                "--precision", "fp32" if r.precision == "fp32" else "bf16",
                "--accelerator", "cpu"])

        return Launch(launcher="habana_deepspeed/launch.sh",
                      workdir=posixpath.join(spec.payload_dir, "habana_deepspeed"),
                      program="pretrain_bert.py", compile_wrapper="",
                      compile_args=bert("compile"), train_args=bert("train"),
                      prepare=("habana_deepspeed/make_tiny_shard.py", "--out", data,
                               "--samples", str(SMOKE["samples"]),
                               "--seq-length", str(SMOKE["seq_length"]),
                               "--max-predictions", str(SMOKE["max_predictions"]),
                               "--vocab-size", str(SMOKE["vocab_size"]), "--seed", str(r.seed)))

    def gpt(which: Pass) -> tuple[str, ...]:
        # The recipe's optimizer and schedule shape on the smoke run's scale (its decay ends
        # where the recipe's does, as a fraction of the run), so the shared loop code
        # (payload/common: schedule, parameter groups, scaled initialisation) runs as on the
        # real job.
        o, s, m = r.optim, r.schedule, r.model
        steps = SMOKE["max_steps"]
        decay_end = round(steps * (s.decay_steps or s.max_steps) / s.max_steps)
        args = _common(spec, which) + [
            "--family", r.model.family, "--lr", "0.003", "--min-lr", "0.0003",
            "--warmup-steps", "2", "--decay", s.name, "--decay-steps", str(max(2, decay_end)),
            "--beta1", number(o.betas[0]), "--beta2", number(o.betas[1]), "--eps", number(o.eps),
            "--init-std", number(m.init_method_std or 0.02)]
        if o.no_decay is not None:
            args += ["--no-decay", *o.no_decay]
        if m.scaled_init:
            args.append("--scaled-init")
        return tuple(args)

    return Launch(launcher="smoke/launch.sh", workdir=posixpath.join(spec.payload_dir, "smoke"),
                  program="train.py", compile_wrapper="", compile_args=gpt("compile"),
                  train_args=gpt("train"))
