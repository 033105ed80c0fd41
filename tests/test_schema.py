"""The strict constructor behind recipes and site profiles: unknown keys, missing keys and wrong
types are errors that name the file and the full key path; records are immutable."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, Mapping, Optional

import pytest

from jobgen.inputs import schema
from jobgen.inputs.recipe import Recipe
from jobgen.plumbing.errors import ConfigError


@dataclass(frozen=True)
class Inner:
    count: int
    ratio: float = 0.5
    label: Optional[str] = None


@dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner
    mode: Literal["a", "b"] = "a"
    flag: bool = False
    pair: tuple[float, float] = (0.0, 1.0)
    many: tuple[int, ...] = ()
    table: Mapping[str, str] = dataclasses.field(default_factory=dict)
    maybe: Optional[Inner] = None


def build(data: dict[str, Any]) -> Outer:
    return schema.build(Outer, data, "f.yaml")


def error(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        build(data)
    return str(info.value)


GOOD = {"name": "x", "inner": {"count": 2}}


def test_build_applies_defaults_and_converts() -> None:
    rec = build({**GOOD, "inner": {"count": 2, "ratio": 1}, "pair": [1, 2.5], "many": [3, 4],
                 "table": {"b": "2", "a": "1"}, "maybe": {"count": 7}})
    assert rec == Outer(name="x", inner=Inner(count=2, ratio=1.0), pair=(1.0, 2.5), many=(3, 4),
                        table={"a": "1", "b": "2"}, maybe=Inner(count=7))
    assert isinstance(rec.inner.ratio, float)      # an int where a number is expected
    assert isinstance(rec.pair, tuple) and isinstance(rec.many, tuple)
    assert list(rec.table) == ["a", "b"]            # deterministic order
    assert isinstance(rec.table, MappingProxyType)


def test_records_are_immutable() -> None:
    rec = build(dict(GOOD, table={"a": "1"}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.name = "y"  # type: ignore[misc]
    with pytest.raises(TypeError):
        rec.table["a"] = "2"  # type: ignore[index]


@pytest.mark.parametrize("data,message", [
    ({**GOOD, "extra": 1},
     "f.yaml: extra: unknown key (known keys: name, inner, mode, flag, pair, many, table, maybe)"),
    ({**GOOD, "inner": {"count": 1, "cuont": 2}},
     "f.yaml: inner.cuont: unknown key (known keys: count, ratio, label)"),
    ({"name": "x"}, "f.yaml: inner: required key is missing"),
    ({**GOOD, "inner": {}}, "f.yaml: inner.count: required key is missing"),
    ({**GOOD, "inner": {"count": "2"}}, "f.yaml: inner.count: expected an integer, got '2'"),
    ({**GOOD, "inner": {"count": True}}, "f.yaml: inner.count: expected an integer, got True"),
    ({**GOOD, "inner": {"count": 2.0}}, "f.yaml: inner.count: expected an integer, got 2.0"),
    ({**GOOD, "inner": {"count": 1, "ratio": "1e-4"}},
     "f.yaml: inner.ratio: expected a number, got '1e-4'"),
    ({**GOOD, "inner": {"count": 1, "ratio": False}},
     "f.yaml: inner.ratio: expected a number, got False"),
    ({**GOOD, "inner": {"count": 1, "label": 5}}, "f.yaml: inner.label: expected a string, got 5"),
    ({**GOOD, "name": None}, "f.yaml: name: expected a string, got None"),
    ({**GOOD, "inner": 3}, "f.yaml: inner: expected a mapping, got 3"),
    ({**GOOD, "mode": "c"}, "f.yaml: mode: expected one of a, b, got 'c'"),
    ({**GOOD, "flag": 1}, "f.yaml: flag: expected true or false, got 1"),
    ({**GOOD, "flag": "yes"}, "f.yaml: flag: expected true or false, got 'yes'"),
    ({**GOOD, "pair": [1]}, "f.yaml: pair: expected a list of 2 items, got [1]"),
    ({**GOOD, "pair": "ab"}, "f.yaml: pair: expected a list, got 'ab'"),
    ({**GOOD, "pair": [1, "x"]}, "f.yaml: pair[1]: expected a number, got 'x'"),
    ({**GOOD, "many": [1, 2, "3"]}, "f.yaml: many[2]: expected an integer, got '3'"),
    ({**GOOD, "table": {"k": 1}}, "f.yaml: table.k: expected a string, got 1"),
    ({**GOOD, "table": ["k"]}, "f.yaml: table: expected a mapping, got ['k']"),
    ({**GOOD, "maybe": {"count": 1, "x": 0}},
     "f.yaml: maybe.x: unknown key (known keys: count, ratio, label)"),
])
def test_errors_name_the_file_and_key_path(data: dict[str, Any], message: str) -> None:
    assert error(data) == message


def test_literal_does_not_confuse_booleans_with_numbers() -> None:
    @dataclass(frozen=True)
    class Levels:
        level: Literal[0, 1]

    assert schema.build(Levels, {"level": 1}, "f").level == 1
    with pytest.raises(ConfigError, match=r"^f: level: expected one of 0, 1, got True$"):
        schema.build(Levels, {"level": True}, "f")


def test_long_bad_values_are_shortened() -> None:
    message = error({**GOOD, "name": ["x" * 100]})
    assert message == "f.yaml: name: expected a string, got ['" + "x" * 35 + "..."
    assert schema.describe("a\nb") == "'a\\nb'"      # a newline cannot split an error line


def test_field_type_walks_dotted_paths() -> None:
    assert schema.field_type(Recipe, "optim.lr", "--set") is float
    assert schema.field_type(Recipe, "parallelism.tensor", "--set") is int
    assert schema.field_type(Recipe, "optim.lr_scaling.base_nodes", "--set") is int  # Optional
    assert schema.field_type(Recipe, "env.ANY_NAME", "--set") is str      # free-form mapping
    assert schema.field_type(Recipe, "data.vocab_file", "--set") == Optional[str]


@pytest.mark.parametrize("dotted,message", [
    ("optim.nope", "--set: optim.nope: unknown key (known keys: name, lr, betas, eps, "
                   "weight_decay, grad_clip, lr_scaling, no_decay)"),
    ("optim.lr.x", "--set: optim.lr.x: optim.lr is not a mapping"),
    ("env.A.B", "--set: env.A.B: env.A is not a mapping"),
])
def test_field_type_errors(dotted: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        schema.field_type(Recipe, dotted, "--set")
    assert str(info.value) == message


def test_to_plain_gives_yaml_and_json_friendly_data() -> None:
    rec = build({**GOOD, "pair": [1, 2], "table": {"a": "1"}, "maybe": {"count": 3}})
    assert schema.to_plain(rec) == {
        "name": "x", "inner": {"count": 2, "ratio": 0.5, "label": None}, "mode": "a",
        "flag": False, "pair": [1.0, 2.0], "many": [], "table": {"a": "1"},
        "maybe": {"count": 3, "ratio": 0.5, "label": None}}


@pytest.mark.parametrize("name,ok", [
    ("neox20b", True), ("llama2-7b", True), ("a.b_c-1", True), ("x" * 64, True),
    ("x" * 65, False), ("-x", False), (".x", False), ("a b", False), ("a;b", False),
    ("a\nb", False), ("ab\n", False), ("a/b", False), ("$(x)", False), ("", False)])
def test_name_alphabet(name: str, ok: bool) -> None:
    assert bool(schema.NAME_RE.fullmatch(name)) is ok
