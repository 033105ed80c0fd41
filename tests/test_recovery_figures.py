"""The recovery figures the README and docs/recovery.md show (issue 40 item 4) are what their
commands print, never typed by hand: the measured tables are `benchmarks/recovery_arms.py
--from-json` of the kept results file, and the modelled 128-node goodput is `jobgen plan --json`
with each arm's settings. Fast: nothing here runs Slurm (the benchmark itself needs the local
cluster and about half an hour; tests/test_recovery_arms.py is its short version)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results/recovery-arms.json"
PRINTED_BY = f"<!-- printed by: python benchmarks/recovery_arms.py --from-json {RESULTS} -->"
JOBGEN = Path(sys.executable).parent / "jobgen"
# Each arm's settings for `jobgen plan llama2-7b --nodes 128`, as docs/recovery.md gives them.
PLAN_SETS = {
    "A": ["checkpoint.async_save=false"],
    "B": ["checkpoint.async_save=false", "job.restarts_in_place=3"],
    "C": ["checkpoint.async_save=false", "job.restarts_in_place=3", "job.spare_nodes=1"],
    "D": ["job.restarts_in_place=3", "job.spare_nodes=1"],
}


def _results() -> dict:
    return json.loads((ROOT / RESULTS).read_text(encoding="utf-8"))


def _printed() -> list[str]:
    proc = subprocess.run([sys.executable, "benchmarks/recovery_arms.py", "--from-json", RESULTS],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.rstrip("\n").splitlines()


def _block_after(page: Path, marker: str) -> list[str]:
    """The indented block that follows `marker` in `page`, unindented."""
    lines = page.read_text(encoding="utf-8").splitlines()
    assert marker in lines, f"{page.name}: no {marker}"
    at = lines.index(marker) + 1
    while at < len(lines) and not lines[at].strip():
        at += 1
    block = []
    while at < len(lines) and (lines[at].startswith("    ") or not lines[at].strip()):
        block.append(lines[at][4:])
        at += 1
    while block and not block[-1].strip():
        block.pop()
    return block


def test_the_kept_results_name_no_machine_path() -> None:
    text = (ROOT / RESULTS).read_text(encoding="utf-8")
    runs = json.loads(text)["runs"]
    assert runs and all("/" not in r["run_dir"] for r in runs)
    assert "/tmp/" not in text and "/home/" not in text and "/root/" not in text


def test_the_docs_tables_are_what_the_benchmark_prints_from_its_results() -> None:
    printed = _printed()
    assert any(line.startswith("arm    runs  utilisation %") for line in printed), printed
    assert _block_after(ROOT / "docs" / "recovery.md", PRINTED_BY) == printed


def _readme_rows() -> dict[str, list[str]]:
    rows = {}
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in ("A", "A-cut", "B", "C", "D"):
            rows[cells[0]] = cells
    return rows


def test_the_readmes_measured_utilisation_is_the_results_summary() -> None:
    arms = _results()["arms"]
    rows = _readme_rows()
    assert sorted(rows) == sorted(arms), (sorted(rows), sorted(arms))
    for arm, s in arms.items():
        want = (f"{100 * s['utilisation']:.1f} % ({100 * s['low']:.1f}-"
                f"{100 * s['high']:.1f})")
        assert rows[arm][2] == want, (arm, rows[arm], want)


@pytest.mark.parametrize("arm", sorted(PLAN_SETS))
def test_the_readmes_modelled_goodput_is_what_plan_prints(arm: str) -> None:
    sets = [w for s in PLAN_SETS[arm] for w in ("--set", s)]
    proc = subprocess.run([str(JOBGEN), "plan", "llama2-7b", "--nodes", "128", *sets, "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    failures = json.loads(proc.stdout)["rows"][0]["failures"]
    cell = _readme_rows()[arm][3]
    shown = re.findall(r"(\d+\.\d+) %", cell)
    assert shown and shown[0] == f"{100 * failures['recipe']['goodput']:.2f}", (arm, cell)
    if len(shown) > 1:     # at the recommended interval
        assert shown[1] == f"{100 * failures['best']['goodput']:.2f}", (arm, cell)
