"""`trainctl list`: every job, recent ones unless --all."""

from __future__ import annotations

import time

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.ops.status import all_statuses

from . import Invocation

# `list` shows a finished job for this long after it ended; `list --all` shows every job.
RECENT_S = 7 * 24 * 3600


def run(
    inv: Invocation, *, show_all: bool = False, as_json: bool = False, all_hosts: bool = False
) -> int:
    """Print the job table (or its JSON); jobs ended over 7 days ago only with --all."""
    if all_hosts:
        return _all_hosts(inv, show_all=show_all, as_json=as_json)
    rows = all_statuses(inv.home, brief=not as_json)  # the table shows no training view
    if not show_all:
        cutoff = time.time() - RECENT_S
        kept = [r for r in rows if isinstance(r, tuple) or (r.ended_at or time.time()) >= cutoff]
        if len(kept) < len(rows) and not as_json:
            render.line(f"({len(rows) - len(kept)} finished more than 7 days ago: list --all)")
        rows = kept
    if as_json:
        inv.reply(
            [
                r.to_doc()
                if not isinstance(r, tuple)
                else {"name": r[0], "state": "unknown", "error": r[1]}
                for r in rows
            ]
        )
    else:
        render.show(render.job_table(rows, str(inv.home)))
    return ExitCode.OK


def _all_hosts(inv: Invocation, *, show_all: bool, as_json: bool) -> int:
    """Every host of hosts.toml, asked at once: a HOST column; a silent host says why."""
    from trainctl.launcher.ops.fleet import over_hosts  # noqa: PLC0415  (ssh, threads)

    answers = over_hosts(["list", *(["--all"] if show_all else [])])
    if as_json:
        inv.reply([a.to_doc() for a in answers])
    else:
        render.show(render.fleet_jobs(answers))
    return ExitCode.OK if all(a.error is None for a in answers) else ExitCode.REMOTE
