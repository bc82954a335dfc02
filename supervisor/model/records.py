"""`@record`: a slotted dataclass whose repr, == and hash are shared, not generated.

Python 3.11's ``@dataclass`` compiles every generated method with its own ``exec``:
``__init__``, ``__repr__``, ``__eq__``, and for a frozen class ``__setattr__``,
``__delattr__`` and ``__hash__`` as well. For the 30-odd records that `trainctl status` and
`stop` import, that compilation was about a quarter of the command's start-up. A record
keeps the generated ``__init__`` (and the frozen guards) and gets one shared ``__repr__``,
``__eq__`` and ``__hash__`` that read the field names, with the same semantics as the
generated ones: equal only to an instance of the very same class with equal fields;
hashable only when frozen.

Records are for documents and results, not for the stop's hot loops (ProcRef and its
kin in state.py stay plain dataclasses, whose generated ``__eq__`` is faster).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform

T = TypeVar("T")


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


@dataclass_transform(frozen_default=False)
def record(*, frozen: bool = False) -> Callable[[type[T]], type[T]]:
    """Make ``cls`` a slotted dataclass with the shared repr, == and hash."""

    def wrap(cls: type[T]) -> type[T]:
        out = dataclasses.dataclass(cls, frozen=frozen, slots=True, repr=False, eq=False)
        type.__setattr__(out, "__repr__", _repr)
        type.__setattr__(out, "__eq__", _eq)
        type.__setattr__(out, "__hash__", _hash if frozen else None)
        return out

    return wrap
