"""What a job's dataset must be, for the data check that reads its headers
(payload/common/data_check.py): the same program runs at `jobgen check --data`, at `submit`
where this host sees the site's data folder, and on the nodes before the compile pass. The
payload's record says the format; the recipe and the spec say the rest."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from ..job.spec import JobSpec
from ..plumbing.errors import ConfigError
from . import REGISTRY

CHECK_PROGRAM = "common/data_check.py"   # under a payload folder


def _train_share(splits: Optional[str]) -> float:
    """The training share of Megatron's splits string ("980,10,10" -> 0.98)."""
    if not splits:
        return 1.0
    parts = [float(p) for p in splits.replace("/", ",").split(",") if p.strip()]
    return parts[0] / sum(parts) if parts and sum(parts) > 0 else 1.0


def expectations(spec: JobSpec) -> Optional[dict[str, Any]]:
    """The data check's input for this job, or None where its trainer reads no dataset (the
    rehearsal's made-up batches, a payload that declares none)."""
    payload = REGISTRY.get(spec.recipe.payload)
    if spec.smoke or payload is None or not payload.data:
        return None
    rec, fmt = spec.recipe, payload.data[0]
    want: dict[str, Any] = {
        "format": fmt, "recipe": spec.source, "key": "data.path",
        "seq_length": rec.model.seq_length, "vocab_size": rec.model.vocab_size,
        "global_batch": spec.global_batch_size,
        "planned_samples": spec.global_batch_size * rec.schedule.max_steps,
    }
    if fmt == "megatron":
        want["prefixes"] = [spec.data_path(rec.data.path)]
        want["train_share"] = _train_share(rec.data.splits)
        if rec.data.vocab_file:
            want["vocab_file"] = spec.data_path(rec.data.vocab_file)
    elif fmt == "hf_blocks":
        want["path"] = spec.data_path(rec.data.path)
        want["columns"] = list(payload.data[1:])
    else:
        want["path"] = spec.data_path(rec.data.path)
        want["max_predictions"] = rec.model.max_predictions
    return want


def check_here(specs: list[JobSpec], payload_dir: Path) -> tuple[int, str, str]:
    """Run the data check on this host for these jobs: (status, stdout, stderr); status 2
    where any dataset cannot be trained on, 3 where one could not be judged here."""
    wants = [w for w in (expectations(s) for s in specs) if w is not None]
    if not wants:
        return 0, "", ""
    program = payload_dir / CHECK_PROGRAM
    if not program.is_file():
        raise ConfigError(f"{program}: the data check is not in this payload")
    env = {**os.environ, "JOBGEN_DATA": json.dumps(wants)}
    done = subprocess.run([sys.executable, str(program), "cli"], env=env, text=True,
                          capture_output=True, timeout=600, check=False)
    status = done.returncode if done.returncode in (0, 2, 3) else 2
    return status, done.stdout, done.stderr
