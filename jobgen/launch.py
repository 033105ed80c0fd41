"""What each payload is started with: the per-node launcher under payload/, the trainer's
arguments for the compile pass and for the training pass, and the environment block.

Everything here is generated from the job spec; nothing is a hand-copied upstream string. The two
passes get the same arguments except for the step count, checkpointing, TensorBoard and resume,
so that the compile pass produces exactly the graphs the training pass will ask for.
"""
from __future__ import annotations

import hashlib
import json
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Literal, Optional

from . import schema
from .errors import ConfigError
from .spec import SMOKE, JobSpec

Pass = Literal["compile", "train"]


@dataclass(frozen=True)
class Launch:
    launcher: str                 # script under payload/, run once per node
    workdir: str                  # the directory the trainer runs in
    program: str                  # the trainer, relative to workdir
    compile_wrapper: str          # prefix for the compile pass ("" when none)
    compile_args: tuple[str, ...]
    train_args: tuple[str, ...]
    files: tuple[tuple[str, str], ...] = ()  # (path under the run dir, content) written first
    # A command run once before the compile pass: (script under payload/, its arguments).
    prepare: tuple[str, ...] = ()

    def args(self, which: Pass) -> tuple[str, ...]:
        return self.compile_args if which == "compile" else self.train_args


def compile_key(spec: JobSpec, lau: Launch) -> str:
    """Names the graphs a compile pass produces, for the cache marker: what shapes the model and
    the training step (model, parallelism and the derived batch sizes, optimizer, precision, the
    environment, the node count, the trainer). Where a run writes, how long it trains, its
    checkpointing and its name are left out: another run of the same spec finds the graphs."""
    r = spec.recipe
    optim = {k: v for k, v in schema.to_plain(r.optim).items() if k not in ("lr", "lr_scaling")}
    blob = json.dumps({
        "payload": r.payload, "model": schema.to_plain(r.model),
        "parallelism": schema.to_plain(r.parallelism), "precision": r.precision, "optim": optim,
        "sizes": [spec.nodes, spec.workers_per_node, spec.data_parallel,
                  spec.gradient_accumulation, spec.global_batch_size],
        "env": env_block(spec), "launcher": lau.launcher, "program": lau.program,
        "compile_steps": r.compile.steps, "smoke": spec.smoke,
    }, sort_keys=True)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
    return f"{r.name}-{spec.nodes}n{'-smoke' if spec.smoke else ''}-{digest}"


# --- environment -------------------------------------------------------------------------------

EFA_ENV = (("FI_PROVIDER", "efa"), ("FI_EFA_USE_DEVICE_RDMA", "1"), ("FI_EFA_FORK_SAFE", "1"))
NEURON_CC_BASE = "--model-type transformer --distribution-strategy=llm-training"


