"""The pages of `trainctl web`, as HTML strings: every value escaped, every chart an SVG
drawn here (launcher/charts.py)."""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from typing import TypedDict

from trainctl.launcher import charts, render
from trainctl.launcher.results import Status
from trainctl.launcher.results.ops import (
    CheckpointFile,
    HistoryRow,
    ProgressPoint,
    StopTimeline,
)
from trainctl.supervisor.watch.samples import Sample

ACTIONS = ("stop", "restart", "deploy")


def esc(value: object) -> str:
    """Text for HTML (None: empty)."""
    return "" if value is None else html.escape(str(value))


def page(title: str, body: str, token: str, *, kind: str, job: str = "") -> str:
    """A whole page: the token for the script's POSTs in a meta tag, our own script."""
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<meta name='trainctl-token' content='{esc(token)}'>"
        f"<title>{esc(title)}</title><link rel='stylesheet' href='/app.css'></head>"
        f"<body data-page='{kind}' data-job='{esc(job)}'>{body}"
        "<script src='/app.js'></script></body></html>"
    )


def duration(secs: float | None) -> str:
    """A duration as every verb prints it (render.duration); empty for none."""
    return "" if secs is None else render.duration(secs)


class JobRow(TypedDict, total=False):
    """One row of the jobs table (the page's script reads it as JSON)."""

    name: str
    state: str
    run: int | str
    pct: float | None
    progress: str
    eta: str
    gpus: str
    last: str


def job_row(s: Status | tuple[str, str]) -> JobRow:
    """One row of the jobs table, as the script and the first render both use it."""
    if isinstance(s, tuple):
        return {"name": s[0], "state": "unknown", "run": "?", "pct": None, "last": s[1]}
    p = s.progress
    pct = None
    text = ""
    if p is not None and p.step is not None:
        text = f"step {p.step:g}" + (f"/{p.total_steps}" if p.total_steps else "")
        if p.total_steps:
            pct = round(100.0 * p.step / p.total_steps, 1)
    last = s.last_log_line if s.cause is None else s.cause.summary
    if s.state == "queued" and s.queue is not None:
        last = f"#{s.queue.position}: {'; '.join(s.queue.waits_for) or 'its turn'}"
    return {
        "name": s.name,
        "state": s.state,
        "run": s.run,
        "pct": pct,
        "progress": text,
        "eta": duration(p.eta_s) if p is not None else "",
        "gpus": ",".join(s.gpu_labels),
        "last": last,
    }


def jobs_page(rows: list[Status | tuple[str, str]], home: str, token: str) -> str:
    """Every job: phase, progress, ETA, GPUs, last line or cause; the script keeps it live."""
    body = [f"<h1>trainctl — jobs in {esc(home)}</h1>"]
    body.append(
        "<table><thead><tr><th>JOB</th><th>PHASE</th><th>RUN</th><th>PROGRESS</th>"
        "<th>ETA</th><th>GPUS</th><th>LAST LINE OR CAUSE</th></tr></thead><tbody id='jobs'>"
    )
    for r in map(job_row, rows):
        bar = (
            f"<span class='bar'><span style='width:{min(100, r['pct'])}%'></span></span>"
            if r["pct"] is not None
            else ""
        )
        body.append(
            f"<tr><td><a href='/jobs/{esc(r['name'])}'>{esc(r['name'])}</a></td>"
            f"<td class='phase {esc(r['state'])}'>{esc(r['state'])}</td><td>{esc(r['run'])}</td>"
            f"<td>{bar}{esc(r.get('progress'))}</td><td>{esc(r.get('eta'))}</td>"
            f"<td>{esc(r.get('gpus'))}</td><td class='last'>{esc(r['last'])}</td></tr>"
        )
    body.append("</tbody></table>")
    if not rows:
        body.append("<p class='note'>no jobs yet: <code>trainctl start ...</code></p>")
    return page("trainctl", "".join(body), token, kind="jobs")


def _size(v: float) -> str:
    return render.size(int(v))


