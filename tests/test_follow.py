"""`--every K` (issue 51, item 4): a follower job beside training exports (and scores) each
sealed step that is a multiple of K as training goes (payload/common/follow_steps.py,
jobgen/payloads/follow.py). Fast: the Slurm follower's script and its dependency on the training
job, the refusals, and which steps the follower takes (real stand-in programs as its export and
eval, real seals). Slow: the rehearsal, the real export beside the real training processes."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.test_rehearsal_data import _port, jobgen, ok

ROOT = Path(__file__).resolve().parents[1]
SHELLCHECK = Path(sys.executable).parent / "shellcheck"
sys.path.insert(0, str(ROOT / "payload"))

from common import checkpoints, follow_steps  # noqa: E402


def _scripts(dry_run: str) -> list[tuple[str, str]]:
    """(sbatch command line, script) of each job of `submit --dry-run`."""
    found = re.findall(r"^job_\d+=\$\((.*?) <<'(JOBGEN_SCRIPT_\w+)'\n(.*?)^\2\n", dry_run,
                       re.M | re.S)
    return [(command, script) for command, _, script in found]


def _args(script: str) -> list[str]:
    found = re.search(r"^ARGS=\(\n(.*?)^\)\n", script, re.M | re.S)
    assert found is not None, script
    return [w.strip() for w in found.group(1).splitlines()]


# --- fast: what is submitted --------------------------------------------------------------------

def test_the_follower_starts_after_training_starts_and_runs_the_export_and_eval_stages_work(
        tmp_path: Path) -> None:
    text = ok(jobgen(tmp_path, "submit", "neox20b", "--smoke", "--site", "trn1-pcluster",
                     "--stages", "train,export,eval", "--every", "8", "--dry-run"))
    jobs = _scripts(text)
    assert len(jobs) == 2, text          # training, then the follower: no export or eval job
    (train_cmd, _), (follow_cmd, script) = jobs
    assert "--dependency" not in train_cmd
    assert '"--dependency=after:${job_1%%;*}"' in follow_cmd        # started, not ended
    assert '"--export=ALL,JOBGEN_FOLLOW_JOB=${job_1%%;*}"' in follow_cmd
    assert "--kill-on-invalid-dep=yes" in follow_cmd
    assert "#SBATCH --nodes=1\n" in script and "#SBATCH --job-name=neox20b-smoke-follow\n" in script
    assert "PROGRAM=common/follow_steps.py\n" in script
    words = _args(script)
    run = "/fsx/jobgen/runs/neox20b-4n-smoke"
    own = dict(zip(words[:words.index("+export")], words[1:words.index("+export")]))
    assert "--checkpoints" not in own and own["--metrics"] == f"{run}/train/metrics.jsonl"
    assert own["--every"] == "8" and own["--slurm-job-env"] == "JOBGEN_FOLLOW_JOB"
    export = words[words.index("+export") + 1:words.index("+eval")]
    assert export[0] == "smoke/export_smoke.py" and "--step" not in export
    assert dict(zip(export, export[1:]))["--output-dir"] == f"{run}/train"
    scored = words[words.index("+eval") + 1:]
    assert scored[0] == "common/eval_step.py" and "--step" not in scored
    (tmp_path / "follow.sbatch").write_text(script)
    lint = subprocess.run([str(SHELLCHECK), str(tmp_path / "follow.sbatch")],
                          capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_without_eval_the_follower_only_exports_and_prepare_still_goes_first(
        tmp_path: Path) -> None:
    text = ok(jobgen(tmp_path, "submit", "neox20b", "--smoke", "--site", "trn1-pcluster",
                     "--stages", "prepare,train,export", "--every", "4", "--dry-run"))
    jobs = _scripts(text)
    assert len(jobs) == 3
    assert "--dependency=afterok:" in jobs[1][0]
    assert "--dependency=after:" in jobs[2][0]
    assert "+eval" not in _args(jobs[2][1])


@pytest.mark.parametrize(("args", "says"), [
    (("--stages", "train,export", "--every", "0"), "--every 0: K must be at least 1"),
    (("--stages", "train", "--every", "4"), "--stages must name train and export"),
    (("--stages", "export,eval", "--every", "4"), "--stages must name train and export"),
    (("--stages", "train,export", "--every", "4", "--step", "8"), "--step is for one export"),
    (("--stages", "train,export", "--every", "4", "--backend", "batch"),
     "--backend batch cannot run a job beside training"),
    (("--stages", "train,export", "--every", "4", "--backend", "sagemaker"),
     "--backend sagemaker cannot run stages"),
    (("--stages", "train,export", "--every", "4", "--backend", "eks"),
     "--backend eks cannot run stages"),
])
def test_what_every_refuses_on_submit(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    done = jobgen(tmp_path, "submit", "neox20b", "--smoke", *args, "--dry-run")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize(("args", "says"), [
    (("--smoke", "--every", "-1"), "--every -1: K must be at least 1"),
    (("--smoke", "--stages", "train,export"), "--stages is for --every K"),
    (("--every", "4"), "a rehearsal's training (--smoke"),
    (("--smoke", "--every", "4", "--stage", "export"), "a rehearsal's training (--smoke"),
])
def test_what_every_refuses_on_run(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    done = jobgen(tmp_path, "run", "neox20b", "--nodes", "1", *args, "--dry-run")
    assert done.returncode == 2 and says in done.stderr, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "jobgen-runs").exists()


# --- fast: which steps the follower takes -------------------------------------------------------

def _save(root: Path, step: int, seal: bool = True) -> None:
    folder = checkpoints.prepare_save_dir(root, step)
    (folder / "state.pt").write_bytes(b"x" * step)
    if seal:
        checkpoints.mark_complete(root, step, {"consumed_samples": 2 * step})


def _log(metrics: Path, *steps: int) -> None:
    with open(metrics, "a", encoding="utf-8") as out:
        for step in steps:
            out.write(json.dumps({"event": "step", "phase": "train", "step": step,
                                  "loss": 5.0}) + "\n")


STAND_IN = """\
import json, pathlib, sys
args = sys.argv[1:]
{listing}step = args[args.index("--step") + 1]
root = pathlib.Path(args[args.index("{flag}") + 1])
with open(root.parent / "calls.txt", "a") as out:
    out.write("{what} " + step + "\\n")
{body}
"""


# An export's --list-sealed, as smoke/export_smoke.py's: export_hf's own listing of jobgen's seals
# under RUN/train/checkpoints (RUN/export is --export-root); it fails while RUN/unlisted exists.
LISTING = f"""\
if "--list-sealed" in args:
    sys.path.insert(0, {str(ROOT / "payload")!r})
    from common import export_hf
    run = pathlib.Path(args[args.index("--export-root") + 1]).parent
    if (run / "unlisted").exists():
        sys.exit("stand-in: error: " + str(run / "train" / "checkpoints") + ": unreadable")
    sys.exit(export_hf.list_sealed(
        lambda: export_hf.sealed_steps(run / "train" / "checkpoints"), "stand-in", False))
