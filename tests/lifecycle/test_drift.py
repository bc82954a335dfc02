"""Which file is the code of a job: the entry script behind every usual launcher form."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainctl.supervisor.drift import entry_script
from trainctl.supervisor.spec import Spec


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
