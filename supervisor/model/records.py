"""`@record`: a slotted dataclass whose methods are shared, not generated.

Python 3.11's ``@dataclass`` compiles every generated method with its own ``exec``:
``__init__``, ``__repr__``, ``__eq__``, and for a frozen class ``__setattr__``,
``__delattr__`` and ``__hash__`` as well. For the records that `trainctl status` and
`stop` import (70-odd), that compilation was about a third of the command's start-up. A
record gets one shared ``__init__`` (fields by position or name, defaults and default
factories, as the generated one takes them), ``__repr__``, ``__eq__`` and ``__hash__``
that read the field names, shared ``__getstate__``/``__setstate__`` (copy and pickle), and
for a frozen record shared guards that refuse assignment
(``dataclasses.FrozenInstanceError``): the same semantics as the generated ones (equal
only to an instance of the very same class with equal fields; hashable only when
frozen). Not supported, and not used by any record: ``__post_init__``, ``InitVar`` and
keyword-only fields (a record that declares one is refused when its class is made).

Records are for documents and results, not for the stop's hot loops (ProcRef and its
kin in model/procs.py stay plain dataclasses, whose generated ``__init__`` and ``__eq__`` are
faster per call).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform

T = TypeVar("T")

# A JSON value, and a JSON object: what a record's to_doc() gives (what json.dumps writes)
Json = None | bool | int | float | str | list["Json"] | dict[str, "Json"]
JsonObject = dict[str, Json]


def _names(cls: type) -> tuple[str, ...]:
    names: tuple[str, ...] | None = cls.__dict__.get("_record_names")
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(cls))
        type.__setattr__(cls, "_record_names", names)
    return names


def _values(obj: Any) -> tuple[Any, ...]:
    return tuple(getattr(obj, n) for n in _names(type(obj)))


def _repr(self: Any) -> str:
    inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in _names(type(self)))
    return f"{type(self).__qualname__}({inner})"


def _eq(self: Any, other: object) -> Any:  # bool, or NotImplemented for another class
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self) == _values(other)


def _hash(self: Any) -> int:
    return hash(_values(self))


_MISSING = dataclasses.MISSING
# per record class: its init fields as (name, default, default factory), then the
# init=False fields that have a default or a factory
_Plan = tuple[tuple[tuple[str, Any, Any], ...], tuple[tuple[str, Any, Any], ...]]


def _plan_of(cls: type) -> _Plan:
    plan: _Plan | None = cls.__dict__.get("_record_plan")
    if plan is None:
        fs = dataclasses.fields(cls)
        given = tuple((f.name, f.default, f.default_factory) for f in fs if f.init)
        rest = tuple(
            (f.name, f.default, f.default_factory)
            for f in fs
            if not f.init and (f.default is not _MISSING or f.default_factory is not _MISSING)
        )
        plan = (given, rest)
        type.__setattr__(cls, "_record_plan", plan)
    return plan


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    given, rest = _plan_of(type(self))
    if len(args) > len(given):
        raise TypeError(
            f"{type(self).__qualname__}() takes {len(given)} positional arguments "
            f"but {len(args)} were given"
        )
    put = object.__setattr__
    for i, (name, default, factory) in enumerate(given):
        if i < len(args):
            if name in kwargs:
                raise TypeError(f"{type(self).__qualname__}() got multiple values for {name!r}")
            put(self, name, args[i])
        elif name in kwargs:
            put(self, name, kwargs.pop(name))
        elif default is not _MISSING:
            put(self, name, default)
        elif factory is not _MISSING:
            put(self, name, factory())
        else:
            raise TypeError(f"{type(self).__qualname__}() missing required argument {name!r}")
    if kwargs:  # every name the record knows was taken above
        raise TypeError(f"{type(self).__qualname__}() got unexpected keyword(s) {sorted(kwargs)}")
    for name, default, factory in rest:
        put(self, name, factory() if factory is not _MISSING else default)


def _getstate(self: Any) -> tuple[Any, ...]:
    return _values(self)


def _setstate(self: Any, state: tuple[Any, ...]) -> None:
    for name, value in zip(_names(type(self)), state, strict=True):
        object.__setattr__(self, name, value)  # past a frozen record's guard, as __init__


def _frozen_set(self: Any, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_del(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _refuse_unsupported(cls: type) -> None:
    if "__post_init__" in cls.__dict__:
        raise TypeError(f"{cls.__qualname__}: a record has no __post_init__ (a dataclass has)")
    for f in dataclasses.fields(cls):
        if f.kw_only is True:
            raise TypeError(f"{cls.__qualname__}.{f.name}: a record has no keyword-only fields")
    for name, kind in inspect.get_annotations(cls).items():
        if "InitVar" in str(kind):  # fields() leaves it out: the shared __init__ would too
            raise TypeError(f"{cls.__qualname__}.{name}: a record has no InitVar")


@dataclass_transform(frozen_default=False)
def record(*, frozen: bool = False) -> Callable[[type[T]], type[T]]:
    """Make ``cls`` a slotted dataclass with the shared init, repr, == and hash (and,
    frozen, the shared guards)."""

    def wrap(cls: type[T]) -> type[T]:
        out = dataclasses.dataclass(cls, init=False, slots=True, repr=False, eq=False)
        _refuse_unsupported(out)
        type.__setattr__(out, "__init__", _init)
        type.__setattr__(out, "__repr__", _repr)
        type.__setattr__(out, "__eq__", _eq)
        type.__setattr__(out, "__hash__", _hash if frozen else None)
        type.__setattr__(out, "__getstate__", _getstate)  # copy and pickle, frozen or not
        type.__setattr__(out, "__setstate__", _setstate)
        if frozen:
            type.__setattr__(out, "__setattr__", _frozen_set)
            type.__setattr__(out, "__delattr__", _frozen_del)
        return out

    return wrap