"""


def _stand_ins(tmp: Path) -> tuple[list[str], list[str]]:
    """An export program that lists the sealed steps (LISTING) and publishes RUN/export/step-S
    (as export_hf.publish does, with its record), and an eval program that writes
    RUN/eval/step-S.json; both log their calls."""
    export = tmp / "export_stand_in.py"
    export.write_text(STAND_IN.format(
        flag="--export-root", what="export", listing=LISTING, body=textwrap.dedent("""\
        (root / f"step-{step}").mkdir(parents=True)
        (root / f"step-{step}" / "jobgen-export.json").write_text("{}")
        sys.exit(3 if step == "24" else 0)   # the last: unproven, still exported
        """)))
    scored = tmp / "eval_stand_in.py"
    scored.write_text(STAND_IN.format(
        flag="--eval-root", what="eval", listing="", body=textwrap.dedent("""\
        assert args.index("--step") < args.index("--")   # eval_step.py's own flags come first
        root.mkdir(exist_ok=True)
        (root / f"step-{step}.json").write_text("{}")
        """)))
    return [str(export), "--export-root", str(tmp / "run" / "export")], \
        [str(scored), "--eval-root", str(tmp / "run" / "eval"), "--on-node", "--", "--tasks", "t"]


def _args_for(tmp: Path, export: list[str], scored: list[str], every: int) -> list[str]:
    run = tmp / "run"
    return ["--metrics", str(run / "train" / "metrics.jsonl"),
            "--export-root", str(run / "export"), "--eval-root", str(run / "eval"),
            "--every", str(every), "--until", str(tmp / "ended"), "--poll", "0.01",
            "+export", *export, "+eval", *scored]


def test_the_follower_takes_sealed_multiples_of_k_once_the_next_step_is_logged_oldest_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, metrics = tmp_path / "run" / "train" / "checkpoints", \
        tmp_path / "run" / "train" / "metrics.jsonl"
    root.parent.mkdir(parents=True)
    for step in (4, 8, 12, 16):
        _save(root, step)
    _save(root, 20, seal=False)              # being written: no COMPLETE marker yet
    _log(metrics, *range(1, 18))            # 16 sealed, 17 logged: all of 8 and 16 are ready
    export, scored = _stand_ins(tmp_path)
    assert follow_steps.wanted(export, 8) == [8, 16]
    assert follow_steps.wanted(export, 4) == [4, 8, 12, 16]
    args, export_words, eval_words = follow_steps.parse(_args_for(tmp_path, export, scored, 8))
    calls = tmp_path / "run" / "calls.txt"
    moments: list[str] = []

    def sleep(_: float) -> None:   # training goes on between two polls of the follower
        moments.append(calls.read_text() if calls.exists() else "")
        if len(moments) == 1:
            _save(root, 20)                      # sealed: not a multiple of 8
            _save(root, 24)                      # sealed, its next step never logged
            checkpoints.prune(root, keep=3)      # 4, 8, 12 go
        elif len(moments) == 2:
            (tmp_path / "ended").write_text("")

    status = follow_steps.follow(args, export_words, eval_words,
                                 lambda: (tmp_path / "ended").exists(), sleep)
    assert status == 0
    # Before the first poll: 8 and 16, oldest first, each exported then scored; not 20.
    assert moments[0] == "export 8\neval 8\nexport 16\neval 16\n"
    # 24 waited for its step 25 until training ended, then was taken in the last sweep.
    assert moments[1] == moments[0]
    assert calls.read_text() == moments[0] + "export 24\neval 24\n"
    out = capsys.readouterr().out
    assert "training has ended; 3 exported, 3 scored, 0 skipped, 0 failed" in out


def test_a_step_pruned_before_its_turn_is_skipped_in_one_line_and_done_steps_are_not_redone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "run" / "train" / "checkpoints"
    root.parent.mkdir(parents=True)
    for step in (4, 8):
        _save(root, step)
    _log(root.parent / "metrics.jsonl", *range(1, 10))
    (tmp_path / "run" / "export" / "step-4").mkdir(parents=True)   # an earlier follower's
    (tmp_path / "run" / "export" / "step-4" / "jobgen-export.json").write_text("{}")
    export, scored = _stand_ins(tmp_path)
    # The export of 4 fails where a stand-in would run: it is done already, only scored.
    args, export_words, eval_words = follow_steps.parse(_args_for(tmp_path, export, scored, 4))
    seen = {"polls": 0}

    def ended() -> bool:
        seen["polls"] += 1
        if seen["polls"] == 2:   # pruning removed 8 after the follower saw it sealed
            import shutil
            shutil.rmtree(root / checkpoints.tag_for(8))
        return seen["polls"] >= 3

    status = follow_steps.follow(args, export_words, eval_words, ended, lambda _: None)
    assert status == 0
    calls = (tmp_path / "run" / "calls.txt").read_text()
    assert calls == "eval 4\n"
    out = capsys.readouterr().out
    assert "follow: step 8: skipped: checkpoint pruning removed it before its export\n" in out
    assert "1 skipped" in out


def test_a_failed_export_is_said_and_the_follower_goes_on_then_exits_with_its_status(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "run" / "train" / "checkpoints"
    root.parent.mkdir(parents=True)
    for step in (2, 4):
        _save(root, step)
    failing = tmp_path / "fails.py"
    failing.write_text("import pathlib, sys\nargs = sys.argv[1:]\n" + LISTING +
                       "sys.exit(78 if '2' in sys.argv[-1:] else 0)\n")
    _, scored = _stand_ins(tmp_path)
    (tmp_path / "ended").write_text("")
    args, export_words, eval_words = follow_steps.parse(_args_for(
        tmp_path, [str(failing), "--export-root", str(tmp_path / "run" / "export")], scored, 2))
    status = follow_steps.follow(args, export_words, eval_words, lambda: True)
    assert status == 78
    out = capsys.readouterr().out
    assert "follow: step 2: failed with status 78" in out
    assert "follow: step 4: exporting" in out          # and it went on


@pytest.mark.parametrize(("argv", "says"), [
    (["--every", "2"], "+export PROGRAM ARGS... is required"),
    (["--metrics", "m", "--export-root", "e", "--eval-root", "v",
      "--every", "0", "--until", "f", "+export", "p"], "--every 0: K must be at least 1"),
    (["--metrics", "m", "--export-root", "e", "--eval-root", "v", "--every", "2",
      "--slurm-job-env", "JOBGEN_TEST_NO_SUCH_VAR", "+export", "p"],
     "--slurm-job-env JOBGEN_TEST_NO_SUCH_VAR: holds no Slurm job id"),
])
def test_the_followers_bad_input_is_one_line_exit_2_and_78_on_a_node(
        argv: list[str], says: str) -> None:
    for extra, code in (([], 2), (["--on-node"], 78)):
        done = subprocess.run([sys.executable, str(ROOT / "payload" / "common" /
                                                   "follow_steps.py"), *extra, *argv],
                              capture_output=True, text=True, check=False, timeout=60)
        assert done.returncode == code and says in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_a_listing_that_fails_is_said_in_one_line_and_asked_again_at_the_next_sweep(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "run" / "train" / "checkpoints"
    root.parent.mkdir(parents=True)
    for step in (2, 4):
        _save(root, step)
    _log(root.parent / "metrics.jsonl", *range(1, 6))
    (tmp_path / "run" / "unlisted").write_text("")     # the shared disk hiccups: listing fails
    export, scored = _stand_ins(tmp_path)
    args, export_words, eval_words = follow_steps.parse(_args_for(tmp_path, export, scored, 2))
    polls: list[str] = []

    def sleep(_: float) -> None:
        polls.append("")
        (tmp_path / "run" / "unlisted").unlink()

    status = follow_steps.follow(args, export_words, eval_words, lambda: bool(polls), sleep)
    assert status == 0 and len(polls) == 1
    assert (tmp_path / "run" / "calls.txt").read_text() == \
        "export 2\neval 2\nexport 4\neval 4\n"
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "listing the sealed steps" in line]
    assert said == [f"follow: listing the sealed steps failed (status 1: stand-in: error: {root}: "
                    "unreadable); asking again at the next sweep"], out
    assert "0 skipped, 0 failed" in out        # a failed listing prunes nothing


def test_a_listing_that_still_fails_after_training_ended_ends_the_follower_with_its_status(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "unlisted").write_text("")
    export, scored = _stand_ins(tmp_path)
    args, export_words, eval_words = follow_steps.parse(_args_for(tmp_path, export, scored, 2))
    status = follow_steps.follow(args, export_words, eval_words, lambda: True, lambda _: None)
    assert status == 1
    out = capsys.readouterr().out
    assert out.count("listing the sealed steps failed") == follow_steps.LAST_TRIES
    assert "3 times since training ended; giving up" in out


def _taken(monkeypatch: pytest.MonkeyPatch, export: list[str], every: int,
           run: Path) -> list[int]:
    """The steps the follower exports, training over (every sealed step's turn has come): its
    listing is the real export's --list-sealed; the export itself is recorded, not run."""
    taken: list[int] = []

    def export_step(words: list[str]) -> int:
        assert words[:len(export)] == export
        taken.append(int(words[words.index("--step") + 1]))
        return 0
    monkeypatch.setattr(follow_steps, "child", export_step)
    args, export_words, _ = follow_steps.parse([
        "--metrics", str(run / "train" / "metrics.jsonl"), "--export-root", str(run / "export"),
        "--eval-root", str(run / "eval"), "--every", str(every), "--until", str(run),
        "+export", *export])
    assert follow_steps.follow(args, export_words, [], lambda: True, lambda _: None) == 0
    return taken


def test_on_a_nemo_run_the_follower_takes_the_complete_kth_steps_the_export_takes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NeMo's layout (TP 2, PP 2, xser; tests/stand_ins/nemo_checkpoint.py): steps 2, 3 and 6
    whole, step 4 with one rank's tensor file missing (a save cut off)."""
    from tests import test_export_nemo as nemo
    run = tmp_path / "run"
    ranks = nemo.nemo_checkpoint.rank_states(nemo._model(64).state_dict(), nemo.TP, nemo.PP,
                                             nemo.LAYERS, nemo.HIDDEN // nemo.HEADS)
    for step in (2, 3, 4, 6):
        for (t, p), state in ranks.items():
            path = run / "nemo" / "checkpoints" / f"tp_rank_{t:02d}_pp_rank_{p:03d}" / \
                nemo.NAME.format(step, step * nemo.GBS)
            nemo.nemo_checkpoint.save(nemo.nemo_checkpoint.lightning(state, step), path, True)
            if step == 4 and (t, p) == (nemo.TP - 1, nemo.PP - 1):
                (path.with_name(path.name + ".tensors") / "tensor_0.pt").unlink()
    (run / "train").mkdir()
    export = ["neuron_nemo/export_neox.py", *nemo.overrides(run, "unread"),
              "--tokenizer-files", "v.json", "m.txt", "--export-root", str(run / "export"),
              "--on-node"]
    assert _taken(monkeypatch, export, 2, run) == [2, 6]
    began = time.monotonic()
    assert follow_steps.sealed(export) == [2, 3, 6]
    print(f"export_neox.py --list-sealed: {time.monotonic() - began:.2f} s")
    # The export's own choice agrees: each listed step is chosen by --step, 4 is refused.
    args = nemo.program.parse_args(export[1:])
    layout, root, metrics = nemo.program.placed(nemo.program.Overrides(args.overrides))
    assert metrics == run / "train" / "metrics.jsonl"
    for step in (2, 3, 6):
        assert nemo.program.sealed(root, layout, step, metrics)[0].step == step
    with pytest.raises(nemo.program.PayloadError, match="step 4 is not complete"):
        nemo.program.sealed(root, layout, 4, metrics)
    # A whole file the export would refuse (no consumed_samples in its name): the listing
    # fails as the export would, in one line (the follower asks again at its next sweep).
    for (t, p), state in ranks.items():
        nemo.nemo_checkpoint.save(nemo.nemo_checkpoint.lightning(state, 8), root /
                                  f"tp_rank_{t:02d}_pp_rank_{p:03d}" / "megatron_neox--step=8.ckpt",
                                  True)
    with pytest.raises(follow_steps.Unlisted) as refused:
        follow_steps.sealed(export)
    assert refused.value.status == 78
    assert str(refused.value).startswith("status 78: nemo-export: error: ")
    assert str(refused.value).endswith("no consumed_samples= in its name (not a NeMo checkpoint "
                                       "callback's file)")


def test_on_an_nxd_run_the_follower_takes_the_kth_steps_nxd_sealed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NxD's layout (tests/test_export_llama.py's nxd_step): 2, 3, 4 and 8 sealed with NxD's
    done file, 6 without it (being written)."""
    from tests import test_export_llama as nxd
    for step in (2, 3, 4, 6, 8):
        nxd.nxd_step(tmp_path / "checkpoints", step, sealed=step != 6)
    export = [str(nxd.EXPORT), *nxd.trainer_flags(tmp_path), "--tokenizer", str(tmp_path),
              "--export-root", str(tmp_path / "export"), "--on-node"]
    assert _taken(monkeypatch, export, 2, tmp_path) == [2, 4, 8]
    assert _taken(monkeypatch, export, 4, tmp_path) == [4, 8]
    began = time.monotonic()
    follow_steps.sealed(export)
    print(f"export_llama.py --list-sealed: {time.monotonic() - began:.2f} s")
    sys.path.insert(0, str(nxd.EXPORT.parent))
    import export_llama
    assert [c.step for c in export_llama.sealed(tmp_path / "checkpoints")] == \
        follow_steps.sealed(export) == [2, 3, 4, 8]


def test_list_sealed_prints_the_steps_one_a_line_or_refuses_in_one_line(tmp_path: Path) -> None:
    """smoke/export_smoke.py's, by path as the follower runs it: jobgen's seals."""
    root = tmp_path / "train" / "checkpoints"
    for step in (3, 1, 2):
        _save(root, step, seal=step != 2)
    words = [sys.executable, str(ROOT / "payload" / "smoke" / "export_smoke.py"),
             "--output-dir", str(tmp_path / "train"), "--tokenizer-seed", "1",
             "--export-root", str(tmp_path / "export"), "--list-sealed"]
    began = time.monotonic()
    done = subprocess.run(words, capture_output=True, text=True, check=False, timeout=60)
    took = time.monotonic() - began
    assert (done.returncode, done.stdout, done.stderr) == (0, "1\n3\n", ""), done.stderr
    assert not (tmp_path / "export").exists()
    print(f"export_smoke.py --list-sealed: {took:.2f} s")


# --- slow: the rehearsal ------------------------------------------------------------------------

@pytest.mark.slow   # about 75 s on 2 busy cores: training at 1 s a step, 3 real exports beside it
def test_a_rehearsal_exports_every_kth_step_while_training_goes_and_training_ends_unharmed(
        tmp_path: Path) -> None:
    began = time.monotonic()
    done = jobgen(tmp_path, "run", "neox20b", "--smoke", "--nodes", "1", "--every", "8",
                  "--stages", "train,export", "--set", f"job.master_port={_port()}",
                  JOBGEN_SMOKE_STEP_DELAY="1.0")
    took = time.monotonic() - began
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "jobgen-runs" / "neox20b-1n-smoke"
    events = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text()
              .splitlines() if line.startswith("{")]
    trained = [e for e in events if e.get("event") == "step" and e.get("phase") == "train"]
    assert [e["step"] for e in trained][-1] == 24          # training went all the way
    # Step 8's export began while training still ran: the follower's line comes before the
    # training pass's end in the run's output, as the lines arrived (no wall-clock figure:
    # a loaded machine may finish the export itself after the last step); 16 and 24 in time or
    # in the last sweep.
    record = run / "export" / "step-8" / "jobgen-export.json"
    assert json.loads(record.read_text())["proof"]["ok"] is True
    lines = done.stdout.splitlines()
    began_8 = next(i for i, line in enumerate(lines)
                   if "[follow] follow: step 8: exporting" in line)
    ended = next(i for i, line in enumerate(lines)
                 if '"event": "done"' in line and '"phase": "train"' in line)
    assert began_8 < ended, done.stdout[-3000:]
    assert (run / "export" / "step-24" / "jobgen-export.json").is_file()   # unproven, exported
    taken = re.findall(r"\[follow\] follow: step (\d+): (exporting|skipped)", done.stdout)
    assert [int(s) for s, _ in taken] == [8, 16, 24], done.stdout[-3000:]
    assert "jobgen: the follower ended with status 0" in done.stderr
    assert not (run / "eval").exists()        # train,export: no scores
    print(f"rehearsal with the follower: {took:.1f} s")


def test_the_training_job_has_ended_once_squeue_no_longer_lists_it_or_lists_it_ended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in squeue on PATH answers as Slurm's does for each case."""
    squeue = tmp_path / "squeue"
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    for body, ended in (("echo RUNNING", False), ("echo PENDING", False), ("true", True),
                        ("echo COMPLETED", True), ("echo TIMEOUT", True),
                        ("echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1",
                         True),
                        ("echo 'slurm_load_jobs error: Socket timed out' >&2; exit 1", False)):
        squeue.write_text(f"#!/bin/sh\n{body}\n")
        squeue.chmod(0o755)
        assert follow_steps.slurm_ended("123") is ended, body
