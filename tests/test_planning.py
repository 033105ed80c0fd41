"""`jobgen plan`: the published tables reproduced, the throughput model's marks and flags, Young's
and Daly's intervals against hand-computed values, the expected wall time against a Monte Carlo
of the same failures, the site's plan facts, the PNG, and bad input."""
from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from conftest import recipe_names

from jobgen import api
from jobgen.planning import failures, measurements, model, planner
from jobgen.runs import ledger as runs

ROOT = Path(__file__).resolve().parent.parent


def plan(recipe: str, nodes: str, *overrides: str, **options: Any) -> planner.Result:
    return planner.plan(recipe, planner.parse_nodes(nodes), overrides, None,
                        planner.Options(**options))


# --- the published tables -----------------------------------------------------------------------

def _groups_with_prices() -> list[measurements.Group]:
    return [g for g in measurements.published().measurements if g.price is not None]


@pytest.mark.parametrize("group", _groups_with_prices(), ids=lambda g: g.recipe)
def test_measured_points_reproduce_the_published_tokens_per_dollar(
        group: measurements.Group) -> None:
    """At the source's own price and global batch, each measured row gives the source's tokens
    per dollar to the token (the published figures are rounded to whole tokens)."""
    nodes = ",".join(str(row.nodes) for row in group.rows)
    sets = []
    if group.settings.global_batch is not None:
        sets.append(f"parallelism.global_batch_size={group.settings.global_batch}")
    result = plan(group.recipe, nodes, *sets, price=group.price)
    assert [r.nodes for r in result.rows] == [row.nodes for row in group.rows]
    for got, row in zip(result.rows, group.rows):
        assert got.throughput.basis == "measured"
        assert got.throughput.flags == ()
        assert got.throughput.samples_per_s == row.samples_per_s
        assert row.per_dollar is not None and got.per_dollar is not None
        assert abs(got.per_dollar - row.per_dollar) <= 1, (got.nodes, got.per_dollar)


def test_neox_64_nodes_at_the_published_price_prints_about_3_2_million_tokens_per_dollar(
        jobgen: Callable) -> None:
    result = jobgen("plan", "neox20b", "--nodes", "64", "--price", "7.59",
                    "--set", "parallelism.global_batch_size=16384")
    assert result.exit_code == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.strip().startswith("64 "))
    assert "212.00" in row and "measured" in row and "3,217,708" in row


def test_bert_scaling_efficiency_matches_the_published_table() -> None:
    """Per-accelerator throughput relative to one node: 85.1 % at 8 nodes, 82.7 % at 16."""
    result = plan("bert1.5b", "1,8,16", price=13.11)
    per_acc = [r.throughput.samples_per_s / (8 * r.nodes) for r in result.rows]
    assert [round(100 * p / per_acc[0], 1) for p in per_acc] == [100.0, 85.1, 82.7]
    # the recipe steps 384 samples per accelerator, as measured: nothing flagged
    assert all(r.throughput.flags == () for r in result.rows)
    # samples per dollar at the price: 276.66 x 3600 / 13.11
    assert result.rows[0].per_dollar == pytest.approx(276.66 * 3600 / 13.11)
    assert result.unit == "samples"


# --- the throughput model -----------------------------------------------------------------------

def test_a_recipe_that_differs_from_its_measurement_is_flagged_and_adjusted() -> None:
    """NeoX was measured at GBS 16,384; the recipe trains at 256. With PP 4 the recipe's step
    has far fewer micro-batches, so the pipeline bubble grows: the figure is adjusted, marked,
    and the mismatch named."""
    result = plan("neox20b", "64")
    row = result.rows[0]
    assert row.throughput.basis == "measured+bubble"
    assert row.throughput.flags == ("measured at global batch 16384, the recipe has 256",)
    # DP 64 (64 x 32 workers / TP 8 x PP 4), micro-batch 1: 4 micro-batches against 256
    factor = (4 / (4 + 3)) / (256 / (256 + 3))
    assert row.throughput.samples_per_s == pytest.approx(212.0 * factor)
    assert "pipeline bubble of 4 stages with 4 micro-batches" in row.throughput.detail


