"""Hostile input, second pass (issue 33): what operators' commands read from and write to disk,
and the numbers and names they take. In process, generated per family:

- writing over what is not a regular file (a FIFO, device nodes, a folder, symlinks): refused,
  the thing left as it was, nothing else written;
- reading what is not a regular file where a log, record or config should be: no hang, one
  error or nothing read, bounded memory;
- numbers outside their declared domain (`plan`'s options and the site's plan: section), and
  `--json` strict in every case;
- values from disk outside their domain (event times, TensorBoard wall times, run records,
  `runs.jsonl` lines), control characters escaped when printed;
- leaving the run folder (rollback), work before the limit (sweeps), overlong integers;
- names a service validates (Kubernetes, Slurm, AWS regions, from the environment too);
- judging what is not a run (`watch --run-dir`).

Device nodes are made with os.mknod in the test's own temporary folder (the numbers of
/dev/zero, /dev/urandom, /dev/full and /dev/null): never a real /dev path.
"""
from __future__ import annotations

import json
import math
import os
import re
import socket
import stat
from pathlib import Path
from typing import Any, Callable

import pytest

from jobgen.inputs import sweep, yaml12
from jobgen.job.plan import Plan, PlannedFile
from jobgen.plumbing import fsio
from jobgen.plumbing.errors import ConfigError, JobgenError, RenderError
from jobgen.runs import ledger as runs
from jobgen.runs import runrecord
from jobgen.watching import actions, command, readers, tbevents
from jobgen.watching.observations import TIME_MAX, plausible_time

pytestmark = pytest.mark.timeout(30)   # a read that blocks fails the case, never the run

DEVICES = {"zero": (1, 5), "urandom": (1, 9), "full": (1, 7), "null": (1, 3)}
SPECIAL = ["fifo", *DEVICES, "folder", "socket"]            # not a regular file at all
LINKS = ["symlink-out", "symlink-dangling", "symlink-in"]   # a symlink, wherever it points
VICTIM = b"outside the folder: must not change\n"


