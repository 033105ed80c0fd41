"""The eval program (payload/common/eval_lm.py: lm-eval on an exported step, offline), the task
it rehearses with (payload/smoke/eval_task.py), and the recipe's eval: section."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import need

from jobgen.inputs import recipe as recipes
from jobgen.plumbing.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "payload" / "common" / "eval_lm.py"
TASK = ROOT / "payload" / "smoke" / "eval_task.py"
TASK_NAME = "jobgen_smoke_choice"


def run(program: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A payload program as the job runs it: the nodes' interpreter, by path."""
    return subprocess.run([sys.executable, str(program), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, check=False)


def fake_export(folder: Path, model_class: str = "GPTNeoXForCausalLM",
                record: str | None = None) -> Path:
    """A folder with an export's config and record only (the refusals never load weights)."""
    folder.mkdir(parents=True)
    model_type = "bert" if model_class.startswith("Bert") else "gpt_neox"
    (folder / "config.json").write_text(json.dumps({"model_type": model_type,
                                                    "architectures": [model_class]}))
    (folder / "jobgen-export.json").write_text(
        record if record is not None else json.dumps({"step": 4, "consumed_samples": 16}))
    return folder


def refused(tmp_path: Path, *args: str) -> str:
    """Run the program on bad input: one line, exit 2 (78 with --on-node), nothing written."""
    out = tmp_path / "eval" / "step-4.json"
    lines = []
    for extra, code in (((), 2), (("--on-node",), 78)):
        result = run(EVAL, *args, "--output", str(out), *extra, cwd=tmp_path)
        assert (result.returncode, result.stdout) == (code, ""), result.stderr
        assert len(result.stderr.splitlines()) == 1, result.stderr
        lines.append(result.stderr)
    assert not (tmp_path / "eval").exists()
    assert lines[0] == lines[1]
    return lines[0]


def test_a_missing_model_folder_is_one_line(tmp_path: Path) -> None:
    line = refused(tmp_path, "--model", str(tmp_path / "nope"), "--tasks", "piqa")
    assert line == f"eval-lm: error: --model {tmp_path / 'nope'}: no such folder\n"


@pytest.mark.parametrize("text", ["not json", json.dumps({"step": 4}), ""])
def test_an_unreadable_export_record_is_one_line(tmp_path: Path, text: str) -> None:
    model = fake_export(tmp_path / "step-4", record=text)
    line = refused(tmp_path, "--model", str(model), "--tasks", "piqa")
    assert line == (f"eval-lm: error: {model / 'jobgen-export.json'}: missing or unreadable "
                    "(no step and consumed samples): not a folder jobgen's export wrote\n")


def test_a_folder_without_a_config_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    line = refused(tmp_path, "--model", str(tmp_path / "run"), "--tasks", "piqa")
    assert line.startswith(f"eval-lm: error: {tmp_path / 'run' / 'config.json'}: missing or ")


@pytest.mark.parametrize(("tasks", "says"), [
    ("piqa=five", "--tasks: piqa=five: the few-shot count must be a whole number"),
    ("piqa=-1", "--tasks: piqa: -1 few-shot examples; must lie in [0, 64]"),
    ("mmlu=65", "--tasks: mmlu: 65 few-shot examples; must lie in [0, 64]"),
    (",", "--tasks: names no task")])
def test_bad_shot_counts_are_one_line(tmp_path: Path, tasks: str, says: str) -> None:
    model = fake_export(tmp_path / "step-4")
    assert refused(tmp_path, "--model", str(model), "--tasks", tasks) == \
        f"eval-lm: error: {says}\n"


def test_an_encoder_is_refused_with_what_it_gets_instead(tmp_path: Path) -> None:
    model = fake_export(tmp_path / "step-4", model_class="BertForPreTraining")
    line = refused(tmp_path, "--model", str(model), "--tasks", "piqa")
    assert line == (f"eval-lm: error: {model}: a bert model (BertForPreTraining), not a causal "
                    "language model: lm-eval's tasks score a continuation's log-likelihood "
                    "given its context, which an encoder does not compute; not evaluated (its "
                    "masked-LM loss on the run's data is the proof in jobgen-export.json)\n")


def test_the_generated_task_is_the_same_for_a_seed_and_written_whole(tmp_path: Path) -> None:
    need("yaml")
    for folder in ("a", "b"):
        result = run(TASK, "--out", str(tmp_path / folder), "--seed", "7", "--docs", "12",
                     cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert sorted(p.name for p in (tmp_path / folder).iterdir()) == [TASK_NAME]
    a, b = (tmp_path / f / TASK_NAME for f in ("a", "b"))
    assert (a / "test.jsonl").read_text() == (b / "test.jsonl").read_text()
    docs = [json.loads(line) for line in (a / "test.jsonl").read_text().splitlines()]
    assert len(docs) == 12
    for doc in docs:   # one grammatical ending, three of its words reordered
        right = doc["choices"][doc["gold"]]
        assert len(set(doc["choices"])) == 4
        assert all(sorted(c.split()) == sorted(right.split()) for c in doc["choices"])


# The recipe's eval: section.

def _load(name: str, *overrides: str) -> recipes.Recipe:
    return recipes.load(name, list(overrides))[0]


def test_llama_carries_hlats_table_and_the_neox_recipes_a_small_default() -> None:
    tasks = dict(_load("llama2-7b").eval.tasks)
    assert (tasks["mmlu"], tasks["bbh_fewshot"], tasks["gsm8k"]) == (5, 3, 8)
    assert {tasks[t] for t in ("nq_open", "triviaqa")} == {5}
    assert {tasks[t] for t in ("arc_challenge", "hellaswag", "piqa", "winogrande", "boolq")} == {0}
    for name in ("neox20b", "pythia6.9b"):
        assert dict(_load(name).eval.tasks) == {"lambada_openai": 0, "piqa": 0, "arc_easy": 0,
                                                "winogrande": 0}
    for name in ("bert-large", "bert1.5b"):
        assert dict(_load(name).eval.tasks) == {}


@pytest.mark.parametrize(("override", "says"), [
    ("eval.tasks.mmlu=65",
     "recipes/pythia6.9b.yaml: eval.tasks.mmlu: 65 few-shot examples; must lie in [0, 64]"),
    ("eval.tasks.mmlu=-1",
     "recipes/pythia6.9b.yaml: eval.tasks.mmlu: -1 few-shot examples; must lie in [0, 64]"),
    ("eval.tasks.mmlu=five", "--set: eval.tasks.mmlu: expected an integer, got 'five'"),
    ("eval.shots=5", "--set: eval.shots: unknown key (known keys: tasks)"),
    ("eval.tasks.a$b=0", "recipes/pythia6.9b.yaml: eval.tasks.a$b: not an lm-eval task name "
                         "(must match ^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$)")])
def test_bad_eval_sections_are_one_line(override: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load("pythia6.9b", override)
    assert str(caught.value) == says


def test_an_encoder_recipe_refuses_eval_tasks() -> None:
    with pytest.raises(ConfigError) as caught:
        _load("bert-large", "eval.tasks.piqa=0")
    assert str(caught.value) == (
        "recipes/bert-large.yaml: eval.tasks: model.family bert is an encoder, and lm-eval's "
        "tasks score a causal language model's log-likelihoods: leave eval: out")


def test_the_eval_section_is_not_a_training_value() -> None:
    from jobgen.runs import runrecord

    base, more = _load("pythia6.9b"), _load("pythia6.9b", "eval.tasks.mmlu=5")
    assert runrecord.suffix(base) == runrecord.suffix(more)


# The real thing: a smoke model trained, exported, and scored by lm-eval's code, offline.

@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need("torch", "transformers", "tokenizers", "safetensors", "lm_eval", "accelerate")
    from test_export import export, smoke_run

    folder = smoke_run(tmp_path_factory.mktemp("eval"), "gpt_neox")
    result = export(folder, "--step", "8")
    assert result.returncode == 0, result.stderr
    tasks = run(TASK, "--out", str(folder / "tasks"), "--seed", "11", "--docs", "24",
                cwd=folder)
    assert tasks.returncode == 0, tasks.stderr
    return folder


def _results(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.slow   # trains, exports, then runs lm-eval (about a minute)
def test_an_exported_step_is_scored_by_lm_eval_offline(exported: Path) -> None:
    model = exported / "export" / "step-8"
    out = exported / "run" / "eval" / "step-8.json"
    result = run(EVAL, "--model", str(model), "--tasks", f"{TASK_NAME}=2",
                 "--tasks-dir", str(exported / "tasks"), "--output", str(out),
                 "--batch-size", "8", cwd=exported)
    assert result.returncode == 0, result.stderr[-3000:]
    body = _results(out)
    scores = body["results"][TASK_NAME]
    assert 0.0 <= scores["acc,none"] <= 1.0 and "acc_norm,none" in scores
    assert body["n-shot"] == {TASK_NAME: 2}
    assert body["n-samples"][TASK_NAME]["effective"] == 24
    assert body["configs"][TASK_NAME]["dataset_path"] == "json"
    assert body["lm_eval_version"].startswith("0.4.")
    record = json.loads((model / "jobgen-export.json").read_text())
    job = body["jobgen"]
    assert (job["step"], job["consumed_samples"]) == (8, record["consumed_samples"])
    assert job["tokens"] == record["consumed_samples"] * 32   # the smoke trainer's sequence
    assert job["proven"] is True and job["model_type"] == "gpt_neox"
    assert result.stdout == (f"eval-lm: {out}: step 8, {job['tokens']} tokens: {TASK_NAME} acc "
                             f"{scores['acc,none']:.4g}\n")
    assert sorted(p.name for p in out.parent.iterdir()) == ["step-8.json"]   # no temporary
    # `jobgen report` reads what lm-eval really wrote (its fast tests write the same shape).
    run_dir = exported / "reported"
    (run_dir / "train").mkdir(parents=True, exist_ok=True)
    (run_dir / "eval").mkdir(exist_ok=True)
    (run_dir / "train" / "metrics.jsonl").write_bytes(
        (exported / "run" / "metrics.jsonl").read_bytes())
    (run_dir / "eval" / "step-8.json").write_bytes(out.read_bytes())
    shown = subprocess.run([str(Path(sys.executable).with_name("jobgen")), "report",
                            "--run-dir", str(run_dir), "--json"], capture_output=True,
                           text=True, check=False)
    assert shown.returncode == 0, shown.stderr
    (entry,) = json.loads(shown.stdout)["eval"]
    (score,) = entry["scores"]
    assert (entry["step"], entry["tokens"]) == (8, job["tokens"])
    assert (score["task"], score["metric"], score["shots"]) == (TASK_NAME, "acc", 2)
    assert score["value"] == scores["acc,none"]
    assert score["stderr"] == scores["acc_stderr,none"]


@pytest.mark.slow   # lm-eval indexes its own tasks first (about 25 s)
def test_a_task_lm_eval_does_not_have_is_one_line(tmp_path: Path) -> None:
    """The tasks are looked up before any model is loaded: a folder with an export's config
    is enough (the 78 of --on-node is the fast refusals' check)."""
    need("lm_eval")
    model = fake_export(tmp_path / "export" / "step-8", record=json.dumps(
        {"step": 8, "consumed_samples": 16, "tokens": 512}))
    tasks = run(TASK, "--out", str(tmp_path / "tasks"), "--seed", "11", cwd=tmp_path)
    assert tasks.returncode == 0, tasks.stderr
    out = tmp_path / "eval" / "step-8.json"
    result = run(EVAL, "--model", str(model), "--tasks", f"{TASK_NAME},no_such_task",
                 "--tasks-dir", str(tmp_path / "tasks"), "--output", str(out), cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("eval-lm: error: --tasks: no_such_task: no such task, group or tag "
                           "in lm-eval 0.4.")
    assert line.endswith(f"'s tasks or in --tasks-dir {tmp_path / 'tasks'}")
    assert not (tmp_path / "eval").exists()
