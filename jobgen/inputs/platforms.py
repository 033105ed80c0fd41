"""Facts per instance type, as data: one file per platform (`env/platforms/<name>.yaml`; shipped:
trn1.32xlarge, trn1n.32xlarge, dl1.24xlarge,
p4d.24xlarge). Recipes name a platform; the spec and the backends
read its worker count, devices and network interfaces from here. A user adds a platform without
editing jobgen: a file in a folder named by JOBGEN_PLATFORMS (folders separated by `:`, searched
before the shipped ones). Files are read when a platform is first asked for."""
from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal, Optional

from ..plumbing import resources
from ..plumbing.errors import ConfigError
from ..plumbing.record import record

PATH_ENV = "JOBGEN_PLATFORMS"
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")


@record
class Health:
    """The health gate (payload/common/health.py): what every node checks before the compile
    pass. A platform file sets its accelerator's checks; a site's `health:` overrides any value
    (left out: the platform's, then jobgen's default)."""
    enabled: Optional[bool] = None              # run the gate (default true; job.health_gate too)
    device_files: Optional[str] = None          # a glob of device files: `devices` must exist
    device_command: Optional[tuple[str, ...]] = None  # the runtime's device tool: must exit 0
    device_count_pattern: Optional[str] = None  # regex: its output lines that are one device each
    efa_interfaces: Optional[int] = None        # EFA interfaces that must be up (default: all)
    local_free_gib: Optional[float] = None      # free GiB at the node-local compile cache copy
    shared_free_gib: Optional[float] = None     # free GiB on shared storage (default: a checkpoint)
    clock_max_offset_ms: Optional[float] = None  # the clock's largest error (chrony or the kernel)
    collective_command: Optional[tuple[str, ...]] = None  # a bandwidth test across all nodes
    collective_pattern: Optional[str] = None    # regex: group 1 is its bandwidth in GB/s
    collective_floor_gbps: Optional[float] = None  # the least bandwidth; 0 or unset: not run
    timeout_s: Optional[int] = None             # seconds each command of the gate may take
    max_requeues: Optional[int] = None          # Slurm: requeues without failed nodes
    cost_s: Optional[float] = None              # seconds the gate adds to every start (jobgen plan)


@record
class Pod:
    """What a Kubernetes pod on this instance type asks for beside its devices and EFA
    interfaces (the EKS backend), as Kubernetes quantities: the scheduler keeps that much of
    the node for the pod, and Gaudi's runtime needs its huge pages reserved."""
    cpu: Optional[str] = None            # requests.cpu (cores, or millicores: "500m")
    memory: Optional[str] = None         # requests.memory (binary units: Mi, Gi)
    hugepages_2mi: Optional[str] = None  # hugepages-2Mi: requests and limits (equal, as required)
    host_ipc: bool = False               # the node's IPC namespace (Habana's EKS examples)
    # Set in the pod's container only, after the platform's env (a pod's interface is eth0).
    env: tuple[tuple[str, str], ...] = ()


@record
class Platform:
    name: str
    accelerator: Literal["neuron", "hpu", "cuda"]
    workers_per_node: int  # ranks started per node (NeuronCores on trn1, HPUs on dl1)
    devices: int           # /dev entries per node (Trainium chips, Gaudi cards)
    efa_interfaces: int
    vcpus: int
    memory_mib: int
    max_nodes: int         # AWS Batch multi-node jobs stop at 1,000 nodes
    # What an AWS Batch container asks for on this instance type: all but the memory the ECS
    # agent keeps, the vCPUs, and the shared memory for dataloaders.
    batch_vcpus: int
    batch_memory_mib: int
    batch_shm_mib: int
    device_paths: tuple[str, ...]  # accelerator device files mapped into a container (or none)
    # Where the accelerator keeps compiled graphs: the variable, and its value with {dir} for
    # the cache folder (Neuron's persistent cache; Habana's recipe cache and its options).
    compile_cache_var: str
    device_resource: str           # the Kubernetes device plugin's resource name
    compile_cache_value: str = "{dir}"
    batch_privileged: bool = False  # a Batch container sees the devices only when privileged
    health: Health = Health()       # the health gate's checks on this instance type
    # Exported on every node of a job on this instance type, in this order, before the payload's
    # and the recipe's own (the network: libfabric's EFA provider on trn1). [NAME, value] pairs.
    env: tuple[tuple[str, str], ...] = ()
    pod: Pod = Pod()                # what a Kubernetes pod asks for (EKS)

    @property
    def efa_devices(self) -> tuple[str, ...]:
        return tuple(f"/dev/infiniband/uverbs{i}" for i in range(self.efa_interfaces))