def test_between_and_beyond_measurements_the_figures_say_they_are_modelled() -> None:
    result = plan("pythia6.9b", "1,2,4,8")
    bases = {r.nodes: r.throughput.basis for r in result.rows}
    assert bases == {1: "measured", 2: "interpolated", 4: "measured", 8: "extrapolated"}
    by = {r.nodes: r.throughput.samples_per_s for r in result.rows}
    # interpolated in log2(nodes): halfway between 10.4 and 35.8 / 4 per node
    assert by[2] == pytest.approx(2 * (10.4 + 35.8 / 4) / 2)
    # fit of nodes/throughput = a + b log2(nodes) through (1, 1/10.4) and (4, 4/35.8)
    a, b = 1 / 10.4, (4 / 35.8 - 1 / 10.4) / 2
    per_node_8 = (35.8 / 4) * (a + 2 * b) / (a + 3 * b)
    assert by[8] == pytest.approx(8 * per_node_8)
    data = json.loads(json.dumps(__import__("jobgen.planning.report", fromlist=["x"])
                                 .as_json(result)))
    assert [r["throughput"]["modelled"] for r in data["rows"]] == [False, True, False, True]


def test_node_counts_the_recipe_cannot_run_are_listed_not_planned() -> None:
    result = plan("pythia6.9b", "32,64")
    assert [r.nodes for r in result.rows] == [32]
    assert [s.nodes for s in result.skipped] == [64]
    assert "not divisible" in result.skipped[0].reason


def test_llama_is_transferred_from_pythia_by_flops_per_sample() -> None:
    base = api.job_spec("llama2-7b")
    source = api.job_spec("pythia6.9b")
    scale = (model.flops_per_token(source) * 2048) / (model.flops_per_token(base) * 4096)
    result = plan("llama2-7b", "4")
    row = result.rows[0]
    assert row.throughput.basis == "transferred"
    assert row.throughput.samples_per_s == pytest.approx(35.8 * scale)
    assert "measured at seq length 2048, the recipe has 4096" in row.throughput.flags
    assert any("transferred from pythia6.9b" in note for note in result.notes)


def test_own_measurement_replaces_the_transfer_and_borrows_its_shape(tmp_path: Path) -> None:
    rows = tmp_path / "mine.yaml"
    rows.write_text(yaml.safe_dump({"measurements": [{
        "recipe": "llama2-7b", "source": "our 128-node run, 2026-10",
        "settings": {"global_batch": 1024, "seq_length": 4096},
        "rows": [{"nodes": 128, "samples_per_s": 400.0}]}]}))
    result = plan("llama2-7b", "64,128", measurement_files=(str(rows),))
    by = {r.nodes: r.throughput for r in result.rows}
    assert by[128].basis == "measured" and by[128].samples_per_s == 400.0
    assert by[128].flags == ()
    assert by[64].basis == "extrapolated"
    assert "the scaling curve of pythia6.9b" in by[64].detail
    slope = (4 / 35.8 - 1 / 10.4) / 2 / (1 / 10.4)
    assert by[64].samples_per_s == pytest.approx(
        64 * (400 / 128) * (1 + slope * 7) / (1 + slope * 6))


def test_parameters_of_the_recipes_match_their_published_sizes() -> None:
    sizes = {name: model.parameters(api.job_spec(name)) / 1e9
             for name in ("llama2-7b", "neox20b", "pythia6.9b", "bert1.5b", "bert-large")}
    assert sizes["llama2-7b"] == pytest.approx(6.74, abs=0.01)
    assert sizes["neox20b"] == pytest.approx(20.55, abs=0.05)
    assert sizes["pythia6.9b"] == pytest.approx(6.86, abs=0.02)
    assert sizes["bert1.5b"] == pytest.approx(1.5, abs=0.05)
    assert sizes["bert-large"] == pytest.approx(0.34, abs=0.01)


# --- failures: the formulas -------------------------------------------------------------------

