"""Hostile strings never execute: every string field of a recipe and of a site profile gets
command substitutions, quote breakers, newlines and expansions; the rendered script is then
EXECUTED with bash, with harmless stand-ins for srun, scontrol, getent, nslookup, torchrun,
neuron_parallel_compile, sudo and sysctl first on PATH (conftest.stub_bin).

Asserted: no canary file appears, and the trainer (torchrun's stand-in) receives each value
verbatim, inside its Hydra override or flag. Fields with a restricted alphabet are refused with
exit status 2 and a message instead. The same stand-ins also check how the job behaves: compile
pass then training pass, the compile cache marker, requeue after a failure, the exit status
through tee, and an unresolvable master address."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from test_nemo_checkpoints import write_ckpt

from jobgen.images import snapshot
from jobgen.inputs.schema import describe

StubBin = Any  # conftest.StubBin, the stub_bin fixture

NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"

# {c} is the canary folder: it exists, so a hostile command that runs leaves a file there.
HOSTILE = {
    "dollar-paren": "$(touch {c}/a)",
    "backticks": "`touch {c}/b`",
    "single-quotes": "'; touch {c}/c; '",
    "double-quotes": '"; touch {c}/d; "',
    "newline": "x\ntouch {c}/e",
    "semicolon": ";touch {c}/f",
    "quoted-substitution": '"$(touch {c}/g)"',
    "home": "$HOME",
    "braces": "${HOME}/x",
    "tilde": "~/x",
    "glob": "*",
}

# The site the rendered scripts run on: every path relative to the submission directory.
BENIGN_SITE = {
    "name": "hostile-test",
    "description": "a scratch site",
    "slurm": {"cpus_per_task": 1, "max_nodes": 4, "master_resolver": "getent"},
    "paths": {"work_dir": "runs", "data_dir": "data", "compile_cache": "cache",
              "nemo_dir": "nemo", "nxd_llama_dir": "nxd"},
    # The scratch disk holds no 20B checkpoint: the health gate asks for a little room.
    "health": {"shared_free_gib": 0.01, "local_free_gib": 0.01},
}
LOCAL_CACHE = "local-cache"   # under the submission directory, given as an absolute path
NEMO_PROGRAM = "megatron_gpt_pretraining.py"
NXD_PROGRAM = "tp_zero1_llama_hf_pretrain.py"


# --- reading what the trainer got -----------------------------------------------------------------

def trainer_argv(call: dict[str, Any]) -> tuple[str, list[str]]:
    """torchrun's own flags come in pairs; then the program and its arguments."""
    argv = call["argv"]
    i = 0
    while argv[i].startswith("--"):
        i += 2
    return argv[i], argv[i + 1:]


def overrides(call: dict[str, Any]) -> dict[str, str]:
    _, args = trainer_argv(call)
    return dict(a.split("=", 1) for a in args)


def flags(call: dict[str, Any]) -> dict[str, str]:
    _, args = trainer_argv(call)
    return {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}


