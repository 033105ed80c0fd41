"""Platforms as data (env/platforms/*.yaml, JOBGEN_PLATFORMS) and payloads from other packages
(the `jobgen.payloads` entry point group): extending jobgen without editing it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from jobgen.inputs import platforms
from jobgen.plumbing import resources
from jobgen.plumbing.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
JOBGEN_EXE = Path(sys.executable).parent / "jobgen"


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    platforms.PLATFORMS.clear()
    yield
    monkeypatch.delenv(platforms.PATH_ENV, raising=False)
    platforms.PLATFORMS.clear()


def test_shipped_platforms() -> None:
    assert list(platforms.PLATFORMS) == ["dl1.24xlarge", "p4d.24xlarge", "trn1.32xlarge",
                                         "trn1n.32xlarge"]
    trn1 = platforms.PLATFORMS["trn1.32xlarge"]
    assert (trn1.accelerator, trn1.workers_per_node, trn1.devices, trn1.efa_interfaces,
            trn1.vcpus, trn1.memory_mib) == ("neuron", 32, 16, 8, 128, 512 * 1024)
    assert trn1.device_paths == tuple(f"/dev/neuron{i}" for i in range(16))
    assert trn1.efa_devices[-1] == "/dev/infiniband/uverbs7"
    trn1n = platforms.PLATFORMS["trn1n.32xlarge"]
    assert trn1n.efa_interfaces == 16 and trn1n.workers_per_node == 32
    dl1 = platforms.PLATFORMS["dl1.24xlarge"]
    assert (dl1.accelerator, dl1.workers_per_node, dl1.efa_interfaces, dl1.device_paths) == \
        ("hpu", 8, 4, ())


def test_a_platform_of_ones_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                fresh: None) -> None:
    """A file in a JOBGEN_PLATFORMS folder is a platform recipes can name, end to end."""
    text = (resources.folder("platforms") / "trn1.32xlarge.yaml").read_text()
    (tmp_path / "trn1-half.yaml").write_text(
        text.replace("name: trn1.32xlarge", "name: trn1-half")
            .replace("workers_per_node: 32", "workers_per_node: 16"))
    env = {**os.environ, platforms.PATH_ENV: str(tmp_path)}
    out = subprocess.run([str(JOBGEN_EXE), "show", "llama2-7b", "--nodes", "2", "--json",
                          "--set", "platform=trn1-half"], capture_output=True, text=True,
                         env=env, timeout=60, check=True).stdout
    derived = json.loads(out)["derived"]
    assert (derived["workers_per_node"], derived["world_size"]) == (16, 32)
    monkeypatch.setenv(platforms.PATH_ENV, str(tmp_path))
    assert "trn1-half" in platforms.PLATFORMS and len(platforms.PLATFORMS) == 5


@pytest.mark.parametrize(("change", "message"), [
    (("name: bad", "name: other"), "name: 'other' must be the file's name ('bad')"),
    (("vcpus: 128", "vcpus: 0"), "vcpus: must be at least 1, got 0"),
    (("efa_interfaces: 8", "efa_interfaces: 99"), "efa_interfaces: 99 is not between 0 and 32"),
    (("batch_vcpus: 96", "batch_vcpus: 500"), "batch_vcpus and batch_memory_mib cannot exceed"),
    (("/dev/neuron0,", "/etc/passwd,"), "device_paths: '/etc/passwd' is not a device file"),
    (("accelerator: neuron", "accelerator: tpu"), "accelerator: expected one of neuron, hpu"),
    (("compile_cache_var: NEURON_COMPILE_CACHE_URL", "compile_cache_var: A B"),
     "compile_cache_var: 'A B' is not an environment variable name"),
    (("compile_cache_var: NEURON_COMPILE_CACHE_URL",
      "compile_cache_var: X\ncompile_cache_value: 'x{dir}'"),
     "compile_cache_value: 'x{dir}' must start with {dir}, once"),
    (("device_resource: aws.amazon.com/neuron", "device_resource: neuron"),
     "device_resource: 'neuron' is not a Kubernetes extended resource name"),
])
def test_bad_platform_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh: None,
                            change: tuple[str, str], message: str) -> None:
    text = (resources.folder("platforms") / "trn1.32xlarge.yaml").read_text()
    text = text.replace("name: trn1.32xlarge", "name: bad").replace(*change)
    (tmp_path / "bad.yaml").write_text(text)
    monkeypatch.setenv(platforms.PATH_ENV, str(tmp_path))
    with pytest.raises(ConfigError) as info:
        platforms.PLATFORMS["bad"]
    assert str(info.value).startswith(f"{tmp_path / 'bad.yaml'}: ") and message in str(info.value)


def test_unknown_platform_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"^r\.yaml: platform: unknown platform 'trn9' "
                                          r"\(platforms: dl1\.24xlarge, p4d\.24xlarge, "
                                          r"trn1\.32xlarge, "
                                          r"trn1n\.32xlarge; add one"):
        platforms.get("trn9", "r.yaml")
    assert "../x" not in platforms.PLATFORMS


# --- a payload registered by another package --------------------------------------------------

PLUGIN = '''
from jobgen.payloads.base import Launch, Payload
from jobgen.payloads.neuronx_distributed import PAYLOAD as NXD


def build(spec):
    steps = str(spec.recipe.schedule.max_steps)
    return Launch(launcher=LAUNCHER, workdir="/opt/toy", program="train.py",
                  compile_wrapper="", compile_args=("--steps", "3"),
                  train_args=("--steps", steps, "--lr", repr(spec.lr)))


LAUNCHER = "/opt/toy/launch.sh"
# The keys NxD's trainer honours: a Llama recipe written for it is one for this payload too.
PAYLOAD = Payload(name="toy", accelerator="neuron", families=("llama",), honours=NXD.honours,
                  fixed=NXD.fixed, launch_keys=NXD.launch_keys, build=build)
'''


def plugin_env(tmp_path: Path, target: str = "toy_payload:PAYLOAD", name: str = "toy") -> dict:
    """A package with a `jobgen.payloads` entry point, importable through PYTHONPATH."""
    (tmp_path / "toy_payload.py").write_text(PLUGIN)
    info = tmp_path / "toy_payload-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-payload\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[jobgen.payloads]\n{name} = {target}\n")
    recipe = (ROOT / "recipes" / "llama2-7b.yaml").read_text()
    (tmp_path / "toy.yaml").write_text(
        recipe.replace("payload: neuronx_distributed", "payload: toy")
              .replace("name: llama2-7b", "name: toy"))
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def test_a_payload_from_an_entry_point_renders(tmp_path: Path) -> None:
    env = plugin_env(tmp_path)
    assert "payload: toy" in (tmp_path / "toy.yaml").read_text()
    proc = subprocess.run([str(JOBGEN_EXE), "render", str(tmp_path / "toy.yaml"), "--nodes", "4"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert "export JOBGEN_LAUNCHER=/opt/toy/launch.sh\n" in proc.stdout
    assert "TRAIN_ARGS=(\n  --steps\n" in proc.stdout
    # The no-silent-values rule holds for it: a key its record does not honour is refused.
    proc = subprocess.run([str(JOBGEN_EXE), "render", str(tmp_path / "toy.yaml"),
                           "--set", "model.hidden_dropout=0.1"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60, check=False)
    assert proc.returncode == 2
    assert "model.hidden_dropout: payload toy does not use this key" in proc.stderr


@pytest.mark.parametrize(("target", "name", "message"), [
    ("toy_payload:nothing", "toy", "cannot load it: AttributeError"),
    ("toy_payload:build", "toy", "must name a jobgen.payloads.Payload whose name is 'toy'"),
    ("toy_payload:PAYLOAD", "neuron_nemo", "a payload of that name is already registered"),
])
def test_broken_entry_points_are_one_line(tmp_path: Path, target: str, name: str,
                                          message: str) -> None:
    env = plugin_env(tmp_path, target, name)
    proc = subprocess.run([str(JOBGEN_EXE), "render", str(tmp_path / "toy.yaml")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
                          check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: entry point jobgen.payloads:") and message in proc.stderr
    assert len(proc.stderr.splitlines()) == 1


def test_built_in_recipes_read_no_package_metadata() -> None:
    code = textwrap.dedent("""
        import sys
        from jobgen.cli import main
        main(["render", "neox20b", "--nodes", "4"])
        print("importlib.metadata" in sys.modules, file=sys.stderr)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert proc.stderr.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize(("recipe", "backend", "variable", "value"), [
    ("llama2-7b", "sagemaker", "TORCHINDUCTOR_CACHE_DIR", "/opt/ml/checkpoints/"),
    ("neox20b", "slurm", "NEURON_COMPILE_CACHE_URL", "jobgen-runs/neuron-compile-cache"),
    ("bert1.5b", "batch", "PT_HPU_RECIPE_CACHE_CONFIG", ",false,8192"),
])
def test_accelerator_facts_come_from_the_platform_file(recipe: str, backend: str,
                                                       variable: str, value: str) -> None:
    """The compile cache variable is the platform's: the p4d (CUDA) job of the SageMaker overlay
    gets inductor's cache, never Gaudi's recipe cache or Neuron's."""
    from jobgen import api, payloads
    from jobgen.payloads import node
    spec = api.job_spec(recipe, 16 if backend == "sagemaker" else 2,
                        backend=backend)  # type: ignore[arg-type]
    lau = payloads.for_spec(spec, backend)
    env = node.environment(spec, lau, node.contract(spec, lau, backend))  # type: ignore[arg-type]
    caches = {k for k in env if k in ("TORCHINDUCTOR_CACHE_DIR", "NEURON_COMPILE_CACHE_URL",
                                      "PT_HPU_RECIPE_CACHE_CONFIG")}
    assert caches == {variable}
    assert value in env[variable] and env["JOBGEN_CACHE_VAR"] == variable
