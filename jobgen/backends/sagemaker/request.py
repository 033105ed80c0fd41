"""The SageMaker backend: one CreateTrainingJob request per job spec.

Every instance runs the image's SageMaker entrypoint (env/containers/sagemaker-entrypoint.sh) with
the payload launcher and the two passes' arguments; the node contract travels in the request's
Environment. The run folder is the instance's checkpoint folder, synced to the site's S3 URI and
restored on every instance of a retry, so training resumes. SMP v2's configuration is the
`mp_parameters` hyperparameter. The request is checked offline against botocore's model of the
API: its validator, then the lengths, counts, ranges, patterns and enums botocore does not check.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
from typing import Any

from ... import payloads
from ...images import catalog as images
from ...inputs.recipe import time_limit_seconds
from ...job.spec import JobSpec
from ...payloads import node
from ...plumbing.errors import ConfigError, RuleError
from . import DECLARATION

MAX_RETRIES = 30          # RetryStrategy.MaximumRetryAttempts: 1 to 30
# CheckpointConfig's LocalPath: where a node keeps the run and its compile cache, synced to the
# run's S3 URI while the job runs and restored from it on every instance of a retry or a
# resubmitted run (so neither its checkpoints nor its compiled graphs are lost).
CHECKPOINTS = "/opt/ml/checkpoints"
# Each instance's scratch, never synced (SageMaker's documented scratch space): what every
# instance makes for itself, like NeMo's dataset index files (jobgen/payloads/neuron_nemo.py).
SCRATCH = DECLARATION.node_scratch
# SageMaker's model-parallel library v2 runs on these GPU instance types only.
SMP_INSTANCES = ("ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge")
# Loss and gradient norm from the payloads' step events, as SageMaker metrics.
METRICS = (
    {"Name": "train:loss", "Regex": r'"event": "step".*?"loss": ([-+0-9.eE]+)'},
    {"Name": "train:grad_norm", "Regex": r'"event": "step".*?"grad_norm": ([-+0-9.eE]+)'},
)


@functools.lru_cache(maxsize=1)
def _sdk() -> Any:
    from ...plumbing.extras import require
    require("--backend sagemaker", ("botocore",), "sagemaker")
    import botocore.loaders
    import botocore.model
    # The API model shipped with botocore, read without a session (as Batch's, batch/rules.py):
    # a session reads the user's AWS config, and a malformed one must not break rendering.
    data = botocore.loaders.create_loader().load_service_model("sagemaker", "service-2")
    return botocore.model.ServiceModel(data, service_name="sagemaker")


def instance_type(spec: JobSpec) -> str:
    site = spec.site
    assert site.sagemaker is not None
    if spec.rehearsal is not None:
        cpu = site.sagemaker.smoke_instance_type
        if not cpu:
            raise ConfigError(f"site {site.name}: sagemaker.smoke_instance_type: no CPU "
                              "instance type for --smoke jobs (like ml.c5.4xlarge)")
        return cpu
    return f"ml.{spec.platform.name}"


def job_name(spec: JobSpec) -> str:
    """The run name in SageMaker's name alphabet ([a-zA-Z0-9](-*[a-zA-Z0-9])*); `training_job`
    appends a hash of the request, so that a changed request gets a new name (SageMaker never
    reuses one, even after the job ended)."""
    return re.sub(r"[^A-Za-z0-9]+", "-", spec.run_name).strip("-")[:50] or "jobgen"


def _check_model(value: Any, shape: Any, path: str, where: str) -> None:
    """What botocore's validator leaves to the service: max lengths and counts, ranges,
    patterns and enums, as the model states them."""
    meta = shape.metadata
    kind = shape.type_name

    def refuse(what: str) -> None:
        raise ConfigError(f"{where}: {path}: {what}")

    if kind == "structure":
        for name, member in shape.members.items():
            if isinstance(value, dict) and name in value:
                _check_model(value[name], member, f"{path}.{name}" if path else name, where)
    elif kind == "list":
        if "max" in meta and len(value) > meta["max"]:
            refuse(f"{len(value)} items, SageMaker takes at most {meta['max']}")
        for i, item in enumerate(value):
            _check_model(item, shape.member, f"{path}[{i}]", where)
    elif kind == "map":
        if "max" in meta and len(value) > meta["max"]:
            refuse(f"{len(value)} entries, SageMaker takes at most {meta['max']}")
        for key, item in value.items():
            _check_model(key, shape.key, f"{path} key {key!r}", where)
            _check_model(item, shape.value, f"{path}[{key!r}]", where)
    elif kind == "string":
        if "max" in meta and len(value) > meta["max"]:
            refuse(f"{len(value)} characters, SageMaker takes at most {meta['max']}")
        if shape.enum and value not in shape.enum:
            refuse(f"{value!r} is not one SageMaker offers")
        pattern = meta.get("pattern")
        if pattern and not re.fullmatch(pattern.replace(r"\p{L}", "a-zA-Z")
                                        .replace(r"\p{Z}", " ").replace(r"\p{N}", "0-9"),
                                        value, re.DOTALL):
            refuse(f"{value!r} does not match {pattern}")
    elif kind in ("integer", "long"):
        if "min" in meta and value < meta["min"] or "max" in meta and value > meta["max"]:
            refuse(f"{value} is not within {meta.get('min')}..{meta.get('max')}")


def validate(request: dict[str, Any], where: str) -> None:
    """botocore's own validation of the request, then the model's limits."""
    from botocore.validate import ParamValidator
    model = _sdk()
    shape = model.operation_model("CreateTrainingJob").input_shape
    report = ParamValidator().validate(request, shape)
    if report.has_errors():
        first = report.generate_report().splitlines()
        raise ConfigError(f"{where}: {first[-1].strip() if first else 'invalid'}")
    _check_model(request, shape, "", where)


HP_VALUE_MAX = 2500        # a hyperparameter value's length
ENV_VALUE_MAX = 512        # an Environment value's length
ARGS_KEY = "jobgen_args_"  # + 2 digits: the flow's arguments as a JSON list, in pieces
ENV_KEY = "jobgen_env_"    # + NAME + _ + 2 digits: an environment value too long for Environment


def _pieces(text: str, key: str) -> dict[str, str]:
    return {f"{key}{i // HP_VALUE_MAX:02d}": text[i:i + HP_VALUE_MAX]
            for i in range(0, len(text), HP_VALUE_MAX)}


def spill(args: list[str], env: dict[str, str]) -> dict[str, str]:
    """The trainer's arguments (a long list: SageMaker takes 100 container arguments of 256
    characters) and any environment value longer than SageMaker's 512 characters go to the
    hyperparameters (values of 2,500), in numbered pieces; the entrypoint reads them back from
    hyperparameters.json. `env` loses the values moved."""
    hyper = _pieces(json.dumps(args), ARGS_KEY)
    for name in [n for n, v in env.items() if len(v) > ENV_VALUE_MAX]:
        hyper.update(_pieces(env.pop(name), f"{ENV_KEY}{name}_"))
    return hyper


def _channels(spec: JobSpec) -> list[dict[str, Any]]:
    """The training data, as channel "train" (mounted at /opt/ml/input/data/train): from S3,
    or from FSx for Lustre. A rehearsal trains on its own synthetic tokens."""
    sm = spec.site.sagemaker
    assert sm is not None
    if spec.rehearsal is not None:
        return []
    if sm.fsx is not None:
        return [{"ChannelName": "train", "InputMode": "File", "DataSource": {
            "FileSystemDataSource": {"FileSystemId": sm.fsx.file_system_id,
                                     "FileSystemAccessMode": sm.fsx.access_mode,
                                     "FileSystemType": "FSxLustre",
                                     "DirectoryPath": sm.fsx.directory_path}}}]
    if sm.data_s3_uri:
        return [{"ChannelName": "train", "InputMode": "FastFile", "DataSource": {
            "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": sm.data_s3_uri,
                             "S3DataDistributionType": "FullyReplicated"}}}]
    raise ConfigError(f"site {spec.site.name}: sagemaker: no training data: set data_s3_uri "
                      "or fsx (file_system_id, directory_path)")


def _time_limit_s(spec: JobSpec) -> int:
    """The stopping condition: the recipe's time limit where it has one, else the site's."""
    sm = spec.site.sagemaker
    assert sm is not None
    limit = sm.max_runtime_hours * 3600
    recipe_limit = time_limit_seconds(spec.recipe.job.time_limit) \
        if spec.recipe.job.time_limit else None
    return min(limit, recipe_limit) if recipe_limit else limit


def training_job(spec: JobSpec) -> dict[str, Any]:
    """The CreateTrainingJob request for this spec, validated offline."""
    site, platform, recipe = spec.site, spec.platform, spec.recipe
    sm = site.sagemaker
    if sm is None:
        raise ConfigError(f"site {site.name}: has no sagemaker section (role, images, S3)")
    model = _sdk()
    where = f"training job for {spec.source}"
    kind = instance_type(spec)
    if kind not in model.shape_for("TrainingInstanceType").enum:
        # A RuleError: `jobgen check --backend sagemaker` lists such recipes as skipped.
        raise RuleError(f"{spec.source}: platform: SageMaker training has no {kind} instances "
                        f"(the {platform.name} recipes run on Slurm or AWS Batch)")
    if recipe.payload == "smp_fsdp" and spec.rehearsal is None and kind not in SMP_INSTANCES:
        raise RuleError(f"{spec.source}: platform: SMP v2 runs on {', '.join(SMP_INSTANCES)}, "
                        f"not {kind}")
    image = images.uri(spec, "sagemaker")
    for key in ("role_arn", "checkpoint_s3_uri", "output_s3_uri"):
        if not getattr(sm, key):
            raise ConfigError(f"site {site.name}: sagemaker.{key} is required")
    assert sm.role_arn and sm.checkpoint_s3_uri and sm.output_s3_uri
    if not sm.compile_cache.startswith(CHECKPOINTS + "/"):
        raise ConfigError(f"site {site.name}: sagemaker.compile_cache: {sm.compile_cache} is "
                          f"outside {CHECKPOINTS} (the checkpoint folder SageMaker restores), "
                          f"so every retry would compile again: set it under {CHECKPOINTS}/")
    lau = payloads.for_spec(spec, "sagemaker")
    contract = node.contract(spec, lau, "sagemaker", rdzv_timeout_s=sm.rendezvous_timeout_s)
    env = node.environment(spec, lau, contract)
    # The compile pass's scratch save goes there, not into the synced run folder (loop.py).
    env["JOBGEN_NODE_SCRATCH"] = SCRATCH + "/"
    hyper = spill(node.flow_args(lau), env)
    if recipe.payload == "smp_fsdp" and spec.rehearsal is None:
        from ...payloads.smp_fsdp import smp_parameters
        hyper["mp_parameters"] = json.dumps(smp_parameters(spec), sort_keys=True)
    request: dict[str, Any] = {
        "TrainingJobName": job_name(spec),
        "AlgorithmSpecification": {
            "TrainingImage": image, "TrainingInputMode": "File",
            "ContainerEntrypoint": ["/bin/bash", images.declared().entrypoint("sagemaker")],
            "ContainerArguments": [lau.launcher],
            "MetricDefinitions": [dict(m) for m in METRICS],
        },
        "RoleArn": sm.role_arn,
        "HyperParameters": hyper,
        "InputDataConfig": _channels(spec),
        "OutputDataConfig": {"S3OutputPath": sm.output_s3_uri},
        "ResourceConfig": {"InstanceType": kind, "InstanceCount": spec.nodes,
                           "VolumeSizeInGB": sm.volume_size_gb},
        "StoppingCondition": {"MaxRuntimeInSeconds": _time_limit_s(spec)},
        "CheckpointConfig": {"S3Uri": sm.checkpoint_s3_uri.rstrip("/") + "/" + spec.run_name,
                             "LocalPath": CHECKPOINTS},
        "Environment": env,
        "EnableNetworkIsolation": False,
        "Tags": [{"Key": "jobgen:recipe", "Value": recipe.name},
                 {"Key": "jobgen:run", "Value": spec.run_name}],
    }
    if not request["InputDataConfig"]:
        del request["InputDataConfig"]
    if sm.keep_alive_s:
        request["ResourceConfig"]["KeepAlivePeriodInSeconds"] = sm.keep_alive_s
    if recipe.job.max_restarts > 0:
        # SageMaker retries a job that failed for an internal reason (capacity, an instance that
        # went away), on fresh instances, with the checkpoints restored.
        request["RetryStrategy"] = {"MaximumRetryAttempts": min(MAX_RETRIES,
                                                                recipe.job.max_restarts)}
    if sm.subnets or sm.security_group_ids:
        if not (sm.subnets and sm.security_group_ids):
            raise ConfigError(f"site {site.name}: sagemaker: subnets and security_group_ids go "
                              "together (the job's VPC)")
        request["VpcConfig"] = {"Subnets": list(sm.subnets),
                                "SecurityGroupIds": list(sm.security_group_ids)}
    elif sm.fsx is not None:
        raise ConfigError(f"site {site.name}: sagemaker.fsx: FSx for Lustre is reached inside "
                          "a VPC: set sagemaker.subnets and sagemaker.security_group_ids")
    digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:8]
    request["TrainingJobName"] = f"{request['TrainingJobName'][:54]}-{digest}"
    validate(request, where)
    return request