# Placeholders a collective command may carry (filled on the main node).
COLLECTIVE_FIELDS = ("nodes", "workers", "world", "hosts")


def check_health(health: Health, shown: str) -> None:
    """One line naming the file and the key for a value the gate cannot use."""
    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{shown}: health.{key}: {why}")

    for key in ("local_free_gib", "shared_free_gib", "clock_max_offset_ms",
                "collective_floor_gbps", "cost_s"):
        value = getattr(health, key)
        if value is not None and (not math.isfinite(value) or value < 0):
            raise bad(key, f"{value} must be a finite number, 0 or more")
    if health.timeout_s is not None and not 1 <= health.timeout_s <= 600:
        raise bad("timeout_s", f"{health.timeout_s} is not between 1 and 600 seconds")
    if health.max_requeues is not None and not 0 <= health.max_requeues <= 20:
        raise bad("max_requeues", f"{health.max_requeues} is not between 0 and 20")
    if health.efa_interfaces is not None and not 0 <= health.efa_interfaces <= 32:
        raise bad("efa_interfaces", f"{health.efa_interfaces} is not between 0 and 32")
    if health.device_files is not None and (
            not re.fullmatch(r"/dev/[A-Za-z0-9_/.*?\[\]-]+", health.device_files)
            or ".." in health.device_files):
        raise bad("device_files", f"{health.device_files!r} is not a glob of files under /dev")
    for key in ("device_command", "collective_command"):
        argv = getattr(health, key)
        if argv is not None and (not all(argv) or any("\0" in a or "\n" in a for a in argv)):
            raise bad(key, "every word must be a non-empty line (a list: [program, arg, ...])")
    for key in ("device_count_pattern", "collective_pattern"):
        pattern = getattr(health, key)
        if pattern is None:
            continue
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise bad(key, f"{pattern!r} is not a regular expression ({exc})") from None
        if key == "collective_pattern" and compiled.groups < 1:
            raise bad(key, f"{pattern!r} needs a group: the bandwidth in GB/s")
    if health.collective_command:
        for field in re.findall(r"\{([^}]*)\}", " ".join(health.collective_command)):
            if field not in COLLECTIVE_FIELDS:
                raise bad("collective_command", f"{{{field}}} is not one of "
                          + ", ".join(f"{{{f}}}" for f in COLLECTIVE_FIELDS))
        if not health.collective_pattern:
            raise bad("collective_pattern", "a collective_command needs the pattern that finds "
                      "its bandwidth")


def folders() -> list[Path]:
    """Where platform files are looked for, in order: JOBGEN_PLATFORMS's folders, then jobgen's."""
    extra = [Path(p) for p in os.environ.get(PATH_ENV, "").split(os.pathsep) if p.strip()]
    return extra + [resources.folder("platforms")]


