"""Issue 41's families for `report`, its picture, `image-context` and the EKS site settings:
outputs through the one writer (a planted `.NAME.tmp` symlink, a FIFO or device given as the
output, a path under a file, a 300-character name), run files through the one reader (a FIFO,
a device, a sparse file), numbers that are not numbers (node-², a 5,000-digit job.status, a
health.json time of nan or 1e308, an event value of 1e308), a `$` in a run name, printed
commands that paste into a shell as they stand, and EKS mount paths and images.

Device nodes are made with os.mknod in the test's own temporary folder (the numbers of
/dev/zero and /dev/full): never a real /dev path. Where mknod is not permitted those cases
skip."""
from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from test_report import make_run

from jobgen.cli import main
from jobgen.plumbing.errors import ConfigError
from jobgen.runs import runrecord

JOBGEN = Path(sys.executable).with_name("jobgen")


def _one_line_error(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def _device(path: Path, major: int, minor: int) -> Path:
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"mknod not permitted here: {exc}")
    return path


# --- outputs through the one writer ----------------------------------------------------------

def test_a_planted_tmp_symlink_is_not_followed(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "shared" / "r.html"
    out.parent.mkdir()
    (out.parent / f".{out.name}.tmp").symlink_to(victim)
    assert main(["report", "--run-dir", str(run), "--no-sacct", "--html", str(out)]) == 0
    assert victim.read_text() == "keep me\n"
    assert out.is_file() and not out.is_symlink() and out.stat().st_size > 0


@pytest.mark.parametrize("option", ["--html", "--plot"])
@pytest.mark.parametrize("what", ["fifo", "symlink", "full"])
def test_an_output_that_is_not_a_regular_file_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, what: str) -> None:
    if option == "--plot":
        pytest.importorskip("matplotlib")
    run = make_run(tmp_path)
    out = tmp_path / "out"
    if what == "fifo":
        os.mkfifo(out)
    elif what == "symlink":
        (tmp_path / "elsewhere").write_text("keep me\n")
        out.symlink_to(tmp_path / "elsewhere")
    else:   # a /dev/full look-alike: writes to it fail; it must not "succeed"
        _device(out, 1, 7)
    capsys.readouterr()
    assert main(["report", "--run-dir", str(run), "--no-sacct", option, str(out)]) == 2
    _one_line_error(capsys, option, str(out))
    mode = os.lstat(out).st_mode
    assert {"fifo": stat.S_ISFIFO, "symlink": stat.S_ISLNK, "full": stat.S_ISCHR}[what](mode)
    if what == "symlink":
        assert (tmp_path / "elsewhere").read_text() == "keep me\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("option", ["--html", "--plot"])
@pytest.mark.parametrize("where", ["under-a-file", "long-name", "no-folder"])
def test_an_output_path_that_cannot_be_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, where: str) -> None:
    if option == "--plot":
        pytest.importorskip("matplotlib")
    run = make_run(tmp_path)
    (tmp_path / "file").write_text("x")
    out = {"under-a-file": tmp_path / "file" / "r.png", "long-name": tmp_path / ("a" * 300),
           "no-folder": tmp_path / "nowhere" / "r.png"}[where]
    capsys.readouterr()
    assert main(["report", "--run-dir", str(run), "--no-sacct", option, str(out)]) == 2
    _one_line_error(capsys, option, "cannot write")


