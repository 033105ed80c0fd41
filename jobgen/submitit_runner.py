"""Submitting a job spec through submitit: the same payload launcher, arguments and environment
as the sbatch script, with the Slurm parameters mapped from the spec. submitit runs `run_node`
once per node; each node runs the compile pass (unless the cache marker says it is done), then
the training pass, and returns what happened. `submit` returns the submitit Job."""
from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from . import launch
from .errors import ConfigError
from .spec import JobSpec


@dataclass(frozen=True)
class NodeTask:
    """Everything a node needs, resolved on the submitting machine (picklable, no jobgen
    objects), so that the nodes do the same thing the sbatch script would."""
    payload_dir: str
    launcher: str
    compile_args: tuple[str, ...]
    train_args: tuple[str, ...]
    prepare: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    run_dir: str
    compile_mode: str
    marker: str
    master_port: int


def node_task(spec: JobSpec) -> NodeTask:
    lau = launch.for_spec(spec, "slurm")
    cwd = Path.cwd()
    run_dir = str(cwd / spec.run_dir)
    cache = str(cwd / spec.site.paths.compile_cache)
    env = dict(launch.env_block(spec))
    env.update(launch.compile_cache_env(spec, cache))
    env.update({"JOBGEN_WORKERS_PER_NODE": str(spec.workers_per_node),
                "JOBGEN_WORKDIR": str(cwd / lau.workdir), "JOBGEN_PROGRAM": lau.program,
                "JOBGEN_COMPILE_WRAPPER": lau.compile_wrapper,
                "MASTER_PORT": str(spec.recipe.job.master_port)})
    return NodeTask(payload_dir=str(cwd / spec.payload_dir), launcher=lau.launcher,
                    compile_args=lau.compile_args, train_args=lau.train_args,
                    prepare=lau.prepare, env=tuple(env.items()), run_dir=run_dir,
                    compile_mode=spec.compile_mode,
                    marker=f"{cache}/.jobgen/{launch.compile_key(spec, lau)}.done",
                    master_port=spec.recipe.job.master_port)


def run_node(task: NodeTask) -> dict[str, Any]:
    """Runs on every node of the allocation (one submitit task per node)."""
    import submitit

    job = submitit.JobEnvironment()
    env = dict(os.environ)
    env.update(task.env)
    env.update({"JOBGEN_NODE_RANK": str(job.node), "JOBGEN_NNODES": str(job.num_nodes),
                "MASTER_ADDR": socket.gethostbyname(job.hostnames[0]),
                "JOBGEN_LOG_DIR": f"{task.run_dir}/logs/{job.job_id}",
                "JOBGEN_RUN_DIR": task.run_dir})
    launcher = f"{task.payload_dir}/{task.launcher}"
    if task.prepare:
        subprocess.run(["python", f"{task.payload_dir}/{task.prepare[0]}", *task.prepare[1:]],
                       env=env, check=True)
    compiled = task.compile_mode == "always" or (
        task.compile_mode == "auto" and not Path(task.marker).exists())
    if compiled:
        rc = subprocess.run(["bash", launcher, "compile", *task.compile_args], env=env).returncode
        if rc != 0:
            raise RuntimeError(f"compile pass failed on node {job.node} with status {rc}")
        if job.node == 0:
            Path(task.marker).parent.mkdir(parents=True, exist_ok=True)
            Path(task.marker).write_text("compiled\n")
    rc = subprocess.run(["bash", launcher, "train", *task.train_args], env=env).returncode
    if rc != 0:
        raise RuntimeError(f"training pass failed on node {job.node} with status {rc}")
    return {"node": job.node, "nodes": job.num_nodes, "compiled": compiled, "status": rc}


def submit(spec: JobSpec, folder: Optional[Path] = None) -> Any:
    """Submit through submitit; returns its Job (`job.results()` gives one dict per node)."""
    try:
        import submitit
    except ImportError:
        raise ConfigError("--via submitit needs submitit: pip install 'jobgen[submitit]'") from None
    site = spec.site
    task = node_task(spec)
    executor = submitit.AutoExecutor(folder=str(folder or Path(task.run_dir) / "submitit"))
    extra: dict[str, Any] = {"requeue": True}
    if site.slurm.exclusive:
        extra["exclusive"] = True
    if site.slurm.account:
        extra["account"] = site.slurm.account
    params: dict[str, Any] = {
        "name": spec.recipe.name, "nodes": spec.nodes, "tasks_per_node": 1,
        "cpus_per_task": site.slurm.cpus_per_task, "slurm_additional_parameters": extra,
        "timeout_min": 60 * 24 * 3,
    }
    if site.slurm.partition:
        params["slurm_partition"] = site.slurm.partition
    executor.update_parameters(**params)
    return executor.submit(run_node, task)
