"""Where trainctl's global options end: the one rule shared by the fast path and --host.

Global options (``--home D``, ``--host H``, ``--version``, ``--help``) are read only before
the verb. A job's own argv often holds ``--host 0.0.0.0`` or ``--home D``; those belong to
the job, never to trainctl, even when the user leaves out ``--``.
"""

from __future__ import annotations

_WITH_VALUE = ("--host", "--home")
_FLAGS = ("--version", "--help", "-h")


def global_options_end(argv: list[str]) -> int:
    """Return the index of the verb in ``argv`` (len(argv) if there is none)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _WITH_VALUE:
            i += 2
        elif arg.startswith(tuple(f"{o}=" for o in _WITH_VALUE)) or arg in _FLAGS:
            i += 1
        else:
            break
    return min(i, len(argv))
