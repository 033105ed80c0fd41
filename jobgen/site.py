"""Site profiles (`env/sites/<name>.yaml`): where jobs run. The recipe says what to train; the
site says which partition, which shared directories, which virtualenv, where the compile cache and
the upstream trainer checkouts live. `local` is the embedded default that works on this machine."""
from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Literal, Optional

from . import resources, schema
from .errors import ConfigError
from .image_ref import check_repository
from .platforms import Health, check_health
from .record import record
from .site_plan import PlanSite, check_plan
from .yamlfile import load_yaml

DEFAULT_SITE = "local"
# botocore's rule for a region name (a host label), which it checks only when a client is made.
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")   # what a terminal or a shell acts on
REGION_RE = re.compile(r"(?![0-9]+$)(?!-)[a-zA-Z0-9-]{1,63}(?<!-)")


@record
class SlurmSite:
    cpus_per_task: int
    max_nodes: int
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    reservation: Optional[str] = None
    exclusive: bool = True
    # Seconds before the time limit at which Slurm warns the job (sbatch --signal): the trainers
    # that can save a checkpoint then, and the job is requeued without counting a failure.
    # Slurm may send it up to 60 s earlier than asked; keep it above a checkpoint write's time.
    time_limit_warning_s: int = 600
    # How the first node's name becomes an IP: `nslookup` asks DNS and so avoids the trn1
    # /etc/hosts mis-mapping (REFERENCE §1.9); `getent` also reads /etc/hosts (emulated nodes).
    master_resolver: Literal["nslookup", "getent"] = "nslookup"
    # The FSx for Lustre client's cap on dirty data per connection, in MiB, set on each node
    # before the passes (`lctl set_param osc.*.max_dirty_mb=N`, where lctl exists; upstream
    # neuronx-nemo-megatron train_setup.sh sets 64 "to avoid OODs"). Left out: not touched.
    lustre_max_dirty_mb: Optional[int] = None
    # The instance types of the cluster's compute nodes: a recipe for another platform is
    # refused here. Left out: any (a site whose nodes emulate every platform, like `local`).
    platforms: Optional[tuple[str, ...]] = None
    # More #SBATCH options every job of this site needs and jobgen does not own (constraint,
    # gres, mem, mail-type, comment, ...): name -> value ("" for a flag). --sbatch-opt adds more.
    extra_options: Optional[dict[str, str]] = None


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


@record
class Setup:
    activate: Optional[str] = None  # a virtualenv's bin/activate, sourced before anything runs


# The site's paths on the hosts that `jobgen submit` looks for before queueing a Slurm job
# (jobgen/site_paths.py). The payload snapshots (paths.payload_dir) are placed from the
# submitting host, so they cannot be only the nodes'.
NodePathKey = Literal["setup.activate", "paths.nemo_dir", "paths.nxd_llama_dir",
                      "paths.data_dir", "paths.work_dir", "paths.compile_cache"]


@record
class CpuInstance:
    """The CPU instance type that runs `--smoke` rehearsals on Batch (a site fact: it must be
    in one of the queue's compute environments), and what a container may take of it."""
    instance_type: str
    vcpus: int
    memory_mib: int


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
    timeout_hours: int = 72
    max_nodes: int = 16
    rendezvous_timeout_s: int = 900      # how long nodes wait for each other before failing
    smoke: Optional[CpuInstance] = None  # where `--smoke` jobs run (no accelerators needed)


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
    volume_size_gb: int = 500                   # each instance's EBS volume
    max_runtime_hours: int = 120                # the stopping condition (at most 28 days)
    max_nodes: int = 16
    rendezvous_timeout_s: int = 900
    compile_cache: str = "/opt/ml/checkpoints/compile-cache"  # kept in S3 with checkpoints
    smoke_instance_type: Optional[str] = None   # a CPU instance for --smoke (ml.c5.4xlarge)
    keep_alive_s: int = 0                       # warm pool: seconds instances stay for the next


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
    # What restarts a job's gang of pods: JobSet (kubernetes-sigs/jobset, recommended), Kubeflow's
    # training operator (a PyTorchJob), or neither (a plain Indexed Job). None: pytorchjob where
    # training_operator (the older key) is true, else indexed-job.
    gang: Optional[Literal["jobset", "pytorchjob", "indexed-job"]] = None
    training_operator: bool = False             # Kubeflow's PyTorchJob instead of an Indexed Job
    service_account: Optional[str] = None
    efa_interfaces: Optional[dict[str, int]] = None  # per platform (default: all it has)
    max_nodes: int = 16
    rendezvous_timeout_s: int = 900
    context: Optional[str] = None               # the kubeconfig context (default: current)
    smoke_cpu: str = "4"                        # what a --smoke pod asks for
    smoke_memory: str = "8Gi"


