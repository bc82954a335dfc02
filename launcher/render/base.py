"""The output sink and the small formatters every area shares (durations, sizes, a
safe terminal line); one JSON document out.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from _thread import _local  # threading.local itself, without threading's import (~2 ms)
from collections.abc import Iterator
from typing import Any, Generic, TextIO, TypeVar

from trainctl.launcher import term
from trainctl.launcher.results import (
    ENDED_STATES,
    Status,
)
from trainctl.supervisor.records import record

T = TypeVar("T")


class _PerThread(_local, Generic[T]):
    """One thread's open blocks of a kind, innermost last. Per thread: the MCP server and
    the web page run each call in a worker thread of its own, and two calls at once must
    never receive each other's output or documents."""

    def __init__(self) -> None:
        self.stack: list[T] = []

    @contextlib.contextmanager
    def opened(self, item: T) -> Iterator[T]:
        """``item`` is the innermost inside the block."""
        self.stack.append(item)
        try:
            yield item
        finally:
            self.stack.pop()


_SINKS: _PerThread[TextIO] = _PerThread()  # render.to() blocks: where out() writes


def out(*parts: object, sep: str = " ", end: str = "\n", flush: bool = False) -> None:
    """Write what a verb prints to its invocation's output: the innermost :func:`to`
    of this thread, else stdout. Every line of text a verb shows goes through here."""
    stream = _SINKS.stack[-1] if _SINKS.stack else sys.stdout
    print(*parts, sep=sep, end=end, file=stream, flush=flush)


@contextlib.contextmanager
def to(stream: TextIO) -> Iterator[TextIO]:
    """Send this thread's output to ``stream`` inside the block: an invocation's explicit
    sink (the web page runs a verb in-process and answers with what it printed)."""
    with _SINKS.opened(stream):
        yield stream


@record(frozen=True)
class Said:
    """What a render function says on both streams: ``out`` for stdout (the verb's
    report), ``err`` for stderr (``trainctl: …`` notes and a failure's last log lines)."""

    out: str = ""
    err: str = ""


def show(text: str | Said, *, flush: bool = False) -> None:
    """Print what a render function returned: its text (nothing when empty), and a
    :class:`Said`'s stderr part after it."""
    said = text if isinstance(text, Said) else Said(text)
    if said.out:
        out(said.out, flush=flush)
    if said.err:
        sys.stderr.write(f"{said.err}\n")


def line(text: str) -> None:
    """Print one line of a verb's own (a note, a refusal's context)."""
    out(text)


def error_line(text: str) -> None:
    """Print one ``trainctl: …`` line to stderr (an error the verb reports itself)."""
    sys.stderr.write(f"trainctl: {text}\n")


def emit_json(doc: Any) -> None:
    """Print one JSON document (a verb hands it over by ``Invocation.reply``)."""
    out(json.dumps(doc, indent=2, default=str))


def duration(secs: float) -> str:
    """Format seconds as 3d4h, 2h05m, 4m07s or 12.3s."""
    if secs < 60:
        return f"{secs:.1f}s"
    m, s = divmod(int(secs), 60)
    h, m = divmod(m, 60)
    d, h = divmod(h, 24)
    if d:
        return f"{d}d{h}h"
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def ago(ts: float | None) -> str:
    """`5m02s ago`, from an epoch time ("-" when there is none)."""
    return "-" if ts is None else f"{age(max(0.0, time.time() - ts))} ago"


def age(secs: float) -> str:
    """An age as every verb prints it: whole seconds under a minute, else `duration`."""
    return f"{secs:.0f}s" if secs < 60 else duration(secs)


def time_cell(s: Status) -> str:
    """`up 3m02s` for a live run, `ended 5m02s ago` for a finished one (list, top)."""
    if s.ended_at is not None and s.state in ENDED_STATES:
        return f"ended {ago(s.ended_at)}"
    if s.state == "queued":
        return f"queued {duration(s.uptime_s)}"
    return f"up {duration(s.uptime_s)}"


def size(nbytes: int) -> str:
    """Format a byte count as 512K, 3.1M, 2.0G."""
    value = float(nbytes)
    for unit in ("B", "K", "M", "G"):
        if value < 1024 or unit == "G":
            return f"{value:.0f}{unit}" if unit in ("B", "K") else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}G"


NAMED_LINES = 8  # processes named one by one in the human report; --json has up to 64


def cmd_cell(cmd: str, used: int) -> str:
    """A job's command in a report line that has ``used`` columns already: cut in the
    middle to fit a terminal, whole when piped (term.width is unlimited then)."""
    return term.middle(clean(cmd), max(20, term.width() - used))


_CARET = {i: f"^{chr(i + 64)}" for i in range(32)} | {0x7F: "^?"}


_CARET.update({i: "?" for i in range(0x80, 0xA0)})  # C1 controls (CSI, OSC as one byte)


_CARET[9] = " "  # a tab is harmless, but would break the columns


def clean(text: str) -> str:
    """Make text from a job (its output, argv, error lines) safe to show on a terminal.

    Control characters are shown in caret notation (ESC as ``^[``), so an escape sequence
    in a log line or a command line can neither retitle the window, clear the screen nor
    fake a line of trainctl's own output. The one sanitizer for every such field.
    """
    return text.translate(_CARET)


def write(text: str) -> None:
    """Write raw log text."""
    sys.stdout.write(text)
    sys.stdout.flush()


def gib(nbytes: int | None) -> str:
    """Format bytes as GiB with one decimal ('?' when unknown)."""
    return "?" if nbytes is None else f"{nbytes / (1 << 30):.1f} GiB"


def _few(procs: list[Any], used: int, *, with_pid: bool) -> str:
    """The first three processes' commands on one line that has ``used`` columns already:
    each cut in the middle to its share of a terminal, whole when piped."""
    each = max(20, (term.width() - used) // 3)
    return ", ".join(
        (f"{p.pid} " if with_pid else "") + term.middle(clean(p.cmd), each) for p in procs[:3]
    )
