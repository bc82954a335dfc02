"""The one poll loop: ask again until an answer comes or a deadline passes.

Used where nothing can be waited on directly (a file that appears, a scheduler's queue, a
flock another process holds). A *process* is waited on through its pidfd instead
(:mod:`.roster`, :mod:`.terminate`), never through this loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll_until(
    probe: Callable[[], T | None], timeout_s: float | None, interval_s: float
) -> T | None:
    """Call ``probe`` every ``interval_s`` until it returns non-None; None at the deadline.

    ``timeout_s`` None waits for ever. The probe runs once more at the deadline, so a
    zero timeout still asks once.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        answer = probe()
        if answer is not None:
            return answer
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(interval_s, left))
        else:
            time.sleep(interval_s)
