"""Site profiles (`env/sites/<name>.yaml`): where jobs run. The recipe says what to train; the
site says which partition, which shared directories, which virtualenv, where the compile cache and
the upstream trainer checkouts live. `local` is the embedded default that works on this machine.

This module holds the profile as a whole, its loading and its checks across sections; each
section's own fields are in site_sections.py."""
from __future__ import annotations

import dataclasses
import posixpath
import re
from pathlib import Path
from typing import Any, Optional

from ..backends.slurm import options as slurm_options
from ..plumbing import resources
from ..plumbing.errors import ConfigError
from ..plumbing.record import record
from . import schema
from .image_ref import check_repository, unseen
from .platforms import Health, check_health
from .site_plan import PlanSite, check_plan
from .site_sections import (
    JOBSET_INSTALL,
    BatchSite,
    EksSite,
    NodePathKey,
    Paths,
    SageMakerSite,
    Setup,
    SlurmSite,
)
from .yamlfile import load_yaml

DEFAULT_SITE = "local"
# An AWS region name: botocore's rule (a host label, which it checks only when a client is made),
# in lower case, as every region is named: botocore takes US-EAST-1 and signs requests for it,
# and AWS refuses the signature (the credential scope names the region).
REGION_RE = re.compile(r"(?![0-9]+$)(?!-)[a-z0-9-]{1,63}(?<!-)")


def region_problem(name: str) -> Optional[str]:
    """Why `name` is not an AWS region name (a phrase after it), or None."""
    if REGION_RE.fullmatch(name):
        return None
    lower = ": region names are lower case" if REGION_RE.fullmatch(name.lower()) else ""
    return f"is not an AWS region name (like us-east-1){lower}"


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
        """The folder of the payload snapshots (jobgen/images/snapshot.py) on the shared storage."""
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
    (JOBGEN_SITE, the config file, else local: jobgen/inputs/userconfig.py)."""
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
    _refuse_other_gangs(data, shown)
    site = schema.build(Site, data, shown)
    if not schema.NAME_RE.fullmatch(site.name):
        raise ConfigError(f"{shown}: name: {schema.describe(site.name)} must match "
                          f"{schema.NAME_RE.pattern}")
    slurm_options.check_site(site.slurm, shown)
    if site.sagemaker is not None and site.sagemaker.max_runtime_hours > 28 * 24:
        raise ConfigError(f"{shown}: sagemaker.max_runtime_hours: "
                          f"{site.sagemaker.max_runtime_hours} is more than SageMaker's "
                          "28 days (672)")
    if site.eks is not None:
        if not K8S_NAME_RE.fullmatch(site.eks.namespace):
            raise ConfigError(f"{shown}: eks.namespace: {schema.describe(site.eks.namespace)} "
                              "is not a Kubernetes name (lower case letters, digits, '-')")
        for key, value in schema.to_plain(site.eks).items():
            said = unseen(value) if isinstance(value, str) else None
            if said is not None:   # names and quantities that reach the manifests
                raise ConfigError(f"{shown}: eks.{key}: {schema.describe(value)} {said}")
        for key, value in (("eks.shared_mount", site.eks.shared_mount),
                           ("eks.local_cache_host_path", site.eks.local_cache_host_path)):
            if not value.startswith("/"):
                raise ConfigError(f"{shown}: {key}: {schema.describe(value)} must be an "
                                  "absolute path")
            if posixpath.normpath("/" + value.strip("/")) == "/" or ".." in value.split("/"):
                # Mounted over the container's / (or a host's /): the pod would see no system.
                raise ConfigError(f"{shown}: {key}: {schema.describe(value)} must be a folder "
                                  "below / (a mount over / hides the container's own files)")
    _check_least(site, "", shown)
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
        said = region_problem(region) if region is not None else None
        if said is not None:
            raise ConfigError(f"{shown}: {key}: {schema.describe(region)} {said}")
    batch = site.batch
    for name, arn in ((batch.secrets or {}).items() if batch is not None else ()):
        said = secret_problem(name, arn, batch.execution_role_arn if batch else None)
        if said is not None:
            raise ConfigError(f"{shown}: batch.secrets.{name}: {said}")
    for section in (site.batch, site.sagemaker, site.eks):
        if section is not None and section.repository is not None:
            # Docker's reference grammar, before any service is asked to pull from it.
            check_repository(section.repository, f"{shown}: {_SECTION[type(section)]}.repository")
    from .limits import SITE_LIMITS
    from .rules import check_limits, check_site_paths, path_problem
    for key, value in _paths(site):
        said = path_problem(value)
        if said is not None:   # before anything looks for it, makes it or renders it
            raise ConfigError(f"{shown}: {key}: {schema.describe(value)} {said}")
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


# A Batch container secret's valueFrom: a Secrets Manager secret's ARN (with an optional
# :json-key:version-stage:version-id) or an SSM parameter's.
SECRET_ARN_RE = re.compile(r"arn:aws(-[a-z]+)*:(secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:"
                           r"[A-Za-z0-9/_+=.@-]+(:[^:\s]*){0,3}|ssm:[a-z0-9-]+:[0-9]{12}:"
                           r"parameter/[A-Za-z0-9/_.-]+)")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def secret_problem(name: str, arn: Any, execution_role: Optional[str]) -> Optional[str]:
    """What is wrong with one batch.secrets entry, or None."""
    if not ENV_NAME_RE.fullmatch(name) or name.startswith(("JOBGEN_", "AWS_BATCH_")):
        return ("is not a variable name the job may set (letters, digits, _; not JOBGEN_* "
                "or AWS_BATCH_*)")
    if not isinstance(arn, str) or not SECRET_ARN_RE.fullmatch(arn):
        return (f"{schema.describe(arn)} is not the ARN of a Secrets Manager secret "
                "(arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME) or an SSM parameter "
                "(arn:aws:ssm:REGION:ACCOUNT:parameter/NAME)")
    if not execution_role:
        return "needs batch.execution_role_arn: the role that reads the secret for the container"
    return None


def _check_least(section: Any, key: str, shown: str) -> None:
    """Each number field's least value (`least` in site_sections.py), section by section."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            _check_least(value, f"{key}{f.name}.", shown)
        elif "least" in f.metadata and value is not None and value < f.metadata["least"]:
            raise ConfigError(f"{shown}: {key}{f.name}: {value} must be at least "
                              f"{f.metadata['least']}")


