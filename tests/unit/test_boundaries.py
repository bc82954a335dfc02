"""Architecture rules that are cheap to check: supervisor never imports launcher."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_supervisor_never_imports_launcher() -> None:
    files = sorted((ROOT / "supervisor").rglob("*.py"))
    assert files
    for path in files:
        bad = {m for m in imported_modules(path) if m.startswith("trainctl.launcher")}
        assert not bad, f"{path} imports {bad}"


def test_status_path_stays_light() -> None:
    """The modules `status` imports must not pull in the heavy libraries."""
    heavy = {"anyio", "structlog", "psutil", "rich", "click", "pynvml"}
    for mod in (
        "launcher/fastpath.py",
        "launcher/views.py",
        "launcher/jobs.py",
        "launcher/render.py",
        "launcher/config.py",
        "supervisor/state.py",
        "supervisor/proctree.py",
        "supervisor/procfs.py",
        "supervisor/cgroup.py",
    ):
        top = {m.split(".")[0] for m in _toplevel_imports(ROOT / mod)}
        assert not top & heavy, f"{mod} imports {top & heavy} at module level"


def _toplevel_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out
