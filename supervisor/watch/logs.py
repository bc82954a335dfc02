"""Bounded job logs: copytruncate-style rotation of ``logs/run-N.log``.

The job writes its log itself, with O_APPEND (the supervisor is never in the data path),
so the file cannot be renamed away under it: its descriptor would keep writing to the
renamed file. Instead the supervisor copies the log aside and truncates it to zero, through
the descriptor the copy read from, as soon as the copy has read the end; the job's next
write lands at the new end, offset 0. What the job writes between the copy's last read
and the truncation, a few microseconds, is the only loss, the known price of
copytruncate. Everything else (moving older copies up to ``.2`` ... ``.KEEP``, naming
the new copy ``.1``) happens before the copy or after the truncation, outside that window.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from trainctl.supervisor import ids
from trainctl.supervisor.errors import StateError
from trainctl.supervisor.model.state import open_in
from trainctl.supervisor.records import field, record


def size_of(path: Path) -> int:
    """The log's size now (0 when it is not there)."""
    try:
        return os.stat(path, follow_symlinks=False).st_size
    except OSError:
        return 0


@record()
class Pace:
    """When to look at the log next, so that it never grows far past its cap.

    Every ``slowest`` seconds while it grows slowly; sooner when, at the rate it grew
    since the last look, it would pass ``max_bytes`` before then (down to ``fastest``).
    A stat costs ~2 µs, so a log written at 100 MiB/s is looked at 20 times a second and
    overshoots its cap by about one look's worth of writes.
    """

    max_bytes: int
    slowest: float
    fastest: float = 0.05
    rate: float = 0.0  # bytes/s between the last two looks (kept across a rotation)
    _last: tuple[int, float] | None = field(default=None, repr=False)

    def next_look(self, size: int, now: float) -> float:
        """Seconds until the next look, given the log's ``size`` at ``now``."""
        last, self._last = self._last, (size, now)
        # a smaller size: rotated (or truncated by the user); the writer's pace is unchanged
        if last is not None and now > last[1] and size >= last[0]:
            self.rate = (size - last[0]) / (now - last[1])
        if not self.max_bytes or self.rate <= 0:
            return self.slowest
        headroom = max(0, self.max_bytes - size)
        return min(self.slowest, max(self.fastest, headroom / self.rate))


def rotate_if_big(path: Path, max_bytes: int, keep: int) -> int:
    """Rotate ``path`` once it is bigger than ``max_bytes`` (0: never); return its old size.

    The older copies move up first, by hard link + rename, so ``run-N.log.1`` ... never
    disappear, not even for a moment, from a reader's view. The copy goes to a fresh
    temporary file (random name, O_EXCL|O_NOFOLLOW: nothing planted is written through)
    and becomes ``.1`` right after the truncation (until then ``.1`` is the copy before).
    """
    try:
        size = os.stat(path, follow_symlinks=False).st_size
    except OSError:
        return 0
    if not max_bytes or size <= max_bytes:
        return 0
    try:
        if keep > 0:
            for i in range(keep - 1, 0, -1):
                older = path.with_name(f"{path.name}.{i}")
                if os.path.lexists(older):
                    _replace_by_link(older, path.with_name(f"{path.name}.{i + 1}"))
        fresh = _copy_and_truncate(path, copy=keep > 0)
        if fresh is not None:
            os.replace(fresh, path.with_name(f"{path.name}.1"))
    except (OSError, StateError):
        # a full disk (often this very log's doing): the log was emptied all the same (the
        # cap matters more than the copy), unless it could not even be opened (a symlink
        # put in its place is never truncated through): the next look tries again
        pass
    return size


def _temp_name(path: Path) -> Path:
    return path.with_name(ids.temp_name(path.name))


def _copy_and_truncate(path: Path, *, copy: bool) -> Path | None:
    """Copy the log to a fresh temporary file (``copy``) and empty it through the same
    descriptor the moment the copy has read its end; return the copy. A copy that fails
    still empties the log (and raises)."""
    src = open_in(path, os.O_RDWR)
    tmp, out = None, -1
    try:
        if copy:
            tmp = _temp_name(path)
            out = open_in(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            while os.sendfile(out, src, None, 1 << 20):
                pass
        os.ftruncate(src, 0)
    except BaseException:
        os.ftruncate(src, 0)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    finally:
        os.close(src)
        if out >= 0:
            os.close(out)
    return tmp


def _replace_by_link(src: Path, dst: Path) -> None:
    """Make ``dst`` the file ``src`` is, while ``src`` stays: link aside, then rename."""
    tmp = _temp_name(dst)
    os.link(src, tmp, follow_symlinks=False)
    os.replace(tmp, dst)
