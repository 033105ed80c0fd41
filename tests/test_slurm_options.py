"""The table of Slurm options jobgen owns (jobgen/backends/slurm/options.py) is the only place an
option is declared: the docs' list is the table's, and an option added to the table alone (in a
copy of jobgen) is a flag, a site key, a check, a `show` value, an #SBATCH line and a docs row."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobgen.backends.slurm import options

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "slurm.md"
LIST = re.compile(r"(<!-- owned-options: [^\n]*-->\n)(.*?)(<!-- /owned-options -->)", re.S)


def test_the_docs_list_is_the_table(request: pytest.FixtureRequest) -> None:
    text = PAGE.read_text(encoding="utf-8")
    found = LIST.search(text)
    assert found is not None, "docs/slurm.md has no owned-options list"
    if request.config.getoption("--update-golden"):
        PAGE.write_text(text[:found.start(2)] + options.markdown() + text[found.end(2):],
                        encoding="utf-8")
        return
    assert found.group(2) == options.markdown(), \
        "regenerate: pytest tests/test_slurm_options.py --update-golden"
    assert [f"`--{o.flag}`" for o in options.OPTIONS] == \
        re.findall(r"^\| (`--[a-z-]+`) ", found.group(2), re.M)


ROW = '''    Owned("wckey", "wckey", NAME, "NAME",
          "Slurm: the workload characterization key (default: the site's slurm.wckey).",
          "wckey", site_help="sacct's workload characterization key for every job"),
)
FLAGS = '''


@pytest.fixture(scope="module")
def added(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of jobgen whose table has one more option (wckey); nothing else is edited."""
    copy = tmp_path_factory.mktemp("jobgen-copy")
    for folder in ("jobgen", "templates", "env", "recipes", "payload"):
        shutil.copytree(ROOT / folder, copy / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    table = copy / "jobgen" / "backends" / "slurm" / "options.py"
    text = table.read_text(encoding="utf-8")
    assert text.count(")\nFLAGS = ") == 1
    table.write_text(text.replace(")\nFLAGS = ", ROW, 1), encoding="utf-8")
    return copy


def _jobgen(copy: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The copy's jobgen, as a user runs it, with the copy first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBGEN_")}
    env.update(PYTHONPATH=str(copy), XDG_CONFIG_HOME=str(copy / "config"),
               XDG_STATE_HOME=str(copy / "state"))
    return subprocess.run([sys.executable, "-m", "jobgen.cli", *args], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_an_option_added_to_the_table_is_rendered_validated_and_documented(added: Path) -> None:
    # Its flag (the copy is what runs, not this checkout's jobgen), and its #SBATCH line among
    # jobgen's own, before --output.
    assert "--wckey NAME" in _jobgen(added, "render", "--help").stdout
    script = _jobgen(added, "render", "pythia6.9b", "--nodes", "2", "--wckey", "proj-7")
    assert script.returncode == 0, script.stderr
    lines = [line for line in script.stdout.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --wckey=proj-7" in lines
    assert lines.index("#SBATCH --wckey=proj-7") < lines.index("#SBATCH --output=%x-%j.out")
    # Checked as its kind says, in one line, exit 2, nothing printed on stdout.
    bad = _jobgen(added, "render", "pythia6.9b", "--nodes", "2", "--wckey", "a;b")
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr.strip().splitlines()[-1].endswith(
        "--wckey: 'a;b' is not a name matching ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    assert "Traceback" not in bad.stderr
    # Its site key: the default, checked on load, in the site schema with its description.
    site = added / "wckey-site.yaml"
    site.write_text((added / "env" / "sites" / "local.yaml").read_text(encoding="utf-8")
                    .replace("slurm:\n", "slurm:\n  wckey: nightly\n", 1), encoding="utf-8")
    shown = _jobgen(added, "show", "pythia6.9b", "--nodes", "2", "--site", str(site), "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["slurm"]["wckey"] == "nightly"
    site.write_text(site.read_text(encoding="utf-8").replace("nightly", "'x y'"),
                    encoding="utf-8")
    bad_site = _jobgen(added, "show", "pythia6.9b", "--site", str(site))
    assert bad_site.returncode == 2 and "slurm.wckey: 'x y' is not a name matching" in \
        bad_site.stderr
    schema = json.loads(_jobgen(added, "schema", "site").stdout)
    key = schema["properties"]["slurm"]["properties"]["wckey"]
    assert key["description"] == "sacct's workload characterization key for every job"
    # jobgen owns it now: passing it through is refused, naming the flag.
    through = _jobgen(added, "render", "pythia6.9b", "--sbatch-opt", "wckey=x")
    assert through.returncode == 2 and "--wckey is set by --wckey" in through.stderr
    # The docs' list has its row.
    docs = subprocess.run([sys.executable, "-c", "from jobgen.backends.slurm import options; "
                           "print(options.markdown(), end='')"], cwd=added, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(added)}, check=True)
    assert "| `--wckey` | NAME | `slurm.wckey` | the workload characterization key" in docs.stdout
