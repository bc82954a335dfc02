"""The terminal: its width, colour (NO_COLOR), and text that fits.

Tables fit the terminal they are printed on: commands are shortened (paths inside the
job's cwd become relative, executables in some ``bin/`` directory, a venv's python
above all, lose their directory) and, if still too long, cut in the middle, where they
are least informative. Piped output keeps every character, with no colour.
"""

from __future__ import annotations

import os
import shlex
import sys

UNLIMITED = 1 << 20


def width() -> int:
    """Columns to fit: the terminal's, $COLUMNS when piped, else no limit."""
    if sys.stdout.isatty():
        try:  # os, not shutil: shutil costs `status` ~2 ms of imports
            return max(40, os.get_terminal_size(sys.stdout.fileno()).columns)
        except OSError:
            return 100
    cols = os.environ.get("COLUMNS", "")
    return max(40, int(cols)) if cols.isdigit() else UNLIMITED


def colour() -> bool:
    """Colour only on a terminal, and never with NO_COLOR set (https://no-color.org)."""
    return (
        sys.stdout.isatty()
        and not os.environ.get("NO_COLOR")
        and os.environ.get("TERM", "") != "dumb"
    )


_CODES = {"green": "32", "yellow": "33", "red": "31", "bold": "1", "dim": "2"}
PHASE_STYLE = {
    "running": "green",
    "starting": "yellow",
    "queued": "yellow",
    "stopping": "yellow",
    "stopped": "dim",
    "exited": "dim",
    "failed": "red",
    "lost": "red",
}


def paint(text: str, style: str | None) -> str:
    """``text`` in ``style`` when colour is on (pad before painting: codes take no width)."""
    if not style or not colour():
        return text
    return f"\x1b[{_CODES[style]}m{text}\x1b[0m"


def phase(text: str, name: str) -> str:
    """``text`` painted for phase ``name`` (running green, failed/lost red, ...)."""
    return paint(text, PHASE_STYLE.get(name))


def middle(text: str, limit: int) -> str:
    """Cut ``text`` to ``limit`` characters in the middle (``…``), keeping both ends."""
    if len(text) <= limit:
        return text
    if limit <= 1:
        return text[:limit]
    head = (limit - 1) * 2 // 3
    return text[:head] + "…" + text[len(text) - (limit - 1 - head) :]


def argv_line(argv: list[str], cwd: str | None) -> str:
    """A command as a shell reads it back (quoted): shortened as short_cmd does on a
    terminal, every character of it when piped (to paste into a shell or a script)."""
    words = argv if not sys.stdout.isatty() else [_short_word(w, cwd) for w in argv]
    return shlex.join(words)


def short_cmd(cmd: str, cwd: str | None) -> str:
    """A command line as a reader wants it: paths relative to cwd, bin/ dirs dropped."""
    return " ".join(_short_word(w, cwd) for w in cmd.split(" "))


def _short_word(word: str, cwd: str | None) -> str:
    if not word.startswith("/"):
        return word
    if cwd and (word == cwd or word.startswith(cwd.rstrip("/") + "/")):
        return os.path.relpath(word, cwd)
    if os.path.basename(os.path.dirname(word)) == "bin":
        return os.path.basename(word)
    return word
