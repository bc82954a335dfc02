"""Keeping a deploy's checkpoint safe (launcher/ops/keepsafe.py) on real file systems: a
copy on this machine's, a reflink on an XFS image (loop-mounted; root and xfsprogs)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainctl.launcher.results import Checkpoint
from trainctl.supervisor.model import keepsafe


def ckpt_of(path: Path) -> Checkpoint:
    st = os.stat(path)
    return Checkpoint(str(path), st.st_mtime, st.st_size)


def test_keep_restore_and_reject_on_a_plain_file_system(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    ck = out / "ckpt.pt"
    ck.write_bytes(b"step 100" * 1000)
    handed = ckpt_of(ck)
    kept = keepsafe.keep(handed, tmp_path / "kept")
    assert kept.how in ("copy", "reflink")
    assert Path(kept.path).read_bytes() == ck.read_bytes()
    assert not keepsafe.changed_since(handed)
    time.sleep(0.01)
    ck.write_bytes(b"step 3")  # new code that started over, in place
    assert keepsafe.changed_since(handed)
    keepsafe.restore(kept.path, handed)
    assert ck.read_bytes() == b"step 100" * 1000
    # a folder checkpoint (DCP): kept and put back whole
    d = out / "step_100"
    d.mkdir()
    (d / "__0_0.distcp").write_bytes(b"a" * 10)
    (d / ".metadata").write_bytes(b"m")
    dk = keepsafe.keep(ckpt_of(d), tmp_path / "kept2")
    shutil.rmtree(d)
    d.mkdir()
    (d / "__0_0.distcp").write_bytes(b"zz")
    keepsafe.restore(dk.path, ckpt_of(d))
    assert (d / "__0_0.distcp").read_bytes() == b"a" * 10
    assert not list(out.glob("*.trainctl-*"))  # nothing left beside it
    # the new code's own checkpoints behind the handed step move to a hidden folder
    behind = out / "step_000020.pt"
    behind.write_bytes(b"x")
    ahead = out / "step_000200.pt"
    ahead.write_bytes(b"y")
    moved = keepsafe.reject_behind(str(out), "step_*.pt", handed.mtime, 100.0, "d1")
    assert moved == [str(behind)]
    assert (out / ".trainctl-rejected-d1" / "step_000020.pt").exists()
    assert ahead.exists()
    assert keepsafe.rewritten_in_place("out/ckpt.pt")
    assert not keepsafe.rewritten_in_place("out/step_*.pt")


@contextlib.contextmanager
def xfs(tmp: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mkfs.xfs") is None:
        pytest.skip("needs root and xfsprogs (mkfs.xfs) for a reflink-capable file system")
    img, mnt = tmp / "xfs.img", tmp / "mnt"
    with open(img, "wb") as f:
        f.truncate(512 << 20)
    subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(img)], check=True)
    mnt.mkdir()
    if subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=False).returncode:
        pytest.skip("cannot loop-mount here (no loop devices in this container)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_reflink_keeps_a_checkpoint_for_no_space_and_no_time(tmp_path: Path) -> None:
    with xfs(tmp_path) as mnt:
        ck = mnt / "ckpt.pt"
        ck.write_bytes(os.urandom(64 << 20))
        os.sync()  # a clone waits for the file's writeback: measure the clone alone
        kept = keepsafe.keep(ckpt_of(ck), mnt / "kept")
        assert kept.how == "reflink"
        assert kept.took_s < 1.0  # ~0.2 ms here; generous: a hang, not a speed target
        assert Path(kept.path).read_bytes() == ck.read_bytes()
