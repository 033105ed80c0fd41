"""The ports a job opens beside job.master_port are declared once (jobgen/inputs/limits.py:
DERIVED_PORTS), and the master port's domain leaves room for each: every `MASTER_PORT + N` the
node-side scripts and jobgen's own code compute is found here and must be declared."""
from __future__ import annotations

import re
from pathlib import Path

from jobgen.inputs import limits
from jobgen.inputs.recipe import load

ROOT = Path(__file__).resolve().parent.parent
# $((MASTER_PORT + 1)), MASTER_PORT+1, master_port + 1, int(os.environ["MASTER_PORT"]) + 1
OFFSET = re.compile(r"master_port\W{0,4}\s*\+\s*(\d+)", re.IGNORECASE)


def offsets() -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for folder in ("payload", "env/containers", "templates", "jobgen"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".sh", ".py", ".j2") or "__pycache__" in path.parts:
                continue
            for line in path.read_text(encoding="utf-8").splitlines():
                code = line.split("#", 1)[0] if path.suffix == ".sh" else line
                for match in OFFSET.finditer(code):
                    found.setdefault(int(match.group(1)), []).append(
                        str(path.relative_to(ROOT)))
    return found


def test_every_port_beside_the_master_port_is_declared() -> None:
    found = offsets()
    assert 1 in found and "env/containers/entrypoint.sh" in found[1]   # the Batch node watch
    assert set(found) <= set(limits.DERIVED_PORTS), found
    assert limits.MASTER_PORT_MAX + max(limits.DERIVED_PORTS) == limits.PORT_MAX == 65535


def test_the_domain_is_the_schema_and_the_loader() -> None:
    rule = limits.RECIPE_LIMITS["job.master_port"]
    assert (rule["minimum"], rule["maximum"]) == (1024, limits.MASTER_PORT_MAX)
    recipe, _ = load("neox20b")
    assert limits.PORT_MIN <= recipe.job.master_port <= limits.MASTER_PORT_MAX
