#!/usr/bin/env python3
"""Render timings: prints medians and ratios, asserts nothing (timings belong here, not in tests).

    python benchmarks/render_bench.py [--runs 21] [--torchx PATH | --no-torchx]

1. `jobgen render neox20b --nodes 4` as a fresh process (what a user waits for), against
   `python -c pass` (the interpreter's own start-up) and against torchx's Slurm dry run of a
   4-node DDP job (`torchx run --dryrun -s slurm dist.ddp -j 4x32`), side by side in one run.
2. `jobgen render --backend batch` against torchx's AWS Batch dry run (`-s aws_batch`).
3. `jobgen check` on the local site as a fresh process (shellcheck included), and the whole
   check matrix rendered in-process (no shellcheck).
4. Which heavy modules the render path imports (boto3, botocore, submitit must not appear).

Every command runs in a fresh process with an empty home folder of its own (so nothing a former
run left under ~/.cache or ~/.config is read back), for jobgen and torchx alike, and the
commands take turns round by round, so that the machine's load falls on each alike.

torchx's Slurm dry run asks the controller (sinfo): run this where one answers (a login node,
or here with `bash tests/ci/slurm-up.sh`), else it waits for Slurm's timeout.
torchx is not a dependency of jobgen: unless --torchx names its command, the benchmark installs
torchx 0.7.0 into its own virtualenv (.venv-torchx, beside the project's) the first time.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Commands run as a user's would: Python keeps its compiled modules (.pyc), for jobgen and
# torchx alike (an environment that sets PYTHONDONTWRITEBYTECODE recompiles them every time).
ENV = {k: v for k, v in os.environ.items()
       if k not in ("PYTHONDONTWRITEBYTECODE", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")}


def once(argv: list[str]) -> float:
    """Wall time of one run of a command in milliseconds, with a new empty home folder."""
    with tempfile.TemporaryDirectory(prefix="render-bench-") as home:
        env = {**ENV, "HOME": home}
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                       cwd=home, check=True)
        return (time.perf_counter() - start) * 1000


def walls(commands: dict[str, list[str]], runs: int) -> dict[str, float]:
    """Median wall time of each command in milliseconds, the commands taking turns in every
    round (so that a change in the machine's load falls on all of them alike); one untimed
    round first. A command that fails is left out."""
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for round_ in range(runs + 1):
        for name, argv in commands.items():
            if name not in samples:
                continue
            try:
                took = once(argv)
            except subprocess.CalledProcessError:
                del samples[name]
                continue
            if round_:
                samples[name].append(took)
    return {name: statistics.median(taken) for name, taken in samples.items()}


TORCHX = "torchx==0.7.0"


def torchx_command(given: str | None) -> str | None:
    """torchx's command: the one given, or one in .venv-torchx (made here the first time)."""
    if given:
        return given
    venv = Path(__file__).resolve().parent.parent / ".venv-torchx"
    exe = venv / "bin" / "torchx"
    if not exe.exists():
        print(f"installing {TORCHX} into {venv.name} (once) ...", file=sys.stderr)
        try:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", TORCHX], check=True)
        except subprocess.CalledProcessError as exc:
            print(f"torchx not installed ({exc}); no ratios", file=sys.stderr)
            return None
    return str(exe)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--torchx", help="torchx command to compare with")
    parser.add_argument("--no-torchx", action="store_true")
    args = parser.parse_args()
    torchx = None if args.no_torchx else torchx_command(args.torchx)
    py = sys.executable
    jobgen = [py, "-m", "jobgen.cli"]
    script = Path(py).with_name("jobgen")
    if script.exists():
        jobgen = [str(script)]

    commands = {
        "baseline": [py, "-c", "pass"],
        "render": [*jobgen, "render", "neox20b", "--nodes", "4"],
        "render_batch": [*jobgen, "render", "neox20b", "--nodes", "4", "--backend", "batch",
                         "--site", "local"],
    }
    if torchx:
        # The same job shape: 4 nodes, one process per accelerator (32 on trn1.32xlarge);
        # no workspace, so that torchx's AWS Batch dry run does not look for Docker.
        ddp = ["dist.ddp", "-j", "4x32", "--script", "train.py"]
        commands["tx_slurm"] = [torchx, "run", "--workspace", "", "--dryrun", "-s", "slurm",
                                *ddp]
        commands["tx_batch"] = [torchx, "run", "--workspace", "", "--dryrun", "-s",
                                "aws_batch", "-cfg", "queue=q", *ddp]
    took = walls(commands, args.runs)
    baseline, render = took["baseline"], took["render"]
    render_batch, tx_slurm, tx_batch = (took.get(k) for k in ("render_batch", "tx_slurm",
                                                              "tx_batch"))
    check_cmd = walls({"check": [*jobgen, "check", "--site", "local"]},
                      max(3, args.runs // 4))["check"]

    # In-process too, nothing is read from a former run: an empty home folder for this one.
    os.environ["HOME"] = tempfile.mkdtemp(prefix="render-bench-")
    os.environ.pop("XDG_CACHE_HOME", None)
    from jobgen import check
    samples = []
    for _ in range(max(3, args.runs // 4)):
        start = time.perf_counter()
        report = check.run(shellcheck=False)
        samples.append((time.perf_counter() - start) * 1000)
    matrix = statistics.median(samples)
    rendered = sum(r.script is not None for r in report.rows)

    probe = subprocess.run(
        [py, "-c", "import sys; from jobgen import cli; sys.argv=['jobgen','render','neox20b'];"
         "import io, contextlib\nwith contextlib.redirect_stdout(io.StringIO()):\n"
         "    cli.main(['render','neox20b'])\n"
         "print(' '.join(m for m in ('boto3','botocore','submitit','torch','deepspeed') "
         "if m in sys.modules))"],
        capture_output=True, text=True, check=False)

    print(f"python -c pass                          median {baseline:7.1f} ms")
    print(f"jobgen render neox20b --nodes 4         median {render:7.1f} ms  "
          f"({render / baseline:.1f}x python start-up)")
    if render_batch is not None:
        print(f"jobgen render neox20b --backend batch   median {render_batch:7.1f} ms  "
              f"({render_batch / baseline:.1f}x python start-up)")
    if tx_slurm is not None and tx_batch is not None:
        print(f"torchx run --dryrun -s slurm dist.ddp   median {tx_slurm:7.1f} ms")
        print(f"torchx run --dryrun -s aws_batch        median {tx_batch:7.1f} ms")
        print(f"ratio jobgen render / torchx slurm dry run:        {render / tx_slurm:.2f}")
        if render_batch is not None:
            print(f"ratio jobgen render --backend batch / torchx aws_batch: "
                  f"{render_batch / tx_batch:.2f}")
    print(f"jobgen check --site local (shellcheck)  median {check_cmd:7.1f} ms")
    print(f"check matrix in-process ({rendered} scripts)   median {matrix:7.1f} ms  "
          f"({matrix / max(rendered, 1):.2f} ms per script)")
    heavy = probe.stdout.strip() or "none"
    print(f"heavy modules imported by render: {heavy}")


if __name__ == "__main__":
    main()
