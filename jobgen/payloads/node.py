"""The node contract: every variable a job's nodes receive, defined once.

payload/common/job_flow.sh (the one two-pass flow: compile marker, compile pass, node-local cache
copy, training pass, status, restarts) reads them, and so do the payload launchers. Every
executor produces them: the sbatch script exports them, the Batch job definition carries them
as its environment, submitit and `jobgen run` put them in the node's environment. The facts that
only the scheduler knows (which node this is, the main node's address, where this attempt logs)
are added on the node by the executor; they are listed in ``NODE_FACTS``.
"""
from __future__ import annotations

import json
from dataclasses import fields
from typing import Literal, Optional

from ..job.spec import JobSpec
from ..plumbing.record import record
from . import Launch, compile_cache_env, compile_key, env_block
from .base import say_once

Executor = str   # a backend's name (jobgen.backends.names()): what runs the nodes
Passes = Literal["both", "compile", "train"]

# What the executor sets on each node, at run time.
NODE_FACTS = {
    "MASTER_ADDR": "IPv4 address of the main node (torchrun's node rank 0)",
    "JOBGEN_NODE_RANK": "this node's torchrun node rank (0 on the main node)",
    "JOBGEN_NNODES": "nodes in the job",
    "JOBGEN_IS_MAIN": "1 on the main node (it writes the compile marker), else 0",
    "JOBGEN_LOG_DIR": "this attempt's log folder (node-R/PASS.log, PASS.status, job.status)",
    "JOBGEN_RUN_COMPILE": "1 or 0 where a controller decided the compile pass for all nodes",
    "JOBGEN_HEALTH_DONE": "1 where a controller ran the health gate on every node already",
    "JOBGEN_ATTEMPT": "the attempt a service numbers (EKS: JobSet's restarts + 1), where it does",
}


