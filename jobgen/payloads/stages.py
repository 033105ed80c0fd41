"""The stages of a recipe's pipeline on one site and one run folder: prepare, then train (the
two passes, the default), then export (a sealed step as a Hugging Face folder), then eval (an
exported step scored by lm-eval). Each stage is a small declaration: what it runs on the nodes
and on how many; a backend renders any declared stage the same way.
"""
from __future__ import annotations

import dataclasses
import posixpath
from typing import Callable, Optional, Sequence

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
    training_node: bool = False     # on a node of the training partition, not the prepare one


# (spec, the --from inputs, the --step N or None): the stage's job.
Work = Callable[[JobSpec, tuple[str, ...], Optional[int]], StageWork]


@record
class Stage:
    name: str
    summary: str
    one_node: bool = False          # one node of slurm.prepare_partition (else the recipe's)
    work: Optional[Work] = None     # None: the training job itself (the two passes)
    takes_step: bool = False        # --step N: the sealed step it works on


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


# Model-References' bertPrep.py downloads this (WikiDownloader.py); its size as Wikipedia said
# (Wikipedia:Size of Wikipedia: 22.14 GB compressed on 2 July 2023, about 1 GB more a year).
WIKIPEDIA_DUMP = "https://dumps.wikimedia.org/enwiki/latest/enwiki-latest-pages-articles.xml.bz2"


def _bert_sample(spec: JobSpec) -> str:
    nltk_data = spec.data_path("nltk_data")
    return (f"prepare: no --from: the job downloads the English Wikipedia dump that "
            f"Model-References' bertPrep.py uses ({WIKIPEDIA_DUMP}, over 22 GB compressed, "
            "plus the text extracted from it: the data folder needs room for both, the node "
            "memory for the text), extracts its articles with WikiExtractor (the wikiextractor "
            "package), splits them into sentences with NLTK's English punkt_tab model (from "
            f"NLTK_DATA or {nltk_data}, read offline; where neither has it, the job first "
            f"fetches it there with NLTK's downloader, as `python -m nltk.downloader -d "
            f"{nltk_data} punkt_tab` would), and writes the shards into "
            f"{spec.data_path(spec.recipe.data.path)}; the node's Python needs wikiextractor "
            "and nltk (jobgen's data extra; the dl1-deepspeed image has both)")


DUMP_SUFFIXES = (".xml", ".xml.bz2")   # a MediaWiki XML export, as Wikipedia's dumps are named


def _wiki_dump(spec: JobSpec, fmt: str, sources: tuple[str, ...]) -> str:
    """The --from that names a MediaWiki dump (BERT's Wikipedia source, read as bertPrep.py
    reads the one it downloads: prepare_tokenized.py --wiki-dump), or ""."""
    dumps = [s for s in sources if s.lower().endswith(DUMP_SUFFIXES)]
    if not dumps:
        return ""
    if fmt != "bert_hdf5" or len(sources) > 1:
        raise ConfigError(f"{spec.source}: --from {dumps[0]}: a MediaWiki dump (.xml, .xml.bz2) "
                          "is read only by the BERT recipes' prepare stage, as its one --from")
    if dumps[0].startswith("s3://"):
        raise ConfigError(f"{spec.source}: --from {dumps[0]}: a MediaWiki dump is read from a "
                          "path the node sees, a file:// or an https:// URL (copy it from S3 to "
                          "the shared file system first)")
    return dumps[0]


def _dump_note(spec: JobSpec, dump: str) -> str:
    return (f"prepare: --from {dump} is a MediaWiki dump: the job makes its text as "
            "Model-References' bertPrep.py makes Wikipedia's (WikiExtractor, then NLTK's punkt_tab "
            f"from NLTK_DATA or {spec.data_path('nltk_data')}) and writes the shards into "
            f"{spec.data_path(spec.recipe.data.path)}; the node's Python needs wikiextractor "
            "and nltk")


