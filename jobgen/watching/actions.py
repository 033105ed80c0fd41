"""What `jobgen watch` can do about a job: requeue it, stop it, roll it back to the checkpoint
before the trouble began, or run the user's notification command. How a job is requeued or
stopped is its backend's (a `Controller` in the backend package's watch.py); what is the same
everywhere (the rollback of a run folder, the notification) is here.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from ..plumbing import fsio
from ..plumbing.errors import ConfigError, JobgenError

NOTIFY_TIMEOUT_S = 60
HOLD_TIMEOUT_S = 300
NEMO_STEP = re.compile(r"step=([0-9]{1,18})(?![0-9])")
STEP_DIR = re.compile(r"step_([0-9]{1,18})")   # ASCII digits only: step_² is no step


class Controller(Protocol):
    job_id: str

    def state(self) -> tuple[str, bool]:
        """(the scheduler's state, whether the job has ended)."""

    def requeue(self, prepare: Optional[Callable[[], str]] = None,
                exclude: Optional[str] = None) -> str:
        """Start the job again from its newest checkpoint; `prepare` runs while nothing of it
        runs (its text is reported); `exclude`: a host the new allocation must not use."""

    def stop(self) -> str: ...


def _complete_steps(root: Path) -> list[int]:
    """Steps of jobgen's payload checkpoints (payload/common/checkpoints.py) that have their
    marker: the ones a resume may load."""
    steps = []
    for marker in root.glob("step_*/COMPLETE"):
        match = STEP_DIR.fullmatch(marker.parent.name)
        if match is None:
            continue
        try:
            info = fsio.loads(fsio.read_bytes(marker, 1 << 16))
        except (OSError, ValueError, JobgenError):
            continue
        if isinstance(info, dict) and info.get("step") == int(match.group(1)):
            steps.append(int(match.group(1)))
    return steps


def rollback_target(run_dir: Path, before: int) -> tuple[Optional[int], str]:
    """The newest checkpoint step below `before`, and the layout found ("jobgen", "nemo"), or
    (None, why)."""
    ours = run_dir / "train" / "checkpoints"
    for root in (ours, run_dir / "nemo" / "checkpoints"):
        if root.exists() and not fsio.inside(run_dir, root):
            return None, (f"{root} leads outside the run folder {run_dir}; a rollback moves "
                          "nothing there")
    if any(ours.glob("step_*/COMPLETE")):
        steps = [s for s in _complete_steps(ours) if s < before]
        return (max(steps), "jobgen") if steps else (None, f"no complete checkpoint in {ours} "
                                                            f"before step {before}")
    nemo = run_dir / "nemo" / "checkpoints"
    ckpts = _nemo_checkpoints(nemo)
    if ckpts:
        steps = [s for s, _ in ckpts if s < before]
        return (max(steps), "nemo") if steps else (None, f"no checkpoint in {nemo} before "
                                                         f"step {before}")
    return None, (f"no checkpoints under {run_dir} that jobgen can roll back (jobgen's payloads' "
                  "train/checkpoints/step_N folders, NeMo's nemo/checkpoints/*.ckpt)")


def _nemo_checkpoints(root: Path) -> list[tuple[int, Path]]:
    out = []
    if root.is_dir():
        for path in root.rglob("*.ckpt"):
            match = NEMO_STEP.search(path.name)
            if match and fsio.inside(root, path):
                out.append((int(match.group(1)), path))
    return out


def roll_back(run_dir: Path, target: int, layout: str) -> str:
    """Move every checkpoint newer than `target` aside, into a `rolled-back-<time>` folder next
    to the checkpoints (nothing is deleted), so that the resume picks `target`."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    moved = []
    root = run_dir / ("train" if layout == "jobgen" else "nemo") / "checkpoints"
    aside = root.parent / f"rolled-back-{stamp}"
    if not fsio.inside(run_dir, root):   # checked again: nothing moves out of the run
        raise ConfigError(f"{root} leads outside the run folder {run_dir}; not rolled back")
    if layout == "jobgen":
        for entry in sorted(root.glob("step_*")):
            match = STEP_DIR.fullmatch(entry.name)
            if match and int(match.group(1)) > target:
                aside.mkdir(parents=True, exist_ok=True)
                os.rename(entry, aside / entry.name)   # a rename: a symlink moves as itself
                moved.append(entry.name)
        fsio.write_file(root / "latest", f"step_{target:08d}")
    else:
        for step, path in _nemo_checkpoints(root):
            if step > target:
                relative = path.relative_to(root)
                (aside / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(path), str(aside / relative))
                moved.append(str(relative))
    if not moved:
        return f"resuming from step {target}; no newer checkpoint to move"
    return (f"resuming from step {target}; moved {len(moved)} newer checkpoint(s) "
            f"({', '.join(moved)}) to {aside}")


# --- notification ------------------------------------------------------------------------------

def notify(command: str, payload: dict[str, Any], env: dict[str, str]) -> tuple[bool, str]:
    """Run the user's notification command with `sh -c`: the alert reaches it only as
    environment variables and as JSON on stdin, never inside the command text."""
    full = dict(os.environ, **env)
    try:
        proc = subprocess.run(["sh", "-c", command], input=json.dumps(payload) + "\n",
                              capture_output=True, text=True, env=full,
                              timeout=NOTIFY_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return False, f"the notification command ran past {NOTIFY_TIMEOUT_S} s and was stopped"
    except OSError as exc:
        return False, f"could not run the notification command: {exc.strerror}"
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
    if proc.returncode != 0:
        return False, f"the notification command exited with status {proc.returncode}: {tail[0]}"
    return True, "notified"
