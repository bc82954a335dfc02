"""``--all-hosts``: jobs, GPUs and top across hosts."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from trainctl.launcher import term

if TYPE_CHECKING:
    from trainctl.launcher.results.ops import (
        HostAnswer,
    )


from trainctl.supervisor.records import replace

from .base import clean, gib


def fleet_jobs(answers: list[HostAnswer]) -> str:
    """`list --all-hosts`: one table, a HOST column; a host that did not answer, a row."""
    o: list[str] = []
    o.append(f"{'HOST':<14} {'NAME':<20} {'STATE':<13} {'RUN':>4} {'MAIN':>7} {'MEMBERS':>7}  LAST")
    for a in answers:
        if a.error is not None:
            o.append(f"{a.host:<14} {'-':<20} {'?':<13} {'':>4} {'':>7} {'':>7}  {clean(a.error)}")
            continue
        jobs = a.doc if isinstance(a.doc, list) else []
        if not jobs:
            o.append(f"{a.host:<14} {'-':<20} {'(no jobs)':<13}")
        for j in jobs:
            if not isinstance(j, dict):
                continue
            cause = j.get("cause") or {}
            last = cause.get("summary") if isinstance(cause, dict) and cause else None
            last = last or j.get("last_log_line") or j.get("error") or ""
            main = j.get("main_pid") if j.get("main_pid") is not None else "-"
            o.append(
                f"{a.host:<14} {j.get('name')!s:<20} {j.get('state')!s:<13} "
                f"{j.get('run', '-')!s:>4} {main!s:>7} {j.get('members', 0)!s:>7}  "
                f"{term.middle(clean(str(last)), max(20, term.width() - 72))}"
            )
    return "\n".join(o)


def fleet_gpus(answers: list[HostAnswer]) -> str:
    """`gpus --all-hosts`: per host, each GPU free or held (and by which job)."""
    o: list[str] = []
    o.append(f"{'HOST':<14} {'GPU':<6} {'USED':>9} {'TOTAL':>9}  HELD BY")
    for a in answers:
        if a.error is not None:
            o.append(f"{a.host:<14} {'-':<6} {'':>9} {'':>9}  {clean(a.error)}")
            continue
        doc = a.doc
        rows = doc if isinstance(doc, list) else []
        if isinstance(doc, dict):  # no driver there: {"gpus": [], "error": ...}
            said = clean(str(doc.get("error") or "no GPUs"))
            o.append(f"{a.host:<14} {'-':<6} {'':>9} {'':>9}  {said}")
            continue
        free = 0
        for g in rows:
            if not isinstance(g, dict):
                continue
            held = g.get("leased_by") or ("foreign use" if g.get("processes") else None)
            free += held is None
            used, total = g.get("memory_used_bytes") or 0, g.get("memory_total_bytes") or 0
            o.append(
                f"{a.host:<14} {g.get('label') or g.get('index')!s:<6} {gib(used):>9} "
                f"{gib(total):>9}  {held or 'free'}"
            )
        if rows:
            o.append(f"{a.host:<14} {free} of {len(rows)} free")
    return "\n".join(o)


def fleet_top(answers: list[HostAnswer]) -> str:
    """`top --all-hosts`: every host's jobs, then every host's GPUs, from one frame each."""

    o: list[str] = []

    def part(a: HostAnswer, key: str) -> HostAnswer:
        if a.error is not None or not isinstance(a.doc, dict):
            return a
        if key == "gpus" and a.doc.get("gpus_error"):
            return replace(a, doc={"error": a.doc["gpus_error"]})
        return replace(a, doc=a.doc.get(key) or [])

    o.append(time.strftime("trainctl top --all-hosts  %H:%M:%S"))
    o.append(fleet_jobs([part(a, "jobs") for a in answers]))
    o.append("")
    o.append(fleet_gpus([part(a, "gpus") for a in answers]))
    return "\n".join(o)
