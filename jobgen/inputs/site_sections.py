"""The sections of a site profile (env/sites/<name>.yaml): Slurm, paths, set-up, and each
container backend's (Batch, SageMaker, EKS). The comment beside a field is its description in
env/sites/site.schema.json; the profile as a whole, its loading and its checks are in site.py."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Literal, Optional

from ..backends.slurm import options as slurm_options
from ..plumbing.record import record


def least(n: int, default: Any = dataclasses.MISSING) -> Any:
    """A number field whose value must be at least `n` (site.py checks each on load)."""
    return dataclasses.field(default=default, metadata={"least": n})


@record
class SlurmSite:
    cpus_per_task: int = least(1)
    max_nodes: int = least(0)
    exclusive: bool = True
    # Seconds before the time limit at which Slurm warns the job (sbatch --signal): the trainers
    # that can save a checkpoint then, and the job is requeued without counting a failure.
    # Slurm may send it up to 60 s earlier than asked; keep it above a checkpoint write's time.
    time_limit_warning_s: int = least(1, 600)
    # How the first node's name becomes an IP: `nslookup` asks DNS and so avoids the trn1
    # /etc/hosts mis-mapping (REFERENCE §1.9); `getent` also reads /etc/hosts (emulated nodes).
    master_resolver: Literal["nslookup", "getent"] = "nslookup"
    # The FSx for Lustre client's cap on dirty data per connection, in MiB, set on each node
    # before the passes (`lctl set_param osc.*.max_dirty_mb=N`, where lctl exists; upstream
    # neuronx-nemo-megatron train_setup.sh sets 64 "to avoid OODs"). Left out: not touched.
    lustre_max_dirty_mb: Optional[int] = least(1, None)
    # The instance types of the cluster's compute nodes: a recipe for another platform is
    # refused here. Left out: any (a site whose nodes emulate every platform, like `local`).
    platforms: Optional[tuple[str, ...]] = None
    # More #SBATCH options every job of this site needs and jobgen does not own (constraint,
    # gres, mem, mail-type, comment, ...): name -> value ("" for a flag). --sbatch-opt adds more.
    extra_options: Optional[dict[str, str]] = None
    # The partition whose one node runs the prepare stage (a CPU partition where the cluster
    # has one). Left out: slurm.partition, where training runs.
    prepare_partition: Optional[str] = None


if not TYPE_CHECKING:   # and the site keys of the Slurm options jobgen owns (partition, ...)
    SlurmSite = slurm_options.site_fields(SlurmSite)


@record
class Paths:
    work_dir: str                            # run directories: logs, checkpoints, experiments
    data_dir: str                            # recipes' relative data paths are under this
    compile_cache: str                       # shared Neuron persistent cache (compile pass)
    local_compile_cache: Optional[str] = None  # node-local copy used by the training pass
    # Where payload snapshots go (one folder per payload digest), on storage every node reads;
    # default WORK_DIR/.jobgen/payload.
    payload_dir: Optional[str] = None
    # The upstream trainers' checkouts on the hosts (Slurm); containers of jobgen's images take
    # the image's own (env/containers/images.yaml).
    nemo_dir: Optional[str] = None           # neuronx-nemo-megatron .../language_modeling
    nxd_llama_dir: Optional[str] = None      # neuronx-distributed .../tp_zero1_llama_hf_pretrain
    # The nodes cannot write beside the data (a read-only mount, like SageMaker's FSx channel in
    # ro mode): trainers write what they derive from it (NeMo's index files) into the run.
    data_read_only: bool = False
    # The eval stage (lm-eval, offline): HF_HOME on the nodes, whose datasets cache holds the
    # tasks' data; a folder of the site's own task YAMLs; whether the nodes may reach the hub.
    hf_home: Optional[str] = None            # HF_HOME for the eval stage (its datasets cache)
    eval_tasks_dir: Optional[str] = None     # the site's own lm-eval task YAMLs (include path)
    hub_access: bool = False                 # the eval stage may download from the hub


@record
class Setup:
    activate: Optional[str] = None  # a virtualenv's bin/activate, sourced before anything runs


# The site's paths on the hosts that `jobgen submit` looks for before queueing a Slurm job
# (jobgen/job/site_paths.py). The payload snapshots (paths.payload_dir) are placed from the
# submitting host, so they cannot be only the nodes'.
NodePathKey = Literal["setup.activate", "paths.nemo_dir", "paths.nxd_llama_dir",
                      "paths.data_dir", "paths.work_dir", "paths.compile_cache"]


@record
class CpuInstance:
    """The CPU instance type that runs `--smoke` rehearsals on Batch (a site fact: it must be
    in one of the queue's compute environments), and what a container may take of it."""
    instance_type: str
    vcpus: int = least(1)
    memory_mib: int = least(512)


@record
class BatchSite:
    job_queue: Optional[str] = None
    repository: Optional[str] = None     # REGISTRY/REPOSITORY of jobgen's images (images.py)
    # platform name -> EFA interfaces the site's launch template attaches per instance (0 up to
    # the platform's maximum). A site fact: Docker refuses a container whose mapped
    # /dev/infiniband/uverbsN is missing on the host, so jobgen maps exactly this many.
    efa_interfaces: Optional[dict[str, int]] = None
    job_role_arn: Optional[str] = None
    execution_role_arn: Optional[str] = None
    log_group: str = "/aws/batch/job"
    region: Optional[str] = None
    shared_volume: Optional[str] = None  # host path mounted at the same path in the container
    timeout_hours: int = least(1, 72)
    max_nodes: int = least(0, 16)
    rendezvous_timeout_s: int = least(1, 900)  # how long nodes wait for each other before failing
    smoke: Optional[CpuInstance] = None  # where `--smoke` jobs run (no accelerators needed)
    # Variables every container reads from Secrets Manager or SSM Parameter Store (the container's
    # `secrets`: NAME -> valueFrom ARN, fetched with execution_role_arn), never a rendered value:
    # HF_TOKEN for a gated tokenizer.
    secrets: Optional[dict[str, str]] = None


@record
class FsxInput:
    """An FSx for Lustre file system a SageMaker job reads its data from (and, rw, writes to)."""
    file_system_id: str
    directory_path: str                  # /MOUNT-NAME/path inside the file system
    access_mode: Literal["ro", "rw"] = "ro"


@record
class SageMakerSite:
    """SageMaker training jobs: the account's role, images and storage (env/sites/*.yaml)."""
    role_arn: Optional[str] = None
    region: Optional[str] = None
    repository: Optional[str] = None            # ECR: ACCOUNT.dkr.ecr.REGION.amazonaws.com/NAME
    # Where a run's checkpoints live between attempts: S3URI/RUN-NAME, synced from and restored
    # to /opt/ml/checkpoints/RUN-NAME on every node (a retried or resubmitted run resumes).
    checkpoint_s3_uri: Optional[str] = None
    output_s3_uri: Optional[str] = None         # the job's model.tar.gz and output (required)
    data_s3_uri: Optional[str] = None           # the training data, as channel "train"
    fsx: Optional[FsxInput] = None              # or from FSx for Lustre (needs subnets)
    subnets: Optional[tuple[str, ...]] = None
    security_group_ids: Optional[tuple[str, ...]] = None
    volume_size_gb: int = least(1, 500)         # each instance's EBS volume
    max_runtime_hours: int = least(1, 120)      # the stopping condition (at most 28 days)
    max_nodes: int = least(0, 16)
    rendezvous_timeout_s: int = least(1, 900)
    compile_cache: str = "/opt/ml/checkpoints/compile-cache"  # kept in S3 with checkpoints
    smoke_instance_type: Optional[str] = None   # a CPU instance for --smoke (ml.c5.4xlarge)
    export_instance_type: Optional[str] = None  # the export stage's (default: by model size)
    keep_alive_s: int = least(0, 0)             # warm pool: seconds instances stay for the next


# The JobSet release the EKS manifests are checked against, and how a cluster gets it.
JOBSET_RELEASE = "v0.12.0"
JOBSET_INSTALL = ("kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/"
                  f"releases/download/{JOBSET_RELEASE}/manifests.yaml")


@record
class EksSite:
    """An Amazon EKS cluster with the Neuron, EFA (and NVIDIA / Habana) device plugins."""
    namespace: str = "default"
    repository: Optional[str] = None            # REGISTRY/REPOSITORY of jobgen's images
    shared_pvc: Optional[str] = None            # the FSx for Lustre PersistentVolumeClaim
    shared_mount: str = "/fsx"                  # where it is mounted (the site's paths are on it)
    # The compile cache each node's training pass reads: a hostPath on the node's own disk
    # (HLAT: a cache on shared FSx caused timeouts); the compile pass writes the shared one.
    local_cache_host_path: str = "/var/tmp/jobgen-compile-cache"
    # What restarts a job's gang of pods: JobSet, the one form (site.py refuses any other value,
    # naming JOBSET_INSTALL).
    gang: Optional[Literal["jobset"]] = None
    # Restarts after a drain, preemption or eviction, which JobSet does not count, beyond
    # job.max_restarts: a pod of a later restart attempt ends the job (the kubelet's own
    # node-pressure evictions are such disruptions too, and could otherwise repeat forever).
    max_disruptions: int = least(0, 10)
    service_account: Optional[str] = None
    efa_interfaces: Optional[dict[str, int]] = None  # per platform (default: all it has)
    max_nodes: int = least(0, 16)
    rendezvous_timeout_s: int = least(1, 900)
    context: Optional[str] = None               # the kubeconfig context (default: current)
    smoke_cpu: str = "4"                        # what a --smoke pod asks for
    smoke_memory: str = "8Gi"
