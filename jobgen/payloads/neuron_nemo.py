"""neuronx-nemo-megatron's GPT pretraining (GPT-NeoX 20B, Pythia 6.9B): Hydra overrides on the
checkout's conf/<config_name>.yaml, generated from the spec. The keys and their types were read
from the upstream release named in upstream/neuron_nemo.json; tests/test_upstream_nemo.py lets
Hydra itself apply the rendered overrides to that key set."""
from __future__ import annotations

import posixpath
import re
from typing import Any, Optional

from ..inputs.recipe import Job
from ..job.spec import JobSpec
from ..plumbing.errors import ConfigError
from .base import COMMON_KEYS, Fixed, Launch, Pass, Payload, launch_value, neuron_environment

# Unquoted Hydra values must not start with a digit or a sign (numbers) and must not be one of
# the words Hydra reads as bool/null/float in any letter case.
_BARE = re.compile(r"[A-Za-z_/][A-Za-z0-9_./:+-]*")
_HYDRA_WORDS = frozenset({"true", "false", "null", "nan", "inf"})


def hydra_string(text: str) -> str:
    """A string as a Hydra override value that arrives as exactly ``text``.

    Quoted when Hydra would read it as anything but that string. Inside quotes Hydra keeps
    backslashes literally except a run of them before a quote (escaped or closing), which it
    halves; OmegaConf then reads ``${`` as an interpolation unless escaped as ``\\${`` (and
    halves a run of backslashes before one). Both rules are applied, in that order reversed.
    """
    if _BARE.fullmatch(text) and text.lower() not in _HYDRA_WORDS:
        return text
    text = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)
    text = re.sub(r'(\\*)("|$)', lambda m: m.group(1) * 2 + ('\\"' if m.group(2) else ""), text)
    return '"' + text + '"'


def hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    return hydra_string(str(value))


def index_dir(spec: JobSpec) -> Optional[str]:
    """Where NeMo writes its sample index files (model.data.index_mapping_dir). Global rank 0
    builds them, then every rank loads them: beside the data (None) where it is writable; where
    it is read-only, in the run folder, which is one shared folder or each node's own (then
    each node builds its own copy: payload/common/node_indices.py). On SageMaker the run folder
    is the checkpoint folder every instance syncs to one S3 prefix, so the index folder is the
    instance's unsynced scratch instead: no key written by every instance, nothing restored N
    times. Index files built in advance beside the data are linked in there first."""
    if not spec.site.paths.data_read_only:
        return None
    from .. import backends
    scratch = backends.declaration(spec.backend).node_scratch
    if scratch:
        return posixpath.join(scratch, spec.run_name, "index_mappings")
    return posixpath.join(spec.run_dir, "nemo", "index_mappings")


