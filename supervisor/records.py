"""`@record`: a slotted class with a dataclass's semantics, made without ``dataclasses``.

Python 3.11's ``@dataclass`` compiles every generated method with its own ``exec``, looks
at each annotation through regular expressions, and builds the slotted class twice; the
``dataclasses`` module itself imports ``inspect`` (~10 ms). For the records that
`trainctl status`, `stop` and the supervisor's boot import (90-odd), that was about half
of the command's start-up. A record is made here in one pass over its annotations: one
slotted class, and shared methods that read the field plan made then: ``__init__``
(fields by position or name, defaults and default factories, as the generated one takes
them), ``__repr__``, ``__eq__`` and ``__hash__``, ``__getstate__``/``__setstate__`` (copy
and pickle), and for a frozen record guards that refuse assignment
(``dataclasses.FrozenInstanceError``). The semantics are the generated ones: equal only
to an instance of the very same class with equal fields, hashable only when frozen.

``dataclasses.fields``, ``replace``, ``asdict`` and ``is_dataclass`` still work on a record:
its ``__dataclass_fields__`` are made the first time something asks for them (that import
is then paid once). The fast paths use :func:`replace` and :func:`asdict` from here.

``compiled=True`` (the stop's hot loops: ProcRef, MemberSnap, procfs.Stat) compiles
``__init__``, ``__eq__`` and ``__hash__`` for the class, one ``exec`` for the three, as fast
per call as the generated ones. Not supported, and refused when the class is made:
``__post_init__``, ``InitVar``, keyword-only fields, a mutable default, a required field
after one with a default.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar, TypeVar, dataclass_transform, get_origin

T = TypeVar("T")

# A JSON value, and a JSON object: what a record's to_doc() gives (what json.dumps writes)
Json = None | bool | int | float | str | list["Json"] | dict[str, "Json"]
JsonObject = dict[str, Json]


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class Field:
    """One field of a record: what :func:`field` declares, completed when the class is made."""

    __slots__ = ("default", "default_factory", "init", "name", "repr", "type")

    def __init__(self, default: Any, default_factory: Any, init: bool, repr: bool) -> None:
        self.name = ""
        self.type: Any = None
        self.default = default
        self.default_factory = default_factory
        self.init = init
        self.repr = repr

    def __repr__(self) -> str:
        return f"Field({self.name!r}, default={self.default!r}, init={self.init})"


def field(
    *,
    default: Any = MISSING,
    default_factory: Callable[[], Any] | Any = MISSING,
    init: bool = True,
    repr: bool = True,
) -> Any:
    """A field's default, default factory, and whether ``__init__`` and ``repr`` take it."""
    if default is not MISSING and default_factory is not MISSING:
        raise ValueError("cannot specify both default and default_factory")
    return Field(default, default_factory, init, repr)


def fields(cls_or_record: Any) -> tuple[Any, ...]:
    """The fields in order (as ``dataclasses.fields``): a record's without importing
    ``dataclasses``, a plain dataclass's from it."""
    got: tuple[Field, ...] | None = getattr(cls_or_record, "__record_fields__", None)
    if got is None:
        plain: tuple[Any, ...] = _dataclasses().fields(cls_or_record)
        return plain
    return got


def is_record(obj: Any) -> bool:
    """Whether ``obj`` is a record class or a record."""
    return hasattr(obj, "__record_fields__")


def is_structured(obj: Any) -> bool:
    """Whether ``obj`` is a record or a plain dataclass (a class or an instance of one)."""
    return is_record(obj) or hasattr(obj, "__dataclass_fields__")


