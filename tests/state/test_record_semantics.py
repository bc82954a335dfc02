"""`@record` behaves as the dataclass it replaces: the same construction (by position or
name, defaults, default factories), the same refusals, the same ==, hash and repr, and a
frozen record refuses assignment. Each case runs against a plain dataclass twin."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import subprocess
import sys
from dataclasses import field

import pytest

from trainctl.supervisor import records
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


@record(frozen=True, compiled=True)
class Hot:
    pid: int
    start: int


@dataclasses.dataclass(frozen=True)
class HotTwin:
    pid: int
    start: int


def test_a_compiled_record_is_the_frozen_dataclass_it_replaces() -> None:
    rec, twin = Hot(1, 2), HotTwin(1, 2)
    assert (rec.pid, rec.start) == (twin.pid, twin.start)
    assert Hot(start=2, pid=1) == rec
    assert rec != Hot(1, 3)
    assert rec != twin
    assert hash(rec) == hash(Hot(1, 2)) == hash(twin)  # both hash the fields' tuple
    assert repr(rec) == repr(twin).replace("HotTwin", "Hot")
    assert {rec: "x"}[Hot(1, 2)] == "x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.pid = 5  # type: ignore[misc]
    for args in ((), (1,), (1, 2, 3)):
        with pytest.raises(TypeError):
            HotTwin(*args)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            Hot(*args)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no defaults"):

        @record(frozen=True, compiled=True)
        class _WithDefault:
            a: int = 0


@record(frozen=True)
class Nested:
    inner: Frozen
    many: list[Frozen] = records.field(default_factory=list)
    by: dict[str, tuple[int, ...]] = records.field(default_factory=dict)
    hidden: int = records.field(default=7, repr=False)


def test_replace_asdict_and_fields_answer_as_dataclasses_does() -> None:
    rec = Nested(Frozen(1, d=[2]), [Frozen(3)], {"k": (4, 5)})
    assert records.asdict(rec) == dataclasses.asdict(rec)  # the lazy __dataclass_fields__
    assert records.asdict(rec)["many"][0]["d"] == []
    assert records.replace(rec, hidden=9) == dataclasses.replace(rec, hidden=9)
    assert records.replace(rec, hidden=9).inner is rec.inner  # shallow, as replace
    with pytest.raises(ValueError, match="init=False"):
        records.replace(Frozen(1), e=3)
    with pytest.raises(ValueError, match="init=False"):
        dataclasses.replace(Frozen(1), e=3)
    ours = [(f.name, f.default, f.init) for f in records.fields(Frozen)]
    theirs = [(f.name, f.default, f.init) for f in dataclasses.fields(Twin)]
    assert [(n, None if d is records.MISSING else d, i) for n, d, i in ours] == [
        (n, None if d is dataclasses.MISSING else d, i) for n, d, i in theirs
    ]
    assert dataclasses.is_dataclass(rec)
    assert "hidden" not in repr(rec)
    assert records.field_names(Twin) == records.field_names(Frozen)


def test_mistakes_a_dataclass_refuses_are_refused_when_the_record_is_made() -> None:
    with pytest.raises(ValueError, match="mutable default"):

        @record()
        class _Mutable:
            a: list[int] = []  # noqa: RUF012

    with pytest.raises(TypeError, match="non-default argument 'b' follows default"):

        @record()
        class _Order:
            a: int = 0
            b: int


def test_a_record_keeps_a_base_records_fields_first() -> None:
    @record(frozen=True)
    class Base:
        a: int
        b: int = 1

    @record(frozen=True)
    class Child(Base):
        c: int = 2

    assert Child(0) == Child(0, 1, 2)
    assert repr(Child(0, c=5)).endswith("Child(a=0, b=1, c=5)")
    assert records.field_names(Child) == ("a", "b", "c")


def test_an_eq_false_record_is_equal_only_to_itself() -> None:
    @record(eq=False)
    class Ident:
        a: int

    one = Ident(1)
    assert one == one  # noqa: PLR0124  (identity is the point)
    assert one != Ident(1)
    assert {one: 1}[one] == 1


def test_making_and_using_records_never_imports_dataclasses() -> None:
    """The point of records.py: `status` and `start` pay for no dataclasses/inspect."""
    code = (
        "import sys\n"
        "from trainctl.supervisor.records import record, field, replace, asdict\n"
        "@record(frozen=True)\n"
        "class A:\n"
        "    x: int\n"
        "    y: list[int] = field(default_factory=list)\n"
        "a = replace(A(1), x=2)\n"
        "assert asdict(a) == {'x': 2, 'y': []}\n"
        "hash(A(1, ()))\n"
        "print(sorted(m for m in ('dataclasses', 'inspect') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[]", out
