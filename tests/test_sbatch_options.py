"""#SBATCH options jobgen does not own: the site's slurm.extra_options and --sbatch-opt reach the
script (and submitit), are checked like every Slurm value, and options jobgen owns are refused
naming what sets them."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from jobgen import api
from jobgen.backends.submitit import runner as submitit_runner


def sbatch_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_options_reach_the_script_in_order_after_the_sites(jobgen: Callable,
                                                           write_site: Callable) -> None:
    site = write_site("local", {"slurm.extra_options": {"constraint": "trn1", "mem": "0",
                                                        "comment": "team-a"}})
    result = jobgen("render", "pythia6.9b", "-n", "2", "--site", str(site),
                    "--sbatch-opt", "constraint=trn1&efa|trn1n", "--sbatch-opt",
                    "mail-type=END,FAIL", "--sbatch-opt", "mail-user=me@example.org",
                    "--sbatch-opt", "hold", "--sbatch-opt", "dependency=afterok:12")
    assert result.exit_code == 0, result.stderr
    lines = sbatch_lines(result.stdout)
    extra = lines[lines.index("#SBATCH --exclusive") + 1:lines.index(
        "#SBATCH --output=%x-%j.out")]
    # The site's (as its file lists them: write_site sorts the keys), --sbatch-opt's value in
    # place of the site's for the same name, then the new ones.
    assert extra == ["#SBATCH --comment=team-a", "#SBATCH --constraint=trn1&efa|trn1n",
                     "#SBATCH --mem=0", "#SBATCH --mail-type=END,FAIL",
                     "#SBATCH --mail-user=me@example.org", "#SBATCH --hold",
                     "#SBATCH --dependency=afterok:12"]
    shown = yaml.safe_load(jobgen("show", "pythia6.9b", "-n", "2", "--site", str(site),
                                  "--sbatch-opt", "hold").stdout)
    assert shown["slurm"]["extra"] == {"comment": "team-a", "constraint": "trn1", "mem": "0",
                                       "hold": ""}


def test_submitit_gets_them_as_additional_parameters() -> None:
    spec = api.job_spec("pythia6.9b", 2, options={"sbatch_opt": ("gres=gpu:8", "hold")})
    extra = submitit_runner.executor_parameters(spec)["slurm_additional_parameters"]
    assert extra["gres"] == "gpu:8" and extra["hold"] is True


@pytest.mark.parametrize(("option", "error"), [
    ("nodes=3", "--sbatch-opt 'nodes=3': --nodes is set by --nodes, not by an extra option"),
    ("time=10", "--sbatch-opt 'time=10': --time is set by --time, not by an extra option"),
    ("signal=B:USR1@9", "--signal is set by the site's slurm.time_limit_warning_s"),
    ("output=x.out", "--output is set by jobgen (%x-%j.out)"),
    ("array=0-3%2", "--array is set by --sweep"),
    ("export=NONE", "--export is set by jobgen (the job needs the submitting environment)"),
    ("N=2", "'N' is not an sbatch long option name"),
    ("--gres=gpu:1", "'--gres' is not an sbatch long option name"),
    ("comment=two words", "--comment: 'two words' cannot go on an #SBATCH line"),
    ("comment=a\n#SBATCH --nodes=99", "cannot go on an #SBATCH line"),
    ("comment=$(touch x)", "cannot go on an #SBATCH line"),
    ("mem=", "no value after '=' (give NAME alone for a flag)"),
])
def test_refused_options_are_one_line(jobgen: Callable, option: str, error: str) -> None:
    result = jobgen("render", "pythia6.9b", "-n", "2", "--sbatch-opt", option)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert error in result.stderr


def test_a_sites_bad_option_names_the_site_key(jobgen: Callable, write_site: Callable) -> None:
    site = write_site("local", {"slurm.extra_options": {"ntasks": "4"}})
    result = jobgen("render", "pythia6.9b", "-n", "2", "--site", str(site))
    assert result.exit_code == 2
    assert result.stderr == ("error: site local: slurm.extra_options.ntasks: --ntasks is set by "
                             "jobgen (one per node), not by an extra option\n")


def test_other_backends_refuse_them(jobgen: Callable) -> None:
    result = jobgen("render", "bert-large", "-n", "2", "--backend", "batch",
                    "--sbatch-opt", "gres=x")
    assert result.exit_code == 2
    assert result.stderr == ("error: --sbatch-opt: a Slurm setting; a batch job takes its "
                             "limits from the site's batch section\n")
    ran = jobgen("run", "neox20b", "-n", "2", "--smoke", "--dry-run", "--sbatch-opt", "hold")
    assert ran.exit_code == 2 and "--sbatch-opt is a Slurm setting" in ran.stderr


@pytest.mark.slurm
def test_sbatch_accepts_what_jobgen_writes(slurm_cluster: int, jobgen: Callable,
                                           tmp_path: Path) -> None:
    """The real sbatch (--test-only) reads the lines as the options they are."""
    result = jobgen("render", "pythia6.9b", "-n", "2", "--smoke", "--sbatch-opt",
                    "comment=team-a|x", "--sbatch-opt", "mail-type=END,FAIL",
                    "--sbatch-opt", "hold", "--sbatch-opt", "mem=0")
    assert result.exit_code == 0, result.stderr
    proc: Any = subprocess.run(["sbatch", "--test-only"], input=result.stdout, text=True,
                               capture_output=True, timeout=60, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "to start at" in proc.stderr


def test_an_array_throttle_goes_on_the_sweeps_array_line(jobgen: Callable) -> None:
    result = jobgen("submit", "llama2-7b", "-n", "4", "--sweep", "optim.lr=1e-4,3e-4,5e-4",
                    "--sbatch-opt", "array=%2", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "#SBATCH --array=0-2%2\n" in result.stdout
    assert result.stdout.count("#SBATCH --array") == 1
    for args, said in ((("render", "llama2-7b", "-n", "4", "--sbatch-opt", "array=%2"),
                        "throttles a sweep's job array, and this job is not one"),
                       (("render", "llama2-7b", "-n", "4", "--sbatch-opt", "array=0-3"),
                        "--array is set by --sweep; give only its throttle, array=%N")):
        refused = jobgen(*args)
        assert refused.exit_code == 2 and said in refused.stderr, refused.stderr
