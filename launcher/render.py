"""Human and JSON output. The only module (besides cli) that prints."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Any

from . import term

if TYPE_CHECKING:
    from .gpus import GpuView
    from .start import StartResult
    from .stop import StopResult
    from .views import PsRow, Status


def emit_json(doc: Any) -> None:
    """Print one JSON document."""
    print(json.dumps(doc, indent=2, default=str))


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


def size(nbytes: int) -> str:
    """Format a byte count as 512K, 3.1M, 2.0G."""
    value = float(nbytes)
    for unit in ("B", "K", "M", "G"):
        if value < 1024 or unit == "G":
            return f"{value:.0f}{unit}" if unit in ("B", "K") else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}G"


def stop_doc(res: StopResult, checkpoint: dict[str, Any] | None = None) -> None:
    """Print a stop result as JSON."""
    emit_json(
        {
            "name": res.name,
            "run": res.run,
            "via": res.via,
            "ok": res.ok,
            "exit_code": res.exit_code,
            "message": res.message,
            "warnings": res.warnings,
            "report": res.report,
            "checkpoint": checkpoint or None,
        }
    )


def status_doc(s: Status) -> None:
    """Print a status as JSON."""
    emit_json(s.to_doc())


def start(res: StartResult) -> None:
    """Render a started run."""
    if res.gpus:
        print(f"GPUs {res.gpus} bound (CUDA_VISIBLE_DEVICES={res.gpus})")
    where = (
        f"main pid {res.main_pid}"
        if res.main_pid is not None
        else f"submitted as {res.mode} job {res.slurm_job_id}"
    )
    ms = res.elapsed_s * 1000
    print(f"started {res.name} run {res.run}: {where}, mode {res.mode} ({ms:.0f} ms)")
    print(f"log: {res.log}")
    if res.unit:
        print(f"unit: {res.unit} (systemd scope, outside your login session)")
    for line in res.warnings:
        sys.stderr.write(f"trainctl: {line}\n")


def stop(res: StopResult) -> None:
    """Render a stop report."""
    if res.message:  # a no-op, or a backend that tells its own outcome
        print(res.message)
        _warnings(res)
        for g in res.report.get("gpus", []):
            print(f"  {gpu_line(g)}")
        return
    r = res.report
    if r.get("already_stopped"):
        why = r.get("reason", "")
        print(
            f"{res.name}: {why}"
            if "backoff" in why
            else f"{res.name}: no process of run {res.run} was alive; nothing to stop"
        )
        return
    nets = ", ".join(f"{k} {v}" for k, v in sorted(r.get("by_net", {}).items()))
    print(f"stopped {res.name} run {res.run} via {res.via} ({r.get('mode')} mode)")
    print(
        f"  found      {r['found']} process(es), {r.get('escaped', 0)} escaped the tree  [{nets}]"
    )
    if r.get("late_joiners"):
        print(
            f"  late       {r['late_joiners']} found after the signal (new forks, or outside "
            "the cgroup) and signalled too"
        )
    _stop_details(r)
    if r.get("zombies"):
        print(f"  zombies    {len(r['zombies'])} exited, waiting for their parent to reap them")
    for s in r.get("survivors", []):
        print(survivor_line(s))
    for g in r.get("gpus", []):
        print(f"  {gpu_line(g)}")
    code = "" if res.exit_code is None else f", main exit code {res.exit_code}"
    print(f"  total      {r['total_s']:.2f} s — {_verdict(r)}{code}")
    _warnings(res)


NAMED_LINES = 8  # processes named one by one in the human report; --json has up to 64


def _stop_details(r: dict[str, Any]) -> None:
    """Who got the signal and when, who exited on it, who was launcher, who was killed."""
    order = r.get("order") or ("main" if r.get("main_only") else "all")
    for launcher in r.get("launchers", []):
        print(
            f"  launcher   pid {launcher['pid']} {clean(launcher['cmd'])[:60]} ({launcher['why']})"
        )
        print("             skipped for its workers; it gets the signal only if it outlives them")
    ex = r.get("exit_s") or {}
    timing = f" in {ex['first']:.2f}-{ex['last']:.2f} s (median {ex['median']:.2f} s)" if ex else ""
    sent = r.get("signalled", r.get("exited_on_signal", 0))
    print(
        f"  {r['signal']:<10} {sent} signalled (order {order}), "
        f"{r['exited_on_signal']} exited on it{timing}"
    )
    named = r.get("sent", [])
    for p in named[:NAMED_LINES]:
        if p["exit_s"] is None:
            gone = "still running"
        elif p.get("killed"):
            gone = f"SIGKILLed {p['exit_s']:.2f} s later"
        else:
            gone = f"exited after {p['exit_s']:.2f} s"
        print(f"    pid {p['pid']:<7} at +{p['at_s']:.2f} s, {gone}: {clean(p['cmd'])[:70]}")
    if len(named) > NAMED_LINES or sent > len(named):
        print(f"    ... and {sent - min(len(named), NAMED_LINES)} more (--json names up to 64)")
    if r.get("exited_unsignalled"):
        print(
            f"  unsignalled {r['exited_unsignalled']} exited without the signal "
            "(their parent shut them down)"
        )
    print(f"  SIGKILL    {r['killed']} killed after the {r['grace_s']:g} s grace")
    for p in r.get("killed_procs", [])[:NAMED_LINES]:
        print(f"    pid {p['pid']:<7} {clean(p['cmd'])[:80]}")
    if r["killed"] > NAMED_LINES:
        print(f"    ... and {r['killed'] - NAMED_LINES} more (--json names up to 64)")


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


def survivor_line(s: dict[str, Any]) -> str:
    """One report line for a process that outlived the stop."""
    why = f" ({s['why']})" if s.get("why") else ""
    wchan = s.get("wchan") or "-"
    return f"  SURVIVOR   pid {s['pid']} state {s['state']} wchan {wchan}{why}: {clean(s['cmd'])}"


def _warnings(res: StopResult) -> None:
    for line in res.warnings:
        sys.stderr.write(f"trainctl: {line}\n")


def _verdict(r: dict[str, Any]) -> str:
    if r.get("survivors"):
        return f"{len(r['survivors'])} process(es) SURVIVED"
    held = [str(g["index"]) for g in r.get("gpus", []) if not g.get("ok")]
    if held:
        return f"nothing of the job is alive, but GPU(s) {', '.join(held)} NOT released"
    return "nothing of the job is alive" + (", GPUs released" if r.get("gpus") else "")


def _stop_verdict(ls: dict[str, Any]) -> str:
    """`clean` only when every process left on the stop signal; otherwise who did not."""
    if not ls.get("ok", True):
        return f"{len(ls.get('survivors', []))} SURVIVED"
    killed = int(ls.get("killed", 0))
    if not killed:
        return "clean"
    who = ", ".join(f"{p['pid']} {clean(p['cmd'])[:40]}" for p in ls.get("killed_procs", [])[:3])
    more = f" and {killed - 3} more" if killed > 3 else ""
    return f"{killed} needed SIGKILL ({who}{more})"


def status(s: Status) -> None:
    """Render one job's status."""
    code = "" if s.exit_code is None else f" (exit code {s.exit_code})"
    boot = " — recorded before the last reboot (from a previous boot)" if s.previous_boot else ""
    print(f"{s.name}: {term.phase(s.state, s.state)}{code}, run {s.run}{boot}")
    if s.slurm is None:
        sup = f"{s.supervisor_pid} ({'alive' if s.supervisor_alive else 'gone'})"
        print(f"  main pid {s.main_pid}   pgid {s.pgid}   supervisor {sup}")
    when = "uptime" if s.ended_at is None else "ran"
    escaped = f", {s.escaped} escaped the tree" if s.escaped else ""
    print(f"  {when} {duration(s.uptime_s)}   members {s.members}{escaped}   mode {s.mode}")
    if s.unit:
        print(f"  unit {s.unit}")
    _status_details(s)
    if s.argv:
        cmd = clean(term.short_cmd(" ".join(s.argv), s.cwd))
        print(f"  cmd  {term.middle(cmd, term.width() - 7)}")
    print(f"  log  {s.log}")
    if s.last_log_line:
        print(f"  last {term.middle(clean(s.last_log_line), term.width() - 7)}")
    if s.last_stop and s.state in ("stopped", "exited", "failed"):
        ls = s.last_stop
        print(
            f"  last stop: {_stop_verdict(ls)}, {ls.get('total_s', 0):.2f} s "
            f"({ls.get('reason', 'stop')})"
        )