def test_young_and_daly_against_hand_computed_values() -> None:
    # write 100 s, MTBF 36,000 s: sqrt(2 x 100 x 36000) = sqrt(7.2e6) = 2683.2816
    assert failures.young(100, 36000) == pytest.approx(2683.2816, abs=1e-3)
    # Daly: 2683.2816 x (1 + sqrt(100/72000)/3 + (100/72000)/9) - 100
    #     = 2683.2816 x (1 + 0.0124226 + 0.0001543) - 100 = 2617.0298
    assert failures.daly(100, 36000) == pytest.approx(2617.0298, abs=1e-3)
    # write 600 s, MTBF 3,600 s: sqrt(4.32e6) = 2078.4610; ratio 600/7200 = 0.0833333
    # 2078.4610 x (1 + 0.0962250 + 0.0092593) = 2078.4610 x 1.1054843 = 2297.7060; - 600
    assert failures.daly(600, 3600) == pytest.approx(1697.7060, abs=1e-3)
    # when a write takes at least twice the MTBF, Daly's answer is the MTBF
    assert failures.daly(8000, 3600) == 3600


def test_expected_wall_time_against_hand_computed_values() -> None:
    # no restart cost: one segment of 100 s at MTBF 1000 s takes 1000 (e^0.1 - 1) = 105.1709
    assert failures.segment_time(100, 0, 1000) == pytest.approx(105.1709, abs=1e-4)
    # with R = 50: 105.1709 x e^0.05 = 105.1709 x 1.0512711 = 110.5631
    assert failures.segment_time(100, 50, 1000) == pytest.approx(110.5631, abs=1e-4)
    # 250 s of work every 100 s with a 10 s write: two segments of 110 s and one of 60 s
    wall = failures.expected_wall(250, 100, 10, 50, 1000)
    hand = 2 * 1000 * math.exp(0.05) * math.expm1(0.11) + 1000 * math.exp(0.05) * math.expm1(0.06)
    assert wall == pytest.approx(hand)
    # no failures in sight: the wall time is the work plus the writes
    assert failures.expected_wall(250, 100, 10, 50, 1e12) == pytest.approx(280, rel=1e-6)


@pytest.mark.parametrize("mtbf,interval,write,restart", [
    (3600.0, 600.0, 30.0, 120.0),       # a failure every hour, saving every 10 minutes
    (3600.0, 3000.0, 60.0, 600.0),      # an interval near the MTBF: many lost segments
    (90000.0, 3455.0, 67.0, 1087.0),    # Llama 2-7B at 128 nodes (the README's example)
    (20000.0, 200.0, 5.0, 30.0),        # frequent cheap saves
])
def test_monte_carlo_agrees_with_the_analytic_goodput(mtbf: float, interval: float,
                                                      write: float, restart: float) -> None:
    work = 40 * interval + interval / 3           # a last, partial segment too
    expected = failures.expected_wall(work, interval, write, restart, mtbf)
    sim = failures.simulate(work, interval, write, restart, mtbf, runs=3000, seed=11)
    assert sim.within(expected), (expected, sim)
    assert sim.goodput_low <= work / expected <= sim.goodput_high
    # seeded: the same figures again
    assert failures.simulate(work, interval, write, restart, mtbf, 3000, 11) == sim


def test_a_run_held_to_the_model_given_its_failure_count() -> None:
    """One finished run is held to the model's runs that failed as often. Given exactly one
    failure, a Poisson failure lies uniformly over the training and writes (the weight of its
    lost work in the rest is e^(-10/3000) at most) and strikes no restart, since no failure came
    before: the wall is the work and writes, one restart and half a segment, by hand. The
    expectation at the same rate lets some failures strike a restart, where they cost less."""
    work, interval, write, restart, mtbf = 240.0, 10.0, 0.01, 65.0, 3000.0
    hand = work + 24 * write + restart + (interval + write) / 2          # 310.245 s
    given = failures.wall_given_failures(work, interval, write, restart, mtbf, 1)
    assert given == pytest.approx(hand, abs=0.6)          # 400 draws: standard error 0.15 s
    assert failures.wall_given_failures(work, interval, write, restart, mtbf, 1) == given
    # at a run's own rate (one failure expected), the expectation sits below the single run
    fast = 300.0
    at_rate = failures.expected_wall(work, interval, write, restart, fast)
    one = failures.wall_given_failures(work, interval, write, restart, fast, 1)
    assert one is not None and at_rate < one - 5
    assert failures.wall_given_failures(work, interval, write, restart, mtbf, 0) == \
        pytest.approx(work + 24 * write)
    # a count the model all but never gives: not drawn
    assert failures.wall_given_failures(work, interval, write, restart, mtbf, 40) is None


