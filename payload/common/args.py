"""The trainer flags the training programs share, each declared once: its name, type, default
and help. A program adds the ones it takes with ``add`` (into its parser or one of its argument
groups, in the order it lists them) and declares only its own flags itself.

jobgen writes these flags for every program from one builder (jobgen/payloads/flags.py);
tests/test_payload_flags.py checks that the two sides name the same flags. Standard library only:
the programs import this before torch, and jobgen's tests load it by file path.

A program keeps its own default where it has always had one (``defaults``), and says which flags
it cannot run without (``required``); both are part of that program's interface, not of the
flag's meaning.
"""
from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The decay shapes of common/schedule.py (kept equal to its DECAY_SHAPES by a test; this module
# imports nothing of the payload so that it loads on its own).
DECAY_SHAPES = ("linear", "cosine")
FAMILIES = ("gpt_neox", "llama")


@dataclass(frozen=True)
class Flag:
    name: str                       # without the leading "--"; the attribute is dest
    type: Any = None                # None: a switch (store_true)
    default: Any = None
    help: str | None = None
    choices: tuple[str, ...] | None = None
    nargs: str | None = None
    metavar: str | None = None
    rendered: bool = True           # False: for a person or a test, never written by jobgen

    @property
    def option(self) -> str:
        return "--" + self.name

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


def _flags(*flags: Flag) -> dict[str, Flag]:
    return {f.name: f for f in flags}


FLAGS: dict[str, Flag] = _flags(
    # the run
    Flag("phase", str, "train", choices=("compile", "train"),
         help="compile: a few steps to fill the compile cache; train: the run"),
    Flag("compile-steps", int, 3, help="steps of the compile pass"),
    Flag("steps", int, -1, rendered=False,
         help="optimizer steps this invocation may run (-1: until --max-steps)"),
    Flag("max-steps", int, None, help="optimizer steps of the whole schedule"),
    Flag("seed", int, 1234),
    Flag("output-dir", Path, Path("output")),
    Flag("data-dir", Path, None,
         help="a tokenized dataset saved by datasets' save_to_disk (input_ids)"),
    Flag("checkpoint-every", int, 1000, help="optimizer steps between checkpoints"),
    Flag("keep-checkpoints", int, 3, help="the newest checkpoints kept"),
    Flag("sync-save", help="write each checkpoint before training goes on (default: in the "
                           "background, sealed once complete; recipe checkpoint.async_save)"),
    Flag("log-every", int, 10, help="optimizer steps between step events"),
    # the model
    Flag("family", str, None, choices=FAMILIES),
    Flag("num-layers", int, None),
    Flag("hidden-size", int, None),
    Flag("num-heads", int, None),
    Flag("intermediate-size", int, None),
    Flag("vocab-size", int, None),
    Flag("seq-length", int, None),
    Flag("max-position-embeddings", int, None),
    Flag("init-std", float, 0.02, help="initializer range"),
    Flag("scaled-init", help="output projections at --init-std / sqrt(2 x layers) "
                             "(common/init.py)"),
    # batch, optimizer and schedule
    Flag("micro-batch-size", int, 1),
    Flag("gradient-accumulation", int, 1),
    Flag("lr", float, None, help="the peak learning rate"),
    Flag("min-lr", float, 0.0, help="the floor the decay reaches"),
    Flag("warmup-steps", int, 0),
    Flag("constant-steps", int, 0, help="steps held at --lr after warmup"),
    Flag("decay-steps", int, None,
         help="step at which the decay reaches --min-lr (default: --max-steps)"),
    Flag("schedule", str, "cosine", choices=DECAY_SHAPES,
         help="shape of the decay after warmup and hold"),
    Flag("beta1", float, 0.9),
    Flag("beta2", float, 0.999),
    Flag("eps", float, 1e-8),
    Flag("weight-decay", float, 0.0),
    Flag("no-decay", nargs="*", metavar="FRAGMENT",
         help="parameters whose names contain one of these get no weight decay (given with "
              "none: every parameter is decayed)"),
    Flag("grad-clip", float, 1.0, help="gradient norm clip"),
)


def add(parser: argparse.ArgumentParser | argparse._ArgumentGroup, names: Iterable[str], *,
        required: Iterable[str] = (), defaults: Mapping[str, Any] | None = None,
        notes: Mapping[str, str] | None = None) -> None:
    """Add the shared flags ``names`` to ``parser`` (a parser, or one of its argument groups),
    in that order. ``required``: the ones this program cannot run without; ``defaults``: this
    program's own default for a flag; ``notes``: what this program adds to a flag's help (e.g.
    its own rule when --no-decay is absent)."""
    names = list(names)
    required, defaults, notes = set(required), dict(defaults or {}), dict(notes or {})
    unknown = (set(names) | required | set(defaults) | set(notes)) - set(FLAGS)
    if unknown:
        raise ValueError(f"not shared flags: {sorted(unknown)}")
    strays = (required | set(defaults) | set(notes)) - set(names)
    if strays:
        raise ValueError(f"not among the flags being added: {sorted(strays)}")
    for name in names:
        flag = FLAGS[name]
        help_ = "; ".join(h for h in (flag.help, notes.get(name)) if h) or None
        if flag.type is None and flag.nargs is None:
            parser.add_argument(flag.option, action="store_true", help=help_)
            continue
        kwargs: dict[str, Any] = {"default": defaults.get(name, flag.default), "help": help_}
        if flag.type is not None and flag.choices is None:
            kwargs["type"] = flag.type
        if flag.choices is not None:
            kwargs["choices"] = flag.choices
        if flag.nargs is not None:
            kwargs.update(nargs=flag.nargs, metavar=flag.metavar)
        if name in required:
            kwargs.update(required=True, default=None)
        parser.add_argument(flag.option, **kwargs)
