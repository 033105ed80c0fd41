"""The launcher's torchrun command line, parsed by torchrun's real parsers: the installed torch's
(2.x) and torch 1.13.1's (neuronx-nemo-megatron's pin), whose get_args_parser() is taken from
the 1.13.1 wheel on PyPI that tests/ci/run.sh downloads (TORCH113_WHEEL, or
$VENV/upstream/torch-1.13.1-*.whl). The recorded option table of jobgen/payloads/upstream/
torchrun.json is checked as well, so the rule holds even where the wheel is absent."""
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


def parser_from_wheel(wheel: str) -> argparse.ArgumentParser:
    """torch 1.13.1's own get_args_parser(), run without importing torch: its source and that
    of torch/distributed/argparse_util.py (which needs only os and argparse) from the wheel."""
    with zipfile.ZipFile(wheel) as z:
        run_src = z.read("torch/distributed/run.py").decode()
        util_src = z.read("torch/distributed/argparse_util.py").decode()
        version = z.read("torch/version.py").decode()
    assert "__version__ = '1.13.1'" in version
    namespace: dict[str, Any] = {}
    exec(compile(util_src, "argparse_util.py", "exec"), namespace)
    namespace.update(ArgumentParser=argparse.ArgumentParser, REMAINDER=argparse.REMAINDER)
    function = next(n for n in ast.parse(run_src).body
                    if isinstance(n, ast.FunctionDef) and n.name == "get_args_parser")
    exec(compile(ast.Module(body=[function], type_ignores=[]), "run.py", "exec"), namespace)
    parser: argparse.ArgumentParser = namespace["get_args_parser"]()
    return parser


def parser_from_facts() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for dest, option in FACTS["torch_1_13_1"]["options"].items():
        if option["takes_value"]:
            parser.add_argument(*option["spellings"], dest=dest)
        else:
            parser.add_argument(*option["spellings"], dest=dest, action="store_true")
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def wheel_113() -> str | None:
    given = os.environ.get("TORCH113_WHEEL")
    if given:
        return given
    venv = os.environ.get("VIRTUAL_ENV") or str(Path(sys.executable).resolve().parent.parent)
    found = sorted(glob.glob(os.path.join(venv, "upstream", "torch-1.13.1-*.whl")))
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


@pytest.mark.parametrize("pass_,env", VARIANTS, ids=["train", "train+timeout", "compile"])
def test_current_torch_parses_the_launch(tmp_path: Path, pass_: str,
                                         env: dict[str, str]) -> None:
    pytest.importorskip("torch")
    from torch.distributed.run import get_args_parser
    args = strict(get_args_parser().parse_args)(launcher_argv(tmp_path, pass_, **env))
    assert (args.nproc_per_node, args.nnodes, args.node_rank) == ("32", "2", 1)
    assert (args.master_addr, args.master_port) == ("10.0.0.1", 41000)
    assert args.rdzv_id == f"jobgen-{pass_}"
    assert args.rdzv_conf == ("timeout=900" if "JOBGEN_RDZV_TIMEOUT" in env else "")
    assert args.training_script.endswith("train.py")
    assert args.training_script_args == ["--lr", "0.1"]


@pytest.mark.parametrize("pass_,env", VARIANTS, ids=["train", "train+timeout", "compile"])
def test_torch_1_13_parses_the_launch(tmp_path: Path, require: Any, pass_: str,
                                      env: dict[str, str]) -> None:
    wheel = wheel_113()
    require(wheel, "the torch 1.13.1 wheel (tests/ci/run.sh downloads it into $VENV/upstream)")
    assert wheel is not None
    argv = launcher_argv(tmp_path, pass_, **env)
    args = strict(parser_from_wheel(wheel).parse_args)(argv)
    assert (args.nproc_per_node, args.node_rank, args.rdzv_id) == ("32", 1, f"jobgen-{pass_}")
    # The hyphenated spellings the launcher used before are refused by the real 1.13.1 parser.
    with pytest.raises(SystemExit):
        parser_from_wheel(wheel).parse_args(["--rdzv-id", "x", "train.py"])


@pytest.mark.parametrize("pass_,env", VARIANTS, ids=["train", "train+timeout", "compile"])
def test_recorded_1_13_options_parse_the_launch(tmp_path: Path, pass_: str,
                                                env: dict[str, str]) -> None:
    argv = launcher_argv(tmp_path, pass_, **env)
    parsed = parser_from_facts().parse_args(argv)
    assert parsed.rdzv_id == f"jobgen-{pass_}"
    used = sorted({a for a in argv if a.startswith("--")} - {"--lr"})
    assert set(used) <= set(FACTS["launcher_uses"])
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parser_from_facts().parse_args(["--rdzv-id", "x", "train.py"])
