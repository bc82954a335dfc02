"""A deploy's files under ``<job>/deploys/``: its plan, its steps, its report, its cancel
file, and the lock its deployer holds; read by the verb, `status` and `history` without
loading the deployer itself."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from trainctl.launcher.results.ops import DeployReport, DeployStep
from trainctl.supervisor.errors import StateError
from trainctl.supervisor.model import layout, state
from trainctl.supervisor.model.schema import build_document

LOCK = layout.DEPLOY_LOCK  # held by the deployer for its whole life (probation included)


def deploys_dir(jdir: Path) -> Path:
    return jdir / "deploys"


def plan_path(jdir: Path, did: str) -> Path:
    return deploys_dir(jdir) / f"{did}.plan.json"


def steps_path(jdir: Path, did: str) -> Path:
    return deploys_dir(jdir) / f"{did}.steps.jsonl"


def report_path(jdir: Path, did: str) -> Path:
    return deploys_dir(jdir) / f"{did}.report.json"


def cancel_path(jdir: Path, did: str) -> Path:
    return deploys_dir(jdir) / f"{did}.cancel"


def read_report(jdir: Path, did: str) -> DeployReport | None:
    path = report_path(jdir, did)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        raise StateError(f"{path} is not valid JSON") from None
    doc.pop("ok", None)
    return build_document(DeployReport, doc, str(path))


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


def on_probation(jdir: Path, run: int) -> DeployReport | None:
    """The deploy whose probation holds run ``run`` now (its deployer lives), if any."""
    if not state.is_locked(jdir, LOCK):
        return None
    for path in sorted(deploys_dir(jdir).glob("*.report.json"))[-3:][::-1]:
        with contextlib.suppress(StateError, OSError):
            rep = read_report(jdir, path.name.removesuffix(".report.json"))
            if rep and rep.outcome == "deployed" and rep.to_run == run and rep.probation_until:
                return rep
    return None