def make(kind: str, path: Path, outside: Path) -> None:
    """A thing of `kind` at `path` (`outside`: a folder beside the one under test)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind in DEVICES:
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(*DEVICES[kind]))
        except PermissionError:
            pytest.skip("device nodes cannot be made here (no CAP_MKNOD)")
    elif kind == "folder":
        path.mkdir()
    elif kind == "socket":     # bound by its name from its folder: a socket's path is short
        here = os.getcwd()
        sock = socket.socket(socket.AF_UNIX)
        try:
            os.chdir(path.parent)
            sock.bind(path.name)
        finally:
            sock.close()
            os.chdir(here)
    else:
        outside.mkdir(exist_ok=True)
        (outside / "victim").write_bytes(VICTIM)
        target = {"symlink-out": outside / "victim", "symlink-dangling": outside / "missing",
                  "symlink-in": path.parent / "sibling"}[kind]
        if kind == "symlink-in":
            target.write_bytes(b"sibling\n")
        os.symlink(target, path)


def fingerprint(path: Path) -> tuple[int, Any]:
    """What a path is (its lstat mode), and where a symlink points."""
    st = os.lstat(path)
    return st.st_mode, os.readlink(path) if stat.S_ISLNK(st.st_mode) else None


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --- writing over what is not a regular file -------------------------------------------------

def _fsio(folder: Path, name: str) -> None:
    fsio.write_file(folder / name, b"new\n")


def _plan(folder: Path, name: str) -> None:
    files = (PlannedFile("first.txt", "1\n"), PlannedFile(name, "2\n"))
    Plan("local", files, name, ()).write(folder)


def _record(folder: Path, name: str) -> None:
    runrecord._write(folder / name, {"format": 1})


def _appended(folder: Path, name: str) -> None:
    fsio.append(folder / name, "{}\n")


def _rollback_latest(folder: Path, name: str) -> None:
    actions.roll_back(folder.parent.parent, 4, "jobgen")   # folder: RUN/train/checkpoints


WRITERS: dict[str, Callable[[Path, str], None]] = {
    "fsio": _fsio, "plan": _plan, "run-record": _record, "append": _appended,
    "rollback-latest": _rollback_latest}


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("kind", SPECIAL + LINKS)
def test_writers_refuse_what_is_not_a_regular_file(tmp_path: Path, kind: str,
                                                   writer: str) -> None:
    folder = tmp_path / "run" / "train" / "checkpoints"
    name = "latest" if writer == "rollback-latest" else "target"
    make(kind, folder / name, tmp_path / "outside")
    (folder / "step_00000004").mkdir()    # the checkpoint a rollback would resume from
    before, names = fingerprint(folder / name), listing(folder)
    with pytest.raises(JobgenError) as info:
        WRITERS[writer](folder, name)
    message = str(info.value)
    assert "\n" not in message and ("regular file" in message or "outside" in message)
    assert fingerprint(folder / name) == before             # the thing is as it was
    assert listing(folder) == names                         # no temporary left, nothing new
    if kind.startswith("symlink"):
        assert (tmp_path / "outside" / "victim").read_bytes() == VICTIM


def test_the_writer_replaces_a_regular_file_atomically_with_the_umask(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"old")
    fsio.write_file(tmp_path / "f", "new")
    assert (tmp_path / "f").read_bytes() == b"new" and listing(tmp_path) == ["f"]
    assert stat.S_IMODE(os.stat(tmp_path / "f").st_mode) == 0o666 & ~fsio.current_umask()


# --- reading what is not a regular file ------------------------------------------------------

def _state_runs(tmp: Path, hostile: Path) -> Any:
    return runs.load()


def _events(tmp: Path, hostile: Path) -> Any:
    return tbevents.EventFile(hostile).read()


def _lines(tmp: Path, hostile: Path) -> Any:
    return readers.LineReader(hostile).read(0.0)


def _node_end(tmp: Path, hostile: Path) -> Any:
    return readers.Allocation(0, "1", hostile.parent.parent).ends()


READERS: dict[str, tuple[str, Callable[[Path, Path], Any], Any]] = {
    # name: (where the hostile thing goes, relative to the state/run folder; the read; result)
    "bytes": ("x", lambda tmp, p: fsio.read_bytes(p), JobgenError),
    "records": ("x.jsonl", lambda tmp, p: fsio.read_records(p, dict), JobgenError),
    "runs.jsonl": ("state/runs.jsonl", _state_runs, JobgenError),
    "run-record": ("run/jobgen-run.json", lambda tmp, p: runrecord.read_file(p), JobgenError),
    "yaml": ("recipe.yaml", lambda tmp, p: yamlfile_load(p), JobgenError),
    "read_from": ("x", lambda tmp, p: readers.read_from(p, 0), b""),
    "events": ("run/nemo/events.out.tfevents.1", _events, []),
    "node-log": ("run/logs/1/restart-0/node-0/train.log", _lines, []),
    "job.status": ("run/logs/1/restart-0/node-0/job.status", _node_end, "ends"),
    "host": ("run/logs/1/restart-0/node-0/host", lambda tmp, p: readers.Allocation(
        0, "1", p.parent.parent).host(0), ""),
    "progress": ("run/logs/1/restart-0/node-0/train.log",
                 lambda tmp, p: progress_step(tmp / "run"), None),
}


def yamlfile_load(path: Path) -> Any:
    from jobgen.inputs.yamlfile import load_yaml
    return load_yaml(path, path.name)


def progress_step(run: Path) -> Any:
    from jobgen.runs.progress import newest_step
    return newest_step(str(run), "1")


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("kind", SPECIAL)
def test_readers_never_block_on_what_is_not_a_regular_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, reader: str) -> None:
    where, read, expected = READERS[reader]
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    path = tmp_path / where
    make(kind, path, tmp_path / "outside")
    if expected is JobgenError:
        with pytest.raises(JobgenError) as info:
            read(tmp_path, path)
        assert "\n" not in str(info.value) and str(path.name) in str(info.value)
    elif expected == "ends":
        assert [(e.node, e.status) for e in read(tmp_path, path)] == [(0, None)]
    else:
        assert read(tmp_path, path) == expected


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_user_config_that_is_not_a_file_is_refused_not_ignored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    from jobgen.inputs import userconfig
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("JOBGEN_SITE", raising=False)
    make(kind, tmp_path / "jobgen" / "config.yaml", tmp_path / "outside")
    with pytest.raises(ConfigError, match="config.yaml: is a"):
        userconfig.site(None)


def test_a_growing_log_is_read_in_bounded_chunks(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(b"x" * (fsio.MAX_LINE + 10) + b"\n" + b'{"event": "done"}\n')
    reader = readers.LineReader(path)
    assert reader.read(0.0) == ['{"event": "done"}'] and reader.skipped == 1


# --- numbers outside their domain ------------------------------------------------------------

NUMBERS = ["nan", "NaN", "inf", "-inf", "Infinity", "1e309", "-1e309", "5e-324", "0", "-0", "-1",
           "1e-9", "1e-3", "0.1", "1", "1e5", "604800", "1e7", "1e15", "1e16", "1e17", "1e300",
           "", "x", "1e", "0x10", "9" * 5000]
PLAN_KEYS = ["tokens", "samples", "price", "node_mtbf_hours", "restart_s", "storage_mb_s",
             "checkpoint_gb"]


@pytest.mark.parametrize("text", NUMBERS, ids=lambda t: t[:12] or "empty")
@pytest.mark.parametrize("key", PLAN_KEYS)
def test_plan_options_take_exactly_their_declared_domain(key: str, text: str) -> None:
    import click

    from jobgen.cli.param_types import _Amount
    from jobgen.inputs.limits import PLAN_DOMAINS
    low, high, unit = PLAN_DOMAINS[key]
    try:
        number = float(text)
    except (ValueError, OverflowError):
        number = math.nan
    inside = math.isfinite(number) and low <= number <= high
    if inside:
        assert _Amount.of(key).convert(text, None, None) == number
    else:
        with pytest.raises(click.BadParameter) as info:
            _Amount.of(key).convert(text, None, None)
        assert f"{high:g}" in str(info.value) or "not a number" in str(info.value)


EDGES = [(f"--{k.replace('_', '-')}", v) for k in PLAN_KEYS if k != "samples"
         for v in ("low", "high")]


@pytest.mark.parametrize("option,edge", EDGES)
@pytest.mark.parametrize("nodes", ["4", "1..1024"])
def test_plan_at_the_edges_of_its_domains_is_strict_json_or_one_line(
        jobgen: Callable[..., Any], option: str, edge: str, nodes: str) -> None:
    from jobgen.inputs.limits import PLAN_DOMAINS
    low, high, _ = PLAN_DOMAINS[option[2:].replace("-", "_")]
    result = jobgen("plan", "neox20b", "--nodes", nodes, option,
                    repr(low if edge == "low" else high), "--json")
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    if result.exit_code == 0:
        data = json.loads(result.output, parse_constant=lambda c: pytest.fail(f"bare {c}"))
        assert all(math.isfinite(v) for v in numbers_in(data))
    else:
        assert result.exit_code == 2 and result.output.count("\n") == 1, result.output


def numbers_in(data: Any) -> list[float]:
    if isinstance(data, dict):
        return [n for v in data.values() for n in numbers_in(v)]
    if isinstance(data, list):
        return [n for v in data for n in numbers_in(v)]
    return [data] if isinstance(data, float) else []


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_json_is_strict_at_its_one_place(value: float, capsys: pytest.CaptureFixture) -> None:
    from jobgen.cli.options import _echo_json
    with pytest.raises(RenderError, match="not finite"):
        _echo_json({"x": [1, {"y": value}]})
    assert capsys.readouterr().out == ""


SITE_PLAN = {"plan.platforms.p.prices.on_demand": "price",
             "plan.platforms.p.node_mtbf_hours": "node_mtbf_hours",
             "plan.storage.write_mb_s": "storage_mb_s", "plan.storage.node_mb_s": "storage_mb_s",
             "plan.restart.detect_s": "restart_s", "plan.restart.compile_s": "restart_s"}


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0, 1e-300, 1e300, 5e-324])
@pytest.mark.parametrize("key", sorted(SITE_PLAN))
def test_the_sites_plan_numbers_have_the_options_domains(key: str, value: float) -> None:
    from jobgen.inputs.limits import PLAN_DOMAINS
    from jobgen.inputs.site_plan import PlanSite, PlatformFacts, Restart, Storage, check_plan
    low, high, unit = PLAN_DOMAINS[SITE_PLAN[key]]
    leaf = key.rsplit(".", 1)[1]
    if key.startswith("plan.platforms"):
        facts = PlatformFacts(prices={"on_demand": value}) if leaf == "on_demand" else \
            PlatformFacts(node_mtbf_hours=value)
        plan = PlanSite(platforms={"p": facts})
    elif key.startswith("plan.storage"):
        plan = PlanSite(storage=Storage(100.0, 100.0, **{leaf: value}) if leaf == "node_mb_s"
                        else Storage(value, 100.0))
    else:
        plan = PlanSite(restart=Restart(**{leaf: value}))
    if math.isfinite(value) and low <= value <= high:
        check_plan(plan, "site.yaml")
    else:
        with pytest.raises(ConfigError, match=f"site.yaml: {key}: .* must be from {low:g} to "):
            check_plan(plan, "site.yaml")


# --- values from disk outside their domain ---------------------------------------------------

GOOD_RUN = {"name": "r1", "backend": "slurm", "job_id": "11", "recipe": "neox20b", "nodes": 4,
            "site": "", "run_dir": "/nonexistent/r1", "submitted": "2026-01-01T00:00:00Z"}
BAD_RUN_LINES = [
    '{"name": "r2", "nodes": NaN}', '{"name": "r2", "nodes": Infinity}', "[" * 100000,
    '{"nodes": ' + "9" * 5000 + "}", "[]", '"x"', "1", "null", "{", "\x00\x01\x02",
    "x" * (fsio.MAX_LINE + 1),
    *[json.dumps({**GOOD_RUN, key: value}) for key, value in [
        ("nodes", "4"), ("nodes", 0), ("nodes", -1), ("nodes", True), ("nodes", 1.5),
        ("nodes", None), ("name", None), ("name", 7), ("job_id", ["1"]), ("jobs", "12"),
        ("jobs", [1, 2]), ("smoke", "yes"), ("max_steps", 0), ("seq_length", "2048"),
        ("endpoint_url", 5), ("queue", {}), ("run_dir", None), ("backend", [])]],
    json.dumps({k: v for k, v in GOOD_RUN.items() if k != "recipe"}),
]


@pytest.mark.parametrize("line", BAD_RUN_LINES, ids=lambda s: s[:24])
def test_runs_skips_and_counts_a_line_that_is_not_a_record(tmp_path: Path, line: str) -> None:
    state = Path(os.environ["JOBGEN_STATE_DIR"])
    state.mkdir(parents=True)
    (state / "runs.jsonl").write_bytes(
        (json.dumps(GOOD_RUN) + "\n" + line + "\n").encode("utf-8", "surrogateescape"))
    found, skipped = runs.load_counted()
    assert [r.name for r in found] == ["r1"] and skipped == 1


RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")   # all but the line break
CONTROLS = ["\x1b[2J", "\x1b]0;pwned\x07", "\r", "\x08" * 5, "\x9b31m", "\x00", "\x7f", "\u0085"]


@pytest.mark.parametrize("control", CONTROLS, ids=lambda c: repr(c)[1:-1])
@pytest.mark.parametrize("as_json", [False, True])
def test_runs_prints_no_raw_control_character(jobgen: Callable[..., Any], control: str,
                                              as_json: bool) -> None:
    state = Path(os.environ["JOBGEN_STATE_DIR"])
    state.mkdir(parents=True)
    (state / "runs.jsonl").write_text(json.dumps({**GOOD_RUN, "name": f"r{control}1",
                                                  "recipe": control}) + "\n")
    result = jobgen("runs", "--no-state", *(["--json"] if as_json else []))
    assert result.exit_code == 0, result.output
    assert not RAW_CONTROL.search(result.output), repr(result.output)
    if as_json:
        assert json.loads(result.output)[0]["name"] == f"r{control}1"


TIMES = ["9999-12-31T23:59:59-12:00", "0001-01-01T00:00:00+14:00", "2200-01-02T00:00:00Z",
         "1969-12-31T23:59:59Z", "", "x" * 100000, "2024-13-45T00:00:00Z", "NaN", 1e300, -1e300,
         None, True, [], {}, "2024-01-01T00:00:00+99:00", "+275760-09-13T00:00:00Z"]


@pytest.mark.parametrize("when", TIMES, ids=lambda t: repr(t)[:24])
def test_event_times_outside_the_domain_are_not_observations(when: Any) -> None:
    events = [json.dumps({"event": "step", "time": when, "step": 1, "loss": 1.0}),
              json.dumps({"event": "step", "time": "2026-01-01T00:00:00Z", "step": 2,
                          "loss": 10 ** 400 if isinstance(when, str) else 1.0})]
    found = readers.parse_lines(events, "events", 0)
    assert [o.step for o in found] == [2] and all(plausible_time(o.time) for o in found)


def write_event(path: Path, wall_time: float, step: int, value: float) -> None:
    """One TensorBoard Event record, framed and checksummed by tensorboard's own writer."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(
        tag="reduced_train_loss", simple_value=value)])
    event = event_pb2.Event(wall_time=wall_time, step=step, summary=summary)
    with open(path, "ab") as out:
        RecordWriter(out).write(event.SerializeToString())


