"""Stop orders without processes: launcher recognition and who is due under all / main.

Protection (SigCgt) and the structural launcher rule read /proc of live processes; the
e2e tests (test_stop_order.py, test_torch_stop.py) cover them on real trees.
"""

from __future__ import annotations

import pytest

from trainctl.supervisor.errors import ConfigError
from trainctl.supervisor.linux.procfs import Stat
from trainctl.supervisor.model.spec import StopOrder, parse_order
from trainctl.supervisor.tree.forest import Planner, launcher_by_cmdline
from trainctl.supervisor.tree.proctree import Member

PY = "/venv/bin/python3"


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [
        ([PY, "/venv/bin/torchrun", "--nproc-per-node", "8", "train.py"], "torchrun"),
        (["torchrun", "train.py"], "torchrun"),
        ([PY, "-u", "-m", "torch.distributed.run", "train.py"], "python -m torch.distributed.run"),
        (
            [PY, "-X", "dev", "-m", "torch.distributed.launch", "t.py"],
            "python -m torch.distributed.launch",
        ),
        (
            ["python", "-m", "torch.distributed.launch", "t.py"],
            "python -m torch.distributed.launch",
        ),
        (["/usr/bin/accelerate", "launch", "train.py"], "accelerate launch"),
        ([PY, "/venv/bin/accelerate", "launch", "train.py"], "accelerate launch"),
        ([PY, "/venv/bin/deepspeed", "train.py"], "deepspeed"),
        (["accelerate", "config"], None),
        ([PY, "train.py", "--launcher", "torchrun"], None),  # merely mentions it
        ([PY, "-m", "torch.distributed.run.not"], None),
        ([PY], None),
        ([PY, "-m"], None),
        ([], None),
    ],
)
def test_launcher_by_cmdline(argv: list[str], launcher: str | None) -> None:
    assert launcher_by_cmdline(argv) == launcher


@pytest.mark.parametrize("raw", ["tree", "ALL", " main "])
def test_parse_order_accepts_the_three(raw: str) -> None:
    assert parse_order(raw) in tuple(StopOrder)


@pytest.mark.parametrize("raw", ["", "trees", "none", 1, None])
def test_parse_order_refuses_the_rest(raw: object) -> None:
    with pytest.raises(ConfigError, match="unknown stop order"):
        parse_order(raw)


# pids far above pid_max: /proc has nothing for them, so nobody "catches" the signal
def _m(pid: int, ppid: int, start: int = 100) -> Member:
    return Member(Stat(pid, "x", "S", ppid, pid, pid, 0, 0, start, 0))


MAIN = _m(10_000_001, 1)
KID = _m(10_000_002, MAIN.stat.pid, 101)
GRANDKID = _m(10_000_003, KID.stat.pid, 102)
ESCAPER = _m(10_000_004, 1, 103)


def test_order_all_signals_everyone_once() -> None:
    plan = Planner(StopOrder.ALL, 15, MAIN.ref)
    live = [MAIN, KID, GRANDKID, ESCAPER]
    assert plan.due(live) == live
    plan.sent.update(dict.fromkeys((m.ref for m in live), 0.0))
    assert plan.due(live) == []


def test_order_main_waits_for_main() -> None:
    plan = Planner(StopOrder.MAIN, 15, MAIN.ref)
    assert plan.due([MAIN, KID, ESCAPER]) == [MAIN]
    plan.sent[MAIN.ref] = 0.0
    assert plan.due([MAIN, KID, ESCAPER]) == []
    assert {m.ref for m in plan.due([KID, ESCAPER])} == {KID.ref, ESCAPER.ref}


def test_tree_without_handlers_signals_everyone_at_once() -> None:
    plan = Planner(StopOrder.TREE, 15, MAIN.ref)
    assert {m.ref for m in plan.due([MAIN, KID, GRANDKID, ESCAPER])} == {
        m.ref for m in (MAIN, KID, GRANDKID, ESCAPER)
    }


def test_a_recycled_ppid_is_not_a_parent() -> None:
    # a "child" that started before its supposed parent: the ppid was recycled
    older = _m(10_000_005, MAIN.stat.pid, start=50)
    plan = Planner(StopOrder.TREE, 15, MAIN.ref)
    plan._protects[MAIN.ref] = True  # as if main caught the signal
    assert {m.ref for m in plan.due([MAIN, older, KID])} == {MAIN.ref, older.ref}


def test_tree_protects_below_a_catching_parent_until_it_exits() -> None:
    plan = Planner(StopOrder.TREE, 15, MAIN.ref)
    plan._protects[MAIN.ref] = True
    assert [m.ref for m in plan.due([MAIN, KID, GRANDKID])] == [MAIN.ref]
    plan.sent[MAIN.ref] = 0.0
    assert plan.due([MAIN, KID, GRANDKID]) == []
    # main exited: its child is a root now and, catching nothing, shields nobody
    assert {m.ref for m in plan.due([KID, GRANDKID])} == {KID.ref, GRANDKID.ref}


def test_a_launcher_lingers_before_its_own_signal() -> None:
    plan = Planner(StopOrder.TREE, 15, MAIN.ref, launcher_linger_s=60)
    plan.launchers[MAIN.ref] = "torchrun"
    assert [m.ref for m in plan.due([MAIN, KID])] == [KID.ref]
    plan.sent[KID.ref] = 0.0
    assert plan.due([MAIN]) == []  # workers gone: it may exit by itself first
    now = Planner(StopOrder.TREE, 15, MAIN.ref, launcher_linger_s=0)
    now.launchers[MAIN.ref] = "torchrun"
    assert now.due([MAIN]) == [MAIN]
