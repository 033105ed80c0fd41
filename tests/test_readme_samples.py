"""The documentation cannot drift from the commands (issues 41 and 42). Its pages: README.md and
every docs/*.md, the site mkdocs.yml builds.

- The site builds with `mkdocs build --strict` (a broken link or anchor, a page missing from the
  nav is an error), into a temporary folder.
- A sample marked `<!-- sample: MODE: jobgen ARGS -->` is the indented block that follows it:
  `output` is the command's whole standard output, line for line; `closing` is the last line of
  `jobgen run ARGS`, its nodes not started (a rehearsal takes minutes); `error` is its standard
  error, exit status 2 (bad input).
- Every other `jobgen ...` command line of a page's code blocks is parsed by the real command
  line (the command exists and takes every option written there), and then RUN: a page's
  commands one after another, as a reader types them, in a fresh folder with a private state
  folder. Each must
  exit 0, or 2 where the block shows `# error:` right under it. `> FILE` writes FILE there (the
  next command may read it); the other side of a pipe is not run (sbatch, aws). `jobgen run`
  runs with its nodes not started, as in `closing`. Files a page calls the reader's own
  (`./my-recipe.yaml`, `./my-site.yaml`) are copies of a shipped recipe and site.
- Commands that need a service or a run that exists are checked as far as the parse only, and
  `_why_not_run` says which and why: `submit` and `resubmit` (they queue a job on Slurm, AWS
  Batch, SageMaker or EKS; `--dry-run` runs), `status`, `logs` and `cancel` (they ask a
  scheduler), `watch` and `report` (a running or finished run), `runs NAME` and
  `plan --from-run` (a recorded run), `check --test-only` (the Slurm controller). The Slurm and
  moto tiers run those commands for real (tests/test_slurm_e2e.py, tests/test_moto_*.py, ...).
- Every file a page names (`jobgen/payloads/node.py`, tests/test_slurm_e2e.py) is there, and a
  `python -c '...'` it shows runs.
- The install steps use a venv or pipx (a system `pip install` is refused on Debian's and
  Ubuntu's own Python).

`pytest tests/test_readme_samples.py --update-golden` rewrites a marked sample that differs.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
MARKER = re.compile(r"^<!-- sample: (?P<mode>[a-z]+): (?P<command>jobgen .*?) -->$")


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _lines(page: Path) -> list[str]:
    return page.read_text(encoding="utf-8").splitlines()


def _block_after(lines: list[str], index: int) -> list[str]:
    """The indented block after line `index` (blank lines before it skipped), dedented."""
    block: list[str] = []
    for line in lines[index + 1:]:
        if line.startswith("    "):
            block.append(line[4:].rstrip())
        elif line.strip():
            break
        elif block:
            block.append("")
    while block and not block[-1]:
        block.pop()
    return block


def _samples() -> list[tuple[Path, int, str, str, list[str]]]:
    found = []
    for page in PAGES:
        lines = _lines(page)
        for index, line in enumerate(lines):
            m = MARKER.match(line)
            if m:
                found.append((page, index + 1, m["mode"], m["command"],
                              _block_after(lines, index)))
    return found


SAMPLES = _samples()


def test_the_pages_mark_their_samples() -> None:
    assert {mode for *_, mode, _, _ in SAMPLES} == {"output", "closing", "error"}
    assert all(block for *_, block in SAMPLES)
    commands = " ".join(command for *_, command, _ in SAMPLES)
    assert "jobgen plan" in commands and "jobgen check" in commands
    for page in (README, DOCS / "recipes.md"):   # the recipes as found, never a list by hand
        assert "jobgen list" in {command for shown, *_, command, _ in SAMPLES if shown == page}


@pytest.mark.golden   # rewritten with the golden files (docs/extending.md)
@pytest.mark.parametrize("page,line,mode,command,block", SAMPLES,
                         ids=[f"{_name(p)}:{n}" for p, n, *_ in SAMPLES])
def test_a_sample_is_what_the_command_prints(
        page: Path, line: int, mode: str, command: str, block: list[str], jobgen: Callable,
        jobgen_proc: Callable, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    _fresh_folder(monkeypatch, tmp_path)
    args = shlex.split(command)[1:]
    if mode == "closing":
        started = _nodes_not_started(monkeypatch)
        result = jobgen(*args)
        assert started and result.exit_code == 0, result.output
        printed = result.stdout.splitlines()[-1:]
    elif mode == "error":       # the console script: a usage error's line is main()'s
        proc = jobgen_proc(*args, cwd=tmp_path, env=dict(os.environ))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        printed = [text.rstrip() for text in proc.stderr.splitlines()]
    else:
        result = jobgen(*args)
        assert result.exit_code == 0, result.output
        printed = [text.rstrip() for text in result.stdout.splitlines()]
    if printed != block and request.config.getoption("--update-golden"):
        _rewrite_sample(page, f"<!-- sample: {mode}: {command} -->", printed)
        return
    assert printed == block, (
        f"{_name(page)} line {line}: the sample of `{command}` is not what it prints; "
        "rewrite it with pytest tests/test_readme_samples.py --update-golden")


def _fresh_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing a command writes lands in the checkout, and no setting of this user's counts."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("JOBGEN_SITE", raising=False)


def _nodes_not_started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """`jobgen run` does everything but start its nodes (their status: 0). Nothing listens on
    the recipe's master port then, so a port another test holds is not this one's concern (the
    EKS and SageMaker emulations refuse a taken port)."""
    from jobgen.backends.local import rehearsal
    from jobgen.backends.local import runner as local_runner
    started: list[Any] = []
    monkeypatch.setattr(rehearsal, "port_taken", lambda port: False)

    def run(spec: Any, **_: Any) -> int:
        started.append(spec)
        return 0
    monkeypatch.setattr(local_runner, "run", run)
    return started


def _rewrite_sample(page: Path, marker: str, printed: list[str]) -> None:
    """--update-golden: the block after `marker` becomes `printed`, nothing else changes (the
    page is read again just before, since others edit it too)."""
    lines = page.read_text(encoding="utf-8").split("\n")
    start = lines.index(marker) + 1
    while not lines[start].strip():
        start += 1
    end = start
    while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
        end += 1
    while not lines[end - 1].strip():
        end -= 1
    lines[start:end] = [f"    {text}".rstrip() for text in printed]
    page.write_text("\n".join(lines), encoding="utf-8")


# --- every command line the pages show -------------------------------------------------------

# What the pages write for "a value of yours": a job id, an optional flag.
PLACEHOLDERS = {"<job-id>": "1234", "[--follow]": "--follow", "RUN-NAME": "run-1",
                "SITE": "local"}
OPERATORS = {"|", ";", "&&", "||", ">", ">>", "<"}


@dataclass
class Command:
    line: int
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    into: Optional[str] = None        # `> FILE`
    fails: bool = False               # `# error:` shown right under it


def _code_blocks(page: Path) -> Iterator[list[tuple[int, str]]]:
    """Each code block of a page (indented, or fenced): its lines with their numbers. The block
    of a marked sample is output, not commands, and is left out."""
    lines = _lines(page)
    block: list[tuple[int, str]] = []
    fenced = sample = False
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            if not fenced and block:
                yield block
            block = []
            continue
        if fenced or line.startswith("    ") or (block and not line.strip()):
            if not sample:
                block.append((number, line[4:] if not fenced else line))
            continue
        if block and not sample:
            yield block
        block, sample = [], bool(MARKER.match(line)) or (sample and not line.strip())
    if block and not sample:
        yield block


def _commands(block: list[tuple[int, str]]) -> Iterator[Command]:
    """The `jobgen ...` commands of a block (continuation lines joined, comments cut off, a
    pipe's other side and redirections taken apart)."""
    index = 0
    while index < len(block):
        number, line = block[index]
        index += 1
        if not re.match(r"^ *(\w+=\S+ )*jobgen ", line):
            continue
        while line.endswith("\\") and index < len(block):
            line = line[:-1] + " " + block[index][1].strip()
            index += 1
        fails = index < len(block) and block[index][1].lstrip().startswith("# error:")
        for old, new in PLACEHOLDERS.items():
            line = line.replace(old, new)
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        segments: list[tuple[list[str], str]] = []
        words: list[str] = []
        for word in [*lexer, ";"]:
            if word in OPERATORS:
                segments.append((words, word))
                words = []
            else:
                words.append(word)
        for at, (words, operator) in enumerate(segments):
            env = {}
            while words and re.fullmatch(r"\w+=\S*", words[0]):
                name, _, value = words.pop(0).partition("=")
                env[name] = value
            if words and words[0] == "jobgen":
                into = (segments[at + 1][0][0] if operator in (">", ">>")
                        and segments[at + 1][0] else None)
                yield Command(number, words[1:], env, into, fails)


PAGE_COMMANDS = [(page, commands) for page in PAGES
                 if (commands := [c for block in _code_blocks(page) for c in _commands(block)])]
COMMANDS = [(page, command) for page, commands in PAGE_COMMANDS for command in commands]


def test_the_pages_show_every_command() -> None:
    """The list is not empty by accident, and names what a newcomer runs first."""
    shown = {c.args[0] for _, c in COMMANDS if c.args and not c.args[0].startswith("-")}
    assert {"list", "show", "render", "check", "plan", "run", "submit", "watch",
            "report", "runs", "status"} <= shown
    assert len(COMMANDS) >= 60
    assert {page for page, _ in COMMANDS} >= {README, DOCS / "commands.md"}


def _parse(args: list[str]) -> None:
    """The command exists and takes every option written (click.UsageError if not)."""
    from jobgen.cli import cli
    group: click.Group = cli
    parent = click.Context(cli, info_name="jobgen")
    try:
        if args[0].startswith("-"):       # `jobgen --version`
            cli.make_context("jobgen", list(args))
        while True:
            command = group.get_command(parent, args[0])
            if command is None:
                raise click.UsageError(f"no command {args[0]!r}")
            if not isinstance(command, click.Group):
                command.make_context(args[0], list(args[1:]), parent=parent)
                break
            parent = click.Context(command, info_name=args[0], parent=parent)
            group, args = command, args[1:]       # `jobgen batch validate ...`
    except click.exceptions.Exit:      # --version, --help
        pass


def _why_not_run(args: list[str]) -> Optional[str]:
    """Why a command is only parsed here (None: it runs)."""
    if "--help" in args or args[0].startswith("-"):
        return None
    words = args[1:] if args[0] == "batch" else args      # `jobgen batch submit` is an alias
    name, rest = words[0], words[1:]
    if name in ("submit", "resubmit") and "--dry-run" not in rest:
        return "it queues a job on Slurm, AWS Batch, SageMaker or EKS"
    if name in ("status", "logs", "cancel"):
        return "it asks a scheduler about a submitted job"
    if name in ("watch", "report"):
        return "it reads a running or finished run"
    if name == "runs" and [word for word in rest if not word.startswith("-")]:
        return "it shows a recorded run"
    if name == "plan" and "--from-run" in rest:
        return "it reads a finished run"
    if name == "check" and "--test-only" in rest:
        return "it asks the Slurm controller"
    if name == "run" and any(a == "--stage" and b in ("export", "eval")
                             for a, b in zip(rest, rest[1:])):
        return ("it exports (scores) a trained rehearsal's checkpoints (exports): "
                "tests/test_export_stage.py")
    return None


# The files a page calls the reader's own, made in the folder before its block runs.
READERS_FILES = {"my-recipe.yaml": ROOT / "recipes" / "neox20b.yaml",
                 "my-site.yaml": ROOT / "env" / "sites" / "local.yaml"}


@pytest.mark.parametrize("page,commands", PAGE_COMMANDS,
                         ids=[_name(p) for p, _ in PAGE_COMMANDS])
def test_the_commands_a_page_shows_run(
        page: Path, commands: list[Command], jobgen: Callable,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fresh_folder(monkeypatch, tmp_path)
    for name, source in READERS_FILES.items():
        shutil.copyfile(source, tmp_path / name)
    _nodes_not_started(monkeypatch)
    for command in commands:
        where = f"{_name(page)} line {command.line}: `jobgen {shlex.join(command.args)}`"
        try:
            _parse(command.args)
        except click.UsageError as exc:
            pytest.fail(f"{where}: {exc.format_message()}")
        if _why_not_run(command.args):
            continue
        with monkeypatch.context() as env:
            for key, value in command.env.items():
                env.setenv(key, value)
            result = jobgen(*command.args)
        want = 2 if command.fails else 0
        assert result.exit_code == want, f"{where}: exit {result.exit_code}\n{result.output}"
        if command.into:
            (tmp_path / command.into).write_text(result.stdout, encoding="utf-8")


# --- the site --------------------------------------------------------------------------------

def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    # Never --quiet: mkdocs 1.6 then counts no warning, and --strict passes whatever is broken.
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site)],
        capture_output=True, text=True, timeout=120, check=False,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))