def env_block(spec: JobSpec) -> list[tuple[str, str]]:
    """The exported environment, in order: network, compiler, precision, then the recipe's own."""
    recipe = spec.recipe
    env: dict[str, str] = {}
    if spec.platform.accelerator == "neuron":
        env.update(EFA_ENV)
        cc = NEURON_CC_BASE
        if recipe.payload == "neuron_nemo" and recipe.precision == "bf16_sr":
            # NeMo's bf16SR recipe accumulates in FP32 inside the compiler.
            cc += " --enable-mixed-precision-accumulation"
        env["NEURON_CC_FLAGS"] = cc
        env["NEURON_FUSE_SOFTMAX"] = "1"
        env["XLA_USE_BF16"] = "0" if recipe.precision == "fp32" else "1"
        env["NEURON_RT_STOCHASTIC_ROUNDING_EN"] = "1" if recipe.precision == "bf16_sr" else "0"
        if recipe.payload == "neuron_nemo":
            env["HYDRA_FULL_ERROR"] = "1"
    env.update(recipe.env)
    if spec.smoke:
        # The rehearsal keeps the whole environment above and runs on CPU processes.
        env.update({"JOBGEN_SMOKE": "1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})
    return list(env.items())


def compile_cache_env(spec: JobSpec, cache_dir: str) -> dict[str, str]:
    """Where the accelerator keeps compiled graphs: Neuron's persistent cache, or Habana's
    recipe cache (directory, keep existing entries, size limit in MB)."""
    if spec.platform.accelerator == "neuron":
        return {"NEURON_COMPILE_CACHE_URL": cache_dir}
    return {"PT_HPU_RECIPE_CACHE_CONFIG": f"{cache_dir},false,8192"}


# --- NeMo (Hydra overrides) --------------------------------------------------------------------

_HYDRA_BARE = re.compile(r"^[A-Za-z0-9_./:+-]*$")


def hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar; strings outside a plain alphabet are quoted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if _HYDRA_BARE.fullmatch(text) and text not in ("null", "true", "false", "True", "False"):
        return text
    # Quoted; `${` would start an OmegaConf interpolation, so it is escaped too.
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("${", "\\${")
    return '"' + escaped + '"'


def _nemo_overrides(spec: JobSpec, which: Pass) -> dict[str, Any]:
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
        "model.max_position_embeddings": m.max_position_embeddings,
        "model.encoder_seq_length": m.seq_length,
        "model.hidden_size": m.hidden_size,
        "model.ffn_hidden_size": m.ffn_hidden_size,
        "model.num_layers": m.num_layers,
        "model.num_attention_heads": m.num_attention_heads,
        "model.init_method_std": m.init_method_std,
        "model.hidden_dropout": m.hidden_dropout,
        "model.layernorm_epsilon": m.layernorm_epsilon,
        "model.position_embedding_type": m.position_embedding_type,
        "model.rotary_percentage": m.rotary_percentage,
        "model.transformer_block_type": m.transformer_block_type,
        "model.use_cpu_initialization": True,
        "model.tokenizer.vocab_file": spec.data_path(d.vocab_file) if d.vocab_file else None,
        "model.tokenizer.merge_file": spec.data_path(d.merge_file) if d.merge_file else None,
        "model.data.data_prefix": [1.0, spec.data_path(d.path)],
        "model.data.num_workers": d.num_workers,
        "model.data.seq_length": m.seq_length,
        "model.data.splits_string": d.splits,
        "model.optim.name": o.name,
        "model.optim.capturable": True,  # the LR as a tensor: one graph for every LR value
        "model.optim.lr": spec.lr,
        "model.optim.betas": list(o.betas),
        "model.optim.weight_decay": o.weight_decay,
        "model.optim.sched.name": "CosineAnnealing" if s.name == "cosine" else "LinearAnnealing",
        "model.optim.sched.warmup_steps": spec.warmup_steps,
        "model.optim.sched.constant_steps": spec.constant_steps,
        "model.optim.sched.min_lr": s.min_lr,
        "+model.save_xser": True,
        "+model.load_xser": True,
        # One experiment directory for the whole run: a requeued or resubmitted job finds its
        # checkpoints there (upstream keyed it on the job id and disabled resume).
        "exp_manager.explicit_log_dir": posixpath.join(spec.run_dir, "nemo" if train else
                                                       "compile"),
        "exp_manager.create_tensorboard_logger": train,
        "exp_manager.resume_if_exists": train,
        "exp_manager.resume_ignore_no_checkpoint": train,
        "exp_manager.create_checkpoint_callback": train,
        "exp_manager.checkpoint_callback_params.save_last": train,
        "exp_manager.checkpoint_callback_params.save_top_k": c.keep,
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


def _neuron_nemo(spec: JobSpec) -> Launch:
    paths = spec.site.paths
    if not paths.nemo_dir:
        raise ConfigError(f"site {spec.site.name}: paths.nemo_dir is required by payload "
                          "neuron_nemo (the neuronx-nemo-megatron language_modeling directory)")
    config = spec.recipe.launch.get("config_name", "megatron_gpt_config")

    def args(which: Pass) -> tuple[str, ...]:
        head = (f"--config-name={config}",)
        return head + tuple(f"{k}={hydra_value(v)}"
                            for k, v in _nemo_overrides(spec, which).items())

    return Launch(launcher="neuron_nemo/launch.sh", workdir=paths.nemo_dir,
                  program="megatron_gpt_pretraining.py", compile_wrapper="neuron_parallel_compile",
                  compile_args=args("compile"), train_args=args("train"))


# --- NeuronX Distributed (argparse flags) ------------------------------------------------------

def llama_config(spec: JobSpec) -> dict[str, Any]:
    """The Hugging Face LlamaConfig the NxD example reads from --model_path."""
    m = spec.recipe.model
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": m.hidden_size,
        "intermediate_size": m.ffn_hidden_size,
        "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.num_kv_heads or m.num_attention_heads,
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.max_position_embeddings,
        "rms_norm_eps": m.layernorm_epsilon,
        "rope_theta": m.rope_theta or 10000.0,
        "initializer_range": m.init_method_std or 0.02,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }


def _nxd_args(spec: JobSpec, which: Pass) -> tuple[str, ...]:
    r = spec.recipe
    p, o, c = r.parallelism, r.optim, r.checkpoint
    run = spec.run_dir
    args: list[str] = [
        "--model_path", posixpath.join(run, "model"),
        "--data_dir", spec.data_path(r.data.path),
        "--tensor_parallel_size", str(p.tensor),
        "--batch_size", str(p.micro_batch_size),
        "--grad_accum_usteps", str(spec.gradient_accumulation),
        "--seq_len", str(r.model.seq_length),
        "--max_steps", str(r.schedule.max_steps),
        "--steps_this_run", str(r.compile.steps if which == "compile" else -1),
        "--warmup_steps", str(spec.warmup_steps),
        "--lr", repr(spec.lr),
        "--weight_decay", repr(o.weight_decay),
        "--beta1", repr(o.betas[0]),
        "--beta2", repr(o.betas[1]),
        "--seed", str(r.seed),
        "--logging_interval", str(r.job.log_every_steps),
        # 0 = BF16 with stochastic rounding (1 would turn rounding off, REFERENCE §2.1).
        "--use_gpu_compatible_precision", "0" if r.precision == "bf16_sr" else "1",
        "--output_dir", posixpath.join(run, "output" if which == "train" else "compile"),
        "--metrics_file", posixpath.join(run, "metrics" if which == "train" else "compile",
                                         "results.json"),
    ]
    if p.sequence_parallel:
        args.append("--sequence_parallel_enabled")
    if r.model.activation_checkpointing == "selective":
        args.append("--selective_checkpoint_enabled")
    if p.zero1:
        args.append("--use_zero_1")
    if which == "train":  # the compile pass neither loads nor saves a checkpoint
        args += ["--checkpoint_dir", posixpath.join(run, "checkpoints"),
                 "--checkpoint_freq", str(c.every_steps),
                 "--num_kept_checkpoint", str(c.keep),
                 "--loading_step", "latest_if_exists"]
    return tuple(args)


def _neuronx_distributed(spec: JobSpec) -> Launch:
    paths = spec.site.paths
    if not paths.nxd_llama_dir:
        raise ConfigError(f"site {spec.site.name}: paths.nxd_llama_dir is required by payload "
                          "neuronx_distributed (the NxD Llama pretraining example directory)")
    if spec.recipe.checkpoint.every_steps is None:
        raise ConfigError(f"{spec.source}: checkpoint.every_seconds: the NxD trainer "
                          "checkpoints by step only; set checkpoint.every_steps")
    config = json.dumps(llama_config(spec), indent=2, sort_keys=True) + "\n"
    return Launch(launcher="neuronx_distributed/launch.sh", workdir=paths.nxd_llama_dir,
                  program="tp_zero1_llama_hf_pretrain.py",
                  compile_wrapper="neuron_parallel_compile",
                  compile_args=_nxd_args(spec, "compile"), train_args=_nxd_args(spec, "train"),
                  files=(("model/config.json", config),))


# --- Habana DeepSpeed BERT (our own program, payload/habana_deepspeed) ------------------------

def _bert_args(spec: JobSpec, which: Pass, data_dir: str) -> tuple[str, ...]:
    r = spec.recipe
    m, p, o, c = r.model, r.parallelism, r.optim, r.checkpoint
    args = [
        "--input-dir", data_dir,
        "--output-dir", posixpath.join(spec.run_dir, "train" if which == "train" else "compile"),
        "--num-layers", str(m.num_layers),
        "--hidden-size", str(m.hidden_size),
        "--num-heads", str(m.num_attention_heads),
        "--intermediate-size", str(m.ffn_hidden_size),
        "--vocab-size", str(m.vocab_size),
        "--max-position-embeddings", str(m.max_position_embeddings),
        "--seq-length", str(m.seq_length),
        "--max-predictions", str(m.max_predictions or 20),
        "--micro-batch-size", str(p.micro_batch_size),
        "--gradient-accumulation", str(spec.gradient_accumulation),
        "--lr", repr(spec.lr),
        "--warmup", repr(spec.warmup_steps / r.schedule.max_steps),
        "--constant", repr(spec.constant_steps / r.schedule.max_steps),
        "--max-steps", str(r.schedule.max_steps),
        "--optimizer", o.name,
        "--weight-decay", repr(o.weight_decay),
        "--grad-clip", repr(o.grad_clip),
        "--zero-stage", "1" if p.zero1 else "0",
        "--precision", "fp32" if r.precision == "fp32" else "bf16",
        "--seed", str(r.seed),
        "--checkpoint-every", str(c.every_steps),
        "--keep-checkpoints", str(c.keep),
        "--phase", which,
        "--compile-steps", str(r.compile.steps),
        "--accelerator", "cpu" if spec.smoke else "auto",
    ]
    return tuple(args)


def _habana_deepspeed(spec: JobSpec) -> Launch:
    r = spec.recipe
    if r.parallelism.tensor != 1 or r.parallelism.pipeline != 1:
        raise ConfigError(f"{spec.source}: parallelism: the DeepSpeed BERT program is data-"
                          "parallel only (tensor and pipeline must be 1)")
    if r.checkpoint.every_steps is None:
        raise ConfigError(f"{spec.source}: checkpoint.every_seconds: the BERT program "
                          "checkpoints by step only; set checkpoint.every_steps")
    data_dir = spec.data_path(r.data.path)
    workdir = posixpath.join(spec.payload_dir, "habana_deepspeed")
    return Launch(launcher="habana_deepspeed/launch.sh", workdir=workdir,
                  program="pretrain_bert.py", compile_wrapper="",
                  compile_args=_bert_args(spec, "compile", data_dir),
                  train_args=_bert_args(spec, "train", data_dir))


# --- smoke: the same job on CPU with a tiny model of the recipe's family ----------------------

def _smoke_common(spec: JobSpec, which: Pass) -> list[str]:
    r = spec.recipe
    return [
        "--num-layers", str(SMOKE["num_layers"]),
        "--hidden-size", str(SMOKE["hidden_size"]),
        "--num-heads", str(SMOKE["num_heads"]),
        "--intermediate-size", str(SMOKE["intermediate_size"]),
        "--seq-length", str(SMOKE["seq_length"]),
        "--vocab-size", str(SMOKE["vocab_size"]),
        "--micro-batch-size", str(SMOKE["micro_batch_size"]),
        "--gradient-accumulation", "1",
        "--max-steps", str(SMOKE["max_steps"]),
        "--checkpoint-every", str(SMOKE["checkpoint_every"]),
        "--keep-checkpoints", str(min(r.checkpoint.keep, 3)),
        "--grad-clip", repr(r.optim.grad_clip),
        "--weight-decay", repr(r.optim.weight_decay),
        "--seed", str(r.seed),
        "--phase", which,
        "--compile-steps", str(r.compile.steps),
        "--output-dir", posixpath.join(spec.run_dir, "train" if which == "train" else "compile"),
    ]


def _smoke(spec: JobSpec) -> Launch:
    r = spec.recipe
    if r.model.family == "bert":
        data = posixpath.join(spec.run_dir, "smoke-data")

        def bert(which: Pass) -> tuple[str, ...]:
            return tuple(_smoke_common(spec, which) + [
                "--input-dir", data, "--max-predictions", str(SMOKE["max_predictions"]),
                "--max-position-embeddings", str(SMOKE["seq_length"]),
                "--lr", "0.001", "--warmup", "0.1", "--constant", "0.2",
                "--optimizer", r.optim.name, "--zero-stage", "1" if r.parallelism.zero1 else "0",
                "--precision", "fp32" if r.precision == "fp32" else "bf16",
                "--accelerator", "cpu"])

        return Launch(launcher="habana_deepspeed/launch.sh",
                      workdir=posixpath.join(spec.payload_dir, "habana_deepspeed"),
                      program="pretrain_bert.py", compile_wrapper="",
                      compile_args=bert("compile"), train_args=bert("train"),
                      prepare=("habana_deepspeed/make_tiny_shard.py", "--out", data,
                               "--samples", str(SMOKE["samples"]),
                               "--seq-length", str(SMOKE["seq_length"]),
                               "--max-predictions", str(SMOKE["max_predictions"]),
                               "--vocab-size", str(SMOKE["vocab_size"]), "--seed", str(r.seed)))

    def gpt(which: Pass) -> tuple[str, ...]:
        return tuple(_smoke_common(spec, which) + [
            "--family", r.model.family, "--lr", "0.003", "--min-lr", "0.0003",
            "--warmup-steps", "2"])

    return Launch(launcher="smoke/launch.sh", workdir=posixpath.join(spec.payload_dir, "smoke"),
                  program="train.py", compile_wrapper="", compile_args=gpt("compile"),
                  train_args=gpt("train"))


_BUILDERS = {"neuron_nemo": _neuron_nemo, "neuronx_distributed": _neuronx_distributed,
             "habana_deepspeed": _habana_deepspeed}


def for_spec(spec: JobSpec, backend: Optional[str] = None) -> Launch:
    if spec.smoke:
        return _smoke(spec)
    builder = _BUILDERS.get(spec.recipe.payload)
    if builder is None:
        raise ConfigError(f"{spec.source}: payload: {spec.recipe.payload} cannot run on "
                          f"{backend or spec.backend} yet")
    return builder(spec)
