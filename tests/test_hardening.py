"""The hardening corpus (tests/hardening/*.yaml, described in its README.md): each case runs the
real `jobgen` command in a fresh folder and is held to its own expectation and to the README's
promise for bad input: one `error:` line, the right exit status, no traceback, nothing on stdout
after an error, nothing half-written, no hang."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

HERE = Path(__file__).resolve().parent / "hardening"
ROOT = HERE.parent.parent
MAIN = "import sys; from jobgen.cli import main; sys.exit(main())"
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")   # raw control characters, line breaks aside


def load_cases() -> list[Any]:
    cases = []
    for corpus in sorted(HERE.glob("*.yaml")):
        for case in yaml.safe_load(corpus.read_text(encoding="utf-8")):
            cases.append(pytest.param(case, id=f"{corpus.stem}:{case['id']}"))
    return cases


CASES = load_cases()


def set_key(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        data = data.setdefault(key, {})
    if value is None:
        data.pop(last, None)
    else:
        data[last] = value


def recipe_text(name: str) -> str:
    """A shipped recipe's text, for generated files that change one line of it."""
    return (ROOT / "recipes" / f"{name}.yaml").read_text(encoding="utf-8")


def site_text(name: str) -> str:
    """A shipped site's text, for generated files that change one line of it."""
    return (ROOT / "env" / "sites" / f"{name}.yaml").read_text(encoding="utf-8")


GENERATORS = {"recipe_text": recipe_text, "site_text": site_text}


def prepare(case: dict[str, Any], tmp: Path) -> None:
    for name, content in (case.get("files") or {}).items():
        if isinstance(content, dict):
            content = eval(content["python"], dict(GENERATORS))   # test input, from this repo
        target = tmp / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8", errors="surrogateescape")
    for name, target in (case.get("links") or {}).items():
        (tmp / name).symlink_to(target)
    if "site" in case:
        site = yaml.safe_load((ROOT / "env" / "sites" / "local.yaml").read_text())
        for key, value in case["site"].items():
            set_key(site, key, value)
        (tmp / "site.yaml").write_text(yaml.safe_dump(site), encoding="utf-8")
    if "recipe" in case:
        base = case["recipe"]["from"]
        recipe = yaml.safe_load((ROOT / "recipes" / f"{base}.yaml").read_text())
        for key, value in case["recipe"].get("changes", {}).items():
            set_key(recipe, key, value)
        (tmp / "recipe.yaml").write_text(yaml.safe_dump(recipe), encoding="utf-8")


def run(case: dict[str, Any], tmp: Path) -> subprocess.CompletedProcess[str]:
    argv = [eval(a["python"], dict(GENERATORS)) if isinstance(a, dict)
            else a.replace("{tmp}", str(tmp)) for a in case["argv"]]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "JOBGEN_"))}
    env.update({"AWS_CONFIG_FILE": str(tmp / "no-aws-config"),
                "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "no-aws-credentials"),
                "PYTHONPATH": str(ROOT)})
    env.update({k: str(v).replace("{tmp}", str(tmp)) for k, v in (case.get("env") or {}).items()})
    how = case.get("stdout_to")
    if how == "full":
        stdout: Any = open("/dev/full", "w")
    elif how == "closed":
        stdout = None
    else:
        stdout = subprocess.PIPE
    try:
        proc = subprocess.run(
            [sys.executable, "-c", MAIN, *argv], cwd=tmp, env=env, stdout=stdout,
            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=60, check=False,
            # fd 1 closed in the child: what `jobgen ... >&-` does
            preexec_fn=(lambda: os.close(1)) if how == "closed" else None)
    finally:
        if how == "full":
            stdout.close()
    out = proc.stdout.decode("utf-8", "replace") if proc.stdout else ""
    err = proc.stderr.decode("utf-8", "replace")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _snapshot(cwd: Path) -> set[Path]:
    """The paths of the payload snapshot a successful render placed under the local site's
    run folder, once checked whole: that is its output, not something left behind."""
    from jobgen.images import snapshot
    root = cwd / "jobgen-runs" / ".jobgen" / "payload"
    if not root.exists():
        return set()
    folder = Path(snapshot.folder(str(root), snapshot.digest()))
    assert (folder / snapshot.MARKER).read_text().strip() == snapshot.digest()
    assert snapshot.digest(folder) == snapshot.digest()
    return {cwd / "jobgen-runs", cwd / "jobgen-runs" / ".jobgen", root, *root.rglob("*")}


@pytest.mark.parametrize("case", CASES)
def test_case(case: dict[str, Any], tmp_path: Path) -> None:
    tmp = tmp_path / "cwd"
    tmp.mkdir()
    prepare(case, tmp)
    before = set(tmp.rglob("*"))
    proc = run(case, tmp)
    where = f"{case['id']}: rc={proc.returncode} stderr={proc.stderr[:500]!r}"
    assert "Traceback" not in proc.stderr, where
    assert proc.returncode == case["rc"], where
    if "error" in case:
        assert proc.stderr.endswith("\n") and proc.stderr.count("\n") == 1, where
        assert proc.stderr.startswith("error: "), where
        assert re.fullmatch(case["error"], proc.stderr[len("error: "):-1]), where
        assert len(proc.stderr) < 2000, where   # values are described, not dumped
    if "errors" in case:   # one line per problem (the preflight names every path)
        lines = proc.stderr.splitlines()
        assert len(lines) == len(case["errors"]) and proc.stderr.endswith("\n"), where
        for line, pattern in zip(lines, case["errors"]):
            assert line.startswith("error: ") and len(line) < 2000, where
            assert re.fullmatch(pattern, line[len("error: "):]), f"{where}: {line!r}"
    if proc.returncode != 0:
        assert proc.stdout == "", f"{where} stdout={proc.stdout[:200]!r}"
    if "stdout" in case:
        assert re.search(case["stdout"], proc.stdout, re.M), f"{where} {proc.stdout[:300]!r}"
    assert not CONTROL.search(proc.stderr), f"{where}: a raw control character reached stderr"
    for secret in case.get("lacks") or ():
        assert secret not in proc.stderr + proc.stdout, where
    after = set(tmp.rglob("*"))
    if proc.returncode == 0:   # a rendered job's payload snapshot, whole
                               # (jobgen/images/snapshot.py)
        after -= _snapshot(tmp)
    made = sorted(str(p.relative_to(tmp)) for p in after - before)
    assert made == sorted(case.get("writes") or []), f"{where}: left behind {made}"


def test_the_corpus_covers_the_issue() -> None:
    """Every case says why it is there, and ids are unique within the corpus."""
    ids = [c.values[0]["id"] for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 60
    assert all(c.values[0].get("why") for c in CASES)
