"""jobgen/batch_rules.py through `jobgen batch validate FILE`: a hand-edited job definition that
breaks botocore's request shape or a multi-node rule is refused with exit 2 and one exact line."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from jobgen.backends.batch import rules as batch_rules
from jobgen.plumbing.errors import ConfigError

RANGES = ("nodeProperties", "nodeRangeProperties")


def base() -> dict[str, Any]:
    """A valid 4-node trn1 definition, small enough to read."""
    return {
        "jobDefinitionName": "jobgen-test",
        "type": "multinode",
        "nodeProperties": {"numNodes": 4, "mainNode": 0, "nodeRangeProperties": [{
            "targetNodes": "0:",
            "container": {
                "image": "jobgen-neuron:latest",
                "instanceType": "trn1.32xlarge",
                "resourceRequirements": [{"type": "VCPU", "value": "128"},
                                         {"type": "MEMORY", "value": "500000"}],
                "linuxParameters": {"devices": (
                    [{"hostPath": f"/dev/infiniband/uverbs{i}"} for i in range(8)]
                    + [{"hostPath": f"/dev/neuron{i}"} for i in range(16)])},
            },
        }]},
        "retryStrategy": {"attempts": 3, "evaluateOnExit": [
            {"onStatusReason": "Host EC2*", "action": "RETRY"},
            {"onReason": "*", "action": "EXIT"}]},
    }


def with_ranges(jd: dict[str, Any], *targets: str, **container: Any) -> dict[str, Any]:
    """`jd` with its one node range copied to each of `targets` (containers updated)."""
    (first,) = jd["nodeProperties"]["nodeRangeProperties"]
    ranges = []
    for target in targets:
        rng = copy.deepcopy(first)
        rng["targetNodes"] = target
        rng["container"].update(container.get(target, {}))
        ranges.append(rng)
    jd["nodeProperties"]["nodeRangeProperties"] = ranges
    return jd


def container(jd: dict[str, Any]) -> dict[str, Any]:
    return jd["nodeProperties"]["nodeRangeProperties"][0]["container"]


def members(shape_path: str) -> str:
    """botocore's list of allowed keys of a shape, in its own order (its message lists them)."""
    import botocore.session
    model = botocore.session.get_session().get_service_model("batch")
    return ", ".join(model.shape_for(shape_path).members)


def _main_node_4(jd: dict[str, Any]) -> None:
    jd["nodeProperties"]["mainNode"] = 4


def _gap(jd: dict[str, Any]) -> None:
    with_ranges(jd, "0:1", "3:")


def _six_ranges(jd: dict[str, Any]) -> None:
    jd["nodeProperties"]["numNodes"] = 6
    with_ranges(jd, "0", "1", "2", "3", "4", "5:")


def _two_instance_types(jd: dict[str, Any]) -> None:
    with_ranges(jd, "0", "1:", **{"1:": {"instanceType": "trn1n.32xlarge"}})


def _closed(jd: dict[str, Any]) -> None:
    with_ranges(jd, "0:3")


def _neuron_gap(jd: dict[str, Any]) -> None:
    devices = container(jd)["linuxParameters"]["devices"]
    devices[:] = [d for d in devices if d["hostPath"] not in ("/dev/neuron2", "/dev/neuron7")]


def _neuron_twice(jd: dict[str, Any]) -> None:
    container(jd)["linuxParameters"]["devices"].append({"hostPath": "/dev/neuron3"})


def _bad_target(jd: dict[str, Any]) -> None:
    with_ranges(jd, "zzz")


def _backwards(jd: dict[str, Any]) -> None:
    with_ranges(jd, "0", "3:1", "1:")


def _neuron_resource(jd: dict[str, Any]) -> None:
    container(jd)["resourceRequirements"].append({"type": "NEURON", "value": "16"})


def _unknown_key(jd: dict[str, Any]) -> None:
    container(jd)["gpus"] = 8


def _numnodes_string(jd: dict[str, Any]) -> None:
    jd["nodeProperties"]["numNodes"] = "2"


def _attempts_11(jd: dict[str, Any]) -> None:
    jd["retryStrategy"]["attempts"] = 11


def _dotted_name(jd: dict[str, Any]) -> None:
    jd["jobDefinitionName"] = "jobgen-bert1.5b"


def _container_type(jd: dict[str, Any]) -> None:
    jd["type"] = "container"


def _no_node_properties(jd: dict[str, Any]) -> None:
    del jd["nodeProperties"]


def _zero_nodes(jd: dict[str, Any]) -> None:
    jd["nodeProperties"]["numNodes"] = 0


def _efa_moved(jd: dict[str, Any]) -> None:
    container(jd)["linuxParameters"]["devices"][1]["containerPath"] = "/dev/efa1"


def _six_conditions(jd: dict[str, Any]) -> None:
    jd["retryStrategy"]["evaluateOnExit"] = [{"onExitCode": str(i), "action": "RETRY"}
                                             for i in range(6)]


def _bad_action(jd: dict[str, Any]) -> None:
    jd["retryStrategy"]["evaluateOnExit"][1]["action"] = "IGNORE"


def _missing_target(jd: dict[str, Any]) -> None:
    del jd["nodeProperties"]["nodeRangeProperties"][0]["targetNodes"]