def test_the_docs_build_strictly(tmp_path: Path, require: Any) -> None:
    """`mkdocs build --strict`: every page in the nav, every link and anchor found; and the same
    build of a copy with one broken link fails, naming it."""
    require.modules("mkdocs", "material")
    proc = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    built = {p.parent.name for p in (tmp_path / "site").glob("*/index.html")}
    assert (tmp_path / "site" / "index.html").is_file()
    assert built >= {page.stem for page in DOCS.glob("*.md") if page.stem != "index"}
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copyfile(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with open(tmp_path / "docs" / "setup.md", "a", encoding="utf-8") as page:
        page.write("\nSee [the page](commands.md#no-such-heading).\n")
    broken = _build(tmp_path / "mkdocs.yml", tmp_path / "broken")
    assert broken.returncode != 0 and "no-such-heading" in broken.stderr, broken.stderr


# --- the files the pages name -----------------------------------------------------------------

# A path into the checkout: `jobgen/payloads/node.py`, tests/test_slurm_e2e.py, env/sites/*.yaml;
# one with a placeholder (<payload>, NAME, RUN, JOB, {...}) stands for many and is not looked for.
PATH = re.compile(r"(?:(?<=^)|(?<=[\s(`'\"]))((?:jobgen|payload|tests|benchmarks|env|recipes|"
                  r"templates|docs)/[\w./*<>{}-]*[\w/*>}])")


def test_every_file_the_pages_name_is_there() -> None:
    """A module, script or test the docs point at exists (a moved one is a page to update). The
    changelog names old paths on purpose."""
    missing = []
    for page in PAGES:
        if page.name == "changelog.md":
            continue
        for number, line in enumerate(_lines(page), 1):
            for path in PATH.findall(line):
                if re.search(r"[<>{}]|NAME|RUN|JOB", path):
                    continue
                if not (any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
                    missing.append(f"{_name(page)} line {number}: {path}")
    assert missing == []
    assert len([1 for page in PAGES for line in _lines(page) if PATH.search(line)]) >= 50


def test_a_python_line_the_pages_show_runs(tmp_path: Path) -> None:
    """`python -c '...'` in a page (the node contract's documentation) runs, exit 0."""
    snippets = [(page, code) for page in PAGES for line in _lines(page)
                for code in re.findall(r"`python3? -c '([^']+)'`", line)]
    assert snippets
    for page, code in snippets:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=tmp_path, timeout=60, check=False,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert proc.returncode == 0 and proc.stdout, f"{_name(page)}: {code}\n{proc.stderr}"


# --- the landing page and install steps -----------------------------------------------------

def test_the_readme_is_a_landing_page() -> None:
    """At most about 200 lines (issue 42), and a link to every page of the site."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", text))
    assert linked >= {page.name for page in DOCS.glob("*.md") if page.name != "index.md"}


def test_install_steps_use_a_venv_or_pipx() -> None:
    code = [text.strip() for page in PAGES for block in _code_blocks(page)
            for _, text in block]
    system_pip = [line for line in code
                  if re.match(r"^(python3? -m pip|pip3?) install", line)]
    assert system_pip == [], "a system pip install fails on an externally-managed Python"
    assert any(line.startswith("python3 -m venv .venv && .venv/bin/pip install build")
               for line in code)
    readme = _lines(README)
    assert ("    python3 -m venv .venv && .venv/bin/pip install -e . && "
            ".venv/bin/jobgen render neox20b --nodes 4") in readme
    assert "    bash tests/ci/run.sh" in readme and "    bash tests/ci/run.sh --fast" in readme