def hydra_read(value: str) -> Any:
    """A Hydra override value as the config will hold it: parsed by Hydra's own override parser,
    then resolved by OmegaConf (where ``${...}`` would be an interpolation)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    parsed = OverridesParser.create().parse_override("key=" + value).value()
    return OmegaConf.to_container(OmegaConf.create({"key": parsed}), resolve=True)["key"]


def hydra_string(value: str) -> str:
    read = hydra_read(value)
    assert isinstance(read, str), f"Hydra reads {value!r} as {type(read).__name__} {read!r}"
    return read


def hydra_list(value: str) -> list[str]:
    read = hydra_read(value)
    assert isinstance(read, list) and len(read) == 2, value   # [weight, path]
    assert isinstance(read[1], str), f"Hydra reads the path {read[1]!r} as not a string"
    return [str(read[0]), read[1]]


# --- fields ---------------------------------------------------------------------------------------

@dataclass
class Job:
    """One rendered and executed job."""
    submit: Path
    script: str
    calls: list[dict[str, Any]]
    stderr: str


@dataclass
class Field:
    recipe: str                                       # neox20b (NeMo) or llama2-7b (NxD)
    recipe_changes: Callable[[str], dict[str, Any]] = lambda h: {}
    site_changes: Callable[[Path, str], dict[str, Any]] = lambda submit, h: {}
    prepare: Callable[[Path, str], None] = lambda submit, h: None
    check: Callable[[Job, str], None] = lambda job, h: None


def _both(job: Job, what: Callable[[dict[str, Any]], Any], expected: Any) -> None:
    assert [what(c) for c in job.calls] == [expected, expected]


def _check_work_dir_nemo(job: Job, h: str) -> None:
    logs = [hydra_string(overrides(c)["exp_manager.explicit_log_dir"]) for c in job.calls]
    assert logs == [f"{h}/neox20b-1n/compile", f"{h}/neox20b-1n/nemo"]
    train_log = job.submit / h / "neox20b-1n" / "logs" / "4242" / "restart-0" / "node-0"
    assert "torchrun stand-in" in (train_log / "train.log").read_text()


def _check_work_dir_nxd(job: Job, h: str) -> None:
    _both(job, lambda c: flags(c)["--model-config"], f"{h}/llama2-7b-1n/model/config.json")
    config = json.loads((job.submit / h / "llama2-7b-1n" / "model" / "config.json").read_text())
    assert config["num_hidden_layers"] == 32 and config["model_type"] == "llama"


def _payload_link(submit: Path, h: str) -> None:
    snapshot.place(str(submit / h), snapshot.digest())   # the job's payload snapshot


def _trainer_dir(program: str) -> Callable[[Path, str], None]:
    def make(submit: Path, h: str) -> None:
        (submit / h).mkdir(parents=True, exist_ok=True)
        (submit / h / program).write_text("")
    return make


def _activate_file(submit: Path, h: str) -> None:
    (submit / h).parent.mkdir(parents=True, exist_ok=True)
    (submit / h).write_text("export STUB_ACTIVATED=yes\n")


def _check_title(job: Job, h: str) -> None:
    title = "# " + json.dumps(f"neox20b: {h}")
    assert title + "\n" in job.script          # one comment line, whatever the description holds


FIELDS: dict[str, Field] = {
    # --- recipe ---
    "description": Field("neox20b", lambda h: {"description": h}, check=_check_title),
    "data.path (NeMo)": Field(
        "neox20b", lambda h: {"data.path": h},
        check=lambda job, h: _both(
            job, lambda c: hydra_list(overrides(c)["model.data.data_prefix"]),
            ["1.0", f"data/{h}"])),
    "data.path (NxD)": Field(
        "llama2-7b", lambda h: {"data.path": h},
        check=lambda job, h: _both(job, lambda c: flags(c)["--data-dir"], f"data/{h}")),
    "data.vocab_file": Field(
        "neox20b", lambda h: {"data.vocab_file": h},
        check=lambda job, h: _both(
            job, lambda c: hydra_string(overrides(c)["model.tokenizer.vocab_file"]), f"data/{h}")),
    "data.merge_file": Field(
        "neox20b", lambda h: {"data.merge_file": h},
        check=lambda job, h: _both(
            job, lambda c: hydra_string(overrides(c)["model.tokenizer.merge_file"]), f"data/{h}")),
    "env value (NeMo)": Field(
        "neox20b", lambda h: {"env.MALLOC_ARENA_MAX": h, "env.HOSTILE_VALUE": h},
        check=lambda job, h: _both(
            job, lambda c: (c["env"]["MALLOC_ARENA_MAX"], c["env"]["HOSTILE_VALUE"]), (h, h))),
    "env value (NxD)": Field(
        "llama2-7b", lambda h: {"env.HOSTILE_VALUE": h},
        check=lambda job, h: _both(job, lambda c: c["env"]["HOSTILE_VALUE"], h)),
    "launch.config_name": Field(
        "neox20b", lambda h: {"launch.config_name": h},
        check=lambda job, h: _both(job, lambda c: trainer_argv(c)[1][1], f"--config-name={h}")),
    # --- site ---
    "site description": Field("neox20b", site_changes=lambda submit, h: {"description": h}),
    "paths.work_dir (NeMo)": Field("neox20b", site_changes=lambda submit, h: {"paths.work_dir": h},
                                   check=_check_work_dir_nemo),
    "paths.work_dir (NxD)": Field("llama2-7b", site_changes=lambda submit, h: {"paths.work_dir": h},
                                  check=_check_work_dir_nxd),
    "paths.data_dir": Field(
        "neox20b", site_changes=lambda submit, h: {"paths.data_dir": h},
        check=lambda job, h: _both(job, lambda c: hydra_string(
            overrides(c)["model.tokenizer.vocab_file"]), f"{h}/gpt2/gpt2-vocab.json")),
    "paths.compile_cache": Field(
        "neox20b", site_changes=lambda submit, h: {"paths.compile_cache": h},
        check=lambda job, h: (
            job.calls[0]["env"]["NEURON_COMPILE_CACHE_URL"] == f"{job.submit}/{h}"
            and len(list((job.submit / h / ".jobgen").glob("neox20b-1n-*.done"))) == 1)
        or pytest.fail("compile pass did not use the shared cache")),
    "paths.local_compile_cache": Field(     # must be absolute (payload/common/sync_cache.sh)
        "neox20b", site_changes=lambda submit, h: {"paths.local_compile_cache": f"{submit}/{h}"},
        check=lambda job, h: (
            job.calls[1]["env"]["NEURON_COMPILE_CACHE_URL"] == f"{job.submit}/{h}"
            and len(list((job.submit / h / ".jobgen").glob("neox20b-1n-*.done"))) == 1)
        or pytest.fail("training did not use the node-local copy of the cache")),
    "paths.payload_dir": Field(
        "neox20b", site_changes=lambda submit, h: {"paths.payload_dir": h}, prepare=_payload_link),
    "paths.nemo_dir": Field(
        "neox20b", site_changes=lambda submit, h: {"paths.nemo_dir": h},
        prepare=_trainer_dir(NEMO_PROGRAM),
        check=lambda job, h: _both(job, lambda c: (trainer_argv(c)[0], trainer_argv(c)[1][0]), (
            f"{job.submit}/{h}/{NEMO_PROGRAM}", f"--config-path={job.submit}/{h}/conf"))),
    "paths.nxd_llama_dir": Field(
        "llama2-7b", site_changes=lambda submit, h: {"paths.nxd_llama_dir": h},
        check=lambda job, h: _both(job, lambda c: flags(c)["--example-dir"], h)),
    "setup.activate": Field(
        "neox20b", site_changes=lambda submit, h: {"setup": {"activate": h}},
        prepare=_activate_file,
        check=lambda job, h: _both(job, lambda c: c["env"].get("STUB_ACTIVATED"), "yes")),
}


# --- rendering and running ------------------------------------------------------------------------

@pytest.fixture
def canary(tmp_path: Path) -> Path:
    folder = tmp_path / "canary"
    folder.mkdir()
    return folder


@pytest.fixture
def submit(tmp_path: Path) -> Path:
    """The submission directory, with the stand-in trainer checkouts of the benign site."""
    folder = tmp_path / "submit"
    _trainer_dir(NEMO_PROGRAM)(folder, "nemo")
    _trainer_dir(NXD_PROGRAM)(folder, "nxd")
    return folder


def _edited_site(write_site: Callable, changes: dict[str, Any], submit: Path) -> Path:
    data = json.loads(json.dumps(BENIGN_SITE))
    data["paths"]["local_compile_cache"] = str(submit / LOCAL_CACHE)
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return write_site(text=json.dumps(data), filename="hostile-site.yaml")


def render_and_run(jobgen: Callable, write_recipe: Callable, write_site: Callable,
                   stub_bin: StubBin, submit: Path, recipe: str,
                   recipe_changes: Optional[dict[str, Any]] = None,
                   site_changes: Optional[dict[str, Any]] = None,
                   render_args: tuple[str, ...] = (), **env: str) -> tuple[Any, Job]:
    # The stand-in trainers read no dataset, and none is made: the data check is off.
    recipe_path = write_recipe(recipe, {"job.data_check": False, **(recipe_changes or {})})
    site_path = _edited_site(write_site, site_changes or {}, submit)
    # Rendered where it is submitted from: relative site paths (and the payload snapshot that
    # render places under the work folder) are the submission folder's.
    here = os.getcwd()
    os.chdir(submit)
    try:
        result = jobgen("render", str(recipe_path), "--nodes", "1", "--site", str(site_path),
                        *render_args)
    finally:
        os.chdir(here)
    assert result.exit_code == 0, result.stderr
    script = submit / "job.sbatch"
    script.write_text(result.stdout)
    proc = stub_bin.run(script, submit, **env)
    return proc, Job(submit, result.stdout, stub_bin.torchrun_calls(), proc.stderr)


# --- the hostile matrix ---------------------------------------------------------------------------

# Fields that can share one job: they touch different places, and none of them changes what
# another one's check expects (data.path and paths.data_dir, say, would). Five jobs per string.
GROUPS = {
    "NeMo recipe and site": [
        "description", "data.path (NeMo)", "data.vocab_file", "data.merge_file",
        "env value (NeMo)", "launch.config_name",
        "site description", "paths.work_dir (NeMo)", "paths.nemo_dir"],
    # Not beside the run folders' own: a cache that is the run folder is refused
    # (jobgen/inputs/rules.py).
    "compile cache": ["paths.compile_cache"],
    "NxD recipe and site": [
        "data.path (NxD)", "env value (NxD)", "paths.work_dir (NxD)", "paths.nxd_llama_dir"],
    "data and local cache": ["paths.data_dir", "paths.local_compile_cache"],
    "payload": ["paths.payload_dir"],
    "activate": ["setup.activate"],
}


def test_groups_cover_every_field() -> None:
    grouped = [f for fields in GROUPS.values() for f in fields]
    assert sorted(grouped) == sorted(FIELDS)
    for fields in GROUPS.values():
        assert len({FIELDS[f].recipe for f in fields}) == 1


# The fast tier runs every field with one string of each kind (substitution, line break, quote,
# expansion); the full tier runs them all (each combination is a job run: 0.7 s).
FAST_HOSTILE = ("dollar-paren", "newline", "single-quotes", "braces")


@pytest.mark.parametrize("hostile", [
    h if h in FAST_HOSTILE else pytest.param(h, marks=pytest.mark.slow) for h in sorted(HOSTILE)])
@pytest.mark.parametrize("group", list(GROUPS))
def test_hostile_value_is_passed_verbatim_and_never_runs(
        group: str, hostile: str, jobgen: Callable, write_recipe: Callable, write_site: Callable,
        stub_bin: StubBin, submit: Path, canary: Path) -> None:
    fields = [FIELDS[name] for name in GROUPS[group]]
    h = HOSTILE[hostile].replace("{c}", str(canary))
    recipe_changes: dict[str, Any] = {}
    site_changes: dict[str, Any] = {}
    for field in fields:
        field.prepare(submit, h)
        recipe_changes.update(field.recipe_changes(h))
        site_changes.update(field.site_changes(submit, h))
    proc, job = render_and_run(jobgen, write_recipe, write_site, stub_bin, submit,
                               fields[0].recipe, recipe_changes, site_changes)
    assert sorted(p.name for p in canary.iterdir()) == [], "a hostile string was executed"
    assert [p.name for p in stub_bin.home.iterdir()] == ["sentinel"], "$HOME was expanded"
    assert proc.returncode == 0, proc.stderr
    assert len(job.calls) == 2, proc.stderr          # compile pass, then training pass
    failures = []
    for name, field in zip(GROUPS[group], fields):
        try:
            field.check(job, h)
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
    assert not failures, "\n".join(failures)


RESTRICTED = {
    # field: (recipe changes, site changes, extra args, message; {r}/{s} = the files)
    "recipe name": (lambda h: {"name": h}, {}, (),
                    "{r}: name: {v} must match " + NAME_PATTERN),
    "env name": (lambda h: {"env": {f"X{h}": "1"}}, {}, (),
                 "{r}: env.X{h}: not a valid variable name"),
    "job.time_limit": (lambda h: {"job.time_limit": h}, {}, (),
                       "{r}: job.time_limit: {v} is not a Slurm time limit "
                       "(MINUTES, HH:MM:SS, D-HH:MM:SS or UNLIMITED)"),
    "slurm.partition": (lambda h: {}, {"slurm.partition": None}, (),
                        "{s}: slurm.partition: {v} is not a name matching " + NAME_PATTERN),
    "slurm.account": (lambda h: {}, {"slurm.account": None}, (),
                      "{s}: slurm.account: {v} is not a name matching " + NAME_PATTERN),
    "site name": (lambda h: {}, {"name": None}, (), "{s}: name: {v} must match " + NAME_PATTERN),
    "--run-name": (lambda h: {}, {}, ("--run-name",),
                   "--run-name: {v} must match " + NAME_PATTERN),
}


@pytest.mark.parametrize("hostile", sorted(HOSTILE))
@pytest.mark.parametrize("field", list(RESTRICTED))
def test_restricted_fields_refuse_hostile_values(
        field: str, hostile: str, jobgen: Callable, write_recipe: Callable, write_site: Callable,
        canary: Path, submit: Path) -> None:
    recipe_changes, site_keys, extra, message = RESTRICTED[field]
    h = HOSTILE[hostile].replace("{c}", str(canary))
    if field == "env name" and re.fullmatch(r"[A-Za-z0-9_]*", h):
        pytest.skip("not hostile as part of a variable name")
    recipe_path = write_recipe("neox20b", recipe_changes(h))
    site_path = _edited_site(write_site, {k: h for k in site_keys}, submit)
    args = ["render", str(recipe_path), "--nodes", "1", "--site", str(site_path)]
    args += [*extra, h] if extra else []
    result = jobgen(*args)
    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    expected = (message.replace("{r}", str(recipe_path)).replace("{s}", str(site_path))
                .replace("{v}", describe(h)).replace("{h}", h))
    # One line on stderr: a line break in a bad key is shown as \n.
    assert result.stderr == "error: " + expected.replace("\n", "\\n") + "\n"
    assert result.stdout == ""
    assert list(canary.iterdir()) == []


@pytest.mark.parametrize("value", ["x\n", "a\\b", "\\", "tab\there", "ünï", "-x", "%x-%j"])
def test_awkward_but_harmless_values_arrive_unchanged(
        value: str, jobgen: Callable, write_recipe: Callable, write_site: Callable,
        stub_bin: StubBin, submit: Path) -> None:
    proc, job = render_and_run(jobgen, write_recipe, write_site, stub_bin, submit, "neox20b",
                               {"env.AWKWARD": value, "launch.config_name": value})
    assert proc.returncode == 0, proc.stderr
    _both(job, lambda c: (c["env"]["AWKWARD"], trainer_argv(c)[1][1]),
          (value, f"--config-name={value}"))


# --- how the job behaves --------------------------------------------------------------------------

@pytest.fixture
def run_job(jobgen: Callable, write_recipe: Callable, write_site: Callable, stub_bin: StubBin,
            submit: Path) -> Callable[..., tuple[Any, Job]]:
    """Render a recipe for the scratch site and run it; can be called again (same files)."""
    def run(recipe: str = "neox20b", *render_args: str,
            site: Optional[dict[str, Any]] = None, **env: str) -> tuple[Any, Job]:
        stub_bin.reset()
        return render_and_run(jobgen, write_recipe, write_site, stub_bin, submit, recipe,
                              site_changes=site, render_args=render_args, **env)
    return run


def test_compile_pass_then_training_pass(run_job: Callable, submit: Path,
                                         stub_bin: StubBin) -> None:
    proc, job = run_job("neox20b")
    assert proc.returncode == 0, proc.stderr
    assert stub_bin.requeues() == []
    # sudo and sysctl fail here: reserving the port is best effort, the node goes on (said
    # once per allocation, by node 0).
    assert proc.stderr.count("could not reserve port 41000 (no privilege); continuing") == 1
    compile_call, train_call = job.calls
    # neuron_parallel_compile wraps the compile pass only.
    assert compile_call["env"].get("STUB_VIA_NEURON_PARALLEL_COMPILE") == "1"
    assert "STUB_VIA_NEURON_PARALLEL_COMPILE" not in train_call["env"]
    assert overrides(compile_call)["trainer.max_steps"] == "3"
    assert overrides(train_call)["trainer.max_steps"] == "10000"
    assert overrides(train_call)["exp_manager.resume_if_exists"] == "True"   # see launch.sh
    for call in job.calls:
        assert call["argv"][:10] == ["--nproc_per_node", "32", "--nnodes", "1", "--node_rank", "0",
                                     "--master_addr", "127.0.0.1", "--master_port", "41000"]
        assert call["env"]["MASTER_ADDR"] == "127.0.0.1"
        assert call["cwd"] == str(submit)
        assert call["env"]["NEURON_CC_FLAGS"].startswith(
            "--model-type transformer --distribution-strategy=llm-training")
    assert compile_call["env"]["NEURON_COMPILE_CACHE_URL"] == f"{submit}/cache"
    assert train_call["env"]["NEURON_COMPILE_CACHE_URL"] == f"{submit}/{LOCAL_CACHE}"
    assert (submit / LOCAL_CACHE / ".jobgen-node-cache").exists()
    assert len(list((submit / "cache" / ".jobgen").glob("neox20b-1n-*.done"))) == 1
    logs = submit / "runs" / "neox20b-1n" / "logs" / "4242" / "restart-0" / "node-0"
    assert "torchrun stand-in: call 0" in (logs / "compile.log").read_text()
    assert "torchrun stand-in: call 1" in (logs / "train.log").read_text()
    assert proc.stderr.index("compile pass (3 steps) on 1 nodes") < \
        proc.stderr.index("jobgen[node 0]: training pass on 1 nodes")


def test_llama_job_writes_its_model_config_and_compiles_first(run_job: Callable,
                                                             submit: Path) -> None:
    proc, job = run_job("llama2-7b")
    assert proc.returncode == 0, proc.stderr
    assert [c["env"].get("STUB_VIA_NEURON_PARALLEL_COMPILE") for c in job.calls] == ["1", None]
    assert [flags(c)["--phase"] for c in job.calls] == ["compile", "train"]
    assert [flags(c)["--compile-steps"] for c in job.calls] == ["3", "3"]
    assert "--checkpoint-dir" not in flags(job.calls[0])
    assert flags(job.calls[1])["--checkpoint-dir"] == "runs/llama2-7b-1n/checkpoints"
    config = json.loads((submit / "runs" / "llama2-7b-1n" / "model" / "config.json").read_text())
    assert (config["hidden_size"], config["num_attention_heads"]) == (4096, 32)


def test_second_run_skips_the_compile_pass(run_job: Callable) -> None:
    proc, job = run_job("neox20b")
    assert proc.returncode == 0 and len(job.calls) == 2
    proc, job = run_job("neox20b")               # auto: the marker is there
    assert proc.returncode == 0, proc.stderr
    assert len(job.calls) == 1
    assert "STUB_VIA_NEURON_PARALLEL_COMPILE" not in job.calls[0]["env"]
    assert overrides(job.calls[0])["trainer.max_steps"] == "10000"
    assert re.search(r"compile pass skipped \(compile mode auto; cache marker "
                     r"neox20b-1n-[0-9a-f]{16}\.done\)", proc.stderr)
    proc, job = run_job("neox20b", "--compile", "always")
    assert proc.returncode == 0 and len(job.calls) == 2
    # A different spec has different graphs: it compiles again.
    proc, job = run_job("neox20b", "--set", "model.num_layers=40")
    assert proc.returncode == 0 and len(job.calls) == 2


def test_compile_never_skips_it_on_an_empty_cache(run_job: Callable, submit: Path) -> None:
    proc, job = run_job("neox20b", "--compile", "never")
    assert proc.returncode == 0, proc.stderr
    assert len(job.calls) == 1 and overrides(job.calls[0])["trainer.max_steps"] == "10000"
    assert not (submit / "cache" / ".jobgen").exists()
    assert "compile pass skipped (compile mode never" in proc.stderr


def test_training_failure_requeues_and_keeps_the_status(run_job: Callable,
                                                        stub_bin: StubBin) -> None:
    proc, job = run_job("neox20b", STUB_TORCHRUN_EXIT="0,7")
    assert proc.returncode == 7                 # torchrun's status, through tee
    assert len(job.calls) == 2
    assert stub_bin.requeues() == ["requeue 4242"]
    assert "training pass failed with status 7; requeueing (restart 1 of 10)" in proc.stderr


@pytest.mark.parametrize("torchrun_exit, which, status", [
    ("0,7", "training pass", 7), ("5", "compile pass", 5), ("0,143", "training pass", 143)])
def test_status_is_the_failed_nodes_not_srun_s(run_job: Callable, torchrun_exit: str,
                                               which: str, status: int) -> None:
    """srun reports the highest status of all nodes, 143 (SIGTERM) for the ones it stopped
    after one failed; the script reports the status the failed node's launcher recorded, and
    srun's where no node recorded a plain exit status."""
    proc, _ = run_job("neox20b", STUB_TORCHRUN_EXIT=torchrun_exit, STUB_SRUN_FAILED_STATUS="143")
    assert proc.returncode == status
    assert f"{which} failed with status {status}; requeueing" in proc.stderr