def field_names(cls: type) -> tuple[str, ...]:
    """The names of the fields of a record class or a plain dataclass class, in order."""
    names: tuple[str, ...] | None = getattr(cls, "_record_names", None)
    if names is None:  # a plain dataclass: its module is loaded already
        names = tuple(f.name for f in _dataclasses().fields(cls))
    return names


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of record ``obj`` with ``changes`` (as ``dataclasses.replace``, which a
    plain dataclass gets)."""
    if not is_record(obj):
        return _dataclasses().replace(obj, **changes)  # type: ignore[no-any-return]
    for f in type(obj).__record_fields__:  # type: ignore[attr-defined]
        if not f.init:
            if f.name in changes:
                raise ValueError(
                    f"field {f.name} is declared with init=False, it cannot be "
                    "specified with replace()"
                )
        elif f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
    return type(obj)(**changes)


def asdict(obj: Any) -> dict[str, Any]:
    """A record as a dict, records inside it as dicts too (as ``dataclasses.asdict``)."""
    if not is_record(obj):
        return _dataclasses().asdict(obj)  # type: ignore[no-any-return]
    return _asdict_inner(obj)  # type: ignore[no-any-return]


def _asdict_inner(obj: Any) -> Any:
    cls = type(obj)
    names: tuple[str, ...] | None = getattr(cls, "_record_names", None)
    if names is not None:
        return {n: _asdict_inner(getattr(obj, n)) for n in names}
    if obj is None or isinstance(obj, str | int | float):  # a str enum too: immutable
        return obj
    if isinstance(obj, list | tuple | dict):
        return _container(obj)
    if hasattr(cls, "__dataclass_fields__"):  # a plain dataclass inside a record
        return _dataclasses().asdict(obj)
    if isinstance(obj, set | frozenset):
        return cls(_asdict_inner(v) for v in obj)
    return obj  # what else records hold is immutable (a Path); asdict would deepcopy it


def _container(obj: list[Any] | tuple[Any, ...] | dict[Any, Any]) -> Any:
    cls: Any = type(obj)
    if isinstance(obj, dict):
        return cls((_asdict_inner(k), _asdict_inner(v)) for k, v in obj.items())
    if hasattr(obj, "_fields"):  # a named tuple, as asdict
        return cls(*[_asdict_inner(v) for v in obj])
    return cls(_asdict_inner(v) for v in obj)


def _dataclasses() -> ModuleType:
    """The dataclasses module, for what only it has: its frozen error, its Field objects
    for code that asks the dataclasses way, a plain dataclass met inside a record."""
    import dataclasses  # noqa: PLC0415  (~10 ms with inspect: only where one is needed)

    return dataclasses


def _frozen_error(text: str) -> AttributeError:
    error: AttributeError = _dataclasses().FrozenInstanceError(text)
    return error


def _repr(self: Any) -> str:
    inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in type(self)._record_shown)
    return f"{type(self).__qualname__}({inner})"


def _values(obj: Any) -> tuple[Any, ...]:
    return tuple([getattr(obj, n) for n in type(obj)._record_names])


def _eq(self: Any, other: object) -> Any:  # bool, or NotImplemented for another class
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self) == _values(other)


def _hash(self: Any) -> int:
    return hash(_values(self))


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    given, rest = cls._record_plan
    if len(args) > len(given):
        raise TypeError(
            f"{cls.__qualname__}() takes {len(given)} positional arguments "
            f"but {len(args)} were given"
        )
    put = object.__setattr__
    for i, (name, default, factory) in enumerate(given):
        if i < len(args):
            if name in kwargs:
                raise TypeError(f"{cls.__qualname__}() got multiple values for {name!r}")
            put(self, name, args[i])
        elif name in kwargs:
            put(self, name, kwargs.pop(name))
        elif default is not MISSING:
            put(self, name, default)
        elif factory is not MISSING:
            put(self, name, factory())
        else:
            raise TypeError(f"{cls.__qualname__}() missing required argument {name!r}")
    if kwargs:  # every name the record knows was taken above
        raise TypeError(f"{cls.__qualname__}() got unexpected keyword(s) {sorted(kwargs)}")
    for name, default, factory in rest:
        put(self, name, factory() if factory is not MISSING else default)


def _getstate(self: Any) -> tuple[Any, ...]:
    return _values(self)


def _setstate(self: Any, state: tuple[Any, ...]) -> None:
    for name, value in zip(type(self)._record_names, state, strict=True):
        object.__setattr__(self, name, value)  # past a frozen record's guard, as __init__


def _frozen_set(self: Any, name: str, value: Any) -> None:
    raise _frozen_error(f"cannot assign to field {name!r}")


def _frozen_del(self: Any, name: str) -> None:
    raise _frozen_error(f"cannot delete field {name!r}")


class _DataclassFields:
    """``__dataclass_fields__`` made on first use, by ``dataclasses`` itself, from a twin
    class with the same annotations and defaults (so ``dataclasses.fields``, ``replace``
    and ``asdict`` see real ``dataclasses.Field`` objects); then kept on the class."""

    def __get__(self, obj: Any, owner: type) -> dict[str, object]:
        dataclasses = _dataclasses()
        mine = fields(owner)
        ns: dict[str, object] = {"__annotations__": {f.name: f.type for f in mine}}
        for f in mine:
            kw: dict[str, object] = {"init": f.init, "repr": f.repr}
            if f.default is not MISSING:
                kw["default"] = f.default
            if f.default_factory is not MISSING:
                kw["default_factory"] = f.default_factory
            ns[f.name] = dataclasses.field(**kw)
        twin: Any = dataclasses.dataclass(
            type(owner.__name__, (), ns), init=False, repr=False, eq=False
        )
        got: dict[str, object] = twin.__dataclass_fields__
        type.__setattr__(owner, "__dataclass_fields__", got)
        return got


def _is_classvar(kind: Any) -> bool:
    if isinstance(kind, str):  # `from __future__ import annotations`: every record's case
        return kind.replace(" ", "").startswith(("ClassVar", "typing.ClassVar"))
    return kind is ClassVar or get_origin(kind) is ClassVar


def _own_annotations(cls: type) -> dict[str, object]:
    ann = cls.__dict__.get("__annotations__")  # noqa: RUF063  (inspect costs ~10 ms)
    if ann is None and "__annotate__" in cls.__dict__:  # Python 3.14's lazy annotations
        ann = cls.__annotations__
    return dict(ann or {})


def _field_of(cls: type, name: str, kind: Any) -> Field:
    if "InitVar" in str(kind):  # a dataclass takes it as an __init__-only argument
        raise TypeError(f"{cls.__qualname__}.{name}: a record has no InitVar")
    if "KW_ONLY" in str(kind):
        raise TypeError(f"{cls.__qualname__}.{name}: a record has no keyword-only fields")
    value = cls.__dict__.get(name, MISSING)
    if isinstance(value, Field):
        f = Field(value.default, value.default_factory, value.init, value.repr)
    elif type(value).__module__ == "dataclasses" and type(value).__name__ == "Field":
        dataclasses = _dataclasses()  # already loaded: the class body used its field()
        if value.kw_only is True:
            raise TypeError(f"{cls.__qualname__}.{name}: a record has no keyword-only fields")
        f = Field(
            MISSING if value.default is dataclasses.MISSING else value.default,
            MISSING if value.default_factory is dataclasses.MISSING else value.default_factory,
            value.init,
            value.repr,
        )
    else:
        f = Field(value, MISSING, True, True)
    if f.default is not MISSING and f.default.__class__.__hash__ is None:
        raise ValueError(
            f"mutable default {type(f.default)} for field {name} is not allowed: "
            "use default_factory"
        )
    f.name, f.type = name, kind
    return f


def _fields_of(cls: type) -> tuple[Field, ...]:
    """The bases' record fields first, then this class's own, in order (as dataclasses)."""
    found: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        for f in base.__dict__.get("__record_fields__", ()):
            found[f.name] = f
    for name, kind in _own_annotations(cls).items():
        if not _is_classvar(kind):
            found[name] = _field_of(cls, name, kind)
    out = tuple(found.values())
    seen_default = None
    for f in out:
        if not f.init:
            continue
        if f.default is not MISSING or f.default_factory is not MISSING:
            seen_default = f.name
        elif seen_default is not None:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
    return out


def _slotted(cls: type, fs: tuple[Field, ...], methods: dict[str, object]) -> type:
    """The class again, with a slot for each field of its own (as ``slots=True`` makes it)
    and ``methods``: made in one call (a setattr on a class each costs as much again)."""
    inherited = {s for base in cls.__mro__[1:] for s in base.__dict__.get("__slots__", ())}
    ns = dict(cls.__dict__)
    for f in fs:
        ns.pop(f.name, None)  # a default lives in the plan, not on the class
    ns.pop("__dict__", None)
    ns.pop("__weakref__", None)
    ns["__slots__"] = tuple(f.name for f in fs if f.name not in inherited)
    for name, value in methods.items():
        if name in ("__repr__", "__eq__", "__hash__") and name in cls.__dict__:
            continue  # the class's own (as @dataclass leaves a written one)
        ns[name] = value
    out = type(cls)(cls.__name__, cls.__bases__, ns)
    out.__qualname__ = cls.__qualname__
    return out


_COMPILED = """\
def __init__(self, {params}):
{sets}
def __eq__(self, other):
    if other.__class__ is not self.__class__:
        return NotImplemented
    return ({mine},) == ({theirs},)