def _series(
    samples: list[Sample], get: Callable[[Sample], float | None]
) -> list[tuple[float, float]]:
    return [(s.t, v) for s in samples if (v := get(s)) is not None]


def _keyed(samples: list[Sample], section: str, key: str) -> list[tuple[float, float]]:
    """The points of one key of a sample's mapping (a progress number, one GPU's value)."""
    out = []
    for s in samples:
        value = getattr(s, section).get(key)
        if value is not None:
            out.append((s.t, float(value)))
    return out


def chart_set(
    samples: list[Sample],
    points: list[ProgressPoint],
    ckpts: list[CheckpointFile],
    status: Status,
    history: list[HistoryRow],
    goodput: tuple[str | None, float | None] = (None, None),
) -> str:
    """The job's charts: progress, GPU memory and utilisation per GPU, job memory and CPU;
    above them the job's goodput line (``report``'s first) and when it was made."""
    marks = [charts.Marker(c.at, f"checkpoint {c.path}", "checkpoint") for c in ckpts]
    marks += [
        charts.Marker(r.started_at, f"run {r.run}: {' '.join(r.marks) or 'start'}", "deploy")
        for r in history
        if r.started_at is not None and r.run > 1
    ]
    cap = status.memory.max_bytes if status.memory is not None else None
    out = [*_progress_charts(samples, points, marks), *_gpu_charts(samples, marks)]
    out.append(
        charts.Chart(
            "job memory" + (" (against its cap)" if cap else ""),
            [charts.Series("memory", _series(samples, lambda s: s.mem_bytes))],
            fmt=_size,
            y_max=cap,
            markers=marks,
        )
    )
    out.append(
        charts.Chart(
            "job CPU % of a core",
            [charts.Series("cpu", _series(samples, lambda s: s.cpu_pct))],
            fmt=lambda v: f"{v:.0f}%",
        )
    )
    line, made_at = goodput
    caption = (
        f"<p class='goodput'>{esc(line)} <small>(trainctl report, as of "
        f"{time.strftime('%H:%M:%S', time.localtime(made_at))})</small></p>"
        if line is not None and made_at is not None
        else ""
    )
    return caption + "".join(charts.render(c) for c in out)


def _progress_charts(
    samples: list[Sample], points: list[ProgressPoint], marks: list[charts.Marker]
) -> list[charts.Chart]:
    """The step over time, then up to four other numbers the job reports (loss, ...),
    each against the step and against the time. From every point the trainer wrote (its
    progress file, or the log lines progress_regex matches), not the supervisor's samples
    (one each ~10 s), which serve only where a point has no time. A line a run against
    the step: a run that resumed behind its predecessor redoes steps, and shows it. A
    loss is drawn on a log scale."""
    timed = [p for p in points if p.t is not None]
    steps = [(p.t, p.step) for p in timed if p.t is not None]
    out = [
        charts.Chart(
            "step",
            [charts.Series("step", steps or _keyed(samples, "progress", "step"))],
            markers=marks,
        )
    ]
    # `t` is a progress line's time (trainer.report writes it), not a number to chart
    sampled = {k for s in samples for k in s.progress if k not in ("step", "t")}
    for k in sorted({k for p in points for k in p.values} or sampled)[:4]:
        log = "loss" in k.lower()
        by_run: dict[int, list[tuple[float, float]]] = {}
        for p in points:
            if k in p.values:
                by_run.setdefault(p.run, []).append((p.step, p.values[k]))
        if by_run:
            lines = [charts.Series(f"run {r}" if len(by_run) > 1 else k, xs)
                     for r, xs in sorted(by_run.items())]  # fmt: skip
            out.append(charts.Chart(f"{k} by step", lines, from_zero=False, x="step", log_y=log))
        by_time = [(p.t, p.values[k]) for p in timed if p.t is not None and k in p.values]
        series = [charts.Series(k, by_time or _keyed(samples, "progress", k))]
        out.append(
            charts.Chart(f"{k} over time", series, from_zero=False, markers=marks, log_y=log)
        )
    return out