def test_no_requeue_once_the_restarts_are_used(run_job: Callable, stub_bin: StubBin,
                                               submit: Path) -> None:
    proc, job = run_job("neox20b", "--compile", "never", STUB_TORCHRUN_EXIT="7",
                        SLURM_RESTART_COUNT="10")
    assert proc.returncode == 7
    assert stub_bin.requeues() == []
    assert "the job has used all 10 restarts; giving up" in proc.stderr
    assert (submit / "runs" / "neox20b-1n" / "logs" / "4242" / "restart-10").is_dir()
    proc, job = run_job("neox20b", "--compile", "never", STUB_TORCHRUN_EXIT="7",
                        SLURM_RESTART_COUNT="9")
    assert proc.returncode == 7 and stub_bin.requeues() == ["requeue 4242"]


def test_compile_failure_stops_before_training(run_job: Callable, stub_bin: StubBin,
                                               submit: Path) -> None:
    proc, job = run_job("neox20b", STUB_TORCHRUN_EXIT="5")
    assert proc.returncode == 5
    assert len(job.calls) == 1                  # no training pass
    assert not (submit / "cache" / ".jobgen").exists()   # no marker for a failed compile
    assert stub_bin.requeues() == ["requeue 4242"]
    assert "compile pass failed with status 5" in proc.stderr


