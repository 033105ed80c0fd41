"""`jobgen report` on a run's evaluations (issue 51 item 4): RUN/eval/step-N.json written by
eval_lm.py's own writer, shaped as lm-eval 0.4 writes its results (a group with subtasks, a
filtered metric, a task whose first metric is a perplexity, a stderr of N/A and of NaN), shown as
accuracy against tokens trained in the text, JSON, HTML and PNG; a bad results file is one line,
exit 2; a run without results prints what it printed before. The real lm-eval run is
tests/test_eval_lm.py's."""
from __future__ import annotations

import json
import math
import os
import re
import sys
import xml.dom.minidom
from pathlib import Path
from typing import Any

import pytest
from conftest import need
from test_report import make_run

from jobgen.cli import main
from jobgen.reporting import evals as evaluations

ROOT = Path(__file__).resolve().parents[1]
STEPS = (4, 8, 12)
SEQUENCE, BATCH = 32, 4     # tokens per sample, samples per step


def eval_lm() -> Any:
    """payload/common/eval_lm.py, the eval stage's program (its writer writes the files)."""
    need("lm_eval")
    sys.path.insert(0, str(ROOT / "payload"))
    try:
        from common import eval_lm as module
    finally:
        sys.path.remove(str(ROOT / "payload"))
    return module


def scores(step: int) -> dict[str, float]:
    """Made-up scores that rise with the step (what the report must show back)."""
    return {"mmlu": 0.25 + step / 400, "gsm8k": step / 200, "lambada": 0.30 + step / 100,
            "piqa": 0.55 + step / 300}


def body(step: int) -> dict[str, Any]:
    """lm-eval's results as simple_evaluate returns them, plus eval_lm.py's jobgen entry."""
    s = scores(step)
    results = {
        "mmlu": {"alias": "mmlu", "acc,none": s["mmlu"], "acc_stderr,none": 0.004},
        "mmlu_humanities": {"alias": " - humanities", "acc,none": 0.9,
                            "acc_stderr,none": 0.01},
        "mmlu_stem": {"alias": " - stem", "acc,none": 0.1, "acc_stderr,none": 0.01},
        "gsm8k": {"alias": "gsm8k", "exact_match,strict-match": s["gsm8k"],
                  "exact_match_stderr,strict-match": 0.01,
                  "exact_match,flexible-extract": 0.99,
                  "exact_match_stderr,flexible-extract": 0.01},
        "lambada_openai": {"alias": "lambada_openai", "perplexity,none": 1000.0 / step,
                           "perplexity_stderr,none": 3.0, "acc,none": s["lambada"],
                           "acc_stderr,none": "N/A"},
        "piqa": {"alias": "piqa", "sample_len": 1838, "acc,none": s["piqa"],
                 "acc_stderr,none": math.nan, "acc_norm,none": 0.99,
                 "acc_norm_stderr,none": 0.01},
    }
    tasks = {"mmlu": 5, "gsm8k": 8, "lambada_openai": 0, "piqa": 0}
    return {"results": results,
            "groups": {"mmlu": results["mmlu"]},
            "group_subtasks": {"mmlu": ["mmlu_humanities", "mmlu_stem"], "gsm8k": [],
                               "lambada_openai": [], "piqa": []},
            "configs": {"piqa": {"task": "piqa", "dataset_path": "baber/piqa"}},
            "versions": {t: 1.0 for t in tasks}, "n-shot": dict(tasks),
            "higher_is_better": {"mmlu": {"acc": True}, "gsm8k": {"exact_match": True},
                                 "lambada_openai": {"perplexity": False, "acc": True},
                                 "piqa": {"acc": True, "acc_norm": True}},
            "n-samples": {"piqa": {"original": 1838, "effective": 1838}},
            "lm_eval_version": "0.4.13", "date": 1764000000.0,
            "jobgen": {"step": step, "consumed_samples": step * BATCH,
                       "tokens": step * BATCH * SEQUENCE, "model": f"/runs/export/step-{step}",
                       "model_type": "gpt_neox", "trainer": "smoke", "proven": True,
                       "tasks": tasks, "device": "cpu", "limit": None}}


def evaluated(run: Path, steps: tuple[int, ...] = STEPS) -> Path:
    module = eval_lm()
    for step in steps:
        module.write(run / "eval" / f"step-{step}.json", body(step))
    return run


