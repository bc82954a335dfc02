"""`trainctl deploy` on a real torchrun job (CPU, gloo, 2 ranks): the new code resumes at
the checkpoint's step, and `history` shows both commits."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import TREES, Harness, wait_for
from tests.helpers import NEEDS_TORCH, free_port

pytestmark = NEEDS_TORCH

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]


def _head(r: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(r), "rev-parse", "HEAD"], capture_output=True, check=True
    )
    return out.stdout.decode().strip()


def test_a_ddp_run_takes_a_deploy_and_resumes_at_its_checkpoint(harness: Harness) -> None:
    h = harness
    r, ck = h.tmp / "repo", h.tmp / "ck"
    r.mkdir()
    ck.mkdir()
    shutil.copy(TREES / "torch_deploy.py", r / "train.py")
    subprocess.run([*GIT, "-C", str(r), "init", "-q"], check=True)
    subprocess.run([*GIT, "-C", str(r), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(r), "commit", "-qm", "v1"], check=True)
    v1 = _head(r)
    h.tc(
        "start", "--name", "ddp", "--cwd", str(r), "--grace", "20", "--env", "OMP_NUM_THREADS=1",
        "--set", "snapshot=git", "--set", f"checkpoint={ck}/ckpt-*.pt",
        "--", TORCHRUN, "--standalone", "--nproc-per-node", "2", f"--master-port={free_port()}",
        "train.py", str(ck),
        check=True,
    )  # fmt: skip
    log1 = h.home / "jobs" / "ddp" / "logs" / "run-1.log"
    wait_for(lambda: log1.exists() and log1.read_text().count(" v1 ") == 2, 90, "both ranks")
    text = (r / "train.py").read_text().replace("VERSION = 1", "VERSION = 2")
    (r / "train.py").write_text(text)
    subprocess.run([*GIT, "-C", str(r), "commit", "-qam", "v2"], check=True)
    v2 = _head(r)
    res = h.tc("deploy", "ddp", "--health", "120s", "--json", timeout=240)
    assert res.rc == 0, res
    rep = res.json()
    assert rep["outcome"] == "deployed"
    ckpt = rep["checkpoint"]
    import torch  # noqa: PLC0415  (NEEDS_TORCH: only here)

    at = int(torch.load(ckpt, weights_only=True)["step"])
    log2 = (h.home / "jobs" / "ddp" / "logs" / "run-2.log").read_text()
    for rank in (0, 1):
        assert f"rank {rank} v2 resumed={ckpt} step={at}" in log2, log2
    assert rep["resumed_step"] > at  # the new run's first step is past the checkpoint's
    rows = h.tc("history", "ddp", "--json", check=True).json()
    assert [row["commit"] for row in rows] == [v1, v2]
    assert rows[0]["phase"] == "stopped"
    stop = h.tc("stop", "ddp", "--json", timeout=120)
    assert stop.rc == 0, stop