def test_failed_requeue_still_exits_with_the_status(run_job: Callable) -> None:
    proc, _ = run_job("neox20b", "--compile", "never", STUB_TORCHRUN_EXIT="7",
                      STUB_REQUEUE_STATUS="1")
    assert proc.returncode == 7
    assert "scontrol requeue failed" in proc.stderr


@pytest.mark.parametrize("resolver", ["getent", "nslookup"])
def test_unresolvable_master_stops_the_job(run_job: Callable, resolver: str) -> None:
    proc, job = run_job("neox20b", site={"slurm.master_resolver": resolver}, STUB_KNOWN_HOSTS="")
    assert proc.returncode != 0
    assert (f"jobgen: cannot resolve the first node 'n1' to an IPv4 address with {resolver}; "
            "stopping") in proc.stderr
    assert job.calls == []                       # never started, never on localhost
    assert "127.0.0.53" not in proc.stderr


def test_nslookup_answer_not_the_dns_server(run_job: Callable) -> None:
    proc, job = run_job("neox20b", site={"slurm.master_resolver": "nslookup"})
    assert proc.returncode == 0, proc.stderr
    assert [c["env"]["MASTER_ADDR"] for c in job.calls] == ["127.0.0.1", "127.0.0.1"]


def test_activation_that_fails_stops_the_job(run_job: Callable) -> None:
    proc, job = run_job("neox20b", site={"setup": {"activate": "no/such/activate"}})
    assert proc.returncode == 1
    assert "jobgen: cannot source no/such/activate" in proc.stderr
    assert job.calls == []


