"""The one relaunch planner (issue 55 §2), fact by fact: pure, no files, no driver. The
supervisor's relaunch and rollback, `restart` and a deploy ask it; the tests that drive
those paths for real are in tests/gpu/test_gpu_healing.py and tests/keeper/."""

from __future__ import annotations

from trainctl.supervisor.model.relaunch import GPUS_LOST, Candidate, Facts, Handed, plan

NEW = Candidate("out/ckpt-20.pt", 20.0, 200.0, 10)
OLD = Candidate("out/ckpt-10.pt", 10.0, 100.0, 10)


def test_the_newest_complete_checkpoint_on_every_gpu_asked() -> None:
    p = plan(Facts(asked=("0", "1"), complete=(NEW, OLD)))
    assert (p.gpus, p.resume, p.skipped, p.refused) == (("0", "1"), NEW.path, None, None)
    assert plan(Facts()).resume is None  # nothing complete: nothing handed


def test_the_one_before_once_when_the_run_failed_on_the_newest() -> None:
    handed = Handed(NEW.path, 20.0)
    failed = Facts(complete=(NEW, OLD), failed=True, handed=handed, tolerance=2.0)
    p = plan(failed)
    assert (p.resume, p.skipped) == (OLD.path, NEW.path)
    again = Facts(complete=(NEW, OLD), failed=True, handed=handed, tried=frozenset({OLD.path}))
    assert plan(again).resume == NEW.path  # once: it was tried already
    assert plan(Facts(complete=(NEW, OLD), handed=handed)).resume == NEW.path  # a user's stop
    on = Facts(complete=(NEW, OLD), failed=True, handed=Handed(OLD.path, 10.0), tolerance=2.0)
    assert plan(on).resume == NEW.path  # it saved past what it was handed: not a bad one


def test_a_checkpoint_rewritten_in_place_is_the_same_by_step_not_by_path() -> None:
    last = Candidate("last.ckpt", 30.0, 300.0, 10)
    before = Candidate("epoch=1.ckpt", 25.0, 250.0, 10)
    handed = Handed("last.ckpt", 20.0)  # the same path, rewritten by a run that advanced
    p = plan(Facts(complete=(last, before), failed=True, handed=handed, tolerance=2.0))
    assert p.resume == "last.ckpt"
    unknown = Handed("last.ckpt", None, 300.0, 10, mark="last.ckpt")  # no steps: identity
    p = plan(Facts(complete=(Candidate("last.ckpt", None, 300.0, 10), before), failed=True,
                   handed=unknown))  # fmt: skip
    assert (p.resume, p.skipped) == ("epoch=1.ckpt", "last.ckpt")


def test_a_verbs_own_checkpoint_wins() -> None:
    p = plan(Facts(complete=(NEW, OLD), failed=True, handed=Handed(NEW.path, 20.0),
                   pinned=OLD.path))  # fmt: skip
    assert (p.resume, p.skipped) == (OLD.path, None)


def test_gpus_lost_or_held_are_left_out_only_as_min_gpus_allows() -> None:
    facts = Facts(asked=("0", "1", "2", "3"), unhealthy=frozenset({"2"}), min_gpus=3,
                  named=(("2", "unhealthy (Xid 79: reboot needed)"),))  # fmt: skip
    p = plan(facts)
    assert (p.gpus, p.left_out, p.refused) == (("0", "1", "3"), ("2",), None)
    held = plan(Facts(asked=("0", "1", "2", "3"), unhealthy=frozenset({"2"}),
                      held=frozenset({"0"}), min_gpus=3))  # fmt: skip
    assert held.refused == GPUS_LOST
    assert held.why == ("GPU 0 is still held, GPU 2 is unhealthy: 2 of 4 GPU(s) left, min_gpus 3")
    none = plan(Facts(asked=("0", "1"), unhealthy=frozenset({"1"}),
                      named=(("1", "unhealthy (Xid 79: reboot needed)"),)))  # fmt: skip
    assert none.refused == GPUS_LOST
    assert none.why == (
        "GPU 1 is unhealthy (Xid 79: reboot needed): 1 of 2 GPU(s) left, min_gpus is not set"
    )
    assert none.resume is None  # no next run: no checkpoint chosen either
