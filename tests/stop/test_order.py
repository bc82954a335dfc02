"""Stop orders on a stdlib tree that needs its loaders alive to checkpoint (the fast tier).

tests/trees/loader_ranks.py behaves like a PyTorch rank with DataLoader workers: a loader
killed under its rank makes the rank crash without a checkpoint. The default `tree` order
must let every rank checkpoint; `all` must reproduce the crash, so the difference is
proven on the same tree.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import Harness
from tests.helpers import stop_and_check
from trainctl.launcher.ops import runview


def _start(h: Harness, *args: str, grace: float = 10, extra: tuple[str, ...] = ()) -> None:
    h.start_tree("job", "loader_ranks.py", str(h.tmp), *args, grace=grace, extra=extra)


def _ckpts(h: Harness) -> tuple[list[str], list[str]]:
    done = sorted(p.name for p in h.tmp.glob("rank*.ckpt"))
    crashed = sorted(p.name for p in h.tmp.glob("rank*.crash"))
    return done, crashed


def test_tree_order_lets_a_rank_checkpoint_with_its_loaders(mode_harness: Harness) -> None:
    h = mode_harness
    _start(h)
    h.bystander("loader_ranks.py", str(h.tmp / "by"))
    doc = stop_and_check(h, "job")
    report = doc["report"]
    assert _ckpts(h) == (["rank0.ckpt"], [])
    assert report["order"] == "tree"
    assert report["killed"] == 0
    assert (report["held"] > 0) == (h.settle_s > 0), report
    assert doc["exit_code"] == 0
    # main got the signal; its two loaders were shut down by main itself, never signalled
    assert [p["pid"] for p in report["sent"]] == [h.state("job")["main"]["pid"]]
    assert report["exited_unsignalled"] == 2
    # ... each named with when it went, so the stop's timeline shows every member
    loaders = report["unsignalled"]
    assert len(loaders) == 2, loaders
    assert all(0 <= p["at_s"] <= report["total_s"] for p in loaders), loaders
    timeline = runview.stop_timeline(h.home, "job")
    assert timeline is not None
    assert sum("exited, unsignalled" in e.text for e in timeline.entries) == 2


def test_tree_order_skips_a_launcher_for_its_ranks(mode_harness: Harness) -> None:
    h = mode_harness
    _start(h, "--launcher", "--ranks", "2")
    main = h.state("job")["main"]["pid"]
    ps = h.tc("ps", "job", "--json", check=True).json()
    assert isinstance(ps, list)
    roles = {r["pid"]: r["stop_role"] for r in ps}
    assert roles[main].startswith("launcher")
    assert sorted(roles.values()).count("first") == 2  # the two ranks
    doc = stop_and_check(h, "job")
    report = doc["report"]
    assert _ckpts(h) == (["rank0.ckpt", "rank1.ckpt"], [])
    assert [lau["pid"] for lau in report["launchers"]] == [main]
    assert "own sessions" in report["launchers"][0]["why"]
    assert (report["held"] > 0) == (h.settle_s > 0), report
    assert report["killed"] == 0
    assert doc["exit_code"] == 0  # the launcher saw every rank succeed
    first = {p["pid"]: p["at_s"] for p in report["sent"]}
    assert main not in first or first[main] > min(first.values())  # never before its ranks


@pytest.mark.parametrize("args", [(), ("--launcher",)], ids=["plain", "launcher"])
def test_all_order_kills_the_loaders_under_the_rank(harness: Harness, args: tuple[str]) -> None:
    h = harness
    _start(h, *args)
    doc = stop_and_check(h, "job", "--order", "all")
    done, crashed = _ckpts(h)
    assert crashed, "order all should reproduce the crash the tree order prevents"
    assert not done
    assert doc["report"]["order"] == "all"


def test_main_order_signals_the_rest_once_main_exited(harness: Harness) -> None:
    h = harness
    sigs = h.tmp / "signals.txt"
    h.start_tree(
        "mo", "checkpointer.py", str(h.tmp), "0.5", extra=("--env", f"TREE_SIGNALS={sigs}"), grace=5
    )
    main = h.state("mo")["main"]["pid"]
    doc = stop_and_check(h, "mo", "--main-only")
    report = doc["report"]
    assert report["order"] == "main"
    assert (h.tmp / "ckpt.done").exists()
    # its two children exit on SIGTERM: they got it after main was gone, not SIGKILL
    assert report["killed"] == 0
    sent = {p["pid"]: p for p in report["sent"]}
    assert set(sent) - {main}, report
    main_gone = sent[main]["at_s"] + sent[main]["exit_s"]
    assert all(p["at_s"] >= main_gone for pid, p in sent.items() if pid != main)


def test_stop_order_from_spec_and_config(harness: Harness) -> None:
    h = harness
    spec = h.tmp / "job.toml"
    spec.write_text('stop_order = "all"\n')
    h.start_tree("job", "loader_ranks.py", str(h.tmp), extra=("-c", str(spec)))
    assert json.loads((h.home / "jobs" / "job" / "spec.json").read_text())["stop"]["order"] == "all"
    doc = stop_and_check(h, "job")
    assert doc["report"]["order"] == "all"
    cfg = h.tmp / "config.toml"
    cfg.write_text('[stop]\norder = "main"\n')
    h.start_tree("other", "checkpointer.py", str(h.tmp), "0.1")
    assert stop_and_check(h, "other")["report"]["order"] == "main"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("stop", "job", "--order", "sideways"), "unknown stop order 'sideways'"),
        (("stop", "job", "--order", "all", "--main-only"), "contradicts"),
        (("--home", "{home}", "stop", "job", "--order", ""), "unknown stop order ''"),
    ],
)
def test_bad_order_is_one_line_and_changes_nothing(
    harness: Harness, argv: tuple[str, ...], needle: str
) -> None:
    h = harness
    _start(h)
    before = h.job_pids("job")
    res = h.tc(*(a.format(home=h.home) for a in argv))
    assert res.rc == 2, res
    assert needle in res.err
    assert len(res.err.strip().splitlines()) == 1
    assert h.job_pids("job") == before
    assert h.tc("status", "job").rc == 0
    stop_and_check(h, "job")


@pytest.mark.parametrize(
    "argv",
    [
        ("start", "--name", "x", "--stop-order", "up", "--", "true"),
        ("start", "--name", "x", "--set", "stop_order=up", "--", "true"),
    ],
)
def test_bad_order_at_start_is_refused(harness: Harness, argv: tuple[str, ...]) -> None:
    res = harness.tc(*argv)
    assert res.rc == 2
    assert "unknown stop order 'up'" in res.err
    assert not (harness.home / "jobs" / "x").exists()


def test_a_parent_that_only_waits_for_its_children_does_not_shield_them(
    mode_harness: Harness,
) -> None:
    h = mode_harness
    sigs = h.tmp / "signals.txt"
    h.start_tree("w", "waiting_parent.py", grace=30, extra=("--env", f"TREE_SIGNALS={sigs}"))
    doc = stop_and_check(h, "w")
    report = doc["report"]
    assert report["killed"] == 0  # the children got SIGTERM, not the grace and a SIGKILL
    assert report["signalled"] == 3
    assert report["total_s"] < 10
    assert doc["exit_code"] == 0
    assert sigs.read_text().count("SIGTERM") == 1
