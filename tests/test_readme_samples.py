"""The README's samples are what the commands print (issue 41).

- A sample marked `<!-- sample: MODE: jobgen ARGS -->` is the indented block that follows it:
  `output` is the command's whole standard output, line for line; `closing` is the last line of
  `jobgen run ARGS`, its nodes not started (a rehearsal takes minutes).
- Every other `jobgen ...` command line in the README's code blocks is parsed by the real
  command line: the command exists and takes every option written there (commands that need a
  cluster, an AWS account or a long run are checked this far only).
- The recipes table gives each recipe's parallelism as its file does; the install steps use a
  venv or pipx (a system `pip install` is refused on Debian's and Ubuntu's own Python).
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, Callable, Iterator

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = re.compile(r"^<!-- sample: (?P<mode>[a-z]+): (?P<command>jobgen .*?) -->$")


def _lines() -> list[str]:
    return README.read_text(encoding="utf-8").splitlines()


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


def _samples() -> list[tuple[int, str, str, list[str]]]:
    lines = _lines()
    found = []
    for index, line in enumerate(lines):
        m = MARKER.match(line)
        if m:
            found.append((index + 1, m["mode"], m["command"], _block_after(lines, index)))
    return found


SAMPLES = _samples()


def test_the_readme_marks_its_samples() -> None:
    assert {mode for _, mode, _, _ in SAMPLES} == {"output", "closing"}
    assert all(block for *_, block in SAMPLES)
    commands = " ".join(command for _, _, command, _ in SAMPLES)
    assert "jobgen plan" in commands and "jobgen check" in commands


@pytest.mark.parametrize("line,mode,command,block", SAMPLES,
                         ids=[f"README:{n}" for n, *_ in SAMPLES])
def test_a_sample_is_what_the_command_prints(
        line: int, mode: str, command: str, block: list[str], jobgen: Callable,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    monkeypatch.chdir(tmp_path)     # nothing a command writes lands in the checkout
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    args = shlex.split(command)[1:]
    if mode == "closing":
        from jobgen import local_runner
        started: list[Any] = []

        def run(spec: Any, **_: Any) -> int:      # the nodes' status, none started
            started.append(spec)
            return 0
        monkeypatch.setattr(local_runner, "run", run)
        result = jobgen(*args)
        assert started and result.exit_code == 0, result.output
        printed = result.stdout.splitlines()[-1:]
    else:
        result = jobgen(*args)
        assert result.exit_code == 0, result.output
        printed = [text.rstrip() for text in result.stdout.splitlines()]
    if printed != block and request.config.getoption("--update-golden"):
        _rewrite_sample(f"<!-- sample: {mode}: {command} -->", printed)
        return
    assert printed == block, (
        f"README.md line {line}: the sample of `{command}` is not what it prints; "
        "rewrite it with pytest tests/test_readme_samples.py --update-golden")


def _rewrite_sample(marker: str, printed: list[str]) -> None:
    """--update-golden: the block after `marker` becomes `printed`, nothing else changes (the
    README is read again just before, since others edit it too)."""
    lines = README.read_text(encoding="utf-8").split("\n")
    start = lines.index(marker) + 1
    while not lines[start].strip():
        start += 1
    end = start
    while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
        end += 1
    while not lines[end - 1].strip():
        end -= 1
    lines[start:end] = [f"    {text}".rstrip() for text in printed]
    README.write_text("\n".join(lines), encoding="utf-8")


# --- every command line the README shows ------------------------------------------------------

# What the README writes for "a value of yours": a job id, an optional flag.
PLACEHOLDERS = {"<job-id>": "1234", "[--follow]": "--follow", "RUN-NAME": "run-1",
                "SITE": "local"}
OPERATORS = {"|", ";", "&&", ">", ">>", "<"}


def _commands() -> Iterator[tuple[int, list[str]]]:
    """Each `jobgen ...` command of the README's indented code blocks (continuation lines
    joined, comments, pipes and redirections cut off), with its line number."""
    lines = _lines()
    index = 0
    while index < len(lines):
        line, number = lines[index], index + 1
        index += 1
        if not re.match(r"^ {4,}(\w+=\S+ )*jobgen ", line):
            continue
        while line.endswith("\\") and index < len(lines):
            line = line[:-1] + " " + lines[index].strip()
            index += 1
        for old, new in PLACEHOLDERS.items():
            line = line.replace(old, new)
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for word in [*lexer, ";"]:
            if word in OPERATORS:
                while words and re.fullmatch(r"\w+=\S*", words[0]):
                    words.pop(0)             # VAR=value before the command
                if words and words[0] == "jobgen":
                    yield number, words[1:]
                words = []
            elif words or word == "jobgen" or re.fullmatch(r"\w+=\S*", word):
                words.append(word)


COMMANDS = list(_commands())


def test_the_readme_shows_every_command() -> None:
    """The list is not empty by accident, and names what a newcomer runs first."""
    shown = {args[0] for _, args in COMMANDS if args and not args[0].startswith("-")}
    assert {"list", "show", "render", "check", "plan", "run", "submit", "watch",
            "report", "runs", "status"} <= shown
    assert len(COMMANDS) >= 60


@pytest.mark.parametrize("line,args", COMMANDS, ids=[f"README:{n}" for n, _ in COMMANDS])
def test_a_readme_command_is_one_the_command_line_takes(line: int, args: list[str]) -> None:
    from jobgen.cli import cli
    group: click.Group = cli
    parent = click.Context(cli, info_name="jobgen")
    try:
        if args[0].startswith("-"):       # `jobgen --version`
            cli.make_context("jobgen", list(args))
        while True:
            command = group.get_command(parent, args[0])
            assert command is not None, f"README.md line {line}: no command {args[0]!r}"
            if not isinstance(command, click.Group):
                command.make_context(args[0], list(args[1:]), parent=parent)
                break
            parent = click.Context(command, info_name=args[0], parent=parent)
            group, args = command, args[1:]       # `jobgen batch validate ...`
    except click.exceptions.Exit:      # --version, --help
        pass
    except click.UsageError as exc:
        pytest.fail(f"README.md line {line}: `jobgen {shlex.join(args)}`: {exc.format_message()}")


# --- tables and install steps -----------------------------------------------------------------

def _recipe_rows() -> dict[str, str]:
    rows = {}
    for line in _lines():
        m = re.match(r"^\| `(?P<name>[\w.-]+)` \| [^|]+ \| (?P<platform>[\w.]+) \| "
                     r"(?P<parallelism>[^|]+) \|", line)
        if m:
            rows[m["name"]] = f"{m['platform']} {m['parallelism']}"
    return rows


def test_the_recipes_table_agrees_with_the_recipe_files() -> None:
    from jobgen import recipe as recipes
    rows = _recipe_rows()
    assert set(recipes.recipe_names()) <= set(rows)
    for name in recipes.recipe_names():
        rec, _ = recipes.load(name)
        par, said = rec.parallelism, rows[name]
        assert said.split()[0] == rec.platform, name
        checks = {r"\bTP (\d+)": par.tensor, r"\bPP (\d+)": par.pipeline,
                  r"\bGBS (\d+)": par.global_batch_size,
                  r"micro-batch (\d+)": par.micro_batch_size,
                  r"(\d+) x \d+ samples per": par.micro_batch_size,
                  r"\d+ x (\d+) samples per": par.gradient_accumulation}
        for pattern, value in checks.items():
            for number in re.findall(pattern, said):
                assert int(number) == value, f"README recipes table, {name}: {said!r}"


def test_install_steps_use_a_venv_or_pipx() -> None:
    text = README.read_text(encoding="utf-8")
    assert "## Rehearsing on this machine (`jobgen run`)" in text
    code = [line.strip() for line in _lines() if line.startswith("    ")]
    system_pip = [line for line in code
                  if re.match(r"^(python3? -m pip|pip3?) install", line)]
    assert system_pip == [], "a system pip install fails on an externally-managed Python"
    assert any(line.startswith("python3 -m venv .venv && .venv/bin/pip install build")
               for line in code)
