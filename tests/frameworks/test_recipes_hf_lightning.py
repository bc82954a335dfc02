"""The Hugging Face Trainer and Lightning recipes (examples/hf_trainer, examples/lightning;
issue 54 §10), run as a user would: started from their spec files, stopped, and started
again with the same command. Each resumes on that plain start (trainctl hands the newest
complete checkpoint in $TRAINCTL_RESUME_FROM), the checkpoint guard sees its first step at
or past it, and no checkpoint goes back. Tiny models on CPU (the torch extra, with
transformers and lightning as test dependencies)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import Harness, wait_for
from tests.helpers import NEEDS_TORCH
from trainctl.supervisor.model import checkpoints
from trainctl.supervisor.watch.runsteps import run_step_lookup

EXAMPLES = Path(__file__).parents[2] / "examples"
pytestmark = [
    *NEEDS_TORCH,
    pytest.mark.skipif(
        not (importlib.util.find_spec("transformers") and importlib.util.find_spec("lightning")),
        reason="transformers and lightning are not installed (the torch extra installs them)",
    ),
]


def recipe(h: Harness, name: str) -> tuple[Path, list[str]]:
    dest = h.tmp / name
    shutil.copytree(EXAMPLES / name, dest, ignore=shutil.ignore_patterns("__pycache__"))
    spec = dest / "job.toml"
    spec.write_text(spec.read_text().replace('"python3"', f'"{sys.executable}"'))
    return dest, ["start", "-c", str(spec)]


def newest(h: Harness, job: str, run: int, d: Path, pattern: str) -> checkpoints.Verdict | None:
    """The newest complete checkpoint, its step as trainctl reads it (Lightning's
    last.ckpt has none in its name: the run's progress dates it)."""
    at = run_step_lookup(h.home / "jobs" / job, run)
    ones = checkpoints.complete_ones(str(d), pattern, at, want=1, quiet=True)
    return ones[0] if ones else None


def steps(h: Harness, name: str, run: int) -> list[float]:
    p = h.home / "jobs" / name / "logs" / f"run-{run}.progress.jsonl"
    lines = p.read_text().splitlines() if p.exists() else []
    return [float(json.loads(x)["step"]) for x in lines]


@pytest.mark.parametrize(
    ("name", "job", "pattern"),
    [("hf_trainer", "hf", "out/checkpoint-*"), ("lightning", "lit", "out/*.ckpt")],
)
def test_the_recipe_resumes_on_a_plain_start_and_its_checkpoint_never_goes_back(
    harness: Harness, name: str, job: str, pattern: str
) -> None:
    h = harness
    d, start = recipe(h, name)
    h.tc(*start, timeout=120, check=True)
    wait_for(lambda: max(steps(h, job, 1), default=0) >= 25, 120, "two saves")
    h.tc("stop", job, timeout=120, check=True)  # SIGTERM: its callback saves, then ends
    before = newest(h, job, 1, d, pattern)
    assert before is not None
    assert before.step is not None
    assert before.step >= 20, before
    res = h.tc(*start, timeout=120, check=True)  # the same command: nothing to change
    assert "resuming from" in res.out, res.out
    log = h.home / "jobs" / job / "logs" / "run-2.log"
    wait_for(lambda: "resuming from" in log.read_text() if log.exists() else False, 120,
             "run 2 to resume")  # fmt: skip
    handed = re.search(r"resuming from (\S+)", log.read_text())
    assert handed is not None
    assert Path(handed.group(1)).resolve() == Path(before.path).resolve()
    wait_for(lambda: max(steps(h, job, 2), default=0) >= before.step + 12, 120, "a save on")
    st = h.state(job)
    assert st["phase"] == "running", st
    assert st["guard"]["first_step"] >= before.step - 2, st["guard"]  # the guard saw it
    after = newest(h, job, 2, d, pattern)
    assert after is not None
    assert after.step is not None
    assert after.step >= before.step  # never back
    if name == "lightning":  # the numbered files no longer pile up: the newest two, last
        kept = sorted(p.name for p in (d / "out").glob("epoch=*.ckpt"))
        assert len(kept) <= 3, kept  # two by top-k, one the stop's own save
    h.tc("stop", job, timeout=120, check=True)