R0 = "nodeProperties.nodeRangeProperties[0]"
CASES: list[tuple[str, Callable[[dict[str, Any]], None], Callable[[], str]]] = [
    ("main-node-not-below-num-nodes", _main_node_4,
     lambda: "nodeProperties.mainNode: 4 must be less than numNodes 4"),
    ("ranges-leave-a-node-out", _gap,
     lambda: "nodeProperties.nodeRangeProperties: nodes [2] are in no range "
             "(ranges must cover 0:3)"),
    ("six-ranges", _six_ranges,
     lambda: "nodeProperties.nodeRangeProperties: 6 node ranges; Batch allows 1 to 5"),
    ("two-instance-types", _two_instance_types,
     lambda: "nodeProperties.nodeRangeProperties: all node ranges must use one instance type "
             "(got trn1.32xlarge, trn1n.32xlarge)"),
    ("no-open-ended-range", _closed,
     lambda: "nodeProperties.nodeRangeProperties: no open-ended range ('0:' or 'n:'), so a "
             "submit-time node count override would be refused"),
    ("neuron-ids-not-contiguous", _neuron_gap,
     lambda: f"{R0}.container.linuxParameters.devices: Neuron devices must be contiguous "
             "(missing /dev/neuron2, /dev/neuron7)"),
    ("neuron-id-twice", _neuron_twice,
     lambda: f"{R0}.container.linuxParameters.devices: Neuron devices must be contiguous "
             "(/dev/neuron3 is listed twice)"),
    ("target-nodes-syntax", _bad_target,
     lambda: f"{R0}: targetNodes: 'zzz' is not a node range like '0:', ':3', '2:5' or '4'"),
    ("target-nodes-backwards", _backwards,
     lambda: "nodeProperties.nodeRangeProperties[1]: targetNodes: '3:1' starts after it ends"),
    ("resource-type-neuron", _neuron_resource,
     lambda: f"{R0}.container.resourceRequirements[2].type: 'NEURON' must be one of "
             "GPU, VCPU, MEMORY"),
    ("unknown-key-botocore", _unknown_key,
     lambda: f'Unknown parameter in {R0}.container: "gpus", must be one of: '
             + members("ContainerProperties")),
    ("num-nodes-string-botocore", _numnodes_string,
     lambda: "Invalid type for parameter nodeProperties.numNodes, value: 2, "
             "type: <class 'str'>, valid types: <class 'int'>"),
    ("missing-target-nodes-botocore", _missing_target,
     lambda: f'Missing required parameter in {R0}: "targetNodes"'),
    ("attempts-11", _attempts_11,
     lambda: "retryStrategy.attempts: 11 must be 1 to 10"),
    ("name-with-a-dot", _dotted_name,
     lambda: "jobDefinitionName: 'jobgen-bert1.5b' must be 1-128 letters, digits, '-' or '_'"),
    ("type-container", _container_type,
     lambda: "type: 'container' must be 'multinode'"),
    ("no-node-properties", _no_node_properties,
     lambda: "nodeProperties: required for a multinode job definition"),
    ("zero-nodes", _zero_nodes,
     lambda: "nodeProperties.numNodes: 0 must be between 1 and 1000"),
    ("efa-device-moved", _efa_moved,
     lambda: f"{R0}.container.linuxParameters.devices[1]: an EFA device must keep its host "
             "path in the container"),
    ("six-exit-conditions", _six_conditions,
     lambda: "retryStrategy.evaluateOnExit: at most 5 conditions"),
    ("bad-exit-action", _bad_action,
     lambda: "retryStrategy.evaluateOnExit[1].action: must be RETRY or EXIT"),
]


def write(tmp_path: Path, jd: Any, name: str = "jd.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(jd, indent=2) + "\n", encoding="utf-8")
    return path


def test_the_base_definition_is_valid(jobgen: Callable[..., Any], tmp_path: Path) -> None:
    result = jobgen("batch", "validate", str(write(tmp_path, base())))
    assert (result.exit_code, result.output) == (0, "ok\n")


@pytest.mark.parametrize("mutate,message", [(c[1], c[2]) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_definition_is_refused_with_one_exact_line(
        jobgen: Callable[..., Any], tmp_path: Path, mutate: Callable[[dict[str, Any]], None],
        message: Callable[[], str]) -> None:
    jd = base()
    mutate(jd)
    path = write(tmp_path, jd)
    result = jobgen("batch", "validate", str(path))
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"error: {path}: {message()}\n"


def test_not_json(jobgen: Callable[..., Any], tmp_path: Path) -> None:
    path = tmp_path / "jd.json"
    path.write_text("")
    result = jobgen("batch", "validate", str(path))
    assert result.exit_code == 2
    assert result.stderr == f"error: {path}: not JSON: Expecting value: line 1 column 1 (char 0)\n"


def test_not_an_object(jobgen: Callable[..., Any], tmp_path: Path) -> None:
    path = write(tmp_path, [base()])
    result = jobgen("batch", "validate", str(path))
    assert result.exit_code == 2
    assert result.stderr == (f"error: {path}: must be a JSON object (a RegisterJobDefinition "
                             "request)\n")


def test_missing_file(jobgen: Callable[..., Any], tmp_path: Path) -> None:
    result = jobgen("batch", "validate", str(tmp_path / "nope.json"))
    assert result.exit_code == 2   # click's own "does not exist" usage error
    assert "nope.json" in result.stderr


def test_validate_names_where_in_library_use() -> None:
    jd = base()
    _attempts_11(jd)
    with pytest.raises(ConfigError) as info:
        batch_rules.validate(jd, "job definition for recipes/x.yaml")
    assert str(info.value) == ("job definition for recipes/x.yaml: retryStrategy.attempts: 11 "
                               "must be 1 to 10")
