"""trainctl's Python API: the operations behind the CLI, as plain functions.

Each verb lives in its own module so that a command imports only what it needs
(`trainctl status` must start in well under 80 ms); this module gathers them for
programs that drive trainctl from Python::

    from trainctl.launcher import api
    from trainctl.launcher.config import load_config

    cfg = load_config()
    spec = api.build_spec("llama", ["torchrun", "train.py"], cfg, grace_s=120)
    api.start_job(api.resolve_home(None, cfg), spec, cfg)
"""

from __future__ import annotations

from trainctl.supervisor.proctree import target_of

from .config import resolve_home
from .inputs import parse_env, parse_seconds, parse_signal
from .jobs import existing_job, live_members, remove_job, wait_job
from .start import StartResult, build_spec, restart_job, start_job
from .stop import StopResult, stop_exit_code, stop_job
from .views import Status, all_statuses, job_ps, job_status, log_lines

__all__ = [
    "StartResult",
    "Status",
    "StopResult",
    "all_statuses",
    "build_spec",
    "existing_job",
    "job_ps",
    "job_status",
    "live_members",
    "log_lines",
    "parse_env",
    "parse_seconds",
    "parse_signal",
    "remove_job",
    "resolve_home",
    "restart_job",
    "start_job",
    "stop_exit_code",
    "stop_job",
    "target_of",
    "wait_job",
]
