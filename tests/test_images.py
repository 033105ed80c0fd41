"""jobgen/images/catalog.py and env/containers/images.yaml: what each image holds is declared once,
and the Dockerfiles, the rendered jobs, `jobgen image-context` and the container rehearsals all
follow it; a rehearsal whose image tree differs from the declaration fails as a wrong image
would."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobgen import api
from jobgen.backends.local import runner as local_runner
from jobgen.images import catalog as images
from jobgen.images import snapshot
from jobgen.inputs import recipe

ROOT = Path(__file__).resolve().parent.parent
CONTAINERS = ROOT / "env" / "containers"
JOBGEN = Path(sys.executable).parent / "jobgen"


def _arg_defaults(dockerfile: str) -> dict[str, str]:
    text = (CONTAINERS / dockerfile).read_text(encoding="utf-8")
    return dict(re.findall(r"^ARG ([A-Z_]+)=(\S+)$", text, re.MULTILINE))


def _args(dockerfile: str) -> set[str]:
    text = (CONTAINERS / dockerfile).read_text(encoding="utf-8")
    return set(re.findall(r"^ARG ([A-Z_]+)", text, re.MULTILINE))


@pytest.mark.parametrize("name", sorted(images.declared().images))
def test_dockerfile_defaults_are_the_declared_paths(name: str) -> None:
    """A plain `docker build` puts things where the declaration says, too: the Dockerfile's
    path arguments default to the declared paths, and no other path to them is written."""
    decl, image = images.declared(), images.declared().images[name]
    defaults = _arg_defaults(image.dockerfile)
    assert defaults["JOBGEN_DIR"] == decl.jobgen_dir
    if image.checkout is not None:
        assert defaults[image.checkout.arg] == image.checkout.path
    text = (CONTAINERS / image.dockerfile).read_text(encoding="utf-8")
    body = re.sub(r"^ARG .*$", "", text, flags=re.MULTILINE)
    assert decl.jobgen_dir not in body
    workdirs = re.findall(r"^WORKDIR (\S+)$", text, re.MULTILINE)
    assert set(workdirs) <= {decl.workdir}
    # Every build argument image-context passes is one the Dockerfile takes.
    assert {k for k, _ in images.build_args(image, "us-east-1")} <= _args(image.dockerfile)


def test_the_declaration_names_real_site_keys_and_every_built_in_payload() -> None:
    import dataclasses

    from jobgen.inputs.site_sections import Paths
    from jobgen.payloads import BUILT_IN
    decl = images.declared()
    fields = {f.name for f in dataclasses.fields(Paths)}
    for image in decl.images.values():
        assert set(image.paths) <= fields, image.name
        assert image.trainer in decl.trainers, image.name
    served = [p for runs in decl.trainers.values() for p in runs]
    assert sorted(served) == sorted(BUILT_IN) and len(set(served)) == len(served)


def test_each_recipe_has_the_image_of_its_trainer() -> None:
    """NeMo (torch 1.13.1) and NxD (torch 2.1.2) recipes on the same platform get different
    images, each with its trainer's checkout."""
    seen = {}
    for name in recipe.recipe_names():
        rec, source = recipe.load(name)
        seen[name] = images.for_recipe(rec.platform, rec.payload, source)
    assert seen["neox20b"].name == seen["pythia6.9b"].name == "trn1-nemo"
    assert seen["neox20b"].torch == "1.13.1" and seen["llama2-7b"].torch == "2.1.2"
    assert seen["llama2-7b"].name == "trn1-nxd" and seen["bert1.5b"].name == "dl1-deepspeed"


@pytest.mark.parametrize("backend", ["sagemaker", "eks", "batch"])
def test_container_jobs_run_the_trainer_where_the_image_holds_it(backend: str) -> None:
    spec = api.job_spec("neox20b", 4, site="sagemaker" if backend != "batch" else "dl1-batch",
                        backend=backend)
    image = images.declared().images["trn1-nemo"]
    assert spec.site.paths.nemo_dir == image.path_of("nemo_dir")
    assert spec.payload_dir == images.declared().payload_dir
    uri = images.uri(spec, backend)
    assert uri.endswith(f"/jobgen:trn1-nemo-{snapshot.short(spec.payload_digest)}")


def _jobgen(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(JOBGEN), *args], capture_output=True, text=True, check=False,
                          cwd=cwd)


