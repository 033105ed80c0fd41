"""The launcher's torchrun command line, parsed by torchrun's real parsers: the installed torch's
and those of the releases the trainers run on (1.13.1: neuronx-nemo-megatron's pin; 2.1.2: the
Neuron SDK 2.20 image), whose get_args_parser() is taken from their PyPI wheels, which
tests/ci/run.sh downloads into $VENV/upstream (or TORCH_WHEEL_1_13_1 / TORCH_WHEEL_2_1_2 name).
The option tables recorded in jobgen/payloads/upstream/torchrun.json are checked against the
wheels and used as parsers too, so the rule holds even where the wheels are absent."""
from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
FACTS = json.loads((ROOT / "jobgen" / "payloads" / "upstream" / "torchrun.json").read_text())
LAUNCHER = ROOT / "payload" / "smoke" / "launch.sh"

STUB = """#!/usr/bin/env bash
printf '%s\\0' "$@" > "$STUB_ARGV"
"""


def launcher_argv(tmp_path: Path, pass_: str = "train", **env: str) -> list[str]:
    """What payload/common/node_launch.sh hands torchrun (a stand-in first on PATH records
    it), for node 1 of 2."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "torchrun"
    stub.write_text(STUB)
    stub.chmod(0o755)
    wrapper = bin_dir / "neuron_parallel_compile"
    wrapper.write_text('#!/usr/bin/env bash\nexec "$@"\n')
    wrapper.chmod(0o755)
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    (workdir / "train.py").write_text("")
    argv_file = tmp_path / "argv"
    full_env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path),
                "SLURM_NODEID": "1", "SLURM_NNODES": "2", "MASTER_ADDR": "10.0.0.1",
                "MASTER_PORT": "41000", "JOBGEN_WORKERS_PER_NODE": "32",
                "JOBGEN_LOG_DIR": str(tmp_path / "logs"), "JOBGEN_WORKDIR": str(workdir),
                "JOBGEN_PROGRAM": "train.py", "STUB_ARGV": str(argv_file), **env}
    proc = subprocess.run(["bash", str(LAUNCHER), pass_, "--lr", "0.1"], env=full_env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    argv = argv_file.read_bytes().decode().split("\0")[:-1]
    if argv and argv[0] == "torchrun":   # through the compile wrapper
        argv = argv[1:]
    return argv


def parser_from_wheel(wheel: str, version: str) -> argparse.ArgumentParser:
    """The get_args_parser() of the torch in ``wheel``, run without importing torch: its source
    and that of torch/distributed/argparse_util.py (which needs only os and argparse)."""
    with zipfile.ZipFile(wheel) as z:
        run_src = z.read("torch/distributed/run.py").decode()
        util_src = z.read("torch/distributed/argparse_util.py").decode()
        version_src = z.read("torch/version.py").decode()
    assert f"__version__ = '{version}'" in version_src, f"{wheel} is not torch {version}"
    namespace: dict[str, Any] = {}
    exec(compile(util_src, "argparse_util.py", "exec"), namespace)
    namespace.update(ArgumentParser=argparse.ArgumentParser, REMAINDER=argparse.REMAINDER)
    function = next(n for n in ast.parse(run_src).body
                    if isinstance(n, ast.FunctionDef) and n.name == "get_args_parser")
    exec(compile(ast.Module(body=[function], type_ignores=[]), "run.py", "exec"), namespace)
    parser: argparse.ArgumentParser = namespace["get_args_parser"]()
    return parser


def option_table(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    """A parser's options as torchrun.json records them."""
    return {a.dest: {"spellings": list(a.option_strings), "takes_value": a.nargs != 0}
            for a in parser._actions if a.option_strings and a.dest != "help"}


def parser_from_facts(version: str) -> argparse.ArgumentParser:
    """A parser that takes exactly the options recorded for ``version`` and refuses others."""
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for dest, option in FACTS["torch"][version]["options"].items():
        if option["takes_value"]:
            parser.add_argument(*option["spellings"], dest=dest)
        else:
            parser.add_argument(*option["spellings"], dest=dest, action="store_true")
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def torch_wheel(version: str) -> str | None:
    """The torch wheel of ``version`` that tests/ci/run.sh downloads (never installs) into
    $VENV/upstream, or the one TORCH_WHEEL_<1_13_1> names."""
    given = os.environ.get("TORCH_WHEEL_" + version.replace(".", "_"))
    if given:
        return given
    # sys.prefix is the virtual environment's folder (its python is a link to another one).
    venv = os.environ.get("VIRTUAL_ENV") or sys.prefix
    found = sorted(glob.glob(os.path.join(venv, "upstream", f"torch-{version}-*.whl")))
    return found[0] if found else None