def job_table(rows: list[Status | tuple[str, str]]) -> None:
    """Render `trainctl list`: columns sized to their content, the table to the terminal."""
    if not rows:
        print("no jobs")
        return
    cells = []
    for row in rows:
        if isinstance(row, tuple):
            cells.append((row[0], "?", "?", "", "", "", "", row[1]))
            continue
        code = f"({row.exit_code})" if row.exit_code is not None else ""
        main = str(row.main_pid) if row.main_pid else "-"
        up = duration(row.uptime_s)
        last = clean(row.last_log_line)
        cells.append(
            (row.name, row.state + code, row.state, str(row.run), main, str(row.members), up, last)
        )
    heads = ("NAME", "STATE", "", "RUN", "MAIN", "MEMBERS", "UPTIME")
    w = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    left = term.width() - (sum(w) - w[2] + 2 * 5 + 2)  # what the last log line may take
    print(
        f"{'NAME':<{w[0]}}  {'STATE':<{w[1]}}  {'RUN':>{w[3]}}  {'MAIN':>{w[4]}}  "
        f"{'MEMBERS':>{w[5]}}  {'UPTIME':>{w[6]}}  LAST LOG LINE"
    )
    for name, shown, ph, run, main, members, up, last in cells:
        state_cell = term.phase(f"{shown:<{w[1]}}", ph)
        print(
            f"{name:<{w[0]}}  {state_cell}  {run:>{w[3]}}  {main:>{w[4]}}  "
            f"{members:>{w[5]}}  {up:>{w[6]}}  {term.middle(last, max(0, left))}".rstrip()
        )


