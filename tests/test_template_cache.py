"""The compiled-template cache (~/.cache/jobgen/templates, or under XDG_CACHE_HOME) holds code
that a render executes; the rendered-script cache (rendered/) holds what a render prints. A
corrupt entry must never break rendering, and an entry someone else could have written must
never run. Each test renders in a fresh process (the Jinja environment
is built once per process), and compares with a render that used no cache at all."""
from __future__ import annotations

import hashlib
import marshal
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

RENDER = "from jobgen import api; print(api.plan(api.job_spec('neox20b', 4)).text, end='')"
SHA = 32   # jobgen's digest in front of each entry


def render(cache_home: Path, keep_rendered: bool = False,
           **env_vars: str) -> subprocess.CompletedProcess[str]:
    """Render in a fresh process. The rendered-script cache is emptied first unless asked to
    keep it (a script rendered before would otherwise be read back without Jinja at all)."""
    if not keep_rendered:
        shutil.rmtree(cache_home / "jobgen" / "rendered", ignore_errors=True)
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_home), **env_vars)
    return subprocess.run([sys.executable, "-c", RENDER], capture_output=True, text=True,
                          env=env, timeout=120, check=False)


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The script rendered with an empty cache (compiled from the templates)."""
    proc = render(tmp_path_factory.mktemp("fresh"))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def entries(cache_home: Path) -> list[Path]:
    return sorted((cache_home / "jobgen" / "templates").glob("__jinja2_*.cache"))


def filled(tmp_path: Path) -> Path:
    """A cache home whose cache holds this checkout's compiled templates."""
    home = tmp_path / "cache"
    assert render(home).returncode == 0
    assert entries(home), "the render wrote no cache entries"
    return home


def planted(entry: Path, marker: Path) -> bytes:
    """An entry in Jinja's own format, digest included, whose code writes `marker` when loaded:
    what an attacker with write access to the folder would put there."""
    import jinja2.bccache
    data = entry.read_bytes()[SHA:]
    magic = jinja2.bccache.bc_magic
    assert data.startswith(magic)
    checksum = pickle.loads(data[len(magic):])   # pickle stops at its own end
    code = compile(f"open({str(marker)!r}, 'w').write('ran')", "<planted>", "exec")
    payload = magic + pickle.dumps(checksum, 2) + marshal.dumps(code)
    return hashlib.sha256(payload).digest() + payload


def test_cached_render_is_identical_and_entries_are_private(tmp_path: Path,
                                                            expected: str) -> None:
    home = filled(tmp_path)
    proc = render(home)
    assert proc.returncode == 0 and proc.stdout == expected
    folder = home / "jobgen" / "templates"
    assert folder.stat().st_mode & 0o077 == 0
    for entry in entries(home):
        assert entry.stat().st_mode & 0o077 == 0, entry


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "flipped byte",
                                    "valid digest, unreadable code", "a folder"])