def overrides(spec: JobSpec, which: Pass) -> dict[str, Any]:
    r = spec.recipe
    m, p, o, s, d, c = r.model, r.parallelism, r.optim, r.schedule, r.data, r.checkpoint
    steps = r.compile.steps if which == "compile" else s.max_steps
    train = which == "train"
    out: dict[str, Any] = {
        "trainer.devices": spec.workers_per_node,
        "trainer.num_nodes": spec.nodes,
        "trainer.max_epochs": None,
        "trainer.max_steps": steps,
        "trainer.val_check_interval": steps,
        "trainer.log_every_n_steps": r.job.log_every_steps,
        "trainer.limit_val_batches": 1,
        "trainer.limit_test_batches": 1,
        "trainer.accumulate_grad_batches": 1,
        "trainer.gradient_clip_val": o.grad_clip,
        # XLA_USE_BF16 sets the precision on Neuron; Lightning itself stays at 32.
        "trainer.precision": 32,
        "model.megatron_amp_O2": False,
        "model.seed": r.seed,
        "model.make_vocab_size_divisible_by": p.tensor,
        "model.micro_batch_size": p.micro_batch_size,
        "model.global_batch_size": spec.global_batch_size,
        "model.tensor_model_parallel_size": p.tensor,
        "model.pipeline_model_parallel_size": p.pipeline,
        "model.sequence_parallel": p.sequence_parallel,
        "model.wrap_with_zero": p.zero1,
        "model.max_position_embeddings": m.max_position_embeddings,
        "model.encoder_seq_length": m.seq_length,
        "model.hidden_size": m.hidden_size,
        "model.ffn_hidden_size": m.ffn_hidden_size,
        "model.num_layers": m.num_layers,
        "model.num_attention_heads": m.num_attention_heads,
        "model.init_method_std": m.init_method_std,
        "model.use_scaled_init_method": m.scaled_init,
        "model.hidden_dropout": m.hidden_dropout,
        "model.attention_dropout": m.attention_dropout,
        "model.layernorm_epsilon": m.layernorm_epsilon,
        "model.position_embedding_type": m.position_embedding_type,
        "model.rotary_percentage": m.rotary_percentage,
        "model.transformer_block_type": m.transformer_block_type,
        "model.use_cpu_initialization": True,
        "model.tokenizer.vocab_file": spec.data_path(d.vocab_file) if d.vocab_file else None,
        "model.tokenizer.merge_file": spec.data_path(d.merge_file) if d.merge_file else None,
        # NeMo's weighted list blends the shards (normalised weights; no merge step).
        "model.data.data_prefix": [x for p in spec.data_prefixes() for x in (1.0, p)],
        "model.data.num_workers": d.num_workers,
        "model.data.seq_length": m.seq_length,
        "model.data.splits_string": d.splits,
        "model.data.index_mapping_dir": index_dir(spec),
        "model.optim.name": o.name,
        "model.optim.capturable": True,  # the LR as a tensor: one graph for every LR value
        "model.optim.lr": spec.lr,
        "model.optim.betas": list(o.betas),
        "+model.optim.eps": o.eps,
        "model.optim.weight_decay": o.weight_decay,
        "model.optim.sched.name": "CosineAnnealing" if s.name == "cosine" else "LinearAnnealing",
        "model.optim.sched.warmup_steps": spec.warmup_steps,
        "model.optim.sched.constant_steps": spec.constant_steps,
        "model.optim.sched.min_lr": s.min_lr,
        # The step at which the decay reaches min_lr (NeMo's scheduler max_steps; by default the
        # trainer's).
        "+model.optim.sched.max_steps": s.decay_steps if s.decay_steps is not None else s.max_steps,
        "+model.save_xser": True,
        "+model.load_xser": True,
        # One experiment directory for the whole run: a requeued or resubmitted job finds its
        # checkpoints there (upstream keyed it on the job id and disabled resume).
        "exp_manager.explicit_log_dir": posixpath.join(spec.run_dir, "nemo" if train else
                                                       "compile"),
        "exp_manager.create_tensorboard_logger": train,
        # Resuming goes through model.resume_from_checkpoint (launch.sh). resume_if_exists only
        # makes NeMo's callback count the kept checkpoints as its top k; with ZeRO-1 it would
        # count each rank's optimizer file too, so resume.py prunes then (docs/trainers.md).
        "exp_manager.resume_if_exists": train and not p.zero1,
        "exp_manager.resume_ignore_no_checkpoint": True,
        # No save in the compile pass: NeMo's XLACheckpointIO skips saving while graphs are
        # extracted (NEURON_EXTRACT_GRAPHS_ONLY, set by neuron_parallel_compile), so NeMo's save
        # graphs compile at its first real save; only the real trainer can do otherwise.
        "exp_manager.create_checkpoint_callback": train,
        "+exp_manager.checkpoint_callback_params.dirpath": posixpath.join(
            spec.run_dir, "nemo" if train else "compile", "checkpoints"),
        # What the callback's restore parses: the monitored step after "step=" in each name,
        # the highest kept (as the upstream config has them, set here so they cannot drift).
        "exp_manager.checkpoint_callback_params.monitor": "step",
        "exp_manager.checkpoint_callback_params.mode": "max",
        # No -last copy: it is a second full save of the newest step, which the callback's
        # restore does not count and nothing deletes once the run resumes from it.
        "exp_manager.checkpoint_callback_params.save_last": False,
        "exp_manager.checkpoint_callback_params.save_top_k": c.keep,
        # Background saves only when the recipe asks, as upstream has it (docs/trainers.md).
        "async_checkpointing": c.async_save is True,
    }
    if m.activation_checkpointing == "full":
        out.update({"model.activations_checkpoint_granularity": "full",
                    "model.activations_checkpoint_method": "uniform",
                    "model.activations_checkpoint_num_layers": 1})
    elif m.activation_checkpointing == "selective":
        out["model.activations_checkpoint_granularity"] = "selective"
    if c.every_steps is not None:
        out["+exp_manager.checkpoint_callback_params.every_n_train_steps"] = c.every_steps
    else:
        out["+exp_manager.checkpoint_callback_params.train_time_interval"] = c.every_seconds
    return {k: v for k, v in out.items() if v is not None or k == "trainer.max_epochs"}