@record
class Site:
    name: str
    description: str
    slurm: SlurmSite
    paths: Paths
    setup: Setup = Setup()
    # Site paths only the compute nodes have (a mount the submitting host lacks): the submit
    # preflight does not look for them on the submitting host.
    node_only_paths: Optional[tuple[NodePathKey, ...]] = None  # keys the preflight skips
    batch: Optional[BatchSite] = None
    sagemaker: Optional[SageMakerSite] = None
    eks: Optional[EksSite] = None
    plan: PlanSite = PlanSite()
    health: Health = Health()        # overrides the platform's health gate (any value)

    @property
    def snapshot_root(self) -> str:
        """The folder of the payload snapshots (jobgen/snapshot.py) on the shared storage."""
        return self.paths.payload_dir or posixpath.join(self.paths.work_dir, ".jobgen", "payload")


_SECTION = {BatchSite: "batch", SageMakerSite: "sagemaker", EksSite: "eks"}
# An Amazon ECR repository: the only place SageMaker's CreateTrainingJob pulls images from.
ECR_RE = re.compile(r"[0-9]{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?/[a-z0-9._/-]+")
# A Kubernetes namespace or object name (RFC 1123 label).
K8S_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def site_names() -> list[str]:
    return sorted(p.stem for p in resources.folder("sites").glob("*.yaml"))


def load(ref: Optional[str] = None) -> Site:
    """Load a site profile by name (env/sites/NAME.yaml) or by path; None: the user's default
    (JOBGEN_SITE, the config file, else local: jobgen/userconfig.py)."""
    if ref is None:
        from . import userconfig
        ref, _ = userconfig.site(None)
    elif not ref.strip():
        raise ConfigError("--site: empty site name (leave it out for the default site)")
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        path, shown = Path(ref), ref
        if not path.is_file():
            raise ConfigError(f"{ref}: no such site profile")
    else:
        path, shown = resources.folder("sites") / f"{ref}.yaml", f"env/sites/{ref}.yaml"
        if not path.is_file():
            raise ConfigError(f"unknown site {ref!r} (sites: {', '.join(site_names())})")
    return load_file(path, shown)


def locate(ref: Optional[str]) -> tuple[Path, str]:
    """(file, name shown in messages) of a site reference, without reading it."""
    if ref is None:
        from . import userconfig
        ref, _ = userconfig.site(None)
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        return Path(ref), ref
    return resources.folder("sites") / f"{ref}.yaml", f"env/sites/{ref}.yaml"