def _gpu_charts(samples: list[Sample], marks: list[charts.Marker]) -> list[charts.Chart]:
    """GPU memory and utilisation, a line per leased GPU (none for a job without GPUs)."""
    gpus = sorted({k for s in samples for k in (*s.gpu_mem, *s.gpu_util)})
    if not gpus:
        return []
    return [
        charts.Chart(
            "GPU memory",
            [charts.Series(f"GPU {g}", _keyed(samples, "gpu_mem", g)) for g in gpus],
            fmt=_size,
            markers=marks,
        ),
        charts.Chart(
            "GPU utilisation %",
            [charts.Series(f"GPU {g}", _keyed(samples, "gpu_util", g)) for g in gpus],
            fmt=lambda v: f"{v:.0f}%",
            reach=100.0,
        ),
    ]


def _kv(rows: list[tuple[str, object]]) -> str:
    cells = "".join(
        f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows if v not in (None, "")
    )
    return f"<table class='kv'>{cells}</table>"


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else ""


def job_page(
    s: Status,
    charts_html: str,
    ckpts: list[CheckpointFile],
    history: list[HistoryRow],
    stacks: list[tuple[str, str]],
    allowed: frozenset[str],
    token: str,
) -> str:
    """One job: status, charts, checkpoints, causes and restarts, deploys, log tail, stacks."""
    p = s.progress
    body = [
        "<p><a href='/'>← jobs</a></p>",
        f"<h1>{esc(s.name)} <span id='phase' class='phase {esc(s.state)}'>"
        f"{esc(s.state)}</span></h1>",
        _kv(
            [
                ("run", s.run),
                ("main pid", s.main_pid),
                ("members", s.members),
                ("up", duration(s.uptime_s)),
                ("GPUs", ",".join(s.gpu_labels)),
                (
                    "step",
                    None
                    if p is None or p.step is None
                    else f"{p.step:g}" + (f" / {p.total_steps}" if p.total_steps else ""),
                ),
                ("ETA", duration(p.eta_s) if p is not None else None),
                ("cause", s.cause.summary if s.cause else None),
                ("command", " ".join(s.argv)),
                ("log", s.log),
            ]
        ),
        _actions(s, allowed),
        f"<h2>Charts</h2><div id='charts'>{charts_html}</div>",
        _checkpoints(ckpts),
        _causes(s, history),
        "<h2>Log</h2><pre id='log'></pre>",
    ]
    for label, text in stacks:
        body.append(f"<h2>Stacks: {esc(label)}</h2><pre class='stacks'>{esc(text)}</pre>")
    if s.last_stop is not None:
        body.append(
            f"<p><a id='stop-link' href='/jobs/{esc(s.name)}/stop'>"
            "the last stop, second by second →</a></p>"
        )
    return page(f"{s.name} — trainctl", "".join(body), token, kind="job", job=s.name)


def _actions(s: Status, allowed: frozenset[str]) -> str:
    if not allowed:
        return (
            "<p class='note'>read-only (start <code>trainctl web --allow stop</code> "
            "for buttons)</p>"
        )
    buttons = "".join(f"<button data-action='{a}'>{a}</button>" for a in ACTIONS if a in allowed)
    return f"<p id='actions'>{buttons}<span id='action-result' class='note'></span></p>"


def _checkpoints(ckpts: list[CheckpointFile]) -> str:
    if not ckpts:
        return ""
    rows = "".join(
        f"<tr><td>{esc(_when(c.at))}</td><td>{esc(c.path)}</td><td>{esc(_size(c.size))}</td></tr>"
        for c in reversed(ckpts[-20:])
    )
    return (
        f"<h2>Checkpoints ({len(ckpts)})</h2><p class='note'>green marks on the charts</p>"
        f"<table><tr><th>written</th><th>path</th><th>size</th></tr>{rows}</table>"
    )


