"""The job page's goodput line (`report`'s first), made off the request and kept.

`report` reads every progress point of every run: a week of per-step lines (a million
points) took 3.8 s, on every page load. Here each job's line is made in a thread of its
own with one points cache for the server's life (ops/goodput.PointsCache: a file is
parsed once, then only what was appended), and kept. A page waits at most ``WAIT_S`` for a
line not made yet; otherwise it shows the kept one (or none), and the charts' refresh
(every 10 s) brings the new one. A line is made again no sooner than ``REFRESH_S`` after
the last, nor than ``COST_FACTOR`` times what the last one cost: a page left open on a
week-long job costs the box ~3 % of a core, not a core.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from trainctl.launcher import render
from trainctl.launcher.ops import goodput
from trainctl.supervisor.errors import TrainctlError
from trainctl.supervisor.records import record

WAIT_S = 0.25
REFRESH_S = 10.0
COST_FACTOR = 30.0


@record()
class _Line:
    text: str | None = None
    made_at: float | None = None  # time.time() of the report behind it
    next_at: float = 0.0  # monotonic: not made again before this
    maker: threading.Thread | None = None


class GoodputLines:
    """Each job's goodput line, made in the background, kept between requests."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.points = goodput.PointsCache()
        self._lock = threading.Lock()
        self._lines: dict[str, _Line] = {}

    def line(self, name: str, wait_s: float = WAIT_S) -> tuple[str | None, float | None]:
        """Job ``name``'s goodput line and when it was made (None: none yet, or no run);
        a new one is started when the kept one is due, and waited for ``wait_s`` at most
        when none is kept."""
        with self._lock:
            kept = self._lines.setdefault(name, _Line())
            if kept.maker is None and time.monotonic() >= kept.next_at:
                kept.maker = threading.Thread(
                    target=self._make, args=(name, kept), name=f"goodput-{name}", daemon=True
                )
                kept.maker.start()
            maker = kept.maker
        if maker is not None and kept.text is None:
            maker.join(wait_s)
        with self._lock:
            return kept.text, kept.made_at

    def _make(self, name: str, kept: _Line) -> None:
        t0 = time.monotonic()
        text: str | None = None
        try:
            text = render.goodput_line(goodput.report(self.home, name, self.points))
        except (TrainctlError, OSError):
            pass  # no run yet, or the job went: the page shows none
        finally:  # whatever happened, the line is made again when due, not never
            took = time.monotonic() - t0
            with self._lock:
                kept.text, kept.made_at = text, time.time()
                kept.next_at = time.monotonic() + max(REFRESH_S, COST_FACTOR * took)
                kept.maker = None
