"""A checkpoint kept safe while a run that might overwrite it proves itself: the one a
deploy hands to new code, and the one every start hands (the checkpoint guard,
supervisor/watch/guard.py).

New code that starts over (its resume flag missing, a changed path) overwrites the
checkpoint it was given: nanoGPT's ``ckpt.pt`` went from iteration 10,150 to 650 that
way, and the deploy was called a success. So before anything is stopped, the handed
checkpoint is kept aside under ``<job>/deploys/<id>.kept/``:

- a reflink (``FICLONE``: btrfs, XFS, bcachefs, OverlayFS over them), which costs no
  space and a few milliseconds whatever the size;
- a hard link (:func:`link_tree`), free, where the trainer gives each save a new name (a
  glob with wildcards): a link shares the inode, so it protects a checkpoint from being
  deleted (HF's ``save_total_limit`` rotation) or replaced by rename, not from a rewrite
  in place, which such a trainer does not do;
- else a copy (``copy_file_range``: in-kernel, server-side on NFS 4.2), up to
  ``checkpoint_keep_max``;
- else, when the checkpoint is rewritten in place (a glob without wildcards), a
  refusal before anything is stopped, since nothing would protect it.

On a rollback the kept copy goes back into place if the new code changed the original,
and the new code's own checkpoints that fell behind the handed step are moved aside (to
``<id>.rejected/``), so the newest complete checkpoint never goes back. After the gate
and probation pass, the kept copy is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob as globmod
import os
import shutil
import time
from pathlib import Path
from typing import BinaryIO, Protocol

from trainctl.supervisor.records import record

from . import checkpoints

FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)


class Held(Protocol):
    """A checkpoint as it was handed: its path and identity (a launcher ``Checkpoint``, a
    ``Guard``, a ``Verdict``)."""

    @property
    def path(self) -> str: ...
    @property
    def mtime(self) -> float: ...
    @property
    def size(self) -> int: ...


@record(frozen=True)
class Kept:
    """Where a checkpoint was kept aside, how, and what it cost."""

    path: str
    how: str  # "reflink" | "link" | "copy"
    took_s: float
    size: int


def rewritten_in_place(pattern: str | None) -> bool:
    """A glob without wildcards names one path the trainer writes again and again."""
    return bool(pattern) and not globmod.has_magic(pattern or "")


COPY_CHUNK = 64 << 20  # a copy with a deadline looks at the clock this often


def _reflinked(fin: BinaryIO, fout: BinaryIO) -> bool:
    """``fout`` now shares ``fin``'s extents (FICLONE); False where the file system cannot."""
    try:
        fcntl.ioctl(fout.fileno(), FICLONE, fin.fileno())
    except OSError:
        return False
    return True


def reflink(src: str, dst: str) -> bool:
    """Clone the file ``src`` to a new ``dst`` by reflink only; False, and no ``dst``,
    where the file system has none."""
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        done = _reflinked(fin, fout)
    if not done:
        os.unlink(dst)
        return False
    shutil.copystat(src, dst)
    return True


def _clone_file(src: str, dst: str, deadline: float | None = None) -> str:
    """Clone ``src`` to a new ``dst``: a reflink where the file system has them, else a
    copy, which raises TimeoutError once past ``deadline`` (time.monotonic())."""
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        if _reflinked(fin, fout):
            shutil.copystat(src, dst)
            return "reflink"
        left = os.fstat(fin.fileno()).st_size
        chunk = 1 << 30 if deadline is None else COPY_CHUNK
        while left > 0:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"copying {src} took too long")
            n = os.copy_file_range(fin.fileno(), fout.fileno(), min(left, chunk))
            if n == 0:
                break
            left -= n
    shutil.copystat(src, dst)
    return "copy"


def clone(src: str, dst: str, deadline: float | None = None) -> str:
    """Clone a checkpoint file or directory tree (symlinks kept as links, never followed
    out of the tree); return how ("reflink" if every file was one, else "copy").
    ``deadline`` (time.monotonic()): a copy past it raises TimeoutError."""
    if not os.path.isdir(src):
        return _clone_file(src, dst, deadline)
    hows: set[str] = set()

    def copy(s: str, d: str) -> str:
        hows.add(_clone_file(s, d, deadline))
        return d

    shutil.copytree(src, dst, symlinks=True, copy_function=copy)
    return "copy" if "copy" in hows else "reflink"


def keep(ck: Held, where: Path) -> Kept:
    """Keep ``ck`` aside under ``where`` (created 0700); its name is kept."""
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    t0 = time.monotonic()
    dst = where / os.path.basename(ck.path.rstrip("/"))
    how = clone(ck.path, str(dst))
    return Kept(str(dst), how, time.monotonic() - t0, ck.size)


def changed_since(ck: Held) -> bool:
    """The handed checkpoint's path no longer holds what was handed over."""
    v = checkpoints.judge(ck.path, look_again=False)
    return v is None or (v.mtime, v.size) != (ck.mtime, ck.size)


def restore(kept: str, ck: Held) -> None:
    """Put the kept copy back at the checkpoint's path: cloned beside it, then renamed
    over it (a directory: the changed one is renamed aside first, then removed)."""
    target = ck.path.rstrip("/")
    tmp = f"{target}.trainctl-restore"
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(tmp) if os.path.isdir(tmp) else os.unlink(tmp)
    clone(kept, tmp)
    if os.path.isdir(target) and not os.path.islink(target):
        old = f"{target}.trainctl-replaced"
        os.rename(target, old)
        os.rename(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)


def reject_behind(cwd: str, pattern: str, since: float, step: float, tag: str) -> list[str]:
    """Move aside the complete checkpoints written after ``since`` whose step is behind
    ``step`` (new code that started over), so the newest complete one is the handed one
    again. Each goes to a hidden folder beside it, ``.trainctl-rejected-TAG/`` (same file
    system: a rename; a glob's ``*`` and ``**`` never reach a hidden folder). Returns
    what was moved."""
    moved = []
    for path in checkpoints.candidates(cwd, pattern):
        v = checkpoints.judge(path, look_again=False)
        if v is None or v.mtime <= since or v.step is None or v.step >= step:
            continue
        where = Path(os.path.dirname(path.rstrip("/"))) / f".trainctl-rejected-{tag}"
        with contextlib.suppress(OSError):
            where.mkdir(mode=0o700, exist_ok=True)
            os.rename(path, where / os.path.basename(path.rstrip("/")))
            moved.append(path)
    return moved


def link_tree(src: str, dst: str) -> None:
    """Hard-link a checkpoint file, or every file of a checkpoint directory (symlinks
    kept as links), to ``dst``; OSError (EXDEV, EPERM ...) when the file system will not."""
    if not os.path.isdir(src):
        os.link(src, dst)
        return
    shutil.copytree(src, dst, symlinks=True, copy_function=os.link)


def discard(kept: str | None) -> None:
    """Remove a kept copy (the new code passed its gate and probation)."""
    if kept is None:
        return
    parent = Path(kept).parent
    shutil.rmtree(parent, ignore_errors=True)
