"""A run's loss, gradient-norm and learning-rate curves, read by watch's own readers (our
payloads' events and metrics.jsonl, NeMo's TensorBoard files), with watch's marks: its
detectors replayed over the recording (spikes, divergences, non-finite values, throughput
drops, bad nodes), and the restarts and rollbacks the run folder shows."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..watching.detectors import Detectors
from ..watching.readers import RunReader

# Detector alerts that depend on the watcher's clock, not the recording: left out.
CLOCKED = {"hang", "node_silent"}


@dataclass
class Curves:
    series: list[dict[str, Any]] = field(default_factory=list)   # one per training step
    marks: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    notes: tuple[str, ...] = ()


def read(run_dir: Path) -> Curves:
    reader = RunReader(run_dir)
    observed = reader.read()
    detectors = Detectors()
    out = Curves()
    alerts = []
    for obs in observed:
        alerts += [a for a in detectors.observe(obs, obs.time) if a.kind not in CLOCKED]
        if obs.training_step:
            out.series.append({"step": obs.step, "time": obs.time, "allocation": obs.restart,
                               "loss": obs.loss, "grad_norm": obs.grad_norm, "lr": obs.lr,
                               "source": obs.source})
        elif obs.kind == "resume" and obs.phase == "train":
            out.restarts.append({"step": obs.step, "time": obs.time,
                                 "allocation": obs.restart, "kind": "resume"})
    alerts += detectors.restarts([a.ends() for a in reader.allocations])
    for alert in alerts:
        out.marks.append({"kind": alert.kind, "step": alert.step, "time": alert.time,
                          "message": alert.message, "host": alert.host})
    for folder in sorted((run_dir / "train").glob("rolled-back-*")):
        steps = sorted(int(p.name[5:]) for p in folder.glob("step_*")
                       if p.name[5:].isascii() and p.name[5:].isdigit() and len(p.name) < 20)
        if steps:
            out.marks.append({"kind": "rollback", "step": steps[0], "time": None,
                              "message": f"checkpoints {steps[0]}..{steps[-1]} set aside "
                                         f"({folder.name}); resumed before them", "host": None})
    out.notes = tuple(reader.notes + reader.skipped_notes())
    return out
