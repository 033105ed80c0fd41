"""The eval stage (issue 51, item 3), fast: what `jobgen render|submit RECIPE --stage(s) eval`
renders (payload/common/eval_step.py, then eval_lm.py on RUN/export/step-N), the chain after
training and export, the site's folders, and what is refused before anything runs; the export
stage's default step (the newest that can be proven). The slow journey, train -> export -> eval
through the console script, is in tests/test_export_stage.py."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jobgen import api
from jobgen.backends.local import stage as local_stage
from jobgen.inputs import recipe as recipes
from jobgen.plumbing.errors import ConfigError
from tests.test_rehearsal_data import jobgen, ok

ROOT = Path(__file__).resolve().parents[1]
SHELLCHECK = Path(sys.executable).parent / "shellcheck"
EVAL_STEP = ROOT / "payload" / "common" / "eval_step.py"
RUN = "/fsx/jobgen/runs"


def _args(script: str) -> list[str]:
    found = re.search(r"^ARGS=\(\n(.*?)^\)\n", script, re.M | re.S)
    assert found is not None, script
    return [w.strip() for w in found.group(1).splitlines()]


def _split(words: list[str]) -> tuple[dict[str, str], list[str], dict[str, str]]:
    """eval_step.py's own flags (name -> value), its bare flags, and eval_lm.py's (after --)."""
    cut = words.index("--")
    own, lm = words[:cut], words[cut + 1:]
    bare = [w for i, w in enumerate(own) if w.startswith("--") and
            (i + 1 == len(own) or own[i + 1].startswith("--"))]
    pairs = {w: own[i + 1] for i, w in enumerate(own) if w.startswith("--") and w not in bare}
    lm_bare = [w for i, w in enumerate(lm) if w.startswith("--") and
               (i + 1 == len(lm) or lm[i + 1].startswith("--"))]
    return pairs, bare, {**{w: lm[i + 1] for i, w in enumerate(lm)
                            if w.startswith("--") and w not in lm_bare},
                         **{w: "" for w in lm_bare}}


def test_a_rehearsals_eval_job_makes_its_task_and_scores_the_step_and_passes_shellcheck(
        tmp_path: Path) -> None:
    text = ok(jobgen(tmp_path, "render", "neox20b", "--smoke", "--site", "trn1-pcluster",
                     "--stage", "eval", "--step", "8"))
    assert "#SBATCH --nodes=1\n" in text and "#SBATCH --array" not in text
    assert "#SBATCH --job-name=neox20b-smoke-eval\n" in text
    assert "PROGRAM=common/eval_step.py\n" in text
    own, bare, lm = _split(_args(text))
    run = f"{RUN}/neox20b-4n-smoke"
    assert own == {"--export-root": f"{run}/export", "--eval-root": f"{run}/eval",
                   "--step": "8", "--smoke-task-seed": "1234"}
    assert bare == ["--on-node"]
    # The task smoke/eval_task.py makes, not the recipe's (they need the hub's datasets).
    assert lm == {"--tasks": "jobgen_smoke_choice=0", "--tasks-dir": f"{run}/eval/tasks"}
    (tmp_path / "eval.sbatch").write_text(text)
    lint = subprocess.run([str(SHELLCHECK), str(tmp_path / "eval.sbatch")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert lint.returncode == 0, lint.stdout
    # Without --step the job takes the newest complete export when it starts.
    newest = ok(jobgen(tmp_path, "render", "neox20b", "--smoke", "--site", "trn1-pcluster",
                       "--stage", "eval"))
    assert "--step" not in _split(_args(newest))[0]


def test_a_recipes_eval_job_names_its_tasks_and_the_sites_offline_folders(
        tmp_path: Path) -> None:
    site = yaml.safe_load((ROOT / "env" / "sites" / "trn1-pcluster.yaml").read_text())
    site["name"] = "evalsite"
    site["paths"].update(hf_home="/fsx/hf-home", eval_tasks_dir="/fsx/lm-eval-tasks",
                         hub_access=True)
    (tmp_path / "evalsite.yaml").write_text(yaml.safe_dump(site))
    for name in ("llama2-7b", "pythia6.9b"):
        text = ok(jobgen(tmp_path, "render", name, "--site", "./evalsite.yaml", "--stage",
                         "eval"))
        own, bare, lm = _split(_args(text))
        tasks = recipes.load(name)[0].eval.tasks
        assert tasks and lm == {"--tasks": ",".join(f"{t}={k}" for t, k in tasks.items()),
                                "--tasks-dir": "/fsx/lm-eval-tasks", "--hf-home": "/fsx/hf-home",
                                "--allow-hub": ""}
        assert "--smoke-task-seed" not in own and bare == ["--on-node"]
    assert "mmlu=5" in _split(_args(ok(jobgen(tmp_path, "render", "llama2-7b", "--stage",
                                                "eval", "--site", "trn1-pcluster"))))[2]["--tasks"]
    # A site without them: lm-eval's own cache, no hub.
    plain = _split(_args(ok(jobgen(tmp_path, "render", "pythia6.9b", "--site", "trn1-pcluster",
                                   "--stage", "eval"))))[2]
    assert set(plain) == {"--tasks"}


def test_train_export_eval_chain_each_after_the_one_before(tmp_path: Path) -> None:
    script = ok(jobgen(tmp_path, "submit", "neox20b", "--smoke", "--site", "trn1-pcluster",
                       "--stages", "train,export,eval", "--step", "8", "--dry-run"))
    names = re.findall(r"^#SBATCH --job-name=(\S+)$", script, re.M)
    assert names == ["neox20b-smoke", "neox20b-smoke-export", "neox20b-smoke-eval"]
    deps = re.findall(r"^job_(\d)=\$\(sbatch --parsable(?: \"--dependency=afterok:\$\{job_(\d)"
                      r"%%;\*\}\")?", script, re.M)
    assert deps == [("1", ""), ("2", "1"), ("3", "2")]
    assert script.count("  --step\n  8\n") == 2      # the step exported is the step scored
    calls = json.loads(ok(jobgen(tmp_path, "submit", "neox20b", "--smoke", "--backend", "batch",
                                 "--stages", "train,export,eval", "--dry-run")))["calls"]
    jobs = [c["request"] for c in calls if c["operation"] == "SubmitJob"]
    assert [(j["jobName"], j.get("dependsOn")) for j in jobs] == [
        ("neox20b-4n-smoke", None),
        ("neox20b-4n-smoke-export", [{"jobId": "<job id of the train job 1>"}]),
        ("neox20b-4n-smoke-eval", [{"jobId": "<job id of the export job 1>"}])]
    definitions = [c["request"] for c in calls if c["operation"] == "RegisterJobDefinition"]
    command = definitions[-1]["containerProperties"]["command"]
    assert command[1].endswith("/common/eval_step.py") and "--smoke-task-seed" in command


@pytest.mark.parametrize("args, line", [
    (["render", "bert1.5b", "--smoke", "--stage", "eval"],
     "error: recipes/bert1.5b.yaml: --stage eval: a BERT model is an encoder, and lm-eval's "
     "tasks score a causal language model's continuations (the recipe names no eval tasks); "
     "its export's proof, the masked-LM loss on the run's data, is its score "
     "(docs/model-out.md)"),
    (["submit", "bert-large", "--stages", "train,eval", "--dry-run"],
     "error: recipes/bert-large.yaml: --stage eval: a BERT model is an encoder, and lm-eval's "
     "tasks score a causal language model's continuations (the recipe names no eval tasks); "
     "its export's proof, the masked-LM loss on the run's data, is its score "
     "(docs/model-out.md)"),
    (["render", "pythia6.9b", "--stage", "eval", "--set", "eval.tasks={}"],
     "error: recipes/pythia6.9b.yaml: eval.tasks names no task (--stage eval scores the tasks "
     "the recipe's eval: section names)"),
    (["run", "neox20b", "--stage", "eval"],
     "error: --stage eval: on this machine it scores a rehearsal's exports (add --smoke)"),
    (["run", "neox20b", "--smoke", "--nodes", "1", "--stage", "eval"],
     "error: jobgen-runs/neox20b-1n-smoke/export: no complete export to evaluate (export "
     "first: jobgen run neox20b --smoke --stage export)"),
])
def test_where_the_eval_stage_cannot_run_it_says_so_in_one_line(tmp_path: Path,
                                                                 args: list[str],
                                                                 line: str) -> None:
    done = jobgen(tmp_path, *args)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")
    assert not (tmp_path / "jobgen-runs").exists()


def test_a_step_not_exported_or_still_being_written_is_refused_before_anything_runs(
        tmp_path: Path) -> None:
    export = tmp_path / "jobgen-runs" / "neox20b-1n-smoke" / "export"
    (export / "step-8").mkdir(parents=True)
    (export / "step-8" / "jobgen-export.json").write_text("{}\n")
    (export / ".step-12.tmp-99").mkdir()                 # an export still being written
    (export / "step-12").mkdir()                         # a folder without its record
    for step in ("12", "4"):
        done = jobgen(tmp_path, "run", "neox20b", "--smoke", "--nodes", "1", "--stage", "eval",
                      "--step", step)
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == (f"error: --step {step}: jobgen-runs/neox20b-1n-smoke/export has "
                               f"no complete export of step {step} (complete: 8)\n")
    assert not (export.parent / "eval").exists()
    assert not (export.parent / "jobgen-run.json").exists()


def _eval_step(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(EVAL_STEP), "--export-root",
                           str(tmp_path / "export"), "--eval-root", str(tmp_path / "eval"),
                           *args], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False)


def test_on_a_node_the_job_refuses_a_missing_export_in_one_line_78(tmp_path: Path) -> None:
    none = _eval_step(tmp_path, "--on-node", "--", "--tasks", "piqa=0")
    assert (none.returncode, none.stdout) == (78, "")
    assert none.stderr == (f"eval-step: error: {tmp_path / 'export'}: no complete export to "
                           "evaluate (the export stage writes step-N folders there)\n")
    (tmp_path / "export" / "step-4").mkdir(parents=True)
    (tmp_path / "export" / "step-4" / "jobgen-export.json").write_text("{}\n")
    other = _eval_step(tmp_path, "--step", "8", "--", "--tasks", "piqa=0")
    assert (other.returncode, other.stdout) == (2, "")
    assert other.stderr == (f"eval-step: error: --step 8: {tmp_path / 'export'} has no "
                            "complete export of step 8 (complete: 4)\n")
    clash = _eval_step(tmp_path, "--", "--tasks", "piqa=0", "--model", "x")
    assert (clash.returncode, clash.stderr) == (
        2, "eval-step: error: --model: given by eval-step (the step's folder, its results "
           "file), not after --\n")
    # The step found, eval_lm.py's own refusal follows (the record is not an export's).
    found = _eval_step(tmp_path, "--", "--tasks", "piqa=0")
    assert found.returncode == 2 and found.stdout.startswith("eval-step: step 4 (the newest ")
    assert found.stderr.startswith("eval-lm: error: ")
    assert not (tmp_path / "eval").exists()


# --- the export stage's default: the newest sealed step that can be proven ---------------------

def _sealed(root: Path, *steps: int) -> None:
    for step in steps:
        folder = root / f"step_{step:08d}"
        folder.mkdir(parents=True)
        (folder / "COMPLETE").write_text(json.dumps({"step": step, "consumed_samples": 0}))


def _logged(metrics: Path, *steps: int) -> None:
    metrics.write_text("".join(json.dumps({"event": "step", "phase": "train", "step": s,
                                           "loss": 5.0}) + "\n" for s in steps))


def test_the_export_program_defaults_to_the_newest_step_it_can_prove(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "payload"))
    try:
        from common import export_hf
    finally:
        sys.path.remove(str(ROOT / "payload"))
    root, metrics = tmp_path / "checkpoints", tmp_path / "metrics.jsonl"
    _sealed(root, 4, 8, 12)
    _logged(metrics, *range(1, 13))          # a finished run: no step 13
    export_hf.CHOSEN.clear()
    assert export_hf.sealed_step(root, None, metrics, "smoke-export").step == 8
    assert export_hf.sealed_step(root, 12, metrics, "smoke-export").step == 12
    # Said once the export is done (export_hf.run), so that a refusal stays one line.
    assert export_hf.CHOSEN == ["smoke-export: step 8, the newest sealed step that can be "
                                "proven: the trainer logged no step 13 after the newest, 12 "
                                "(--step 12 exports it unproven)"]
    _logged(metrics, 1, 2, 3)                # none can be proven: the newest, unproven
    assert export_hf.sealed_step(root, None, metrics).step == 12


def test_jobgen_run_defaults_to_the_newest_step_it_can_prove(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.chdir(tmp_path)
    spec = api.job_spec("neox20b", 1, smoke=True, site="local")
    train = Path(spec.run_dir, "train")
    _sealed(train / "checkpoints", 16, 20, 24)
    _logged(train / "metrics.jsonl", *range(1, 25))
    said: list[str] = []
    assert local_stage.sealed_step(spec, None, said.append) == 20
    assert said == ["export: step 20, the newest sealed step that can be proven: the trainer "
                    "logged no step 25 after the newest, 24 (--step 24 exports it unproven)"]
    assert local_stage.sealed_step(spec, 24, said.append) == 24 and len(said) == 1
    (train / "metrics.jsonl").unlink()
    assert local_stage.sealed_step(spec, None, said.append) == 24 and len(said) == 1
    with pytest.raises(ConfigError):
        local_stage.sealed_step(spec, 8)