def _tokenized(fmt: str, spec: JobSpec, sources: tuple[str, ...]) -> StageWork:
    """payload/common/prepare_tokenized.py with the recipe's tokenizer (data.tokenizer): the
    packed blocks, or BERT's hdf5 shards (jobgen/payloads/upstream/prepare_tokenized.json)."""
    data, model = spec.recipe.data, spec.recipe.model
    if not data.tokenizer:
        raise ConfigError(f"{spec.source}: data.tokenizer is needed to prepare this dataset "
                          "(a Hugging Face hub name or a folder under the data folder)")
    if data.shards > 1:
        raise ConfigError(f"{spec.source}: data.shards={data.shards} is for Megatron datasets "
                          "(--set data.shards=1)")
    args = ["--format", fmt, "--data-dir", spec.site.paths.data_dir, "--path", data.path,
            "--tokenizer", data.tokenizer, "--seq-length", str(model.seq_length),
            "--workers", str(spec.site.slurm.cpus_per_task)]
    if fmt == "bert_hdf5":
        args += ["--max-predictions", str(model.max_predictions)]
    dump = _wiki_dump(spec, fmt, sources)
    if dump:
        args += ["--wiki-dump", dump]
    elif sources:
        args += ["--from", *sources]
    notes = [_dump_note(spec, dump)] if dump else [] if sources else [
        _bert_sample(spec) if fmt == "bert_hdf5" else (
        f"prepare: no --from: the job fetches the tutorial's corpus (wikicorpus raw_en) and "
        f"reads its raw text into {spec.data_path(data.path)} (datasets >= 4 no longer runs "
        "the wikicorpus loading script)")]
    if not posixpath.isabs(data.tokenizer) and "/" in data.tokenizer:
        notes.append(f"prepare: tokenizer {data.tokenizer} comes from the Hugging Face hub; a "
                     "gated one reads HF_TOKEN from the job's environment on the node (export "
                     "it before submitting; it is never written into the job)")
    return StageWork(program="common/prepare_tokenized.py", tasks=(tuple(args),),
                     notes=tuple(notes))


# What the prepare stage runs, by the dataset format the payload declares (payloads/data.py).
PREPARE = {"megatron": _megatron,
           "hf_blocks": lambda spec, sources: _tokenized("hf_blocks", spec, sources),
           "bert_hdf5": lambda spec, sources: _tokenized("bert_hdf5", spec, sources)}
REHEARSED = ("megatron", "hf_blocks", "bert_hdf5")   # what prepare_data.py writes


def _prepare(spec: JobSpec, sources: tuple[str, ...], step: Optional[int]) -> StageWork:
    payload = REGISTRY.get(spec.recipe.payload)
    fmt = payload.data[0] if payload is not None and payload.data else ""
    if spec.smoke and fmt in REHEARSED:
        return _rehearsal(spec, fmt, sources)
    if fmt not in PREPARE:
        raise ConfigError(f"{spec.source}: --stage prepare is not available for payload "
                          f"{spec.recipe.payload} yet (only for {', '.join(PREPARE)} datasets)")
    return PREPARE[fmt](spec, sources)


# --- export: smoke/export_smoke.py, habana_deepspeed/export_bert.py, neuron_nemo/export_neox.py

EXPORT_ROOT = "export"              # RUN/export/step-N/ (docs/model-out.md)


def _tokenizer_args(spec: JobSpec, declared: tuple[str, ...]) -> tuple[str, ...]:
    """Which tokenizer a rehearsal's export saves: its prepared dataset's (GPT-2 BPE files, the
    Llama-style folder, BERT's vocab.txt), else one trained from the recipe's seed (it trained
    on made-up token ids)."""
    from . import data_want
    want = data_want.wanted(spec, declared)
    data = spec.recipe.data
    if want and want["format"] == "megatron" and data.vocab_file and data.merge_file:
        return ("--tokenizer-files", spec.data_path(data.vocab_file),
                spec.data_path(data.merge_file))
    if want and want["format"] == "hf_blocks":
        return ("--tokenizer", want["path"])
    if want and want["format"] == "bert_hdf5":
        return ("--tokenizer-files", posixpath.join(want["path"], "vocab.txt"))
    return ("--tokenizer-seed", str(spec.recipe.seed))


