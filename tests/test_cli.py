"""The command line, in process (CliRunner): list, show, render, check, --version. Bad input is
in test_errors.py; the scripts' content in test_backends_slurm.py."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import yaml

from jobgen import __version__, api
from jobgen import recipe as recipes


def test_version(jobgen: Callable) -> None:
    result = jobgen("--version")
    assert result.exit_code == 0
    assert result.stdout == f"jobgen, version {__version__}\n"


def test_help_lists_the_commands(jobgen: Callable) -> None:
    result = jobgen("--help")
    assert result.exit_code == 0
    for command in ("list", "show", "render", "check"):
        assert f"\n  {command} " in result.stdout


def test_list(jobgen: Callable) -> None:
    result = jobgen("list")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == recipes.recipe_names()
    neox = next(line for line in lines if line.startswith("neox20b "))
    assert neox.split()[1:4] == ["neuron_nemo", "trn1.32xlarge", "4n"]
    assert neox.endswith(
        "GPT-NeoX 20B (44 layers, hidden 6144), TP 8 x PP 4, GPT-2 BPE, Neuron NeMo")
    llama = next(line for line in lines if line.startswith("llama2-7b "))
    assert llama.split()[1:4] == ["neuronx_distributed", "trn1.32xlarge", "128n"]
    # Aligned columns: the payload column starts at the same place on every line.
    assert len({line.index(line.split()[1]) for line in lines}) == 1


def test_show_prints_the_derived_numbers(jobgen: Callable) -> None:
    result = jobgen("show", "neox20b", "--nodes", "4")
    assert result.exit_code == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown["derived"]["world_size"] == 128
    assert shown["derived"]["data_parallel"] == 4
    assert shown["derived"]["gradient_accumulation"] == 64
    assert shown["derived"]["tokens_per_step"] == 524288
    assert (shown["recipe"], shown["site"], shown["nodes"]) == ("recipes/neox20b.yaml", "local", 4)
    assert shown["spec"]["model"]["num_layers"] == 44
    assert list(shown)[:3] == ["recipe", "site", "backend"]     # in order, not sorted


def test_show_follows_options(jobgen: Callable) -> None:
    result = jobgen("show", "llama2-7b", "--nodes", "128", "--site", "trn1-pcluster",
                    "--set", "optim.lr=1e-4", "--compile", "never", "--run-name", "hlat")
    assert result.exit_code == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown["derived"]["data_parallel"] == 512
    assert shown["derived"]["gradient_accumulation"] == 2
    assert shown["derived"]["tokens_per_step"] == 4194304
    assert shown["derived"]["lr"] == 1e-4
    assert (shown["compile_mode"], shown["run_name"], shown["run_dir"]) == \
        ("never", "hlat", "/fsx/jobgen/runs/hlat")


def test_render_to_stdout(jobgen: Callable) -> None:
    result = jobgen("render", "pythia6.9b", "--nodes", "2", "--site", "trn1-pcluster")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    expected = api.plan(api.job_spec("pythia6.9b", 2, site="trn1-pcluster")).text
    assert result.stdout == expected
    assert "#SBATCH --nodes=2\n" in result.stdout


def test_render_a_recipe_file(jobgen: Callable, write_recipe: Callable) -> None:
    path = write_recipe("neox20b", {"name": "my-neox", "nodes": 2})
    result = jobgen("render", str(path))
    assert result.exit_code == 0, result.stderr
    assert "#SBATCH --job-name=my-neox\n" in result.stdout
    assert "#SBATCH --nodes=2\n" in result.stdout
    assert f'Rendered by jobgen from "{path}"' in result.stdout


def test_render_output_dir(jobgen: Callable, tmp_path: Path) -> None:
    result = jobgen("render", "llama2-7b", "-n", "4", "--run-name", "try1",
                    "--output-dir", str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    written = tmp_path / "out" / "try1.sbatch"
    assert result.stdout == f"{written}\n"
    assert written.read_text().startswith("#!/bin/bash\n#SBATCH --job-name=llama2-7b\n")


def test_check_command(jobgen: Callable) -> None:
    result = jobgen("check", "--recipe", "pythia6.9b", "--no-shellcheck")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "6 ok, 2 skipped, 0 failed"
    assert "pythia6.9b     64  skipped  recipes/pythia6.9b.yaml: parallelism.global_batch_size" \
        in result.stdout


def test_check_failure_exits_1(jobgen: Callable) -> None:
    result = jobgen("check", "--recipe", "nope", "--no-shellcheck")
    assert result.exit_code == 1
    assert "0 ok, 0 skipped, 8 failed" in result.stdout
    assert "unknown recipe 'nope'" in result.stdout