def test_the_recommended_interval_beats_the_recipes_when_they_differ() -> None:
    result = plan("neox20b", "64", node_mtbf_hours=5000.0)
    f = result.rows[0].failures
    assert f is not None
    assert f.best.steps != f.recipe.steps
    assert f.best.goodput > f.recipe.goodput
    assert f.job_mtbf_s == pytest.approx(5000 * 3600 / 64)
    # the recommended interval is Daly's optimum, in whole steps
    assert f.best.steps == round(f.daly_s / result.rows[0].step_s)
    # 20.55B parameters x 12 bytes at the local site's 1,200 MB/s
    assert f.write_s == pytest.approx(result.checkpoint_bytes / 1.2e9)


def test_background_saves_cost_their_stall_so_the_recommended_interval_shortens() -> None:
    """The plan's checkpoint cost is what a save stops training for: in the background, the
    copy into host memory, not the write; a failure before a save is sealed (at the step
    boundary after its last byte: at least a step, at most the interval) re-trains that much
    more. NeMo's saves are synchronous unless the recipe asks (upstream's default)."""
    back = plan("neox20b", "64", "checkpoint.async_save=true",
                node_mtbf_hours=5000.0).rows[0].failures
    sync = plan("neox20b", "64", "checkpoint.async_save=false",
                node_mtbf_hours=5000.0).rows[0].failures
    unset = plan("neox20b", "64", node_mtbf_hours=5000.0).rows[0].failures
    assert back is not None and sync is not None and unset is not None
    assert unset.stall_s == sync.stall_s and unset.best.steps == sync.best.steps
    assert sync.stall_s == sync.write_s and back.write_s == sync.write_s
    assert back.stall_s is not None and back.stall_s < back.write_s / 5
    assert back.daly_s < sync.daly_s and back.young_s < sync.young_s
    assert back.best.steps < sync.best.steps
    row = plan("neox20b", "64", "checkpoint.async_save=true", node_mtbf_hours=5000.0).rows[0]
    lag = min(back.recipe.seconds, row.step_s * math.ceil(back.write_s / row.step_s))
    assert back.write_s > row.step_s and lag > back.write_s   # sealed at a step boundary
    assert back.restart_s == pytest.approx(sync.restart_s + lag)
    assert back.best.goodput > sync.best.goodput


def test_a_simulation_too_large_to_finish_is_refused(jobgen: Callable) -> None:
    result = jobgen("plan", "bert-large", "--nodes", "1", "--samples", "1e12",
                    "--simulate", "1000000")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --simulate 1000000: at 1 nodes with a checkpoint "
                                    "every 200 steps that is about ")


@pytest.mark.parametrize("recipe", recipe_names())
def test_every_recipe_plans_at_its_own_node_count(jobgen: Callable, recipe: str) -> None:
    """A recipe with published throughput (its own or transferred) is planned; a new one
    without is refused in one line that says how to give it some."""
    from jobgen.planning import measurements
    table = measurements.published()
    measured = {g.recipe for g in table.measurements} | {t.recipe for t in table.transfers}
    result = jobgen("plan", recipe)
    if recipe not in measured:
        assert result.exit_code == 2 and "--measurements FILE" in result.stderr, result.stderr
        return
    assert result.exit_code == 0, result.stderr
    nodes = api.job_spec(recipe).nodes
    assert f"  nodes: {nodes}\n" in result.stdout
    assert "Failures: expected goodput" in result.stdout


def test_simulate_prints_both_figures(jobgen: Callable) -> None:
    result = jobgen("plan", "bert1.5b", "--nodes", "8,16", "--samples", "2e9",
                    "--price", "13.11", "--simulate", "300", "--seed", "5")
    assert result.exit_code == 0, result.stderr
    assert "simulated [95 % CI]" in result.stdout
    assert "300 runs with seed 5" in result.stdout


# --- the site's facts and the options -----------------------------------------------------------

