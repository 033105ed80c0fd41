"""A default site set once: --site, then JOBGEN_SITE, then the user's config file, then the
built-in `local`; `jobgen show` says which, and a bad config file is one line naming its key."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

JOBGEN = Path(sys.executable).parent / "jobgen"


def show(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "JOBGEN_SITE"}
    full.update(XDG_CONFIG_HOME=str(tmp_path / "config"), **env)
    return subprocess.run([str(JOBGEN), "show", "pythia6.9b", "-n", "2", *args], env=full,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)


def site_of(proc: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    assert proc.returncode == 0, proc.stderr
    data = yaml.safe_load(proc.stdout)
    return data["site"], data["site_from"]


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config" / "jobgen" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_precedence_flag_environment_config_builtin(tmp_path: Path) -> None:
    assert site_of(show(tmp_path)) == ("local", "built-in default")
    config = write_config(tmp_path, "site: trn1-pcluster\n")
    assert site_of(show(tmp_path)) == ("trn1-pcluster", str(config))
    assert site_of(show(tmp_path, JOBGEN_SITE="local")) == ("local", "JOBGEN_SITE")
    assert site_of(show(tmp_path, "--site", "local", JOBGEN_SITE="trn1-pcluster")) == \
        ("local", "--site")


def test_a_site_file_named_by_the_config_is_taken_from_its_folder(tmp_path: Path) -> None:
    mine = yaml.safe_load((Path(__file__).parents[1] / "env" / "sites" / "local.yaml")
                          .read_text())
    mine["name"] = "mine"
    config = write_config(tmp_path, "site: sites/mine.yaml\n")
    (config.parent / "sites").mkdir()
    (config.parent / "sites" / "mine.yaml").write_text(yaml.safe_dump(mine))
    name, origin = site_of(show(tmp_path))
    assert name == "mine" and origin == f"{config} ({config.parent / 'sites' / 'mine.yaml'})"


@pytest.mark.parametrize(("text", "env", "error"), [
    ("sites: local\n", {}, "{config}: sites: not a jobgen setting (known: site)"),
    ("site: ''\n", {}, "{config}: site: must be a site name or a file"),
    ("site: [a]\n", {}, "{config}: site: must be a site name or a file"),
    ("", {"JOBGEN_SITE": ""}, "JOBGEN_SITE is set but empty (unset it for the default site)"),
    ("", {"JOBGEN_SITE": "nowhere"}, "unknown site 'nowhere' (sites: dl1-batch, local, "
                                     "sagemaker, trn1-pcluster)"),
])
def test_bad_defaults_are_one_line(tmp_path: Path, text: str, env: dict[str, str],
                                   error: str) -> None:
    config = write_config(tmp_path, text) if text else tmp_path / "none"
    proc = show(tmp_path, **env)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"error: {error.format(config=config)}\n"


def test_a_submission_records_the_site_it_used(tmp_path: Path) -> None:
    """The default site that was in force is what the run's record names (a later status or
    resubmit must not depend on the environment of that moment)."""
    proc = subprocess.run([str(JOBGEN), "submit", "pythia6.9b", "-n", "2", "--dry-run"],
                          env={**os.environ, "JOBGEN_SITE": "trn1-pcluster"}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "export JOBGEN_RUN_DIR=/fsx/jobgen/runs/pythia6.9b-2n" in proc.stdout


def test_list_as_json(tmp_path: Path) -> None:
    import json
    proc = subprocess.run([str(JOBGEN), "list", "--json"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["name"] for r in rows] == ["bert-large", "bert1.5b", "llama2-7b", "neox20b",
                                         "pythia6.9b"]
    assert rows[2] == {"name": "llama2-7b", "payload": "neuronx_distributed",
                       "platform": "trn1.32xlarge", "nodes": 128,
                       "description": rows[2]["description"]}


@pytest.mark.parametrize(("recipe", "nodes", "target"), [
    ("pythia6.9b", 4, ("--tokens", "1e9")), ("neox20b", 8, ("--tokens", "5e9")),
    ("bert-large", 8, ("--samples", "2e8"))])
def test_a_token_target_trains_what_plan_counts(tmp_path: Path, recipe: str, nodes: int,
                                                target: tuple[str, str]) -> None:
    """`--tokens`/`--samples` set the schedule's steps as `jobgen plan` counts them for the
    same node count, so the plan and the job agree; the run is named for its target."""
    import json

    def run(*args: str) -> str:
        proc = subprocess.run([str(JOBGEN), *args], capture_output=True, text=True,
                              cwd=tmp_path, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    planned = json.loads(run("plan", recipe, "--nodes", str(nodes), *target, "--json"))
    shown = yaml.safe_load(run("show", recipe, "-n", str(nodes), *target))
    assert shown["spec"]["schedule"]["max_steps"] == planned["rows"][0]["steps"]
    assert shown["run_name"].startswith(f"{recipe}-{nodes}n-")
    script = run("render", recipe, "-n", str(nodes), *target, "--backend", "batch"
                 if recipe.startswith("bert") else "slurm")
    assert str(planned["rows"][0]["steps"]) in script


def test_a_target_for_a_rehearsal_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run([str(JOBGEN), "render", "neox20b", "-n", "2", "--smoke", "--tokens",
                           "1e9"], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          check=False)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("error: --tokens/--samples: a --smoke rehearsal trains its own short "
                           "schedule; set the target for the real job\n")


def test_plan_headline_names_the_price_and_shows_on_demand(tmp_path: Path) -> None:
    proc = subprocess.run([str(JOBGEN), "plan", "llama2-7b", "--nodes", "16"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    head = proc.stdout.splitlines()
    assert head[0].endswith("; priced at $7.59 per node-hour: trn1.32xlarge reserved_3y, site "
                            "local")
    assert "  on demand: $21.5 per node-hour (site local): every cost below x 2.83" in head
    on_demand = subprocess.run([str(JOBGEN), "plan", "llama2-7b", "--nodes", "16", "--rate",
                                "on_demand"], capture_output=True, text=True, cwd=tmp_path,
                               timeout=120, check=False)
    assert "priced at $21.5 per node-hour: trn1.32xlarge on_demand" in on_demand.stdout
    assert "on demand:" not in on_demand.stdout


@pytest.mark.parametrize(("args", "env", "region", "origin"), [
    ((), {}, "us-east-1", "site local: batch.region"),
    ((), {"AWS_DEFAULT_REGION": "eu-west-1"}, "eu-west-1", "AWS_DEFAULT_REGION"),
    ((), {"AWS_REGION": "eu-west-3", "AWS_DEFAULT_REGION": "eu-west-1"}, "eu-west-3",
     "AWS_REGION"),
    (("--region", "ap-south-1"), {"AWS_REGION": "eu-west-3"}, "ap-south-1", "--region"),
])
def test_dry_run_says_the_region_and_where_it_came_from(tmp_path: Path, args: tuple[str, ...],
                                                        env: dict[str, str], region: str,
                                                        origin: str) -> None:
    """flag > environment > site > AWS config, as the AWS CLI; shown by --dry-run."""
    import json
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    for backend, recipe, nodes in (("batch", "bert-large", "2"), ("sagemaker", "llama2-7b",
                                                                   "16")):
        proc = subprocess.run([str(JOBGEN), "submit", recipe, "-n", nodes, "--backend", backend,
                               "--dry-run", *args], env={**base, **env}, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        want = origin.replace("batch.region", f"{backend}.region")
        assert json.loads(proc.stdout)["region"] == {"name": region, "from": want}


def test_bad_region_and_profile_flags_are_one_line(tmp_path: Path) -> None:
    bad = subprocess.run([str(JOBGEN), "status", "abc", "--backend", "batch", "--region",
                          "us east"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         check=False)
    assert (bad.returncode, bad.stdout) == (2, "")
    assert "'us east' is not an AWS region name" in bad.stderr and bad.stderr.count("\n") == 1
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=str(tmp_path / "config"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "credentials"))
    (tmp_path / "config").write_text("[profile team]\nregion = eu-west-1\n")
    nope = subprocess.run([str(JOBGEN), "status", "abc", "--backend", "batch", "--profile",
                           "nope"], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)
    assert (nope.returncode, nope.stderr) == (
        2, f"error: --profile: no profile 'nope' in {tmp_path / 'config'} or "
           f"{tmp_path / 'credentials'}\n")
