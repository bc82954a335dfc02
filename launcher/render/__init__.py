"""Records into text and JSON: the only package that formats what a verb prints.

Its functions return text (a ``str``, or a :class:`Said` with a stderr part) or a JSON
document, built from records; the verb prints it (``show``, ``emit_json``), and the web
page and MCP take the same text or document without capturing any output.

It reads records (``results``) and nothing above them; operations and backends never
format text. One module an area (as results/ is): base (the output sink and the shared
formatters), stop, status, tools, deploy, fleet. Everything a verb calls is named here.
"""

from __future__ import annotations

from .base import (
    NAMED_LINES,
    Said,
    age,
    ago,
    clean,
    cmd_cell,
    duration,
    emit_json,
    error_line,
    gib,
    line,
    out,
    show,
    size,
    time_cell,
    to,
    write,
)
from .deploy import (
    code_check,
    deploy_plan,
    deploy_report,
    deploy_step,
    goodput,
    goodput_line,
    history,
)
from .fleet import fleet_gpus, fleet_jobs, fleet_top
from .status import (
    as_written,
    checkpoint_line,
    health,
    job_table,
    memory_line,
    newer_note,
    progress_line,
    ps,
    status,
    status_doc,
)
from .stop import (
    ended_at_once,
    gpu_line,
    guard_lines,
    queued,
    restart_plan,
    slurm_stop,
    start,
    stop,
    stop_doc,
    stop_plan,
    stop_summary,
    survivor_line,
)
from .tools import doctor, doctor_doc, gpus, hosts, stacks

__all__ = [
    "NAMED_LINES",
    "Said",
    "age",
    "ago",
    "as_written",
    "checkpoint_line",
    "clean",
    "cmd_cell",
    "code_check",
    "deploy_plan",
    "deploy_report",
    "deploy_step",
    "doctor",
    "doctor_doc",
    "duration",
    "emit_json",
    "ended_at_once",
    "error_line",
    "fleet_gpus",
    "fleet_jobs",
    "fleet_top",
    "gib",
    "goodput",
    "goodput_line",
    "gpu_line",
    "gpus",
    "guard_lines",
    "health",
    "history",
    "hosts",
    "job_table",
    "line",
    "memory_line",
    "newer_note",
    "out",
    "progress_line",
    "ps",
    "queued",
    "restart_plan",
    "show",
    "size",
    "slurm_stop",
    "stacks",
    "start",
    "status",
    "status_doc",
    "stop",
    "stop_doc",
    "stop_plan",
    "stop_summary",
    "survivor_line",
    "time_cell",
    "to",
    "write",
]