def _export(spec: JobSpec, sources: tuple[str, ...], step: Optional[int]) -> StageWork:
    """The payload's export program with the training pass's own flags (the model's shape and
    where its data is), the run's tokenizer, RUN/export and the step (default: the newest
    sealed one that can be proven, when the job starts). Rehearsals, NeMo's, NxD's and SMP's
    own runs (docs/model-out.md)."""
    from . import for_spec
    name = spec.recipe.payload
    if spec.rehearsal is None and name == "habana_deepspeed":
        return _bert_export(spec, step)
    if spec.rehearsal is None and name == "neuronx_distributed":
        return _nxd_export(spec, step)
    if spec.rehearsal is None and name == "neuron_nemo":
        return _nemo_export(spec, step)
    if spec.rehearsal is None and name == "smp_fsdp":
        return _smp_export(spec, step)
    if spec.rehearsal is None:
        raise ConfigError(f"{spec.source}: --stage export is not available for payload {name} "
                          "yet (only for --smoke rehearsals: docs/model-out.md)")
    payload = REGISTRY.get(name)
    if payload is not None and payload.rehearses_itself:
        # Its rehearsal runs its own trainer (smp_fsdp.py): its own export reads the checkpoints.
        program = OWN_EXPORT[name]
    else:
        program = ("habana_deepspeed/export_bert.py" if spec.rehearsal.family == "bert"
                   else "smoke/export_smoke.py")
    args = (*for_spec(spec).train_args,
            *_tokenizer_args(spec, payload.data if payload is not None else ()),
            "--export-root", posixpath.join(spec.run_dir, EXPORT_ROOT),
            *(("--step", str(step)) if step is not None else ()), "--on-node")
    return StageWork(program=program, tasks=(args,))


BERT_PROOF_MICRO_BATCHES = 8   # of a global batch of 65,536 samples: the proof's sample