def strict(parse: Callable[[list[str]], Any]) -> Callable[[list[str]], Any]:
    def run(argv: list[str]) -> Any:
        try:
            return parse(argv)
        except SystemExit as exc:
            pytest.fail(f"torchrun refuses {argv} (exit {exc.code})")
    return run


VARIANTS = [("train", {}), ("train", {"JOBGEN_RDZV_TIMEOUT": "900"}),
            ("compile", {"JOBGEN_COMPILE_WRAPPER": "neuron_parallel_compile",
                         "JOBGEN_RDZV_TIMEOUT": "900"})]


IDS = ["train", "train+timeout", "compile"]
RELEASES = sorted(FACTS["torch"])          # the torch releases whose parsers are recorded


def check_parsed(args: Any, pass_: str, env: dict[str, str]) -> None:
    assert (str(args.nproc_per_node), str(args.nnodes), int(args.node_rank)) == ("32", "2", 1)
    assert (args.master_addr, int(args.master_port)) == ("10.0.0.1", 41000)
    assert args.rdzv_id == f"jobgen-{pass_}"
    assert (args.rdzv_conf or "") == ("timeout=900" if "JOBGEN_RDZV_TIMEOUT" in env else "")
    assert args.training_script.endswith("train.py")
    assert args.training_script_args == ["--lr", "0.1"]


@pytest.mark.parametrize("pass_,env", VARIANTS, ids=IDS)
def test_current_torch_parses_the_launch(tmp_path: Path, require: Any, pass_: str,
                                         env: dict[str, str]) -> None:
    require.modules("torch")
    from torch.distributed.run import get_args_parser
    check_parsed(strict(get_args_parser().parse_args)(launcher_argv(tmp_path, pass_, **env)),
                 pass_, env)


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("pass_,env", VARIANTS, ids=IDS)
def test_released_torch_parses_the_launch(tmp_path: Path, require: Any, version: str,
                                          pass_: str, env: dict[str, str]) -> None:
    """torchrun's own parser of each recorded release, taken from its wheel."""
    wheel = torch_wheel(version)
    require(wheel, f"the torch {version} wheel (tests/ci/run.sh downloads it into "
                   "$VENV/upstream)")
    assert wheel is not None
    parser = parser_from_wheel(wheel, version)
    check_parsed(strict(parser.parse_args)(launcher_argv(tmp_path, pass_, **env)), pass_, env)


@pytest.mark.parametrize("version", RELEASES)
def test_recorded_options_are_the_wheels(require: Any, version: str) -> None:
    """torchrun.json says what the wheel's parser takes, no more and no less."""
    wheel = torch_wheel(version)
    require(wheel, f"the torch {version} wheel (tests/ci/run.sh downloads it into "
                   "$VENV/upstream)")
    assert wheel is not None
    assert option_table(parser_from_wheel(wheel, version)) == FACTS["torch"][version]["options"]


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("pass_,env", VARIANTS, ids=IDS)
def test_recorded_options_parse_the_launch(tmp_path: Path, version: str, pass_: str,
                                           env: dict[str, str]) -> None:
    """The same check from the recorded option tables, so that it holds without the wheels."""
    argv = launcher_argv(tmp_path, pass_, **env)
    check_parsed(parser_from_facts(version).parse_args(argv), pass_, env)
    script = next(i for i, a in enumerate(argv) if a.endswith("train.py"))
    assert {a for a in argv[:script] if a.startswith("-")} <= set(FACTS["launcher_uses"])


def test_torch_1_13_refuses_the_hyphenated_spellings(require: Any) -> None:
    """What the launcher passed before (finding 2 of issue 7) fails on torch 1.13.1: the rule
    above has teeth, in the recorded table and in the real parser."""
    bad = ["--rdzv-id", "x", "--nproc-per-node", "2", "train.py"]
    assert not FACTS["torch"]["1.13.1"]["hyphenated_aliases"]
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parser_from_facts("1.13.1").parse_args(bad)
    wheel = torch_wheel("1.13.1")
    require(wheel, "the torch 1.13.1 wheel (tests/ci/run.sh downloads it into $VENV/upstream)")
    assert wheel is not None
    with pytest.raises(SystemExit):
        parser_from_wheel(wheel, "1.13.1").parse_args(bad)
