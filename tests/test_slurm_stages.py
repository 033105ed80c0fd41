"""The stage chain on the real local Slurm cluster (tests/ci/slurm-up.sh), through the installed
CLI as a user types it: `jobgen submit neox20b --smoke --nodes 1 --stages
prepare,train,export,eval --wait`. Four jobs, each afterok the one before and run in that order;
the dataset the prepare job makes passes the nodes' data check and is what training reads;
RUN/export/step-N loads with transformers alone in a fresh `python -I` and gives the trainer's
logged loss on the batch of the step after N; the eval job scores that folder; `jobgen status
RUN` and `jobgen logs RUN` name each stage's job. About 45-60 s here (2 cores).
"""
from __future__ import annotations

import json
import math
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from test_slurm_e2e import (  # noqa: F401  (cluster: the module fixture, used by name)
    JOB_TIMEOUT,
    JOBGEN_EXE,
    MAX_STEPS,
    SUBMITTED,
    Job,
    cluster,
    explain,
    free_port,
    job_env,
    only,
    run_cli,
    show_figures,
    steps_of,
    unique,
    wait_until,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STAGES = ("prepare", "train", "export", "eval")
JOB_NAMES = ("neox20b-smoke-prepare", "neox20b-smoke", "neox20b-smoke-export",
             "neox20b-smoke-eval")
FIGURES: dict[str, str] = {}

# Run in a fresh isolated interpreter (-I: no PYTHON* variables, no script or working folder on
# sys.path): the exported folder with transformers only. Prints the model's class, its loss on
# each held-out micro-batch and their token rows' CRC-32 (chained as the trainer logs them),
# the tokenizer's vocabulary and a round trip, and any module of jobgen's that got loaded.
LOAD = r"""
import json, sys, zlib
import torch, transformers
from safetensors.torch import load_file
folder = sys.argv[1]
model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
flat = load_file(folder + "/heldout-batch.safetensors")
losses, crc = [], 0
with torch.no_grad():
    for k in range(len(flat) // 2):
        ids = flat[f"{k}.input_ids"]
        crc = zlib.crc32(ids.contiguous().numpy().tobytes(), crc)
        losses.append(float(model(input_ids=ids, labels=flat[f"{k}.labels"]).loss))
text = "the model was trained here"
print(json.dumps({
    "class": type(model).__name__, "losses": losses, "crc32": crc,
    "vocab": tokenizer.get_vocab(), "vocab_size": model.config.vocab_size,
    "round_trip": tokenizer.decode(tokenizer(text)["input_ids"]) == text,
    "ours": sorted(m for m in sys.modules if m.split(".")[0] in ("jobgen", "common", "smoke"))}))
"""


@pytest.fixture(scope="module", autouse=True)
def _cleanup_and_figures(request: pytest.FixtureRequest) -> Iterator[None]:
    """At the end: cancel this module's jobs still queued or running, print the figures."""
    before = len(SUBMITTED)
    yield
    mine = SUBMITTED[before:]
    if mine:
        subprocess.run(["scancel", *mine], capture_output=True, timeout=30, check=False)
    show_figures(request, "Slurm stage-chain figures", FIGURES)


def _dependency(job_id: str) -> str:
    proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                          text=True, timeout=30, check=False)
    found = re.search(r"\bDependency=(\S+)", proc.stdout)
    return found.group(1) if found else ""


def _accounting(ids: list[str]) -> dict[str, list[str]]:
    """{job id: [name, state, exit code, start, end, node list]} once all have ended."""
    proc = subprocess.run(["sacct", "-X", "-P", "-n", "-o",
                           "JobID,JobName,State,ExitCode,Start,End,NodeList", "-j",
                           ",".join(ids)], capture_output=True, text=True, timeout=30,
                          check=False)
    rows = {r.split("|")[0]: r.split("|")[1:] for r in proc.stdout.split("\n") if r}
    done = set(rows) == set(ids) and all(r[4] not in ("", "Unknown") for r in rows.values())
    return rows if done else {}


