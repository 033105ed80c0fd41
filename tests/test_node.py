"""The node contract (jobgen/payloads/node.py) is defined once and every executor produces it: the
sbatch script exports it, the Batch job definition carries it, submitit and `jobgen run` put it in
each node's environment. What the node-side scripts read is documented there."""
from __future__ import annotations

import re
import subprocess
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from jobgen import api, payloads
from jobgen.backends.batch import backend as batch
from jobgen.backends.local import runner as local_runner
from jobgen.backends.submitit import runner as submitit_runner
from jobgen.payloads import node

ROOT = Path(__file__).resolve().parent.parent
NODE_SCRIPTS = [ROOT / "payload" / "common" / "job_flow.sh",
                *sorted((ROOT / "payload" / "common" / "flow").glob("*.sh")),   # its stages
                ROOT / "payload" / "common" / "node_launch.sh",
                ROOT / "env" / "containers" / "entrypoint.sh"]
# Read by the node scripts but not part of the contract: a tool's own setting, and what the
# entrypoint reads from Batch (JOBGEN_NET_IFACE: which interface is the main node's address).
NOT_CONTRACT = {"JOBGEN_PYTHON", "JOBGEN_NET_IFACE", "JOBGEN_CONFIG_ERROR",
                "JOBGEN_CONFIG_PATTERNS"}
CONTRACT = [f.name for f in fields(node.NodeContract)]


def exported(script: str) -> dict[str, str]:
    """The variables a rendered sbatch script exports, as bash sees them."""
    head = script.partition("# ---- end of generated values")[0]

    def env_after(text: str) -> dict[str, str]:
        out = subprocess.run(["bash", "--noprofile", "--norc", "-c", text + "\nenv -0\n}"],
                             env={"PATH": "/usr/bin:/bin"}, capture_output=True,
                             check=True).stdout.decode()
        return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)

    bash_own = env_after("{")    # PWD, SHLVL, _ ...
    return {k: v for k, v in env_after(head).items() if k not in bash_own}


def environments(recipe: str, nodes: int, smoke: bool = False) -> dict[str, dict[str, str]]:
    """executor -> the job-wide environment it gives a node."""
    out: dict[str, dict[str, Any]] = {}
    spec = api.job_spec(recipe, nodes, smoke=smoke)
    out["slurm"] = exported(api.plan(spec).text)
    bspec = api.job_spec(recipe, nodes, backend="batch", smoke=smoke)
    container = batch.job_definition(bspec)["nodeProperties"]["nodeRangeProperties"][0][
        "container"]
    out["batch"] = {e["name"]: e["value"] for e in container["environment"]}
    out["submitit"] = dict(submitit_runner.node_task(spec).env)
    out["local"] = local_runner.node_commands(spec, "job-1")[0][1]
    return out


def test_every_variable_the_node_scripts_read_is_documented_once() -> None:
    documented = node.documentation()
    assert set(CONTRACT) <= set(documented)
    assert all(documented[name] for name in documented)
    read = set()
    for script in NODE_SCRIPTS:
        read |= set(re.findall(r"\b(JOBGEN_[A-Z_]+|MASTER_(?:ADDR|PORT))\b", script.read_text()))
    undocumented = read - set(documented) - NOT_CONTRACT
    assert undocumented == set(), (
        f"read on the nodes but not in jobgen/payloads/node.py: {undocumented}")


@pytest.mark.parametrize("recipe,nodes,smoke", [("neox20b", 4, False), ("llama2-7b", 2, False),
                                                ("bert1.5b", 2, True)])
def test_every_executor_gives_the_nodes_the_same_job(recipe: str, nodes: int,
                                                      smoke: bool) -> None:
    envs = environments(recipe, nodes, smoke)
    spec = api.job_spec(recipe, nodes, smoke=smoke)
    lau = payloads.for_spec(spec)
    for executor, env in envs.items():
        # Always there, on every executor.
        for name in ("MASTER_PORT", "JOBGEN_RUN_DIR", "JOBGEN_PAYLOAD_DIR", "JOBGEN_LAUNCHER",
                     "JOBGEN_WORKERS_PER_NODE", "JOBGEN_WORKDIR", "JOBGEN_PROGRAM",
                     "JOBGEN_COMPILE_CACHE", "JOBGEN_COMPILE_KEY", "JOBGEN_CACHE_VAR",
                     "JOBGEN_NODES", "JOBGEN_COMPILE_MODE", "JOBGEN_COMPILE_STEPS"):
            assert env.get(name), f"{executor}: {name} is missing"
        assert env["JOBGEN_LAUNCHER"] == lau.launcher, executor
        assert env["JOBGEN_PROGRAM"] == lau.program, executor
        assert env["JOBGEN_NODES"] == str(nodes), executor
        assert env["MASTER_PORT"] == str(spec.recipe.job.master_port), executor
        for name, value in payloads.env_block(spec):
            assert env.get(name) == value, f"{executor}: {name}"
        assert env["JOBGEN_RUN_DIR"].endswith(spec.run_dir), executor
        assert not set(env) - set(CONTRACT) - set(node.NODE_FACTS) - {
            n for n, _ in payloads.env_block(spec)} - {"FLOW_WHO", env["JOBGEN_CACHE_VAR"]}, \
            f"{executor}: variables outside the contract"
    # The compile key names the same graphs whoever runs them.
    assert len({env["JOBGEN_COMPILE_KEY"] for env in envs.values()}) == 1
    # Restarts are the scheduler's business on Slurm and submitit, Batch's retry strategy there.
    assert envs["slurm"]["JOBGEN_MAX_RESTARTS"] == envs["submitit"]["JOBGEN_MAX_RESTARTS"]
    assert "JOBGEN_MAX_RESTARTS" not in envs["batch"]
    # Batch nodes of the local site (no shared volume) do not share a folder; the others do.
    assert "JOBGEN_SHARED_FS" not in envs["batch"]
    assert {envs[e]["JOBGEN_SHARED_FS"] for e in ("slurm", "submitit", "local")} == {"1"}


def test_node_facts_come_from_the_executor() -> None:
    """`jobgen run` gives each emulated node its rank and the main node's address."""
    spec = api.job_spec("bert1.5b", 2, smoke=True)
    nodes = local_runner.node_commands(spec, "job-1")
    assert [env["JOBGEN_NODE_RANK"] for _, env in nodes] == ["0", "1"]
    assert [env["JOBGEN_IS_MAIN"] for _, env in nodes] == ["1", "0"]
    assert {env["MASTER_ADDR"] for _, env in nodes} == {"127.0.0.1"}
    argv = nodes[0][0]
    snapshot = Path.cwd() / "jobgen-runs" / ".jobgen" / "payload" / spec.payload_digest[:16]
    assert argv[:3] == ["bash", str(snapshot / "common" / "job_flow.sh"), "node"]
    lau = payloads.for_spec(spec)
    assert argv[3:] == node.flow_args(lau)