def report(run: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["report", "--run-dir", str(run), "--no-sacct", *args]) == 0
    return capsys.readouterr().out


def section(out: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("evaluation ("))
    end = next((i for i in range(start, len(lines)) if not lines[i]), len(lines))
    return lines[start:end]


def test_the_text_shows_each_tasks_headline_per_step_and_its_change(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path)
    before = report(run, capsys)
    after = report(evaluated(run), capsys)
    shown = section(after)
    # Only the section (and the blank line before it) is new: the rest is as it was.
    lines = after.splitlines()
    start = lines.index(shown[0])
    assert lines[start - 1] == "" and lines[:start - 1] + lines[start + len(shown):] == \
        before.splitlines()
    header = shown[1].split()
    assert header == ["step", "tokens", "mmlu", "gsm8k", "lambada_openai", "piqa"]
    assert shown[2].split("  ")[-1].strip() == "acc, 0-shot"
    assert "exact_match (strict-match), 8-shot" in shown[2] and "acc, 5-shot" in shown[2]
    assert "perplexity" not in after and "mmlu_stem" not in after   # acc first; a subtask
    rows = shown[3:3 + len(STEPS)]
    for step, row in zip(STEPS, rows):
        s = scores(step)
        cells = re.split(r"\s{2,}", row.strip())
        assert cells == [str(step), f"{step * BATCH * SEQUENCE:,}", f"{s['mmlu']:.4f} +-0.0040",
                         f"{s['gsm8k']:.4f} +-0.0100", f"{s['lambada']:.4f}",
                         f"{s['piqa']:.4f}"]   # N/A and NaN: no stderr
    first, last = scores(STEPS[0]), scores(STEPS[-1])
    assert shown[3 + len(STEPS)] == (
        f"  mmlu acc: {last['mmlu'] - first['mmlu']:+.4f} from step 4 (512 tokens) to step 12 "
        f"(1,536 tokens): {first['mmlu']:.4f} to {last['mmlu']:.4f}")
    assert len(shown) == 3 + len(STEPS) + 4     # a change line per task


