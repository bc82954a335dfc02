"""Which file is the code of a job: the entry script behind every usual launcher form."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.watch.drift import code_version, drift, entry_script


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["python", "train.py", "--cfg", "a.yaml"], "train.py"),
        (["/venv/bin/python3", "-u", "train.py"], "train.py"),
        (["torchrun", "--standalone", "--nproc-per-node", "8", "train.py"], "train.py"),
        (["accelerate", "launch", "--num_processes", "2", "train.py"], "train.py"),
        (["deepspeed", "--num_gpus", "8", "train.py", "--deepspeed"], "train.py"),
        (["python", "-m", "pkg.train", "--lr", "1"], "pkg/train.py"),
        (["python", "-m", "pkg"], "pkg/__main__.py"),
        (
            ["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"],
            "train.py",
        ),
        (["sleep", "600"], None),
    ],
)
def test_entry_script(tmp_path: Path, argv: list[str], expected: str | None) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("")
    (tmp_path / "pkg" / "__main__.py").write_text("")
    spec = Spec(name="j", argv=tuple(argv), cwd=str(tmp_path), env={})
    got = entry_script(spec)
    assert got == (None if expected is None else str(tmp_path / expected))


def test_drift_compares_content_not_commits(tmp_path: Path) -> None:
    """A real repository: a commit of the very changes a run started with, or an empty
    commit, is not a code change; a commit of new content is, and so is a lost commit."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    (repo / "train.py").write_text("v1\n")
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "v1"], check=True)
    (repo / "train.py").write_text("v2\n")  # the run starts with an uncommitted edit
    spec = Spec(name="t", argv=("python", "train.py"), cwd=str(repo), env={})
    at_start = code_version(spec)
    assert at_start is not None
    assert at_start.dirty is True
    assert drift(at_start, spec) == []
    subprocess.run([*git, "commit", "-qam", "the same bytes"], check=True)
    assert drift(at_start, spec) == []
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "empty"], check=True)
    assert drift(at_start, spec) == []
    (repo / "train.py").write_text("v3\n")
    subprocess.run([*git, "commit", "-qam", "v3"], check=True)
    changes = drift(at_start, spec)
    assert any(c.startswith(f"git HEAD {str(at_start.git_head)[:8]} -> ") for c in changes)
    assert "train.py edited" in changes
    gone = dataclasses.replace(at_start, git_head="0" * 40)  # a start commit the repository lost
    assert any(c.startswith("git HEAD 00000000 -> ") for c in drift(gone, spec))
    # never handed to git as an option
    odd = dataclasses.replace(at_start, git_head="--output=/tmp/x")
    assert any(c.startswith("git HEAD --output -> ") for c in drift(odd, spec))
