"""A deploy's files under ``<job>/deploys/`` (named in supervisor/model/deploys.py), read
by the verb, `status` and `history` without loading the deployer itself."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from trainctl.supervisor.errors import StateError
from trainctl.supervisor.model import layout
from trainctl.supervisor.model.deploys import (
    DeployReport,
    DeployStep,
    cancel_path,
    deploys_dir,
    plan_path,
    report_at,
    report_path,
    steps_path,
)
from trainctl.supervisor.model.schema import build_document

LOCK = layout.DEPLOY_LOCK  # held by the deployer until the new code runs
__all__ = ["cancel_path", "deploys_dir", "plan_path", "report_path", "steps_path"]


def read_report(jdir: Path, did: str) -> DeployReport | None:
    try:
        return report_at(report_path(jdir, did))
    except FileNotFoundError:
        return None


def read_steps(jdir: Path, did: str, seen: int) -> list[DeployStep]:
    """The steps written after the first ``seen``."""
    try:
        lines = steps_path(jdir, did).read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines[seen:]:
        with contextlib.suppress(ValueError, StateError):
            out.append(build_document(DeployStep, json.loads(line), "deploy step"))
    return out
