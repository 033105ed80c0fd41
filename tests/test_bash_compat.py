"""Every script that runs on the nodes works on bash 4.2 (Amazon Linux 2 ParallelCluster AMIs):
the sbatch script, the payload launchers and the Batch entrypoint.

Two checks. Statically, no construct newer than bash 4.2 appears, and every "${array[@]}"
expansion is written ${array[@]+"${array[@]}"} (before bash 4.4, an empty array under `set -u`
is an "unbound variable" error). At run time, the job-script tests of test_hostile.py run under
any bash given as JOBGEN_TEST_BASH (conftest.stub_bin links it first on PATH), so
`JOBGEN_TEST_BASH=/path/to/bash-4.2 pytest tests/test_hostile.py tests/test_bash_compat.py` runs
the whole job under that bash.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from jobgen import api
from jobgen.inputs import recipe as recipes

ROOT = Path(__file__).resolve().parent.parent

# Bash features newer than 4.2, with the version that brought them.
NEWER = {
    r"\bmapfile\s+-d\b|\breadarray\s+-d\b": "mapfile/readarray -d (4.4)",
    r"\$\{[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?@[QEPAaUuLK]\}": "${var@op} (4.4)",
    r"\bwait\s+-n\b": "wait -n (4.3)",
    r"\b(local|declare|typeset)\s+-n\b": "namerefs (4.3)",
    r"\$\{?EPOCH(REAL)?TIME|\$\{?EPOCHSECONDS": "$EPOCHREALTIME/$EPOCHSECONDS (5.0)",
    r"\bBASH_ARGV0\b": "BASH_ARGV0 (5.0)",
}
UNGUARDED = re.compile(r'(?<![@\]]\+)"\$\{([A-Za-z_][A-Za-z0-9_]*)\[@\]\}"')


def node_scripts() -> list[tuple[str, str]]:
    """(name, text) of every script that runs on a node, rendered ones included."""
    found = [(str(p.relative_to(ROOT)), p.read_text())
             for p in sorted([*ROOT.glob("payload/**/*.sh"),
                              ROOT / "env" / "containers" / "entrypoint.sh"])]
    for name in recipes.recipe_names():
        for smoke in (False, True):
            trn1 = recipes.load(name)[0].platform == "trn1.32xlarge"
            spec = api.job_spec(name, 2 if smoke else None, site="trn1-pcluster"
                                if trn1 and not smoke else "local", smoke=smoke)
            found.append((f"rendered {name}{' --smoke' if smoke else ''}", api.plan(spec).text))
    return found


def code_lines(text: str) -> list[tuple[int, str]]:
    return [(n, line) for n, line in enumerate(text.splitlines(), 1)
            if not line.lstrip().startswith("#")]


@pytest.mark.parametrize("name,text", node_scripts(), ids=lambda v: v[:40])
def test_no_feature_newer_than_bash_4_2(name: str, text: str) -> None:
    problems = [f"line {n}: {what}: {line.strip()}" for n, line in code_lines(text)
                for pattern, what in NEWER.items() if re.search(pattern, line)]
    assert problems == [], f"{name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("name,text", node_scripts(), ids=lambda v: v[:40])
def test_array_expansions_survive_an_empty_array_on_bash_4_2(name: str, text: str) -> None:
    problems = [f"line {n}: {line.strip()}" for n, line in code_lines(text)
                if UNGUARDED.search(line)]
    assert problems == [], (f"{name}: write ${{a[@]+\"${{a[@]}}\"}} instead of \"${{a[@]}}\":\n"
                            + "\n".join(problems))


def test_the_static_rule_catches_what_bash_4_2_refuses() -> None:
    """The pattern above flags exactly the form that fails, and not the guarded one."""
    assert UNGUARDED.search('run "${args[@]}"')
    assert not UNGUARDED.search('run ${args[@]+"${args[@]}"}')
    assert not UNGUARDED.search('run "$@"')


def test_guarded_expansion_behaves_like_the_plain_one() -> None:
    """Under the bash running the tests (JOBGEN_TEST_BASH when set): the guarded form expands an
    empty array to no word and a full one to its items, spaces and all, under `set -u`."""
    bash = os.environ.get("JOBGEN_TEST_BASH", "bash")
    script = ('set -u; e=(); f=("a b" "" c); '
              'for x in ${e[@]+"${e[@]}"}; do echo "e:$x"; done; '
              'for x in ${f[@]+"${f[@]}"}; do echo "f:[$x]"; done')
    proc = subprocess.run([bash, "-c", script], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["f:[a b]", "f:[]", "f:[c]"]