@record
class NodeContract:
    """The job-wide variables (name: the environment variable; doc: the field's comment)."""
    MASTER_PORT: str                  # the rendezvous port (recipe job.master_port)
    JOBGEN_RUN_DIR: str               # checkpoints, logs, the job's files (relative: from the cwd)
    JOBGEN_PAYLOAD_DIR: str           # jobgen's payload/ (launchers, job_flow.sh)
    JOBGEN_PAYLOAD_DIGEST: str        # the digest its .jobgen-digest must hold (snapshot.py)
    JOBGEN_LAUNCHER: str              # the launcher: under JOBGEN_PAYLOAD_DIR, or absolute
    JOBGEN_WORKERS_PER_NODE: str      # torchrun --nproc_per_node
    JOBGEN_WORKDIR: str               # the folder the trainer runs from
    JOBGEN_PROGRAM: str               # the trainer, relative to JOBGEN_WORKDIR
    JOBGEN_TRAINER_FILES: str         # ':'-separated files of the image's trainer, or ""
    JOBGEN_COMPILE_WRAPPER: str       # the compile pass's prefix (neuron_parallel_compile), or ""
    JOBGEN_COMPILE_STEPS: str         # steps of the compile pass (recipe compile.steps)
    JOBGEN_PASSES: str                # both | compile | train (one job of a --chain)
    JOBGEN_COMPILE_MODE: str          # auto | always | never
    JOBGEN_COMPILE_CACHE: str         # the shared compile cache (and its .jobgen/ markers)
    JOBGEN_LOCAL_COMPILE_CACHE: str   # node-local copy the training pass reads, or ""
    JOBGEN_COMPILE_KEY: str           # the marker's name: a hash of what shapes the graphs
    JOBGEN_CACHE_VAR: str             # the accelerator's cache variable
    JOBGEN_CACHE_SUFFIX: str          # what follows the folder in it (Habana's options)
    JOBGEN_NODES: str                 # the node count the arguments were computed for
    JOBGEN_MAX_RESTARTS: str          # requeues allowed after a failure (recipe job.max_restarts)
    JOBGEN_RESTARTS_IN_PLACE: str     # torchrun --max_restarts of the training pass, or "" (none)
    JOBGEN_SPARE_NODES: str           # Slurm: nodes allocated beyond JOBGEN_NODES, or "" (none)
    JOBGEN_RDZV_TIMEOUT: str          # seconds the nodes wait for each other, or "" (torch's)
    JOBGEN_COLLECTIVE_TIMEOUT: str    # seconds a collective waits for a peer before it fails
    JOBGEN_NODE_SILENCE: str          # Batch: seconds of a child's silence that end the attempt
    JOBGEN_SHARED_FS: str             # 1 where the nodes share the run and cache folders
    JOBGEN_SETUP_ON: str              # where files and prepare run: every | main | none
    JOBGEN_MASTER_RESOLVER: str       # nslookup | getent (Slurm: the first node's name -> IPv4)
    JOBGEN_LUSTRE_MAX_DIRTY_MB: str   # Slurm: lctl osc.*.max_dirty_mb set on each node, or ""
    JOBGEN_ACTIVATE: str              # a script to source first (site setup.activate), or ""
    JOBGEN_STOP_SIGNAL: str           # the trainer saves and stops on it (time limit), or ""
    JOBGEN_FILES_JSON: str            # {path under the run dir: content}, or ""
    JOBGEN_PREPARE_JSON: str          # [script under payload/, args...] run before the passes
    JOBGEN_HEALTH: str                # the health gate's checks as JSON (job/health.py), or ""
    JOBGEN_DATA: str                  # the data check's expectations as JSON (payloads/data.py)

    def variables(self) -> dict[str, str]:
        """Name -> value, empty values left out (the flow treats unset and empty alike)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: v for k, v in out.items() if v != ""}


def documentation() -> dict[str, str]:
    """Every variable of the contract with what it means, job-wide ones first."""
    import inspect
    import re

    doc: dict[str, str] = {}
    for line in inspect.getsource(NodeContract).splitlines():
        m = re.match(r"\s+([A-Z_]+): str\s+# (.*)", line)
        if m:
            doc[m.group(1)] = m.group(2)
    doc.update(NODE_FACTS)
    return doc


def contract(spec: JobSpec, lau: Launch, executor: Executor, *,
             passes: Passes = "both", base: str = "",
             rdzv_timeout_s: Optional[int] = None,
             shared: Optional[bool] = None,
             node_silence_s: Optional[int] = None) -> NodeContract:
    """The job-wide variables for `spec` run by `executor`. `base` is prefixed to relative site
    paths where the executor resolves them on the submitting machine (submitit); `shared`:
    whether the nodes share storage, where the site decides it (default: as declared)."""
    site, recipe = spec.site, spec.recipe

    def path(p: str) -> str:
        return p if not base or p.startswith("/") else f"{base}/{p}"

    from .. import backends
    ((cache_var, cache_value),) = compile_cache_env(spec, "DIR").items()
    # What the executor's nodes are, as it declares: containers (their entrypoint, env/containers/,
    # finds the node's place), on shared storage or each on its own disk (`shared` overrides
    # what it declares where its site decides: EKS pods share the FSx claim where it is one).
    declared = backends.declaration(executor)
    container = declared.container
    shared = declared.shared_fs if shared is None else shared
    if declared.stop_grace_s and not lau.stop_signal:
        _warn_no_stop(spec, executor, declared.stop_grace_s)
    if recipe.job.restarts_in_place and not shared:
        say_once(f"note: {spec.source}: job.restarts_in_place={recipe.job.restarts_in_place} does "
                 f"not apply on {executor}: its nodes do not share the run folder (each keeps "
                 "its own checkpoint part), so a failure goes to the service's retry")
    spares = recipe.job.spare_nodes if shared else 0
    if recipe.job.spare_nodes and declared.spares:
        say_once(f"note: {spec.source}: job.spare_nodes={recipe.job.spare_nodes} does not apply "
                 f"on {executor}: {declared.spares}")
    return NodeContract(
        MASTER_PORT=str(recipe.job.master_port),
        JOBGEN_RUN_DIR=path(spec.run_dir),
        JOBGEN_PAYLOAD_DIR=path(spec.payload_dir),
        JOBGEN_PAYLOAD_DIGEST=spec.payload_digest,
        JOBGEN_LAUNCHER=lau.launcher,
        JOBGEN_WORKERS_PER_NODE=str(spec.workers_per_node),
        JOBGEN_WORKDIR=path(lau.workdir),
        JOBGEN_PROGRAM=lau.program,
        # In jobgen's image, the trainer's files where images.yaml says they are: each node
        # checks them first (the real run and the --smoke rehearsal alike).
        JOBGEN_TRAINER_FILES=":".join(_image_trainer_files(spec)) if container else "",
        JOBGEN_COMPILE_WRAPPER=lau.compile_wrapper,
        JOBGEN_COMPILE_STEPS=str(recipe.compile.steps),
        JOBGEN_PASSES="" if passes == "both" else passes,
        JOBGEN_COMPILE_MODE=spec.compile_mode,
        JOBGEN_COMPILE_CACHE=path(site.paths.compile_cache),
        # Nodes on their own disks have no node-local cache step (their cache is their own).
        JOBGEN_LOCAL_COMPILE_CACHE=(site.paths.local_compile_cache or "")
        if declared.local_cache_step else "",
        JOBGEN_COMPILE_KEY=compile_key(spec, lau),
        JOBGEN_CACHE_VAR=cache_var,
        JOBGEN_CACHE_SUFFIX=cache_value[len("DIR"):],
        JOBGEN_NODES=str(spec.nodes),
        # Containers are restarted by their service (retry strategy, backoff limit).
        JOBGEN_MAX_RESTARTS=str(recipe.job.max_restarts) if not container else "",
        # Where the nodes share the run folder: the agents may rank the nodes otherwise than the
        # executor does, and a node on a disk of its own keeps its own checkpoint part.
        JOBGEN_RESTARTS_IN_PLACE=str(recipe.job.restarts_in_place)
        if recipe.job.restarts_in_place and shared else "",
        JOBGEN_SPARE_NODES=str(spares) if spares and not declared.spares else "",
        JOBGEN_RDZV_TIMEOUT="" if rdzv_timeout_s is None else str(rdzv_timeout_s),
        JOBGEN_COLLECTIVE_TIMEOUT=str(recipe.job.collective_timeout_s),
        JOBGEN_NODE_SILENCE="" if node_silence_s is None else str(node_silence_s),
        JOBGEN_SHARED_FS="1" if shared else "",
        # submitit's nodes share the folder: the main node writes, the others' trainers start
        # once it has reached the rendezvous. Slurm's controller does it once itself.
        JOBGEN_SETUP_ON="main" if declared.setup_on_main and shared else "",
        JOBGEN_MASTER_RESOLVER=site.slurm.master_resolver if declared.resolves_master else "",
        JOBGEN_LUSTRE_MAX_DIRTY_MB=str(site.slurm.lustre_max_dirty_mb or "")
        if declared.resolves_master else "",
        JOBGEN_ACTIVATE=(site.setup.activate or "") if not container else "",
        # Where the stop request reaches the trainers: Slurm's time-limit warning, forwarded by
        # the sbatch script's controller; a container's SIGTERM, turned into it by the flow.
        JOBGEN_STOP_SIGNAL=lau.stop_signal if declared.forwards_stop_signal else "",
        JOBGEN_FILES_JSON=json.dumps(dict(lau.files), sort_keys=True) if lau.files else "",
        JOBGEN_PREPARE_JSON=json.dumps(list(lau.prepare)) if lau.prepare else "",
        JOBGEN_HEALTH=_health(spec),
        JOBGEN_DATA=_data(spec),
    )


def _warn_no_stop(spec: JobSpec, executor: str, grace_s: int) -> None:
    """A trainer that cannot save on request (NeMo's) loses what it trained since its last
    periodic checkpoint when a container service ends the job at its time limit: only the
    recipe can make that smaller, so the render says so once."""
    every = spec.recipe.checkpoint.every_steps
    lost = (f"up to checkpoint.every_steps={every} steps" if every
            else f"up to checkpoint.every_seconds={spec.recipe.checkpoint.every_seconds} s "
                 "of training")
    say_once(f"note: {spec.source}: the {spec.recipe.payload} trainer cannot save on a stop "
             f"request; at a {executor} time limit it is killed {grace_s} s after SIGTERM and "
             f"resumes from its last periodic checkpoint ({lost} are lost): lower "
             "checkpoint.every_steps to lose fewer")


def _image_trainer_files(spec: JobSpec) -> tuple[str, ...]:
    from ..images.catalog import for_spec
    return for_spec(spec).trainer_files()


def _health(spec: JobSpec) -> str:
    from ..job import health
    checks = health.settings(spec)
    return json.dumps(checks, sort_keys=True, separators=(",", ":")) if checks else ""


def _data(spec: JobSpec) -> str:
    from . import data
    want = data.expectations(spec) if spec.recipe.job.data_check else None
    return json.dumps(want, sort_keys=True, separators=(",", ":")) if want is not None else ""


def environment(spec: JobSpec, lau: Launch, node: NodeContract) -> dict[str, str]:
    """Everything a node's environment gets from the job: the platform's and the recipe's
    variables, the compile cache variable (the flow points it at the node-local copy when there
    is one), then the contract."""
    env = dict(env_block(spec))
    env.update(compile_cache_env(spec, node.JOBGEN_COMPILE_CACHE))
    env.update(node.variables())
    return env


def flow_args(lau: Launch) -> list[str]:
    """COMPILE_ARGC COMPILE_ARG... TRAIN_ARG...: the arguments of `job_flow.sh node`."""
    return [str(len(lau.compile_args)), *lau.compile_args, *lau.train_args]
