"""`record`: a dataclass whose methods are shared code instead of generated code.

`dataclasses.dataclass` writes the source of `__init__`, `__repr__`, `__eq__`, `__hash__`,
`__setattr__` and `__delattr__` for every class and compiles it when the module is imported:
about 2 ms per frozen class here, two thirds of the time jobgen's own modules take to import,
paid by every `jobgen render`. A record is a real dataclass (`dataclasses.fields`, `asdict`,
`replace` work, and mypy checks it as one) whose methods are the same few functions for every
class, reading the field list. Behaviour is that of `@dataclass(frozen=True)` (or not frozen)
for what jobgen uses: positional or keyword arguments, defaults and default factories,
`__post_init__`, `compare=False`, `init=False` with a default.
"""
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


def _methods(cls: type, frozen: bool) -> dict[str, Any]:
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

    methods: dict[str, Any] = {"__init__": __init__, "__repr__": __repr__, "__eq__": __eq__}
    if frozen:
        def __setattr__(self: Any, name: str, _value: Any) -> None:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

        def __delattr__(self: Any, name: str) -> None:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

        def __hash__(self: Any) -> int:
            return hash(tuple(getattr(self, n) for n in hashed))

        methods.update(__setattr__=__setattr__, __delattr__=__delattr__, __hash__=__hash__)
    else:
        methods["__hash__"] = None      # mutable and comparable: unhashable, as dataclasses do
    return methods


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def record(cls: Any = None, *, frozen: bool = True) -> Any:
    """Decorate a class as a dataclass (frozen unless frozen=False) with shared methods."""
    def wrap(klass: type[T]) -> type[T]:
        if not klass.__doc__:
            # dataclasses would make one from inspect.signature(klass): 2-6 ms a class.
            klass.__doc__ = f"{klass.__name__} (a record: its fields are its dataclass fields)"
        klass = dataclasses.dataclass(klass, init=False, repr=False, eq=False)
        params = klass.__dict__["__dataclass_params__"]
        for name, method in _methods(klass, frozen).items():
            if method is not None:
                method.__qualname__ = f"{klass.__qualname__}.{name}"
            setattr(klass, name, method)
        # what dataclasses.replace and tools reading the parameters expect of such a class
        params.init, params.repr, params.eq, params.frozen = True, True, True, frozen
        return klass
    return wrap if cls is None else wrap(cls)