@pytest.mark.parametrize("section,key,says", [
    ("sagemaker", "images", "write sagemaker.repository: REGISTRY/REPOSITORY"),
    ("eks", "entrypoint", "remove it (env/containers/images.yaml declares where"),
])
def test_old_image_keys_get_one_line_saying_what_to_write(tmp_path: Path, section: str,
                                                          key: str, says: str) -> None:
    text = (ROOT / "env" / "sites" / "sagemaker.yaml").read_text(encoding="utf-8")
    text = text.replace(f"\n{section}:\n", f"\n{section}:\n  {key}: {{}}\n", 1)
    (tmp_path / "old.yaml").write_text(text, encoding="utf-8")
    proc = _jobgen("render", "neox20b", "--backend", "sagemaker", "--site",
                   str(tmp_path / "old.yaml"), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"error: {tmp_path / 'old.yaml'}: {section}.{key}: ")
    assert says in proc.stderr


def test_sagemaker_refuses_an_image_outside_ecr(tmp_path: Path) -> None:
    text = (ROOT / "env" / "sites" / "sagemaker.yaml").read_text(encoding="utf-8")
    text = text.replace("  repository: 123456789012.dkr.ecr.us-west-2.amazonaws.com/jobgen\n"
                        "  checkpoint_s3_uri", "  repository: jobgen\n  checkpoint_s3_uri", 1)
    (tmp_path / "s.yaml").write_text(text, encoding="utf-8")
    proc = _jobgen("render", "neox20b", "--backend", "sagemaker", "--site",
                   str(tmp_path / "s.yaml"), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == (f"error: {tmp_path / 's.yaml'}: sagemaker.repository: 'jobgen' is "
                           "not an Amazon ECR repository: push jobgen's images to one and "
                           "write ACCOUNT.dkr.ecr.REGION.amazonaws.com/NAME\n")


def test_image_context_prints_every_build_the_sites_recipes_need(tmp_path: Path) -> None:
    proc = _jobgen("image-context", str(tmp_path / "ctx"), "--site", "sagemaker", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    full = snapshot.digest()
    builds: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("docker build "):
            argv = shlex.split(line)
            builds[argv[argv.index("--label") + 3].split("=")[1]] = argv
    assert sorted(builds) == ["dl1-deepspeed", "p4d-smp", "trn1-nemo", "trn1-nxd"]
    for name, argv in builds.items():
        image = images.declared().images[name]
        dockerfile = Path(argv[argv.index("-f") + 1])
        assert dockerfile.is_file() and dockerfile.name == image.dockerfile
        given = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--build-arg")
        assert given.keys() <= _args(image.dockerfile)       # no argument the build ignores
        assert given["BASE_IMAGE"] and "{" not in given["BASE_IMAGE"]
        repo_tag = f"123456789012.dkr.ecr.us-west-2.amazonaws.com/jobgen:{name}-{full[:16]}"
        assert argv[argv.index("-t") + 1] == repo_tag
        assert f"docker push {repo_tag}" in proc.stdout
        assert argv[-1] == str(tmp_path / "ctx")
        # What the image adds and imports, from the declaration (the Dockerfiles hold no copy).
        assert given["PACKAGES"] == " ".join(image.packages)
        assert json.loads(given["IMPORTS"]) == list(image.imports)
        assert (given["BASE_TORCH"], given["BASE_PYTHON"]) == (image.torch, image.python)
    # SMP's base is in SageMaker's registry of the site's region, after a login to it.
    assert builds["p4d-smp"][builds["p4d-smp"].index("--build-arg") + 1].startswith(
        "BASE_IMAGE=658645717510.dkr.ecr.us-west-2.amazonaws.com/smdistributed-modelparallel:")
    assert ("aws ecr get-login-password --region us-west-2 | docker login --username AWS "
            "--password-stdin 658645717510.dkr.ecr.us-west-2.amazonaws.com") in proc.stdout
    assert "TRAINER=nemo" in builds["trn1-nemo"] and "TRAINER=nxd" in builds["trn1-nxd"]
    assert ":1.13.1-neuronx" in " ".join(builds["trn1-nemo"])


# --- what each image adds to its base, and what its build imports -------------------------------

BUILD_CHECK = CONTAINERS / "build_check.py"


def _instructions(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments left out."""
    text = (CONTAINERS / dockerfile).read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return [i.strip() for i in re.sub(r"\\\n", " ", "\n".join(lines)).splitlines() if i.strip()]


@pytest.mark.parametrize("name", sorted(images.declared().images))
def test_the_dockerfile_installs_and_imports_what_the_declaration_says(name: str) -> None:
    """The packages and the import statements come only from the build arguments image-context
    passes: the Dockerfile takes them without a default, names none of the packages itself,
    installs PACKAGES under the base's constraints and runs IMPORTS after the payload is in."""
    image = images.declared().images[name]
    steps = _instructions(image.dockerfile)
    for arg in ("BASE_TORCH", "BASE_PYTHON", "PACKAGES", "IMPORTS", "IMPORT_PATH"):
        assert f"ARG {arg}" in steps, arg                   # no default that could drift
    body = " ".join(steps)
    for package in image.packages:
        project = re.match(r"[A-Za-z0-9._-]+", package)
        assert project is not None and project.group(0).lower() not in body.lower(), package
    runs = [s for s in steps if s.startswith("RUN ")]
    base = next(i for i, s in enumerate(steps) if "jobgen-build-check.py base" in s)
    install = next(i for i, s in enumerate(steps) if 'read -ra packages <<< "$PACKAGES"' in s)
    assert '-c /tmp/keep.txt' in steps[install] and '"${packages[@]}"' in steps[install]
    assert "jobgen-build-check.py constraints" in " ".join(steps[base:install + 1])
    payload = next(i for i, s in enumerate(steps) if s.startswith("COPY payload/"))
    imports = [i for i, s in enumerate(steps) if "jobgen-build-check.py imports" in s]
    assert len(imports) == 1 and imports[0] > max(payload, install), runs
    assert "COPY env/containers/build_check.py /tmp/jobgen-build-check.py" in steps
    assert not any("py_compile" in s and "payload/" in s and "batch_setup" not in s
                   for s in runs)


def _build_check(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("BASE_TORCH", "BASE_PYTHON", "IMPORTS", "IMPORT_PATH")}
    return subprocess.run([sys.executable, str(BUILD_CHECK), *args], env={**clean, **env},
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_build_check_stops_on_another_base() -> None:
    from importlib.metadata import version
    torch = version("torch")
    python = "%d.%d" % sys.version_info[:2]
    ok = _build_check("base", BASE_TORCH=torch.split("+")[0], BASE_PYTHON=python)
    assert ok.returncode == 0, ok.stderr
    wrong = _build_check("base", BASE_TORCH="2.4.1", BASE_PYTHON=python)
    assert wrong.returncode == 1
    assert wrong.stderr == (f"image check: the base image has Python {python} and torch "
                            f"{torch}; env/containers/images.yaml declares Python {python} "
                            "and torch 2.4.1 for it\n")
    unset = _build_check("base")
    assert unset.returncode == 1 and "BASE_PYTHON is not set: build with the arguments" \
        in unset.stderr
    held = _build_check("constraints", "(torch|numpy)")
    assert held.returncode == 0 and f"torch=={torch}" in held.stdout.splitlines()


@pytest.mark.parametrize("name", sorted(images.declared().images))
def test_the_declared_payload_imports_run_from_the_import_path(name: str) -> None:
    """The declaration's statements that import only the payload's own modules run here, from
    IMPORT_PATH with the image's payload folder put back at this checkout's: the path the build
    passes reaches the modules it names. A statement that fails stops the check, named."""
    image = images.declared().images[name]
    args = dict(images.build_args(image, None))
    payload = images.declared().payload_dir
    path = args["IMPORT_PATH"].replace(payload, str(ROOT / "payload"))
    local = [Path(p) for p in path.split(":")]
    own = [s for s in image.imports if re.fullmatch(r"import [\w, ]+", s) and all(
        any((d / f"{m.strip()}.py").is_file() for d in local) for m in s[7:].split(","))]
    assert own, f"{name}: no statement imports the payload's own modules"
    # One run (each imports torch): the payload's statements pass, then the bad one stops it.
    run = _build_check("imports", IMPORTS=json.dumps([*own, "import jobgen_no_such_module"]),
                       IMPORT_PATH=path)
    assert run.returncode == 1
    assert [f"image check: ok: {s}" for s in own] == run.stdout.splitlines(), run.stderr
    assert run.stderr.splitlines()[-1] == (
        "image check: 'import jobgen_no_such_module' failed: ModuleNotFoundError: No module "
        "named 'jobgen_no_such_module'")


def test_the_habana_image_keeps_its_bases_fabric_libraries() -> None:
    """Habana's base builds libfabric with SynapseAI support and the HCCL OFI wrapper against
    it (Setup_and_Install 1.16.0, dockerfiles/base/Dockerfile.ubuntu22.04): the image installs
    neither again, puts nothing before them on the library path, and its build checks that the
    wrapper loads the base's libfabric."""
    steps = _instructions("habana.Dockerfile")
    body = "\n".join(steps)
    for gone in ("efa_installer", "aws-efa-installer", "hccl_ofi_wrapper.git", "INSTALL_EFA",
                 "/opt/amazon/efa", "LD_LIBRARY_PATH"):
        assert gone not in body, gone
    check = next(s for s in steps if "libhccl_ofi_wrapper.so" in s)
    assert check.startswith("RUN set -eu;")
    assert "wrapper=/usr/lib/habanalabs/libhccl_ofi_wrapper.so" in check
    assert 'ldd "$wrapper"' in check and '$1 == "libfabric.so.1"' in check
    assert '"$(readlink -f "$root")"/lib/*) ;;' in check
    assert "root=${LIBFABRIC_ROOT:?" in check and "fi_info --version" in check
    assert '"${LIBFABRIC_VERSION:?}"' in check


def _fabric_check(tmp: Path, loads: str, reports: str) -> subprocess.CompletedProcess[str]:
    """The Habana build's fabric check, run as the build runs it, on a file tree laid out as
    Habana's base lays it out (under `tmp`), with `ldd` and `fi_info` standing in: the wrapper
    resolves libfabric.so.1 to `loads`, and fi_info reports libfabric `reports`."""
    check = next(s for s in _instructions("habana.Dockerfile") if "libhccl_ofi_wrapper.so" in s)
    wrapper = tmp / "usr/lib/habanalabs/libhccl_ofi_wrapper.so"
    root = tmp / "opt/habanalabs/libfabric-1.20.0"
    for path in (wrapper, root / "lib/libfabric.so.1", tmp / "opt/amazon/efa/lib/libfabric.so.1"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("", encoding="utf-8")
    stubs = tmp / "bin"
    stubs.mkdir(exist_ok=True)
    (stubs / "ldd").write_text("#!/bin/bash\nprintf '\\tlibc.so.6 => /lib/libc.so.6 (0x1)\\n"
                               f"\\tlibfabric.so.1 => {loads}\\n'\n", encoding="utf-8")
    (stubs / "fi_info").write_text(f"#!/bin/bash\necho 'fi_info: 1.20.0'\necho 'libfabric: "
                                   f"{reports}'\necho 'libfabric api: 1.20'\n",
                                   encoding="utf-8")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    script = check[len("RUN "):].replace("/usr/lib/habanalabs/libhccl_ofi_wrapper.so",
                                         str(wrapper))
    env = {"PATH": f"{stubs}:{os.environ['PATH']}", "LIBFABRIC_ROOT": str(root),
           "LIBFABRIC_VERSION": "1.20.0"}
    return subprocess.run(["bash", "-o", "pipefail", "-c", script], env=env, cwd=tmp,
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_habana_fabric_check_passes_only_on_the_bases_libfabric(tmp_path: Path) -> None:
    base = tmp_path / "opt/habanalabs/libfabric-1.20.0/lib/libfabric.so.1"
    efa = tmp_path / "opt/amazon/efa/lib/libfabric.so.1"
    ok = _fabric_check(tmp_path, f"{base} (0x7f)", "1.20.0")
    assert ok.returncode == 0, ok.stderr
    assert f"loads libfabric from {base}" in ok.stdout
    efa_first = _fabric_check(tmp_path, f"{efa} (0x7f)", "1.20.0")   # the EFA installer's
    assert efa_first.returncode == 1
    assert efa_first.stderr == (f"the OFI wrapper loads {efa}, not the base's under "
                                f"{tmp_path / 'opt/habanalabs/libfabric-1.20.0'}\n")
    missing = _fabric_check(tmp_path, "not found", "1.20.0")
    assert missing.returncode == 1 and "loads no libfabric" in missing.stderr
    other = _fabric_check(tmp_path, f"{base} (0x7f)", "1.22.0")
    assert other.returncode == 1
    assert other.stderr == "fi_info loads libfabric 1.22.0, not the base's 1.20.0\n"


# --- the container rehearsal: the image's file tree, the real site's paths -----------------------

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rehearsal(monkeypatch: Any, tmp_path: Path, backend: str) -> tuple[Any, list[str]]:
    monkeypatch.chdir(tmp_path)
    # Its own rendezvous port: other rehearsals on this machine use the recipe's.
    spec = api.job_spec("neox20b", 1, site="sagemaker", backend=backend, smoke=True,
                        run_name=f"rh-{backend}",
                        overrides=[f"job.master_port={_free_port()}"])
    return spec, []


@pytest.mark.parametrize("backend", ["sagemaker", "eks"])
def test_a_trainer_that_is_not_where_the_image_declares_stops_the_rehearsal(
        monkeypatch: Any, tmp_path: Path, backend: str) -> None:
    """The rehearsal's image tree is laid out from the declaration; moving the trainer in it
    (as a Dockerfile that cloned it elsewhere would) stops every node before it trains, with
    the configuration status (78: not retried) and the file named."""
    if backend == "eks":
        pytest.importorskip("kubernetes_validate")
    spec, lines = _rehearsal(monkeypatch, tmp_path, backend)
    local_runner.image_moves(spec)                    # lay the image out, as the run does
    tree = local_runner.image_tree(spec)
    checkout = tree / "workspace" / "neuronx-nemo-megatron"
    assert (checkout / "nemo/examples/nlp/language_modeling/megatron_gpt_pretraining.py").is_file()
    assert (tree / "opt/jobgen/payload" / snapshot.MARKER).is_file()
    shutil.move(str(checkout), str(tree / "workspace" / "elsewhere"))
    status = local_runner.run(spec, emit=lines.append, job_id=f"moved-{backend}", grace_s=5)
    out = "\n".join(lines)
    assert status == 78, out[-3000:]
    assert ("neuronx-nemo-megatron/nemo/examples/nlp/language_modeling/"
            "megatron_gpt_pretraining.py: the image does not hold the trainer where "
            "env/containers/images.yaml declares it") in out
    assert '"event": "step"' not in out


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sagemaker", "eks"])
def test_the_container_rehearsal_runs_in_the_declared_image_with_the_real_site(
        monkeypatch: Any, tmp_path: Path, backend: str) -> None:
    """env/sites/sagemaker.yaml as it is (its /opt/ml and /fsx paths relocated under the
    rehearsal folder), the entrypoint and payload from the image tree: both passes finish."""
    if backend == "eks":
        pytest.importorskip("kubernetes_validate")
    spec, lines = _rehearsal(monkeypatch, tmp_path, backend)
    status = local_runner.run(spec, emit=lines.append, job_id=f"ok-{backend}", grace_s=5)
    out = "\n".join(lines)
    assert status == 0, out[-3000:]
    assert "training pass finished" in out
    tree = local_runner.image_tree(spec)
    # Nothing ran from this checkout: the entrypoint and the payload are the image tree's.
    argv, env = local_runner.commands(spec, "again", write=False)[0]
    assert argv[1] == str(tree / "opt/jobgen" / images.declared().entrypoints[backend])
    assert env["JOBGEN_PAYLOAD_DIR"] == str(tree / "opt/jobgen/payload")
    assert env["JOBGEN_TRAINER_FILES"].startswith(str(tree / "workspace"))


def _batch_node(monkeypatch: Any, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """Node 0 of the rendered Batch job (env/sites/dl1-batch.yaml as it is, its EFS volume
    relocated under tmp_path), its entrypoint and payload from the declared image tree."""
    import os

    from jobgen.backends.batch import backend as batch
    monkeypatch.chdir(tmp_path)
    spec = api.job_spec("neox20b", 1, site="dl1-batch", backend="batch", smoke=True,
                        run_name="rh-batch", overrides=[f"job.master_port={_free_port()}"])
    container = batch.job_definition(spec)["nodeProperties"]["nodeRangeProperties"][0][
        "container"]
    assert spec.site.batch is not None and spec.site.batch.shared_volume == "/mnt/efs"
    moves = local_runner.image_moves(spec) + [("/mnt/efs/", f"{tmp_path}/efs/")]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_BATCH_", "JOBGEN_", "SLURM_", "MASTER_"))}
    env.update({e["name"]: local_runner.relocate(e["value"], moves)
                for e in container["environment"]})
    env.update({"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
                "AWS_BATCH_JOB_NUM_NODES": "1", "AWS_BATCH_JOB_ID": "rh#0",
                "JOBGEN_NET_IFACE": "lo", "JOBGEN_RDZV_TIMEOUT": "60",
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])})
    argv = ["bash", *(local_runner.relocate(a, moves) for a in container["command"])]
    assert argv[1] == str(local_runner.image_tree(spec) / "opt/jobgen/entrypoint.sh")
    return argv, env


def test_the_batch_entrypoint_stops_when_the_image_moves_the_trainer(monkeypatch: Any,
                                                                    tmp_path: Path) -> None:
    argv, env = _batch_node(monkeypatch, tmp_path)
    tree = Path(argv[1]).parents[2]
    shutil.move(str(tree / "workspace" / "neuronx-nemo-megatron"), str(tree / "elsewhere"))
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 78, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "the image does not hold the trainer where env/containers/images.yaml declares it" \
        in proc.stderr


@pytest.mark.slow
def test_the_batch_entrypoint_trains_in_the_declared_image(monkeypatch: Any,
                                                            tmp_path: Path) -> None:
    argv, env = _batch_node(monkeypatch, tmp_path)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = tmp_path / "efs" / "jobgen" / "runs" / "rh-batch"
    assert (run / "train" / "checkpoints").is_dir()


# --- what the service around the image needs from the job -------------------------------------

def test_nemo_writes_its_index_files_where_every_instance_has_them() -> None:
    """SageMaker mounts the site's FSx channel read-only (access_mode ro), and an S3 channel with
    FastFile (read-only too): NeMo, which writes its sample index files beside the data by
    default, is pointed into each instance's unsynced scratch (each builds its own:
    payload/common/node_indices.py). A read-write FSx channel keeps them beside the data, where
    every instance sees the files rank 0 builds."""
    import dataclasses

    from jobgen import payloads
    from jobgen.inputs import recipe
    from jobgen.inputs import site as sites

    def index_dir(site: str, backend: str, access_mode: str = "") -> list[str]:
        loaded = sites.load(site)
        if access_mode:
            assert loaded.sagemaker is not None and loaded.sagemaker.fsx is not None
            loaded = dataclasses.replace(loaded, sagemaker=dataclasses.replace(
                loaded.sagemaker, fsx=dataclasses.replace(loaded.sagemaker.fsx,
                                                          access_mode=access_mode)))
        rec, source = recipe.load("neox20b", [], backend)
        spec = payloads.resolved(rec, source, loaded, 4, backend=backend)
        return [a for a in payloads.for_spec(spec).train_args
                if a.startswith("model.data.index_mapping_dir=")]

    scratch = ["model.data.index_mapping_dir=/tmp/jobgen/neox20b-4n/index_mappings"]
    assert index_dir("sagemaker", "sagemaker") == scratch
    assert index_dir("local", "sagemaker") == scratch      # an S3 channel (FastFile)
    assert index_dir("sagemaker", "sagemaker", "rw") == []
    assert index_dir("trn1-pcluster", "slurm") == []


def test_p4d_jobs_carry_nccl_over_efa() -> None:
    """jobgen's entrypoint replaces SageMaker's training toolkit, so the EFA/NCCL settings the
    toolkit would export come from the platform file."""
    from jobgen.backends.sagemaker import backend as sagemaker
    spec = api.job_spec("llama2-7b", 16, site="sagemaker", backend="sagemaker")
    assert spec.platform.name == "p4d.24xlarge"
    env = sagemaker.training_job(spec)["Environment"]
    assert (env["FI_PROVIDER"], env["FI_EFA_USE_DEVICE_RDMA"]) == ("efa", "1")
    assert env["NCCL_PROTO"] == "simple" and env["FI_EFA_FORK_SAFE"] == "1"


# --- the payload digest a render computes (memoised in-process only) ------------------------

def test_the_rendered_digest_is_the_payloads_and_a_changed_file_changes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """jobgen's own payload (here a copy as JOBGEN_HOME's) is hashed like any folder; the
    in-process memo that `jobgen check` relies on never serves a changed file's old digest."""
    from jobgen.plumbing import resources
    home = tmp_path / "home"
    shutil.copytree(resources.folder("payload"), home / "payload",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    monkeypatch.setenv("JOBGEN_HOME", str(home))
    monkeypatch.setattr(snapshot, "_memo", {})
    full = snapshot.digest()
    assert full == snapshot.digest(home / "payload") and re.fullmatch(r"[0-9a-f]{64}", full)
    (home / "payload" / "common" / "init.py").write_text("# changed\n")
    changed = snapshot.digest()
    assert changed != full and changed == snapshot.digest(home / "payload")
    with pytest.raises(Exception, match="is not this jobgen's payload"):
        snapshot.export(tmp_path / "ctx", full)
    assert not (tmp_path / "ctx").exists()
    assert snapshot.export(tmp_path / "ctx2", changed).is_dir()