def build(spec: JobSpec) -> Launch:
    paths = spec.site.paths
    if not paths.nemo_dir:
        raise ConfigError(f"site {spec.site.name}: paths.nemo_dir is required by payload "
                          "neuron_nemo (the neuronx-nemo-megatron language_modeling directory)")
    config = launch_value(spec, PAYLOAD, "config_name")
    if "step" in spec.run_dir:
        # NeMoModelCheckpoint.nemo_topk_check_previous_run reads the monitored value after the
        # first "step" in a checkpoint's whole path: a folder named so makes it fail to start.
        raise ConfigError(f"site {spec.site.name}: paths.work_dir: the run directory "
                          f"{spec.run_dir} contains \"step\", which NeMo's checkpoint callback "
                          "misreads as its monitored value (choose another work_dir or run name)")

    if spec.recipe.checkpoint.async_save:
        _note_background_save(spec)

    def args(which: Pass) -> tuple[str, ...]:
        head = (f"--config-name={config}",)
        return head + tuple(f"{k}={hydra_value(v)}" for k, v in overrides(spec, which).items())

    # No stop signal: NeMo's trainer has no save-and-stop on request (a Lightning callback in the
    # real trainer could add one). At a time limit (Slurm's warning, a container's SIGTERM) it
    # trains on until stopped and resumes from its last periodic checkpoint.
    return Launch(launcher="neuron_nemo/launch.sh", workdir=paths.nemo_dir,
                  program="megatron_gpt_pretraining.py", compile_wrapper="neuron_parallel_compile",
                  compile_args=args("compile"), train_args=args("train"))


def _note_background_save(spec: JobSpec) -> None:
    """NeMo's background save holds a node's share twice in host memory while it writes (a
    copy in the trainers, a pickled one in a child process: docs/trainers.md)."""
    from ..job import sizes
    from .base import say_once
    share = sizes.checkpoint_bytes(spec) / spec.nodes
    say_once(f"note: {spec.source}: checkpoint.async_save: NeMo's background save holds each "
             f"node's share of a checkpoint twice in host memory while it writes (a copy in "
             f"the trainers, a pickled copy in a child process): about {2 * share / 1e9:.0f} GB "
             f"per node of {spec.nodes}; set checkpoint.async_save: false if the node's memory "
             "cannot spare it")


PAYLOAD = Payload(
    name="neuron_nemo",
    data=("megatron",),
    accelerator="neuron",
    families=("gpt_neox",),
    honours=COMMON_KEYS | {
        "job.log_every_steps",
        "model.init_method_std", "model.scaled_init", "model.hidden_dropout",
        "model.attention_dropout", "model.layernorm_epsilon", "model.position_embedding_type",
        "model.rotary_percentage", "model.transformer_block_type",
        "model.activation_checkpointing", "parallelism.sequence_parallel", "parallelism.zero1",
        "optim.eps", "schedule.min_lr", "schedule.decay_steps", "data.vocab_file",
        "data.merge_file", "data.num_workers", "data.splits", "data.shards",
    },
    build=build,
    # NeMo's bf16SR accumulates in FP32 inside the compiler; its bf16 runs all in bf16; Hydra
    # prints its whole error.
    environment=lambda recipe: neuron_environment(recipe, fp32_accumulation=True,
                                                  bf16_downcasts=False,
                                                  extra={"HYDRA_FULL_ERROR": "1"}),
    fixed={"job.restarts_in_place": Fixed(0, "launch.sh chooses the checkpoint NeMo resumes from "
                                           "before torchrun starts: a restart in place would "
                                           "resume from that one, not the newest"),
           "job.collective_timeout_s": Fixed(
        Job().collective_timeout_s, "NeMo's process group is made by its Lightning strategy (an "
                                    "XLA one), which takes no timeout; the Neuron runtime bounds "
                                    "its collectives"),
           "model.vocab_size": Fixed(
        50257, "NeMo takes the vocabulary from the GPT-2 BPE tokenizer files (data.vocab_file, "
               "data.merge_file) and pads it to a multiple of parallelism.tensor")},
    refused_values={"optim.name": {"lamb": "the NeMo payload trains with adamw (NeMo's LAMB "
                                           "is apex's CUDA kernel)"},
                    "checkpoint.keep": {1: "NeMo holds the checkpoint it resumed from until the "
                                           "job ends, so it keeps at least 2"}},
    launch_keys={"config_name": "megatron_neox_config"},
    upstream="neuron_nemo.json",
    background_save_default=False,
)
