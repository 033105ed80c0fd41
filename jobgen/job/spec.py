"""The job spec: a recipe resolved against a site and a node count, with every derived number
(world size, data parallelism, gradient accumulation, tokens per step, the learning rate at this
node count) computed once and the parallelism arithmetic checked before anything is rendered
(the checks are in spec_checks.py; what a --smoke rehearsal trains, in smoke_spec.py)."""
from __future__ import annotations

import dataclasses
import math
import posixpath
from collections.abc import Mapping
from typing import Any, Literal, Optional

from .. import backends
from ..inputs import schema
from ..inputs.platforms import PLATFORMS, Platform
from ..inputs.recipe import Recipe
from ..inputs.site import Site
from ..plumbing.errors import ConfigError, RuleError
from ..plumbing.record import record
from .smoke_spec import Rehearsal, rehearsal
from .spec_checks import check_arithmetic as _check_arithmetic
from .spec_checks import check_values as _check_values

CompileMode = Literal["auto", "always", "never"]
Backend = str   # a backend's name: jobgen.backends.names()


@record
class JobSpec:
    recipe: Recipe
    source: str          # the recipe file as named in messages
    site: Site
    nodes: int
    backend: Backend = backends.DEFAULT
    compile_mode: CompileMode = "auto"
    smoke: bool = False
    run_name: str = ""
    # The scheduler's per-job options, as the backend declares them (its declaration's
    # job_options: Slurm's partition, time_limit, ...), resolved and checked by its table.
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # The payload the job runs (images/snapshot.py): its digest, fixed when the spec is resolved.
    payload_digest: str = ""
    # A rehearsal whose dataset an earlier job of its submission makes (--stages prepare,...):
    # it is trained on although it is not at the recipe's paths yet (payloads/data_want.py).
    data_prepared: bool = False
    # Set from `smoke` (never by hand): what the rehearsal trains, or None for the real job.
    rehearsal: Optional[Rehearsal] = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rehearsal", rehearsal(self.recipe) if self.smoke else None)

    # --- sizes ---------------------------------------------------------------------------------
    @property
    def platform(self) -> Platform:
        return PLATFORMS[self.recipe.platform]

    @property
    def workers_per_node(self) -> int:
        """Ranks per node: the platform's accelerators, or the rehearsal's CPU processes."""
        if self.rehearsal:
            return self.rehearsal.workers_per_node
        return self.platform.workers_per_node

    @property
    def world_size(self) -> int:
        return self.nodes * self.workers_per_node

    @property
    def model_parallel(self) -> int:
        if self.rehearsal:
            return self.rehearsal.model_parallel
        return self.recipe.parallelism.tensor * self.recipe.parallelism.pipeline

    @property
    def data_parallel(self) -> int:
        return self.world_size // self.model_parallel

    @property
    def micro_batch_size(self) -> int:
        if self.rehearsal:
            return self.rehearsal.micro_batch_size
        return self.recipe.parallelism.micro_batch_size

    @property
    def gradient_accumulation(self) -> int:
        par = self.recipe.parallelism
        if self.rehearsal:
            return self.rehearsal.gradient_accumulation
        if par.gradient_accumulation is not None:
            return par.gradient_accumulation
        assert par.global_batch_size is not None
        return par.global_batch_size // (par.micro_batch_size * self.data_parallel)

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.gradient_accumulation * self.data_parallel

    @property
    def tokens_per_step(self) -> int:
        seq = self.rehearsal.seq_length if self.rehearsal else self.recipe.model.seq_length
        return self.global_batch_size * seq

    # --- how the scheduler sees it --------------------------------------------------------------
    @property
    def job_name(self) -> str:
        """The scheduler's job name: a rehearsal is told apart in squeue and the Batch console."""
        return self.recipe.name + ("-smoke" if self.rehearsal else "")

    @property
    def exclusive(self) -> bool:
        """Whole nodes for the real job where the site asks for them; a rehearsal's CPU
        processes share the nodes."""
        return self.site.slurm.exclusive and self.rehearsal is None

    # --- schedule ------------------------------------------------------------------------------
    @property
    def lr(self) -> float:
        """The peak learning rate at this node count (the recipe states how it scales)."""
        optim = self.recipe.optim
        scaling = optim.lr_scaling
        if scaling is None or scaling.rule == "none":
            return optim.lr
        ratio = self.nodes / scaling.base_nodes
        factor = ratio if scaling.rule == "linear" else math.sqrt(ratio)
        return float(f"{optim.lr * factor:.6g}")  # 0.0015*2 -> 0.003, not 0.0030000000000000001

    @property
    def warmup_steps(self) -> int:
        sched = self.recipe.schedule
        if sched.warmup_fraction is not None:
            return round(sched.warmup_fraction * sched.max_steps)
        return sched.warmup_steps or 0

    @property
    def constant_steps(self) -> int:
        sched = self.recipe.schedule
        if sched.constant_fraction is not None:
            return round(sched.constant_fraction * sched.max_steps)
        return sched.constant_steps or 0

    # --- places --------------------------------------------------------------------------------
    @property
    def run_dir(self) -> str:
        """Stable across requeues and resubmissions of the same run, so training resumes."""
        return posixpath.join(self.site.paths.work_dir, self.run_name)

    @property
    def payload_dir(self) -> str:
        """Where the job's payload is on the nodes: its snapshot on the site's shared storage
        (Slurm, submitit, jobgen run), the image's copy in a container."""
        declared = backends.declaration(self.backend)
        if declared.container:
            from ..images.catalog import declared as image_declaration
            return image_declaration().payload_dir
        from ..images import snapshot
        return snapshot.folder(self.site.snapshot_root, self.payload_digest)

    def data_path(self, path: str) -> str:
        return posixpath.join(self.site.paths.data_dir, path)

    def data_prefixes(self) -> list[str]:
        """The dataset's prefixes, as the prepare stage writes them and training reads them."""
        return [self.data_path(p) for p in shard_names(self.recipe.data.path,
                                                        self.recipe.data.shards)]

    # --- identity ------------------------------------------------------------------------------
    def _options_shown(self) -> dict[str, Any]:
        """The scheduler's options under the backend's site section (`slurm:`), for show."""
        table = backends.job_options(self.backend)
        if table is None:
            return {}
        return {backends.declaration(self.backend).site_section: table.shown(self.options)}

    def as_dict(self) -> dict[str, Any]:
        """Every resolved value plus the derived numbers, for `jobgen show`."""
        return {
            "recipe": self.source,
            "site": self.site.name,
            "backend": self.backend,
            "nodes": self.nodes,
            "run_name": self.run_name,
            "run_dir": self.run_dir,
            "compile_mode": self.compile_mode,
            "smoke": self.smoke,
            # What the nodes run: its digest, and where (a snapshot, or the image's copy).
            "payload": {"digest": self.payload_digest, "dir": self.payload_dir},
            **self._options_shown(),
            "derived": {
                "workers_per_node": self.workers_per_node,
                "world_size": self.world_size,
                "model_parallel": self.model_parallel,
                "data_parallel": self.data_parallel,
                "gradient_accumulation": self.gradient_accumulation,
                "global_batch_size": self.global_batch_size,
                "tokens_per_step": self.tokens_per_step,
                "lr": self.lr,
                "warmup_steps": self.warmup_steps,
                "constant_steps": self.constant_steps,
            },
            "spec": schema.to_plain(self.recipe),
            # What a --smoke job trains instead of the model above (absent for the real job).
            **({"rehearsal": dataclasses.asdict(self.rehearsal)} if self.rehearsal else {}),
        }


