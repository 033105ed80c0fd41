"""Facts per instance type, as data: one file per platform (`env/platforms/<name>.yaml`; shipped:
trn1.32xlarge, trn1n.32xlarge, dl1.24xlarge,
p4d.24xlarge). Recipes name a platform; the spec and the backends
read its worker count, devices and network interfaces from here. A user adds a platform without
editing jobgen: a file in a folder named by JOBGEN_PLATFORMS (folders separated by `:`, searched
before the shipped ones). Files are read when a platform is first asked for."""
from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal, Optional

from . import resources
from .errors import ConfigError
from .record import record

PATH_ENV = "JOBGEN_PLATFORMS"
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")


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

    @property
    def efa_devices(self) -> tuple[str, ...]:
        return tuple(f"/dev/infiniband/uverbs{i}" for i in range(self.efa_interfaces))


def folders() -> list[Path]:
    """Where platform files are looked for, in order: JOBGEN_PLATFORMS's folders, then jobgen's."""
    extra = [Path(p) for p in os.environ.get(PATH_ENV, "").split(os.pathsep) if p.strip()]
    return extra + [resources.folder("platforms")]


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
        from .recipe import load_yaml
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
