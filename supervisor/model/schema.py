"""Total type checks of the documents trainctl reads back (state.json, spec.json).

A JSON document can hold anything; a frozen record built from it with ``**doc`` checks
nothing. Every field is checked here against its annotation (and a finite, sane range
for numbers), so a mistyped file becomes one StateError line (exit 4) instead of a crash
deep inside a stop.
"""

from __future__ import annotations

import functools
import math
import sys
import types
import typing
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

from trainctl.supervisor import records
from trainctl.supervisor.errors import StateError

# No trainctl number is negative; none is this large either (timestamps, pids, ticks).
_MAX_NUMBER = 2.0**62
T = TypeVar("T")
Hints = dict[str, Any]  # a record's field names to their hints (typing.get_type_hints's)


def build_document(cls: type[T], doc: Any, where: str) -> T:
    """Build record (or dataclass) ``cls`` from a JSON object (nested records too), then check it.

    Keys the record does not know are dropped (a newer writer may add some); a missing
    required key or a mistyped value is one StateError naming the field.
    """
    if not isinstance(doc, dict):
        raise StateError(f"{where}: must be an object, got {type(doc).__name__}")
    hints = _hints(typing.cast(Any, cls))
    kwargs = {k: _build_value(v, hints[k], where, k) for k, v in doc.items() if k in hints}
    try:
        obj = cls(**kwargs)
    except TypeError as e:
        raise StateError(f"{where}: {e}; refusing to act on it") from None
    check_document(obj, where)
    return obj


def _build_value(value: Any, hint: Any, where: str, path: str) -> Any:
    """Turn the JSON form of a nested record (or a list/tuple of them) into the record."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and value is not None:
        inner = [a for a in args if a is not type(None)]
        return _build_value(value, inner[0], where, path) if len(inner) == 1 else value
    if isinstance(hint, type) and issubclass(hint, Enum) and not isinstance(value, hint):
        try:
            return hint(value)
        except ValueError:
            return value  # the check names it
    if isinstance(hint, type) and records.is_structured(hint):
        return build_document(hint, value, f"{where}: {path}")
    if origin in (list, tuple) and isinstance(value, list | tuple) and args:
        items = [_build_value(v, args[0], where, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    return value


def check_document(obj: Any, where: str) -> None:
    """Raise StateError naming the first field of record ``obj`` that breaks its type."""
    _check_fields(obj, where, "")


def _check_fields(obj: Any, where: str, prefix: str) -> None:
    cls: Any = type(obj)
    for name, hint, kind, scalar_ok in _plan(cls):
        value = getattr(obj, name)
        if scalar_ok is not None:  # the common case, without a call per field
            if not scalar_ok(value):
                _check(value, hint, where, f"{prefix}{name}")  # says what is wrong
        elif kind != "any":
            _check(value, hint, where, f"{prefix}{name}")


def _int_ok(v: Any) -> bool:
    return isinstance(v, int) and v.__class__ is not bool and 0 <= v <= _MAX_NUMBER


def _float_ok(v: Any) -> bool:
    return (
        isinstance(v, int | float)
        and v.__class__ is not bool
        and math.isfinite(v)
        and 0 <= v <= _MAX_NUMBER
    )


def _str_ok(v: Any) -> bool:
    return isinstance(v, str)


def _bool_ok(v: Any) -> bool:
    return isinstance(v, bool)


# what _check_scalar accepts, as one test each (it names the field when one fails)
_SCALAR_OK: dict[Any, Callable[[Any], bool]] = {
    int: _int_ok,
    float: _float_ok,
    str: _str_ok,
    bool: _bool_ok,
}


@functools.cache
def _plan(cls: Any) -> tuple[tuple[str, Any, str, Callable[[Any], bool] | None], ...]:
    """Each field of ``cls`` with its hint, how it is checked and, for a plain scalar, its
    one test: worked out once per class (a state holds hundreds of member records)."""
    return tuple((name, hint, _kind(hint)[0], _test_of(hint)) for name, hint in _hints(cls).items())


def _test_of(hint: Any) -> Callable[[Any], bool] | None:
    """One test for a scalar hint or an optional one (``int | None``); else None."""
    kind, origin = _kind(hint)
    if kind == "scalar":
        return _SCALAR_OK.get(hint)
    args = _args(hint)
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and args[1] is type(None):
        inner = _SCALAR_OK.get(args[0])
        if inner is not None:
            return lambda v: v is None or inner(v)
    return None


@functools.cache
def _args(hint: Any) -> tuple[Any, ...]:
    return typing.get_args(hint)


@functools.cache
def _hints(cls: Any) -> Hints:
    hints = type_hints(cls)
    return {name: hints[name] for name in records.field_names(cls)}


def type_hints(cls: type) -> Hints:
    """``typing.get_type_hints(cls)``, made faster for what records are: annotations in
    strings (``from __future__ import annotations``), evaluated as typing evaluates a
    class's (the class's names, then its module's). typing makes a ForwardRef of each
    string, which compiles it: ~150 compiles, 2 ms of a ~45 ms `status`. Here each
    distinct text is compiled once. A hint with a reference left inside it (``list["Json"]``)
    or an ``Annotated`` one is typing's to resolve: the class goes to typing whole."""
    out: Hints = {}
    for base in reversed(cls.__mro__):
        ann = base.__dict__.get("__annotations__")  # noqa: RUF063  (a record's, or none)
        if not isinstance(ann, dict):
            if ann is not None or "__annotate__" in base.__dict__:
                return typing.get_type_hints(cls)  # lazy annotations (3.14): typing's
            continue
        module = sys.modules.get(base.__module__)
        names, scope = dict(vars(base)), (module.__dict__ if module is not None else {})
        for name, value in ann.items():
            hint = eval(_code(value), names, scope) if isinstance(value, str) else value  # noqa: S307  (our own annotations, as typing evaluates them)
            hint = type(None) if hint is None else hint
            if not _resolved(hint):
                return typing.get_type_hints(cls)
            out[name] = hint
    return out