def test_price_comes_from_the_site_rate_or_falls_back_to_on_demand() -> None:
    neox = plan("neox20b", "4")
    assert neox.price == 7.59 and "reserved_3y" in neox.price_basis
    bert = plan("bert1.5b", "1")
    assert bert.price == 13.11 and "on_demand (no reserved_3y rate)" in bert.price_basis
    assert plan("neox20b", "4", rate="on_demand").price == 21.50


def test_site_without_plan_facts_still_plans_throughput(write_site: Callable) -> None:
    site = write_site("local", delete=["plan"])
    result = planner.plan("neox20b", [4], (), str(site), planner.Options())
    row = result.rows[0]
    assert row.cost is None and row.failures is None
    assert any("--price" in note for note in result.notes)
    assert any("--node-mtbf-hours" in note for note in result.notes)
    assert any("--storage-mb-s" in note for note in result.notes)
    with_opts = planner.plan("neox20b", [4], (), str(site), planner.Options(
        price=7.59, node_mtbf_hours=3000.0, storage_mb_s=500.0))
    assert with_opts.rows[0].failures is not None


@pytest.mark.parametrize("key,value,message", [
    ("plan.platforms.trn1.32xlarge.prices.on_demand", -1,
     "plan.platforms.trn1.32xlarge.prices.on_demand: -1.0 must be from 0.0001 to 100000 US "
     "dollars per node-hour"),
    ("plan.storage.write_mb_s", 0, "plan.storage.write_mb_s: 0.0 must be from 0.1 to 1e+08 MB/s"),
    ("plan.restart.detect_s", -5, "plan.restart.detect_s: -5.0 must be from 0 to 604800 seconds"),
])
def test_bad_site_plan_values_name_the_key(write_site: Callable, jobgen: Callable, key: str,
                                           value: Any, message: str) -> None:
    data = yaml.safe_load((ROOT / "env/sites/local.yaml").read_text())
    node: Any = data
    parts = key.split(".")
    # the platform name holds dots: walk plan.platforms.<name> by hand
    if parts[:2] == ["plan", "platforms"]:
        node = data["plan"]["platforms"]["trn1.32xlarge"]["prices"]
        node["on_demand"] = value
    else:
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = value
    site = write_site(text=yaml.safe_dump(data))
    result = jobgen("plan", "neox20b", "--nodes", "4", "--site", str(site))
    assert result.exit_code == 2
    assert result.stderr == f"error: {site}: {message}\n"
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize("args,message", [
    (["--nodes", "4..x"], "--nodes: '4..x' is not a node count or a range A..B"),
    (["--nodes", "8..4"], "--nodes: '8..4' is not a node count or a range A..B"),
    (["--nodes", "0"], "--nodes: node counts must be 1 to 100000"),
    (["--tokens", "1e9", "--samples", "5"], "--tokens and --samples: give one target"),
    (["--rate", "spot"], "--rate spot: the site local has no such price for trn1.32xlarge"),
    (["--measurements", "nope.yaml"], "--measurements nope.yaml: no such file"),
    (["--from-run", "nothing-here"], "--from-run nothing-here: no run of that name"),
])
def test_bad_options_are_one_line_errors(jobgen: Callable, args: list[str],
                                         message: str) -> None:
    result = jobgen("plan", "neox20b", *args)
    assert result.exit_code == 2, result.stdout
    assert result.stderr.startswith(f"error: {message}"), result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("args,message", [
    (["--price", "-1"],
     "Invalid value for '--price': -1 must be from 0.0001 to 100000 US dollars per node-hour"),
    (["--tokens", "x"], "Invalid value for '--tokens': 'x' is not a number of tokens"),
])
def test_bad_numbers_are_one_line_usage_errors(jobgen_proc: Callable, args: list[str],
                                               message: str) -> None:
    result = jobgen_proc("plan", "neox20b", *args)
    assert result.returncode == 2
    assert result.stderr == f"error: jobgen plan: {message} (see 'jobgen plan --help')\n"


def test_a_measurement_file_with_a_bad_row_names_the_row(tmp_path: Path,
                                                       jobgen: Callable) -> None:
    bad = tmp_path / "rows.yaml"
    bad.write_text("measurements:\n  - recipe: neox20b\n    source: x\n    rows:\n"
                   "      - {nodes: 4, samples_per_s: -3}\n")
    result = jobgen("plan", "neox20b", "--measurements", str(bad))
    assert result.exit_code == 2
    assert result.stderr == (f"error: {bad}: measurements[0].rows[0].samples_per_s: -3.0 must "
                             "be a number more than 0\n")


