"""tests/gpu/fsdp_resume.py's checks, on made-up run records: they hold for a faithful resume and
fail for each way a resume can go wrong. (The script's training itself runs on a lent GPU, or on
CPU with --cpu; it is too long for CI.)"""
from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent / "gpu" / "fsdp_resume.py"
spec = importlib.util.spec_from_file_location("fsdp_resume", SCRIPT)
assert spec is not None and spec.loader is not None
fsdp_resume = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fsdp_resume)

BATCH, MAX = 4, 8


def loss(step: int) -> float:
    return 5.0 - 0.1 * step


def write(run: Path, records: list[dict[str, Any]]) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def steps(first: int, last: int, shift: float = 0.0, skip: int = 0) -> list[dict[str, Any]]:
    return [{"event": "step", "step": s, "consumed_samples": (s + skip) * BATCH,
             "loss": loss(s) + shift, "time": "2026-01-01T00:00:00+00:00",
             "samples_per_s": 1.0} for s in range(first, last + 1)]


def start() -> dict[str, Any]:
    return {"event": "start", "global_batch_size": BATCH}


def records(resumed_from: int = 4, **after: Any) -> list[dict[str, Any]]:
    """Killed at step 5 after its checkpoint of step 4, resumed to the end."""
    return [start(), *steps(1, 4), {"event": "checkpoint", "step": 4}, *steps(5, 5),
            start(), {"event": "resume", "step": resumed_from,
                      "consumed_samples": resumed_from * BATCH},
            *steps(resumed_from + 1, MAX, **after)]


def verify(tmp_path: Path, run: list[dict[str, Any]]) -> None:
    write(tmp_path / "ref", [start(), *steps(1, MAX)])
    write(tmp_path / "run", run)
    opts = argparse.Namespace(cpu=True, max_steps=MAX)
    fsdp_resume.verify(opts, tmp_path / "ref", tmp_path / "run", 5)


def test_a_faithful_resume_passes(tmp_path: Path) -> None:
    verify(tmp_path, records())


@pytest.mark.parametrize("run, why", [
    (records(resumed_from=3), "did not start from the checkpoint of step 4"),
    (records(shift=0.5), "loss"),
    (records(skip=1), "samples repeated or skipped"),
    (records()[:-1], "steps are not 5..8"),
])
def test_each_broken_resume_fails(tmp_path: Path, run: list[dict[str, Any]], why: str) -> None:
    with pytest.raises(fsdp_resume.CheckFailed, match=why):
        verify(tmp_path, run)
