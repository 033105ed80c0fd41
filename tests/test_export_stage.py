"""The export stage (issue 51, item 1): `jobgen render|submit|run RECIPE --stage export [--step N]`
runs the payload's export program (payload/smoke/export_smoke.py for the rehearsals) with the
training pass's own flags into RUN/export/step-N/; the slow test goes on to the eval stage
(tests/test_eval_stage.py has its fast ones). The console script, a fresh working folder and the
local site, as a user types it (jobgen/payloads/stages.py, jobgen/backends/local/stage.py).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_export import LOAD_ALONE
from tests.test_rehearsal_data import _port, jobgen, ok

SHELLCHECK = Path(sys.executable).parent / "shellcheck"


# --- fast: what the stage renders, and what it refuses ----------------------------------------

def test_the_export_job_runs_the_smoke_export_with_the_trainers_flags_and_passes_shellcheck(
        tmp_path: Path) -> None:
    done = jobgen(tmp_path, "render", "neox20b", "--smoke", "--site", "trn1-pcluster",
                  "--stage", "export", "--step", "8")
    text = ok(done)
    assert "#SBATCH --nodes=1\n" in text and "#SBATCH --array" not in text
    assert "PROGRAM=smoke/export_smoke.py\n" in text
    args = re.search(r"^ARGS=\(\n(.*?)^\)\n", text, re.M | re.S)
    assert args is not None
    words = [w.strip() for w in args.group(1).splitlines()]
    pairs = dict(zip(words, words[1:]))
    # The training pass's own folder and model shape, then the export's own flags.
    assert pairs["--output-dir"] == "/fsx/jobgen/runs/neox20b-4n-smoke/train"
    assert (pairs["--family"], pairs["--phase"]) == ("gpt_neox", "train")
    assert pairs["--export-root"] == "/fsx/jobgen/runs/neox20b-4n-smoke/export"
    assert pairs["--step"] == "8" and pairs["--tokenizer-seed"] == "1234"
    assert words[-1] == "--on-node"
    (tmp_path / "export.sbatch").write_text(text)
    lint = subprocess.run([str(SHELLCHECK), str(tmp_path / "export.sbatch")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert lint.returncode == 0, lint.stdout
    # Without --step the program takes the newest sealed step when the job starts.
    newest = ok(jobgen(tmp_path, "render", "neox20b", "--smoke", "--site", "trn1-pcluster",
                       "--stage", "export"))
    assert "  --step\n" not in newest
    # Chained after training: afterok on the training job, which comes first.
    chained = ok(jobgen(tmp_path, "submit", "neox20b", "--smoke", "--site", "trn1-pcluster",
                        "--stages", "train,export", "--dry-run"))
    assert chained.index("--job-name=neox20b-smoke-export\n") > chained.index(
        "--job-name=neox20b-smoke\n") > chained.index("job_1=$(sbatch --parsable <<")
    assert chained.count('"--dependency=afterok:${job_') == 1


def test_the_batch_export_job_is_a_single_node_container_job(tmp_path: Path) -> None:
    jd = json.loads(ok(jobgen(tmp_path, "render", "bert1.5b", "--smoke", "--backend", "batch",
                              "--stage", "export", "--step", "2")))
    command = jd["containerProperties"]["command"]
    assert command[:2] == ["python3", command[1]] and command[1].endswith(
        "/habana_deepspeed/export_bert.py")
    assert command[command.index("--step") + 1] == "2" and command[-1] == "--on-node"
    assert "--tokenizer-seed" in command


@pytest.mark.parametrize("args, line", [
    (["run", "neox20b", "--stage", "export"],
     "error: --stage export: on this machine it exports a rehearsal's checkpoints (add --smoke)"),
    (["run", "neox20b", "--smoke", "--stage", "prepare", "--step", "4"],
     "error: jobgen run: --step is the export and eval stages' (--stage export|eval) (see "
     "'jobgen run --help')"),
    (["render", "neox20b", "--step", "4"],
     "error: jobgen render: --step is the export and eval stages' (--stage export|eval) (see "
     "'jobgen render --help')"),
    (["submit", "neox20b", "--stages", "train", "--step", "4", "--dry-run"],
     "error: jobgen submit: --step is the export and eval stages': add one to --stages (see "
     "'jobgen submit --help')"),
])
def test_where_the_stage_cannot_run_it_says_so_in_one_line(tmp_path: Path, args: list[str],
                                                            line: str) -> None:
    done = jobgen(tmp_path, *args)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")


def test_no_sealed_checkpoint_or_an_unsealed_step_is_refused_before_anything_runs(
        tmp_path: Path) -> None:
    run = tmp_path / "jobgen-runs" / "neox20b-1n-smoke"
    none = jobgen(tmp_path, "run", "neox20b", "--smoke", "--nodes", "1", "--stage", "export")
    assert (none.returncode, none.stdout) == (2, "")
    assert none.stderr == ("error: jobgen-runs/neox20b-1n-smoke/train/checkpoints: no complete "
                           "checkpoint to export (train first: jobgen run neox20b --smoke)\n")
    for step, sealed in ((4, True), (8, False)):    # step 8 is still being written
        folder = run / "train" / "checkpoints" / f"step_{step:08d}"
        folder.mkdir(parents=True)
        if sealed:
            (folder / "COMPLETE").write_text("{}\n")
    late = jobgen(tmp_path, "run", "neox20b", "--smoke", "--nodes", "1", "--stage", "export",
                  "--step", "8")
    assert (late.returncode, late.stdout) == (2, "")
    assert late.stderr == ("error: --step 8: jobgen-runs/neox20b-1n-smoke/train/checkpoints has "
                           "no complete checkpoint of step 8 (complete: 4)\n")
    assert not (run / "export").exists() and not (run / "jobgen-run.json").exists()
    assert ok(jobgen(tmp_path, "runs")).strip().count("\n") == 0      # nothing recorded


# --- slow: a rehearsal trained, exported, then scored, as a user runs them ---------------------

@pytest.mark.slow   # trains a rehearsal (about 20 s), exports twice (about 25 s each), evaluates
def test_a_rehearsal_exports_into_its_run_folder_and_transformers_alone_loads_it(
        tmp_path: Path) -> None:
    port = ("--set", f"job.master_port={_port()}")
    ok(jobgen(tmp_path, "run", "neox20b", "--smoke", "--nodes", "1", *port))
    run = tmp_path / "jobgen-runs" / "neox20b-1n-smoke"
    # The default: the newest sealed step that can be proven (24, the last, has no step after).
    done = jobgen(tmp_path, "run", "neox20b", "--smoke", "--nodes", "1", *port,
                  "--stage", "export")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert ("export: step 20, the newest sealed step that can be proven: the trainer logged no "
            "step 25 after the newest, 24 (--step 24 exports it unproven)\n") in done.stderr
    folder = run / "export" / "step-20"
    assert done.stdout.splitlines()[-1] == (
        "jobgen: the export stage ended with status 0: proven; the model folders are in "
        "jobgen-runs/neox20b-1n-smoke/export (transformers loads each with from_pretrained)")
    assert sorted(p.name for p in (run / "export").iterdir()) == ["step-20"]
    proof = json.loads((folder / "jobgen-export.json").read_text())["proof"]
    assert proof["ok"] is True and proof["precision"] == "fp32"
    # A job of the run: its stage, step and folder in the run's record, its status known.
    (job,) = re.findall(r"job (local-[0-9]+-[0-9]+)\)", done.stderr)
    found = json.loads(ok(jobgen(tmp_path, "status", job, "--json")))
    assert (found["state"], found["run"]["stages"]) == ("COMPLETED", ["export"])
    record = json.loads((run / "jobgen-run.json").read_text())["submissions"][-1]
    assert record["job_stages"] == ["export"]
    assert record["export"] == {
        "step": 20, "folder": str(folder), "status": 0, "outcome": "proven",
        "precision": "fp32", "logged_loss": proof["logged_loss"],
        "measured_loss": proof["measured_loss"]}
    # Anyone can load it: an isolated interpreter, transformers only.
    alone = subprocess.run([sys.executable, "-I", "-c", LOAD_ALONE, str(folder)],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           check=False)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.splitlines()[-2:][1] == "[]"
    assert alone.stdout.splitlines()[-2].startswith("GPTNeoXForCausalLM (1, ")
    # The eval stage scores the newest export with lm-eval's code, on a task made here.
    scored = jobgen(tmp_path, "run", "neox20b", "--smoke", "--nodes", "1", *port,
                    "--stage", "eval")
    assert scored.returncode == 0, scored.stdout[-3000:] + scored.stderr[-3000:]
    results = json.loads((run / "eval" / "step-20.json").read_text())
    acc = results["results"]["jobgen_smoke_choice"]["acc,none"]
    assert 0.0 <= acc <= 1.0 and results["n-shot"] == {"jobgen_smoke_choice": 0}
    assert (results["jobgen"]["step"], results["jobgen"]["proven"]) == (20, True)
    assert ("[eval] eval-lm: jobgen-runs/neox20b-1n-smoke/eval/step-20.json: step 20, "
            in scored.stdout)
    (job,) = re.findall(r"job (local-[0-9]+-[0-9]+)\)", scored.stderr)
    found = json.loads(ok(jobgen(tmp_path, "status", job, "--json")))
    assert (found["state"], found["run"]["stages"]) == ("COMPLETED", ["eval"])
    last = json.loads((run / "jobgen-run.json").read_text())["submissions"][-1]
    assert last["job_stages"] == ["eval"]
    assert last["eval"] == {
        "step": 20, "results": str(run.absolute() / "eval" / "step-20.json"), "status": 0,
        "outcome": "scored", "tokens": results["jobgen"]["tokens"],
        "metrics": {"jobgen_smoke_choice": {"acc": acc}}}
    # The newest step, named: it has no logged step after it: exported, unproven (3).
    newest = jobgen(tmp_path, "run", "neox20b", "--smoke", "--nodes", "1", *port,
                    "--stage", "export", "--step", "24")
    assert newest.returncode == 3, newest.stderr[-3000:]
    assert newest.stdout.splitlines()[-1].startswith(
        "jobgen: the export stage ended with status 3: unproven")
    assert "proof" in json.loads((run / "export" / "step-24" / "jobgen-export.json").read_text())
    last = json.loads((run / "jobgen-run.json").read_text())["submissions"][-1]["export"]
    assert (last["step"], last["outcome"]) == (24, "unproven")


def test_a_bert_runs_export_takes_the_vocabulary_prepare_wrote_and_bert1_5b_is_refused(
        tmp_path: Path) -> None:
    """A BERT run's own export (not a rehearsal's): export_bert.py with the training pass's
    flags and the vocab.txt that the prepare stage writes beside the shards; its own parser
    takes every word. bert1.5b's LayerNorm placement has no BertConfig: refused at render."""
    text = ok(jobgen(tmp_path, "render", "bert-large",
                     "--stage", "export", "--step", "6"))
    assert "PROGRAM=habana_deepspeed/export_bert.py\n" in text
    block = re.search(r"^ARGS=\(\n(.*?)^\)\n", text, re.M | re.S)
    assert block is not None
    words = [w.strip() for w in block.group(1).splitlines()]
    program = Path(__file__).resolve().parents[1] / "payload" / "habana_deepspeed" / \
        "export_bert.py"
    parsed = subprocess.run(
        [sys.executable, "-c", "import runpy, sys; sys.argv[0] = sys.argv.pop(1); "
         "m = runpy.run_path(sys.argv[0]); a = m['parse_args'](sys.argv[1:]); "
         "print(a.tokenizer_files[0], a.input_dir, a.step, a.micro_batches, a.on_node)",
         str(program), *words], capture_output=True, text=True, timeout=120, check=False)
    assert parsed.returncode == 0, parsed.stderr[-2000:]
    vocab, data, step, micro, node = parsed.stdout.split()
    assert vocab == f"{data}/vocab.txt" and "wikicorpus_en" in data
    assert (step, micro, node) == ("6", "8", "True")
    done = jobgen(tmp_path, "render", "bert1.5b", "--stage", "export")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.count("\n") == 1 and "model.layer_norm_large_model" in done.stderr
