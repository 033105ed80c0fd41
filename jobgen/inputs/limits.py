"""The range, enum and pattern rules of single recipe and site values, by dotted key, in JSON
Schema's own keywords: the generated schemas carry them (jobgen/inputs/json_schema.py) and the
loaders apply them (rules.check_limits), so both refuse the same values. Data only: the loaders read
it without importing the schema generator, which imports the recipe and site records."""
from __future__ import annotations

import re
from typing import Any

from ..backends.slurm import options as slurm_options
from . import schema
from .image_ref import NAME_MAX, REPOSITORY_PATTERN

SEED_MAX = 2**32 - 1
# The ports a job opens beside job.master_port (the rendezvous), as offsets from it, and what opens
# each (the Batch node watch: env/containers/entrypoint.sh, MASTER_PORT + 1): a master port leaves
# room for all of them, so its domain is declared here, once (tests/test_ports.py finds them).
PORT_MIN, PORT_MAX = 1024, 65535   # unprivileged TCP ports
DERIVED_PORTS = {1: "the Batch node watch"}
MASTER_PORT_MAX = PORT_MAX - max(DERIVED_PORTS)
PORT_ROOM = ", ".join(f"job.master_port + {k} for {what}" for k, what in DERIVED_PORTS.items())
# Kubernetes object names: an RFC 1123 label (namespaces), a subdomain (claims, accounts).
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# The domain of each number `jobgen plan` takes, from its option (--node-mtbf-hours) or from
# the site's plan: section: (least, most, unit). Inside it the plan's arithmetic stays finite
# (a job that would never finish is refused by the goodput model itself).
PLAN_DOMAINS: dict[str, tuple[float, float, str]] = {
    "tokens": (1.0, 1e16, "tokens"),
    "samples": (1.0, 1e14, "samples"),
    "price": (1e-4, 1e5, "US dollars per node-hour"),
    "node_mtbf_hours": (0.1, 1e7, "hours"),
    "restart_s": (0.0, 604800.0, "seconds"),
    "storage_mb_s": (0.1, 1e8, "MB/s"),
    "checkpoint_gb": (1e-6, 1e7, "GB"),
    "process_failure_share": (0.0, 1.0, ""),     # of all failures
}
# The recipe's eval: section (recipe.check_eval applies both; payload/common/eval_lm.py the
# shots too): lm-eval's task, group and tag names, in an alphabet safe on a command line.
EVAL_TASK_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
EVAL_MAX_SHOTS = 64
RECIPE_LIMITS: dict[str, dict[str, Any]] = {
    "name": {"pattern": schema.NAME_RE.pattern},
    "nodes": {"minimum": 1},
    **{f"model.{k}": {"minimum": 1} for k in (
        "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "seq_length",
        "vocab_size", "max_position_embeddings", "num_kv_heads", "max_predictions")},
    "model.transformer_block_type": {"enum": ["pre_ln", "post_ln", "normformer", "gpt_j"]},
    "model.hidden_dropout": {"minimum": 0, "exclusiveMaximum": 1},
    "model.attention_dropout": {"minimum": 0, "exclusiveMaximum": 1},
    "model.rotary_percentage": {"exclusiveMinimum": 0, "maximum": 1},
    "model.layernorm_epsilon": {"exclusiveMinimum": 0},
    "model.init_method_std": {"exclusiveMinimum": 0},
    "model.rope_theta": {"exclusiveMinimum": 0},
    **{f"parallelism.{k}": {"minimum": 1} for k in (
        "micro_batch_size", "tensor", "pipeline", "global_batch_size", "gradient_accumulation",
        "activation_loading_horizon")},
    "parallelism.hybrid_shard": {"minimum": 0},
    "optim.lr": {"exclusiveMinimum": 0},
    "optim.eps": {"exclusiveMinimum": 0},
    "optim.weight_decay": {"minimum": 0},
    "optim.grad_clip": {"exclusiveMinimum": 0},
    "optim.lr_scaling.base_nodes": {"minimum": 1},
    "schedule.max_steps": {"minimum": 1},
    "schedule.warmup_steps": {"minimum": 0},
    "schedule.constant_steps": {"minimum": 0},
    "schedule.decay_steps": {"minimum": 1},
    "schedule.warmup_fraction": {"minimum": 0, "maximum": 1},
    "schedule.constant_fraction": {"minimum": 0, "maximum": 1},
    "schedule.min_lr": {"minimum": 0},
    "data.num_workers": {"minimum": 0},
    "data.shards": {"minimum": 1, "maximum": 10000},
    "data.path": {"minLength": 1},
    "description": {"minLength": 1},
    "data.splits": {"pattern": r"^\s*(\d+(\.\d*)?|\.\d+)\s*([,/]\s*(\d+(\.\d*)?|\.\d+)\s*){2}$"},
    "checkpoint.every_steps": {"minimum": 1},
    "checkpoint.every_seconds": {"minimum": 1},
    "checkpoint.keep": {"minimum": 1},
    "compile.steps": {"minimum": 1},
    "job.max_restarts": {"minimum": 0, "maximum": 1000},
    "job.restarts_in_place": {"minimum": 0, "maximum": 100},
    "job.spare_nodes": {"minimum": 0, "maximum": 64},
    "job.collective_timeout_s": {"minimum": 1, "maximum": 604800},
    "job.master_port": {"minimum": PORT_MIN, "maximum": MASTER_PORT_MAX},
    "job.log_every_steps": {"minimum": 1},
    "seed": {"minimum": 0, "maximum": SEED_MAX},
    "eval.tasks": {"propertyNames": {"pattern": EVAL_TASK_RE.pattern}},
    "eval.tasks.*": {"minimum": 0, "maximum": EVAL_MAX_SHOTS},
}
SITE_LIMITS: dict[str, dict[str, Any]] = {
    "name": {"pattern": schema.NAME_RE.pattern},
    "slurm.cpus_per_task": {"minimum": 1},
    "slurm.max_nodes": {"minimum": 0},
    "slurm.time_limit_warning_s": {"minimum": 1, "maximum": 65535},
    "slurm.lustre_max_dirty_mb": {"minimum": 1},
    **{f"slurm.{o.site_key}": dict(o.kind.json) for o in slurm_options.OPTIONS if o.site_key},
    **{f"paths.{k}": {"minLength": 1} for k in ("work_dir", "data_dir", "compile_cache")},
    "batch.max_nodes": {"minimum": 0},
    "batch.timeout_hours": {"minimum": 1},
    "sagemaker.max_nodes": {"minimum": 0},
    "sagemaker.max_runtime_hours": {"minimum": 1, "maximum": 672},
    "eks.max_nodes": {"minimum": 0},
    "eks.namespace": {"pattern": DNS_LABEL},
    # Docker's image reference grammar, the name part (image_ref.py: jobgen adds the tag).
    **{f"{section}.repository": {"pattern": REPOSITORY_PATTERN, "maxLength": NAME_MAX}
       for section in ("batch", "sagemaker", "eks")},
    # Kubernetes names these as DNS subdomains (RFC 1123): the API server refuses anything else.
    "eks.shared_pvc": {"pattern": DNS_SUBDOMAIN, "maxLength": 253},
    "eks.service_account": {"pattern": DNS_SUBDOMAIN, "maxLength": 253},
    # The health gate's numbers (platforms.check_health says the same on load).
    **{f"health.{k}": {"minimum": 0} for k in ("local_free_gib", "shared_free_gib",
                                               "clock_max_offset_ms", "collective_floor_gbps",
                                               "cost_s")},
    "health.timeout_s": {"minimum": 1, "maximum": 600},
    "health.max_requeues": {"minimum": 0, "maximum": 20},
    "health.efa_interfaces": {"minimum": 0, "maximum": 32},
    # A share of failures: its schema says 0 to 1, as plan's check on load (PLAN_DOMAINS).
    "plan.process_failure_share": {"minimum": 0, "maximum": 1},
}