_QUANTITY = re.compile(r"([0-9]+)(m|Mi|Gi|Ti)?")
_MIB = {"Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}


def _check_pod(platform: Platform, shown: str) -> None:
    """The pod's requests are Kubernetes quantities that fit the instance."""
    pod = platform.pod
    mib = 0
    for key in ("memory", "hugepages_2mi"):
        text = getattr(pod, key)
        if text is None:
            continue
        match = _QUANTITY.fullmatch(text)
        if not match or match.group(2) not in _MIB:
            raise ConfigError(f"{shown}: pod.{key}: {text!r} is not a quantity in Mi, Gi or Ti "
                              "(e.g. 690Gi)")
        mib += int(match.group(1)) * _MIB[match.group(2)]
    if mib > platform.memory_mib:
        raise ConfigError(f"{shown}: pod.memory and pod.hugepages_2mi ({mib} MiB together) "
                          f"exceed the instance's memory_mib ({platform.memory_mib})")
    if pod.cpu is not None:
        match = _QUANTITY.fullmatch(pod.cpu)
        if not match or match.group(2) not in (None, "m"):
            raise ConfigError(f"{shown}: pod.cpu: {pod.cpu!r} is not a CPU quantity (e.g. 120, "
                              "500m)")
        cores = int(match.group(1)) / (1000 if match.group(2) else 1)
        if not 0 < cores <= platform.vcpus:
            raise ConfigError(f"{shown}: pod.cpu: {pod.cpu} is not between 0 and the "
                              f"instance's {platform.vcpus} vcpus")


def _check(platform: Platform, shown: str, stem: str) -> Platform:
    if platform.name != stem:
        raise ConfigError(f"{shown}: name: {platform.name!r} must be the file's name ({stem!r})")
    for key in ("workers_per_node", "devices", "vcpus", "memory_mib", "max_nodes",
                "batch_vcpus", "batch_memory_mib", "batch_shm_mib"):
        if getattr(platform, key) < 1:
            raise ConfigError(f"{shown}: {key}: must be at least 1, got {getattr(platform, key)}")
    if not 0 <= platform.efa_interfaces <= 32:
        raise ConfigError(f"{shown}: efa_interfaces: {platform.efa_interfaces} is not between "
                          "0 and 32")
    if platform.batch_vcpus > platform.vcpus or platform.batch_memory_mib > platform.memory_mib:
        raise ConfigError(f"{shown}: batch_vcpus and batch_memory_mib cannot exceed the "
                          "instance's vcpus and memory_mib")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", platform.compile_cache_var):
        raise ConfigError(f"{shown}: compile_cache_var: {platform.compile_cache_var!r} is not "
                          "an environment variable name")
    if platform.compile_cache_value.count("{dir}") != 1 or \
            not platform.compile_cache_value.startswith("{dir}"):
        raise ConfigError(f"{shown}: compile_cache_value: {platform.compile_cache_value!r} must "
                          "start with {dir}, once (the cache folder, then any options)")
    if not re.fullmatch(r"[a-z0-9.-]+/[a-z0-9.-]+", platform.device_resource):
        raise ConfigError(f"{shown}: device_resource: {platform.device_resource!r} is not a "
                          "Kubernetes extended resource name (vendor.domain/name)")
    check_health(platform.health, shown)
    _check_pod(platform, shown)
    for path in platform.device_paths:
        if not re.fullmatch(r"/dev/[A-Za-z0-9_/.-]+", path) or ".." in path:
            raise ConfigError(f"{shown}: device_paths: {path!r} is not a device file under /dev")
    return platform


class _Platforms(Mapping[str, Platform]):
    """name -> Platform, read from the platform folders on first use (and kept)."""

    def __init__(self) -> None:
        self._loaded: dict[str, Platform] = {}

    def _find(self, name: str) -> Optional[Path]:
        if not _NAME_RE.fullmatch(name):
            return None
        for folder in folders():
            path = folder / f"{name}.yaml"
            if path.is_file():
                return path
        return None

    def __getitem__(self, name: str) -> Platform:
        found = self._loaded.get(name)
        if found is not None:
            return found
        path = self._find(name)
        if path is None:
            raise KeyError(name)
        from . import schema
        from .yamlfile import load_yaml
        builtin = path.parent == resources.folder("platforms")
        shown = f"env/platforms/{path.name}" if builtin else str(path)
        platform = _check(schema.build(Platform, load_yaml(path, shown), shown), shown, name)
        self._loaded[name] = platform
        return platform

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._loaded or self._find(name) is not None)

    def __iter__(self) -> Iterator[str]:
        names: set[str] = set()
        for folder in folders():
            if folder.is_dir():
                names.update(p.stem for p in folder.glob("*.yaml") if _NAME_RE.fullmatch(p.stem))
        return iter(sorted(names))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def clear(self) -> None:
        """Forget what was read (a test that changes JOBGEN_PLATFORMS)."""
        self._loaded.clear()


PLATFORMS = _Platforms()


def get(name: str, where: str) -> Platform:
    """The platform a recipe names, or one line naming the file, the key and the choices."""
    try:
        return PLATFORMS[name]
    except KeyError:
        raise ConfigError(f"{where}: platform: unknown platform {name!r} (platforms: "
                          f"{', '.join(PLATFORMS)}; add one as a file in env/platforms/ or in "
                          f"a folder named by {PATH_ENV})") from None
