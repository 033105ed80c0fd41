"""The stages of a recipe's pipeline on one site and one run folder: prepare, then train (the
two passes, the default). Each stage is a small declaration: what it runs on the nodes and on
how many; a backend renders any declared stage the same way (export and eval register here).
"""
from __future__ import annotations

import posixpath
from typing import Callable, Optional

from ..job.spec import JobSpec, shard_names
from ..plumbing.errors import ConfigError
from ..plumbing.record import record
from . import REGISTRY


@record
class StageWork:
    """One stage's job: a program under the payload folder, one argument list per task (a job
    array where there are several), and what the user is told when it is rendered."""
    program: str
    tasks: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()


Work = Callable[[JobSpec, tuple[str, ...]], StageWork]


@record
class Stage:
    name: str
    summary: str
    one_node: bool = False          # one node of slurm.prepare_partition (else the recipe's)
    work: Optional[Work] = None     # None: the training job itself (the two passes)


def _nemo_checkout(spec: JobSpec) -> str:
    """The NeMo repository's root from the site's paths.nemo_dir
    (<root>/nemo/examples/nlp/language_modeling)."""
    nemo_dir = spec.site.paths.nemo_dir
    if not nemo_dir:
        raise ConfigError(f"site {spec.site.name}: paths.nemo_dir is required by the prepare "
                          "stage (NeMo's preprocessing script is in that checkout)")
    return posixpath.normpath(posixpath.join(nemo_dir, "..", "..", "..", ".."))


def _megatron(spec: JobSpec, sources: tuple[str, ...]) -> StageWork:
    """NeMo's preprocess_data_for_megatron.py, one task per --from input (each its shard), or
    the tutorial's public sample."""
    data = spec.recipe.data
    if not data.vocab_file or not data.merge_file:
        raise ConfigError(f"{spec.source}: data.vocab_file and data.merge_file are needed to "
                          "prepare a GPT-2 BPE dataset")
    shards = shard_names(data.path, data.shards)
    if sources and len(sources) != len(shards):
        raise ConfigError(f"{spec.source}: --from gives {len(sources)} inputs and data.shards "
                          f"is {data.shards}: one shard per input (--set "
                          f"data.shards={len(sources)} here and for training)")
    if not sources and data.shards > 1:
        raise ConfigError(f"{spec.source}: data.shards={data.shards} needs --from with "
                          f"{data.shards} inputs (the public sample is one prefix)")
    script = posixpath.join(_nemo_checkout(spec), "nemo", "scripts", "nlp_language_modeling",
                            "preprocess_data_for_megatron.py")
    common = ("--data-dir", spec.site.paths.data_dir, "--vocab-file", data.vocab_file,
              "--merge-file", data.merge_file, "--nemo-script", script,
              "--workers", str(spec.site.slurm.cpus_per_task))
    tasks = tuple(("--output", shard, *common, *(("--from", sources[k]) if sources else ()))
                  for k, shard in enumerate(shards))
    notes = () if sources else (
        f"prepare: no --from: the job fetches the public sample {spec.recipe.name}'s source "
        f"used (GPT-2 vocab and merges, tokenized Wikipedia) into {spec.data_path(data.path)}",)
    return StageWork(program="neuron_nemo/prepare.py", tasks=tasks, notes=notes)


def _rehearsal(spec: JobSpec, fmt: str, sources: tuple[str, ...]) -> StageWork:
    """A --smoke job's dataset: payload/smoke/prepare_data.py writes the recipe's names at the
    rehearsal's sizes (the data check and the smoke trainer judge it by the same), from the
    --from files or a corpus generated from the recipe's seed."""
    data, t = spec.recipe.data, spec.rehearsal
    assert t is not None, "the rehearsal's prepare stage is for --smoke specs"
    if data.shards > 1:
        raise ConfigError(f"{spec.source}: data.shards={data.shards}: a rehearsal's prepare "
                          "stage makes one shard (--set data.shards=1)")
    args = ["--format", fmt, "--data-dir", spec.site.paths.data_dir, "--path", data.path]
    if fmt == "megatron":
        if not data.vocab_file or not data.merge_file:
            raise ConfigError(f"{spec.source}: data.vocab_file and data.merge_file are needed "
                              "to prepare a GPT-2 BPE dataset")
        args += ["--vocab-file", data.vocab_file, "--merge-file", data.merge_file]
    args += ["--seq-length", str(t.seq_length), "--vocab-size", str(t.vocab_size),
             "--seed", str(spec.recipe.seed)]
    if fmt == "bert_hdf5":
        args += ["--max-predictions", str(t.max_predictions)]
    if sources:
        args += ["--from", *sources]
    notes = () if sources else (
        f"prepare: no --from: the rehearsal's corpus is generated from seed {spec.recipe.seed} "
        f"(nothing is downloaded) into {spec.data_path(data.path)}",)
    return StageWork(program="smoke/prepare_data.py", tasks=(tuple(args),), notes=notes)


# What the prepare stage runs, by the dataset format the payload declares (payloads/data.py).
PREPARE = {"megatron": _megatron}
REHEARSED = ("megatron", "hf_blocks", "bert_hdf5")   # what prepare_data.py writes


def _prepare(spec: JobSpec, sources: tuple[str, ...]) -> StageWork:
    payload = REGISTRY.get(spec.recipe.payload)
    fmt = payload.data[0] if payload is not None and payload.data else ""
    if spec.smoke and fmt in REHEARSED:
        return _rehearsal(spec, fmt, sources)
    if fmt not in PREPARE:
        raise ConfigError(f"{spec.source}: --stage prepare is not available for payload "
                          f"{spec.recipe.payload} yet (only for {', '.join(PREPARE)} datasets)")
    return PREPARE[fmt](spec, sources)


STAGES = {
    "prepare": Stage("prepare", "make the dataset the recipe's data: section names",
                     one_node=True, work=_prepare),
    "train": Stage("train", "the compile pass, then the training pass"),
}


def stage(name: str) -> Stage:
    if name not in STAGES:
        raise ConfigError(f"unknown stage {name!r} (one of {', '.join(STAGES)})")
    return STAGES[name]


def chain(text: str) -> tuple[str, ...]:
    """--stages a,b,...: known stages, in pipeline order, each once."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    order = list(STAGES)
    for name in names:
        stage(name)
    if not names or list(names) != sorted(set(names), key=order.index):
        raise ConfigError(f"--stages {text}: stages in pipeline order, each once "
                          f"({','.join(order)})")
    return names
