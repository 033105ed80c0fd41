"""A --tokens target against a recipe whose schedule decays short of its max_steps: the docs'
`jobgen submit llama2-7b --nodes 64 --tokens 1.8e12` trains the steps plan counted, the decay
scaled with them and said in one line; a target the warmup does not fit in is refused with the
--set that fixes it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

JOBGEN = Path(sys.executable).parent / "jobgen"


def jobgen(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(JOBGEN), *args], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120, check=False)


def test_the_docs_submit_trains_what_plan_counted(tmp_path: Path) -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "commands.md").read_text()
    assert "jobgen submit llama2-7b --nodes 64 --tokens 1.8e12 " in docs
    plan = jobgen(tmp_path, "plan", "llama2-7b", "--nodes", "64", "--tokens", "1.8e12", "--json")
    assert plan.returncode == 0, plan.stderr
    steps = json.loads(plan.stdout)["rows"][0]["steps"]
    decay = round(480000 * steps / 500000)
    submitted = jobgen(tmp_path, "submit", "llama2-7b", "--nodes", "64", "--tokens", "1.8e12",
                       "--dry-run")
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stderr == (
        f"note: --tokens 1.8e12: schedule.max_steps 500,000 -> {steps:,} steps (as `jobgen plan` "
        f"counts them); schedule.decay_steps scaled with it, 480,000 -> {decay:,} (the decay "
        "still ends 96 % of the way); --set schedule.decay_steps=N to choose another\n")
    shown = yaml.safe_load(jobgen(tmp_path, "show", "llama2-7b", "-n", "64", "--tokens",
                                  "1.8e12").stdout)["spec"]["schedule"]
    assert (shown["max_steps"], shown["decay_steps"], shown["warmup_steps"]) == (steps, decay,
                                                                                2000)
    assert str(steps) in submitted.stdout
    assert str(decay) in submitted.stdout


def test_a_decay_given_with_set_is_kept_or_refused(tmp_path: Path) -> None:
    kept = jobgen(tmp_path, "show", "llama2-7b", "-n", "64", "--tokens", "1.8e12", "--set",
                  "schedule.decay_steps=400000")
    assert kept.returncode == 0, kept.stderr
    assert kept.stderr == ""
    assert yaml.safe_load(kept.stdout)["spec"]["schedule"]["decay_steps"] == 400000
    refused = jobgen(tmp_path, "show", "llama2-7b", "-n", "64", "--tokens", "1.8e12", "--set",
                     "schedule.decay_steps=480000")
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.startswith("error: --tokens 1.8e12: schedule.decay_steps 480,000 "
                                     "(given with --set) must lie between 2,000 and the "
                                     "target's ")


def test_a_target_too_short_for_the_warmup_names_the_set(tmp_path: Path) -> None:
    proc = jobgen(tmp_path, "render", "llama2-7b", "-n", "64", "--tokens", "5e9")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("error: --tokens 5e9: 1,193 steps leave no room for the schedule's "
                           "warmup 2,000 + constant 0 steps; add --set schedule.warmup_steps=N "
                           "with the two at most 1193 steps, or train to a larger target\n")
    fixed = jobgen(tmp_path, "show", "llama2-7b", "-n", "64", "--tokens", "5e9", "--set",
                   "schedule.warmup_steps=20")
    assert fixed.returncode == 0, fixed.stderr
    schedule = yaml.safe_load(fixed.stdout)["spec"]["schedule"]
    assert (schedule["max_steps"], schedule["decay_steps"]) == (1193, 1145)


def test_a_recipe_that_decays_to_its_end_changes_only_max_steps(tmp_path: Path) -> None:
    proc = jobgen(tmp_path, "show", "neox20b", "-n", "8", "--tokens", "5e9")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert yaml.safe_load(proc.stdout)["spec"]["schedule"].get("decay_steps") is None
