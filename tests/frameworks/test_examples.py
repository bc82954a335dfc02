"""The recipes of examples/ (issue 44 §13), run as a user would: copied out, started from
their spec files, stopped, restarted and deployed, on CPU PyTorch (the torch extra)."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path

import torch

from tests.conftest import Harness, wait_for
from tests.helpers import NEEDS_TORCH

pytestmark = NEEDS_TORCH
EXAMPLES = Path(__file__).parents[2] / "examples"
BIN = str(Path(sys.executable).parent)


def recipe(h: Harness, name: str) -> Path:
    dest = h.tmp / name
    shutil.copytree(EXAMPLES / name, dest)
    spec = dest / "job.toml"  # this interpreter (the venv's python, torchrun)
    text = spec.read_text().replace('"python3"', f'"{sys.executable}"')
    spec.write_text(text.replace('"torchrun"', f'"{BIN}/torchrun"'))
    return dest


def iters(log: str) -> list[int]:
    return [int(n) for n in re.findall(r"^iter (\d+):", log, re.M)]


def test_the_nanogpt_shaped_recipe_stops_at_its_save_and_deploys_resuming(
    harness: Harness,
) -> None:
    h = harness
    d = recipe(h, "nanogpt_shape")
    h.tc("start", "-c", str(d / "job.toml"), check=True)
    ckpt = d / "out" / "ckpt.pt"
    wait_for(ckpt.exists, 60, "its first save")
    plan = h.tc("stop", "gpt", "--dry-run", "--json", check=True).json()
    assert "next-checkpoint" in plan["can_at"]
    assert "checkpoint" not in plan["can_at"]  # no handler: nothing catches SIGUSR2
    # new code, resuming by its own flag: the spec says so, deploy --reload takes it
    spec = d / "job.toml"
    spec.write_text(spec.read_text().replace("--init_from=scratch", "--init_from=resume"))
    res = h.tc("deploy", "gpt", "--reload", "--health", "60s", "--json", timeout=180)
    assert res.rc == 0, res
    rep = res.json()
    handed = rep["checkpoint_step"]
    assert handed is not None
    assert handed > 0
    log2 = (h.home / "jobs" / "gpt" / "logs" / "run-2.log").read_text()
    found = re.search(r"resuming from iteration (\d+)", log2)
    assert found, log2[-500:]
    assert int(found.group(1)) >= handed - 2  # the gate's own check, seen from outside
    # a stop at its next save loses only the steps of the stop itself
    res = h.tc("stop", "gpt", "--at", "next-checkpoint", timeout=120)
    assert res.rc == 0, res
    saved = torch.load(ckpt, weights_only=True)["iter_num"]
    done = max(iters((h.home / "jobs" / "gpt" / "logs" / "run-2.log").read_text()))
    assert done - saved <= 15, (done, saved)  # a plain stop loses up to 25


def test_the_torchrun_ddp_recipe_checkpoints_on_demand_and_restarts_from_it(
    harness: Harness,
) -> None:
    h = harness
    d = recipe(h, "torchrun_ddp")
    h.tc("start", "-c", str(d / "job.toml"), check=True)
    progress = h.home / "jobs" / "ddp" / "logs" / "run-1.progress.jsonl"
    wait_for(lambda: progress.exists() and len(progress.read_text().splitlines()) > 10, 90, "steps")
    res = h.tc("stop", "ddp", "--at", "checkpoint", timeout=120)
    assert res.rc == 0, res
    saved = sorted((d / "out").glob("step_*.pt"))
    assert saved, "no checkpoint"
    assert all(Path(f"{p}.complete").exists() for p in saved)  # marked by the trainer
    step = int(torch.load(saved[-1], weights_only=True)["step"])
    h.tc("restart", "ddp", timeout=120, check=True)
    log = h.home / "jobs" / "ddp" / "logs" / "run-2.log"
    wait_for(lambda: log.exists() and "resumed from" in log.read_text(), 90, "the resume")
    assert f"at step {step}" in log.read_text()
    status = h.tc("status", "ddp", "--json", check=True).json()
    assert status["checkpoint"]["step"] >= step
    time.sleep(0.5)
    h.tc("stop", "ddp", timeout=120, check=True)
    assert json.loads(progress.read_text().splitlines()[-1])["step"] >= 10
