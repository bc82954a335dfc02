"""NVIDIA's action table, as trainctl acts on it (issue 47 §1): each class of Xid gives
its action, the driver's recovery action overrides the table, an unknown number is never
guessed at, and the breaker counts only the application's faults (pure: no processes)."""

from __future__ import annotations

import pytest

from trainctl.supervisor.gpu import xid
from trainctl.supervisor.life import policy
from trainctl.supervisor.model.reports import Cause, RestartEntry
from trainctl.supervisor.model.spec import GpuBinding, RestartPolicy, Spec


@pytest.mark.parametrize(
    ("code", "klass", "action", "unhealthy"),
    [
        (13, xid.RESTART_APP, "restart the application", False),
        (31, xid.RESTART_APP, "restart the application", False),
        (94, xid.RESTART_APP, "restart the application", False),
        (64, xid.RESET_GPU, "GPU reset needed", True),
        (95, xid.RESET_GPU, "GPU reset needed", True),
        (119, xid.RESET_GPU, "GPU reset needed", True),
        (79, xid.REBOOT, "reboot needed", True),
        (43, xid.INFO, "informational", False),
        (63, xid.INFO, "informational", False),
        (92, xid.INFO, "informational", False),
        (4242, xid.UNKNOWN, "not in NVIDIA's catalog here: not acted on", False),
    ],
)
def test_each_class_of_xid_gives_its_action(
    code: int, klass: str, action: str, unhealthy: bool
) -> None:
    fault = xid.classify(2, code)
    assert (fault.gpu, fault.xid, fault.klass) == (2, code, klass)
    assert fault.unhealthy is unhealthy
    assert fault.line("03:12:00").startswith(f"GPU 2 Xid {code} (")
    assert fault.line("03:12:00").endswith(f"; {action}) at 03:12:00")


def test_an_unknown_xid_keeps_its_number() -> None:
    assert xid.classify(0, 4242).line("t") == (
        "GPU 0 Xid 4242 (an Xid trainctl does not know; "
        "not in NVIDIA's catalog here: not acted on) at t"
    )


@pytest.mark.parametrize(
    ("action", "klass"),
    [(1, xid.RESET_GPU), (2, xid.REBOOT), (3, xid.RESET_GPU), (4, xid.RESET_GPU),
     (5, xid.RESTART_APP), (6, xid.RESET_GPU), (7, xid.REBOOT), (99, xid.UNKNOWN)],
)  # fmt: skip
def test_the_drivers_recovery_action_overrides_the_table(action: int, klass: str) -> None:
    over = xid.from_recovery(1, action, xid.classify(1, 13))
    assert over is not None
    assert (over.gpu, over.xid, over.klass) == (1, 13, klass)
    assert over.what.startswith("graphics engine exception; ")
    alone = xid.from_recovery(1, action)
    assert alone is not None
    assert (alone.xid, alone.klass) == (None, klass)
    if action == 99:
        assert alone.what == "the driver reports recovery action 99"


def test_no_recovery_action_is_no_fault() -> None:
    assert xid.from_recovery(1, 0, xid.classify(1, 79)) is None
    assert xid.from_recovery(1, 0) is None


SPEC = Spec(
    name="j",
    argv=("true",),
    cwd="/",
    env={},
    restart=RestartPolicy(mode="on-failure", max_restarts=2, backoff_s=1.0),
    gpu=GpuBinding(min_gpus=2),
)
CRASH = Cause("exit", "exit 1", exit_code=1)


def _entries(*kinds: str) -> tuple[RestartEntry, ...]:
    return tuple(RestartEntry(run=i + 1, at=float(i), kind=k) for i, k in enumerate(kinds))


def test_the_breaker_counts_only_the_applications_faults() -> None:
    """Two GPU-fault restarts and one crash restart, max_restarts 2: the crash is the
    application's first and a second one is allowed; two crashes are the budget."""
    healed = _entries("gpu", "gpu", "exit")
    ok = policy.decide(
        SPEC, restarts=3, cause=CRASH, cleaned_up=True, reason="main exited", history=healed
    )
    assert ok.relaunch, ok
    spent = _entries("gpu", "exit", "exit")
    over = policy.decide(
        SPEC, restarts=3, cause=CRASH, cleaned_up=True, reason="main exited", history=spent
    )
    assert not over.relaunch
    assert over.gave_up == "restarts-exhausted", over


def test_a_hardware_fault_heals_past_a_spent_budget_until_too_few_gpus() -> None:
    spent = _entries("exit", "exit")
    heal = policy.decide(
        SPEC, restarts=2, cause=CRASH, cleaned_up=True, reason="gpu fault", history=spent,
        healthy_gpus=2,
    )  # fmt: skip
    assert (heal.relaunch, heal.matched) == (True, "gpu")
    few = policy.decide(
        SPEC, restarts=2, cause=CRASH, cleaned_up=True, reason="gpu fault", healthy_gpus=1
    )
    assert (few.relaunch, few.gave_up) == (False, "too-few-gpus")
    assert few.why == "1 healthy GPU(s) left, fewer than min_gpus 2"