def _paths(site: Site) -> list[tuple[str, str]]:
    """(key, path) of every path the site names, on the hosts, the nodes or in containers."""
    found = [(f"paths.{k}", v) for k, v in schema.to_plain(site.paths).items()
             if isinstance(v, str)]
    found += [("setup.activate", site.setup.activate or "")]
    if site.batch is not None:
        found += [("batch.shared_volume", site.batch.shared_volume or "")]
    if site.sagemaker is not None:
        found += [("sagemaker.compile_cache", site.sagemaker.compile_cache)]
    if site.eks is not None:
        found += [("eks.shared_mount", site.eks.shared_mount),
                  ("eks.local_cache_host_path", site.eks.local_cache_host_path)]
    return found


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


def _refuse_other_gangs(data: dict[str, object], shown: str) -> None:
    """EKS gangs are JobSets only: the forms that were not (eks.gang: pytorchjob, indexed-job,
    eks.training_operator) are refused with the line that installs JobSet."""
    eks = data.get("eks")
    if not isinstance(eks, dict):
        return
    gang = eks.get("gang")
    if "training_operator" in eks:
        key = f"training_operator: {schema.describe(eks['training_operator'])}"
    elif gang is not None and gang != "jobset":
        key = f"gang: {schema.describe(gang)}"
    else:
        return
    raise ConfigError(f"{shown}: eks.{key}: jobgen's EKS jobs are JobSets only; install JobSet "
                      f"on the cluster ({JOBSET_INSTALL}) and leave the key out")
