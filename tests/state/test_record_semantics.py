"""`@record` behaves as the dataclass it replaces: the same construction (by position or
name, defaults, default factories), the same refusals, the same ==, hash and repr, and a
frozen record refuses assignment. Each case runs against a plain dataclass twin."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from dataclasses import field

import pytest

from trainctl.supervisor.records import record


@record(frozen=True)
class Frozen:
    a: int
    b: str = "x"
    c: tuple[int, ...] = ()
    d: list[int] = field(default_factory=list)
    e: int = field(default=0, init=False)


@dataclasses.dataclass(frozen=True)
class Twin:
    a: int
    b: str = "x"
    c: tuple[int, ...] = ()
    d: list[int] = field(default_factory=list)
    e: int = field(default=0, init=False)


@record()
class Open:
    a: int
    b: list[str] = field(default_factory=list)


CALLS: list[tuple[tuple[object, ...], dict[str, object]]] = [
    ((1,), {}),
    ((1, "y"), {}),
    ((1,), {"b": "z", "c": (2,)}),
    ((), {"a": 3, "d": [4]}),
    ((1, "y", (5,), [6]), {}),
]


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_built_as_the_dataclass_is(args: tuple[object, ...], kwargs: dict[str, object]) -> None:
    rec, twin = Frozen(*args, **kwargs), Twin(*args, **kwargs)  # type: ignore[arg-type]
    assert dataclasses.astuple(rec) == dataclasses.astuple(twin)
    assert repr(rec) == repr(twin).replace("Twin", "Frozen")
    assert rec == Frozen(*args, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unhashable type: 'list'"):
        hash(twin)  # a list field: neither hashes
    with pytest.raises(TypeError, match="unhashable type: 'list'"):
        hash(rec)
    assert hash(Frozen(1, d=None)) == hash(Frozen(1, d=None))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "kwargs", "words"),
    [
        ((), {}, "missing required argument 'a'"),
        ((1, "y", (), [], 9), {}, "takes 4 positional arguments but 5 were given"),
        ((1,), {"a": 2}, "multiple values for 'a'"),
        ((1,), {"zz": 2}, "unexpected keyword(s) ['zz']"),
        ((1,), {"e": 2}, "unexpected keyword(s) ['e']"),  # init=False, as a dataclass
    ],
)
def test_refused_as_the_dataclass_refuses(
    args: tuple[object, ...], kwargs: dict[str, object], words: str
) -> None:
    with pytest.raises(TypeError) as twin:
        Twin(*args, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=None) as rec:
        Frozen(*args, **kwargs)  # type: ignore[arg-type]
    assert words in str(rec.value), (str(rec.value), str(twin.value))


def test_a_default_factory_gives_each_record_its_own() -> None:
    one, two = Frozen(1), Frozen(1)
    one.d.append(1)
    assert two.d == []
    assert Open(1).b is not Open(1).b


def test_frozen_refuses_assignment_and_replace_still_works() -> None:
    rec = Frozen(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.a = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del rec.a  # type: ignore[misc]
    assert dataclasses.replace(rec, a=2) == Frozen(2)
    assert dataclasses.asdict(dataclasses.replace(rec, b="q"))["b"] == "q"


def test_equality_is_by_class_and_fields_and_only_frozen_ones_hash() -> None:
    assert Frozen(1) != Frozen(2)
    assert Frozen(1) != Twin(1)
    assert Open(1) == Open(1)
    open_rec = Open(1)
    open_rec.a = 5
    assert open_rec.a == 5
    with pytest.raises(TypeError):
        hash(Open(1))
    assert not hasattr(Frozen(1), "__dict__")  # slotted


def test_what_a_record_does_not_support_is_refused_when_the_class_is_made() -> None:
    with pytest.raises(TypeError, match="no __post_init__"):

        @record()
        class _Post:
            a: int

            def __post_init__(self) -> None: ...

    with pytest.raises(TypeError, match="no keyword-only fields"):

        @record()
        class _Kw:
            a: int = field(kw_only=True)

    with pytest.raises(TypeError, match="no InitVar"):

        @record()
        class _Init:
            a: int
            b: dataclasses.InitVar[int] = 0


def test_copied_and_pickled_as_a_dataclass_is() -> None:
    for rec in (Frozen(1, "y", (2,), [3]), Open(4, ["z"])):
        assert copy.copy(rec) == rec
        deep = copy.deepcopy(rec)
        assert deep == rec
        assert deep is not rec
        assert pickle.loads(pickle.dumps(rec)) == rec  # noqa: S301  (our own bytes)
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.copy(Frozen(1)).a = 2  # type: ignore[misc]