def test_node_ranges_double() -> None:
    assert planner.parse_nodes("4..64") == [4, 8, 16, 32, 64]
    assert planner.parse_nodes("3..20") == [3, 6, 12, 20]
    assert planner.parse_nodes("16,1..2,16") == [1, 2, 16]


def test_default_target_is_the_recipes_schedule() -> None:
    result = plan("neox20b", "4")
    assert result.target_samples == 10000 * 256
    assert result.target == 10000 * 256 * 2048 and result.unit == "tokens"
    assert result.rows[0].steps == 10000


# --- a finished run's own throughput ------------------------------------------------------------

def _event(kind: str, when: float, **fields: Any) -> str:
    sys.path.insert(0, str(ROOT / "payload"))
    try:
        from common.events import format_event
    finally:
        sys.path.pop(0)
    from datetime import datetime, timezone
    stamp = datetime.fromtimestamp(when, timezone.utc).isoformat(timespec="milliseconds")
    return format_event(kind, **fields, time=stamp)


def test_from_run_reads_the_runs_metrics(tmp_path: Path) -> None:
    """A run's metrics.jsonl, as the payloads write it: the first two intervals after each
    start are warm-up; the rest give samples per second."""
    run_dir = tmp_path / "pythia-run"
    (run_dir / "train").mkdir(parents=True)
    t0 = 1_800_000_000.0
    lines = [_event("start", t0, phase="train", global_batch_size=256)]
    for step in range(1, 9):            # first steps slow (graph warm-up), then 10 s per step
        lines.append(_event("step", t0 + (60 * step if step <= 2 else 120 + 10 * (step - 2)),
                            phase="train", step=step, consumed_samples=256 * step, loss=2.0))
    lines.append(_event("start", t0 + 1000, phase="train", global_batch_size=256))
    for step in range(9, 14):
        lines.append(_event("step", t0 + 1000 + 10 * (step - 8) + (50 if step == 9 else 0),
                            phase="train", step=step, consumed_samples=256 * step, loss=2.0))
    (run_dir / "train" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    runs.record(runs.Run(name="pythia-run", backend="slurm", job_id="4242",
                         recipe="pythia6.9b", nodes=2, site="", run_dir=str(run_dir),
                         submitted=runs.now()))
    result = plan("pythia6.9b", "2,4", from_runs=("pythia-run",))
    row = result.rows[0]
    assert row.throughput.basis == "measured"
    assert row.throughput.samples_per_s == pytest.approx(25.6)   # 256 samples / 10 s
    assert "run pythia-run" in row.throughput.detail


def test_from_run_refuses_a_smoke_rehearsal(tmp_path: Path) -> None:
    runs.record(runs.Run(name="smoky", backend="slurm", job_id="77", recipe="pythia6.9b",
                         nodes=2, site="", run_dir=str(tmp_path), submitted=runs.now(),
                         smoke=True))
    with pytest.raises(Exception, match="a --smoke rehearsal; its throughput is the CPU"):
        plan("pythia6.9b", "2", from_runs=("smoky",))


# --- output --------------------------------------------------------------------------------------

def test_json_has_every_figure_and_its_basis(jobgen: Callable) -> None:
    result = jobgen("plan", "llama2-7b", "--nodes", "16,32,64,128", "--tokens", "1.8e12",
                    "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [r["nodes"] for r in data["rows"]] == [16, 32, 64, 128]
    for row in data["rows"]:
        assert row["throughput"]["basis"] == "transferred"
        assert row["throughput"]["modelled"] is True
        assert row["failures"]["best"]["goodput"] >= row["failures"]["recipe"]["goodput"] - 1e-3
    assert data["unit"] == "tokens" and data["target"] == 1.8e12


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    body = data[16:16 + 13]
    crc, = struct.unpack(">I", data[29:33])
    assert zlib.crc32(kind + body) == crc
    width, height = struct.unpack(">II", body[:8])
    return width, height


def test_plot_writes_a_valid_png(jobgen: Callable, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "plan.png"
    result = jobgen("plan", "neox20b", "--nodes", "4..64", "--tokens", "3e11",
                    "--node-mtbf-hours", "5000", "--plot", str(out))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.endswith(f"plot: {out}\n")
    width, height = _png_size(out.read_bytes())
    assert width > 600 and height > 300
    from PIL import Image
    with Image.open(out) as image:
        image.verify()
    assert [p.name for p in tmp_path.iterdir()] == ["plan.png"]   # no temporary left


def _without_matplotlib(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a Python where importing matplotlib fails, as where it is not installed."""
    blocker = ("import sys\n"
               "class Block:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name.split('.')[0] == 'matplotlib':\n"
               "            raise ImportError('No module named matplotlib')\n"
               "sys.meta_path.insert(0, Block())\n")
    return subprocess.run([sys.executable, "-c", blocker + code], capture_output=True,
                          text=True, timeout=300, check=False, cwd=ROOT)


def test_without_matplotlib_plot_is_a_clear_error_and_check_works(tmp_path: Path) -> None:
    out = tmp_path / "p.png"
    result = _without_matplotlib(
        "import jobgen.cli\n"
        f"sys.exit(jobgen.cli.main(['plan', 'neox20b', '--nodes', '4', '--plot', {str(out)!r}]))\n")
    assert result.returncode == 2
    assert result.stderr == "error: --plot needs matplotlib: pip install 'jobgen[plot]'\n"
    assert not out.exists()
    result = _without_matplotlib(
        "import jobgen.cli\n"
        "sys.exit(jobgen.cli.main(['check', '--recipe', 'pythia6.9b', '--no-shellcheck',"
        " '--max-nodes', '4']))\n")
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout


def test_render_does_not_import_the_planner() -> None:
    code = ("import contextlib, io, sys\n"
            "import jobgen.cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            "        jobgen.cli.main(['render', 'neox20b', '--nodes', '4'])\n"
            "    except SystemExit as exc:\n"
            "        assert not exc.code\n"
            "print(sorted(m for m in sys.modules if m.startswith('jobgen.planning')"
            " or m.split('.')[0] == 'matplotlib'))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False, cwd=ROOT)
    assert (result.returncode, result.stdout) == (0, "[]\n"), result.stderr


def _scatter(*args: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos_scatter.py"),
                          "--runs", "1500", *args], capture_output=True, text=True,
                         check=True).stdout
    sd = float(out.split(" sd ")[1].split(",")[0])
    most = int(out.split("most ")[1].split()[0])
    beyond = float(out.split("beyond 3 points: ")[1].split("(")[1].split(" %")[0])
    return {"sd": sd, "most": most, "beyond": beyond}


def test_chaos_scatter_shows_why_ci_rehearses_one_kill() -> None:
    # The CI rehearsal's regime (benchmarks/chaos_scatter.py defaults: one kill, a 40-s restart
    # next to 36 s of training): every drawn run fails once and stays within the tolerance.
    one = _scatter()
    assert one["most"] == 1 and one["sd"] < 0.5 and one["beyond"] == 0.0
    # Kills at 2-minute mean gaps, saves every 4 steps: the same model, a scatter of points.
    many = _scatter("--kills", "0", "--interval", "6")
    assert many["most"] > 1 and many["sd"] > 2 * one["sd"] and many["beyond"] > 3.0
    # Restarts short next to the gaps between failures: the drawn runs centre on the model.
    mild = _scatter("--kills", "0", "--restart", "2", "--kill-every", "600", "--work", "600",
                    "--first-kill", "100", "300")
    assert abs(mild["sd"]) < 1.0 and mild["beyond"] < 1.0


def test_a_background_save_is_exposed_until_the_step_boundary_after_its_last_byte() -> None:
    """seal_lag: at least one step (the loop polls at step boundaries), the write rounded up to
    whole steps, at most the interval (the next save waits for it)."""
    from jobgen.planning.goodput import seal_lag
    assert seal_lag(0.01, 10.0, 10.0) == 10.0        # the rehearsal: a save every 10-s step
    assert seal_lag(25.0, 10.0, 100.0) == 30.0
    assert seal_lag(250.0, 10.0, 100.0) == 100.0