def test_missing_trainer_is_reported_and_not_retried(run_job: Callable,
                                                     stub_bin: StubBin) -> None:
    proc, job = run_job("neox20b", site={"paths.nemo_dir": "elsewhere"})
    assert proc.returncode == 78                  # EX_CONFIG: no restart can cure it
    assert "no trainer at" in proc.stderr and "elsewhere/megatron_gpt_pretraining.py" in proc.stderr
    assert "configuration error (status 78" in proc.stderr and "not requeueing" in proc.stderr
    assert job.calls == []
    assert stub_bin.requeues() == []


def test_missing_torchrun_is_not_retried(run_job: Callable, stub_bin: StubBin) -> None:
    (stub_bin.path / "torchrun").unlink()
    empty = stub_bin.path.parent / "empty-bin"     # PATH without any torchrun at all
    empty.mkdir()
    proc, job = run_job("neox20b", PATH=f"{stub_bin.path}:{empty}:/usr/bin:/bin")
    assert proc.returncode == 78, proc.stderr
    assert "not found or not executable (status 127: torchrun or neuron_parallel_compile)" \
        in proc.stderr
    assert stub_bin.requeues() == []


@pytest.mark.parametrize("printed", [
    "ModuleNotFoundError: No module named 'modeling_llama_nxd'",
    "train.py: error: unrecognized arguments: --rdzv-id",
    "ImportError: cannot import name 'batch_utils'",
])
def test_trainer_started_wrongly_is_not_retried(run_job: Callable, stub_bin: StubBin,
                                                printed: str) -> None:
    proc, job = run_job("neox20b", STUB_TORCHRUN_EXIT="1", STUB_TORCHRUN_PRINT=printed)
    assert proc.returncode == 78, proc.stderr
    assert "the trainer was started wrongly" in proc.stderr
    assert stub_bin.requeues() == []


