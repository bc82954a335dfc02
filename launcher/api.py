"""trainctl's Python API: the operations behind the CLI, as plain functions on records.

The CLI's verbs call exactly these; programs that drive trainctl from Python import them
from here::

    from trainctl.launcher import api
    from trainctl.launcher.config import load_config

    cfg = load_config()
    spec = api.build_spec("llama", ["torchrun", "train.py"], cfg, grace_s=120)
    api.start_job(api.resolve_home(None, cfg), spec, cfg)

Every function returns a record from :mod:`trainctl.launcher.results` and raises an
error of the tree in ``trainctl.supervisor.errors``; none prints.
"""

from __future__ import annotations

from trainctl.supervisor.tree.proctree import target_of

from .config import resolve_home
from .inputs import parse_env, parse_seconds, parse_signal
from .ops.jobs import existing_job, live_members, wait_job
from .ops.logs import log_lines
from .ops.ps import job_ps
from .ops.remove import remove_job
from .ops.start import build_spec, restart_job, start_job
from .ops.status import all_statuses, job_status
from .ops.stop import check_checkpoint, stop_exit_code, stop_job
from .results import StartResult, Status, StopReport, StopResult

__all__ = [
    "StartResult",
    "Status",
    "StopReport",
    "StopResult",
    "all_statuses",
    "build_spec",
    "check_checkpoint",
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