def test_a_corrupt_entry_is_compiled_again(tmp_path: Path, expected: str, damage: str) -> None:
    home = filled(tmp_path)
    for entry in entries(home):
        data = entry.read_bytes()
        if damage == "garbage":
            entry.write_bytes(os.urandom(len(data)))
        elif damage == "truncated":
            entry.write_bytes(data[:len(data) // 2])
        elif damage == "empty":
            entry.write_bytes(b"")
        elif damage == "flipped byte":
            entry.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
        elif damage == "valid digest, unreadable code":
            payload = data[SHA:-40] + b"\x00" * 40
            entry.write_bytes(hashlib.sha256(payload).digest() + payload)
        else:
            entry.unlink()
            entry.mkdir()
    proc = render(home)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected and proc.stderr == ""
    if damage != "a folder":   # rewritten whole: the next render uses the cache again
        assert all(e.read_bytes() != b"" for e in entries(home))


def test_a_planted_entry_runs_only_from_this_users_private_folder(tmp_path: Path) -> None:
    """The control: the planted entry does run when it sits, owned by this user, in this user's
    private folder (so the tests below would see it run if the checks were missing)."""
    home = filled(tmp_path)
    marker = tmp_path / "ran"
    for entry in entries(home):
        entry.write_bytes(planted(entry, marker))
        entry.chmod(0o600)
    render(home)
    assert marker.exists()


def test_a_folder_others_can_write_is_not_used(tmp_path: Path, expected: str) -> None:
    home = filled(tmp_path)
    marker = tmp_path / "ran"
    folder = home / "jobgen" / "templates"
    for entry in entries(home):
        entry.write_bytes(planted(entry, marker))
    folder.chmod(0o777)
    proc = render(home)
    assert proc.returncode == 0 and proc.stdout == expected
    assert not marker.exists(), "code from a world-writable cache folder ran"


def test_an_entry_others_can_write_is_not_used(tmp_path: Path, expected: str) -> None:
    home = filled(tmp_path)
    marker = tmp_path / "ran"
    for entry in entries(home):
        entry.write_bytes(planted(entry, marker))
        entry.chmod(0o666)
    proc = render(home)
    assert proc.returncode == 0 and proc.stdout == expected
    assert not marker.exists(), "code from a world-writable cache entry ran"


@pytest.mark.skipif(os.getuid() != 0, reason="giving files to another user needs root")
@pytest.mark.parametrize("owned", ["folder", "entry"])
def test_what_another_user_owns_is_not_used(tmp_path: Path, expected: str, owned: str) -> None:
    home = filled(tmp_path)
    marker = tmp_path / "ran"
    folder = home / "jobgen" / "templates"
    for entry in entries(home):
        entry.write_bytes(planted(entry, marker))
        entry.chmod(0o600)
        if owned == "entry":
            os.chown(entry, 65534, 65534)
    if owned == "folder":
        os.chown(folder, 65534, 65534)
    proc = render(home)
    assert proc.returncode == 0 and proc.stdout == expected
    assert not marker.exists(), f"code from a cache {owned} owned by another user ran"


def test_a_cache_folder_that_is_a_file_or_a_link_is_not_used(tmp_path: Path,
                                                             expected: str) -> None:
    home = tmp_path / "cache"
    (home / "jobgen").mkdir(parents=True)
    (home / "jobgen" / "templates").write_text("not a folder")
    proc = render(home)
    assert proc.returncode == 0 and proc.stdout == expected
    other = filled(tmp_path / "other")
    (home / "jobgen" / "templates").unlink()
    (home / "jobgen" / "templates").symlink_to(other / "jobgen" / "templates")
    marker = tmp_path / "ran"
    for entry in entries(other):
        entry.write_bytes(planted(entry, marker))
    proc = render(home)
    assert proc.returncode == 0 and proc.stdout == expected
    assert not marker.exists(), "code from a cache reached through a symbolic link ran"


# --- parsed recipe/site files and botocore's verdicts share the same checked cache -------------

def test_parsed_file_cache_is_exact_and_checked(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from jobgen.inputs import yamlfile
    from jobgen.plumbing import cache
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cache.folder.cache_clear()
    path = tmp_path / "r.yaml"
    path.write_text("a: 041000\nb: [1, 2.5, null, yes]\n")
    first = yamlfile.load_yaml(path, "r.yaml")
    assert first == {"a": 41000, "b": [1, 2.5, None, "yes"]}
    entries = list((tmp_path / "cache" / "jobgen" / "parsed").iterdir())
    assert len(entries) == 1
    assert yamlfile.load_yaml(path, "r.yaml") == first          # read back from the entry
    entries[0].write_bytes(b"x" * 32 + b'{"a": "planted"}')    # a checksum that does not match
    assert yamlfile.load_yaml(path, "r.yaml") == first
    path.write_text("a: 1\n")                                 # an edited file is parsed again
    assert yamlfile.load_yaml(path, "r.yaml") == {"a": 1}
    path.write_text("1: x\n")                                 # not JSON-exact: never cached
    before = set((tmp_path / "cache" / "jobgen" / "parsed").iterdir())
    assert yamlfile.load_yaml(path, "r.yaml") == {1: "x"}
    assert set((tmp_path / "cache" / "jobgen" / "parsed").iterdir()) == before
    cache.folder.cache_clear()


def test_botocore_verdict_is_remembered_only_for_what_it_accepted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobgen import api
    from jobgen.backends.batch import rules as batch_rules
    from jobgen.plumbing import cache
    from jobgen.plumbing.errors import ConfigError
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cache.folder.cache_clear()
    import json
    jd = json.loads(api.plan(api.job_spec("bert-large", 2, backend="batch")).text)
    folder = tmp_path / "cache" / "jobgen" / "accepted"
    assert [p.name for p in folder.iterdir()] != []   # the render above was accepted
    calls: list[int] = []
    monkeypatch.setattr(batch_rules, "botocore_errors", lambda jd: calls.append(1) or [])
    batch_rules.validate(jd, "x")
    assert calls == []                                # remembered
    bad = dict(jd, type="multinode", timeout={"attemptDurationSeconds": "soon"})
    monkeypatch.setattr(batch_rules, "botocore_errors", lambda jd: ["a bad timeout"])
    with pytest.raises(ConfigError, match="x: a bad timeout"):
        batch_rules.validate(bad, "x")                # another definition is checked again
    with pytest.raises(ConfigError, match="x: a bad timeout"):
        batch_rules.validate(bad, "x")                # and a refusal is never remembered
    cache.folder.cache_clear()


# --- rendered scripts (rendered/): a warm render reads the script back without Jinja ---------

WHICH = ("import sys; from jobgen import api; t = api.plan(api.job_spec('neox20b', 4)).text; "
         "print('jinja2' in sys.modules, len(t))")


def rendered(cache_home: Path) -> list[Path]:
    return sorted((cache_home / "jobgen" / "rendered").glob("*"))


def test_a_warm_render_reads_the_script_back_without_jinja(tmp_path: Path, expected: str) -> None:
    home = tmp_path / "cache"
    env = dict(os.environ, XDG_CACHE_HOME=str(home))
    first = subprocess.run([sys.executable, "-c", WHICH], capture_output=True, text=True,
                           env=env, check=True)
    second = subprocess.run([sys.executable, "-c", WHICH], capture_output=True, text=True,
                            env=env, check=True)
    assert first.stdout.split()[0] == "True" and second.stdout.split()[0] == "False"
    assert len(rendered(home)) == 1
    assert render(home, keep_rendered=True).stdout == expected
    assert rendered(home)[0].stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("damage", ["garbage", "empty", "flipped byte", "others can write",
                                    "a folder"])
def test_a_damaged_rendered_script_is_rendered_again(tmp_path: Path, expected: str,
                                                     damage: str) -> None:
    home = tmp_path / "cache"
    assert render(home, keep_rendered=True).returncode == 0
    (entry,) = rendered(home)
    data = entry.read_bytes()
    if damage == "garbage":
        entry.write_bytes(os.urandom(len(data)))
    elif damage == "empty":
        entry.write_bytes(b"")
    elif damage == "flipped byte":
        entry.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
    elif damage == "others can write":   # a well-formed entry with other content, mode 0666
        payload = b"#!/bin/bash\necho planted\n"
        entry.write_bytes(hashlib.sha256(payload).digest() + payload)
        entry.chmod(0o666)
    else:
        entry.unlink()
        entry.mkdir()
    proc = render(home, keep_rendered=True)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == expected


def test_an_edited_template_or_another_value_is_rendered_afresh(tmp_path: Path) -> None:
    """The key holds every template's text and every value: an edit shows at once."""
    ROOT = Path(__file__).resolve().parents[1]   # the project's checkout
    project = tmp_path / "project"
    for part in ("recipes", "templates", "payload", "env"):
        shutil.copytree(ROOT / part, project / part)
    home = tmp_path / "cache"
    before = render(home, keep_rendered=True, JOBGEN_HOME=str(project)).stdout
    assert before.startswith("#!/bin/bash") and len(rendered(home)) == 1
    template = project / "templates" / "slurm" / "job.sbatch.j2"
    template.write_text(template.read_text() + "# edited\n")
    edited = render(home, keep_rendered=True, JOBGEN_HOME=str(project)).stdout
    assert edited == before + "# edited\n"
    env = dict(os.environ, XDG_CACHE_HOME=str(home), JOBGEN_HOME=str(project))
    eight = subprocess.run([sys.executable, "-c", RENDER.replace(", 4)", ", 8)")],
                           capture_output=True, text=True, env=env, check=True).stdout
    assert "#SBATCH --nodes=8" in eight and len(rendered(home)) == 3


def test_cache_off_writes_nothing_and_renders_the_same(tmp_path: Path, expected: str) -> None:
    home = tmp_path / "cache"
    proc = render(home, JOBGEN_CACHE="off")
    assert proc.returncode == 0 and proc.stdout == expected
    assert not (home / "jobgen").exists()


def test_the_rendered_folder_stays_bounded(tmp_path: Path) -> None:
    from jobgen.plumbing import cache
    folder = tmp_path / "rendered"
    folder.mkdir()
    for i in range(20):
        path = folder / f"e{i:02d}"
        path.write_bytes(b"x")
        os.utime(path, ns=(i * 10**9, i * 10**9))
    cache.prune(str(folder), keep=10)
    left = sorted(p.name for p in folder.iterdir())
    assert left == [f"e{i:02d}" for i in range(15, 20)]   # the newest half of the bound
