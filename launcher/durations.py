"""The one grammar of a duration (issue 55 §4: "the grace has one grammar"): every flag,
spec key and config key, and early.py's plain stop, read a duration here.

``90``, ``1.5``, ``90s``, ``5 min``, ``1h30m``, ``2 hours 15 minutes``, ``1.5d``: a number,
or numbers with units in any combination, each unit at most once (as systemd and people
write them). Plain Python with no import: early.py reads ``--grace`` with it before
anything else of trainctl is loaded (a stop's first signal waits for nothing).
"""

from __future__ import annotations

UNITS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
}


def seconds(text: str) -> float | None:
    """The seconds ``text`` says, or None when it is not a duration (the caller names the
    setting, and refuses a negative, non-finite or year-long one)."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    pos, total, seen = 0, 0.0, set()
    while pos < len(text):
        pos = _skip_space(text, pos)
        num_end = _number_end(text, pos)
        if num_end == pos:
            return None
        number = float(text[pos:num_end])
        pos = _skip_space(text, num_end)
        unit_end = pos
        while unit_end < len(text) and text[unit_end].isascii() and text[unit_end].isalpha():
            unit_end += 1
        scale = UNITS.get(text[pos:unit_end].lower())
        if scale is None or scale in seen:
            return None
        seen.add(scale)
        total += number * scale
        pos = _skip_space(text, unit_end)
        if pos < len(text) and text[pos] == ",":
            pos += 1
    return total if seen else None


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _number_end(text: str, pos: int) -> int:
    """Where ``\\d+(\\.\\d+)?`` starting at ``pos`` ends (``pos``: there is none)."""
    end = pos
    while end < len(text) and text[end].isdecimal():  # \d: any decimal digit, as float()
        end += 1
    if end == pos:
        return pos
    if text[end : end + 1] == "." and text[end + 1 : end + 2].isdecimal():
        end += 1
        while end < len(text) and text[end].isdecimal():
            end += 1
    return end
