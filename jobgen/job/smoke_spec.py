"""What a `--smoke` rehearsal trains instead of the recipe's model (JobSpec.rehearsal): one CPU
process per node, a tiny model of the recipe's family, the recipe's optimizer and schedule shape
on the rehearsal's scale."""
from __future__ import annotations

from ..inputs.recipe import Recipe
from ..plumbing.record import record

# The smoke model and run (`--smoke`): small enough that a 2-node rehearsal on a laptop finishes
# in seconds; long enough to show warmup, several checkpoints and a resume.
SMOKE = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "intermediate_size": 256,
         "seq_length": 32, "vocab_size": 512, "micro_batch_size": 2, "max_steps": 24,
         "checkpoint_every": 4, "max_predictions": 5, "samples": 256}


@record
class Rehearsal:
    """What a `--smoke` job trains instead of the recipe's model, resolved once (`rehearsal`):
    one CPU process per node, a tiny model of the recipe's family, unsharded; the recipe's
    optimizer and schedule shape on the rehearsal's scale. Everything that differs from the
    real job reads it from here."""
    family: str
    trainer: str                 # the program, relative to payload/
    num_layers: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    seq_length: int
    vocab_size: int
    micro_batch_size: int
    max_steps: int
    checkpoint_every: int
    keep_checkpoints: int
    lr: float
    min_lr: float
    warmup_steps: int            # GPT rehearsals (BERT's program takes fractions of the run:)
    warmup_fraction: float
    constant_fraction: float
    decay_steps: int             # the decay ends where the recipe's does, as a fraction
    max_predictions: int         # BERT: masked positions per sequence
    samples: int                 # BERT: the generated shard's sequences
    gradient_accumulation: int = 1
    workers_per_node: int = 1    # one CPU process per node
    model_parallel: int = 1      # the tiny model is not sharded
    device: str = "cpu"


def rehearsal(recipe: Recipe) -> Rehearsal:
    s, steps = recipe.schedule, SMOKE["max_steps"]
    bert = recipe.model.family == "bert"
    fsdp = recipe.payload == "smp_fsdp"   # rehearses itself, sharded over 2 processes a node
    return Rehearsal(
        family=recipe.model.family,
        trainer="habana_deepspeed/pretrain_bert.py" if bert else
        "smp_fsdp/train_fsdp.py" if fsdp else "smoke/train.py",
        workers_per_node=2 if fsdp else 1,
        num_layers=SMOKE["num_layers"], hidden_size=SMOKE["hidden_size"],
        num_heads=SMOKE["num_heads"], intermediate_size=SMOKE["intermediate_size"],
        seq_length=SMOKE["seq_length"], vocab_size=SMOKE["vocab_size"],
        micro_batch_size=SMOKE["micro_batch_size"], max_steps=steps,
        # Every 4 steps, or more often where the recipe asks for fewer than 4 (the chaos
        # rehearsal saves every step: a failure then loses at most one).
        checkpoint_every=min(SMOKE["checkpoint_every"],
                             recipe.checkpoint.every_steps or SMOKE["checkpoint_every"]),
        keep_checkpoints=min(recipe.checkpoint.keep, 3),
        lr=0.001 if bert else 0.003, min_lr=0.0 if bert else 0.0003,
        warmup_steps=round(0.1 * steps) if bert else 2,
        warmup_fraction=0.1 if bert else 2 / steps, constant_fraction=0.2 if bert else 0.0,
        decay_steps=max(2, round(steps * (s.decay_steps or s.max_steps) / s.max_steps)),
        max_predictions=SMOKE["max_predictions"], samples=SMOKE["samples"])
