"""`gpus`, `hosts`, `stack` and `doctor`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainctl.launcher import term
from trainctl.launcher.results import (
    StackReport,
)
from trainctl.supervisor.records import JsonObject

if TYPE_CHECKING:
    from trainctl.launcher.remote import HostRow
    from trainctl.launcher.results import GpuInventory
    from trainctl.launcher.results.ops import (
        Check,
    )


from trainctl.supervisor.records import asdict

from .base import NAMED_LINES, Said, clean, gib


def stacks(r: StackReport) -> str:
    """Render `trainctl stack`: each distinct stack once, with who stands at it."""
    o: list[str] = []
    n = len({t.pid for g in r.groups for t in g.threads})
    o.append(
        f"{r.name} run {r.run}: {n} Python process(es), {len(r.groups)} distinct "
        f"stack(s) ({r.elapsed_s:.2f} s)"
    )
    for g in sorted(r.groups, key=lambda g: -len(g.threads)):
        who = ", ".join(
            f"pid {t.pid}"
            + (f" rank {t.rank}" if t.rank is not None else "")
            + (f" thread {clean(t.thread)}" if not t.thread.isdigit() else "")
            for t in g.threads[:NAMED_LINES]
        )
        more = f" and {len(g.threads) - NAMED_LINES} more" if len(g.threads) > NAMED_LINES else ""
        o.append(f"\n  {len(g.threads)} thread(s): {who}{more}")
        for f in g.frames:
            where = f"{clean(f.filename)}:{f.line}" if f.line is not None else clean(f.filename)
            o.append(f"    {clean(f.name)} ({where})")
    for sk in r.skipped:
        o.append(f"\n  skipped pid {sk.pid} {clean(sk.cmd)[:60]}: {sk.why}")
    return "\n".join(o)


# Idle memory that needs no explanation: the driver reserves some on every GPU.
_IDLE_NOTE_BYTES = 1 << 30


def gpus(inv: GpuInventory) -> Said:
    """Render `trainctl gpus`: the driver, a line a GPU, its processes, the warnings."""
    o: list[str] = []
    d = inv.driver
    o.append(f"driver {d.driver_version or '?'}  NVML {d.nvml_version or '?'}")
    for v in inv.views:
        if v.unhealthy is not None:
            o.append(
                f"GPU {v.label}  {term.paint(v.unhealthy.upper()[:9], 'red')}{v.unhealthy[9:]}"
            )
        if v.error is not None:
            o.append(f"GPU {v.label}  {term.paint('ERROR', 'red')}: {v.error}")
            continue
        util = "?" if v.utilization_pct is None else f"{v.utilization_pct}%"
        lease = f"leased by {v.leased_by}" if v.leased_by else "free"
        if v.mig_mode:
            lease = "MIG mode (bound per instance)"
        modes = "" if v.persistence is not False else "  persistence off"
        indent = "  " if v.mig is not None else ""
        o.append(
            f"{indent}GPU {v.label}  {v.name}  {gib(v.memory_used_bytes)} / "
            f"{gib(v.memory_total_bytes)}  util {util}  {lease}{modes}  {v.uuid}"
        )
        for p in v.processes:
            kind = f" [{p.seen.split(' ')[1]}]" if p.seen.startswith("nvml+fd ") else ""
            o.append(
                f"{indent}    pid {p.pid:>7}  {gib(p.used_bytes):>9}  {p.owner or '':<22} "
                f"{(p.cmd or '')[:80]}{kind}"
            )
        if v.last_fault is not None and v.unhealthy is None:
            o.append(f"{indent}    {v.last_fault}")
        if not v.processes and not v.mig_mode and v.memory_used_bytes > _IDLE_NOTE_BYTES:
            o.append(f"{indent}    (no process listed: NVML may not see other PID namespaces)")
    return Said("\n".join(o), "\n".join(f"trainctl: warning: {w}" for w in inv.warnings))


def hosts(rows: list[HostRow]) -> str:
    """Render `trainctl hosts`."""
    o: list[str] = []
    for r in rows:
        h = r.host
        line = f"{h.name:<16} {h.target}"
        if h.port:
            line += f":{h.port}"
        if h.prefix:
            line += f"  via `{' '.join(h.prefix)}`"
        if r.check is not None:
            if r.check.error:
                line += f"  FAIL: {r.check.error}"
            else:
                ok = "ok" if r.check.compatible else "INCOMPATIBLE"
                line += f"  trainctl {r.check.version} ({ok})"
        o.append(line)
    return "\n".join(o)


def doctor_doc(checks: list[Check]) -> list[JsonObject]:
    """`trainctl doctor --json`: a check each."""
    return [asdict(ch) for ch in checks]


def doctor(checks: list[Check]) -> str:
    """Render `trainctl doctor`: one line per check, a hint under what needs action."""
    o: list[str] = []
    width = max(len(ch.name) for ch in checks)
    for ch in checks:
        o.append(f"{'ok  ' if ch.ok else 'FIX '} {ch.name:<{width}}  {ch.value}")
        if ch.hint:
            o.append(f"     {'':<{width}}  -> {ch.hint}")
    return "\n".join(o)