def test_one_evaluated_step_has_no_change_yet(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    shown = section(report(evaluated(make_run(tmp_path), (8,)), capsys))
    assert shown[-1] == "  one evaluated step per task: no change to show yet"
    assert shown[-2].split()[:2] == ["8", "1,024"]


def test_the_json_lists_every_evaluated_step_strictly(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    run = evaluated(make_run(tmp_path))
    data = json.loads(report(run, capsys, "--json"),
                      parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert [(e["step"], e["tokens"], e["consumed_samples"], e["file"]) for e in data["eval"]] == \
        [(s, s * BATCH * SEQUENCE, s * BATCH, f"eval/step-{s}.json") for s in STEPS]
    for e in data["eval"]:
        got = {x["task"]: x for x in e["scores"]}
        s = scores(e["step"])
        assert got["mmlu"] == {"task": "mmlu", "metric": "acc", "filter": "none",
                               "value": s["mmlu"], "stderr": 0.004, "shots": 5,
                               "higher_is_better": True}
        assert (got["gsm8k"]["filter"], got["gsm8k"]["value"]) == ("strict-match", s["gsm8k"])
        assert (got["lambada_openai"]["metric"], got["lambada_openai"]["stderr"]) == ("acc", None)
        assert (got["piqa"]["metric"], got["piqa"]["stderr"]) == ("acc", None)   # NaN
    change = {c["task"]: c for c in data["eval_change"]}
    assert change["piqa"]["change"] == pytest.approx(scores(12)["piqa"] - scores(4)["piqa"])
    assert (change["piqa"]["first_tokens"], change["piqa"]["last_tokens"]) == (512, 1536)


def test_the_page_and_the_png_draw_accuracy_against_tokens_beside_the_loss(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = evaluated(make_run(tmp_path))
    page = tmp_path / "r.html"
    report(run, capsys, "--html", str(page))
    html = page.read_text()
    pictures = re.findall(r"<svg.*?</svg>", html, re.S)
    assert len(pictures) == 5    # the timeline, loss, accuracy, gradient norm, learning rate
    for picture in pictures:
        xml.dom.minidom.parseString(picture)
    loss, accuracy = pictures[1], pictures[2]
    assert ">loss</text>" in loss and "accuracy against tokens trained" in accuracy
    tips = re.findall(r"<title>(step [^<]*)</title>", accuracy)
    assert len(tips) == 4 * len(STEPS)
    assert f"step 12, 1,536 tokens: mmlu acc, 5-shot {scores(12)['mmlu']:.4f} +- 0.0040" in tips
    assert f"step 4, 512 tokens: piqa acc, 0-shot {scores(4)['piqa']:.4f}" in tips
    for words in ("mmlu acc, 5-shot", "gsm8k exact_match (strict-match), 8-shot"):
        assert f"</span>{words}</li>" in html     # the legend names each task's colour
    assert "evaluation (lm-eval on the exported steps" in html    # the account's text
    pytest.importorskip("matplotlib")
    from jobgen.reporting import png
    from jobgen.reporting import report as reports
    made = reports.make(None, run, use_sacct=False)
    png.write(made, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_without_results_files_prints_what_it_printed_before(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path)
    outputs = []
    for _ in ("no eval folder", "an eval folder with no results"):
        page = tmp_path / "r.html"
        outputs.append((report(run, capsys), report(run, capsys, "--json"),
                        report(run, capsys, "--html", str(page)), page.read_text()))
        (run / "eval" / "tasks" / "jobgen_smoke_choice").mkdir(parents=True, exist_ok=True)
        (run / "eval" / ".step-4.json.tmp-123").write_text('{"results": ')   # a write cut short
        (run / "eval" / "step-04.json").write_text("not eval_step.py's name")
    assert outputs[0] == outputs[1]
    assert "evaluation" not in outputs[0][0] and '"eval"' not in outputs[0][1]
    assert len(re.findall(r"<svg", outputs[0][3])) == 4


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _oversized(path: Path) -> None:
    with open(path, "wb") as sparse:
        sparse.truncate(evaluations.MAX_BYTES + 1)


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: p.write_text('{"results": {"piqa": '), "not lm-eval's results JSON (Expecting "),
    (lambda p: p.write_text("[1, 2]"), "not lm-eval's results JSON (not an object)"),
    (lambda p: p.write_bytes(b'{"results": "\xff"}'), "not lm-eval's results JSON ('utf-8'"),
    (lambda p: p.write_text('{"jobgen": {"step": 8}}'),
     "not lm-eval's results JSON (no results object of tasks)"),
    (lambda p: p.write_text('{"results": {"piqa": {"alias": "piqa"}}}'),
     "not lm-eval's results JSON (no task in results has a metric)"),
    (lambda p: p.write_text("[" * 100_000 + "]" * 100_000),
     "not lm-eval's results JSON (nested too deeply)"),
    (lambda p: p.write_text(json.dumps(dict(body(8), jobgen={"step": 4}))),
     "jobgen.step: 4, but the file is named for step 8"),
    (lambda p: p.write_text(json.dumps(dict(body(8), jobgen={"tokens": -1}))),
     "jobgen.tokens: -1 is not a whole number of at least 0"),
    (lambda p: p.write_text(json.dumps(dict(body(8), jobgen=[8]))), "jobgen: not an object"),
    (_oversized, f"more than {evaluations.MAX_BYTES:,} bytes; not read"),
    (_fifo, "is a FIFO, not a regular file"),
    (lambda p: p.mkdir(), "is a folder, not a regular file"),
])
def test_a_bad_results_file_is_one_line_and_status_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, says: str) -> None:
    run = evaluated(make_run(tmp_path), (4,))
    bad = run / "eval" / "step-8.json"
    make(bad)
    page = tmp_path / "r.html"
    for extra in ((), ("--json",), ("--html", str(page))):
        assert main(["report", "--run-dir", str(run), "--no-sacct", *extra]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
        assert f"{bad}: " in err and says in err, err
    assert not page.exists()


def test_plan_from_run_still_takes_the_cluster_beside_a_bad_results_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobgen.reporting import inputs
    from jobgen.runs import ledger as runs
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr("jobgen.reporting.sacct.spans", lambda job: None)
    run = make_run(tmp_path)
    (run / "eval").mkdir()
    (run / "eval" / "step-8.json").write_text("{")
    assert runs.record(runs.Run("demo", "slurm", "7", "llama2-7b", 2, "", str(run),
                                runs.now())) is None
    options: dict[str, Any] = {"node_mtbf_hours": None, "restart_s": None}
    assert len(inputs.fill(options, ["demo"])) == 2 and options["node_mtbf_hours"] > 0


def test_the_stage_jobs_of_a_run_are_not_allocations_of_its_training(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An export and an eval job log under RUN/logs/JOB as training does: the run's record names
    their stage, and the report leaves them out of the allocations (it counted each as a failed
    allocation "after step 0", with a node MTBF made of them)."""
    from jobgen.runs import runrecord
    run = make_run(tmp_path)
    before = json.loads(report(run, capsys, "--json"))
    for job, stage in (("local-8", "export"), ("local-9", "eval")):
        node = run / "logs" / job / "node-0"
        node.mkdir(parents=True)
        (node / f"{stage}.log").write_text(f"the {stage} stage's output\n")
        (node / "job.status").write_text(f"0 {stage}\n")

    def submission(jobs: list[str], stages: list[str] | None) -> dict[str, Any]:
        sub: dict[str, Any] = {k: 1 if kind is int else kind()
                               for k, kind in runrecord.SUBMISSION_KEYS.items()}
        sub["job_ids"] = jobs
        if stages is not None:
            sub["job_stages"] = stages
        return sub

    (run / runrecord.FILE).write_text(json.dumps({
        "format": runrecord.FORMAT, "run": "demo",
        "submissions": [submission(["7"], None), submission(["local-8"], ["export"]),
                        submission(["local-9"], ["eval"])]}))
    after = json.loads(report(run, capsys, "--json"))
    assert after == before
    assert [a["job"] for a in after["timeline"]["allocations"]] == ["7", "7", "7"]


def _export(run: Path, step: int, proof: dict[str, Any]) -> None:
    """An export's folder as payload/common/export_hf.py publishes it (its record last)."""
    folder = run / "export" / f"step-{step}"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}\n")
    (folder / "jobgen-export.json").write_text(json.dumps(
        {"step": step, "checkpoint": f"/runs/train/checkpoints/step_{step:08d}",
         "consumed_samples": step * BATCH, "proof": proof}, indent=1) + "\n")


def test_the_report_lists_each_export_with_its_proof_in_text_and_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A cluster's export job leaves its outcome in RUN/export/step-N/jobgen-export.json: the
    report shows it (a folder still being written, or a temporary one, is not an export)."""
    run = make_run(tmp_path)
    before = report(run, capsys)
    _export(run, 8, {"ok": True, "precision": "bf16", "logged_loss": 5.8119,
                     "measured_loss": 5.8301, "allowed": 0.116})
    _export(run, 12, {"ok": None, "precision": "bf16", "reason": "no step 13"})
    (run / "export" / "step-16").mkdir()                  # being written: no record yet
    (run / "export" / ".step-20.tmp-99").mkdir()          # export_hf.py's temporary name
    out = report(run, capsys)
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("exports ("))
    assert lines[start + 1:start + 3] == [
        "  step        8  proven: 5.8301 against 5.8119 (bf16)  export/step-8",
        "  step       12  unproven (bf16)  export/step-12"]
    assert lines[start - 1] == "" and lines[start + 3:start + 4] in ([], [""])
    assert lines[:start - 1] + lines[start + 3:] == before.splitlines()
    data = json.loads(report(run, capsys, "--json"))
    assert [(e["step"], e["outcome"], e["measured_loss"], e["logged_loss"], e["folder"])
            for e in data["exports"]] == [(8, "proven", 5.8301, 5.8119, "export/step-8"),
                                          (12, "unproven", None, None, "export/step-12")]


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: p.write_text('{"step": 8, "proof": '), "not an export's record (not JSON)"),
    (lambda p: p.write_text('{"step": 4, "proof": {"ok": true}}'),
     "not an export's record of step 8"),
    (_fifo, "is a FIFO, not a regular file"),
])
def test_a_bad_export_record_is_one_line_and_status_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, says: str) -> None:
    run = make_run(tmp_path)
    (run / "export" / "step-8").mkdir(parents=True)
    bad = run / "export" / "step-8" / "jobgen-export.json"
    make(bad)
    assert main(["report", "--run-dir", str(run), "--no-sacct"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and f"{bad}: " in err and says in err, err