def __hash__(self):
    return hash(({mine},))
"""


def _compile(cls: type, fs: tuple[Field, ...], frozen: bool) -> dict[str, object]:
    """``__init__``, ``__eq__`` and ``__hash__`` for ``cls``, compiled in one exec (only
    plain fields: no defaults of any kind, every one taken by ``__init__``)."""
    if any(not f.init or f.default is not MISSING or f.default_factory is not MISSING for f in fs):
        raise TypeError(f"{cls.__qualname__}: a compiled record takes every field, no defaults")
    names = [f.name for f in fs]
    put = "__put(self, {n!r}, {n})" if frozen else "self.{n} = {n}"
    src = _COMPILED.format(
        params=", ".join(names),
        sets="\n".join("    " + put.format(n=n) for n in names) or "    pass",
        mine=", ".join(f"self.{n}" for n in names),
        theirs=", ".join(f"other.{n}" for n in names),
    )
    made: dict[str, object] = {}
    exec(src, {"__put": object.__setattr__}, made)  # noqa: S102  (our own text, as dataclasses)
    return made


@dataclass_transform(frozen_default=False, field_specifiers=(field,))
def record(
    *, frozen: bool = False, eq: bool = True, compiled: bool = False
) -> Callable[[type[T]], type[T]]:
    """Make ``cls`` a slotted record with the shared init, repr, == and hash (and, frozen,
    the shared guards); ``eq=False``: equal only to itself, hashed by identity, as a
    dataclass's; ``compiled``: its own init, == and hash, for hot loops."""

    def wrap(cls: type[T]) -> type[T]:
        if "__post_init__" in cls.__dict__:
            raise TypeError(f"{cls.__qualname__}: a record has no __post_init__ (a dataclass has)")
        fs = _fields_of(cls)
        methods: dict[str, object] = {
            "__record_fields__": fs,
            "_record_names": tuple(f.name for f in fs),
            "_record_shown": tuple(f.name for f in fs if f.repr),
            "_record_plan": (
                tuple((f.name, f.default, f.default_factory) for f in fs if f.init),
                tuple(
                    (f.name, f.default, f.default_factory)
                    for f in fs
                    if not f.init and (f.default is not MISSING or f.default_factory is not MISSING)
                ),
            ),
            "__match_args__": tuple(f.name for f in fs if f.init),
            "__dataclass_fields__": _DataclassFields(),
            "__init__": _init,
            "__repr__": _repr,
            "__eq__": _eq,
            "__hash__": _hash if frozen else None,
            "__getstate__": _getstate,  # copy and pickle, frozen or not
            "__setstate__": _setstate,
        }
        if compiled:
            made = _compile(cls, fs, frozen)
            methods.update(made if frozen else {**made, "__hash__": None})
        if not eq:  # object's own == and hash: by identity
            del methods["__eq__"], methods["__hash__"]
        if frozen:
            methods["__setattr__"] = _frozen_set
            methods["__delattr__"] = _frozen_del
        return _slotted(cls, fs, methods)

    return wrap
