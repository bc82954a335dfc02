"""Snapshots in the usual repository layout (issue 46 §5): `data/` and `checkpoints/` are
git-ignored and reached by relative paths. Under `snapshot = "git"` the run executes in
`<job>/snapshots/run-N/`; it must still read its data and write its checkpoints where the
user (and the next run) look. Under `snapshot = "copy"`, every file of the tree is the
code, not only the entry script; `history` tells two dirty runs of one commit apart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import Harness, wait_for
from tests.keeper.test_deploy import GIT, log, progress

TRAINER = """\
import json, os, signal, sys, time
from helper import VERSION
vocab = open("data/vocab.txt").read().split()
step = 0
resume = os.environ.get("TRAINCTL_RESUME_FROM")
if resume:
    step = int(open(resume).read())
print(f"v{VERSION} vocab={len(vocab)} resumed={resume} step={step}", flush=True)
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
os.makedirs("checkpoints", exist_ok=True)
while not stop:
    step += 1
    time.sleep(0.05)
    with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:
        f.write(json.dumps({"step": step, "t": time.time()}) + "\\n")
    if step % 10 == 0:
        with open(f"checkpoints/step_{step:06d}.txt", "w") as f:
            f.write(str(step))
"""


def repo(h: Harness) -> Path:
    r = h.tmp / "repo"
    (r / "data").mkdir(parents=True)
    (r / "data" / "vocab.txt").write_text("a b c d\n")  # ignored: in no commit
    (r / ".gitignore").write_text("data/\ncheckpoints/\n")
    (r / "train.py").write_text(TRAINER)
    (r / "helper.py").write_text("VERSION = 1\n")
    subprocess.run([*GIT, "-C", str(r), "init", "-q"], check=True)
    subprocess.run([*GIT, "-C", str(r), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(r), "commit", "-qm", "v1"], check=True)
    return r


def start(h: Harness, name: str, r: Path, snapshot: str) -> None:
    h.tc(
        "start", "--name", name, "--cwd", str(r), "--grace", "5",
        "--set", f"snapshot={snapshot}", "--set", "checkpoint=checkpoints/step_*.txt",
        "--set", 'snapshot_exclude=[".git", "__pycache__", "data", "checkpoints"]',
        "--", sys.executable, "train.py",
        check=True,
    )  # fmt: skip


def test_a_git_snapshot_reads_data_and_saves_where_the_user_looks(harness: Harness) -> None:
    h = harness
    r = repo(h)
    start(h, "lay", r, "git")
    wait_for(lambda: progress(h, "lay", 1) >= 25, 30, "two saves")
    assert "v1 vocab=4 resumed=None" in log(h, "lay", 1)  # data/ read through the snapshot
    saved = sorted(p.name for p in (r / "checkpoints").glob("step_*.txt"))
    assert saved[:2] == ["step_000010.txt", "step_000020.txt"]  # in the user's own tree
    st = h.tc("status", "lay", "--json", check=True).json()
    assert st["checkpoint"]["path"].startswith(str(r / "checkpoints" / "step_"))
    # the next run (a deploy) resumes from them
    (r / "helper.py").write_text("VERSION = 2\n")
    subprocess.run([*GIT, "-C", str(r), "commit", "-qam", "v2"], check=True)
    res = h.tc("deploy", "lay", "--at", "now", "--health", "30s", "--json", timeout=90)
    assert res.rc == 0, res
    rep = res.json()
    assert rep["outcome"] == "deployed"
    assert rep["checkpoint"].startswith(str(r / "checkpoints"))  # the user's path
    line = next(x for x in log(h, "lay", 2).splitlines() if x.startswith("v2"))
    assert "vocab=4" in line
    assert f"step={rep['checkpoint_step']:g}" in line.replace(".0", "")
    h.tc("stop", "lay", check=True)
    assert (
        not (h.home / "jobs" / "lay" / "snapshots" / "run-2" / "checkpoints")
        .resolve()
        .is_relative_to(h.home)
    )


def test_a_copy_snapshot_counts_every_file_as_code(harness: Harness) -> None:
    h = harness
    r = repo(h)
    start(h, "cp", r, "copy")
    wait_for(lambda: progress(h, "cp", 1) >= 3, 30, "progress")
    assert "v1 vocab=4" in log(h, "cp", 1)  # data/ left out of the copy, linked to
    first = h.tc("status", "cp", "--json", check=True).json()
    assert first["code"]["tree_sha"]
    head = subprocess.run(
        ["git", "-C", str(r), "rev-parse", "HEAD"], capture_output=True, check=True, text=True
    ).stdout.strip()
    assert first["code"]["git_head"] == head  # the commit it was copied from (issue 54 §12)
    (r / "helper.py").write_text("VERSION = 2\n")  # an imported module, not the entry
    changed = h.tc("status", "cp", check=True).out
    assert "CODE CHANGED" in changed
    res = h.tc("deploy", "cp", "--at", "now", "--health", "30s", "--force", timeout=90)
    assert res.rc == 0, res
    wait_for(lambda: "v2 vocab=4" in log(h, "cp", 2), 20, "v2")
    h.tc("stop", "cp", check=True)


def test_history_tells_two_dirty_runs_of_one_commit_apart(harness: Harness) -> None:
    h = harness
    r = repo(h)
    for n, edit in enumerate(("# one\n", "# two\n"), start=1):
        (r / "helper.py").write_text("VERSION = 1\n" + edit)
        start(h, "dd", r, "git")
        wait_for(lambda n=n: progress(h, "dd", n) >= 2, 30, "progress")
        h.tc("stop", "dd", check=True)
    rows = h.tc("history", "dd", "--json", check=True).json()
    codes = [row["code"] for row in rows]
    head = subprocess.run(
        ["git", "-C", str(r), "rev-parse", "HEAD"], capture_output=True, check=True
    ).stdout.decode()[:8]
    assert all(c.startswith(f"{head}+") for c in codes), codes
    assert codes[0] != codes[1]
    assert json.dumps(codes)
