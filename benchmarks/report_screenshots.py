"""Screenshots of `jobgen report --html` in headless Chromium at two window widths, and the
`--plot` PNG, for a person to look at (issue 41: the picture must read at a glance).

    python benchmarks/report_screenshots.py OUT_FOLDER [--chromium PATH]

The run is tests/test_report.py's three-allocation run (a node left out by the health gate,
a failure on node 1, a resume), with the nodes' gates at different times so that each node's
row shows its own phases, under a run name holding a `$`. Writes OUT_FOLDER/report.html,
report.png, wide.png (1280 px) and narrow.png (720 px). Needs chromium (Debian: apt-get install
chromium) and matplotlib (the plot extra)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def demo_run(folder: Path) -> Path:
    from tests.test_report import make_run
    run = make_run(folder)
    # Node 1's gate of allocation 1 takes 4 s longer than node 0's: its row must show it.
    health = run / "logs" / "7" / "restart-1" / "node-1" / "health.json"
    when = health.stat().st_mtime + 4
    health.write_text(json.dumps({"seconds": 6.0, "ok": True}))
    os.utime(health, (when, when))
    return run


def shoot(chromium: str, page: Path, out: Path, width: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", f"--user-data-dir={profile}",
                        f"--window-size={width},2200", f"--screenshot={out}",
                        page.as_uri()], check=True, capture_output=True, timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from jobgen.cli import main as jobgen
    with tempfile.TemporaryDirectory() as tmp:
        run = demo_run(Path(tmp))
        status = jobgen(["report", "cost $HOME $x$", "--run-dir", str(run), "--no-sacct",
                         "--html", str(args.out / "report.html"),
                         "--plot", str(args.out / "report.png")])
    if status != 0:
        return status
    for name, width in (("wide", 1280), ("narrow", 720)):
        shoot(args.chromium, args.out / "report.html", args.out / f"{name}.png", width)
        print(args.out / f"{name}.png")
    print(args.out / "report.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
