"""The control protocol's requests on the wire, encoded here and only here (issue 55 §4:
one encoder): a flat JSON object on one line, from strings, numbers, booleans and None.

Plain Python with no import: :mod:`trainctl.launcher.early` sends a plain stop (and
status's one question) before anything else of trainctl is imported, json included (its
import is ~8 ms of the stop's first signal on a small machine); control.py sends every
other request through the same function. Replies, which nest, are the supervisor's
``json.dumps`` (control.encode).
"""

from __future__ import annotations

Scalar = str | int | float | bool | None

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _text(s: str) -> str:
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch < " " or ch == "\x7f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _value(v: Scalar) -> str:
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v - v != 0.0:  # inf and nan (math.isfinite, without the import)
            raise ValueError(f"not a JSON number: {v!r}")
        return repr(v)
    if isinstance(v, str):
        return _text(v)
    raise TypeError(f"a request's field must be a string, number, boolean or None: {v!r}")


def request(op: str, **fields: Scalar) -> bytes:
    """``{"op": op, ...fields}`` as one line, newline-terminated."""
    parts = [f'"op": {_text(op)}', *(f"{_text(k)}: {_value(v)}" for k, v in fields.items())]
    return ("{" + ", ".join(parts) + "}\n").encode()
