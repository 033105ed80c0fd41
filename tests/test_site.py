"""Site profiles: where jobs run. Loaded by name or path, strictly, with the names that reach
#SBATCH lines restricted to a safe alphabet."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from jobgen.inputs import site as sites
from jobgen.plumbing.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def test_site_names_are_the_files() -> None:
    names = sites.site_names()
    assert names == sorted(p.stem for p in (ROOT / "env" / "sites").glob("*.yaml"))
    assert {"local", "trn1-pcluster"} <= set(names)


def test_local_is_the_default() -> None:
    site = sites.load()
    assert site.name == sites.DEFAULT_SITE == "local"
    assert site.slurm.master_resolver == "getent"      # emulated nodes are in /etc/hosts only
    assert site.slurm.partition is None
    assert site.paths.payload_dir is None
    # Payload snapshots go under the run folders, on the storage the nodes share.
    assert site.snapshot_root == "jobgen-runs/.jobgen/payload"
    assert not Path(site.paths.work_dir).is_absolute()  # relative to the submission directory


def test_trn1_pcluster() -> None:
    site = sites.load("trn1-pcluster")
    assert (site.slurm.partition, site.slurm.cpus_per_task, site.slurm.max_nodes) == \
        ("compute1", 128, 128)
    assert site.slurm.exclusive is True
    assert site.slurm.master_resolver == "nslookup"    # DNS, not the trn1 hosts file
    assert site.paths.compile_cache == "/fsx/neuron-compile-cache"
    assert site.paths.local_compile_cache == "/local_storage/neuron-compile-cache"
    assert site.snapshot_root == "/fsx/jobgen/payload"     # paths.payload_dir
    # Where AWS's ParallelCluster sample makes the venv (tests/test_site_paths.py: cited).
    assert site.setup.activate == "/home/ubuntu/aws_neuron_venv_pytorch/bin/activate"


def test_site_by_path(write_site: Callable) -> None:
    path = write_site("local", {"name": "mine", "slurm.max_nodes": 2})
    site = sites.load(str(path))
    assert (site.name, site.slurm.max_nodes) == ("mine", 2)


def test_site_defaults(write_site: Callable) -> None:
    path = write_site(text="name: tiny\ndescription: d\nslurm: {cpus_per_task: 1, max_nodes: 1}\n"
                           "paths: {work_dir: w, data_dir: d, compile_cache: c}\n")
    site = sites.load(str(path))
    assert site.slurm.exclusive is True and site.slurm.master_resolver == "nslookup"
    assert site.setup.activate is None and site.batch is None
    assert site.paths.local_compile_cache is None and site.paths.nemo_dir is None


def test_unknown_sites(tmp_path: Path) -> None:
    names = ", ".join(sorted(p.stem for p in (ROOT / "env" / "sites").glob("*.yaml")))
    with pytest.raises(ConfigError) as info:
        sites.load("nope")
    assert str(info.value) == f"unknown site 'nope' (sites: {names})"
    with pytest.raises(ConfigError) as info:
        sites.load(str(tmp_path / "gone.yaml"))
    assert str(info.value) == f"{tmp_path}/gone.yaml: no such site profile"


@pytest.mark.parametrize("changes,message", [
    ({"slurm.partition": "compute1; id"},
     "{f}: slurm.partition: 'compute1; id' is not a name matching " + NAME_PATTERN),
    ({"slurm.partition": "compute1\n#SBATCH --x"},
     "{f}: slurm.partition: 'compute1\\n#SBATCH --x' is not a name matching " + NAME_PATTERN),
    ({"slurm.account": "$(id)"},
     "{f}: slurm.account: '$(id)' is not a name matching " + NAME_PATTERN),
    ({"name": "a b"}, "{f}: name: 'a b' must match " + NAME_PATTERN),
    ({"slurm.partiton": "x"}, "{f}: slurm.partiton: unknown key (known keys: cpus_per_task, "
                              "max_nodes, partition, account, qos, reservation, exclusive, "
                              "time_limit_warning_s, master_resolver, "
                              "lustre_max_dirty_mb, platforms, extra_options, "
                              "prepare_partition)"),
    ({"slurm.lustre_max_dirty_mb": 0},
     "{f}: slurm.lustre_max_dirty_mb: 0 must be at least 1"),
    # each number's least value is declared on its field (site_sections.least)
    ({"slurm.max_nodes": -1}, "{f}: slurm.max_nodes: -1 must be at least 0"),
    ({"slurm.time_limit_warning_s": 0}, "{f}: slurm.time_limit_warning_s: 0 must be at least 1"),
    ({"eks.max_disruptions": -1}, "{f}: eks.max_disruptions: -1 must be at least 0"),
    ({"paths.local_compile_cache": "/"}, "{f}: paths.local_compile_cache: '/' is the root, the "
                                         "home folder or the submission folder itself: give a "
                                         "folder of its own"),
    ({"paths.compile_cache": "/fsx/jobgen"}, "{f}: paths.compile_cache: '/fsx/jobgen' holds the "
                                             "run folders (paths.work_dir '/fsx/jobgen/runs'): "
                                             "give the cache a folder of its own"),
    ({"paths.work_dir": "."}, "{f}: paths.work_dir: '.' is the root, the home folder or the "
                              "submission folder itself: give a folder of its own"),
    ({"slurm.cpus_per_task": "all"}, "{f}: slurm.cpus_per_task: expected an integer, got 'all'"),
    ({"slurm.master_resolver": "dig"},
     "{f}: slurm.master_resolver: expected one of nslookup, getent, got 'dig'"),
    ({"paths.work_dir": 3}, "{f}: paths.work_dir: expected a string, got 3"),
    ({"paths": {"work_dir": "w"}}, "{f}: paths.data_dir: required key is missing"),
    ({"paths.local_compile_cache": "local/cache"},
     "{f}: paths.local_compile_cache: 'local/cache' must be an absolute path on each node's "
     "local disk"),
])
def test_bad_sites(write_site: Callable, changes: dict[str, Any], message: str) -> None:
    path = write_site("trn1-pcluster", changes)
    with pytest.raises(ConfigError) as info:
        sites.load(str(path))
    assert str(info.value) == message.replace("{f}", str(path))
