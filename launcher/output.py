"""stdout that a closed reader cannot break: `trainctl stop X | head -1` still exits 0.

When the reader goes away (``head`` has its line, a pager was quit, ssh dropped), a write
raises BrokenPipeError. What the verb did (a stop, a start) is done by then; its exit
code must say so, and no traceback or crash file may appear. :func:`install` puts a
wrapper in front of ``sys.stdout`` that turns the first EPIPE into a quiet end of output:
fd 1 is pointed at /dev/null (so the interpreter's own flush at exit cannot fail either)
and every later write is dropped. :func:`reader_gone` lets a follower (`logs -f`) stop.

Any other error of the sink (a full disk behind ``> out.txt``: ENOSPC; EIO) ends the
output the same way, and is kept: once the verb is done, main.py says it in one line and
exits non-zero (the output asked for is not there), never a traceback.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any, TextIO


class _QuietPipe:
    """A text stream in front of the real stdout that swallows EPIPE once and for all."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.gone = False
        self.error: OSError | None = None  # what ended the output, if not a gone reader

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._lost()
            except OSError as e:
                self._lost(e)
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._lost()
            except OSError as e:
                self._lost(e)

    def _lost(self, error: OSError | None = None) -> None:
        self.gone = True
        self.error = error
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def install() -> None:
    """Put the quiet wrapper in front of sys.stdout (once). A closed stdout
    (`trainctl status X >&-`: Python's is None) is a sink that fails from the start: the
    verb runs, and main.py says so at the end, as for a full disk."""
    if sys.stdout is None:
        closed = _QuietPipe(open(os.devnull, "w"))  # noqa: SIM115  (fd 1 from here on: no socket takes it)
        closed.gone = True
        closed.error = OSError(errno.EBADF, "standard output is closed")
        sys.stdout = closed  # type: ignore[assignment,unused-ignore]
    elif not isinstance(sys.stdout, _QuietPipe):
        sys.stdout = _QuietPipe(sys.stdout)  # type: ignore[assignment,unused-ignore]


def reader_gone() -> bool:
    """Tell whether stdout's reader has gone away (a write found the pipe closed)."""
    out = sys.stdout
    return isinstance(out, _QuietPipe) and out.gone


def write_error() -> OSError | None:
    """What stopped stdout other than a gone reader (ENOSPC, EIO), if anything did."""
    out = sys.stdout
    return out.error if isinstance(out, _QuietPipe) else None
