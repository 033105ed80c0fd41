"""The plan for one recipe at several node counts: throughput, time and cost to a target, and
what failures take, at the recipe's checkpoint interval and at the recommended one."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..job.spec import JobSpec
from ..plumbing.errors import ConfigError, RuleError
from . import in_place, model
from . import measurements as meas
from .goodput import Failures, failures_at
from .inputs import from_runs, mtbf_of, price_of, recipe_points
from .model import Curve, Throughput

# Node counts: "16,32,64" or "4..64" (doubling from the first to the last) or both.
MAX_NODES = 100_000


def parse_nodes(text: str) -> list[int]:
    counts: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if ".." in part:
                first_s, last_s = part.split("..", 1)
                first, last = int(first_s), int(last_s)
                if first < 1 or last < first:
                    raise ValueError
                n = first
                while n < last:
                    counts.append(n)
                    n *= 2
                counts.append(last)
            else:
                counts.append(int(part))
        except ValueError:
            raise ConfigError(f"--nodes: {part!r} is not a node count or a range A..B "
                              "(like 16,32,64 or 4..64)") from None
    if any(n < 1 or n > MAX_NODES for n in counts):
        raise ConfigError(f"--nodes: node counts must be 1 to {MAX_NODES}")
    return sorted(set(counts))


@dataclass(frozen=True, slots=True)
class Options:
    tokens: Optional[float] = None
    samples: Optional[float] = None
    price: Optional[float] = None
    rate: Optional[str] = None
    node_mtbf_hours: Optional[float] = None
    restart_s: Optional[float] = None
    process_failure_share: Optional[float] = None
    storage_mb_s: Optional[float] = None
    checkpoint_gb: Optional[float] = None
    measurement_files: tuple[str, ...] = ()
    from_runs: tuple[str, ...] = ()
    simulate: int = 0
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Row:
    nodes: int
    throughput: Throughput
    global_batch: int
    step_s: float
    steps: int
    work_s: float            # training time to the target without failures
    tokens_per_s: float
    cost: Optional[float]
    per_dollar: Optional[float]
    failures: Optional[Failures] = None


@dataclass(frozen=True, slots=True)
class Skipped:
    nodes: int
    reason: str


@dataclass(frozen=True, slots=True)
class Result:
    recipe: str
    site: str
    platform: str
    unit: str                # tokens | samples
    target: float            # in `unit`
    target_samples: float
    target_basis: str
    price: Optional[float]
    price_basis: str
    node_mtbf_hours: Optional[float]
    mtbf_basis: str
    parameters: int
    checkpoint_bytes: int
    checkpoint_basis: str
    write_mb_s: Optional[float]
    read_mb_s: Optional[float]
    restart_basis: str
    rows: tuple[Row, ...]
    skipped: tuple[Skipped, ...]
    notes: tuple[str, ...]
    # The site's on-demand price where the plan used another rate (reserved, say), to show both.
    on_demand: Optional[float] = None
    # Where a share of failures is a process's (planning/in_place.py); None where it is 0.
    process: Optional[in_place.InPlace] = None


# --- the plan -----------------------------------------------------------------------------------
def _first_resolved(resolve: Callable[[str, Optional[int], Sequence[str]], JobSpec], ref: str,
                    node_counts: Sequence[int], sets: Sequence[str]) -> JobSpec:
    """The spec at the recipe's own node count, else at the first count asked that resolves: the
    recipe's own may not fit the site (its spare nodes count against the site's limit)."""
    try:
        return resolve(ref, None, sets)
    except RuleError:
        for nodes in node_counts:
            with contextlib.suppress(RuleError):
                return resolve(ref, nodes, sets)
        raise


def plan(recipe_ref: str, node_counts: Sequence[int], overrides: Sequence[str] = (),
         site_ref: Optional[str] = None, opts: Optional[Options] = None) -> Result:
    from .. import api
    from ..inputs import site as sites

    opts = opts or Options()
    site = sites.load(site_ref)
    # The site's first backend (the registry's order) that has nodes: a site without Slurm plans
    # for its Batch queue (its node limit, its paths).
    from .. import backends

    def has_nodes(d: Any) -> bool:
        section = getattr(site, d.site_section, None)
        return d.submits and section is not None and section.max_nodes > 0
    found = backends.having(has_nodes)
    backend = found[0] if found else backends.names()[0]

    def resolve(ref: str, nodes: Optional[int], sets: Sequence[str] = ()) -> JobSpec:
        return api.job_spec(ref, nodes, overrides=sets, site=site_ref,
                            backend=backend)  # type: ignore[arg-type]

    base = _first_resolved(resolve, recipe_ref, node_counts, overrides)
    name, platform = base.recipe.name, base.recipe.platform
    table = meas.published()
    extra: list[meas.Measurement] = []
    for path in opts.measurement_files:
        extra += meas.user_file(path)
    extra += from_runs(opts.from_runs, name, lambda ref, n: resolve(ref, n))
    points, notes = recipe_points(name, table, extra)

    transfer = next((t for t in table.transfers if t.recipe == name), None)
    scale = 1.0
    shape: Optional[Curve] = None
    source_points: list[meas.Measurement] = []
    if transfer is not None:
        source = resolve(transfer.source_recipe, None)
        source_points, _ = recipe_points(transfer.source_recipe, table, extra)
        # samples/s of this model = samples/s of the source x (its FLOPs per sample / ours)
        scale = (model.flops_per_token(source) * source.recipe.model.seq_length
                 / (model.flops_per_token(base) * base.recipe.model.seq_length))
        shape = Curve.fit(source_points)
    transferred_from = ""     # the recipe whose throughput this one's is scaled from
    if points:
        curve = Curve.fit(points, shape)
    elif transfer is not None and source_points:
        curve, transferred_from = Curve.fit(source_points), transfer.source_recipe
        notes.append(f"no measurement of {name}: throughput transferred from "
                     f"{transfer.source_recipe} x {scale:.3f} (training FLOPs per sample, "
                     f"{transfer.source_recipe} / {name}), because {transfer.why}")
    else:
        raise ConfigError(f"{name}: no measured throughput (recipes/measurements/published.yaml "
                          "has none for it); add rows of your own with --measurements FILE "
                          "or --from-run RUN")

    # the target, in samples
    seq = base.recipe.model.seq_length
    unit = "samples" if base.recipe.model.family == "bert" else "tokens"
    if opts.tokens is not None and opts.samples is not None:
        raise ConfigError("--tokens and --samples: give one target")
    if opts.tokens is not None:
        target_samples, target_basis, unit = opts.tokens / seq, "--tokens", "tokens"
    elif opts.samples is not None:
        target_samples, target_basis, unit = opts.samples, "--samples", "samples"
    else:
        steps = base.recipe.schedule.max_steps
        target_samples = float(steps * base.global_batch_size)
        target_basis = (f"the recipe's schedule: {steps:,} steps x {base.global_batch_size:,} "
                        f"samples at {base.nodes} nodes")
    target = target_samples * seq if unit == "tokens" else target_samples

    price, price_basis = price_of(site, platform, opts.price, opts.rate)
    mtbf_h, mtbf_basis = mtbf_of(site, platform, opts.node_mtbf_hours)
    params = model.parameters(base)
    if opts.checkpoint_gb is not None:
        ckpt_bytes, ckpt_basis = int(opts.checkpoint_gb * 1e9), "--checkpoint-gb"
    else:
        per = model.CHECKPOINT_BYTES_PER_PARAM[base.recipe.precision]
        ckpt_bytes = model.checkpoint_bytes(base)
        ckpt_basis = f"{params / 1e9:.2f}B parameters x {per} bytes ({base.recipe.precision})"
    storage = site.plan.storage
    node_mb_s: Optional[float] = None
    write_mb_s = read_mb_s = opts.storage_mb_s
    if write_mb_s is None and storage is not None:
        write_mb_s, read_mb_s, node_mb_s = storage.write_mb_s, storage.read_mb_s, storage.node_mb_s
    elif write_mb_s is None:
        notes.append(f"no checkpoint storage bandwidth: pass --storage-mb-s, or set plan.storage "
                     f"in the site {site.name}")
    r = site.plan.restart
    # Every start of the job runs the health gate on every node first (jobgen/job/health.py).
    from ..job import health
    gate_s = health.cost_s(base)
    if opts.restart_s is not None:
        restart_fixed, restart_basis = opts.restart_s, "--restart-s"
    else:
        restart_fixed = r.total_s + gate_s
        restart_basis = (f"site {site.name}: detect {r.detect_s:g} + requeue {r.requeue_s:g} + "
                         f"rendezvous {r.rendezvous_s:g} + compile {r.compile_s:g} s"
                         + (f" + health gate {gate_s:g} s" if gate_s else ""))
    # A node lost while a spare remains (job.spare_nodes), or a process failure while torchrun
    # has restarts left (job.restarts_in_place), restarts inside the allocation: the failure is
    # detected and torchrun meets again, with no requeue, gate or compile pass (so never more
    # than the requeue: --restart-s or --from-run may give less than the site's two parts).
    in_place_fixed = min(r.detect_s + r.rendezvous_s, restart_fixed)
    process, process_notes = in_place.model(base, backend, site, opts.process_failure_share)
    notes += process_notes
    if mtbf_h is None:
        notes.append(mtbf_basis)
    if price is None:
        notes.append(price_basis)

    rows: list[Row] = []
    skipped: list[Skipped] = []
    for n in node_counts:
        try:
            spec = resolve(recipe_ref, n, overrides)
        except RuleError as exc:
            skipped.append(Skipped(n, str(exc).split(": ", 1)[-1]))
            continue
        thr = _throughput(curve, spec, n, scale if transferred_from else 1.0, transferred_from)
        gbs = spec.global_batch_size
        step_s = gbs / thr.samples_per_s
        steps = math.ceil(target_samples / gbs)
        work = steps * step_s
        tokens_per_s = thr.samples_per_s * seq
        billed = n + spec.recipe.job.spare_nodes     # spare nodes are billed too
        cost = work / 3600 * billed * price if price is not None else None
        per_unit = tokens_per_s if unit == "tokens" else thr.samples_per_s
        per_dollar = per_unit * 3600 / (price * billed) if price is not None else None
        fail = None
        if mtbf_h is not None and write_mb_s is not None and read_mb_s is not None:
            try:    # a count at which the job would never finish is skipped, with why
                fail = failures_at(spec, n, step_s, work, mtbf_h, ckpt_bytes, write_mb_s,
                                   read_mb_s, node_mb_s, restart_fixed, price, steps,
                                   opts.simulate, opts.seed, in_place_fixed=in_place_fixed,
                                   process=process)
            except RuleError as exc:
                skipped.append(Skipped(n, str(exc)))
                continue
        rows.append(Row(n, thr, gbs, step_s, steps, work, tokens_per_s, cost, per_dollar, fail))
    if not rows:
        raise ConfigError(f"{name}: none of the node counts can run it: "
                          + "; ".join(f"{s.nodes}: {s.reason}" for s in skipped))
    facts = (site.plan.platforms or {}).get(platform)
    on_demand = (facts.prices or {}).get("on_demand") if facts else None
    return Result(name, site.name, platform, unit, target, target_samples, target_basis, price,
                  price_basis, mtbf_h, mtbf_basis, params, ckpt_bytes, ckpt_basis, write_mb_s,
                  read_mb_s, restart_basis, tuple(rows), tuple(skipped), tuple(notes),
                  on_demand if on_demand != price else None,
                  process if process.process_share else None)


def _throughput(curve: Curve, spec: JobSpec, nodes: int, scale: float,
                transferred_from: str) -> Throughput:
    per_node, basis, detail = curve.per_node(nodes)
    value = per_node * nodes * scale
    if transferred_from:
        basis = "transferred"
        detail = f"{transferred_from}'s throughput x {scale:.3f}, {detail}"
    nearest = min(curve.points, key=lambda p: abs(math.log2(p.nodes) - math.log2(nodes)))
    flags = model.setting_flags(nearest.settings, spec, nodes)
    pipeline = spec.recipe.parallelism.pipeline
    measured_gbs = nearest.settings.global_batch
    if (pipeline > 1 and measured_gbs is not None and not transferred_from
            and measured_gbs != spec.global_batch_size):
        per_step = spec.micro_batch_size * spec.data_parallel
        ours = spec.global_batch_size / per_step
        theirs = measured_gbs / per_step
        factor = (model.bubble_efficiency(ours, pipeline)
                  / model.bubble_efficiency(theirs, pipeline))
        value *= factor
        basis += "+bubble"
        detail += (f"; x {factor:.3f} for the pipeline bubble of {pipeline} stages with "
                   f"{ours:g} micro-batches per step (measured with {theirs:g})")
    return Throughput(value, basis, detail, tuple(flags))
