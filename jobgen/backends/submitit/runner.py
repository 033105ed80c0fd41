"""Submitting a job spec through submitit. submitit runs `run_node` once per node; each node runs
the one two-pass flow (payload/common/job_flow.sh) with the node contract (jobgen/payloads/node.py)
and the facts submitit gives it, exactly as the sbatch script's nodes do. The main node does the
restart accounting the sbatch script does: after a failure that a restart can cure it requeues
the job until `job.max_restarts` is used. `submit` returns the submitit Job."""
from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ... import payloads
from ...job.spec import JobSpec
from ...payloads import node
from ...plumbing.errors import ConfigError
from ..slurm.options import EXTRA, sbatch_lines

# What submitit's job gets when the recipe sets no job.time_limit (Slurm's partition default
# would apply to an sbatch script; submitit always sends one).
DEFAULT_TIMEOUT_MIN = 60 * 24 * 3


@dataclass(frozen=True, slots=True)
class NodeTask:
    """Everything a node needs, resolved on the submitting machine (picklable, no jobgen
    objects): the flow, its arguments, and the node's environment from the job."""
    flow: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    run_dir: str


def node_task(spec: JobSpec) -> NodeTask:
    lau = payloads.for_spec(spec, "submitit")
    contract = node.contract(spec, lau, "submitit", base=str(Path.cwd()))
    env = node.environment(spec, lau, contract)
    return NodeTask(flow=f"{contract.JOBGEN_PAYLOAD_DIR}/common/job_flow.sh",
                    args=tuple(node.flow_args(lau)), env=tuple(env.items()),
                    run_dir=contract.JOBGEN_RUN_DIR)


def _flow(task: NodeTask, env: dict[str, str], *call: str) -> str:
    """A function of job_flow.sh, run in bash; its output."""
    script = 'source "$0" && "$@"'
    return subprocess.run(["bash", "-c", script, task.flow, *call], env=env, check=False,
                          capture_output=True, text=True).stdout.strip()


def run_node(task: NodeTask) -> dict[str, Any]:
    """Runs on every node of the allocation (one submitit task per node)."""
    import submitit

    job = submitit.JobEnvironment()
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    env = dict(os.environ)
    env.update(task.env)
    resolver = env.get("JOBGEN_MASTER_RESOLVER", "nslookup")
    master = _flow(task, env, "flow_resolve_master", job.hostnames[0], resolver)
    if not master:
        raise RuntimeError(f"cannot resolve the first node {job.hostnames[0]!r} to an IPv4 "
                           f"address with {resolver}")
    log_dir = f"{task.run_dir}/logs/{job.job_id}/restart-{restart}"
    env.update({"MASTER_ADDR": master, "JOBGEN_NODE_RANK": str(job.node),
                "JOBGEN_NNODES": str(job.num_nodes), "JOBGEN_IS_MAIN": str(int(job.node == 0)),
                "JOBGEN_LOG_DIR": log_dir, "FLOW_WHO": f"jobgen[node {job.node}]"})
    rc = subprocess.run(["bash", task.flow, "node", *task.args], env=env, check=False).returncode
    compiled = Path(log_dir, f"node-{job.node}", "compile.status").exists()
    if rc != 0:
        decision = _flow(task, env, "flow_restart_decision", str(rc), str(restart))
        if job.node == 0 and decision == "requeue":
            print(f"jobgen: the job failed with status {rc}; requeueing (restart {restart + 1} "
                  f"of {env.get('JOBGEN_MAX_RESTARTS', '0')})", flush=True)
            requeued = subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]],
                                      check=False).returncode == 0
            if requeued:
                # Slurm stops this attempt now; returning would record a result for it.
                time.sleep(3600)
        why = {"stop": "a configuration error: not requeued",
               "give-up": "the job has used all its restarts"}.get(decision, "")
        raise RuntimeError(f"the job failed on node {job.node} with status {rc}"
                           + (f" ({why})" if why else ""))
    return {"node": job.node, "nodes": job.num_nodes, "compiled": compiled, "status": rc,
            "restart": restart}


def time_limit_minutes(limit: Optional[str]) -> int:
    """A Slurm time limit (MINUTES, [HH:]MM:SS, D-HH[:MM[:SS]], as the recipe allows) in
    whole minutes, rounded up; no limit (or UNLIMITED) is DEFAULT_TIMEOUT_MIN."""
    if not limit or limit.upper() == "UNLIMITED":
        return DEFAULT_TIMEOUT_MIN
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:        # D-HH, D-HH:MM, D-HH:MM:SS
        parts += [0] * (3 - len(parts))
        hours, minutes, seconds = parts
        hours += 24 * int(days)
    elif len(parts) == 1:   # MINUTES
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:   # MM:SS
        hours, (minutes, seconds) = 0, parts
    else:                   # HH:MM:SS
        hours, minutes, seconds = parts
    return max(1, hours * 60 + minutes + (1 if seconds else 0))


def executor_parameters(spec: JobSpec) -> dict[str, Any]:
    """submitit's parameters for the spec: the sbatch script's, as submitit names them."""
    site = spec.site
    values = spec.options
    extra: dict[str, Any] = {"requeue": True}
    if spec.exclusive:
        extra["exclusive"] = True
    # sbatch's own option names, as submitit passes additional parameters through (the
    # partition and the time limit are submitit's own parameters, below).
    for option, value in sbatch_lines(values):
        if option not in ("partition", "time"):
            extra[option] = value
    for option, value in values.get(EXTRA, ()):   # --sbatch-opt, the site's extra_options
        if option == "array":
            raise ConfigError("--sbatch-opt array=%N: submitit submits each job of a sweep on "
                              "its own (no job array to throttle)")
        extra[option.replace("-", "_")] = value or True
    params: dict[str, Any] = {
        "name": spec.job_name, "nodes": spec.nodes, "tasks_per_node": 1,
        "cpus_per_task": site.slurm.cpus_per_task, "slurm_additional_parameters": extra,
    }
    params["timeout_min"] = time_limit_minutes(values.get("time_limit"))
    if values.get("partition"):
        params["slurm_partition"] = values["partition"]
    return params


def dry_run(spec: JobSpec) -> dict[str, Any]:
    """What `submit` hands submitit: its parameters, and the command every node runs (with the
    environment it adds to the node's; the facts submitit knows only there are named)."""
    task = node_task(spec)
    return {"submitit": {"folder": str(Path(task.run_dir) / "submitit"),
                         "parameters": executor_parameters(spec)},
            "node": {"argv": ["bash", task.flow, "node", *task.args], "env": dict(task.env),
                     "facts": {k: v for k, v in node.NODE_FACTS.items()
                               if k != "JOBGEN_RUN_COMPILE"}}}


def submit(spec: JobSpec, folder: Optional[Path] = None) -> Any:
    """Submit through submitit; returns its Job (`job.results()` gives one dict per node)."""
    try:
        import submitit
    except ImportError:
        raise ConfigError("--via submitit needs submitit: pip install 'jobgen[submitit]'") from None
    from ...images import snapshot
    # The payload the nodes run: its snapshot on the shared storage (placed once, verified).
    snapshot.place(spec.site.snapshot_root, spec.payload_digest)
    task = node_task(spec)
    executor = submitit.AutoExecutor(folder=str(folder or Path(task.run_dir) / "submitit"))
    executor.update_parameters(**executor_parameters(spec))
    return executor.submit(run_node, task)
