"""Offline validation of AWS Batch job definitions: botocore's own parameter validation for
RegisterJobDefinition (types, unknown and missing keys), then the multi-node rules that botocore
does not know (REFERENCE.md §4.1). Violations are ConfigErrors naming the key."""
from __future__ import annotations

import functools
import re
from typing import Any

from ...plumbing.errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
RANGE_RE = re.compile(r"^(\d*):(\d*)$|^(\d+)$")
RESOURCE_TYPES = ("GPU", "VCPU", "MEMORY")
MAX_NODE_RANGES = 5
MAX_NODES = 1000


@functools.lru_cache(maxsize=1)
def _input_shape() -> Any:
    try:
        import botocore.loaders
        import botocore.model
    except ImportError:
        raise ConfigError("validating AWS Batch job definitions needs botocore: "
                          "pip install 'jobgen[batch]'") from None
    # The API model shipped with botocore, read without a session: a session would read the
    # user's AWS profile, and a mistyped AWS_PROFILE must not break rendering (nor validation).
    data = botocore.loaders.create_loader().load_service_model("batch", "service-2")
    model = botocore.model.ServiceModel(data, service_name="batch")
    return model.operation_model("RegisterJobDefinition").input_shape


def botocore_errors(jd: dict[str, Any]) -> list[str]:
    """botocore's report, one problem per line (empty when valid)."""
    from botocore.validate import ParamValidator
    report = ParamValidator().validate(jd, _input_shape())
    if not report.has_errors():
        return []
    lines = report.generate_report().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("Parameter validation")]


def _parse_range(text: str, num_nodes: int, where: str) -> tuple[int, int]:
    match = RANGE_RE.fullmatch(text)
    if not match:
        raise ConfigError(f"{where}: targetNodes: {text!r} is not a node range like '0:', ':3', "
                          "'2:5' or '4'")
    if match.group(3) is not None:
        lo = hi = int(match.group(3))
    else:
        lo = int(match.group(1) or 0)
        hi = int(match.group(2)) if match.group(2) else num_nodes - 1
    if lo > hi:
        raise ConfigError(f"{where}: targetNodes: {text!r} starts after it ends")
    return lo, hi


def _check_devices(devices: list[dict[str, Any]], where: str) -> None:
    ids = sorted(int(m.group(1)) for d in devices
                 if (m := re.match(r"^/dev/neuron(\d+)$", str(d.get("hostPath", "")))))
    if ids and ids != list(range(ids[0], ids[0] + len(ids))):
        gaps = sorted(set(range(ids[0], ids[-1] + 1)) - set(ids))
        what = (f"missing {', '.join(f'/dev/neuron{i}' for i in gaps)}" if gaps else
                f"/dev/neuron{next(i for i in ids if ids.count(i) > 1)} is listed twice")
        raise ConfigError(f"{where}.linuxParameters.devices: Neuron devices must be contiguous "
                          f"({what})")
    for i, dev in enumerate(devices):
        if dev.get("containerPath", dev.get("hostPath")) != dev.get("hostPath") and \
                "uverbs" in str(dev.get("hostPath")):
            raise ConfigError(f"{where}.linuxParameters.devices[{i}]: an EFA device must keep its "
                              "host path in the container")


def multinode_errors(jd: dict[str, Any]) -> None:
    """The multi-node-parallel rules; raises ConfigError at the first violation."""
    name = jd.get("jobDefinitionName", "")
    if not NAME_RE.fullmatch(str(name)):
        raise ConfigError(f"jobDefinitionName: {name!r} must be 1-128 letters, digits, '-' or '_'")
    if jd.get("type") != "multinode":
        raise ConfigError(f"type: {jd.get('type')!r} must be 'multinode'")
    props = jd.get("nodeProperties") or {}
    if not props:
        raise ConfigError("nodeProperties: required for a multinode job definition")
    num, main = props.get("numNodes", 0), props.get("mainNode", -1)
    if not 1 <= num <= MAX_NODES:
        raise ConfigError(f"nodeProperties.numNodes: {num} must be between 1 and {MAX_NODES}")
    if not 0 <= main < num:
        raise ConfigError(f"nodeProperties.mainNode: {main} must be less than numNodes {num}")
    ranges = props.get("nodeRangeProperties") or []
    if not 1 <= len(ranges) <= MAX_NODE_RANGES:
        raise ConfigError(f"nodeProperties.nodeRangeProperties: {len(ranges)} node ranges; "
                          f"Batch allows 1 to {MAX_NODE_RANGES}")
    covered: set[int] = set()
    instance_types: set[str] = set()
    open_ended = False
    for i, rng in enumerate(ranges):
        where = f"nodeProperties.nodeRangeProperties[{i}]"
        text = str(rng.get("targetNodes", ""))
        lo, hi = _parse_range(text, num, where)
        open_ended |= text.endswith(":")
        covered.update(range(lo, min(hi, num - 1) + 1))
        container = rng.get("container") or {}
        itype = container.get("instanceType")
        if itype:
            instance_types.add(itype)
        for j, req in enumerate(container.get("resourceRequirements") or []):
            if req.get("type") not in RESOURCE_TYPES:
                raise ConfigError(f"{where}.container.resourceRequirements[{j}].type: "
                                  f"{req.get('type')!r} must be one of {', '.join(RESOURCE_TYPES)}")
        _check_devices((container.get("linuxParameters") or {}).get("devices") or [],
                       f"{where}.container")
    missing = sorted(set(range(num)) - covered)
    if missing:
        raise ConfigError(f"nodeProperties.nodeRangeProperties: nodes {missing} are in no range "
                          f"(ranges must cover 0:{num - 1})")
    if not open_ended:
        raise ConfigError("nodeProperties.nodeRangeProperties: no open-ended range ('0:' or 'n:'), "
                          "so a submit-time node count override would be refused")
    if len(instance_types) > 1:
        raise ConfigError("nodeProperties.nodeRangeProperties: all node ranges must use one "
                          f"instance type (got {', '.join(sorted(instance_types))})")
    retry = jd.get("retryStrategy") or {}
    if retry and not 1 <= retry.get("attempts", 1) <= 10:
        raise ConfigError(f"retryStrategy.attempts: {retry.get('attempts')} must be 1 to 10")
    if len(retry.get("evaluateOnExit") or []) > 5:
        raise ConfigError("retryStrategy.evaluateOnExit: at most 5 conditions")
    for i, cond in enumerate(retry.get("evaluateOnExit") or []):
        if str(cond.get("action", "")).upper() not in ("RETRY", "EXIT"):
            raise ConfigError(f"retryStrategy.evaluateOnExit[{i}].action: must be RETRY or EXIT")


def validate(jd: dict[str, Any], where: str) -> None:
    """botocore first (shape), then the multi-node rules (meaning)."""
    problems = botocore_errors(jd)
    if problems:
        raise ConfigError(f"{where}: {problems[0]}")
    try:
        multinode_errors(jd)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
