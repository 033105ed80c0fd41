"""`jobgen plan` with a share of process failures (site plan.process_failure_share,
--process-failure-share; issue 40): with job.restarts_in_place they restart inside the allocation
while torchrun's budget lasts, node failures keep the spares' path. A share of 0 is the plan as
before; the figures with a share are checked against failures.expected_wall computed here, the
budgets against a direct count, and the closed form against the simulation of the budgets."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import jsonschema
import pytest
import yaml

from jobgen import api
from jobgen.inputs import json_schema
from jobgen.planning import failures, in_place, planner
from jobgen.planning.goodput import Failures

ROOT = Path(__file__).resolve().parent.parent
SYNC = ["checkpoint.async_save=false"]
B = [*SYNC, "job.restarts_in_place=3"]
C = [*B, "job.spare_nodes=1"]


def _plan(sets: Sequence[str], share: float | None = None, **opts: Any) -> planner.Result:
    return planner.plan("llama2-7b", [128], sets, None,
                        planner.Options(process_failure_share=share, **opts))


def _fail(result: planner.Result) -> Failures:
    f = result.rows[0].failures
    assert f is not None
    return f


def test_a_share_of_0_is_the_plan_as_before(jobgen: Callable, write_site: Callable) -> None:
    """Share 0, given or not, from the site or the option: the same text and JSON, and
    restarts in place change nothing (every failure a node's)."""
    site = write_site(changes={"plan.process_failure_share": 0})
    args = ["plan", "llama2-7b", "--nodes", "128", *sum((["--set", s] for s in B), [])]
    plain = jobgen(*args)
    assert plain.exit_code == 0, plain.stderr
    assert jobgen(*args, "--site", str(site)).stdout == plain.stdout.replace(
        "site local", f"site {yaml.safe_load(site.read_text())['name']}")
    assert jobgen(*args, "--process-failure-share", "0").stdout == plain.stdout
    assert "process" not in plain.stdout
    assert "process" not in json.loads(jobgen(*args, "--json").stdout)
    assert _plan(B, 0.0).rows == _plan(SYNC).rows == _plan(B).rows


def _requeued(p: float, k: int, s: int) -> float:
    """The long-run requeued share, written out for the cases below (docs/planning.md)."""
    launch = (1 - p ** (k + 1)) / (1 - p) if p < 1 else k + 1
    spent = p ** (k + 1)
    launches = (1 - (1 - spent) ** (s + 1)) / spent if spent else s + 1
    return 1 / (launch * launches)


@pytest.mark.parametrize(("sets", "k", "s"), [(B, 3, 0), (C, 3, 1)])
@pytest.mark.parametrize("share", [0.25, 0.5])
def test_restarts_in_place_raise_goodput_by_what_the_formula_says(
        sets: list[str], k: int, s: int, share: float) -> None:
    before = _fail(_plan([*SYNC, f"job.spare_nodes={s}"], share))   # K = 0
    after = _fail(_plan(sets, share))
    plain = _fail(_plan(SYNC))
    row = _plan(sets, share).rows[0]
    requeue = plain.restart_s                    # detect + requeue + rendezvous + gate + load
    inside = 600 + 120 + plain.load_s            # the local site's detect + rendezvous + load
    mixed = _requeued(share, k, s) * requeue + (1 - _requeued(share, k, s)) * inside
    assert after.restart_s == pytest.approx(mixed, rel=1e-12)
    for interval, old in ((after.recipe, before.recipe), (after.best, before.best)):
        wall = failures.expected_wall(row.work_s, interval.seconds, plain.write_s, mixed,
                                      after.job_mtbf_s)
        assert interval.goodput == pytest.approx(row.work_s / wall, rel=1e-12)
        assert interval.goodput > old.goodput


def test_the_share_is_ignored_without_any_restart_in_place() -> None:
    assert _plan(SYNC, 0.5).rows == _plan(SYNC).rows
    note = _plan(SYNC, 0.5).notes[-1]
    assert note.startswith("50 % of failures are a process's on healthy nodes "
                           "(--process-failure-share); job.restarts_in_place=0")


def test_with_spares_alone_process_failures_are_requeued_and_take_no_spare() -> None:
    spared = [*SYNC, "job.spare_nodes=1"]
    plain, mixed = _fail(_plan(spared)), _fail(_plan(spared, 0.5))
    requeue, inside = _fail(_plan(SYNC)).restart_s, 720 + plain.load_s
    assert plain.restart_s == pytest.approx(0.5 * requeue + 0.5 * inside, rel=1e-12)
    share = 1 / (2 - 0.5)          # one launch per failure; a node's takes the spare
    assert mixed.restart_s == pytest.approx(share * requeue + (1 - share) * inside, rel=1e-12)
    assert mixed.recipe.goodput < plain.recipe.goodput


def test_where_the_nodes_do_not_share_the_run_folder_restarts_in_place_do_not_count() -> None:
    opts: dict[str, Any] = {"price": 10.0, "node_mtbf_hours": 3200.0, "storage_mb_s": 1000.0}
    on_sagemaker = planner.plan("llama2-7b", [4], B, "sagemaker",
                                planner.Options(process_failure_share=0.5, **opts))
    without = planner.plan("llama2-7b", [4], SYNC, "sagemaker", planner.Options(**opts))
    assert on_sagemaker.rows == without.rows
    assert "job.restarts_in_place=3 does not apply on sagemaker" in on_sagemaker.notes[-1]


@pytest.mark.parametrize(("site", "delete", "backend"), [
    ("local", "", "slurm"), ("local", "", "batch"), ("local", "", "eks"),
    ("local", "eks.shared_pvc", "eks"), ("local", "", "sagemaker"), ("local", "", "submitit"),
    ("local", "", "local"), ("dl1-batch", "", "batch"), ("dl1-batch", "batch.shared_volume",
                                                         "batch")])
def test_plan_counts_restarts_in_place_where_the_rendered_job_runs_them(
        write_site: Callable, site: str, delete: str, backend: str) -> None:
    """The plan's reading of where restarts in place apply is the node contract's, as
    rendered (JOBGEN_RESTARTS_IN_PLACE set to the budget, or left out/empty)."""
    path = write_site(site, delete=[delete] if delete else [])
    spec = api.job_spec("llama2-7b", 2, overrides=["job.restarts_in_place=3"], site=str(path),
                        backend=backend)  # type: ignore[arg-type]
    text = api.plan(spec).text
    rendered = re.search(r'JOBGEN_RESTARTS_IN_PLACE["\s:=,]*("?value"?[\s:=]*)?["\x27]?3\b', text)
    assert in_place.restarts_that_apply(spec, backend) == (3 if rendered else 0)


@pytest.mark.parametrize(("p", "k", "s"), [(0.25, 3, 1), (0.5, 3, 0), (0.5, 2, 2),
                                           (0.3, 0, 2), (0.9, 1, 1)])
def test_the_budgets_long_run_shares_match_a_direct_count(p: float, k: int, s: int) -> None:
    model, rng = in_place.InPlace(p, k, s), random.Random(7)
    used = spares = 0
    counts = {"requeue": 0, "process": 0, "process in place": 0, "node": 0, "node in place": 0}
    draws = 100_000
    for _ in range(draws):
        kind = "process" if rng.random() < p else "node"
        counts[kind] += 1
        if kind == "process" and used < k:
            used += 1
        elif kind == "node" and spares < s:
            spares, used = spares + 1, 0
        else:
            used = spares = 0
            counts["requeue"] += 1
            continue
        counts[f"{kind} in place"] += 1
    assert model.requeued() == pytest.approx(counts["requeue"] / draws, abs=0.01)
    assert model.requeued() == pytest.approx(_requeued(p, k, s), rel=1e-12)
    assert model.process_in_place() == pytest.approx(
        counts["process in place"] / counts["process"], abs=0.01)
    assert model.node_in_place() == pytest.approx(
        counts["node in place"] / max(1, counts["node"]), abs=0.01)


@pytest.mark.parametrize("sets", [B, C])
def test_the_simulation_of_the_budgets_agrees_with_the_closed_form(sets: list[str]) -> None:
    """The simulation draws each failure's kind and spends the budgets (each run starts in a
    fresh allocation); a requeue of 3,000 s against 787 s in place makes the share count."""
    opts = {"restart_s": 3000.0, "simulate": 2000, "seed": 1}
    mixed, nodes_only = _fail(_plan(sets, 0.5, **opts)), _fail(_plan(sets, **opts))
    for f in (mixed, nodes_only):
        sim = f.recipe.simulation
        assert sim is not None and sim.within(f.recipe.wall_s), (sim, f.recipe.wall_s)
    # the share moves the closed form well outside the other's interval: the check can fail
    assert not mixed.recipe.simulation.within(nodes_only.recipe.wall_s)  # type: ignore


def test_text_and_json_say_what_the_share_comes_to(jobgen: Callable) -> None:
    args = ["plan", "llama2-7b", "--nodes", "128", "--process-failure-share", "0.25",
            *sum((["--set", s] for s in C), [])]
    text = jobgen(*args)
    assert text.exit_code == 0, text.stderr
    assert ("  - 25 % of failures are a process's on healthy nodes (--process-failure-share); "
            "job.restarts_in_place=3: the first 3 of a torchrun launch restart in place, the next "
            "is requeued; a requeue or a spare's relaunch starts a fresh launch. In the long run "
            "98.8 % of process failures and 50.1 % of node failures restart in place (detect 600 "
            "+ rendezvous 120 s, plus the checkpoint load) and 37.7 % of all failures are "
            "requeued (docs/planning.md)\n") in text.stdout
    data = json.loads(jobgen(*args, "--json").stdout)["process"]
    assert data["process_failure_share"] == 0.25 and data["restarts_in_place"] == 3
    assert data["in_place"] == pytest.approx(1 - _requeued(0.25, 3, 1), rel=1e-12)


BAD = [(1.5, "1.5 must be from 0 to 1"), (-0.1, "-0.1 must be from 0 to 1"),
       ("abc", "expected a number, got 'abc'")]


@pytest.mark.parametrize(("value", "message"), BAD)
def test_a_bad_share_in_a_site_is_one_line_naming_the_file_and_key(
        write_site: Callable, jobgen: Callable, value: Any, message: str) -> None:
    site = write_site(changes={"plan.process_failure_share": value})
    result = jobgen("plan", "llama2-7b", "--nodes", "128", "--site", str(site))
    assert result.exit_code == 2
    assert result.stderr == f"error: {site}: plan.process_failure_share: {message}\n"
    assert result.exception is None or isinstance(result.exception, SystemExit)
    data = yaml.safe_load(site.read_text())
    assert list(jsonschema.Draft202012Validator(json_schema.site_schema()).iter_errors(data))


@pytest.mark.parametrize(("value", "message"), [("1.5", "1.5 must be from 0 to 1"),
                                                ("-0.1", "-0.1 must be from 0 to 1"),
                                                ("abc", "'abc' is not a number")])
def test_a_bad_share_option_is_a_one_line_usage_error(jobgen_proc: Callable, value: str,
                                                      message: str) -> None:
    result = jobgen_proc("plan", "llama2-7b", f"--process-failure-share={value}")
    assert result.returncode == 2
    assert result.stderr == (f"error: jobgen plan: Invalid value for '--process-failure-share': "
                             f"{message} (see 'jobgen plan --help')\n")


def test_the_site_schema_takes_a_share_from_0_to_1(write_site: Callable) -> None:
    data = yaml.safe_load(write_site(changes={"plan.process_failure_share": 0.25}).read_text())
    assert not list(jsonschema.Draft202012Validator(json_schema.site_schema()).iter_errors(data))


def test_a_restart_in_place_never_costs_more_than_the_requeue_given() -> None:
    """--restart-s (or --from-run's measured restart) below the site's detect + rendezvous:
    a restart in place skips parts of the requeue, so it costs the requeue at most."""
    quick = _fail(_plan(C, 0.5, restart_s=10.0))
    assert quick.restart_s == pytest.approx(10.0 + quick.load_s, rel=1e-12)
    assert quick.recipe.goodput == pytest.approx(
        _fail(_plan(SYNC, restart_s=10.0)).recipe.goodput, rel=1e-12)