@pytest.mark.parametrize("wall_time", [1e300, -1e300, math.nan, math.inf, -math.inf, 1e19,
                                       -1.0, TIME_MAX + 1, 5e-324 * -1])
def test_tensorboard_wall_times_outside_the_domain_are_left_out(
        tmp_path: Path, wall_time: float) -> None:
    path = tmp_path / "run" / "nemo" / "events.out.tfevents.1"
    path.parent.mkdir(parents=True)
    write_event(path, wall_time, 1, 2.0)
    write_event(path, 1.7e9, 2, 1.5)
    assert [s.step for s in tbevents.EventFile(path).read()] == [2]
    found = readers.RunReader(tmp_path / "run").read()
    assert [o.step for o in found if o.kind == "step"] == [2]


# --- run records for resubmit ----------------------------------------------------------------

def good_record() -> dict[str, Any]:
    sub = {key: kind() for key, kind in runrecord.SUBMISSION_KEYS.items()}
    sub.update(nodes=4, backend="slurm", recipe="neox20b", site="", site_shown="local")
    return {"format": runrecord.FORMAT, "run": "r1", "submissions": [sub]}


def broken(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    data = good_record()
    change(data)
    return data


RECORDS = {
    **{f"no-{key}": broken(lambda d, k=key: d["submissions"][0].pop(k))
       for key in runrecord.SUBMISSION_KEYS},
    **{f"{key}-wrong-type": broken(lambda d, k=key, kind=kind: d["submissions"][0].update(
        {k: 1.5 if kind is not float else "x"})) for key, kind in
       runrecord.SUBMISSION_KEYS.items()},
    "nodes-bool": broken(lambda d: d["submissions"][0].update(nodes=True)),
    "overrides-not-text": broken(lambda d: d["submissions"][0].update(overrides=[1])),
    "submissions-empty-mapping": broken(lambda d: d.update(submissions=[{}])),
    "submissions-empty": broken(lambda d: d.update(submissions=[])),
    "submissions-text": broken(lambda d: d.update(submissions="x")),
    "submission-number": broken(lambda d: d.update(submissions=[1])),
    "format-2": broken(lambda d: d.update(format=2)),
    "no-run": broken(lambda d: d.pop("run")),
    "top-list": [1, 2],
}
RAW_RECORDS = {"nan": '{"format": NaN}', "deep": "[" * 100000, "digits": "9" * 5000,
               "cut-short": '{"format": 1, "run": "r1", "submissions": [', "empty": "",
               "binary": "\udcff\udcfe\x00"}


@pytest.mark.parametrize("name", sorted(RECORDS) + sorted(RAW_RECORDS))
def test_a_malformed_run_record_is_one_line(tmp_path: Path, name: str) -> None:
    text = RAW_RECORDS[name] if name in RAW_RECORDS else json.dumps(RECORDS[name])
    path = tmp_path / "jobgen-run.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ConfigError) as info:
        runrecord.read_file(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


def test_the_good_record_of_these_cases_is_read(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps(good_record()))
    assert runrecord.read_file(tmp_path / "r.json") == good_record()


@pytest.mark.parametrize("name", ["submissions-empty-mapping", "no-recipe_text", "no-cwd"])
def test_resubmit_of_a_malformed_record_is_one_line(jobgen: Callable[..., Any], name: str) -> None:
    state = Path(os.environ["JOBGEN_STATE_DIR"]) / "records" / "local" / "slurm"
    state.mkdir(parents=True)
    (state / "r1.json").write_text(json.dumps(RECORDS[name]))
    result = jobgen("resubmit", "r1", "--dry-run")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert isinstance(result.exception, SystemExit)


# --- rollback stays in the run folder ---------------------------------------------------------

def complete(root: Path, step: int) -> None:
    folder = root / f"step_{step:08d}"
    folder.mkdir(parents=True)
    (folder / "COMPLETE").write_text(json.dumps({"step": step}))


@pytest.mark.parametrize("layout", ["jobgen", "nemo"])
@pytest.mark.parametrize("how", ["checkpoints", "train"])
def test_rollback_never_leaves_the_run_folder(tmp_path: Path, layout: str, how: str) -> None:
    run, outside = tmp_path / "run", tmp_path / "elsewhere"
    part = "train" if layout == "jobgen" else "nemo"
    real = outside / "checkpoints" if how == "checkpoints" else outside / part
    ckpts = real if how == "checkpoints" else real / "checkpoints"
    for step in (4, 8, 12):
        if layout == "jobgen":
            complete(ckpts, step)
        else:
            ckpts.mkdir(parents=True, exist_ok=True)
            (ckpts / f"m-step={step}.ckpt").write_bytes(b"x")
    (run / part).mkdir(parents=True) if how == "checkpoints" else run.mkdir()
    link = run / part / "checkpoints" if how == "checkpoints" else run / part
    os.symlink(real, link)
    before = sorted(str(p) for p in outside.rglob("*"))
    target, why = actions.rollback_target(run, before=10)
    assert target is None and "outside the run folder" in why
    with pytest.raises(ConfigError, match="outside the run folder"):
        actions.roll_back(run, 8, layout)
    assert sorted(str(p) for p in outside.rglob("*")) == before


@pytest.mark.parametrize("name", ["step_²", "step_٣", "step_" + "9" * 240, "step_-1",
                                  "step_1e3", "step_ 1", "step_", "step_0x10", "step_１２"])
def test_checkpoint_folders_that_are_no_step_are_left_alone(tmp_path: Path, name: str) -> None:
    root = tmp_path / "train" / "checkpoints"
    complete(root, 4)
    complete(root, 8)
    (root / name).mkdir()
    (root / name / "COMPLETE").write_text('{"step": 2}')
    assert actions.rollback_target(tmp_path, before=10) == (8, "jobgen")
    actions.roll_back(tmp_path, 4, "jobgen")
    assert (root / name).is_dir() and (root / "latest").read_text() == "step_00000004"


@pytest.mark.parametrize("name", ["m-step=" + "9" * 240 + ".ckpt", "m-step=².ckpt",
                                  "m-step=٣.ckpt", "m-step=.ckpt"])
def test_nemo_checkpoint_names_that_are_no_step_are_left_alone(tmp_path: Path,
                                                              name: str) -> None:
    root = tmp_path / "nemo" / "checkpoints"
    root.mkdir(parents=True)
    (root / "m-step=4.ckpt").write_bytes(b"x")
    (root / name).write_bytes(b"x")
    assert actions.rollback_target(tmp_path, before=10) == (4, "nemo")


# --- work before the limit, overlong integers -------------------------------------------------

SWEEPS = [(6, 100), (2, 1001), (1, 1001), (4, 6), (3, 11), (10, 2), (20, 2), (2, 50000)]


@pytest.mark.parametrize("keys,values", SWEEPS)
def test_sweeps_are_counted_before_they_are_built(monkeypatch: pytest.MonkeyPatch, keys: int,
                                                  values: int) -> None:
    monkeypatch.setattr(sweep.itertools, "product",
                        lambda *a: pytest.fail("combinations built before they were counted"))
    options = [f"optim.k{k}=" + ",".join(str(v) for v in range(values)) for k in range(keys)]
    with pytest.raises(ConfigError, match=r"combinations with the keys before it, more than 1000"):
        sweep.points(options, "base")


def test_a_sweep_at_the_limit_is_built() -> None:
    options = [f"optim.k{k}=" + ",".join(str(v) for v in range(10)) for k in range(3)]
    assert len(sweep.points(options, "b")) == sweep.MAX_JOBS


@pytest.mark.parametrize("digits", [41, 100, 4300, 4301, 20000])
@pytest.mark.parametrize("form", ["{}", "-{}", "0x{}", "0o{}"])
def test_overlong_integers_are_one_line(digits: int, form: str) -> None:
    text = form.format(("7" if "o" in form else "9") * digits)
    with pytest.raises(yaml12.YamlError, match=f"an integer of {len(text):,} characters"):
        yaml12.loads(f"nodes: {text}\n")


@pytest.mark.parametrize("key", ["nodes", "parallelism.global_batch_size", "seed",
                                 "schedule.max_steps"])
def test_overlong_integers_through_set_are_one_line(key: str) -> None:
    from jobgen.inputs import recipe
    with pytest.raises(ConfigError, match=r"--set: 999999999999\.\.\.: an integer of 4,301"):
        recipe.load("neox20b", [f"{key}={'9' * 4301}"])


# --- names a service validates ---------------------------------------------------------------

BAD_K8S = ["FSX", "a b", "a..b", ".a", "a.", "-a", "a-", "x" * 254, "fsx\n", "fsx\nkind: Pod",
           "fsx\x1b[2J", "", "a_b", "ａｂ", "a/b", "a:b", "fsx\t", "é"]


@pytest.mark.parametrize("value", BAD_K8S, ids=lambda v: repr(v)[1:20])
@pytest.mark.parametrize("key", ["eks.shared_pvc", "eks.service_account", "eks.namespace"])
def test_kubernetes_names_are_checked_where_they_enter(write_site: Callable[..., Path],
                                                       key: str, value: str) -> None:
    from jobgen.inputs import site as sites
    path = write_site("local", {key: value})
    with pytest.raises(ConfigError) as info:
        sites.load_file(path, path.name)
    assert str(info.value).startswith(f"{path.name}: {key}: ")


@pytest.mark.parametrize("value", ["fsx-claim", "a", "a.b-c.d", "x" * 253])
def test_kubernetes_names_the_api_server_takes_are_taken(write_site: Callable[..., Path],
                                                         value: str) -> None:
    from jobgen.inputs import site as sites
    path = write_site("local", {"eks.shared_pvc": value})
    assert sites.load_file(path, path.name).eks.shared_pvc == value


@pytest.fixture(scope="module")
def slurm_inputs() -> tuple[Any, Any]:
    from jobgen.inputs import recipe
    from jobgen.inputs import site as sites
    return sites.load("local"), recipe.load("neox20b")[0]


SLURM_VALUES = {
    "exclude": (["n[1-999999999999]", "n[5-3]", "n[1-70000]", "n[0-65536]", "n1," * 2000,
                 "n[1-9999999999]", "a b", "n\n1", "n[1-2]\x1b", "", ",", "n[]", "n[1-]", "n[٣]"],
                ["n1", "n[1-4],n7", "gpu-[01-04,07]", "n[1-65536]"]),
    "time": (["99999999999999999999", "4294967294", "3000000-00", "99999999999-00", "1:2:3:4",
              "1e5", "-1", "\n5", "5\n", "", "1-2-3", "UNLIMITEDx", "٣"],
             ["60", "4294967293", "1-00:00:00", "UNLIMITED", "infinite", "2:30:00"]),
}


@pytest.mark.parametrize("option,value,good", [
    (option, value, good) for option, (bad, ok) in SLURM_VALUES.items()
    for good, values in ((False, bad), (True, ok)) for value in values])
def test_slurm_host_lists_and_times_within_slurms_domain(slurm_inputs: tuple[Any, Any],
                                                         option: str, value: str,
                                                         good: bool) -> None:
    from jobgen.backends.slurm.options import resolve
    site, recipe = slurm_inputs
    if good:
        resolve(site, recipe, {option: value}, 65536)
    else:
        with pytest.raises(ConfigError, match=f"^--{option}: .* is not a Slurm"):
            resolve(site, recipe, {option: value}, 65536)


BAD_REGIONS = ["us-east-1\x1b", "us east", "-x", "x-", "123", "a" * 64, "eu-west-1\n",
               "us-east-1;id", "us_east_1"]


@pytest.mark.parametrize("value", BAD_REGIONS, ids=lambda v: repr(v)[1:16])
@pytest.mark.parametrize("origin", ["AWS_REGION", "AWS_DEFAULT_REGION", "--region",
                                    "site"])
def test_aws_regions_are_checked_wherever_they_come_from(
        monkeypatch: pytest.MonkeyPatch, origin: str, value: str) -> None:
    import dataclasses

    from jobgen.backends import aws
    from jobgen.inputs import site as sites
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    site = sites.load("local")
    if origin.startswith("AWS_"):
        monkeypatch.setenv(origin, value)
    elif origin == "--region":
        monkeypatch.setitem(aws.FLAGS, "region", value)
    else:
        site = dataclasses.replace(site, batch=dataclasses.replace(site.batch, region=value))
    with pytest.raises(JobgenError) as info:
        aws.region(site)
    assert str(info.value).startswith(f"{origin if origin != 'site' else 'site local'}")
    assert "is not an AWS region name" in str(info.value)


# --- judging what is not a run ------------------------------------------------------------------

def not_a_run(tmp: Path, kind: str) -> Path:
    folder = tmp / "folder"
    folder.mkdir()
    if kind == "files":
        (folder / "notes.txt").write_text("hello\n")
        (folder / "log").mkdir()
    elif kind == "deep":
        deep = folder
        for n in range(50):
            deep = deep / f"d{n}"
        deep.mkdir(parents=True)
    elif kind == "proc":
        return Path("/proc/self")
    elif kind == "a-file":
        (tmp / "file").write_text("x")
        return tmp / "file"
    elif kind == "missing":
        return tmp / "missing"
    return folder


@pytest.mark.parametrize("kind", ["empty", "files", "deep", "proc", "a-file", "missing"])
def test_watch_refuses_to_judge_what_is_not_a_run(jobgen: Callable[..., Any], tmp_path: Path,
                                                  kind: str) -> None:
    result = jobgen("watch", "--run-dir", str(not_a_run(tmp_path, kind)))
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    if kind == "a-file":     # click's usage error (the command line makes it one line)
        assert "is a file" in result.output
    else:
        assert result.output.count("\n") == 1, result.output
        assert "not a run folder" in result.output or "no such folder" in result.output


@pytest.mark.parametrize("kind", SPECIAL)
def test_watch_of_a_run_whose_files_are_not_files_ends(tmp_path: Path, kind: str,
                                                       capsys: pytest.CaptureFixture) -> None:
    from jobgen.watching.detectors import Rules
    run = tmp_path / "run"
    make(kind, run / "train" / "metrics.jsonl", tmp_path / "outside")
    summary = command.watch_recorded(run, Rules(), as_json=True)
    assert summary.alerts == []
    # Said once, in the summary: the file was there and was not read.
    assert summary.notes == [f"{run / 'train' / 'metrics.jsonl'}: not a regular file; not read"]
    for line in capsys.readouterr().out.splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c}"))


def test_watch_counts_the_lines_it_skipped(tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    from jobgen.watching.detectors import Rules
    run = tmp_path / "run"
    (run / "train").mkdir(parents=True)
    good = {"event": "step", "phase": "train", "step": 1, "loss": 2.0,
            "time": "2026-11-26T10:00:00+00:00"}
    (run / "train" / "metrics.jsonl").write_text("\n".join([
        json.dumps(good),
        '{"event": "step", "step": 2, "loss": ' + "9" * (readers.MAX_LINE + 10),  # too long
        '{"event": "step", "step": 3, "lo',                                        # cut short
        '{"event": "step", "step": ' + "[" * 100_000,                              # too deep
        json.dumps({**good, "step": 4})]) + "\n")
    summary = command.watch_recorded(run, Rules(), as_json=True)
    assert summary.last_step == 4
    assert summary.notes == [f"3 line(s) of the run's logs skipped (over {readers.MAX_LINE} "
                             "bytes, or events that are not JSON objects)"]
    last = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert last["type"] == "summary" and last["notes"] == summary.notes
