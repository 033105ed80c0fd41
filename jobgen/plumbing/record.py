"""`record`: a frozen dataclass whose methods are shared code instead of generated code.

Only for the records that `jobgen render` imports (the inputs, the spec, the backends'
declarations); every other module uses `@dataclass(frozen=True, slots=True)`. A record is a real
dataclass (`dataclasses.fields`, `asdict`, `replace` work, and mypy checks it as one) whose
methods are the same few functions for every class, reading the field list; it behaves as
`@dataclass(frozen=True)` does for what jobgen uses: positional or keyword arguments, defaults
and default factories, `__post_init__`, `compare=False`, `init=False` with a default.
"""
# Measured (benchmarks/render_bench.py, docs/benchmarks.md): dataclasses here cost 24 ms a render.
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, TypeVar

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda f: f

T = TypeVar("T")
MISSING: Any = dataclasses.MISSING


def _methods(cls: type) -> dict[str, Any]:
    every = dataclasses.fields(cls)
    params = tuple((f.name, f.default, f.default_factory) for f in every if f.init)
    fixed = tuple((f.name, f.default, f.default_factory) for f in every if not f.init)
    names = tuple(p[0] for p in params)
    compared = tuple(f.name for f in every if f.compare)
    hashed = tuple(f.name for f in every if (f.compare if f.hash is None else f.hash))
    shown = tuple(f.name for f in every if f.repr)
    has_post_init = hasattr(cls, "__post_init__")
    set_field = object.__setattr__

    def _value(name: str, default: Any, factory: Any) -> Any:
        if default is not MISSING:
            return default
        if factory is not MISSING:
            return factory()
        raise TypeError(f"{cls.__qualname__}() missing required argument: {name!r}")

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(names):
            raise TypeError(f"{cls.__qualname__}() takes {len(names)} positional arguments "
                            f"but {len(args)} were given")
        for name, value in zip(names, args):
            if name in kwargs:
                raise TypeError(f"{cls.__qualname__}() got multiple values for argument {name!r}")
            kwargs[name] = value
        for name, default, factory in params:
            set_field(self, name, kwargs.pop(name) if name in kwargs
                      else _value(name, default, factory))
        if kwargs:
            raise TypeError(f"{cls.__qualname__}() got an unexpected keyword argument "
                            f"{next(iter(kwargs))!r}")
        for name, default, factory in fixed:
            if default is not MISSING or factory is not MISSING:
                set_field(self, name, _value(name, default, factory))
        if has_post_init:
            self.__post_init__()

    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in shown)
        return f"{type(self).__qualname__}({inner})"

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in compared)

    def __setattr__(self: Any, name: str, _value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self: Any, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __hash__(self: Any) -> int:
        return hash(tuple(getattr(self, n) for n in hashed))

    methods: dict[str, Any] = {"__init__": __init__, "__repr__": __repr__, "__eq__": __eq__,
                               "__setattr__": __setattr__, "__delattr__": __delattr__,
                               "__hash__": __hash__}
    return methods


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def record(cls: type[T]) -> type[T]:
    """Decorate a class as a frozen dataclass with shared methods."""
    if not cls.__doc__:
        # dataclasses would make one from inspect.signature(cls): 2-6 ms a class.
        cls.__doc__ = f"{cls.__name__} (a record: its fields are its dataclass fields)"
    cls = dataclasses.dataclass(cls, init=False, repr=False, eq=False)
    params = cls.__dict__["__dataclass_params__"]
    for name, method in _methods(cls).items():
        method.__qualname__ = f"{cls.__qualname__}.{name}"
        setattr(cls, name, method)
    # what dataclasses.replace and tools reading the parameters expect of such a class
    params.init, params.repr, params.eq, params.frozen = True, True, True, True
    return cls