def test_a_dollar_in_the_run_name_is_text_in_the_png(tmp_path: Path) -> None:
    """Once for the PNG (seconds to draw): a run name mathtext would fail on, and a planted
    `.NAME.tmp` symlink beside the output."""
    pytest.importorskip("matplotlib")
    run = make_run(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "r.png"
    (tmp_path / f".{out.name}.tmp").symlink_to(victim)
    name = "cost $x$ a$\\frac{1}{0}$ $ $$"   # mathtext would fail on each of these
    assert main(["report", name, "--run-dir", str(run), "--no-sacct", "--plot", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG" and victim.read_text() == "keep me\n"


# --- run files through the one reader --------------------------------------------------------

# One run, the file of each kind in another allocation or node: all must be passed over.
RUN_FILES = ["restart-1/node-0/train.log", "restart-1/node-1/job.status",
             "restart-2/node-0/host", "restart-2/node-1/health.json",
             "restart-1/node-0/compile.log", "../../jobgen-health.jsonl"]


def _report(run: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(JOBGEN), "report", "--run-dir", str(run), "--no-sacct"],
                          capture_output=True, text=True, timeout=120)


def test_a_fifo_where_a_run_file_should_be_does_not_hang(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    for name in RUN_FILES:
        path = run / "logs" / "7" / name
        path.unlink(missing_ok=True)
        os.mkfifo(path)
    proc = _report(run)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "effective utilisation" in proc.stdout


def test_a_device_or_sparse_file_is_not_read_whole(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    sparse = run / "logs" / "7" / "restart-0" / "node-0" / "host"
    sparse.unlink()
    with open(sparse, "wb") as f:   # 8 GiB of holes: read whole, it would fill the memory
        f.truncate(8 << 30)
    for name in RUN_FILES[:4]:
        path = run / "logs" / "7" / name
        path.unlink(missing_ok=True)
        _device(path, 1, 5)    # /dev/zero's numbers: endless zeros
    proc = _report(run)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_numbers_that_are_not_numbers_are_skipped(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    job = run / "logs" / "7"
    (job / "restart-2" / "node-²").mkdir()
    (job / "restart-²").mkdir()
    (job / "restart-2" / "node-0" / "job.status").write_text("9" * 5000 + " train\n")
    (job / "restart-2" / "node-1" / "job.status").write_text("٣ train\n")
    (job / "restart-2" / "node-0" / "train.restarts").write_text("²\n")
    (job / "restart-1" / "node-0" / "train.restarts").write_text("9" * 60 + "\n")
    (job / "restart-1" / "node-0" / "health.json").write_text('{"seconds": 1e308}')
    (job / "restart-1" / "node-1" / "health.json").write_text('{"seconds": "nan"}')
    log = job / "restart-2" / "node-0" / "train.log"
    lines = log.read_text().splitlines()
    deep: list[object] = []
    for _ in range(400):
        deep = [deep]
    for i, line in enumerate(lines):
        if '"step"' in line and '"loss"' in line:
            event = json.loads(line)
            event.update(loss=1e308, grad_norm=1e308, checkpoint=deep)
            lines[i] = json.dumps(event)
    log.write_text("\n".join(lines) + "\n")
    for extra in ([], ["--json"]):
        proc = subprocess.run([str(JOBGEN), "report", "--run-dir", str(run), "--no-sacct",
                               *extra], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    from jobgen.reporting import report
    from jobgen.runs.restart_counts import counts
    assert counts(run)["by_allocation"] == {"7/restart-1": int("9" * 60)}   # not ², not -²
    made = report.make(None, run, use_sacct=False)
    assert [n.node for n in made.timeline.allocations[2].nodes] == [0, 1]
    assert made.timeline.allocations[2].nodes[0].status is None
    one = made.timeline.allocations[1]
    assert all(n.gate is None or n.gate[0] <= n.gate[1] for n in one.nodes)
    assert one.start > 1e9   # not 1e308 seconds before the gate ended


def test_each_node_row_has_its_own_gate(tmp_path: Path) -> None:
    from jobgen.reporting import layout, report
    run = make_run(tmp_path)
    health = run / "logs" / "7" / "restart-1" / "node-1" / "health.json"
    when = health.stat().st_mtime + 4
    health.write_text(json.dumps({"seconds": 6.0, "ok": True}))
    os.utime(health, (when, when))
    made = report.make(None, run, use_sacct=False)
    rows = {(r.allocation, r.node): r for r in layout.rows(made)}

    def gate_s(row: layout.Row) -> float:
        return sum(s.end - s.start for s in row.segments if s.kind == "gate")
    assert gate_s(rows[(1, 0)]) == pytest.approx(2.0)
    assert gate_s(rows[(1, 1)]) == pytest.approx(6.0)


# --- what the picture shows ------------------------------------------------------------------

@pytest.mark.parametrize("span, labels", [
    (48.0, ["0 s", "10 s", "20 s", "30 s", "40 s"]),
    (213.0, ["0 s", "30 s", "60 s", "90 s", "120 s", "150 s", "180 s", "210 s"]),
    (3 * 3600 + 5, ["0 h", "0.5 h", "1 h", "1.5 h", "2 h", "2.5 h", "3 h"]),
])
def test_time_ticks_are_round(span: float, labels: list[str]) -> None:
    from jobgen.reporting.layout import time_ticks
    assert [label for _, label in time_ticks(span)] == labels


def test_tick_labels_are_plain() -> None:
    from jobgen.reporting.layout import plain, spans_decades, value_ticks
    assert [plain(v) for v in value_ticks(0.95, 1.05)] == ["0.96", "0.98", "1", "1.02", "1.04"]
    assert plain(1.2) == "1.2" and plain(12000) == "12,000" and plain(3e-4) == "0.0003"
    assert not spans_decades([1.1, 4.0, 9.0]) and spans_decades([0.01, 5.0])


def test_the_page_has_a_legend_for_every_colour(tmp_path: Path) -> None:
    import re

    from jobgen.reporting import html, layout, report
    made = report.make(None, make_run(tmp_path), use_sacct=False)
    page = html.page(made)
    drawn = set(re.findall(r'<rect [^>]*fill="(#[0-9a-f]{6})"', page))
    swatches = set(re.findall(r'class="sw" style="background:(#[0-9a-f]{6})"', page))
    assert drawn and drawn <= swatches
    assert layout.COLOURS["gap"] in drawn     # the restart gap is drawn and named
    curve = set(re.findall(r'<path d="M[^"]*" fill="none" stroke="(#[0-9a-f]{6})"', page))
    taken = set(layout.COLOURS.values()) | set(layout.MARKS.values())
    assert curve and not curve & taken and not set(layout.ALLOCATIONS) & taken
    assert "0.8 min" not in page and ">30 s<" in page
    assert "width=\"100%\"" in page and "pre-wrap" in page   # scales; the account wraps


# --- printed commands paste into a shell ----------------------------------------------------

def test_image_context_words_paste_as_they_stand(tmp_path: Path) -> None:
    from jobgen.plumbing.render import shell_path, shell_quote
    for text in ("a\x1bb", "x\x00y", "it's", "-rf", "a b", "\x9b31m"):
        word = shell_path(text) if text.startswith("-") else shell_quote(text)
        assert not any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f for c in word)
        said = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True)
        expected = ("./" + text if text.startswith("-") else text).split("\x00")[0]
        assert said.stdout == expected.encode()
    folder = "-rf\x1b[2J"
    proc = subprocess.run([str(JOBGEN), "image-context", "--site", "sagemaker", "--", folder],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr and "\x00" not in proc.stdout
    builds = [line for line in proc.stdout.splitlines() if line.startswith("docker build")]
    assert builds
    for line in builds:   # bash reads each word back as written: the folder, not an option
        words = subprocess.run(["bash", "-c", "printf '%s\\0' " + line[len("docker "):]],
                               capture_output=True, check=True).stdout.split(b"\0")[:-1]
        assert words[-1].decode() == "./" + folder and " -rf" not in line
        assert words[2].decode() == f"./{folder}/env/containers/" + words[2].decode().rsplit(
            "/", 1)[1]


def test_a_printed_drain_command_is_quoted() -> None:
    from jobgen.watching.detectors import Detectors
    from jobgen.watching.readers import NodeEnd
    host = "n1;touch pwned"
    watch = Detectors()
    ended = [[NodeEnd(0, host, 1, "train", 1.0)] for _ in range(watch.rules.restarts_per_node)]
    alerts = watch.restarts(ended)
    assert alerts, "a node that ended every allocation is named"
    message = alerts[0].message
    command = message.split("drain it: ", 1)[1]
    assert shlex.split(command)[2] == f"nodename={host}"


# --- EKS site settings ------------------------------------------------------------------------

@pytest.mark.parametrize("key, value", [
    ("eks.shared_mount", "/"), ("eks.shared_mount", "//"), ("eks.shared_mount", "/./"),
    ("eks.local_cache_host_path", "/"), ("eks.shared_mount", "/fsx/../"),
    ("eks.shared_mount", "/fsx\x1b[2J"), ("eks.shared_mount", "/fsx\nx"),
    ("eks.local_cache_host_path", "/var/tmp/c\x00"), ("eks.repository", "repo/img\x1b"),
    ("eks.smoke_memory", "8Gi\r"), ("eks.context", "ctx\x07"),
])
def test_eks_mounts_and_images_are_refused_in_one_line(
        write_site: Callable[..., Path], capsys: pytest.CaptureFixture[str], key: str,
        value: str) -> None:
    from jobgen.inputs import site as sites
    path = write_site("local", {key: value})
    with pytest.raises(ConfigError) as info:
        sites.load_file(path, path.name)
    said = str(info.value)
    assert said.startswith(f"{path.name}: {key}: ") and "\n" not in said and "\x1b" not in said
    assert main(["check", "--site", str(path), "--recipe", "llama2-7b", "--no-shellcheck"]) == 2
    _one_line_error(capsys, key)


def test_following_slurm_logs_passes_over_a_fifo(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from jobgen.backends.slurm import jobs
    monkeypatch.setattr(jobs, "state", lambda job_id: SimpleNamespace(finished=True))
    log = tmp_path / "node-0.log"
    log.write_text("step 1\n")
    os.mkfifo(tmp_path / "node-1.log")
    said: list[str] = []
    jobs.follow(lambda: [log, tmp_path / "node-1.log"], "7", said.append, poll=0)
    assert said[0] == "step 1\n" and "a FIFO" in said[1] and said[1].count("\n") == 1


def test_a_400_deep_run_record_is_not_a_recursion_error(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    run = make_run(tmp_path)
    deep: object = []
    for _ in range(400):
        deep = [deep, {"a": deep}] if isinstance(deep, list) and not deep else [deep]
    base = {"name": "deep", "backend": "local", "job_id": "7", "recipe": "x", "nodes": 2,
            "site": "", "run_dir": str(run), "submitted": "2026-01-01T00:00:00+00:00"}
    lines = [json.dumps(dict(base, **{key: deep})) for key in ("name", "nodes", "extra")]
    (state / "runs.jsonl").write_text("\n".join(lines + [json.dumps(base)]) + "\n")
    # A record of the right shape with a 400-deep value inside (runs NAME prints it as YAML).
    sub = {key: False if kind is bool else 1 if kind is int else kind()
           for key, kind in runrecord.SUBMISSION_KEYS.items()}
    sub.update(training={"a": deep}, job_ids=[deep])
    (run / runrecord.FILE).write_text(json.dumps({"format": runrecord.FORMAT, "run": "deep",
                                                  "submissions": [sub]}))
    env = dict(os.environ, JOBGEN_STATE_DIR=str(state))
    for argv in (["runs"], ["runs", "--json"], ["runs", "deep"], ["runs", "deep", "--json"],
                 ["status", "deep"], ["report", "deep"]):
        proc = subprocess.run([str(JOBGEN), *argv], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr, argv
        assert proc.returncode in (0, 2) and proc.stderr.count("\n") <= 1, proc.stderr


@pytest.mark.parametrize("where", ["under-a-file", "long-name", "fifo"])
def test_plan_plot_to_a_path_that_cannot_be_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    pytest.importorskip("matplotlib")
    (tmp_path / "file").write_text("x")
    out = {"under-a-file": tmp_path / "file" / "p.png", "long-name": tmp_path / ("a" * 300),
           "fifo": tmp_path / "fifo"}[where]
    if where == "fifo":
        os.mkfifo(out)
    assert main(["plan", "llama2-7b", "--plot", str(out)]) == 2
    _one_line_error(capsys, "--plot")


@pytest.mark.slow
def test_the_screenshot_script_shoots_both_widths(tmp_path: Path) -> None:
    """benchmarks/report_screenshots.py (for a person to look at): both screenshots and the
    PNG come out, at the widths asked for."""
    import shutil
    import struct
    pytest.importorskip("matplotlib")
    if shutil.which("chromium") is None:
        pytest.skip("no chromium here (Debian: apt-get install chromium)")
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "report_screenshots.py"
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, timeout=300,
                   capture_output=True)
    for name, width in (("wide.png", 1280), ("narrow.png", 720), ("report.png", None)):
        head = (tmp_path / name).read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        if width is not None:
            assert struct.unpack(">I", head[16:20])[0] == width


def test_status_runs_and_report_pass_over_fifos_in_a_local_run(tmp_path: Path) -> None:
    state, run = tmp_path / "state", tmp_path / "runs" / "r1"
    state.mkdir()
    (run / "logs" / "local-1" / "node-0").mkdir(parents=True)
    for name in ("logs/local-1/node-0/job.status", "logs/local-1/node-0/train.log",
                 "logs/local-1/node-0/host", "logs/local-1/cancelled.json",
                 "jobgen-health.jsonl", "jobgen-run.json"):
        os.mkfifo(run / name)
    (state / "runs.jsonl").write_text(json.dumps({
        "name": "r1", "backend": "local", "job_id": "local-1", "recipe": "x", "nodes": 1,
        "site": "", "run_dir": str(run), "submitted": "2026-01-01T00:00:00+00:00"}) + "\n")
    env = dict(os.environ, JOBGEN_STATE_DIR=str(state))
    for argv in (["runs"], ["runs", "r1"], ["status", "r1"], ["report", "r1"]):
        proc = subprocess.run([str(JOBGEN), *argv], env=env, cwd=run, capture_output=True,
                              text=True, timeout=60)
        assert "Traceback" not in proc.stderr and proc.returncode in (0, 2), (argv, proc.stderr)
