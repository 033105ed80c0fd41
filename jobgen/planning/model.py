"""Model sizes and the throughput model.

Sizes come from the recipe's dimensions: parameters (for the checkpoint's size) and training
FLOPs per token (to carry one model's measured throughput over to another). Throughput at a node
count is measured where a measurement exists, and modelled elsewhere: interpolated between
measured node counts, extrapolated beyond them along a fitted scaling curve, transferred from
another recipe, or adjusted for a pipeline bubble the measurement did not have. Every figure
says which, and why.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional, Sequence

from ..job.sizes import CHECKPOINT_BYTES_PER_PARAM, checkpoint_bytes, parameters  # noqa: F401
from ..job.spec import JobSpec
from .measurements import Measurement, Settings


def flops_per_token(spec: JobSpec) -> float:
    """Training FLOPs per token: 6 per matmul parameter (forward and backward) plus the
    attention scores and their use, 12 x layers x hidden x sequence. Recomputation for
    activation checkpointing is not counted (it costs time, not useful work)."""
    m = spec.recipe.model
    h, layers = m.hidden_size, m.num_layers
    head_dim = h // m.num_attention_heads
    kv = (m.num_kv_heads or m.num_attention_heads) * head_dim
    ffn_mats = 3 if m.family == "llama" else 2
    per_layer = 2 * h * h + 2 * h * kv + ffn_mats * h * m.ffn_hidden_size
    head = float(m.vocab_size * h)
    if m.family == "bert" and m.max_predictions:
        head = head * m.max_predictions / m.seq_length   # only masked positions are predicted
    return 6.0 * (layers * per_layer + head) + 12.0 * layers * h * m.seq_length


# --- the throughput model ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Throughput:
    samples_per_s: float
    basis: str                  # measured | interpolated | extrapolated | transferred
    detail: str                 # how the figure was obtained, in words
    flags: tuple[str, ...] = ()  # where the measurement's settings differ from the recipe's


@dataclass(frozen=True, slots=True)
class Curve:
    """Per-node throughput against the node count, from one recipe's measurements: exact at the
    measured counts, interpolated in log2(nodes) between them, and beyond them a least-squares
    fit of 1/(per-node throughput) = a + b x log2(nodes), anchored at the nearest measured
    count. With one measurement the shape comes from `shape` (another recipe's curve), else
    per-node throughput is held constant and said so."""
    points: tuple[Measurement, ...]
    slope: Optional[float]       # b/a of the fit: the relative loss per doubling
    shape_from: str = ""

    @classmethod
    def fit(cls, points: Sequence[Measurement], shape: Optional["Curve"] = None) -> "Curve":
        pts = tuple(sorted(points, key=lambda p: p.nodes))
        if len(pts) >= 2:
            xs = [math.log2(p.nodes) for p in pts]
            ys = [p.nodes / p.samples_per_s for p in pts]
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            sxx = sum((x - mx) ** 2 for x in xs)
            b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
            a = my - b * mx
            return cls(pts, b / a if a > 0 else 0.0)
        if shape is not None and shape.slope is not None:
            return cls(pts, shape.slope, shape.shape_from or shape.points[0].recipe)
        return cls(pts, None)

    def _relative(self, nodes: float) -> float:
        """1/(per-node throughput), up to a constant factor."""
        return 1.0 + (self.slope or 0.0) * math.log2(nodes)

    def per_node(self, nodes: int) -> tuple[float, str, str]:
        """(per-node samples/s, basis, detail) at `nodes`."""
        pts = self.points
        for p in pts:
            if p.nodes == nodes:
                return p.samples_per_s / p.nodes, "measured", p.source
        lo = [p for p in pts if p.nodes < nodes]
        hi = [p for p in pts if p.nodes > nodes]
        if lo and hi:
            a, b = lo[-1], hi[0]
            t = (math.log2(nodes) - math.log2(a.nodes)) / (math.log2(b.nodes) - math.log2(a.nodes))
            pa, pb = a.samples_per_s / a.nodes, b.samples_per_s / b.nodes
            return (pa + t * (pb - pa), "interpolated",
                    f"between the measurements at {a.nodes} and {b.nodes} nodes")
        anchor = lo[-1] if lo else hi[0]
        base = anchor.samples_per_s / anchor.nodes
        if self.slope is None:
            return base, "extrapolated", (f"per-node throughput of the {anchor.nodes}-node "
                                          "measurement held constant (one measurement, no "
                                          "scaling curve)")
        value = base * self._relative(anchor.nodes) / self._relative(nodes)
        fitted = (f"the scaling curve of {self.shape_from}" if self.shape_from else
                  f"a scaling curve fitted to {len(pts)} measurements")
        return value, "extrapolated", (f"from the {anchor.nodes}-node measurement along "
                                       f"{fitted} ({100 * self.slope:.1f} % more time per "
                                       "sample per doubling)")


def bubble_efficiency(micro_batches: float, stages: int) -> float:
    """The busy fraction of a 1F1B pipeline of `stages` with `micro_batches` per step."""
    return micro_batches / (micro_batches + stages - 1)


def setting_flags(settings: Settings, spec: JobSpec, nodes: int) -> list[str]:
    """The measurement's settings that differ from the recipe's at `nodes` (those the source
    states; what it does not state is said once)."""
    rec = spec.recipe
    accelerators = spec.platform.devices * nodes
    per_accelerator = spec.global_batch_size / accelerators
    ours: dict[str, object] = {
        "global_batch": spec.global_batch_size,
        "batch_per_accelerator": (int(per_accelerator) if per_accelerator.is_integer()
                                  else round(per_accelerator, 2)),
        "seq_length": rec.model.seq_length, "micro_batch": spec.micro_batch_size,
        "tensor": rec.parallelism.tensor, "pipeline": rec.parallelism.pipeline,
        "precision": rec.precision}
    flags = []
    for key, theirs in dataclasses.asdict(settings).items():
        if theirs is not None and ours[key] != theirs:
            flags.append(f"measured at {key.replace('_', ' ')} {theirs}, the recipe has "
                         f"{ours[key]}")
    return flags