def test_submit_stages_prepare_train_export_eval_on_slurm(cluster: int,  # noqa: F811
                                                           tmp_path: Path) -> None:
    run_name, port = unique("stages"), free_port()
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(JOBGEN_EXE), "submit", "neox20b", "--smoke", "--nodes", "1", "--stages",
         ",".join(STAGES), "--run-name", run_name, "--set", f"job.master_port={port}", "--wait"],
        cwd=tmp_path, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    # The job ids come first (then --wait follows the last job): while the later jobs wait,
    # each one's dependency is the job before it.
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    first = proc.stdout.readline() if ready else ""
    ids = first.split()
    SUBMITTED.extend(ids)
    if len(ids) != len(STAGES) or not all(i.isdigit() for i in ids):
        proc.kill()
        pytest.fail(f"submit printed {first!r}; stderr: {proc.communicate()[1]}", pytrace=False)
    pending = {ids[k]: _dependency(ids[k]) for k in range(1, len(ids))}
    try:
        out, err = proc.communicate(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"submit --wait did not return in {JOB_TIMEOUT} s: {err[-2000:]}",
                    pytrace=False)
    wall = time.monotonic() - started
    jobs = {stage: Job(job_id, tmp_path, run_name, port, time.time(), stage)
            for stage, job_id in zip(STAGES, ids)}
    if proc.returncode != 0:   # each stage's state and output (a failed one cancels the rest)
        pytest.fail(f"--wait exited {proc.returncode}: {err[-2000:]}\n" + "\n".join(
            explain(job, f"the {stage} job") for stage, job in jobs.items()), pytrace=False)
    assert f"job {ids[-1]}: COMPLETED" in err
    assert sorted(ids, key=int) == ids            # submitted in pipeline order
    for k in range(1, len(ids)):
        assert re.fullmatch(rf"afterok:{ids[k - 1]}(_\*)?\(unfulfilled\)", pending[ids[k]]), \
            f"job {ids[k]} ({STAGES[k]}) right after submit: Dependency={pending[ids[k]]}"

    # Accounting: the four jobs by name, each completed, each started once the one before ended.
    rows = wait_until(jobs["eval"], lambda: _accounting(ids), "accounting of the four jobs", 60)
    for k, (job_id, name) in enumerate(zip(ids, JOB_NAMES)):
        assert rows[job_id][:3] == [name, "COMPLETED", "0:0"], (job_id, rows[job_id])
        if k:
            assert rows[job_id][3] >= rows[ids[k - 1]][4], rows
    outs = {stage: tmp_path / f"{name}-{job_id}.out"
            for stage, name, job_id in zip(STAGES, JOB_NAMES, ids)}
    text = {stage: path.read_text(encoding="utf-8", errors="replace")
            for stage, path in outs.items()}

    # prepare: the dataset at the recipe's paths, under the submission folder.
    made = re.search(r"prepare-data: jobgen-data/gpt2/my-gpt2_text_document\.bin/\.idx: "
                     r"\d+ documents, (\d+) tokens of uint16", text["prepare"])
    assert made, explain(jobs["prepare"], "the prepare job made no dataset")
    prefix = tmp_path / "jobgen-data/gpt2/my-gpt2_text_document"
    assert Path(f"{prefix}.bin").stat().st_size == 2 * int(made.group(1))
    assert Path(f"{prefix}.idx").is_file()
    # train: the nodes' data check passed on that dataset before the compile pass, and both
    # passes read it (not made-up batches).
    checked = "data: recipes/neox20b.yaml: data.path: 1 shard(s) of uint16, "
    line = next((x for x in text["train"].splitlines() if x.startswith(checked)), "")
    assert f" samples, {int(made.group(1)):,} tokens, " in line, explain(jobs["train"], line)
    assert text["train"].index(checked) < text["train"].index("jobgen[node 0]: compile pass"), \
        explain(jobs["train"], "the data check did not come before the compile pass")
    train = jobs["train"]
    train_events = train.events(0, "train")
    for events in (train.events(0, "compile"), train_events):
        assert [e["data"] for e in only(events, "start")] == ["megatron"], \
            explain(train, "training did not read the prepared dataset")
    assert steps_of(train_events, "train") == list(range(1, MAX_STEPS + 1))

    # export: a proven step, loaded by transformers alone in a fresh interpreter.
    exported = re.search(rf"smoke-export: jobgen-runs/{run_name}/export/step-(\d+): exported "
                         r"and proven", text["export"])
    assert exported, explain(jobs["export"], "no proven export")
    step = int(exported.group(1))
    folder = tmp_path / "jobgen-runs" / run_name / "export" / f"step-{step}"
    loaded = subprocess.run([sys.executable, "-I", "-c", LOAD, str(folder)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, check=False)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    got: dict[str, Any] = json.loads(loaded.stdout.splitlines()[-1])
    assert (got["class"], got["ours"], got["round_trip"]) == ("GPTNeoXForCausalLM", [], True)
    # The tokenizer is the prepared dataset's GPT-2 BPE (its vocab.json), within the model's.
    vocab = json.loads((tmp_path / "jobgen-data/gpt2/gpt2-vocab.json").read_text())
    assert got["vocab"] == vocab and len(vocab) <= got["vocab_size"]
    # The held-out batch is the one the trainer read at the step after (its logged CRC-32),
    # and the model gives the loss the trainer logged there (fp32, one rank).
    (after,) = [e for e in train_events if e["event"] == "step" and e["step"] == step + 1]
    assert [got["crc32"]] == after["data_crc32"]
    mean = sum(got["losses"]) / len(got["losses"])
    assert math.isclose(mean, after["loss"], rel_tol=1e-4), (mean, after["loss"])

    # eval: that folder scored, its results file and the job's last line agree.
    scored = re.search(rf"eval-lm: jobgen-runs/{run_name}/eval/step-{step}\.json: step {step}, "
                       r"\d+ tokens: jobgen_smoke_choice acc ([\d.]+)", text["eval"])
    assert scored, explain(jobs["eval"], "the eval job scored nothing")
    results = json.loads((tmp_path / "jobgen-runs" / run_name / "eval" /
                          f"step-{step}.json").read_text())
    assert results["jobgen"]["step"] == step and results["jobgen"]["proven"] is True
    assert math.isclose(results["results"]["jobgen_smoke_choice"]["acc,none"],
                        float(scored.group(1)), abs_tol=5e-4)

    # status and logs of the run by its name: each stage's job, in order.
    status = run_cli(tmp_path, "status", run_name)
    assert status.returncode == 0, status.stderr
    want = []
    for stage, job_id in zip(STAGES, ids):
        want += [f"{stage}: job {job_id}: COMPLETED, exit 0:0, nodes {rows[job_id][5]}",
                 f"{stage}: output {outs[stage]}"]
    assert status.stdout.splitlines() == want
    logs = run_cli(tmp_path, "logs", run_name)
    assert logs.returncode == 0, logs.stderr
    at = 0
    for stage, job_id in zip(STAGES, ids):   # each job's header, then its output file's text
        header = f"jobgen: the {stage} stage's job {job_id}\n"
        assert header in logs.stdout[at:], (stage, logs.stdout[-3000:])
        at = logs.stdout.index(header, at) + len(header)
        assert logs.stdout[at:].startswith(text[stage].splitlines()[0]), stage
    FIGURES["submit --stages prepare,train,export,eval --wait, 1 node (submit to the end)"] = (
        f"{wall:.1f} s; jobs: " + ", ".join(f"{s} {rows[i][3][11:]}-{rows[i][4][11:]}"
                                            for s, i in zip(STAGES, ids)))
