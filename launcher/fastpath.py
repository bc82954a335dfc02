"""The console-script entry: `status` answered without importing click.

`trainctl status NAME` is what monitoring loops and shell prompts call over and over, so
it must beat `supervisorctl status` (~86 ms here). click alone costs ~20 ms to import on
these machines, so the exact shapes ``status NAME [--json]`` (optionally after
``--home DIR``) are parsed here by hand; every other command line, including any help or
error case of `status`, goes through click unchanged. Both paths render with the same
functions and map errors with the same table.
"""

from __future__ import annotations

import os
import sys

from trainctl.supervisor.errors import TrainctlError

from .exitcodes import exit_code_for


def _parse_status(argv: list[str]) -> tuple[str | None, str, bool] | None:
    home = None
    if argv[:1] == ["--home"] and len(argv) >= 2:
        home, argv = argv[1], argv[2:]
    if not argv or argv[0] != "status" or len(argv) not in (2, 3):
        return None
    name, rest = argv[1], argv[2:]
    if name.startswith("-") or rest not in ([], ["--json"]):
        return None
    return home, name, bool(rest)


def fast_status(home_opt: str | None, name: str, as_json: bool) -> int:
    """Run `status NAME` exactly as the click command would."""
    from . import render, views  # noqa: PLC0415
    from .config import resolve_home  # noqa: PLC0415

    try:
        s = views.job_status(resolve_home(home_opt, None), name)
    except TrainctlError as e:
        sys.stderr.write(f"trainctl: error: {e}\n")
        return exit_code_for(e)
    if as_json:
        render.emit_json(s.to_doc())
    else:
        render.status(s)
    return views.status_exit_code(s)


def main() -> None:
    """Entry point of the `trainctl` script."""
    parsed = _parse_status(sys.argv[1:])
    if parsed is not None and "TRAINCTL_NO_FASTPATH" not in os.environ:
        sys.stdout.flush()
        sys.exit(int(fast_status(*parsed)))
    from .cli import main as click_main  # noqa: PLC0415

    click_main()