def _bert_export(spec: JobSpec, step: Optional[int]) -> StageWork:
    """payload/habana_deepspeed/export_bert.py with the training pass's flags and the vocab.txt
    the prepare stage wrote beside the shards (the trainer's WordPiece vocabulary), proven on
    the step's first micro-batches. bert1.5b's LayerNorm placement has no BertConfig: refused
    here, before a node is spent (the program refuses it too)."""
    from . import for_spec
    if spec.recipe.model.layer_norm_large_model:
        raise ConfigError(f"{spec.source}: model.layer_norm_large_model: --stage export cannot "
                          "make a Hugging Face BERT of it: this LayerNorm placement has no "
                          "BertConfig, and stock BertForPreTraining would load the weights and "
                          "compute another function (docs/model-out.md)")
    proof = min(BERT_PROOF_MICRO_BATCHES, spec.global_batch_size // spec.micro_batch_size)
    args = (*for_spec(spec).train_args,
            "--tokenizer-files", posixpath.join(spec.data_path(spec.recipe.data.path),
                                                "vocab.txt"),
            "--micro-batches", str(proof),
            "--export-root", posixpath.join(spec.run_dir, EXPORT_ROOT),
            *(("--step", str(step)) if step is not None else ()), "--on-node")
    return StageWork(program="habana_deepspeed/export_bert.py", tasks=(args,))


NXD_PROOF_MICRO_BATCHES = 8   # a 7B model's fp32 forward of 4,096 tokens: about a minute on CPU


def _nxd_export(spec: JobSpec, step: Optional[int]) -> StageWork:
    """payload/neuronx_distributed/export_llama.py on a node of the training kind (NxD's
    converter loads the xser saves with torch_xla)."""
    return _llama_export(spec, step, "neuronx_distributed/export_llama.py",
                         NXD_PROOF_MICRO_BATCHES, training_node=True)


def _llama_export(spec: JobSpec, step: Optional[int], program: str, micro_batches: int,
                  training_node: bool = False) -> StageWork:
    """A Llama export program with the training pass's flags, the tokenizer prepare saved
    beside the blocks (or data.tokenizer's own folder), proven on the first micro-batches of
    the step."""
    from . import for_spec
    data = spec.recipe.data
    tokenizer = (data.tokenizer if data.tokenizer and posixpath.isabs(data.tokenizer)
                 else spec.data_path(data.path))
    proof = min(micro_batches, spec.global_batch_size // spec.micro_batch_size)
    args = (*for_spec(spec).train_args, "--tokenizer", tokenizer,
            "--export-root", posixpath.join(spec.run_dir, EXPORT_ROOT),
            "--micro-batches", str(proof),
            *(("--step", str(step)) if step is not None else ()), "--on-node")
    return StageWork(program=program, tasks=(args,), training_node=training_node)


SMP_PROOF_MICRO_BATCHES = 8   # a 7B model's fp32 forward of 4,096 tokens: about a minute on CPU
OWN_EXPORT = {"smp_fsdp": "smp_fsdp/export_smp.py"}   # by payload, where the trainer is its own


def _smp_export(spec: JobSpec, step: Optional[int]) -> StageWork:
    """payload/smp_fsdp/export_smp.py (torch's DCP reader merges the sharded checkpoint in one
    CPU process)."""
    return _llama_export(spec, step, OWN_EXPORT["smp_fsdp"], SMP_PROOF_MICRO_BATCHES)


NEMO_PROOF_MICRO_BATCHES = 8   # a whole step of a 20B model is hours of fp32 on a CPU


def _nemo_export(spec: JobSpec, step: Optional[int]) -> StageWork:
    """payload/neuron_nemo/export_neox.py with the training pass's Hydra overrides (the model's
    shape, parallelism, checkpoint folder and data), the recipe's GPT-2 BPE files and precision."""
    from . import for_spec
    data = spec.recipe.data
    if not data.vocab_file or not data.merge_file:
        raise ConfigError(f"{spec.source}: --stage export: data.vocab_file and data.merge_file "
                          "name the tokenizer NeMo trained with, which the export saves")
    if spec.recipe.model.rotary_percentage < 1:
        # payload/neuron_nemo/export_neox.py's PARTIAL_ROTARY: refused before a node is spent.
        raise ConfigError(f"{spec.source}: model.rotary_percentage "
                          f"{spec.recipe.model.rotary_percentage:g}: --stage export cannot make "
                          "a GPT-NeoX of it: neuronx-nemo-megatron's partial rotary embedding is "
                          "not GPT-NeoX's, and no Hugging Face config computes it "
                          "(docs/model-out.md); a model trained with 1.0 exports")
    proof = min(NEMO_PROOF_MICRO_BATCHES, spec.global_batch_size // spec.micro_batch_size)
    args = (*for_spec(spec).train_args,
            "--tokenizer-files", spec.data_path(data.vocab_file), spec.data_path(data.merge_file),
            "--precision", "fp32" if spec.recipe.precision == "fp32" else "bf16",
            "--micro-batches", str(proof),
            "--export-root", posixpath.join(spec.run_dir, EXPORT_ROOT),
            *(("--step", str(step)) if step is not None else ()), "--on-node")
    # On a node of the training kind: the trainer's Python (NeMo's xser loader where it imports),
    # and the memory a 20B merge needs (the ranks' tensors, then the model: 2 x 80 GB in fp32).
    return StageWork(program="neuron_nemo/export_neox.py", tasks=(args,), training_node=True)


# --- eval: payload/common/eval_step.py (which export), then eval_lm.py (lm-eval) -------------

EVAL_ROOT = "eval"                  # RUN/eval/step-N.json (docs/model-out.md)
SMOKE_TASK = "jobgen_smoke_choice"  # payload/smoke/eval_task.py's, made from the recipe's seed


def _eval(spec: JobSpec, sources: tuple[str, ...], step: Optional[int]) -> StageWork:
    """lm-eval on an exported step (`step`, else the newest complete export when the job
    starts), offline: the recipe's eval.tasks, with the site's task folder and datasets cache;
    a rehearsal scores the task smoke/eval_task.py makes from the recipe's seed instead."""
    family = spec.rehearsal.family if spec.rehearsal is not None else spec.recipe.model.family
    if family == "bert":
        raise ConfigError(f"{spec.source}: --stage eval: a BERT model is an encoder, and "
                          "lm-eval's tasks score a causal language model's continuations (the "
                          "recipe names no eval tasks); its export's proof, the masked-LM loss "
                          "on the run's data, is its score (docs/model-out.md)")
    paths, eval_root = spec.site.paths, posixpath.join(spec.run_dir, EVAL_ROOT)
    own = ["--export-root", posixpath.join(spec.run_dir, EXPORT_ROOT), "--eval-root", eval_root,
           *(("--step", str(step)) if step is not None else ())]
    if spec.rehearsal is not None:
        own += ["--smoke-task-seed", str(spec.recipe.seed)]
        lm = ["--tasks", f"{SMOKE_TASK}=0", "--tasks-dir", posixpath.join(eval_root, "tasks")]
    else:
        if not spec.recipe.eval.tasks:
            raise ConfigError(f"{spec.source}: eval.tasks names no task (--stage eval scores "
                              "the tasks the recipe's eval: section names)")
        lm = ["--tasks", ",".join(f"{t}={k}" for t, k in spec.recipe.eval.tasks.items())]
        if paths.eval_tasks_dir:
            lm += ["--tasks-dir", paths.eval_tasks_dir]
    if paths.hf_home:
        lm += ["--hf-home", paths.hf_home]
    if paths.hub_access:
        lm += ["--allow-hub"]
    return StageWork(program="common/eval_step.py", tasks=((*own, "--on-node", "--", *lm),))


STAGES = {
    "prepare": Stage("prepare", "make the dataset the recipe's data: section names",
                     one_node=True, work=_prepare),
    "train": Stage("train", "the compile pass, then the training pass"),
    "export": Stage("export", "a sealed step as a Hugging Face model folder, proven",
                    one_node=True, work=_export, takes_step=True),
    "eval": Stage("eval", "an exported step scored by lm-evaluation-harness, offline",
                  one_node=True, work=_eval, takes_step=True),
}


def stage(name: str) -> Stage:
    if name not in STAGES:
        raise ConfigError(f"unknown stage {name!r} (one of {', '.join(STAGES)})")
    return STAGES[name]


def work(name: str, spec: JobSpec, sources: tuple[str, ...] = (),
         step: Optional[int] = None) -> StageWork:
    """Stage `name`'s job; `step` reaches only a stage that takes one (the CLI refuses it for
    the others)."""
    declared = stage(name)
    if declared.work is None:
        raise ConfigError(f"--stage {name}: the training job is not a stage job")
    return declared.work(spec, tuple(sources), step if declared.takes_step else None)


def chained(spec: JobSpec, names: Sequence[str]) -> list[tuple[str, JobSpec]]:
    """Each stage of a submission with the spec its job is rendered with: in a rehearsal, the
    jobs after its prepare job read the dataset that job makes (spec.data_prepared), which is
    not there yet when they are rendered."""
    out: list[tuple[str, JobSpec]] = []
    for k, name in enumerate(names):
        after = spec.smoke and "prepare" in names[:k]
        out.append((name, dataclasses.replace(spec, data_prepared=True) if after else spec))
    return out


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
