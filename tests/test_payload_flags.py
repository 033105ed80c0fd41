"""The shared trainer-flag contract: jobgen writes the flags its training programs share from one
builder (jobgen/payloads/flags.py), and the programs declare them once (payload/common/args.py).
The two name the same flags, every value the builder writes parses with the declared type, and
each program's own parser reads the rendered arguments to the same values."""
from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from jobgen import api, payloads
from jobgen.payloads import flags

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = ROOT / "payload"
PROGRAMS = ("habana_deepspeed/pretrain_bert.py", "neuronx_distributed/train_llama.py",
            "smoke/train.py", "smp_fsdp/train_fsdp.py")


def load(relative: str) -> ModuleType:
    """A file under payload/ by its path, under a name of its own (as the other tests do)."""
    name = "flags_" + relative.replace("/", "_").removesuffix(".py")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, PAYLOAD / relative)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ARGS = load("common/args.py")
RENDERED = {name for name, flag in ARGS.FLAGS.items() if flag.rendered}

# (recipe, backend, site, nodes, smoke): each payload's real job and its rehearsal.
SPECS = [
    ("bert-large", "slurm", "local", 2, False),
    ("bert1.5b", "batch", "dl1-batch", None, False),
    ("bert-large", "slurm", "local", 2, True),           # pretrain_bert.py on CPU
    ("llama2-7b", "slurm", "trn1-pcluster", 4, False),
    ("llama2-7b", "slurm", "trn1-pcluster", 2, True),    # smoke/train.py, Llama
    ("neox20b", "slurm", "local", 2, True),              # smoke/train.py, GPT-NeoX
    ("llama2-7b", "sagemaker", "sagemaker", 16, False),  # train_fsdp.py
    ("llama2-7b", "sagemaker", "sagemaker", 2, True),    # train_fsdp.py on CPU
]
IDS = [f"{r}-{b}-{'smoke' if s else n}" for r, b, _, n, s in SPECS]


def job(case: tuple[str, str, str, int | None, bool]) -> Any:
    ref, backend, site, nodes, smoke = case
    return api.job_spec(ref, nodes, site=site, backend=backend, smoke=smoke)


def shared_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shared")
    ARGS.add(parser, RENDERED)
    return parser


def test_the_builder_and_the_programs_name_the_same_flags() -> None:
    assert set(flags.SHARED) == RENDERED, (
        f"only in jobgen/payloads/flags.py: {sorted(set(flags.SHARED) - RENDERED)}; "
        f"only in payload/common/args.py: {sorted(RENDERED - set(flags.SHARED))}")
    assert len(flags.SHARED) == len(set(flags.SHARED))


def test_declared_choices_are_the_payloads_own() -> None:
    schedule, models = load("common/schedule.py"), load("common/models.py")
    assert ARGS.DECAY_SHAPES == schedule.DECAY_SHAPES
    assert set(ARGS.FAMILIES) == set(models.OUTPUT_PROJECTIONS)


@pytest.mark.parametrize("case", SPECS, ids=IDS)
@pytest.mark.parametrize("which", ["compile", "train"])
def test_every_shared_value_parses_as_declared(case: Any, which: str) -> None:
    spec = job(case)
    values = flags.shared(spec, which)  # type: ignore[arg-type]
    missing = RENDERED - set(values)
    # A rehearsal makes its own data and holds no constant learning rate after warmup.
    assert missing == ({"data-dir", "constant-steps"} if spec.smoke else set())
    if values["family"] not in ARGS.FAMILIES:   # BERT: its program has no --family
        del values["family"]
    parsed = shared_parser().parse_args(flags.render(list(values), values))
    for name, value in values.items():
        flag, got = ARGS.FLAGS[name], getattr(parsed, ARGS.FLAGS[name].dest)
        if isinstance(value, bool):
            assert got is value, name
        elif value is None:
            assert got == flag.default, name
        elif isinstance(value, tuple):
            assert got == list(value), name
        else:
            assert got == (value if flag.choices else flag.type(value)), name


@pytest.mark.parametrize("case", SPECS, ids=IDS)
@pytest.mark.parametrize("which", ["compile", "train"])
def test_each_program_reads_the_rendered_shared_flags_as_declared(case: Any, which: str) -> None:
    """The program's own parser, on the arguments jobgen renders for it, reads every shared
    flag it is given to the value the declaration alone reads."""
    spec = job(case)
    lau = payloads.for_spec(spec, case[1])
    relative = f"{Path(lau.workdir).name}/{lau.program}"
    assert relative in PROGRAMS
    rendered = list(lau.args(which))  # type: ignore[arg-type]
    try:
        mine = load(relative).parse_args(rendered)
    except SystemExit as exc:
        pytest.fail(f"payload/{relative} refuses the rendered arguments (exit {exc.code}): "
                    f"{' '.join(rendered)}")
    given = [n for n in RENDERED if "--" + n in rendered]
    assert given, "no shared flag rendered"
    values = flags.shared(spec, which)  # type: ignore[arg-type]
    expected = shared_parser().parse_args(flags.render(given, values))
    for name in given:
        dest = ARGS.FLAGS[name].dest
        assert getattr(mine, dest) == getattr(expected, dest), f"--{name} in {relative}"


# A program's own flag that also answers to a shared flag's name, for another program's sake.
ALIASES = {("smoke/train.py", "--schedule"): "its --decay; --schedule is the NxD program's name"}


@pytest.mark.parametrize("relative", PROGRAMS)
def test_programs_take_the_shared_flags_from_common_args(relative: str) -> None:
    """No program declares a shared flag itself (it adds it with common/args.py's add), and
    each program's shared flags have the declared type, choices and arity."""
    source = (PAYLOAD / relative).read_text()
    own = set(re.findall(r"add_argument\(\s*\"--([a-z0-9-]+)\"", source))
    assert not own & set(ARGS.FLAGS), f"declared again in payload/{relative}"
    parser = load(relative).parser()
    for action in parser._actions:
        for option in action.option_strings:
            flag = ARGS.FLAGS.get(option.removeprefix("--"))
            if flag is None or (relative, option) in ALIASES:
                continue
            assert action.dest == flag.dest
            if flag.choices is not None:
                assert tuple(action.choices) == flag.choices
            elif flag.nargs is not None:
                assert (action.nargs, action.type, action.metavar) == (flag.nargs, None,
                                                                       flag.metavar), option
            elif flag.type is not None:
                assert action.type is flag.type, option
            else:
                assert isinstance(action, argparse._StoreTrueAction), option
            if flag.nargs is None:
                assert action.nargs in (None, 0), option