def ps(rows: list[PsRow], cwd: str | None = None) -> None:
    """Render `trainctl ps` as an indented tree (a GPU column when any process holds one).

    Commands are shown relative to the job's cwd and without their bin/ directories, and
    cut in the middle to fit the terminal; `ps --json` keeps them whole.
    """
    if not rows:
        print("no live process")
        return
    if any(r.node for r in rows):  # published by node agents: where, who, what
        node_w = max(4, *(len(r.node or "") for r in rows))
        print(f"{'NODE':<{node_w}} {'PID':>7} {'PPID':>7} S  CMD")
        for r in rows:
            room = max(20, term.width() - node_w - 21)
            cmd = term.middle(clean(term.short_cmd(r.cmd, cwd)), room)
            print(f"{r.node or '-':<{node_w}} {r.pid:>7} {r.ppid:>7} {r.state}  {cmd}")
        return
    with_gpu = any(r.gpu_holder for r in rows)
    gpu_head = f" {'GPU MEM':>9}" if with_gpu else ""
    head = f"{'PID':>7} {'PPID':>7} {'PGID':>7} {'SID':>7} S {'CPU%':>5} {'RSS':>7}{gpu_head}  "
    print(f"{head}CMD")
    for r in rows:
        flag = "  [escaped]" if r.escaped else ""
        if r.stop_role.startswith("launcher"):
            flag += f"  [{r.stop_role}]"
        gpu = f" {gib(r.gpu_bytes) if r.gpu_holder else '-':>9}" if with_gpu else ""
        indent = "  " * r.depth
        room = max(20, term.width() - len(head) - len(indent) - len(flag))
        cmd = term.middle(clean(term.short_cmd(r.cmd, cwd)), room)
        print(
            f"{r.pid:>7} {r.ppid:>7} {r.pgid:>7} {r.sid:>7} {r.state} {r.cpu_percent:>5.1f} "
            f"{size(r.rss_bytes):>7}{gpu}  {indent}{cmd}{term.paint(flag, 'yellow')}"
        )


def write(text: str) -> None:
    """Write raw log text."""
    sys.stdout.write(text)
    sys.stdout.flush()


def gib(nbytes: int | None) -> str:
    """Format bytes as GiB with one decimal ('?' when unknown)."""
    return "?" if nbytes is None else f"{nbytes / (1 << 30):.1f} GiB"


def gpu_line(g: dict[str, Any]) -> str:
    """One line of a stop report about a GPU's release."""
    if g.get("ok"):
        return (
            f"GPU {g['index']}  released {gib(g.get('released_bytes', 0))} in "
            f"{g.get('seconds', 0):.1f} s (now {gib(g['used_bytes'])}, baseline "
            f"{gib(g['baseline_bytes'])})"
        )
    if "error" in g:
        return f"GPU {g['index']}  NOT VERIFIED: {g['error']}"
    who = "; ".join(
        f"pid {h['pid']} {h.get('owner', '')} {h.get('cmd', '(not visible here)')}".strip()
        for h in g.get("holders", [])
    )
    return (
        f"GPU {g['index']}  NOT RELEASED: {gib(g['used_bytes'])} used vs baseline "
        f"{gib(g['baseline_bytes'])}; " + (who or g.get("note", ""))
    )


