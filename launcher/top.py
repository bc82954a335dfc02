"""`trainctl top`: every job and GPU on one live screen.

One frame is a list of (text, style) lines built from the same views as `list`,
`status` and `gpus` (nothing here reads state files itself). The curses loop redraws it
every ``interval_s`` and on a resize, and quits on ``q`` (or Ctrl-C). ``--once`` prints a
single frame as plain text, for scripts and for terminals without curses.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from trainctl.supervisor.errors import GpuError
from trainctl.supervisor.gpu import NoDriverError
from trainctl.supervisor.records import Json, JsonObject

from . import render, term
from .gpus import gpu_views
from .ops.status import all_statuses
from .results import ENDED_STATES, Status

Line = tuple[str, str | None]  # text, style (a term style name) or None


def frame(home: Path, width: int) -> list[Line]:
    """The screen's content now, cut to ``width`` columns."""
    statuses = all_statuses(home)
    jobs = [s for s in statuses if isinstance(s, Status)]
    live = sum(1 for s in jobs if s.state in ("running", "starting", "stopping"))
    stamp = time.strftime("%H:%M:%S")
    head = f"trainctl top — {socket.gethostname()} — {stamp} — {len(statuses)} job(s), {live} live"
    lines: list[Line] = [(_fit(f"{head}   (q: quit)", width), "bold"), ("", None)]
    lines += _job_lines(statuses, width)
    lines.append(("", None))
    lines += _gpu_lines(home, width)
    return lines


# `top` shows every live job, and this many of the latest finished ones: two live jobs are
# not to be buried under nine that ended yesterday (`list` shows them all).
TOP_FINISHED = 3


def _job_lines(all_: list[Status | tuple[str, str]], width: int) -> list[Line]:
    if not all_:
        return [("no jobs", "dim")]
    # statuses come live first, then the latest finished (all_statuses)
    ended = [s for s in all_ if isinstance(s, Status) and s.state in ENDED_STATES]
    statuses = [s for s in all_ if s not in ended[TOP_FINISHED:]]
    name_w = max(4, *(len(s.name if isinstance(s, Status) else s[0]) for s in statuses))
    out: list[Line] = [
        (
            _fit(
                f"{'NAME':<{name_w}}  {'STATE':<12} {'RUN':>4} {'PROCS':>5} {'TIME':<16}  "
                "PROGRESS / LAST LOG LINE",
                width,
            ),
            "bold",
        )
    ]
    for s in statuses:
        if isinstance(s, tuple):
            out.append((_fit(f"{s[0]:<{name_w}}  {'?':<12} {s[1]}", width), "red"))
            continue
        code = f"({s.exit_code})" if s.exit_code is not None else ""
        stalled = " STALLED" if s.stalled_for_s is not None else ""
        row = (
            f"{s.name:<{name_w}}  {s.state + code + stalled:<12} {s.run:>4} {s.members:>5} "
            f"{render.time_cell(s):<16}  "
        )
        over = s.state if s.state in ENDED_STATES else None
        detail = render.progress_line(s.progress, over) if s.progress else ""
        if not detail:
            detail = render.clean(s.last_log_line)
        style = "red" if stalled else term.PHASE_STYLE.get(s.state)
        out.append((_fit(row + detail, width), style))
        if s.progress and s.last_log_line:
            last = render.clean(s.last_log_line)
            out.append((_fit(" " * (name_w + 2) + "last: " + last, width), "dim"))
    if len(ended) > TOP_FINISHED:
        more = f"... and {len(ended) - TOP_FINISHED} more finished job(s): trainctl list"
        out.append((_fit(more, width), "dim"))
    return out


def _gpu_lines(home: Path, width: int) -> list[Line]:
    try:
        views = gpu_views(home)
    except NoDriverError as e:
        return [(_fit(f"GPUs: {e}", width), "dim")]
    except GpuError as e:  # the driver cannot answer: the jobs still show
        return [(_fit(f"GPUs: {e}", width), "red")]
    out: list[Line] = [("GPUS", "bold")]
    for v in views:
        if v.error is not None:
            out.append((_fit(f"{v.label:>3} ERROR: {v.error}", width), "red"))
            continue
        util = "-" if v.utilization_pct is None else f"{v.utilization_pct}%"
        lease = f"job {v.leased_by}" if v.leased_by else "free"
        mem = f"{render.gib(v.memory_used_bytes)} / {render.gib(v.memory_total_bytes)}"
        who = ", ".join(f"{p.pid} {p.owner}" for p in v.processes[:4])
        more = f" +{len(v.processes) - 4}" if len(v.processes) > 4 else ""
        line = f"{v.label:>3} {v.name[:24]:<24} {mem:>20}  util {util:>4}  {lease:<14} {who}{more}"
        out.append((_fit(line, width), "yellow" if v.leased_by else None))
    return out


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def frame_doc(home: Path) -> JsonObject:
    """One frame as JSON: every job (as `status --json`, live first) and every GPU (as
    `gpus --json`; ``gpus_error`` says why there are none)."""
    jobs: list[Json] = []
    for s in all_statuses(home):
        jobs.append(
            s.to_doc()
            if isinstance(s, Status)
            else {"name": s[0], "state": "unknown", "error": s[1]}
        )
    doc: JsonObject = {"host": socket.gethostname(), "at": time.time(), "jobs": jobs}
    try:
        doc["gpus"] = [v.to_doc() for v in gpu_views(home)]
    except GpuError as e:  # no driver, or one that cannot answer
        doc["gpus"], doc["gpus_error"] = [], str(e)
    return doc


def print_once(home: Path) -> None:
    """One frame on stdout, plain (colour only on a terminal, as everywhere)."""
    for text, style in frame(home, term.width()):
        sys.stdout.write(term.paint(text, style).rstrip() + "\n")


def run(home: Path, interval_s: float = 1.0) -> None:
    """The live screen; returns when the user quits."""
    import curses  # noqa: PLC0415  (only here: `top` is the one full-screen verb)

    def loop(scr: Any) -> None:
        colours = _colours(curses)
        with contextlib.suppress(curses.error):
            curses.curs_set(0)
        scr.timeout(int(interval_s * 1000))
        while True:
            height, width = scr.getmaxyx()
            lines = frame(home, max(1, width - 1))
            scr.erase()
            for y, (text, style) in enumerate(lines[: max(0, height - 1)]):
                with contextlib.suppress(curses.error):  # the last cell of a full screen
                    scr.addstr(y, 0, text, colours.get(style or "", 0))
            scr.refresh()
            key = scr.getch()
            if key in (ord("q"), ord("Q"), 27):
                return

    with contextlib.suppress(KeyboardInterrupt):
        curses.wrapper(loop)


def _colours(curses: Any) -> dict[str, int]:
    attrs = {"bold": curses.A_BOLD, "dim": curses.A_DIM}
    if os.environ.get("NO_COLOR") or not curses.has_colors():
        return attrs
    with contextlib.suppress(curses.error):
        curses.use_default_colors()
    for i, (name, fg) in enumerate(
        (("green", curses.COLOR_GREEN), ("yellow", curses.COLOR_YELLOW), ("red", curses.COLOR_RED)),
        start=1,
    ):
        with contextlib.suppress(curses.error):
            curses.init_pair(i, fg, -1)
            attrs[name] = curses.color_pair(i)
    return attrs