@functools.cache
def _code(text: str) -> types.CodeType:
    return compile(text, "<annotation>", "eval")


def _resolved(hint: Any) -> bool:
    """No string or forward reference inside ``hint``, and nothing ``Annotated``."""
    if type(hint) is type:  # a plain class (a record, int, str): the common case
        return True
    if isinstance(hint, str | typing.ForwardRef):
        return False
    if typing.get_origin(hint) is typing.Annotated:
        return False
    return all(_resolved(a) for a in typing.get_args(hint) if a is not Ellipsis)


@functools.cache
def _kind(hint: Any) -> tuple[str, Any]:
    """How a hint is checked, worked out once per hint (`list` reads dozens of specs)."""
    if hint is Any:
        return "any", None
    origin = typing.get_origin(hint)
    if origin is dict and _args(hint) == (str, str):
        return "str-dict", None  # a job's environment: hundreds of strings, one pass
    if origin is not None or records.is_structured(hint):
        return "compound", origin
    if isinstance(hint, type) and issubclass(hint, Enum):
        return "enum", None
    return "scalar", None


def _check(value: Any, hint: Any, where: str, path: str) -> None:
    kind, origin = _kind(hint)
    if kind == "any":
        return
    if kind == "str-dict":
        ok = isinstance(value, dict) and all(
            type(k) is str and type(v) is str for k, v in value.items()
        )
        if not ok:  # find and name the offending entry
            _check_compound(value, hint, dict, where, path)
    elif kind == "compound":
        _check_compound(value, hint, origin, where, path)
    elif kind == "enum":
        _need(isinstance(value, hint), value, f"one of {[e.value for e in hint]}", where, path)
    else:
        _check_scalar(value, hint, where, path)


def _check_compound(value: Any, hint: Any, origin: Any, where: str, path: str) -> None:
    args = _args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return
        inner = [a for a in args if a is not type(None)]
        if len(inner) > 1:  # records of several kinds (a local or a Slurm stop report)
            kind = next((a for a in inner if isinstance(a, type) and isinstance(value, a)), None)
            _need(kind is not None, value, "a record", where, path)
            inner = [kind]
        _check(value, inner[0], where, path)
    elif origin is dict:
        _need(isinstance(value, dict), value, "an object", where, path)
        for k, v in value.items():
            _need(isinstance(k, str), k, "string keys", where, path)
            _check(v, args[1] if args else Any, where, f"{path}.{k}")
    elif origin in (tuple, list):
        _need(isinstance(value, tuple | list), value, "a list", where, path)
        if origin is tuple and args and args[-1] is not Ellipsis:  # (pid, ticks): exactly
            _need(len(value) == len(args), value, f"a list of {len(args)}", where, path)
        test = _SCALAR_OK.get(args[0]) if args else None
        if test is not None and all(test(item) for item in value):
            return  # a list of plain scalars (a member's nets): one pass, no path built
        for i, item in enumerate(value):
            _check(item, args[0], where, f"{path}[{i}]")
    else:  # a nested record (ProcRef, MemberSnap, GpuLease)
        _need(isinstance(value, typing.cast(type, hint)), value, "an object", where, path)
        _check_fields(value, where, f"{path}.")


def _check_scalar(value: Any, hint: Any, where: str, path: str) -> None:
    if hint is bool:
        _need(isinstance(value, bool), value, "true or false", where, path)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        _need(ok and 0 <= value <= _MAX_NUMBER, value, "a non-negative integer", where, path)
    elif hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok = ok and math.isfinite(value) and 0 <= value <= _MAX_NUMBER
        _need(ok, value, "a non-negative finite number", where, path)
    elif hint is str:
        _need(isinstance(value, str), value, "a string", where, path)


def _need(ok: bool, value: Any, what: str, where: str, path: str) -> None:
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise StateError(f"{where}: {path} must be {what}, got {shown}; refusing to act on it")
