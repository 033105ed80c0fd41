"""Facts per instance type (REFERENCE.md §4.4). Recipes name a platform; the spec and the
backends read its worker count, devices and network interfaces from here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PlatformName = Literal["trn1.32xlarge", "dl1.24xlarge"]


@dataclass(frozen=True)
class Platform:
    name: str
    accelerator: Literal["neuron", "hpu"]
    workers_per_node: int  # ranks started per node (NeuronCores on trn1, HPUs on dl1)
    devices: int           # /dev entries per node (Trainium chips, Gaudi cards)
    efa_interfaces: int
    vcpus: int
    memory_mib: int
    max_nodes: int         # AWS Batch multi-node jobs stop at 1,000 nodes


PLATFORMS: dict[str, Platform] = {
    # 16 Trainium chips x 2 NeuronCores; 8 EFA (800 Gbps); 128 vCPU; 512 GiB.
    "trn1.32xlarge": Platform("trn1.32xlarge", "neuron", 32, 16, 8, 128, 512 * 1024, 1000),
    # 8 Gaudi (32 GB HBM each); 4 EFA (400 Gbps); 96 vCPU; 768 GiB.
    "dl1.24xlarge": Platform("dl1.24xlarge", "hpu", 8, 8, 4, 96, 768 * 1024, 1000),
}
PLATFORM_NAMES = tuple(PLATFORMS)
