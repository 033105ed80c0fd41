"""Reading and rendering: list, show, render, check, schema, image-context."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import click

from ..plumbing.errors import ConfigError
from .options import (
    _backend_option,
    _echo_json,
    _json_option,
    _slurm_overrides,
    _spec,
    _spec_options,
    _targeted,
    _with_target,
)
from .param_types import TEXT, _Folder


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (for programs) instead of text.")
def list_cmd(as_json: bool) -> None:
    """The built-in recipes, one line each."""
    from ..inputs import recipe as recipes
    rows = []
    for name in recipes.recipe_names():
        rec, _ = recipes.load(name)
        rows.append((rec.name, rec.payload, rec.platform, f"{rec.nodes}n", rec.description))
    if not rows:
        from ..plumbing.resources import folder
        raise ConfigError(f"no recipes in {folder('recipes')} (this installation has lost its "
                          "built-in recipes: reinstall jobgen)")
    if as_json:
        _echo_json([{"name": r[0], "payload": r[1], "platform": r[2], "nodes": int(r[3][:-1]),
                     "description": r[4]} for r in rows])
        return
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[4])


@click.command()
@click.argument("recipe")
@_spec_options
@_backend_option(lambda d: True, "Resolve for this backend (paths differ on Batch).")
@_targeted
@_json_option
def show(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
         compile_mode: str, run_name: Optional[str], smoke: bool, backend: str,
         tokens: Optional[float], samples: Optional[float], as_json: bool,
         **slurm: Optional[str]) -> None:
    """The resolved job spec: every value, plus derived sizes (DP, accumulation, tokens/step);
    with --smoke, what the rehearsal trains instead."""
    overrides = _with_target(recipe, nodes, overrides, site, backend, smoke, tokens, samples)
    spec = _spec(recipe, nodes, overrides, site, compile_mode, run_name, smoke, backend,
                 _slurm_overrides(slurm))
    from ..inputs import userconfig
    from ..payloads import key_report
    shown = spec.as_dict()
    ref, origin = userconfig.site(site)
    # Where the site came from: --site, JOBGEN_SITE, the config file, or the built-in default.
    said = origin if ref == spec.site.name or origin == "--site" else f"{origin} ({ref})"
    shown = {k: v for key, value in shown.items()
             for k, v in ([(key, value), ("site_from", said)] if key == "site"
                          else [(key, value)])}
    # Which values reach the trainer: the rest must stay at their defaults (or are refused).
    shown["payload_keys"] = key_report(spec.recipe)
    from ..job import health
    shown["health_gate"] = health.describe(spec)
    if as_json:
        _echo_json(shown)
        return
    import yaml
    click.echo(yaml.safe_dump(shown, sort_keys=False, default_flow_style=False,
                              width=100), nl=False)


@click.command()
@click.argument("recipe")
@_spec_options
@_backend_option(lambda d: True, "An sbatch script, a Batch job definition, what submitit is "
                           "handed, or the local run's node commands.")
@click.option("--output-dir", "-o", type=_Folder(),
              help="Write the job's files into this folder (atomically) instead of stdout.")
@click.option("--stage", default="train", show_default=True, metavar="NAME",
              help="The stage's job: train (the two passes), prepare (the dataset the "
                   "recipe's data: section names), export (a sealed step as a Hugging Face "
                   "folder in RUN/export, proven; --smoke rehearsals) or eval (an exported "
                   "step scored by lm-eval into RUN/eval); Slurm, Batch; SageMaker: export.")
@click.option("--from", "sources", multiple=True, metavar="PATH",
              help="--stage prepare: its input (text or JSONL, local or s3://); repeatable: "
                   "one array task and one shard (data.shards) per input. BERT: or one "
                   "MediaWiki dump (.xml, .xml.bz2), made into text as bertPrep.py does.")
@click.option("--step", type=click.IntRange(min=0), metavar="N",
              help="--stage export: the sealed step to export (default: the newest sealed "
                   "one the trainer logged a step after, when the job starts); --stage eval: "
                   "the exported step to score (default: the newest).")
@_targeted
def render(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
           compile_mode: str, run_name: Optional[str], smoke: bool, backend: str,
           output_dir: Optional[Path], stage: str, sources: tuple[str, ...],
           step: Optional[int], tokens: Optional[float], samples: Optional[float],
           **slurm: Optional[str]) -> None:
    """Render RECIPE (a built-in name or a YAML file) into a job: stdout, or files in a folder."""
    from .. import api
    _sdk_for_rendering(backend)
    overrides = _with_target(recipe, nodes, overrides, site, backend, smoke, tokens, samples)
    spec = _spec(recipe, nodes, overrides, site, compile_mode, run_name, smoke, backend,
                 _slurm_overrides(slurm))
    from ..backends import get as backend_impl
    from ..payloads.stages import stage as declared_stage
    if sources and stage != "prepare":
        raise click.UsageError("--from is the prepare stage's input (--stage prepare)")
    if step is not None and not declared_stage(stage).takes_step:
        raise click.UsageError("--step is the export and eval stages' (--stage export|eval)")
    if declared_stage(stage).work is None:
        plan = api.plan(spec, backend)
    elif hasattr(backend_impl(backend), "plan_stage"):
        plan = backend_impl(backend).plan_stage(spec, stage, sources, step)
    else:
        raise click.UsageError(f"--stage {stage}: --backend {backend} cannot render it yet "
                               "(slurm and batch can)")
    if output_dir is None:
        click.echo(plan.text, nl=False)
        # Out first, then the payload snapshot the script points at (or the image check of a
        # container backend): output that cannot be written leaves nothing behind, and
        # `render | sbatch` reads to the end of the output, which comes when jobgen exits.
        sys.stdout.flush()
    written = plan.write(output_dir) if output_dir is not None else []
    backend_impl(backend).prepare(spec, strict=False, say=lambda m: click.echo(m, err=True))
    for path in written:
        click.echo(str(path))


@click.command()
@click.option("--site", type=TEXT, help="Site profile to render for (default: local).")
@click.option("--recipe", "recipes", multiple=True, help="Only these recipes (repeatable).")
@click.option("--test-only", is_flag=True,
              help="Also ask the Slurm controller with `sbatch --test-only` (node counts the "
                   "site's partition can hold: slurm.partition, else the default one).")
@click.option("--no-shellcheck", is_flag=True,
              help="Do not lint with shellcheck (without this, a missing shellcheck fails).")
@click.option("--paths", is_flag=True,
              help="A site path missing on this host (the cluster's login node) is an error, as "
                   "at submit (exit 2); without it, --site names each one and goes on.")
@click.option("--max-nodes", type=click.IntRange(min=1), default=128, show_default=True,
              help="Try every node count from 1 to this (or the site's limit, if lower).")
@_backend_option(lambda d: d.checks, "Check sbatch scripts, Batch job definitions, SageMaker "
                                      "training job requests or EKS manifests.")
@click.option("--verbose", "-v", is_flag=True,
              help="List every recipe and node count (by default rows alike are one line).")
@click.option("--data", "data", is_flag=True,
              help="Instead, read each recipe's dataset on this host by its headers (format, "
                   "token dtype, sequence length, shards, samples, epochs planned): exit 2 if "
                   "one cannot be trained on or could not be judged here.")
@click.argument("names", nargs=-1, metavar="[RECIPE]...")
@_json_option
def check(site: Optional[str], recipes: tuple[str, ...], test_only: bool,
          no_shellcheck: bool, paths: bool, max_nodes: int, backend: str, verbose: bool,
          data: bool, names: tuple[str, ...], as_json: bool) -> None:
    """Dry-run every recipe at every node count the site allows (up to --max-nodes): render,
    shellcheck, optionally `sbatch --test-only`. Exits 1 if anything failed or a check could
    not run. With --data: the datasets' check alone (exit 2 on a problem)."""
    from .. import check as checking
    recipes = (*recipes, *names)
    if data:
        _check_data(site, recipes, backend)
        return
    _sdk_for_rendering(backend)
    report = checking.run(site=site, recipes=list(recipes) or None, test_only=test_only,
                          shellcheck=not no_shellcheck, backend=backend,  # type: ignore[arg-type]
                          max_nodes=max_nodes, paths=paths)
    if as_json:
        _echo_json(report.as_dict())
    else:
        click.echo(report.table() if verbose else report.summary())
    if not report.ok:
        raise SystemExit(1)


