"""`--every K`: one follower job beside training that exports (and scores) every K-th sealed
step as training goes (payload/common/follow_steps.py), instead of one export and one eval job
after it. It is built of the export and eval stages' own work (stages.py), without their
--step; how it learns that training has ended is the backend's (a Slurm job id, a file)."""
from __future__ import annotations

import posixpath
from typing import Optional, Sequence

from ..job.spec import JobSpec
from ..plumbing.errors import ConfigError
from . import stages

PROGRAM = "common/follow_steps.py"
STAGE = "follow"                # the follower job's stage name in a run's record
SLURM_ENV = "JOBGEN_FOLLOW_JOB"  # the training job's id, given to the follower by sbatch


def check(names: Sequence[str], every: Optional[int], step: Optional[int] = None) -> None:
    """--every K with the --stages it needs, or one line."""
    if every is None:
        return
    if every < 1:
        raise ConfigError(f"--every {every}: K must be at least 1 (every K-th sealed step)")
    if "export" not in names or "train" not in names:
        raise ConfigError(f"--every {every}: exports every K-th sealed step while training "
                          "goes: --stages must name train and export (and eval to score them)")
    if step is not None:
        raise ConfigError(f"--every {every} and --step {step}: the follower takes every K-th "
                          "step; --step is for one export after training")


def work(spec: JobSpec, names: Sequence[str], every: int,
         ends: Sequence[str]) -> stages.StageWork:
    """The follower's job: its own flags, `ends` (how training's end is seen), then the export
    stage's program and flags (+export: the follower asks it for the sealed steps too) and,
    where eval is named, the eval stage's (+eval)."""
    check(names, every)
    export = stages.work("export", spec)
    # Which steps are sealed is the export's to say (its --list-sealed); metrics.jsonl is under
    # RUN/train for every payload (NeMo's relayed there from RUN/nemo, as export_neox.py reads).
    own = ["--metrics", posixpath.join(spec.run_dir, "train", "metrics.jsonl"),
           "--export-root", posixpath.join(spec.run_dir, stages.EXPORT_ROOT),
           "--eval-root", posixpath.join(spec.run_dir, stages.EVAL_ROOT),
           "--every", str(every), *ends, "--on-node",
           "+export", export.program, *export.tasks[0]]
    notes = list(export.notes)
    if "eval" in names:
        scored = stages.work("eval", spec)
        own += ["+eval", scored.program, *scored.tasks[0]]
        notes += scored.notes
    # Where the export needs a training node (NeMo's, NxD's: their readers), the follower too.
    return stages.StageWork(program=PROGRAM, tasks=(tuple(own),), notes=tuple(notes),
                            training_node=export.training_node)