def resolve(recipe: Recipe, source: str, site: Site, nodes: Optional[int] = None, *,
            backend: Backend = backends.DEFAULT, compile_mode: CompileMode = "auto",
            smoke: bool = False, run_name: Optional[str] = None,
            options: Optional[Mapping[str, Any]] = None,
            payload_digest: Optional[str] = None, name_suffix: str = "") -> JobSpec:
    """Resolve and validate; raises ConfigError/RuleError naming the file and the key.
    `options`: the scheduler's per-job options, keyed by flag (the backend's table's FLAGS);
    `payload_digest`: the payload of an earlier submission (default: this jobgen's);
    `name_suffix`: what the default run name carries when overrides change training values."""
    _check_values(recipe, source)
    n = recipe.nodes if nodes is None else nodes
    if n < 1:
        raise ConfigError(f"--nodes {n}: must be at least 1")
    platform = PLATFORMS[recipe.platform]
    declared = backends.declaration(backend)
    # Spare nodes (job.spare_nodes) are allocated with the job where the backend keeps them
    # (its declaration's spares is ""; the others train on exactly --nodes): they count
    # against every node limit.
    spares = recipe.job.spare_nodes if declared.spares == "" else 0
    asked = f"--nodes {n}" + (f" and job.spare_nodes {spares}" if spares else "")
    if n + spares > platform.max_nodes:
        raise RuleError(f"{asked}: {platform.name} jobs are limited to "
                        f"{platform.max_nodes} nodes")
    section, where = getattr(site, declared.site_section), declared.site_section
    if section is None:
        raise ConfigError(f"site {site.name} has no {where} section "
                          f"({declared.site_section_holds}): use a site with one (like "
                          f"{declared.site_example}), or the {backends.DEFAULT} backend")
    if section.max_nodes == 0 and declared.site_empty:
        raise ConfigError(f"site {site.name} {declared.site_empty}")
    platforms = getattr(section, "platforms", None)
    if platforms is not None and recipe.platform not in platforms:
        # A RuleError: `jobgen check --site` lists the other platform's recipes as skipped.
        raise RuleError(f"{source}: platform: a {recipe.platform} recipe, but site "
                        f"{site.name} has {', '.join(platforms)} nodes ({where}.platforms)")
    limit, key = section.max_nodes, f"{where}.max_nodes"
    if declared.container:
        # Where its nodes keep the run, the data and the compile cache; its containers run
        # jobgen's image, so the trainer is where the image holds it.
        from ..images.catalog import with_image_paths
        site = backends.get(backend).node_site(site)  # type: ignore[attr-defined]
        site = with_image_paths(site, recipe.platform, recipe.payload)
    if n + spares > limit:
        raise RuleError(f"{asked}: site {site.name} allows at most {limit} nodes "
                        f"({key})")
    name = run_name or (f"{recipe.name}-{n}n" + (f"-{name_suffix}" if name_suffix else "")
                        + ("-smoke" if smoke else ""))
    if not schema.NAME_RE.fullmatch(name):
        raise ConfigError(f"--run-name: {schema.describe(name)} must match "
                          f"{schema.NAME_RE.pattern}")
    table = backends.job_options(backend)
    if table is None:
        given = sorted(k for k, v in (options or {}).items() if v not in (None, ()))
        if given:
            owner = next(t.NOUN for t in backends.option_tables() if given[0] in t.FLAGS)
            raise ConfigError(f"--{given[0].replace('_', '-')}: a {owner} setting; a {backend} "
                              f"job takes its limits from the site's {declared.site_section} "
                              "section")
        resolved: Mapping[str, Any] = {}
    else:
        resolved = table.resolve(site, recipe, options or {}, n)
    from ..images import snapshot
    spec = JobSpec(recipe=recipe, source=source, site=site, nodes=n, backend=backend,
                   compile_mode=compile_mode, smoke=smoke, run_name=name, options=resolved,
                   payload_digest=payload_digest or snapshot.digest())
    # A smoke rehearsal is refused wherever the real job would be.
    _check_arithmetic(dataclasses.replace(spec, smoke=False) if smoke else spec)
    return spec


def shard_names(path: str, shards: int) -> list[str]:
    """The one rule for a dataset's shard names (recipe data.shards): `path` itself for one,
    path_part0 ... for more."""
    return [path] if shards <= 1 else [f"{path}_part{k}" for k in range(shards)]
