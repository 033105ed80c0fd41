#!/usr/bin/env python3
"""Render timings: prints medians and ratios, asserts nothing (timings belong here, not in tests).

    python benchmarks/render_bench.py [--runs 21]

1. `jobgen render neox20b --nodes 4` as a fresh process (what a user waits for), against
   `python -c pass` (the interpreter's own start-up) on the same machine.
2. Rendering the whole `jobgen check` matrix in-process (no shellcheck).
3. Which heavy modules the render path imports (boto3, botocore, submitit must not appear).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path


def wall(argv: list[str], runs: int) -> float:
    """Median wall time of a command, in milliseconds."""
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    py = sys.executable
    jobgen = [py, "-m", "jobgen.cli"]
    script = Path(py).with_name("jobgen")
    if script.exists():
        jobgen = [str(script)]

    baseline = wall([py, "-c", "pass"], args.runs)
    render = wall([*jobgen, "render", "neox20b", "--nodes", "4"], args.runs)
    render_batch = None
    try:
        render_batch = wall([*jobgen, "render", "neox20b", "--nodes", "4", "--backend", "batch",
                             "--site", "local"], args.runs)
    except subprocess.CalledProcessError:
        pass

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
          f"({render / baseline:.1f}x python start-up; target <= 120 ms)")
    if render_batch is not None:
        print(f"jobgen render neox20b --backend batch   median {render_batch:7.1f} ms  "
              f"({render_batch / baseline:.1f}x python start-up)")
    print(f"check matrix in-process ({rendered} scripts)   median {matrix:7.1f} ms  "
          f"({matrix / max(rendered, 1):.2f} ms per script)")
    heavy = probe.stdout.strip() or "none"
    print(f"heavy modules imported by render: {heavy}")


if __name__ == "__main__":
    main()