def load_file(path: Path, shown: str) -> Site:
    """`load` of a file named `shown` in messages (a run's recorded copy of its site)."""
    data = load_yaml(path, shown)
    _refuse_image_paths(data, shown)
    site = schema.build(Site, data, shown)
    for key, value in (("slurm.partition", site.slurm.partition),
                       ("slurm.account", site.slurm.account), ("slurm.qos", site.slurm.qos),
                       ("slurm.reservation", site.slurm.reservation), ("name", site.name)):
        if value is not None and not schema.NAME_RE.fullmatch(value):
            raise ConfigError(f"{shown}: {key}: {schema.describe(value)} must match "
                              f"{schema.NAME_RE.pattern}")
    numbers: list[tuple[str, int, int]] = [("slurm.cpus_per_task", site.slurm.cpus_per_task, 1),
               ("slurm.max_nodes", site.slurm.max_nodes, 0),
               ("slurm.time_limit_warning_s", site.slurm.time_limit_warning_s, 1)]
    if site.slurm.lustre_max_dirty_mb is not None:
        numbers += [("slurm.lustre_max_dirty_mb", site.slurm.lustre_max_dirty_mb, 1)]
    if site.batch is not None:
        numbers += [("batch.timeout_hours", site.batch.timeout_hours, 1),
                    ("batch.max_nodes", site.batch.max_nodes, 0),
                    ("batch.rendezvous_timeout_s", site.batch.rendezvous_timeout_s, 1)]
        if site.batch.smoke is not None:
            numbers += [("batch.smoke.vcpus", site.batch.smoke.vcpus, 1),
                        ("batch.smoke.memory_mib", site.batch.smoke.memory_mib, 512)]
    if site.sagemaker is not None:
        numbers += [("sagemaker.max_nodes", site.sagemaker.max_nodes, 0),
                    ("sagemaker.volume_size_gb", site.sagemaker.volume_size_gb, 1),
                    ("sagemaker.max_runtime_hours", site.sagemaker.max_runtime_hours, 1),
                    ("sagemaker.rendezvous_timeout_s", site.sagemaker.rendezvous_timeout_s, 1),
                    ("sagemaker.keep_alive_s", site.sagemaker.keep_alive_s, 0)]
        if site.sagemaker.max_runtime_hours > 28 * 24:
            raise ConfigError(f"{shown}: sagemaker.max_runtime_hours: "
                              f"{site.sagemaker.max_runtime_hours} is more than SageMaker's "
                              "28 days (672)")
    if site.eks is not None:
        numbers += [("eks.max_nodes", site.eks.max_nodes, 0),
                    ("eks.rendezvous_timeout_s", site.eks.rendezvous_timeout_s, 1)]
        if not K8S_NAME_RE.fullmatch(site.eks.namespace):
            raise ConfigError(f"{shown}: eks.namespace: {schema.describe(site.eks.namespace)} "
                              "is not a Kubernetes name (lower case letters, digits, '-')")
        if site.eks.training_operator and site.eks.gang not in (None, "pytorchjob"):
            raise ConfigError(f"{shown}: eks.training_operator: true contradicts eks.gang: "
                              f"{site.eks.gang} (leave training_operator out)")
        for key, value in schema.to_plain(site.eks).items():
            if isinstance(value, str) and CONTROL_RE.search(value):
                raise ConfigError(f"{shown}: eks.{key}: {schema.describe(value)} holds a control "
                                  "character")
        for key, value in (("eks.shared_mount", site.eks.shared_mount),
                           ("eks.local_cache_host_path", site.eks.local_cache_host_path)):
            if not value.startswith("/"):
                raise ConfigError(f"{shown}: {key}: {schema.describe(value)} must be an "
                                  "absolute path")
            if posixpath.normpath("/" + value.strip("/")) == "/" or ".." in value.split("/"):
                # Mounted over the container's / (or a host's /): the pod would see no system.
                raise ConfigError(f"{shown}: {key}: {schema.describe(value)} must be a folder "
                                  "below / (a mount over / hides the container's own files)")
    for key, number, least in numbers:
        if number < least:
            raise ConfigError(f"{shown}: {key}: {number} must be at least {least}")
    check_plan(site.plan, shown)
    check_health(site.health, shown)
    if site.slurm.time_limit_warning_s > 65535:   # sbatch --signal's limit
        raise ConfigError(f"{shown}: slurm.time_limit_warning_s: "
                          f"{site.slurm.time_limit_warning_s} is more than sbatch's 65535")
    from .platforms import PLATFORMS
    for name in site.slurm.platforms or ():
        if name not in PLATFORMS:
            raise ConfigError(f"{shown}: slurm.platforms: {schema.describe(name)} is not a "
                              f"platform jobgen knows ({', '.join(sorted(PLATFORMS))})")
    for key, region in (("batch.region", site.batch.region if site.batch else None),
                        ("sagemaker.region", site.sagemaker.region if site.sagemaker else None)):
        if region is not None and not REGION_RE.fullmatch(region):
            raise ConfigError(f"{shown}: {key}: {schema.describe(region)} is not an AWS "
                              "region name (like us-east-1)")
    for section in (site.batch, site.sagemaker, site.eks):
        if section is not None and section.repository is not None:
            # Docker's reference grammar, before any service is asked to pull from it.
            check_repository(section.repository, f"{shown}: {_SECTION[type(section)]}.repository")
    from .limits import SITE_LIMITS
    from .rules import check_limits, check_site_paths
    check_site_paths(site.paths.work_dir, site.paths.compile_cache,
                     site.paths.local_compile_cache, shown)
    local_cache = site.paths.local_compile_cache
    if local_cache is not None and not local_cache.startswith("/"):
        # Each node's own disk: payload/common/sync_cache.sh refuses a relative path at run time.
        raise ConfigError(f"{shown}: paths.local_compile_cache: {schema.describe(local_cache)} "
                          "must be an absolute path on each node's local disk")
    check_limits(schema.to_plain(site), SITE_LIMITS, shown)
    repository = site.sagemaker.repository if site.sagemaker else None
    if repository is not None and not ECR_RE.fullmatch(repository):
        # CreateTrainingJob pulls training images from Amazon ECR only.
        raise ConfigError(f"{shown}: sagemaker.repository: {schema.describe(repository)} is "
                          "not an Amazon ECR repository: push jobgen's images to one and write "
                          "ACCOUNT.dkr.ecr.REGION.amazonaws.com/NAME")
    return site


# Keys of container sections that named what is inside jobgen's images (images.yaml declares
# it now), and what to write instead.
_IMAGE_KEYS = {
    "images": "write {section}.repository: REGISTRY/REPOSITORY (one repository; jobgen tags "
              "each image PLATFORM-TRAINER-PAYLOADID: see `jobgen image-context`)",
    "payload_dir": "remove it (env/containers/images.yaml declares where the image holds it)",
    "entrypoint": "remove it (env/containers/images.yaml declares where the image holds it)",
}


def _refuse_image_paths(data: dict[str, object], shown: str) -> None:
    for section in ("batch", "sagemaker", "eks"):
        values = data.get(section)
        for key, instead in _IMAGE_KEYS.items():
            if isinstance(values, dict) and key in values:
                raise ConfigError(f"{shown}: {section}.{key}: a site no longer names jobgen's "
                                  f"images or paths inside them; "
                                  + instead.format(section=section))