def _causes(s: Status, history: list[HistoryRow]) -> str:
    out = []
    if s.restart_history:
        rows = "".join(
            f"<tr><td>{esc(r.run)}</td><td>{esc(_when(r.at))}</td><td>{esc(r.cause)}</td></tr>"
            for r in s.restart_history
        )
        out.append(
            f"<h2>Restarts</h2><table><tr><th>run</th><th>at</th><th>cause</th></tr>{rows}</table>"
        )
    if history:
        rows = "".join(
            f"<tr><td>{esc(r.run)}</td><td>{esc(_when(r.started_at))}</td><td>{esc(duration(r.duration_s))}</td>"
            f"<td>{esc(r.code)}</td><td>{esc(r.phase or 'running')}</td><td>{esc(r.cause)}</td>"
            f"<td>{esc(' '.join(r.marks))}</td></tr>"
            for r in reversed(history[-30:])
        )
        out.append(
            "<h2>Runs, causes and deploys</h2><table><tr><th>run</th><th>started</th><th>for</th>"
            f"<th>code</th><th>end</th><th>cause</th><th>deploy</th></tr>{rows}</table>"
        )
    return "".join(out)


def stop_page(t: StopTimeline, token: str) -> str:
    """One stop: the request, each signal and who got it, each exit, the SIGKILLs, the GPUs
    coming back, the verdict; a bar per process on a shared time axis."""
    rows = "".join(
        f"<tr class='kind-{esc(e.kind)}'><td class='at'>+{e.at_s:.3f} s</td><td>{esc(e.kind)}</td>"
        f"<td>{esc(e.text)}</td></tr>"
        for e in t.entries
    )
    began = f" at {esc(_when(t.started_at))}" if t.started_at else ""
    body = (
        f"<p><a href='/jobs/{esc(t.name)}'>← {esc(t.name)}</a></p>"
        f"<h1>Stop of {esc(t.name)} run {t.run}{began}</h1>"
        f"<p class='kind-verdict' id='verdict'>{esc(t.verdict)}</p>"
        f"{_timeline_svg(t)}"
        f"<table class='timeline'><tr><th>when</th><th>what</th><th></th></tr>{rows}</table>"
    )
    return page(f"stop of {t.name}", body, token, kind="stop", job=t.name)


def _timeline_svg(t: StopTimeline) -> str:
    """Every member as a bar: a signalled one from its signal to its exit (red:
    SIGKILLed), one that its parent shut down (grey) from the stop's start to its exit."""
    signals = {e.pid: e.at_s for e in t.entries if e.kind == "signal" and e.pid is not None}
    exits = {e.pid: e.at_s for e in t.entries if e.kind == "exit" and e.pid is not None}
    if not signals and not exits:
        return ""
    span = max([t.total_s, *exits.values(), *signals.values(), 0.001])
    width, left, row = 720, 70, 14
    pids = [*signals, *(p for p in exits if p not in signals)][:64]
    height = 20 + row * len(pids)
    parts = [f"<svg class='chart timeline' viewBox='0 0 {width} {height}'>"]
    for i, pid in enumerate(pids):
        began = signals.get(pid, 0.0)
        x0 = left + began / span * (width - left - 10)
        x1 = left + exits.get(pid, t.total_s) / span * (width - left - 10)
        killed = any(e.kind == "exit" and e.pid == pid and "SIGKILL" in e.text for e in t.entries)
        colour = "#c92a2a" if killed else "#2f6fdf" if pid in signals else "#adb5bd"
        y = 10 + i * row
        parts.append(
            f"<text class='tick' x='2' y='{y + 9}'>{pid}</text>"
            f"<rect x='{x0:.1f}' y='{y}' width='{max(2.0, x1 - x0):.1f}' height='10' "
            f"fill='{colour}'><title>{pid}: +{began:.3f} s → "
            f"+{exits.get(pid, t.total_s):.3f} s</title></rect>"
        )
    parts.append(
        f"<text class='tick' x='{width - 10}' y='{height - 2}' text-anchor='end'>"
        f"{span:.2f} s</text></svg>"
    )
    return "".join(parts)
