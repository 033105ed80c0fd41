"""What a newcomer's first `jobgen run` prints: only the options `run` takes, no warning that
does not matter, a line before a long silent build, and a closing line that says where the run
is and what to run next (issue 41)."""
from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path
from typing import Any, Callable

import pytest

from jobgen.backends.slurm.options import OPTIONS

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = ROOT / "payload"
SLURM_FLAGS = [f"--{o.flag}" for o in OPTIONS] + ["--sbatch-opt"]


def test_run_help_lists_no_slurm_option_and_run_still_refuses_one(jobgen: Callable) -> None:
    shown = jobgen("run", "--help").stdout
    assert "--smoke" in shown and "--dry-run" in shown
    assert [flag for flag in SLURM_FLAGS if flag in shown] == [] and "Slurm" not in shown
    # render and submit still take them
    assert all(flag in jobgen("render", "--help").stdout for flag in SLURM_FLAGS)
    result = jobgen("run", "llama2-7b", "--smoke", "--partition", "big")
    assert result.exit_code == 2 and "--partition is a Slurm setting" in result.stderr


def test_the_closing_line_names_the_folder_and_the_next_commands() -> None:
    from jobgen.cli.submit_cmds import closing_line
    line = closing_line("jobgen-runs/bert1.5b-2n-smoke", 0,
                        ["jobgen", "run", "bert1.5b", "--nodes", "2", "--smoke"])
    assert line == (
        "jobgen: run ended with status 0; its folder: jobgen-runs/bert1.5b-2n-smoke; next: "
        "jobgen report --run-dir jobgen-runs/bert1.5b-2n-smoke, jobgen watch --run-dir "
        "jobgen-runs/bert1.5b-2n-smoke; resume (or rerun) with: jobgen run bert1.5b --nodes 2 "
        "--smoke")
    # Every word pastes into a shell as it stands: spaces quoted, control characters escaped.
    line = closing_line("runs/a b\x1b", 130, ["jobgen", "run", "x", "--set", "env.A=1 2"])
    assert "its folder: $'runs/a b\\x1b';" in line and "--set 'env.A=1 2'" in line
    assert "\x1b" not in line and "\n" not in line


def _node_setup(workers: int, hard: int) -> subprocess.CompletedProcess[str]:
    script = (f'ulimit -Sn 1024 && ulimit -Hn {hard} && source "$1" && node_rank=0 '
              f'MASTER_PORT=29999 JOBGEN_WORKERS_PER_NODE={workers} && node_setup && ulimit -n')
    return subprocess.run(["bash", "-c", script, "bash", str(PAYLOAD / "common/node_launch.sh")],
                          capture_output=True, text=True, timeout=30, check=False)


def test_the_open_file_limit_is_raised_to_the_hard_one_and_said_only_when_short() -> None:
    """A CPU rehearsal's 2 workers under a hard limit of 4,096: raised, nothing said (it printed
    "could not raise the open-file limit" 4 times per run). 32 workers there: one line."""
    few = _node_setup(2, 4096)
    assert (few.returncode, few.stdout.strip()) == (0, "4096"), few.stderr
    assert "open-file" not in few.stderr
    many = _node_setup(32, 4096)
    assert many.returncode == 0, many.stderr
    said = [line for line in many.stderr.splitlines() if "open-file limit" in line]
    assert said == ["jobgen[node 0]: open-file limit 4096 (the hard limit) is short of about "
                    "32768 for 32 workers: raise it (limits.conf, the container's ulimits) if "
                    "the pass fails with 'Too many open files'"]


def test_an_unreserved_port_is_said_once_per_allocation(tmp_path: Path) -> None:
    """Without the privilege to reserve the rendezvous port (no sudo, no sysctl: a user on a
    laptop), node 0 says so in its first pass only; it was 4 lines per rehearsal."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("sudo", "sysctl"):
        (stubs / name).write_text("#!/bin/sh\nexit 1\n")
        (stubs / name).chmod(0o755)
    logs = tmp_path / "node"
    logs.mkdir()

    def said(rank: int, pass_: str) -> list[str]:
        script = (f'source "$1" && node_rank={rank} pass={pass_} log_dir="$2" '
                  'MASTER_PORT=29999 JOBGEN_WORKERS_PER_NODE=1 && node_setup')
        proc = subprocess.run(["bash", "-c", script, "bash",
                               str(PAYLOAD / "common/node_launch.sh"), str(logs)],
                              capture_output=True, text=True, timeout=30, check=False,
                              env={"PATH": f"{stubs}:/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stderr
        return [line for line in proc.stderr.splitlines() if "reserve port" in line]

    assert said(1, "compile") == [] and said(1, "train") == []
    assert said(0, "compile") == [
        "jobgen[node 0]: could not reserve port 29999 (no privilege); continuing"]
    assert len(said(0, "train")) == 1          # no compile pass ran in this allocation
    (logs / "compile.log").write_text("")
    assert said(0, "train") == []              # the compile pass said it


@pytest.fixture
def accelerators(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """payload/habana_deepspeed/accelerators.py, with a stand-in for DeepSpeed's record of the
    ops its wheel was built with and an empty torch extension cache."""
    for entry in (str(PAYLOAD), str(PAYLOAD / "habana_deepspeed")):
        monkeypatch.syspath_prepend(entry)
    info = types.ModuleType("deepspeed.git_version_info")
    info.installed_ops = {"deepspeed_shm_comm": False}   # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "deepspeed", types.ModuleType("deepspeed"))
    monkeypatch.setitem(sys.modules, "deepspeed.git_version_info", info)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    import accelerators as module
    module.installed = info.installed_ops   # the test's handle on the stand-in
    return module


def test_a_first_build_of_deepspeeds_cpu_op_is_announced_once(
        accelerators: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch
    cpu = accelerators.Accelerator("cpu", torch.device("cpu"), "gloo")

    def start(rank: int) -> list[str]:
        with accelerators.communication_start(cpu, rank):     # DeepSpeed's init, standing in
            print("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully")
            print("something else DeepSpeed says")
        return capsys.readouterr().out.splitlines()

    assert start(1) == ["something else DeepSpeed says"]      # rank 1 waits on rank 0's build
    said = start(0)
    assert said[0] == ("building DeepSpeed's CPU communication op (first run only, about 2 "
                       "minutes on one core)...")
    assert said[1] == "something else DeepSpeed says"
    assert said[2].startswith("built DeepSpeed's CPU communication op in ") and len(said) == 3
    built = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "deepspeed_shm_comm.so"
    built.parent.mkdir(parents=True)
    built.write_bytes(b"")
    assert start(0) == ["something else DeepSpeed says"]      # cached: nothing to say
    built.unlink()
    accelerators.installed["deepspeed_shm_comm"] = True
    assert start(0) == ["something else DeepSpeed says"]      # in the wheel: nothing to say
