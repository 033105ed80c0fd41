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
from .data_want import wanted

CHECK_PROGRAM = "common/data_check.py"   # under a payload folder


def expectations(spec: JobSpec) -> Optional[dict[str, Any]]:
    """The data check's input for this job (data_want.py), or None where it reads no dataset."""
    payload = REGISTRY.get(spec.recipe.payload)
    return wanted(spec, payload.data if payload is not None else ())


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
