"""jobgen.plumbing.record behaves like @dataclass(frozen=True) for everything jobgen uses: each test
builds the same class both ways and compares."""
from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Optional

import pytest

from jobgen.plumbing.record import record


def make(decorate: Any) -> type:
    class Job:
        name: str
        nodes: int = 1
        tags: list[str] = dataclasses.field(default_factory=list)
        note: Optional[str] = dataclasses.field(default=None, compare=False)
        derived: int = dataclasses.field(default=0, init=False)

        def __post_init__(self) -> None:
            object.__setattr__(self, "derived", self.nodes * 2)
    return decorate(Job)


RECORD, DATACLASS = make(record), make(dataclasses.dataclass(frozen=True))
BOTH = pytest.mark.parametrize("cls", [RECORD, DATACLASS], ids=["record", "dataclass"])


@BOTH
def test_arguments_defaults_and_post_init(cls: Any) -> None:
    a, b = cls("x", 3), cls(name="x", nodes=3, tags=["t"])
    assert (a.name, a.nodes, a.tags, a.note, a.derived) == ("x", 3, [], None, 6)
    assert b.tags == ["t"] and cls("y").tags is not cls("z").tags   # a fresh list each time


def test_argument_errors_are_those_of_a_dataclass() -> None:
    for args, kwargs in [((), {}), (("x", 1, [], None, 5), {}), (("x",), {"name": "y"}),
                         ((), {"name": "x", "derived": 1}), ((), {"name": "x", "bogus": 1})]:
        with pytest.raises(TypeError):
            RECORD(*args, **kwargs)
        with pytest.raises(TypeError):
            DATACLASS(*args, **kwargs)


def test_equality_hash_and_repr_match() -> None:
    r1, r2 = RECORD("x", 2, note="a"), RECORD("x", 2, note="b")
    d1, d2 = DATACLASS("x", 2, note="a"), DATACLASS("x", 2, note="b")
    assert (r1 == r2) == (d1 == d2) is True          # compare=False leaves `note` out
    assert (RECORD("x", 2) == RECORD("x", 3)) == (DATACLASS("x", 2) == DATACLASS("x", 3))
    assert RECORD("x") != DATACLASS("x")             # another class is never equal
    r3, r4 = RECORD("x", 2, ("t",)), RECORD("x", 2, ("t",))
    assert hash(r3) == hash(r4)
    assert repr(r1).split("(", 1)[1] == repr(d1).split("(", 1)[1]


@BOTH
def test_frozen(cls: Any) -> None:
    job = cls("x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.nodes = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        del job.nodes


@BOTH
def test_dataclass_functions_and_pickle(cls: Any) -> None:
    job = cls("x", 2, ["t"])
    assert [f.name for f in dataclasses.fields(job)] == ["name", "nodes", "tags", "note",
                                                          "derived"]
    assert dataclasses.asdict(job) == {"name": "x", "nodes": 2, "tags": ["t"], "note": None,
                                       "derived": 4}
    moved = dataclasses.replace(job, nodes=5)
    assert (moved.nodes, moved.derived, moved.tags) == (5, 10, ["t"])
    assert dataclasses.is_dataclass(job)


def test_a_record_survives_pickle() -> None:
    from jobgen.inputs.platforms import PLATFORMS
    for platform in PLATFORMS.values():
        again = pickle.loads(pickle.dumps(platform))
        assert again == platform and hash(again) == hash(platform)