def gpus(views: list[GpuView]) -> None:
    """Render `trainctl gpus`."""
    for v in views:
        util = "?" if v.utilization_pct is None else f"{v.utilization_pct}%"
        lease = f"leased by {v.leased_by}" if v.leased_by else "free"
        print(
            f"GPU {v.index}  {v.name}  {gib(v.memory_used_bytes)} / "
            f"{gib(v.memory_total_bytes)}  util {util}  {lease}  {v.uuid}"
        )
        for p in v.processes:
            print(
                f"    pid {p['pid']:>7}  {gib(p['used_bytes']):>9}  {p['owner']:<22} "
                f"{p.get('cmd', '')[:80]}"
            )
        if not v.processes and v.memory_used_bytes:
            print("    (no process listed: NVML may not see other PID namespaces)")


def hosts(rows: list[dict[str, Any]]) -> None:
    """Render `trainctl hosts`."""
    for r in rows:
        line = f"{r['name']:<16} {r['target']}"
        if r.get("port"):
            line += f":{r['port']}"
        if r.get("prefix"):
            line += f"  via `{r['prefix']}`"
        if "reachable" in r:
            if r.get("error"):
                line += f"  FAIL: {r['error']}"
            else:
                ok = "ok" if r.get("compatible") else "INCOMPATIBLE"
                line += f"  trainctl {r.get('version')} ({ok})"
        print(line)


def progress_line(p: dict[str, Any]) -> str:
    """`step 687/2000 (34%) loss 2.0900 ▇▆▅▄▃ 3.2 steps/s ETA 6m50s`."""
    from .progress import sparkline  # noqa: PLC0415

    step = p.get("step")
    total = p.get("total_steps")
    parts = [
        f"step {step:g}"
        + (f"/{total} ({100 * step / total:.0f}%)" if total and step is not None else "")
    ]
    for k, v in list(p.get("metrics", {}).items())[:3]:
        parts.append(f"{k} {v:.4g}")
    if p.get("history") and len(p["history"]) > 1:
        parts.append(sparkline(p["history"]))
    if p.get("steps_per_s"):
        parts.append(f"{p['steps_per_s']:.2f} steps/s")
    if p.get("eta_s") is not None:
        parts.append(f"ETA {duration(p['eta_s'])}")
    return "  ".join(parts)


def _status_details(s: Status) -> None:
    """The optional lines of `status`: Slurm, GPUs, restarts, training, notes."""
    if s.slurm:
        reason = f" ({s.slurm['reason']})" if s.slurm.get("reason") not in (None, "None") else ""
        print(
            f"  slurm job {s.slurm['job_id']}: {s.slurm['state']}{reason} on "
            f"{s.slurm.get('nodes') or '-'}"
        )
        for a in s.slurm.get("agents", []):
            how = (
                "stopped"
                if a["stopped"]
                else f"NOT REPORTING for {a['age_s']:.0f} s"
                if a["stale"]
                else f"{a['members']} process(es)"
            )
            print(f"    node {a['node']} (rank {a['rank']}, {a['host']}): {how}")
    if s.gpus:
        print(f"  gpus {','.join(map(str, s.gpus))}")
    if s.restarts or s.restart_in_s is not None:
        lf = s.last_failure or {}
        nxt = f", next run in {s.restart_in_s:.0f}s" if s.restart_in_s is not None else ""
        print(
            f"  restarts {s.restarts}; last failure: run {lf.get('run')} "
            f"({lf.get('reason')}, exit code {lf.get('exit_code')}){nxt}"
        )
    if s.checkpoint:
        ck = s.checkpoint
        print(f"  ckpt {ck['path']} ({duration(ck['age_s'])} old)")
    if s.progress:
        print(f"  prog {progress_line(s.progress)}")
    if s.code_changed:
        print(
            f"  CODE CHANGED on disk since start ({'; '.join(s.code_changed)}) — "
            f"`trainctl restart {s.name}` to run it"
        )
    if s.stalled_for_s is not None:
        print(f"  STALLED: no progress and no log output for {duration(s.stalled_for_s)}")
    if s.error:
        print(f"  note {clean(s.error)}")


def doctor(checks: list[Any], *, as_json: bool) -> None:
    """Render `trainctl doctor`: one line per check, a hint under what needs action."""
    if as_json:
        emit_json([dataclasses.asdict(ch) for ch in checks])
        return
    width = max(len(ch.name) for ch in checks)
    for ch in checks:
        print(f"{'ok  ' if ch.ok else 'FIX '} {ch.name:<{width}}  {ch.value}")
        if ch.hint:
            print(f"     {'':<{width}}  -> {ch.hint}")