def test_a_crash_is_still_retried(run_job: Callable, stub_bin: StubBin) -> None:
    proc, job = run_job("neox20b", STUB_TORCHRUN_EXIT="1",
                        STUB_TORCHRUN_PRINT="RuntimeError: NaN loss")
    assert proc.returncode == 1
    assert stub_bin.requeues() == ["requeue 4242"]


def test_stand_ins_do_not_leak_into_the_real_environment(stub_bin: StubBin, submit: Path) -> None:
    env = stub_bin.env(submit, SLURM_RESTART_COUNT="3")
    assert env["PATH"].split(os.pathsep)[0] == str(stub_bin.path)
    assert env["HOME"] == str(stub_bin.home) != os.environ.get("HOME")
    assert env["SLURM_JOB_NODELIST"] == "n1" and env["SLURM_RESTART_COUNT"] == "3"
    assert "PATH" in os.environ and not os.environ["PATH"].startswith(str(stub_bin.path))


@pytest.mark.parametrize("work_dir", ["runs", "it's \\ ${HOME} runs"])
def test_nemo_training_resumes_through_model_resume_from_checkpoint(
        run_job: Callable, submit: Path, work_dir: str) -> None:
    """The documented NeMo resume: the newest checkpoint (by the step in its name, held by all
    32 tensor/pipeline-rank folders; the rank folder taken off) reaches the trainer as
    model.resume_from_checkpoint, which Hydra reads back as exactly that path; without a
    checkpoint the override is absent. Modification times do not decide (after a restore from
    S3 they are download times), and a step one rank folder lacks is not offered."""
    proc, job = run_job("neox20b", site={"paths.work_dir": work_dir})
    assert proc.returncode == 0, proc.stderr
    assert not any(a.startswith("model.resume_from_checkpoint=") for a in job.calls[1]["argv"])
    assert overrides(job.calls[1])["exp_manager.resume_if_exists"] == "True"
    checkpoints = submit / work_dir / "neox20b-1n" / "nemo" / "checkpoints"
    ranks = [checkpoints / f"tp_rank_{t:02d}_pp_rank_{p:03d}" for t in range(8) for p in range(4)]
    older = "megatron_neox--step=200-consumed_samples=51200.0.ckpt"
    newest = Path("megatron_neox--step=400-consumed_samples=102400.0-last.ckpt")
    partial = "megatron_neox--step=600-consumed_samples=153600.0-last.ckpt"
    for rank in ranks:
        rank.mkdir(parents=True, exist_ok=True)
        for i, name in enumerate((newest.name, older)):   # the older one downloaded last
            write_ckpt(rank / name)
            os.utime(rank / name, (1_700_000_000 + i, 1_700_000_000 + i))
    for rank in ranks[:-1]:                                # one rank's part never arrived
        write_ckpt(rank / partial)
    proc, job = run_job("neox20b", site={"paths.work_dir": work_dir})
    assert proc.returncode == 0, proc.stderr
    assert len(job.calls) == 1                     # compile skipped: the marker is there
    resume = hydra_string(overrides(job.calls[0])["model.resume_from_checkpoint"])
    assert resume == f"{submit}/{work_dir}/neox20b-1n/nemo/checkpoints/{newest.name}"
    assert hydra_string(overrides(job.calls[0])["+exp_manager.explicit_ckpt_path"]) == resume
    # NeMo holds the one it resumed from: its callback keeps keep - 1 (recipe: keep 3).
    assert overrides(job.calls[0])["exp_manager.checkpoint_callback_params.save_top_k"] == "2"
    assert not (ranks[0] / partial).exists() and (ranks[0] / older).exists()
    assert "resuming from" in proc.stderr