def _check_data(site: Optional[str], recipes: tuple[str, ...], backend: str) -> None:
    """`check --data`: every named recipe's dataset (every recipe's without names), as the
    nodes will read it, judged here by its headers."""
    from .. import api
    from ..inputs import recipe as recipe_module
    from ..payloads import data
    from ..plumbing import resources
    specs = [api.job_spec(name, site=site, backend=backend)
             for name in (recipes or recipe_module.recipe_names())]
    status, out, err = data.check_here(specs, resources.folder("payload"))
    click.echo(out, nl=False)
    click.echo(err, nl=False, err=True)
    if status:
        raise SystemExit(2)


@click.command("schema")
@click.argument("what", type=click.Choice(["recipe", "site"]))
def schema_cmd(what: str) -> None:
    """The JSON Schema (draft 2020-12) of a recipe or a site profile, generated from the records
    and value rules the loader uses: point an editor at it with a
    `# yaml-language-server: $schema=FILE` line."""
    from ..inputs import json_schema
    _echo_json(json_schema.recipe_schema() if what == "recipe" else json_schema.site_schema())


@click.command("image-context")
@click.argument("folder", type=_Folder())
@click.option("--site", type=TEXT, help="Site profile whose recipes the images are for, and "
                                        "whose repositories they are tagged for.")
def image_context(folder: Path, site: Optional[str]) -> None:
    """Write the build context of jobgen's container images to FOLDER (a new folder): the
    payload with its digest file, and env/containers/; print, for every image the site's
    recipes need on its container backends (env/containers/images.yaml: one per platform and
    trainer), the commands that build it and push it, runnable as printed."""
    import shutil

    from ..images import snapshot
    from ..images.builds import build_commands
    from ..plumbing import resources
    full = snapshot.digest()
    if folder.exists():
        raise ConfigError(f"{folder}: exists; give a new folder")
    lines = build_commands(site, str(folder), full, say=lambda m: click.echo(m, err=True))
    snapshot.export(folder / "payload", full)
    shutil.copytree(resources.folder("containers"), folder / "env" / "containers")
    for line in lines:
        click.echo(line)


def _sdk_for_rendering(backend: str) -> None:
    """Where rendering validates with a backend's SDK, its extra first (one line, exit 2)."""
    from .. import backends
    if backends.declaration(backend).renders_with_sdk:
        backends.require_extra(backend, f"--backend {backend}")
