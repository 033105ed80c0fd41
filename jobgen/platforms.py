"""Facts per instance type (REFERENCE.md §4.4). Recipes name a platform; the spec and the
backends read its worker count, devices and network interfaces from here."""
from __future__ import annotations

from typing import Literal

from .record import record

PlatformName = Literal["trn1.32xlarge", "dl1.24xlarge"]


@record
class Platform:
    name: str
    accelerator: Literal["neuron", "hpu"]
    workers_per_node: int  # ranks started per node (NeuronCores on trn1, HPUs on dl1)
    devices: int           # /dev entries per node (Trainium chips, Gaudi cards)
    efa_interfaces: int
    vcpus: int
    memory_mib: int
    max_nodes: int         # AWS Batch multi-node jobs stop at 1,000 nodes
    # What an AWS Batch container asks for on this instance type (REFERENCE.md §3.1, §4.2): all
    # but the memory the ECS agent keeps, the vCPUs, and the shared memory for dataloaders.
    batch_vcpus: int
    batch_memory_mib: int
    batch_shm_mib: int
    device_paths: tuple[str, ...]  # accelerator device files mapped into a container (or none)

    @property
    def efa_devices(self) -> tuple[str, ...]:
        return tuple(f"/dev/infiniband/uverbs{i}" for i in range(self.efa_interfaces))


PLATFORMS: dict[str, Platform] = {
    # 16 Trainium chips x 2 NeuronCores; 8 EFA (800 Gbps); 128 vCPU; 512 GiB.
    "trn1.32xlarge": Platform("trn1.32xlarge", "neuron", 32, 16, 8, 128, 512 * 1024, 1000,
                              batch_vcpus=96, batch_memory_mib=500000, batch_shm_mib=65536,
                              # contiguous ids, or the runtime fails with "Could not open the nd1"
                              device_paths=tuple(f"/dev/neuron{i}" for i in range(16))),
    # 8 Gaudi (32 GB HBM each); 4 EFA (400 Gbps); 96 vCPU; 768 GiB.
    "dl1.24xlarge": Platform("dl1.24xlarge", "hpu", 8, 8, 4, 96, 768 * 1024, 1000,
                             batch_vcpus=96, batch_memory_mib=760000, batch_shm_mib=64000,
                             # Gaudi cards have no device mapping on Batch: the container runs
                             # privileged to see /dev/hl*.
                             device_paths=()),
}
PLATFORM_NAMES = tuple(PLATFORMS)
